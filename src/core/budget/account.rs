//! Reserving and crediting a member's bytes on one GPU of the pool.
//!
//! A reservation the pool can take, and every credit, is one compare-and-swap on the
//! GPU's `used` word (check against the cap and add, together) with the member's own
//! words around it (`used`: no lock, no journal), so a member stopped at any instruction
//! blocks no other member's allocation, and one killed at any instruction leaves only
//! its own words to clear and `used` to count again. Only what is not on that path
//! takes the GPU's word lock (a compare-and-swap of the holder's slot into the `lock`
//! word; never a process-shared mutex with an owner pid): a recount before a refusal
//! or after a member died, a guarantee's admission, a waiter's ticket and its serving.
//! Whoever finds the holder dead (its slot's kernel lock can be taken) frees the word
//! lock: nothing the holder did needs finishing, every change it made to `used` was
//! one swap.
//!
//! Threads of one process pass an in-process gate per GPU first, so while a thread
//! holds the gate no other thread of its process holds the word: a word naming this
//! process's own slot then is impossible (a stale or forged word) and is repaired. A
//! member that finds the word held sleeps on it (a futex on the shared word, the same
//! `MemberLocks::sleep_on` the waits for memory use), looking every [`RECHECK`] whether
//! the holder died: a stopped holder costs the others no processor time. A member with
//! a ceiling of its own reserves behind its gate (no other process waits on that), so
//! that two of its threads cannot both pass the ceiling.
//!
//! The short path ([`Member::try_reserve`], `short_path`) makes one try of the cap with
//! the same compare-and-swap and falls back here, to the whole rule ([`Take`]).

use std::fmt;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::time::Duration;

use super::gpu_words::GpuWords;
use super::layout::{
    G_CAP, G_LARGEST_REFUSED, G_LOCK, G_LOCK_SINCE, G_REFUSALS, G_WAITERS, LOCK_HOLDER,
    LOCK_WAITING, M_USED,
};
use super::member::Member;
use super::notes::Repair;
use super::used::Rule;

/// Spins on a held gate or word lock before going to sleep on it.
const SPINS: u32 = 64;
/// The longest a member sleeps on a held word lock before it asks whether the holder
/// still lives (a killed holder wakes nobody).
pub(super) const RECHECK: Duration = Duration::from_millis(10);

/// A reservation the pool's cap does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRefusal {
    pub requested: u64,
    /// Bytes every member of the pool holds on the GPU.
    pub used: u64,
    pub cap: u64,
    /// Bytes this member holds on the GPU.
    pub own: u64,
    /// Set when the member left the pool (at exit).
    pub left: bool,
    /// How long the request waited for memory first (`GPUCAP_WAIT`), in ms.
    pub waited_ms: u64,
    /// Set when the member's own ceiling (`GPUCAP_CEILING`) refused it, not the pool.
    pub ceiling: Option<u64>,
    /// What the other members have left of their guarantees (`GPUCAP_GUARANTEE`), kept
    /// for them: the pool's room is its cap less `used` and this.
    pub kept_for_others: u64,
}

impl fmt::Display for PoolRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requested, {} of {} in use by the pool",
            self.requested, self.used, self.cap
        )
    }
}

/// The turns a reservation takes again when a resize came into force during its try.
const RESIZED_TURNS: u32 = 4;

/// The rule of one try of a reservation ([`Member::take`]).
struct Take<'m, 'a> {
    m: &'m Member<'a>,
    h: &'m GpuWords<'a>,
    g: usize,
    bytes: u64,
    cap: u64,
    /// The cap generation `cap` was read at (see `resize`).
    seen: u64,
    guarantee: u64,
    ceiling: u64,
}

impl Rule for Take<'_, '_> {
    #[inline(always)]
    fn apply(&self, pool: u64, own: u64) -> Option<u64> {
        let Take {
            m,
            h,
            g,
            bytes,
            cap,
            seen,
            guarantee,
            ceiling,
        } = *self;
        if m.queue_first_at(h) || pool < own || m.cap_changed(h, seen) {
            return None; // waiters first, in order; or a `used` that cannot be
        }
        m.fits_under(h, g, pool, own, bytes, cap, guarantee, ceiling)
    }
}

impl Member<'_> {
    /// Checks the pool's cap on `device` and adds `bytes` to the pool's and this
    /// member's use, in one step. A device not registered with the pool is not
    /// charged to it (the caller's own cap still applies).
    pub fn reserve(&self, device: usize, bytes: u64) -> Result<(), PoolRefusal> {
        let Some(g) = self.entry_of(device) else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(()); // takes nothing: never refused, never queued behind waiters
        }
        if self.left.load(Acquire) {
            return Err(PoolRefusal {
                requested: bytes,
                used: 0,
                cap: 0,
                own: 0,
                left: true,
                waited_ms: 0,
                ceiling: None,
                kept_for_others: 0,
            });
        }
        let (mut swept, mut recounted, mut resized) = (false, false, 0);
        // The pool's use the last try was refused on: the refusal names it.
        let mut weighed;
        // When this request began waiting at the member's own ceiling (once at most).
        let mut at_ceiling: Option<std::time::Instant> = None;
        // At most three turns: again after taking back the dead, again after a recount
        // (and a few more if the pool is resized meanwhile), and one after a wait at
        // the ceiling.
        loop {
            // The cap this member registered, kept in its own memory: a cap word another
            // process zeroed or raised does not uncap it; a resize's does (`resize`).
            let (cap, seen) = self.cap_now(g);
            match self.take(g, bytes, cap, seen) {
                Ok(()) => {
                    if let Some(since) = at_ceiling {
                        self.ceiling_served(device, bytes, since);
                    }
                    return Ok(());
                }
                Err(used) => weighed = used,
            }
            if resized < RESIZED_TURNS && self.hot(g).is_some_and(|h| self.cap_changed(h, seen)) {
                resized += 1;
                continue;
            }
            if let Some(refusal) = self.past_ceiling(g, bytes) {
                // Its own ceiling: no other member's free would help. Its own share
                // words are written back first if another process changed them.
                self.repair_own_shares(g);
                // With `GPUCAP_WAIT`, its own frees or a raise of its ceiling
                // (`gpucap pool set`) would: it waits for them, then goes on.
                if at_ceiling.is_some() || self.wait.is_none() || bytes > cap {
                    return Err(refusal);
                }
                at_ceiling = Some(self.wait_at_ceiling(g, device, bytes, refusal)?);
                continue;
            }
            // A `used` or cap word that differs from what the members hold: recounted
            // once (under the word lock), then tried again.
            if !recounted {
                recounted = true;
                if self.recount(g) {
                    continue;
                }
            }
            // Memory a dead member still holds is this request's first: take it back
            // once and try again. After the recount: a word lock holder found dead
            // there is then taken back too.
            if !swept && self.sweep_waiting() > 0 {
                swept = true;
                continue;
            }
            if self.wait.is_some() && bytes <= cap {
                return self.wait_for(g, device, bytes, cap);
            }
            #[cfg(test)]
            super::used::between_reads::run_refused();
            self.w.gpu(g, G_REFUSALS).fetch_add(1, Relaxed);
            self.w.gpu(g, G_LARGEST_REFUSED).fetch_max(bytes, Relaxed);
            return Err(PoolRefusal {
                requested: bytes,
                used: weighed,
                cap,
                own: self.w.member_gpu(self.slot, g, M_USED).load(Relaxed),
                left: false,
                waited_ms: 0,
                ceiling: None,
                kept_for_others: self.others_unused(g),
            });
        }
    }

    /// Adds `bytes` the driver already took on `device` to the pool's and this member's
    /// use without a check (see `Ledger::charge_past_cap`): the pool may stand past its cap until
    /// memory is given back. A device not registered, or a member that left: nothing.
    pub fn charge_past_cap(&self, device: usize, bytes: u64) {
        let Some(g) = self.entry_of(device) else {
            return;
        };
        if bytes == 0 || self.left.load(Acquire) {
            return;
        }
        self.add(g, bytes, |pool, _| pool.checked_add(bytes));
    }

    /// [`take`](Self::take) on the short path, out of line: a member with a guarantee or
    /// a ceiling of its own on the GPU entry of words `h`, or beside a member with a
    /// guarantee there.
    #[inline(never)]
    pub(super) fn take_shared(&self, h: &GpuWords<'_>, bytes: u64) -> bool {
        let g = h.g;
        let (cap, seen) = self.cap_now(g);
        let (guarantee, ceiling) = self.own_share(g);
        self.take_at(h, g, bytes, cap, seen, guarantee, ceiling)
            .is_ok()
    }

    /// One try of a reservation of `bytes` on GPU entry `g` under `cap`, without a lock
    /// (behind this process's gate if the member has a ceiling). Err: refused, with the
    /// pool's use it was refused on (see `add_at`). The full path's; the short path's is
    /// [`try_reserve`](Self::try_reserve)'s way.
    #[inline(always)]
    fn take(&self, g: usize, bytes: u64, cap: u64, seen: u64) -> Result<(), u64> {
        let Some(h) = self.hot(g) else {
            return Err(self.w.used(g));
        };
        let (guarantee, ceiling) = self.own_share(g);
        self.take_at(h, g, bytes, cap, seen, guarantee, ceiling)
    }

    /// [`take`](Self::take) with GPU entry `g`'s words `h`, this member's `guarantee`
    /// and `ceiling` there (`u64::MAX`: none; both set when it claims its share, before
    /// its allocations).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn take_at(
        &self,
        h: &GpuWords<'_>,
        g: usize,
        bytes: u64,
        cap: u64,
        seen: u64,
        guarantee: u64,
        ceiling: u64,
    ) -> Result<(), u64> {
        let rule = Take {
            m: self,
            h,
            g,
            bytes,
            cap,
            seen,
            guarantee,
            ceiling,
        };
        if ceiling == u64::MAX {
            return self.add_at(h, bytes, &rule);
        }
        self.enter_gate(g);
        let done = self.add_at(h, bytes, &rule);
        self.leave_gate(g);
        done
    }

    /// Counts a request of `bytes` on `device` that this member's own cap refused
    /// before the pool was asked: a refusal the program saw, so the pool's refusals
    /// (`gpucap status`, `gpucap_pool_refusals_total`) count it too.
    pub fn note_refused(&self, device: usize, bytes: u64) {
        if let Some(g) = self.entry_of(device) {
            self.w.gpu(g, G_REFUSALS).fetch_add(1, Relaxed);
            self.w.gpu(g, G_LARGEST_REFUSED).fetch_max(bytes, Relaxed);
        }
    }

    /// Gives `bytes` of this member's use on `device` back to the pool.
    pub fn credit(&self, device: usize, bytes: u64) {
        let Some(g) = self.entry_of(device) else {
            return;
        };
        if self.left.load(Acquire) {
            return;
        }
        let Some(h) = self.hot(g) else {
            return;
        };
        self.sub_at(h, bytes);
        if h.gpu[G_WAITERS].load(Acquire) > 0 {
            self.wake_waiters(g);
        }
    }

    /// Under GPU entry `g`'s word lock: sets its `used` to what the members hold and
    /// its cap word to this member's cap if either differs (another process wrote the
    /// file), and repairs impossible share words (`repair`). True if anything changed;
    /// each repair is told to the member's note.
    pub(super) fn recount(&self, g: usize) -> bool {
        let repairs = self.locked(g, || {
            let mut out = Vec::new();
            if let Some((found, members)) = self.recount_used(g) {
                out.push(Repair::Used {
                    gpu: g,
                    found,
                    members,
                });
            }
            // A cap word a resize wrote is taken, not repaired (`resize`).
            self.refresh_cap(g);
            let (word, ours) = (self.w.gpu(g, G_CAP), self.caps[g].load(Relaxed));
            let found = word.load(SeqCst);
            if ours != 0 && found != ours && !self.cap_resized(g) {
                word.store(ours, SeqCst);
                out.push(Repair::Cap {
                    gpu: g,
                    found,
                    ours,
                });
            }
            out.extend(self.fix_shares(g));
            out
        });
        for r in &repairs {
            self.report_repair(r);
        }
        !repairs.is_empty()
    }

    /// Runs `f` holding GPU entry `g`'s word lock (changes that need no journal).
    pub(super) fn locked<R>(&self, g: usize, f: impl FnOnce() -> R) -> R {
        self.lock_gpu(g);
        let r = f();
        self.unlock_gpu(g);
        r
    }

    /// Takes GPU entry `g`'s word lock (after this process's gate for it). A holder
    /// found dead is taken over: the lock freed (its share is taken back by the next
    /// sweep; nothing it did under the lock needs finishing). A word no live member can hold is
    /// freed. A live holder is waited for asleep on the word.
    ///
    /// Bounded by the holder: each turn either takes the lock, frees it from a dead or
    /// impossible holder, or sleeps at most [`RECHECK`] while a live process holds it
    /// (a few instructions, unless that process is stopped: then as long as it is).
    #[inline]
    fn lock_gpu(&self, g: usize) {
        self.enter_gate(g);
        let me = self.slot as u64 + 1;
        if self
            .w
            .gpu(g, G_LOCK)
            .compare_exchange(0, me, Acquire, Relaxed)
            .is_err()
        {
            self.lock_gpu_held(g);
        }
    }

    /// [`lock_gpu`](Self::lock_gpu) once the word was found held (this thread holds the
    /// gate).
    #[cold]
    #[inline(never)]
    fn lock_gpu_held(&self, g: usize) {
        let me = self.slot as u64 + 1;
        let lock = self.w.gpu(g, G_LOCK);
        // After a sleep, taken with the waiting bit: others may sleep on it too.
        let mut take = me;
        let mut turns = 0u32;
        let mut recount = false;
        // When the holder was last asked after (a system call): at most every RECHECK.
        let mut asked: Option<std::time::Instant> = None;
        loop {
            let word = match lock.compare_exchange_weak(0, take, Acquire, Relaxed) {
                Ok(_) => break,
                Err(0) => continue,
                Err(w) => w,
            };
            let holder = word & LOCK_HOLDER;
            if holder == 0 || holder > self.w.slots() as u64 || holder == me || word >> 17 != 0 {
                // Nobody can hold this: no slot, or this process's own (its threads
                // are behind the gate).
                if self.release_from(g, word) {
                    self.report_repair(&Repair::Lock { gpu: g, word });
                }
                continue;
            }
            turns += 1;
            if turns < SPINS {
                std::hint::spin_loop();
                continue;
            }
            let d = (holder - 1) as usize;
            let ask = asked.is_none_or(|t| t.elapsed() >= RECHECK);
            if ask {
                asked = Some(std::time::Instant::now());
            }
            if ask && self.locks.try_take(d) {
                // The holder is dead, and we hold its slot's kernel lock now.
                if lock.load(Acquire) == word {
                    self.release_from(g, word);
                    recount = true; // it may have died inside the ticket step
                }
                self.locks.give_back(d);
                continue;
            }
            if word & LOCK_WAITING == 0
                && lock
                    .compare_exchange(word, word | LOCK_WAITING, Relaxed, Relaxed)
                    .is_err()
            {
                continue;
            }
            self.stamp_since(g, holder);
            self.locks.sleep_on(lock, word | LOCK_WAITING, RECHECK);
            take = me | LOCK_WAITING;
        }
        if recount {
            self.count_waiters(g);
        }
    }

    /// Gives back GPU entry `g`'s word lock and this process's gate for it.
    #[inline]
    fn unlock_gpu(&self, g: usize) {
        let lock = self.w.gpu(g, G_LOCK);
        if lock.swap(0, Release) & LOCK_WAITING != 0 {
            self.wake_lock_sleepers(g);
        }
        self.leave_gate(g);
    }

    #[cold]
    #[inline(never)]
    fn wake_lock_sleepers(&self, g: usize) {
        self.w.gpu(g, G_LOCK_SINCE).store(0, Relaxed);
        self.locks.wake(self.w.gpu(g, G_LOCK));
    }

    /// Frees GPU entry `g`'s word lock if it still holds `word` (a dead or impossible
    /// holder's), waking whoever sleeps on it. True if this call freed it.
    pub(super) fn release_from(&self, g: usize, word: u64) -> bool {
        let lock = self.w.gpu(g, G_LOCK);
        if lock.compare_exchange(word, 0, Release, Relaxed).is_err() {
            return false;
        }
        self.w.gpu(g, G_LOCK_SINCE).store(0, Relaxed);
        self.locks.wake(lock);
        true
    }

    /// Notes since when `holder` keeps this member waiting on GPU entry `g`'s word lock
    /// (kept if already noted for that holder).
    fn stamp_since(&self, g: usize, holder: u64) {
        let since = self.w.gpu(g, G_LOCK_SINCE);
        let seen = since.load(Relaxed);
        if seen & LOCK_HOLDER != holder {
            let ms = super::layout::now_ms();
            let _ = since.compare_exchange(seen, ms << 16 | holder, Relaxed, Relaxed);
        }
    }

    /// This process's gate of GPU entry `g`: one thread at a time goes on to the word
    /// lock. Bounded like the word lock: the holder is a thread of this live process
    /// inside a change of a few instructions, or waiting on the word itself.
    #[inline]
    pub(super) fn enter_gate(&self, g: usize) {
        let gate = &self.gate[g];
        if gate.compare_exchange(0, 1, Acquire, Relaxed).is_ok() {
            return;
        }
        self.enter_gate_slow(gate);
    }

    #[cold]
    fn enter_gate_slow(&self, gate: &AtomicU64) {
        for _ in 0..SPINS {
            std::hint::spin_loop();
            if gate.compare_exchange(0, 1, Acquire, Relaxed).is_ok() {
                return;
            }
        }
        // 2: taken, and threads sleep on it (the leaver wakes them).
        while gate.swap(2, Acquire) != 0 {
            self.locks.sleep_on(gate, 2, RECHECK);
        }
    }

    #[inline]
    pub(super) fn leave_gate(&self, g: usize) {
        let gate = &self.gate[g];
        if gate.swap(0, Release) == 2 {
            self.locks.wake(gate);
        }
    }
}
