//! A live member's guarantee and ceiling changed by another process (`gpucap pool set`),
//! and how the member takes them.
//!
//! A member decides by the share it claimed, kept in its own memory (`Member::own`):
//! share words another process changed are damage, written back (`repair`). A change
//! by `gpucap pool set` is told apart from damage by two counts: the GPU entry's cap
//! generation (`G_CAP_GEN`, which sends every member's next reservation the full way)
//! and the slot's share change count (`S_SHARE_GEN`, which tells the member that the
//! change is its own). The changer joins the pool for the change (a slot of its own, so
//! that it may hold the GPU's word lock, as a claim does), then:
//!
//! 1. takes the entry's turn (the generation made odd: one resize or change at a time),
//!    then the word lock (no repair, claim or recount runs meanwhile);
//! 2. checks the new figures against the cap in force: a ceiling at most the cap, a
//!    guarantee at most the ceiling; a raised guarantee is admitted as a joiner's is
//!    (`shares::admit_raise`): the live members' guarantees must fit the cap, and the
//!    raise must be free now;
//! 3. writes the member's share words and holder bit, then (for a raise) checks the
//!    admission against `used` and swaps `used` for the next word (the same bytes, one
//!    more change): a reservation that read `used` before fails its swap and reads the
//!    new words. A refused change writes the old words back;
//! 4. counts the change in the member's slot, makes the generation even (in force), gives
//!    the word lock back and wakes the waiters: a raised ceiling serves its member's
//!    waiting request at once.
//!
//! A member still starting (its GPU registered, its own guarantee and ceiling not yet
//! claimed) can be changed too: the change then wins over the share its configuration
//! asks for. Its claim, under the same word lock, finds the GPU entry's bit in its
//! slot's change word (`S_SHARE_GEN`) and takes the change's words as its share instead
//! of writing its own over them (`Member::claim`, `Claimed::Set`).
//!
//! The member takes its words at its next reservation, wait turn, `cuMemGetInfo` or
//! repair (`Member::refresh_cap`), before any of them decides. Until then it holds the
//! share it had, which errs on the safe side everywhere but for a lowered guarantee:
//! the others may lend out its freed part at once, so a request inside the member's
//! guarantee goes by the lower of the guarantee it holds and its word (`fits_under`).
//! A lowered ceiling takes nothing back: the member's new allocations are refused (or
//! wait) until it holds less.

use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use super::layout;
use super::member::Member;
use super::resize::{take_turn, turn_busy_text};
use super::share_words::Holder;
use super::shares::{self, Admission};
use crate::size::format_bytes;

/// What `gpucap pool set` changes (None: left as it is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareChange {
    pub guarantee: Option<u64>,
    /// Some(None): no ceiling of its own (the pool's cap).
    pub ceiling: Option<Option<u64>>,
}

/// A change done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareSet {
    pub pid: u32,
    pub command: String,
    /// The guarantee and ceiling before and after (ceiling None: the pool's cap).
    pub old: (u64, Option<u64>),
    pub new: (u64, Option<u64>),
    /// What the member held when the change came into force.
    pub held: u64,
}

/// Why a change was refused (nothing was changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareRefusal {
    /// The pool has no entry for the GPU.
    NoGpu,
    /// The slot holds no live member using the GPU.
    NoMember,
    /// Another resize or `pool set` of the GPU, by a live process, held the turn for all
    /// of `TURN_WAIT`.
    Busy,
    /// The ceiling is above the pool's cap.
    CeilingAboveCap { ceiling: u64, cap: u64 },
    /// The guarantee is above the member's ceiling (or the cap, without one).
    AboveCeiling { guarantee: u64, ceiling: u64 },
    /// The guarantee is not admitted (`shares::admit_raise`).
    Admission {
        guarantee: u64,
        why: Admission,
        /// The other members that hold guarantees on the GPU.
        holders: Vec<Holder>,
    },
}

impl fmt::Display for ShareRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = format_bytes;
        match self {
            ShareRefusal::NoGpu => write!(f, "no member of the pool has used that GPU yet"),
            ShareRefusal::NoMember => write!(f, "the member does not use that GPU"),
            ShareRefusal::Busy => f.write_str(&turn_busy_text()),
            ShareRefusal::CeilingAboveCap { ceiling, cap } => write!(
                f,
                "the ceiling {} is above the pool's cap {} (gpucap pool resize raises the cap)",
                b(*ceiling),
                b(*cap)
            ),
            ShareRefusal::AboveCeiling { guarantee, ceiling } => write!(
                f,
                "the guarantee {} is above the member's ceiling {} (a member cannot be kept \
                 more than it may hold: raise --ceiling too)",
                b(*guarantee),
                b(*ceiling)
            ),
            ShareRefusal::Admission {
                guarantee,
                why,
                holders,
            } => {
                match *why {
                    Admission::Promised { given, cap } => write!(
                        f,
                        "the guarantee {} does not fit: {} of the pool's {} cap is guaranteed \
                         to the other members already",
                        b(*guarantee),
                        b(given),
                        b(cap)
                    )?,
                    Admission::Borrowed { used, unused, cap } => write!(
                        f,
                        "the guarantee {} is not free now: {} of the pool's {} cap in use and \
                         {} kept for the other members' guarantees",
                        b(*guarantee),
                        b(used),
                        b(cap),
                        b(unused)
                    )?,
                }
                if !holders.is_empty() {
                    let list: Vec<String> = holders
                        .iter()
                        .map(|h| format!("{} to pid {} ({})", b(h.guarantee), h.pid, h.command))
                        .collect();
                    write!(f, " (guaranteed: {})", list.join(", "))?;
                }
                Ok(())
            }
        }
    }
}

impl Member<'_> {
    /// Changes the guarantee and ceiling of the member in slot `target` on the GPU
    /// `uuid` (see the module's text). This member is the changer: it holds no share.
    pub fn set_share(
        &self,
        target: usize,
        uuid: &[u8; 16],
        change: ShareChange,
    ) -> Result<ShareSet, ShareRefusal> {
        let w = self.w;
        let key = layout::gpu_key(uuid);
        let g = (0..layout::MAX_POOL_GPUS)
            .find(|&g| w.gpu(g, layout::G_KEY).load(Acquire) == key)
            .ok_or(ShareRefusal::NoGpu)?;
        if target == self.slot || target >= w.slots() || self.left.load(Acquire) {
            return Err(ShareRefusal::NoMember);
        }
        let turn = take_turn(w, g, self.locks).map_err(|_| ShareRefusal::Busy)?;
        let odd = turn.odd;
        let done = self.locked(g, || {
            let done = self.set_locked(target, g, change);
            if done.is_ok() {
                let _ = w
                    .slot(target, layout::S_SHARE_GEN)
                    .fetch_update(SeqCst, SeqCst, |c| {
                        Some(c.wrapping_add(layout::SHARE_GEN_COUNT) | 1 << g)
                    });
            }
            // In force (or, refused, the same words) before the lock is given back: the
            // member's repair, under the lock, then takes the words rather than
            // writing its old ones back.
            w.gpu(g, layout::G_CAP_GEN).store(odd + 1, SeqCst);
            done
        });
        self.wake_waiters(g);
        done
    }

    /// [`set_share`](Self::set_share) holding GPU entry `g`'s turn and word lock.
    fn set_locked(
        &self,
        target: usize,
        g: usize,
        change: ShareChange,
    ) -> Result<ShareSet, ShareRefusal> {
        let w = self.w;
        if w.state(target).load(SeqCst) != layout::STATE_LIVE
            || !self.locks.held(target)
            || w.member_gpu(target, g, layout::M_CAP).load(SeqCst) == 0
        {
            return Err(ShareRefusal::NoMember);
        }
        let cap = layout::decode_cap(w.gpu(g, layout::G_CAP).load(SeqCst))
            .flatten()
            .unwrap_or(u64::MAX);
        let limit = cap.min(layout::USED_BYTES);
        let words = |i| w.share(target, g, i);
        let old = (
            words(layout::SH_GUARANTEE).load(SeqCst),
            words(layout::SH_CEILING).load(SeqCst),
        );
        let guarantee = change.guarantee.unwrap_or(old.0);
        let ceiling = match change.ceiling {
            None => old.1,
            Some(c) => c.unwrap_or(0),
        };
        if ceiling > limit {
            return Err(ShareRefusal::CeilingAboveCap { ceiling, cap });
        }
        let most = if ceiling == 0 { limit } else { ceiling };
        if guarantee > most {
            return Err(ShareRefusal::AboveCeiling {
                guarantee,
                ceiling: most,
            });
        }
        self.write_words(target, g, guarantee, ceiling);
        let used = w.gpu(g, layout::G_USED);
        loop {
            let word = used.load(SeqCst);
            if guarantee > old.0 {
                let (mut given, mut unused) = (0u64, 0u64);
                for s in self.guaranteed(g).filter(|&s| s != target) {
                    let gj = w.share(s, g, layout::SH_GUARANTEE).load(SeqCst);
                    given = given.saturating_add(gj);
                    let held = w.member_gpu(s, g, layout::M_USED).load(SeqCst);
                    unused = unused.saturating_add(shares::unused(gj, held));
                }
                let held = w.member_gpu(target, g, layout::M_USED).load(SeqCst);
                let bytes = layout::used_bytes(word);
                if let Err(why) = shares::admit_raise(limit, given, bytes, unused, held, guarantee)
                {
                    self.write_words(target, g, old.0, old.1);
                    let holders = self
                        .guaranteed(g)
                        .filter(|&s| s != target)
                        .map(|s| Holder {
                            pid: layout::word_pid(w.slot(s, layout::S_PID).load(Relaxed)),
                            command: w.command(s),
                            guarantee: w.share(s, g, layout::SH_GUARANTEE).load(Relaxed),
                        })
                        .collect();
                    return Err(ShareRefusal::Admission {
                        guarantee,
                        why,
                        holders,
                    });
                }
            }
            // A reservation that read `used` before the new words swaps no more.
            if used
                .compare_exchange(
                    word,
                    layout::used_word(word, layout::used_bytes(word)),
                    SeqCst,
                    SeqCst,
                )
                .is_ok()
            {
                break;
            }
        }
        let shown = |c: u64| (c != 0 && c < limit).then_some(c);
        Ok(ShareSet {
            pid: layout::word_pid(w.slot(target, layout::S_PID).load(Relaxed)),
            command: w.command(target),
            old: (old.0, shown(old.1)),
            new: (guarantee, shown(ceiling)),
            held: w.member_gpu(target, g, layout::M_USED).load(SeqCst),
        })
    }

    /// Writes slot `s`'s guarantee and ceiling words on GPU entry `g` and its holder
    /// bit (under the word lock: no repairer sees them half-written).
    fn write_words(&self, s: usize, g: usize, guarantee: u64, ceiling: u64) {
        let w = self.w;
        w.share(s, g, layout::SH_CEILING).store(ceiling, SeqCst);
        w.share(s, g, layout::SH_GUARANTEE).store(guarantee, SeqCst);
        let (k, bit) = (s / 64, 1u64 << (s % 64));
        if guarantee > 0 {
            w.share_bits(g, k).fetch_or(bit, SeqCst);
        } else {
            w.share_bits(g, k).fetch_and(!bit, SeqCst);
        }
    }

    /// This member's share words on GPU entry `g` (guarantee, ceiling, and the slot's
    /// change count), if `gpucap pool set` changed them since it last took them.
    pub(super) fn share_to_take(&self, g: usize) -> Option<(u64, u64, u64)> {
        let count = self.w.slot(self.slot, layout::S_SHARE_GEN).load(SeqCst);
        if count == self.share_seen[g].load(Acquire) {
            return None;
        }
        let word = |i| self.w.share(self.slot, g, i).load(SeqCst);
        Some((word(layout::SH_GUARANTEE), word(layout::SH_CEILING), count))
    }

    /// Takes `share` (from [`share_to_take`](Self::share_to_take)) as this member's own
    /// on GPU entry `g`, whose cap word is `cap_word`: only figures a change could have
    /// written (a ceiling at most the cap, a guarantee at most the ceiling); others are
    /// damage, and its own stay (written back by its next repair).
    pub(super) fn take_share(&self, g: usize, share: (u64, u64, u64), cap_word: u64) {
        let (guarantee, ceiling, count) = share;
        let limit = layout::limit_of(cap_word);
        let most = if ceiling == 0 { limit } else { ceiling };
        if ceiling <= limit
            && guarantee <= most
            && let Some(own) = self.own.get(g)
        {
            own[layout::SH_GUARANTEE].store(guarantee, SeqCst);
            own[layout::SH_CEILING].store(ceiling, SeqCst);
            self.note_route(g);
        }
        self.share_seen[g].store(count, Release);
    }
}
