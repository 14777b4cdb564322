//! The one policy for charging memory the driver takes on its own, in two steps around
//! the driver call:
//!
//! - [`reserve_expected`] before it: what a call of its kind is expected to take is
//!   reserved against the cap (the process's and its pool's, with the other members'
//!   guarantees), so that a call the cap cannot take is refused with
//!   `CUDA_ERROR_OUT_OF_MEMORY` while it can still fail, before the driver takes
//!   anything;
//! - [`charge`] after it: the reservation is settled to the measured figure. Where the
//!   call can still be undone (a context destroyed, a module unloaded, a limit set back),
//!   a figure the cap cannot take refuses it: the caller undoes the call, then gives the
//!   reservation back. Where it cannot (a launch that loaded kernels, graph memory the
//!   driver reserved), the figure is charged whatever the cap says: the reserved part
//!   from the reservation, the rest from the room left if there is any, else by force
//!   (`Ledger::charge_past_cap`: past the cap, the pool's share taken first out of this member's
//!   own guarantee, never out of another member's).
//!
//! Invariants (property-tested below): a charge is never below the measured figure
//! (what stays charged is exactly that figure); a call is refused only when the figure
//! does not fit under the cap; a figure that fits is never forced; and nothing is
//! counted as a refusal that the program does not see as one.

use crate::ledger::{Ledger, Refusal, Reservation};

/// Whether the call a charge is for can still be taken back once made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undo {
    /// The caller can undo it (destroy the context, unload the module, set the limit
    /// back): a figure the cap cannot take is refused.
    Possible,
    /// It is done for good (kernels loaded, graph memory reserved): charged by force.
    Impossible,
}

/// What [`charge`] charged: `bytes` in all, `forced` of them without a check (the part
/// beyond the reservation, where the cap had no room for all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charged {
    pub bytes: u64,
    pub forced: u64,
}

/// A figure the cap cannot take, for a call that can be undone: the caller undoes the
/// call first, then drops `held` (what was reserved before it goes back only once the
/// driver freed the memory), and says `refusal`.
#[must_use = "the call must be undone before its reservation is given back"]
pub struct Refused<'a> {
    pub held: Option<Reservation<'a>>,
    pub bytes: u64,
    pub refusal: Refusal,
}

/// Reserves `expected` bytes on `device` before a driver call that may take them (None
/// for 0: nothing known, nothing reserved). Err: the cap cannot take them, and the call
/// must not be made.
pub fn reserve_expected(
    ledger: &Ledger,
    device: usize,
    expected: u64,
) -> Result<Option<Reservation<'_>>, Refusal> {
    match expected {
        0 => Ok(None),
        bytes => ledger.reserve(device, bytes).map(Some),
    }
}

/// Charges `bytes`, the measured figure of a call the driver made on `device`, `held`
/// being what [`reserve_expected`] reserved before it (see the module's policy).
pub fn charge<'a>(
    ledger: &'a Ledger,
    device: usize,
    held: Option<Reservation<'a>>,
    bytes: u64,
    undo: Undo,
) -> Result<Charged, Refused<'a>> {
    charge_floored(ledger, device, held, bytes, bytes, undo)
}

/// [`charge`] of a figure held at what a call of its kind takes (a context's expectation,
/// a raised stack's size) above what was seen taken in the call, `backed` (a
/// measurement that a free beside it made short, or a driver that took nothing): all of
/// `bytes` charged, only `backed` of it marked made in the pool's marks
/// (`Reservation::keep_backed`), so that another member's measurement whose window held
/// the call takes off no more than the driver was seen taking.
pub fn charge_floored<'a>(
    ledger: &'a Ledger,
    device: usize,
    held: Option<Reservation<'a>>,
    bytes: u64,
    backed: u64,
    undo: Undo,
) -> Result<Charged, Refused<'a>> {
    if undo == Undo::Possible {
        let kept = match held {
            Some(mut r) => match ledger.resize(&mut r, bytes) {
                Ok(()) => r,
                Err(refusal) => {
                    return Err(Refused {
                        held: Some(r),
                        bytes,
                        refusal,
                    });
                }
            },
            None if bytes == 0 => return Ok(Charged { bytes, forced: 0 }),
            None => ledger.reserve(device, bytes).map_err(|refusal| Refused {
                held: None,
                bytes,
                refusal,
            })?,
        };
        kept.keep_backed(backed);
        return Ok(Charged { bytes, forced: 0 });
    }
    Ok(charge_done(ledger, device, held, bytes))
}

/// [`charge`] of a call that cannot be undone ([`Undo::Impossible`]): never refused.
pub fn charge_done<'a>(
    ledger: &'a Ledger,
    device: usize,
    held: Option<Reservation<'a>>,
    bytes: u64,
) -> Charged {
    let reserved = held.as_ref().map_or(0, |r| r.charge().bytes);
    if let Some(mut r) = held {
        // Shrinking (or keeping) a reservation is never refused.
        let _ = ledger.resize(&mut r, bytes.min(reserved));
        r.keep();
    }
    let beyond = bytes.saturating_sub(reserved);
    if beyond == 0 {
        return Charged { bytes, forced: 0 };
    }
    // Taken where there is room; what a full cap cannot take is forced, and no refusal
    // is counted: the program saw none.
    let forced = match ledger.try_reserve(device, beyond) {
        Some(r) => {
            r.keep();
            0
        }
        None => {
            ledger.charge_past_cap(device, beyond);
            beyond
        }
    };
    Charged { bytes, forced }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DEV: usize = 0;

    fn capped(cap: u64) -> Ledger {
        let l = Ledger::new();
        l.set_cap(DEV, Some(cap));
        l
    }

    fn used(l: &Ledger) -> u64 {
        l.usage(DEV).unwrap().used
    }

    fn refusals(l: &Ledger) -> u64 {
        l.usage(DEV).unwrap().refusals
    }

    #[test]
    fn an_undoable_call_the_cap_cannot_take_is_refused_and_its_reservation_kept_for_the_undo() {
        let l = capped(100);
        let held = reserve_expected(&l, DEV, 40).unwrap();
        let refused = charge(&l, DEV, held, 120, Undo::Possible).err().unwrap();
        assert_eq!(refused.bytes, 120);
        // Still held while the caller undoes the call.
        assert_eq!(used(&l), 40);
        drop(refused.held);
        assert_eq!(used(&l), 0);
    }

    #[test]
    fn a_call_done_for_good_is_charged_past_the_cap_without_a_refusal_counted() {
        let l = capped(100);
        let held = reserve_expected(&l, DEV, 40).unwrap();
        let c = charge(&l, DEV, held, 120, Undo::Impossible).ok().unwrap();
        // Beyond the 40 reserved, 80 more: 60 of room could not take them.
        assert_eq!(
            c,
            Charged {
                bytes: 120,
                forced: 80
            }
        );
        assert_eq!(used(&l), 120);
        assert_eq!(refusals(&l), 0);
    }

    #[test]
    fn a_figure_below_the_expectation_gives_the_rest_back() {
        for undo in [Undo::Possible, Undo::Impossible] {
            let l = capped(100);
            let held = reserve_expected(&l, DEV, 40).unwrap();
            let c = charge(&l, DEV, held, 10, undo).ok().unwrap();
            assert_eq!(
                c,
                Charged {
                    bytes: 10,
                    forced: 0
                }
            );
            assert_eq!(used(&l), 10);
        }
    }

    #[test]
    fn nothing_expected_reserves_nothing_and_an_expectation_past_the_cap_is_refused() {
        let l = capped(100);
        assert!(reserve_expected(&l, DEV, 0).unwrap().is_none());
        assert!(reserve_expected(&l, DEV, 101).is_err());
        assert_eq!((used(&l), refusals(&l)), (0, 1));
    }

    /// One driver call: what is already charged on the device, what was expected of
    /// the call, what it measured, and whether it can be undone.
    #[derive(Debug, Clone)]
    struct Call {
        before: u64,
        expected: u64,
        measured: u64,
        undo: Undo,
    }

    fn call() -> impl Strategy<Value = Call> {
        (0u64..150, 0u64..80, 0u64..120, any::<bool>()).prop_map(
            |(before, expected, measured, possible)| Call {
                before,
                expected,
                measured,
                undo: if possible {
                    Undo::Possible
                } else {
                    Undo::Impossible
                },
            },
        )
    }

    proptest! {
        /// Over random calls beside random charges on a 100-byte cap: a call made is
        /// charged exactly its measured figure (never less); one that can be undone is
        /// refused only when that figure does not fit, and refused before the driver
        /// call only when the expectation does not; a figure that fits is never forced;
        /// a call done for good never counts a refusal.
        #[test]
        fn charged_never_below_the_figure_refused_only_when_it_does_not_fit(
            calls in prop::collection::vec(call(), 1..32),
        ) {
            const CAP: u64 = 100;
            for c in calls {
                let l = capped(CAP);
                l.charge_past_cap(DEV, c.before);
                let held = match reserve_expected(&l, DEV, c.expected) {
                    Ok(h) => h,
                    Err(_) => {
                        prop_assert!(c.before + c.expected > CAP, "{c:?} refused up front");
                        prop_assert_eq!(used(&l), c.before);
                        continue;
                    }
                };
                let refusals_before = refusals(&l);
                // Nothing taken fits even past the cap (where a forced charge left it).
                let fits = c.measured == 0 || c.before + c.measured <= CAP;
                match charge(&l, DEV, held, c.measured, c.undo) {
                    Ok(charged) => {
                        prop_assert_eq!(charged.bytes, c.measured);
                        prop_assert_eq!(used(&l), c.before + c.measured, "{:?}", c);
                        prop_assert!(fits || c.undo == Undo::Impossible, "{c:?} not refused");
                        if fits {
                            prop_assert_eq!(charged.forced, 0, "{:?} forced", c);
                        }
                        if c.undo == Undo::Impossible {
                            prop_assert_eq!(refusals(&l), refusals_before);
                        }
                    }
                    Err(refused) => {
                        prop_assert_eq!(c.undo, Undo::Possible);
                        prop_assert!(!fits, "{c:?} refused with room under the cap");
                        drop(refused.held);
                        prop_assert_eq!(used(&l), c.before);
                    }
                }
            }
        }

        /// Random interleavings of residents taken and given back on one ledger (a
        /// first load, a context, kernels loaded past the cap, an unload): the device's
        /// charge is always the sum of what the residents alive measured, never below
        /// it, and an undoable call is refused only when its figure does not fit.
        #[test]
        fn over_interleavings_the_charge_is_the_sum_of_the_residents_alive(
            steps in prop::collection::vec((call(), any::<bool>(), any::<prop::sample::Index>()), 1..48),
        ) {
            const CAP: u64 = 100;
            let l = capped(CAP);
            let mut alive: Vec<u64> = Vec::new();
            for (c, unload, which) in steps {
                if unload && !alive.is_empty() {
                    let bytes = alive.swap_remove(which.index(alive.len()));
                    l.settle(crate::ledger::Charge { device: DEV, bytes });
                } else {
                    let before = used(&l);
                    let held = match reserve_expected(&l, DEV, c.expected) {
                        Ok(h) => h,
                        Err(_) => {
                            prop_assert!(before + c.expected > CAP, "{c:?} refused up front at {before}");
                            continue;
                        }
                    };
                    let fits = c.measured == 0 || before + c.measured <= CAP;
                    match charge(&l, DEV, held, c.measured, c.undo) {
                        Ok(charged) => {
                            prop_assert!(fits || c.undo == Undo::Impossible, "{c:?} not refused at {before}");
                            alive.push(charged.bytes);
                        }
                        Err(refused) => {
                            prop_assert!(!fits, "{c:?} refused with room at {before}");
                            drop(refused.held);
                        }
                    }
                }
                prop_assert_eq!(used(&l), alive.iter().sum::<u64>());
            }
        }
    }
}
