//! Resizing a live pool (`gpucap pool resize`): the cap word of a GPU entry changed
//! while members hold it, and how each member learns the new cap.
//!
//! Every member keeps its own copy of the cap (`Member::caps`, and `limit` for the
//! short path), so that a cap word another process damaged does not uncap it. A resize
//! is told apart from damage by the entry's cap generation (`G_CAP_GEN`):
//!
//! 1. the resizer takes the GPU's turn (its lock, held while the resizer's process
//!    lives: one resize at a time, [`take_turn`]) and makes the generation odd (one left
//!    odd by a resizer that died half-way is taken over), writes the cap word, and checks
//!    the live members' guarantees against it (a guarantee claimed at the same time
//!    checks the cap word too: of the two, at least one sees the other);
//! 2. if they do not fit, the old cap is written back and the resize refused, naming
//!    the holders; else the pool's `used` word is swapped for the next one (the same
//!    bytes, one more change), so that a reservation that read `used` before and weighed
//!    the old cap alone fails its swap and reads again, and then the generation is made
//!    even again: the new cap is in force;
//! 3. every member's own cap word (`M_CAP`: what readers and joiners weigh) gets the
//!    new cap;
//! 4. the waiters are woken: a raise serves them at once.
//!
//! A member checks the generation inside each reservation's rule (one load, after its
//! read of `used`): any other value than the one its cap was read at sends the
//! reservation to the full path, which takes the cap word as the member's cap once the
//! generation is even ([`Member::refresh_cap`]) and, while it is odd, weighs the lower
//! of its cap and the cap word ([`Member::cap_now`]). So an admission whose swap lands
//! after the new cap came into force weighed it: one that weighed the old cap alone
//! read `used` before the swap of step 2 and fails. A recount repairs a cap word only
//! when the generation is the one the member read its cap at.
//!
//! A lower cap takes nothing back: the memory held stays held, new reservations are
//! refused (or wait) until use falls under the new cap, those inside a member's
//! guarantee too (`shares::reserve_owed`: the cap in force wins). Once a pool was resized, the
//! cap word is authoritative while members hold the GPU: a member started later with
//! another `GPUCAP_LIMIT` joins with the pool's cap. Once no member holds it, the next
//! member's cap replaces it, as for a pool never resized.

use std::fmt;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::time::{Duration, Instant};

use super::gpu_words::GpuWords;
use super::layout;
use super::member::{Member, MemberLocks, Pool, RESIZE_TAKEOVER, TURN_WAIT, TurnLock};
use super::share_words::Holder;

/// A resize done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resized {
    /// The cap before and after (None: no cap).
    pub old: Option<u64>,
    pub new: Option<u64>,
    /// What the members held when the new cap came into force.
    pub used: u64,
}

/// Why a resize was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeRefusal {
    /// The pool has no entry for the GPU (no member registered it yet).
    NoGpu,
    /// Another resize or `pool set` of the GPU, by a live process, held the turn for all
    /// of [`TURN_WAIT`].
    Busy,
    /// The live members' guarantees on the GPU sum to more than the new cap.
    Guarantees {
        cap: u64,
        guaranteed: u64,
        holders: Vec<Holder>,
    },
}

impl fmt::Display for ResizeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResizeRefusal::NoGpu => write!(f, "no member of the pool has used that GPU yet"),
            ResizeRefusal::Busy => f.write_str(&turn_busy_text()),
            ResizeRefusal::Guarantees {
                cap,
                guaranteed,
                holders,
            } => {
                let size = crate::size::format_bytes;
                write!(
                    f,
                    "the new cap {} is below the {} guaranteed to live members (",
                    size(*cap),
                    size(*guaranteed)
                )?;
                for (i, h) in holders.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(
                        f,
                        "{sep}pid {} {} guarantees {}",
                        h.pid,
                        h.command,
                        size(h.guarantee)
                    )?;
                }
                write!(
                    f,
                    "); the cap was not changed: resize to at least {} or end a member \
                     that holds a guarantee first",
                    size(*guaranteed)
                )
            }
        }
    }
}

/// GPU entry `g`'s turn to change its cap or a member's share ([`take_turn`]), its lock
/// given back when dropped: once the change's generation is stored even.
pub(super) struct Turn<'l> {
    /// The odd generation: storing it + 1 ends the turn and puts the change in force.
    pub odd: u64,
    locks: &'l dyn MemberLocks,
    g: usize,
    locked: bool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if self.locked {
            self.locks.give_back_turn(self.g);
        }
    }
}

/// A live process held GPU entry's turn for all of [`TURN_WAIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TurnBusy;

/// What a resize or `pool set` refused as [`TurnBusy`] says.
pub(super) fn turn_busy_text() -> String {
    format!(
        "another `gpucap pool resize` or `gpucap pool set` of this GPU has been under way for \
         {} s (its process stopped half-way?); nothing was changed: try again once it ends",
        TURN_WAIT.as_secs()
    )
}

/// Takes GPU entry `g`'s turn to change its cap or a member's share: the turn's lock
/// (`locks`: one resize or `pool set` at a time, waiting while a live process holds it,
/// at most [`TURN_WAIT`]), then its cap generation made odd; one left odd by a process
/// that died half-way is taken over. Where the lock cannot say whether the holder lives,
/// the generation alone orders the changes, and one left odd is taken over after
/// [`RESIZE_TAKEOVER`]. Before, that was the only rule: a resizer stopped for a second
/// (SIGSTOP, a loaded machine) was taken over while it lived, the two finished the same
/// generation, and a member that read the second's cap kept it as its own while the
/// first's stood in the pool's word (a member held 1.56 GiB under a 512 MiB cap).
pub(super) fn take_turn<'l>(
    w: layout::Words<'_>,
    g: usize,
    locks: &'l dyn MemberLocks,
) -> Result<Turn<'l>, TurnBusy> {
    let locked = match locks.take_turn(g, TURN_WAIT) {
        TurnLock::Busy => return Err(TurnBusy),
        TurnLock::Taken => true,
        TurnLock::Untold => false,
    };
    let turn = |odd| Turn {
        odd,
        locks,
        g,
        locked,
    };
    let generation = w.gpu(g, layout::G_CAP_GEN);
    let start = Instant::now();
    loop {
        let e = generation.load(SeqCst);
        if e & 1 == 1 {
            if !locked && start.elapsed() < RESIZE_TAKEOVER {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // Its process died half-way: this change finishes the turn.
            if generation.compare_exchange(e, e, SeqCst, SeqCst).is_ok() {
                return Ok(turn(e));
            }
            continue;
        }
        if generation
            .compare_exchange(e, e + 1, SeqCst, SeqCst)
            .is_ok()
        {
            return Ok(turn(e + 1));
        }
    }
}

impl Pool<'_> {
    /// Sets the cap of the GPU `uuid` to `cap` (None: no cap) while members hold it (see
    /// the module's text). `locks` answers which members live and wakes the waiters.
    pub fn resize(
        &self,
        uuid: &[u8; 16],
        cap: Option<u64>,
        locks: &dyn MemberLocks,
    ) -> Result<Resized, ResizeRefusal> {
        let w = self.w;
        let key = layout::gpu_key(uuid);
        let g = (0..layout::MAX_POOL_GPUS)
            .find(|&g| w.gpu(g, layout::G_KEY).load(Acquire) == key)
            .ok_or(ResizeRefusal::NoGpu)?;
        let generation = w.gpu(g, layout::G_CAP_GEN);
        let turn = take_turn(w, g, locks).map_err(|_| ResizeRefusal::Busy)?;
        let odd = turn.odd;
        let word = w.gpu(g, layout::G_CAP);
        let old = word.swap(layout::encode_cap(cap), SeqCst);
        let limit = cap.unwrap_or(u64::MAX);
        // After the cap word: a guarantee claimed now sees the new cap, or is seen here.
        let holders = self.guarantees(g, locks);
        let guaranteed = holders
            .iter()
            .fold(0u64, |a, h| a.saturating_add(h.guarantee));
        if guaranteed > limit {
            word.store(old, SeqCst);
            generation.store(odd + 1, SeqCst);
            return Err(ResizeRefusal::Guarantees {
                cap: limit,
                guaranteed,
                holders,
            });
        }
        // A reservation that read `used` before the generation turned odd, and so may
        // weigh it against the old cap alone, swaps no more: `used` changes here, before
        // the new cap is in force. Those that read it since see the odd generation, and
        // weigh the lower of the two caps until it ends (`cap_now`).
        let used = w.gpu(g, layout::G_USED);
        let mut now = used.load(SeqCst);
        while let Err(w) = used.compare_exchange_weak(
            now,
            layout::used_word(now, layout::used_bytes(now)),
            SeqCst,
            SeqCst,
        ) {
            now = w;
        }
        generation.store(odd + 1, SeqCst);
        #[cfg(test)]
        super::used::between_reads::run_in_force();
        // The members' own cap words, which readers (`view`) and joiners weigh: the new
        // cap for every member holding the GPU (each writes the same when it takes it).
        let new = layout::encode_cap(cap);
        for s in 0..w.slots() {
            let theirs = w.member_gpu(s, g, layout::M_CAP);
            let now = theirs.load(SeqCst);
            if now != 0 && now != new {
                let _ = theirs.compare_exchange(now, new, SeqCst, SeqCst);
            }
        }
        let seq = w.gpu(g, layout::G_WAIT_SEQ);
        seq.fetch_add(1, AcqRel);
        locks.wake(seq);
        Ok(Resized {
            old: layout::decode_cap(old).flatten(),
            new: cap,
            used: layout::used_bytes(now),
        })
    }

    /// The guarantees live members hold on GPU entry `g`.
    fn guarantees(&self, g: usize, locks: &dyn MemberLocks) -> Vec<Holder> {
        let w = self.w;
        (0..w.slots())
            .filter_map(|s| {
                let guarantee = w.share(s, g, layout::SH_GUARANTEE).load(SeqCst);
                (guarantee != 0 && w.state(s).load(SeqCst) == layout::STATE_LIVE && locks.held(s))
                    .then(|| Holder {
                        pid: layout::word_pid(w.slot(s, layout::S_PID).load(Relaxed)),
                        command: w.command(s),
                        guarantee,
                    })
            })
            .collect()
    }
}

impl Member<'_> {
    /// The cap word (`G_CAP` encoding) and generation a joiner registers GPU entry `g`
    /// with, its own cap being `ours`: the pool's cap word if the pool was resized and
    /// another live member holds the GPU, else its own; and the generation read (the
    /// last even one, and as read).
    pub(super) fn cap_to_register(&self, g: usize, ours: u64) -> (u64, u64, u64) {
        let generation = self.w.gpu(g, layout::G_CAP_GEN).load(SeqCst);
        let pool = self.w.gpu(g, layout::G_CAP).load(SeqCst);
        let held = generation != 0
            && pool != 0
            && (0..self.w.slots()).any(|s| {
                s != self.slot
                    && self.w.member_gpu(s, g, layout::M_CAP).load(SeqCst) != 0
                    && self.w.state(s).load(SeqCst) == layout::STATE_LIVE
                    && self.locks.held(s)
            });
        // While a resize is under way (odd), the member looks again once it ends.
        (if held { pool } else { ours }, generation & !1, generation)
    }

    /// Whether GPU entry `h.g`'s cap generation moved since `seen`: a resize (or a
    /// `gpucap pool set`) came into force or began. A reservation's rule checks it after
    /// its read of `used`: a cap read at `seen` is weighed only while the generation
    /// still is `seen`.
    #[inline(always)]
    pub(super) fn cap_changed(&self, h: &GpuWords<'_>, seen: u64) -> bool {
        h.gpu[layout::G_CAP_GEN].load(Relaxed) != seen
    }

    /// The cap this member enforces on GPU entry `g` (`u64::MAX`: none) and the
    /// generation it was read at, after taking a resize's cap if one came into force.
    /// While a resize is under way (an odd generation, which is then the one returned),
    /// the lower of that cap and the cap word it writes: an admission that lands after
    /// the new cap came into force never weighed a higher one, whichever way the resize
    /// went (one refused writes the old cap back; a resizer that died half-way leaves
    /// the lower cap until another finishes its turn).
    pub(super) fn cap_now(&self, g: usize) -> (u64, u64) {
        self.refresh_cap(g);
        let seen = self.cap_gen[g].load(Acquire);
        let cap = layout::decode_cap(self.caps[g].load(Relaxed))
            .flatten()
            .unwrap_or(u64::MAX);
        let now = self.w.gpu(g, layout::G_CAP_GEN).load(SeqCst);
        if now & 1 == 1 {
            let written = layout::decode_cap(self.w.gpu(g, layout::G_CAP).load(SeqCst))
                .flatten()
                .unwrap_or(u64::MAX);
            return (cap.min(written), now);
        }
        (cap, seen)
    }

    /// Takes the cap word of GPU entry `g` as this member's cap if a resize (or a
    /// `gpucap pool set`) came into force since it last read it, and its share words as
    /// its own share if `gpucap pool set` changed them (`share_set`). True if it did.
    pub(super) fn refresh_cap(&self, g: usize) -> bool {
        if self.left.load(Acquire) {
            return false; // the slot may be another member's now
        }
        let generation = self.w.gpu(g, layout::G_CAP_GEN);
        let e = generation.load(SeqCst);
        if e & 1 == 1 || e == self.cap_gen[g].load(Acquire) || self.caps[g].load(Relaxed) == 0 {
            return false;
        }
        let word = self.w.gpu(g, layout::G_CAP).load(SeqCst);
        // The share words as `gpucap pool set` left them, read before the generation is
        // checked again: a change begun since is taken once it ends.
        let share = self.share_to_take(g);
        if word == 0 || generation.load(SeqCst) != e {
            return false; // another resize began: taken once it ends
        }
        self.caps[g].store(word, Relaxed);
        self.limit[g].store(layout::limit_of(word), Relaxed);
        self.w
            .member_gpu(self.slot, g, layout::M_CAP)
            .store(word, SeqCst);
        if let Some(share) = share {
            self.take_share(g, share, word);
        }
        self.cap_gen[g].store(e, Release);
        true
    }

    /// Whether the cap word of GPU entry `g` is one a resize wrote (in force or under
    /// way) rather than another process's damage: the generation moved since this
    /// member read its cap.
    pub(super) fn cap_resized(&self, g: usize) -> bool {
        self.w.gpu(g, layout::G_CAP_GEN).load(SeqCst) != self.cap_gen[g].load(Acquire)
    }
}
