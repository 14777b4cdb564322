//! A member's guarantee and ceiling in the pool file's words: claiming them at join
//! (admission), the reservation check, the free figure a member sees. What is decided
//! is `shares`'s (pure functions); this file only reads and writes the words.
//!
//! Per GPU entry, a bit per slot says which members hold a guarantee, so a reservation
//! reads four words when nobody does, and one guarantee and one `used` per member that
//! does. A member's guarantee and ceiling are written once, when it claims them under
//! the GPU's word lock, and cleared when its share is taken back or given back (with
//! its slot): a killed member's guarantee returns with its bytes.

use std::fmt;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, SeqCst},
};
use std::time::{Duration, Instant};

use super::account::PoolRefusal;
use super::gpu_words::GpuWords;
use super::layout;
use super::member::Member;
use super::shares::{self, Admission, Share};
use crate::size::format_bytes;

/// How often a member waiting to be admitted (`GPUCAP_WAIT`) looks again.
const ADMISSION_RECHECK: Duration = Duration::from_millis(50);

/// A live member holding a guarantee, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
    pub guarantee: u64,
}

/// Why a guarantee was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRefusal {
    pub guarantee: u64,
    pub why: Admission,
    /// The members that hold guarantees on the GPU.
    pub holders: Vec<Holder>,
    /// How long the process waited to be admitted (`GPUCAP_WAIT`).
    pub waited: Duration,
}

impl fmt::Display for ClaimRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = format_bytes;
        match self.why {
            Admission::Promised { given, cap } => write!(
                f,
                "a guarantee of {} does not fit: {} of the pool's {} cap is guaranteed already",
                b(self.guarantee),
                b(given),
                b(cap)
            )?,
            Admission::Borrowed { used, unused, cap } => write!(
                f,
                "a guarantee of {} is not free now: {} of the pool's {} cap in use and {} \
                 kept for other members' guarantees",
                b(self.guarantee),
                b(used),
                b(cap),
                b(unused)
            )?,
        }
        if !self.holders.is_empty() {
            let list: Vec<String> = self
                .holders
                .iter()
                .map(|h| format!("{} to pid {} ({})", b(h.guarantee), h.pid, h.command))
                .collect();
            write!(f, " (guaranteed: {})", list.join(", "))?;
        }
        if !self.waited.is_zero() {
            write!(
                f,
                ", after waiting {:.1} s for members to leave",
                self.waited.as_secs_f64()
            )?;
        }
        Ok(())
    }
}

/// What a claim left in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The share claimed (or nothing: the device is not the pool's).
    Own,
    /// `gpucap pool set` changed this member's share on the GPU after it registered
    /// the GPU and before it claimed: the change's share, in force instead of the one
    /// claimed (a change that landed wins; the command said it was made). The ceiling
    /// None: none of its own (the pool's cap).
    Set {
        guarantee: u64,
        ceiling: Option<u64>,
    },
}

impl Member<'_> {
    /// Claims `share` on CUDA ordinal `device` (registered first): admitted if the live
    /// members' guarantees and the memory in use leave room for its guarantee, checked
    /// and written in one step under the GPU's word lock. With `GPUCAP_WAIT`, a refused
    /// claim is tried again as members leave or free memory, up to that long. Where
    /// `gpucap pool set` changed this member's share on the GPU since it joined, that
    /// share stays in force and nothing is claimed ([`Claimed::Set`]).
    pub fn claim(&self, device: usize, share: Share) -> Result<Claimed, ClaimRefusal> {
        let Some(g) = self.entry_of(device) else {
            return Ok(Claimed::Own); // not in the pool: nothing to keep
        };
        let wait = self.wait.map_or(Duration::ZERO, |(max, _)| max);
        let start = Instant::now();
        let (mut swept, mut repaired) = (false, false);
        loop {
            let refused = match self.claim_now(g, share) {
                Ok(claimed) => return Ok(claimed),
                Err(r) => r,
            };
            if !swept {
                swept = true;
                if self.sweep() > 0 {
                    continue; // the dead's guarantees came back
                }
            }
            // Guarantees no member could have been given (an empty slot's, one above
            // the cap, ...) are cleared: this claim is tried against the rest.
            if !repaired {
                repaired = true;
                if self.repair_shares(g) {
                    continue;
                }
            }
            let waited = start.elapsed();
            if waited >= wait {
                return Err(ClaimRefusal {
                    waited: if wait.is_zero() {
                        Duration::ZERO
                    } else {
                        waited
                    },
                    ..refused
                });
            }
            let word = self.w.gpu(g, layout::G_WAIT_SEQ);
            let seen = word.load(Acquire);
            self.locks
                .sleep_on(word, seen, (wait - waited).min(ADMISSION_RECHECK));
            self.sweep();
            self.repair_shares(g);
        }
    }

    fn claim_now(&self, g: usize, share: Share) -> Result<Claimed, ClaimRefusal> {
        // Written first, then checked against `used`, whose word is then swapped for the
        // next one (the same bytes, one more change): a reservation that read `used`
        // before fails its swap and reads again, and then sees these words. Taken back
        // if refused (meanwhile others only kept more for this member).
        self.locked(g, || {
            // A change by `gpucap pool set` holds this word lock too: it landed before
            // this look, or comes after the claim and changes the claimed share.
            if self.w.slot(self.slot, layout::S_SHARE_GEN).load(SeqCst) & 1 << g != 0 {
                return Ok(self.take_set_share(g));
            }
            // A ceiling at the cap (`shares::check` gives the cap where none is set) is
            // no ceiling of its own: written as none, so that it follows the pool's cap
            // when a resize changes it (a member kept at the old cap after a raise, or
            // a ceiling word above a lowered cap that others clear as damage).
            let share = Share {
                ceiling: if share.ceiling >= layout::limit_of(self.caps[g].load(Relaxed)) {
                    0
                } else {
                    share.ceiling
                },
                ..share
            };
            self.write_share(g, share);
            // After the share words: a resize under way now sees them, or its cap word
            // is seen here (the lower of the two caps decides).
            let pool = layout::decode_cap(self.w.gpu(g, layout::G_CAP).load(SeqCst))
                .flatten()
                .unwrap_or(u64::MAX);
            let cap = self.cap_now(g).0.min(pool);
            let used = self.w.gpu(g, layout::G_USED);
            loop {
                let word = used.load(SeqCst);
                let (mut given, mut unused) = (0u64, 0u64);
                for s in self.guaranteed(g) {
                    let gj = self.w.share(s, g, layout::SH_GUARANTEE).load(SeqCst);
                    given = given.saturating_add(gj);
                    let held = self.w.member_gpu(s, g, layout::M_USED).load(SeqCst);
                    unused = unused.saturating_add(shares::unused(gj, held));
                }
                let bytes = layout::used_bytes(word);
                if let Err(why) = shares::admit(cap, given, bytes, unused, share.guarantee) {
                    self.write_share(
                        g,
                        Share {
                            guarantee: 0,
                            ceiling: 0,
                        },
                    );
                    return Err(ClaimRefusal {
                        guarantee: share.guarantee,
                        why,
                        holders: self.holders(g),
                        waited: Duration::ZERO,
                    });
                }
                if used
                    .compare_exchange(word, layout::used_word(word, bytes), SeqCst, SeqCst)
                    .is_ok()
                {
                    return Ok(Claimed::Own);
                }
            }
        })
    }

    /// Under GPU entry `g`'s word lock, once `gpucap pool set` changed this member's
    /// share there: the change's words taken as its own share (if a reservation or
    /// repair has not taken them already), and that share.
    fn take_set_share(&self, g: usize) -> Claimed {
        if let Some(words) = self.share_to_take(g) {
            // The cap the change was checked against, the pool's cap word (a resize
            // under way changes no share word).
            self.take_share(g, words, self.w.gpu(g, layout::G_CAP).load(SeqCst));
        }
        Claimed::Set {
            guarantee: self.own_word(g, layout::SH_GUARANTEE),
            ceiling: Some(self.own_word(g, layout::SH_CEILING)).filter(|&c| c != 0),
        }
    }

    /// Writes this member's guarantee and ceiling on GPU entry `g`, and its bit, in its
    /// own memory (what it decides by) and in the pool file (what the others read).
    fn write_share(&self, g: usize, share: Share) {
        if let Some(own) = self.own.get(g) {
            own[layout::SH_GUARANTEE].store(share.guarantee, SeqCst);
            own[layout::SH_CEILING].store(share.ceiling, SeqCst);
        }
        self.write_own_words(g);
    }

    /// Writes this member's share on GPU entry `g` as it claimed it (`own`) into its
    /// share words and its bit.
    pub(super) fn write_own_words(&self, g: usize) {
        let share = Share {
            guarantee: self.own_word(g, layout::SH_GUARANTEE),
            ceiling: self.own_word(g, layout::SH_CEILING),
        };
        let mine = |i| self.w.share(self.slot, g, i);
        mine(layout::SH_GUARANTEE).store(share.guarantee, SeqCst);
        mine(layout::SH_CEILING).store(share.ceiling, SeqCst);
        let (k, bit) = (self.slot / 64, 1u64 << (self.slot % 64));
        if share.guarantee > 0 {
            self.w.share_bits(g, k).fetch_or(bit, SeqCst);
        } else {
            self.w.share_bits(g, k).fetch_and(!bit, SeqCst);
        }
        self.note_route(g);
    }

    /// Word `i` (`SH_GUARANTEE`, `SH_CEILING`) of the share this member claimed on GPU
    /// entry `g`, from its own memory (0: none).
    #[inline(always)]
    pub(super) fn own_word(&self, g: usize, i: usize) -> u64 {
        self.own
            .get(g)
            .and_then(|o| o.get(i))
            .map_or(0, |w| w.load(Relaxed))
    }

    /// This member's guarantee and ceiling on GPU entry `g` as it claimed them (the
    /// ceiling `u64::MAX`: none of its own), from its own memory: a share word another
    /// process changed neither lifts nor lowers them.
    #[inline(always)]
    pub(super) fn own_share(&self, g: usize) -> (u64, u64) {
        let ceiling = match self.own_word(g, layout::SH_CEILING) {
            0 => u64::MAX,
            c => c,
        };
        (self.own_word(g, layout::SH_GUARANTEE), ceiling)
    }

    /// The slots other than this one holding a guarantee on GPU entry `g`.
    pub(super) fn guaranteed(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        let slots = self.w.slots();
        (0..self.w.share_bits_of(g).len())
            .flat_map(move |k| {
                let mut bits = self.w.share_bits(g, k).load(Acquire);
                if k == self.slot / 64 {
                    bits &= !(1u64 << (self.slot % 64));
                }
                std::iter::from_fn(move || {
                    if bits == 0 {
                        return None;
                    }
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    Some(k * 64 + b)
                })
            })
            .filter(move |&s| s < slots) // bits past the slots: none a member sets
    }

    fn holders(&self, g: usize) -> Vec<Holder> {
        self.guaranteed(g)
            .map(|s| Holder {
                pid: layout::word_pid(self.w.slot(s, layout::S_PID).load(Relaxed)),
                command: self.w.command(s),
                guarantee: self.w.share(s, g, layout::SH_GUARANTEE).load(Relaxed),
            })
            .collect()
    }

    /// What the other members have left of their guarantees on GPU entry `g`.
    pub(super) fn others_unused(&self, g: usize) -> u64 {
        self.hot(g).map_or(0, |h| self.others_unused_at(h, g))
    }

    /// [`others_unused`](Self::others_unused) with GPU entry `g`'s words `h`: four loads
    /// and masks when nobody else holds a guarantee (on every reservation).
    #[inline(always)]
    fn others_unused_at(&self, h: &GpuWords<'_>, g: usize) -> u64 {
        let bits: [u64; layout::SHARE_HEAD_WORDS] =
            std::array::from_fn(|k| h.bits[k].load(Acquire) & self.not_me[k]);
        if bits.iter().fold(0, |a, b| a | b) == 0 && h.more.is_empty() {
            return 0;
        }
        self.unused_of(g, bits, h.more)
    }

    /// The unused guarantees of the slots in `bits` (the first 256 slots) and `more`
    /// (the others, this member's own bit masked) on GPU entry `g`.
    #[cold]
    fn unused_of(
        &self,
        g: usize,
        bits: [u64; layout::SHARE_HEAD_WORDS],
        more: &[AtomicU64],
    ) -> u64 {
        let mut total = 0u64;
        let rest = more.iter().enumerate().map(|(i, w)| {
            let k = layout::SHARE_HEAD_WORDS + i;
            let mine = if k == self.slot / 64 {
                1u64 << (self.slot % 64)
            } else {
                0
            };
            w.load(Acquire) & !mine
        });
        for (k, mut b) in bits.into_iter().chain(rest).enumerate() {
            while b != 0 {
                let s = k * 64 + b.trailing_zeros() as usize;
                b &= b - 1;
                if s >= self.w.slots() {
                    continue; // past the slots: no member sets it
                }
                let gj = self.w.share(s, g, layout::SH_GUARANTEE).load(Relaxed);
                let held = self.w.member_gpu(s, g, layout::M_USED).load(Relaxed);
                total = total.saturating_add(shares::unused(gj, held));
            }
        }
        total
    }

    /// This member's ceiling on GPU entry `g` (`u64::MAX`: none of its own).
    fn ceiling(&self, g: usize) -> u64 {
        self.own_share(g).1
    }

    /// The pool's new use if this member, holding
    /// `own` while the pool uses `pool` of `cap`, may take `bytes` more (the reservation
    /// rule of `shares::reserve`).
    ///
    /// A request inside this member's own guarantee does not weigh the others' unused
    /// guarantees (`shares::reserve_owed`): the pool keeps room for every unused
    /// guarantee (each borrower leaves it), so such a request fits whenever the cap has
    /// the room. It must not weigh them: another member's change in flight (its bytes
    /// in `used` before its own word, or off its own word before `used`: see
    /// `used.rs`) makes its unused guarantee look larger than it is, and a guaranteed
    /// request would be refused. For a borrower that error errs on the safe side.
    pub(super) fn fits(&self, g: usize, pool: u64, own: u64, bytes: u64, cap: u64) -> Option<u64> {
        let h = self.hot(g)?;
        let (guarantee, ceiling) = self.own_share(g);
        self.fits_under(h, g, pool, own, bytes, cap, guarantee, ceiling)
    }

    /// [`fits`](Self::fits) with GPU entry `g`'s words `h`, this member's `guarantee`
    /// and `ceiling` read already.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fits_under(
        &self,
        h: &GpuWords<'_>,
        g: usize,
        pool: u64,
        own: u64,
        bytes: u64,
        cap: u64,
        guarantee: u64,
        ceiling: u64,
    ) -> Option<u64> {
        // A guarantee `gpucap pool set` lowered counts at once, before this member takes
        // its words: the others lend out the rest from then (`share_set`).
        let guarantee = if guarantee != 0 {
            guarantee.min(
                self.w
                    .share(self.slot, g, layout::SH_GUARANTEE)
                    .load(SeqCst),
            )
        } else {
            0
        };
        if guarantee != 0 {
            // Called inside a change (`Member::add`): `pending` holds this request's
            // bytes and those of this process's other changes in flight. Those count as
            // held: another thread's reservation may have swapped `used` and not yet
            // raised `own`, and two threads must not each take the guarantee's rest
            // without weighing the others' (a borrow that could break their guarantees).
            let in_flight = h.mine[layout::M_PENDING].load(SeqCst).saturating_sub(bytes);
            let held = own.saturating_add(in_flight);
            if let Some(new) = shares::reserve_owed(cap, pool, held, guarantee, bytes) {
                return Some(new);
            }
        }
        shares::reserve(cap, pool, own, ceiling, bytes, self.others_unused_at(h, g))
    }

    /// The refusal of `bytes` on GPU entry `g` if they would take this member past its
    /// own ceiling (refused at once: waiting for other members would not help).
    pub(super) fn past_ceiling(&self, g: usize, bytes: u64) -> Option<PoolRefusal> {
        let ceiling = self.ceiling(g);
        let own = self
            .w
            .member_gpu(self.slot, g, layout::M_USED)
            .load(Relaxed);
        shares::past_ceiling(own, ceiling, bytes).then(|| PoolRefusal {
            requested: bytes,
            used: self.w.used(g),
            cap: layout::decode_cap(self.caps[g].load(Relaxed))
                .flatten()
                .unwrap_or(u64::MAX),
            own,
            left: false,
            waited_ms: 0,
            ceiling: Some(ceiling),
            kept_for_others: 0,
        })
    }

    /// Clears slot `d`'s guarantees and ceilings (its share was taken or given back), on
    /// the GPU entries in use (see `clear_new_slot_shares`).
    pub(super) fn forget_shares(&self, d: usize) {
        let (k, bit) = (d / 64, 1u64 << (d % 64));
        for g in (0..layout::MAX_POOL_GPUS).filter(|&g| self.w.has_gpu(g)) {
            self.w.share_bits(g, k).fetch_and(!bit, AcqRel);
            self.w.share(d, g, layout::SH_GUARANTEE).store(0, Relaxed);
            self.w.share(d, g, layout::SH_CEILING).store(0, Relaxed);
        }
    }

    /// What this member sees of CUDA ordinal `device` in the pool: (what it could
    /// reserve now, its ceiling or the cap), or None if the device is not registered.
    pub fn room(&self, device: usize) -> Option<(u64, Option<u64>)> {
        let g = self.entry_of(device)?;
        // A change `gpucap pool set` made is taken first; then its own words as it
        // claimed them, if another process changed them.
        self.refresh_cap(g);
        self.repair_own_shares(g);
        let cap = layout::decode_cap(self.caps[g].load(Relaxed)).flatten();
        let ceiling = self.ceiling(g);
        let used = self.w.used(g);
        let own = self
            .w
            .member_gpu(self.slot, g, layout::M_USED)
            .load(Relaxed);
        let free = shares::free(
            cap.unwrap_or(u64::MAX),
            used,
            own,
            ceiling,
            self.others_unused(g),
        );
        let total = match (cap, ceiling) {
            (_, c) if c != u64::MAX => Some(c),
            (cap, _) => cap,
        };
        Some((free, total))
    }
}
