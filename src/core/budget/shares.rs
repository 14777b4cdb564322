//! Guarantees and ceilings inside a pool (`GPUCAP_GUARANTEE`, `GPUCAP_CEILING`): the
//! policy, as pure functions over plain numbers (bytes of one GPU). The pool file's
//! words are read and written elsewhere (`share_words`); everything that decides is here.
//!
//! Member *j* of a pool with cap `cap` has a guarantee `g_j` (bytes the pool keeps for it
//! even before it allocates them), a ceiling `c_j` (the most it may hold; the pool's cap
//! when unset) and holds `h_j`. Its *unused guarantee* is `max(0, g_j − h_j)`, its
//! *borrowed* bytes `max(0, h_j − g_j)`.
//!
//! - Admission ([`admit`]): a member joins with guarantee `g` only if the live members'
//!   guarantees plus `g` fit the cap, and `g` is free now (the pool's use plus every
//!   unused guarantee plus `g` fit the cap): a guarantee admitted is one that can be
//!   taken at once.
//! - Reservation ([`reserve`]) of `r` bytes by member *i*: `h_i + r ≤ c_i`, and
//!   `used + r + Σ_{j≠i} max(0, g_j − h_j) ≤ cap`.
//!
//! - A request inside the member's own guarantee ([`reserve_owed`]): `h_i + r ≤ g_i` and
//!   `used + r ≤ cap`, the others' unused guarantees not weighed.
//!
//! Together they keep one invariant: `Σ_j max(g_j, h_j) ≤ cap` (the pool's *commitment*).
//! So the driver is never asked for more than the cap, and each live member can always
//! take the rest of its guarantee (its unused guarantee is part of the commitment).
//!
//! Two things can leave the commitment above the cap: a charge that could not be
//! refused (`Member::charge_past_cap`: memory the driver already took), and a cap lowered below it
//! (`gpucap pool resize`). Then the cap in force wins: no reservation, inside a
//! guarantee or not, takes the pool's use past it, and each is refused until use falls
//! far enough (nothing is taken back). A forced charge stays the only way past the cap.
//! The guarantees still hold against the others: no other member borrows a member's
//! unused guarantee while it is kept.

use std::fmt;

/// One member's share of one GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Bytes kept for the member (0: none).
    pub guarantee: u64,
    /// The most the member may hold (the pool's cap, or `u64::MAX` without one, if unset).
    pub ceiling: u64,
}

/// A guarantee or ceiling that cannot be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareError {
    /// The guarantee is above the ceiling.
    GuaranteeAboveCeiling { guarantee: u64, ceiling: u64 },
    /// The ceiling is above the pool's cap.
    CeilingAboveCap { ceiling: u64, cap: u64 },
    /// The guarantee is above the pool's cap.
    GuaranteeAboveCap { guarantee: u64, cap: u64 },
}

impl fmt::Display for ShareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::size::format_bytes as b;
        match *self {
            ShareError::GuaranteeAboveCeiling { guarantee, ceiling } => write!(
                f,
                "the guarantee ({}) is above the ceiling ({}): a member cannot be kept more \
                 than it may hold",
                b(guarantee),
                b(ceiling)
            ),
            ShareError::CeilingAboveCap { ceiling, cap } => write!(
                f,
                "the ceiling ({}) is above the pool's cap ({}, GPUCAP_LIMIT)",
                b(ceiling),
                b(cap)
            ),
            ShareError::GuaranteeAboveCap { guarantee, cap } => write!(
                f,
                "the guarantee ({}) is above the pool's cap ({}, GPUCAP_LIMIT)",
                b(guarantee),
                b(cap)
            ),
        }
    }
}

impl std::error::Error for ShareError {}

/// Checks one member's guarantee and ceiling against the pool's cap (None: no cap) and
/// returns its share (an unset ceiling is the cap).
pub fn check(cap: Option<u64>, guarantee: u64, ceiling: Option<u64>) -> Result<Share, ShareError> {
    let limit = cap.unwrap_or(u64::MAX);
    let ceiling_bytes = ceiling.unwrap_or(limit);
    if let (Some(cap), Some(c)) = (cap, ceiling)
        && c > cap
    {
        return Err(ShareError::CeilingAboveCap { ceiling: c, cap });
    }
    if let (Some(cap), None) = (cap, ceiling)
        && guarantee > cap
    {
        return Err(ShareError::GuaranteeAboveCap { guarantee, cap });
    }
    if guarantee > ceiling_bytes {
        return Err(ShareError::GuaranteeAboveCeiling {
            guarantee,
            ceiling: ceiling_bytes,
        });
    }
    Ok(Share {
        guarantee,
        ceiling: ceiling_bytes,
    })
}

/// The share of visible GPU `ordinal` (`uuids`: every visible GPU's UUID) of a member
/// configured by `config` whose cap there is `cap` (None: no cap): the guarantee and
/// ceiling read for it ([`crate::config::shares_for`]) and checked ([`check`]); None
/// when it has neither. One source of truth: the shim claims this share when it joins
/// its pool, and `gpucap check` and `run` ask it of every GPU before anything starts.
pub fn for_gpu(
    config: &crate::config::Config,
    ordinal: usize,
    uuids: &[[u8; 16]],
    cap: Option<u64>,
) -> Result<Option<Share>, String> {
    let share = || {
        let (guarantee, ceiling) = crate::config::shares_for(config, ordinal, uuids, cap)?;
        if guarantee.is_none() && ceiling.is_none() {
            return Ok(None);
        }
        check(cap, guarantee.unwrap_or(0), ceiling)
            .map(Some)
            .map_err(|e| e.to_string())
    };
    // The line names the flags typed (`--limit`), not the variables they set.
    share().map_err(|e| crate::config::name_flags_in(&e, &config.typed))
}

/// How a member whose own cap on a GPU is a ceiling handed down to it (a configuration
/// file's, `held` bytes) meets a pool that holds the GPU to another cap (`pool`; None:
/// no cap). Members without such a ceiling must hold a GPU to the pool's cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnderCeiling {
    /// The pool's cap is above the ceiling: the member joins at the pool's cap, its own
    /// share held at the ceiling (its share's ceiling, [`held_share`]).
    Held(u64),
    /// The pool's cap is below the ceiling: the member joins at the pool's cap, which
    /// holds; nothing to add.
    PoolHolds,
}

/// See [`UnderCeiling`]; None where the member has no cap of its own there (`held`
/// None: it may not join a capped pool any more than a member without a ceiling).
pub fn under_ceiling(held: Option<u64>, pool: Option<u64>) -> Option<UnderCeiling> {
    let held = held?;
    Some(match pool {
        Some(p) if p <= held => UnderCeiling::PoolHolds,
        _ => UnderCeiling::Held(held),
    })
}

/// The share of a member held at `held` bytes in a pool whose cap is `cap`: its own
/// guarantee and ceiling (`share`, [`for_gpu`] against the pool's cap; None: neither
/// set), its ceiling lowered to `held`, checked again ([`check`]: a guarantee above
/// `held` cannot be).
pub fn held_share(share: Option<Share>, cap: Option<u64>, held: u64) -> Result<Share, ShareError> {
    let (guarantee, ceiling) = share.map_or((0, held), |s| (s.guarantee, s.ceiling.min(held)));
    check(cap, guarantee, Some(ceiling))
}

/// The part of `guarantee` a member holding `held` has not taken yet.
#[inline]
pub fn unused(guarantee: u64, held: u64) -> u64 {
    guarantee.saturating_sub(held)
}

/// What a member holding `held` holds above its guarantee (lent to it by the pool).
#[inline]
pub fn borrowed(guarantee: u64, held: u64) -> u64 {
    held.saturating_sub(guarantee)
}

/// Why a guarantee is not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The live members' guarantees (`given`) plus this one exceed the cap.
    Promised { given: u64, cap: u64 },
    /// The guarantees fit, but not the memory in use now: `used` by the pool plus the
    /// others' `unused` guarantees leave less than this guarantee (members borrowed it).
    Borrowed { used: u64, unused: u64, cap: u64 },
}

/// Admits a guarantee of `own` bytes into a pool with cap `cap` whose live members
/// (this one excluded) were given `given` in all, use `used` in all, and have `unused`
/// of their guarantees left (see [`unused`]).
#[inline]
pub fn admit(cap: u64, given: u64, used: u64, unused: u64, own: u64) -> Result<(), Admission> {
    if own == 0 {
        return Ok(()); // asks nothing of anyone
    }
    if given.checked_add(own).is_none_or(|t| t > cap) {
        return Err(Admission::Promised { given, cap });
    }
    let committed = used.saturating_add(unused);
    if committed.checked_add(own).is_none_or(|t| t > cap) {
        return Err(Admission::Borrowed { used, unused, cap });
    }
    Ok(())
}

/// Admits raising a live member's guarantee to `guarantee` (`gpucap pool set`) while it
/// holds `held`, in a pool with cap `cap` whose other live members were given `given`
/// and have `unused` of their guarantees left, the pool using `used` (the member's
/// bytes in it): as [`admit`], the guarantees must fit the cap, and the raise must be
/// free now: `used + unused + (guarantee - held)` within the cap (the commitment).
#[inline]
pub fn admit_raise(
    cap: u64,
    given: u64,
    used: u64,
    unused: u64,
    held: u64,
    guarantee: u64,
) -> Result<(), Admission> {
    if given.checked_add(guarantee).is_none_or(|t| t > cap) {
        return Err(Admission::Promised { given, cap });
    }
    let committed = used.saturating_add(unused);
    if committed
        .checked_add(self::unused(guarantee, held))
        .is_none_or(|t| t > cap)
    {
        return Err(Admission::Borrowed { used, unused, cap });
    }
    Ok(())
}

/// The reservation rule for member *i*: `request` more bytes, when it holds `held` with
/// ceiling `ceiling`, the pool uses `used` of `cap`, and the other live members have
/// `others_unused` of their guarantees left. Returns the pool's new use, or None.
#[inline]
pub fn reserve(
    cap: u64,
    used: u64,
    held: u64,
    ceiling: u64,
    request: u64,
    others_unused: u64,
) -> Option<u64> {
    if held.checked_add(request)? > ceiling {
        return None;
    }
    let new = used.checked_add(request)?;
    (new.checked_add(others_unused)? <= cap).then_some(new)
}

/// The reservation rule for a request inside member *i*'s own guarantee (`held +
/// request <= guarantee`): the others' unused guarantees are not weighed, only the cap
/// in force (`used + request <= cap`). While the invariant holds (every reservation
/// keeps it), that check always passes: the borrowers left the guarantee's room (see
/// [`reserve`]). It refuses only where the pool stands past what it can hold: a cap
/// lowered below the pool's commitment (`gpucap pool resize`), or a charge that could
/// not be refused (`Member::charge_past_cap`). The cap in force wins then: the request is refused until
/// the pool's use falls far enough under the cap, as every other request is. A forced
/// charge is the only way past the cap; no admission is. None for a request that is not
/// inside the guarantee, or that the cap cannot take now. A guarantee never exceeds a
/// ceiling (admission), so the ceiling needs no check.
#[inline]
pub fn reserve_owed(cap: u64, used: u64, held: u64, guarantee: u64, request: u64) -> Option<u64> {
    if held.checked_add(request)? > guarantee {
        return None;
    }
    let new = used.checked_add(request)?;
    (new <= cap).then_some(new)
}

/// Where a charge that cannot be refused falls (bytes the driver already took for
/// member *i*: the kernels a launch loaded): first out of its own unused guarantee,
/// then out of the pool's free room (the cap less the pool's use and the others' unused
/// guarantees), the rest past the cap. The pool's words simply add it
/// (`Member::charge_past_cap`); this states the rule for the model below, which checks
/// its promise: no other member's guarantee is ever eaten, and the pool passes its cap
/// by at most `over`.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Forced {
    pub own_guarantee: u64,
    pub free_room: u64,
    pub over: u64,
}

/// [`Forced`] of `bytes` charged to a member holding `held` of its `guarantee`, the pool
/// using `used` of `cap` and the others' unused guarantees being `others_unused`.
#[cfg(test)]
pub fn where_forced(
    cap: u64,
    used: u64,
    held: u64,
    guarantee: u64,
    others_unused: u64,
    bytes: u64,
) -> Forced {
    let own_guarantee = unused(guarantee, held).min(bytes);
    // The room beyond every unused guarantee (this member's own counted apart).
    let room = cap
        .saturating_sub(used)
        .saturating_sub(others_unused)
        .saturating_sub(unused(guarantee, held));
    let free_room = room.min(bytes - own_guarantee);
    Forced {
        own_guarantee,
        free_room,
        over: bytes - own_guarantee - free_room,
    }
}

/// Whether `request` more bytes would take a member holding `held` past its ceiling.
#[inline]
pub fn past_ceiling(held: u64, ceiling: u64, request: u64) -> bool {
    held.checked_add(request).is_none_or(|t| t > ceiling)
}

/// What member *i* could reserve now (its `cuMemGetInfo` free, before the physical
/// free is taken into account): the rest of its ceiling, and the pool's room once the
/// others' unused guarantees are kept for them.
#[inline]
pub fn free(cap: u64, used: u64, held: u64, ceiling: u64, others_unused: u64) -> u64 {
    let own = ceiling.saturating_sub(held);
    let pool = cap.saturating_sub(used).saturating_sub(others_unused);
    own.min(pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_request_inside_the_guarantee_needs_only_the_caps_room() {
        // 3 of a 4 guarantee held; the others' unused guarantees do not count.
        assert_eq!(reserve_owed(10, 5, 3, 4, 1), Some(6));
        assert_eq!(
            reserve(10, 5, 3, u64::MAX, 1, 5),
            None,
            "the general rule would refuse"
        );
        assert_eq!(
            reserve_owed(10, 5, 3, 4, 2),
            None,
            "past the guarantee: the general rule"
        );
        assert_eq!(reserve_owed(10, 9, 3, 4, 1), Some(10), "up to the cap");
        assert_eq!(
            reserve_owed(10, 10, 3, 4, 1),
            None,
            "past the cap (where a forced charge or a lowered cap put the pool): the cap \
             in force wins, inside the guarantee too"
        );
        assert_eq!(reserve_owed(10, 12, 0, 4, 1), None, "the pool past its cap");
        assert_eq!(reserve_owed(10, 0, 0, 0, 1), None, "no guarantee");
        assert_eq!(
            reserve_owed(10, 0, 0, u64::MAX, 11),
            None,
            "never above the cap's worth"
        );
        assert_eq!(
            reserve_owed(u64::MAX, u64::MAX, 0, 4, 1),
            None,
            "no overflow"
        );
    }

    #[test]
    fn a_forced_charge_falls_on_its_own_guarantee_then_free_room_then_past_the_cap() {
        // cap 1024; B holds 510 of no guarantee, A's 512 unused: 2 free.
        assert_eq!(
            where_forced(1024, 510, 510, 0, 512, 256),
            Forced {
                own_guarantee: 0,
                free_room: 2,
                over: 254
            }
        );
        // B with a guarantee of 600 holding 510: 90 of it first.
        assert_eq!(
            where_forced(1024, 510, 510, 600, 0, 256),
            Forced {
                own_guarantee: 90,
                free_room: 166,
                over: 0
            }
        );
        assert_eq!(
            where_forced(10, 12, 12, 0, 0, 5),
            Forced {
                own_guarantee: 0,
                free_room: 0,
                over: 5
            }
        );
    }

    #[test]
    fn a_member_under_a_ceiling_joins_a_larger_pool_held_at_it() {
        const MIB: u64 = 1 << 20;
        let ceiling = Some(256 * MIB);
        assert_eq!(
            under_ceiling(ceiling, Some(4 * GIB)),
            Some(UnderCeiling::Held(256 * MIB))
        );
        assert_eq!(
            under_ceiling(ceiling, None),
            Some(UnderCeiling::Held(256 * MIB)),
            "a pool without a cap: held all the same"
        );
        assert_eq!(
            under_ceiling(ceiling, Some(128 * MIB)),
            Some(UnderCeiling::PoolHolds)
        );
        assert_eq!(under_ceiling(None, Some(4 * GIB)), None);
        // Its share: the ceiling lowered to what it may hold, the guarantee kept.
        let cap = Some(4 * GIB);
        assert_eq!(
            held_share(None, cap, 256 * MIB),
            Ok(Share {
                guarantee: 0,
                ceiling: 256 * MIB
            })
        );
        let own = check(cap, 100 * MIB, Some(GIB)).ok();
        assert_eq!(
            held_share(own, cap, 256 * MIB),
            Ok(Share {
                guarantee: 100 * MIB,
                ceiling: 256 * MIB
            })
        );
        let own = check(cap, 0, Some(200 * MIB)).ok();
        assert_eq!(held_share(own, cap, 256 * MIB).unwrap().ceiling, 200 * MIB);
        let own = check(cap, 300 * MIB, None).ok();
        assert_eq!(
            held_share(own, cap, 256 * MIB),
            Err(ShareError::GuaranteeAboveCeiling {
                guarantee: 300 * MIB,
                ceiling: 256 * MIB
            })
        );
        assert_eq!(
            held_share(None, None, 256 * MIB).unwrap().ceiling,
            256 * MIB
        );
    }

    #[test]
    fn check_orders_guarantee_ceiling_and_cap() {
        let cap = Some(10 * GIB);
        assert_eq!(
            check(cap, 4 * GIB, Some(8 * GIB)),
            Ok(Share {
                guarantee: 4 * GIB,
                ceiling: 8 * GIB
            })
        );
        assert_eq!(check(cap, 0, None).unwrap().ceiling, 10 * GIB);
        assert_eq!(check(None, 4 * GIB, None).unwrap().ceiling, u64::MAX);
        assert_eq!(
            check(cap, 9 * GIB, Some(8 * GIB)),
            Err(ShareError::GuaranteeAboveCeiling {
                guarantee: 9 * GIB,
                ceiling: 8 * GIB
            })
        );
        assert_eq!(
            check(cap, 0, Some(11 * GIB)),
            Err(ShareError::CeilingAboveCap {
                ceiling: 11 * GIB,
                cap: 10 * GIB
            })
        );
        assert_eq!(
            check(cap, 11 * GIB, None),
            Err(ShareError::GuaranteeAboveCap {
                guarantee: 11 * GIB,
                cap: 10 * GIB
            })
        );
        assert!(check(cap, 8 * GIB, Some(8 * GIB)).is_ok(), "equal is fine");
        let shown = check(cap, 0, Some(11 * GIB)).unwrap_err().to_string();
        assert!(
            shown.contains("11 GiB") && shown.contains("10 GiB"),
            "{shown}"
        );
    }

    #[test]
    fn unused_and_borrowed_split_what_is_held() {
        assert_eq!((unused(4, 1), borrowed(4, 1)), (3, 0));
        assert_eq!((unused(4, 4), borrowed(4, 4)), (0, 0));
        assert_eq!((unused(4, 7), borrowed(4, 7)), (0, 3));
        assert_eq!((unused(0, 7), borrowed(0, 7)), (0, 7));
    }

    #[test]
    fn admission_counts_promises_and_memory_in_use() {
        assert_eq!(admit(10, 6, 0, 6, 4), Ok(()));
        assert_eq!(
            admit(10, 6, 0, 6, 5),
            Err(Admission::Promised { given: 6, cap: 10 })
        );
        // Nobody promised anything, but a neighbour holds 8 of 10: 4 cannot be kept now.
        assert_eq!(
            admit(10, 0, 8, 0, 4),
            Err(Admission::Borrowed {
                used: 8,
                unused: 0,
                cap: 10
            })
        );
        assert_eq!(
            admit(10, 0, 10, 0, 0),
            Ok(()),
            "no guarantee: always admitted"
        );
        assert!(admit(u64::MAX, u64::MAX, 0, 0, 1).is_err(), "no overflow");
    }

    #[test]
    fn a_raised_guarantee_counts_what_its_member_holds() {
        // cap 10; the others were given 4 and have 2 of it left; 6 in use, 3 of them the
        // member's: raising its guarantee to 5 asks 2 more.
        assert_eq!(admit_raise(10, 4, 6, 2, 3, 5), Ok(()));
        assert_eq!(
            admit_raise(10, 4, 6, 2, 3, 7),
            Err(Admission::Promised { given: 4, cap: 10 })
        );
        assert_eq!(
            admit_raise(10, 4, 7, 2, 3, 5),
            Err(Admission::Borrowed {
                used: 7,
                unused: 2,
                cap: 10
            })
        );
        assert_eq!(
            admit_raise(10, 0, 9, 0, 9, 6),
            Ok(()),
            "held already: nothing more kept"
        );
        assert!(
            admit_raise(u64::MAX, 1, 0, 0, 0, u64::MAX).is_err(),
            "no overflow"
        );
    }

    #[test]
    fn reservation_keeps_others_unused_guarantees() {
        // cap 10; a notebook guaranteed 4 holds 1: 3 kept for it.
        assert_eq!(reserve(10, 1, 0, 10, 6, 3), Some(7));
        assert_eq!(reserve(10, 1, 0, 10, 7, 3), None);
        // Its own guarantee is its own: the notebook takes its 3 even with the pool at 7.
        assert_eq!(reserve(10, 7, 1, 10, 3, 0), Some(10));
        // Ceiling.
        assert_eq!(reserve(10, 0, 5, 6, 2, 0), None);
        assert!(past_ceiling(5, 6, 2) && !past_ceiling(5, 6, 1));
        assert_eq!(reserve(u64::MAX, u64::MAX, 0, u64::MAX, 1, 0), None);
    }

    #[test]
    fn free_is_what_a_reservation_would_take() {
        assert_eq!(free(10, 1, 0, 10, 3), 6);
        assert_eq!(free(10, 1, 0, 4, 3), 4, "the ceiling first");
        assert_eq!(free(10, 12, 0, 10, 3), 0, "saturates");
        for request in 0..12 {
            assert_eq!(
                reserve(10, 1, 0, 10, request, 3).is_some(),
                request <= free(10, 1, 0, 10, 3)
            );
        }
    }

    /// A pool of members driven by random operations through these functions only.
    #[derive(Debug, Clone)]
    struct Model {
        cap: u64,
        /// (guarantee, ceiling, held) of each live member.
        members: Vec<(u64, u64, u64)>,
        /// How far past the cap the commitment may stand: what forced charges took
        /// past it, and what a lowered cap left above it, all told.
        over: u64,
        /// Whether any charge was forced (it may pass its member's ceiling too).
        forced: bool,
    }

    impl Model {
        fn used(&self) -> u64 {
            self.members.iter().map(|m| m.2).sum()
        }
        fn given(&self, except: Option<usize>) -> u64 {
            self.members
                .iter()
                .enumerate()
                .filter(|&(j, _)| Some(j) != except)
                .map(|(_, m)| m.0)
                .sum()
        }
        fn others_unused(&self, i: usize) -> u64 {
            self.members
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, m)| unused(m.0, m.2))
                .sum()
        }
        fn committed(&self) -> u64 {
            self.members.iter().map(|m| m.0.max(m.2)).sum()
        }
        fn step(&mut self, op: Op) {
            match op {
                Op::Join { guarantee, ceiling } => {
                    let Ok(s) = check(Some(self.cap), guarantee, Some(ceiling)) else {
                        return;
                    };
                    let unused: u64 = self.members.iter().map(|m| unused(m.0, m.2)).sum();
                    if admit(self.cap, self.given(None), self.used(), unused, s.guarantee).is_ok()
                        && self.members.len() < 8
                    {
                        self.members.push((s.guarantee, s.ceiling, 0));
                    }
                }
                Op::Leave { who } if !self.members.is_empty() => {
                    let i = who % self.members.len();
                    self.members.remove(i); // its bytes and its guarantee go with it
                }
                Op::Reserve { who, bytes } if !self.members.is_empty() => {
                    let i = who % self.members.len();
                    let (g, c, h) = self.members[i];
                    let others = self.others_unused(i);
                    let can = free(self.cap, self.used(), h, c, others);
                    let used = self.used();
                    let rule = match reserve_owed(self.cap, self.used(), h, g, bytes) {
                        Some(new) => Some(new),
                        None => reserve(self.cap, self.used(), h, c, bytes, others),
                    };
                    match rule {
                        Some(new) => {
                            assert!(
                                bytes <= can || h + bytes <= g,
                                "reserved more than free said"
                            );
                            assert_eq!(new, used + bytes);
                            // Whatever forced charges and resizes did: no admission
                            // passes the cap in force.
                            assert!(new <= self.cap, "admitted past the cap: {self:?}");
                            self.members[i].2 += bytes;
                        }
                        None => {
                            // (a member a forced charge took past its ceiling is refused even 0)
                            assert!(bytes > can || h > c, "refused what free said could be had");
                            // A refusal inside the member's own guarantee (and ceiling)
                            // is a broken guarantee, unless the cap in force cannot take
                            // it (the pool past its commitment: forced, or resized).
                            assert!(
                                h + bytes > g || used + bytes > self.cap,
                                "guarantee {g} broken at {h} + {bytes}"
                            );
                        }
                    }
                }
                Op::Free { who, bytes } if !self.members.is_empty() => {
                    let i = who % self.members.len();
                    let b = bytes.min(self.members[i].2);
                    self.members[i].2 -= b;
                }
                Op::Force { who, bytes } if !self.members.is_empty() => {
                    let i = who % self.members.len();
                    let (g, _, h) = self.members[i];
                    let f = where_forced(self.cap, self.used(), h, g, self.others_unused(i), bytes);
                    assert_eq!(f.own_guarantee + f.free_room + f.over, bytes);
                    self.over += f.over;
                    self.forced = true;
                    self.members[i].2 += bytes; // past its ceiling too, if need be
                }
                // Refused where the live guarantees do not fit (`Pool::resize`).
                Op::Resize { cap } if self.given(None) <= cap => {
                    self.over = self.over.max(self.committed().saturating_sub(cap));
                    self.cap = cap;
                }
                _ => {}
            }
            assert!(
                self.used() <= self.cap + self.over,
                "over-committed: {self:?}"
            );
            assert!(
                self.committed() <= self.cap + self.over,
                "commitment above the cap: {self:?}"
            );
            assert!(self.given(None) <= self.cap);
            for (i, &(g, c, h)) in self.members.iter().enumerate() {
                assert!(h <= c || self.forced, "member {i} past its ceiling");
                // While the commitment fits the cap in force (no forced charge or
                // lowered cap left it above), every live member can take the rest of
                // its guarantee now, by either rule.
                let rest = unused(g, h);
                let others = self.others_unused(i);
                if self.committed() <= self.cap && rest > 0 {
                    assert!(
                        reserve_owed(self.cap, self.used(), h, g, rest).is_some(),
                        "member {i} cannot take the rest of its guarantee: {self:?}"
                    );
                    assert!(
                        reserve(self.cap, self.used(), h, c, rest, others).is_some(),
                        "member {i}: the plain rule breaks its guarantee: {self:?}"
                    );
                }
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join { guarantee: u64, ceiling: u64 },
        Leave { who: usize },
        Reserve { who: usize, bytes: u64 },
        Free { who: usize, bytes: u64 },
        Force { who: usize, bytes: u64 },
        Resize { cap: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..60, 1u64..101).prop_map(|(guarantee, ceiling)| Op::Join { guarantee, ceiling }),
            (0usize..8).prop_map(|who| Op::Leave { who }),
            // (never 0: the pool serves a request of nothing without asking the rule)
            (0usize..8, 1u64..70).prop_map(|(who, bytes)| Op::Reserve { who, bytes }),
            (0usize..8, 0u64..70).prop_map(|(who, bytes)| Op::Free { who, bytes }),
            (0usize..8, 0u64..40).prop_map(|(who, bytes)| Op::Force { who, bytes }),
            // `gpucap pool resize`: the cap changed while members hold the GPU.
            (1u64..101).prop_map(|cap| Op::Resize { cap }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Whatever members join, leave, reserve, free, are charged by force and however
        /// the cap is resized, no reservation takes the pool past the cap in force, the
        /// pool never holds more than its cap plus what forced charges and lowered caps
        /// left above it, and while nothing did, no live member's guarantee is ever out
        /// of its reach.
        #[test]
        fn never_over_commits_and_never_breaks_a_live_guarantee(
            cap in 1u64..101,
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let mut m = Model { cap, members: Vec::new(), over: 0, forced: false };
            for o in ops {
                m.step(o);
            }
        }

        /// The rule is monotone: a request that fits, any smaller one fits too.
        #[test]
        fn smaller_requests_fit_when_larger_ones_do(
            cap in 0u64..1000, used in 0u64..1000, held in 0u64..1000,
            ceiling in 0u64..1000, others in 0u64..1000, r in 0u64..1000, s in 0u64..1000,
        ) {
            let (small, large) = (r.min(s), r.max(s));
            if reserve(cap, used, held, ceiling, large, others).is_some() {
                prop_assert!(reserve(cap, used, held, ceiling, small, others).is_some());
            }
        }
    }
}
