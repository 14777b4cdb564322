//! Reserving and crediting a member's bytes on one GPU of the pool.
//!
//! A change of a GPU's `used` is one step under that GPU's word lock (a compare-and-swap
//! of the holder's slot into the `lock` word; never a process-shared mutex with an
//! owner pid): check against the cap and add, together. Before writing, the holder
//! writes what it is about to write in its journal; whoever finds the holder dead
//! (its slot's kernel lock can be taken) writes the same values again and frees the
//! word lock, so a member killed at any instruction leaves the pool consistent and
//! blocks nobody for longer than it takes to notice (a few milliseconds).

use std::fmt;
use std::sync::atomic::Ordering::*;

use super::layout::*;
use super::member::Member;

/// Spins on a held GPU lock before yielding the processor.
const SPINS: u32 = 64;
/// Yields between two checks of whether the holder still lives.
const YIELDS_PER_CHECK: u32 = 16;

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
            });
        }
        let cap = decode_cap(self.w.gpu(g, G_CAP).load(Relaxed))
            .flatten()
            .unwrap_or(u64::MAX);
        let mut swept = false;
        loop {
            let done = self.change(g, self.slot, |pool, own| {
                if self.queue_first(g) {
                    return None; // waiters first, in order
                }
                let new = self.fits(g, pool, own, bytes, cap)?;
                Some((new, own.saturating_add(bytes)))
            });
            if done.is_some() {
                return Ok(());
            }
            if let Some(refusal) = self.past_ceiling(g, bytes) {
                return Err(refusal); // its own ceiling: no member's free would help
            }
            // Memory a dead member still holds is this request's first: take it back
            // once and try again.
            if !swept && self.sweep() > 0 {
                swept = true;
                continue;
            }
            if self.wait.is_some() && bytes <= cap {
                return self.wait_for(g, device, bytes, cap);
            }
            self.w.gpu(g, G_REFUSALS).fetch_add(1, Relaxed);
            self.w.gpu(g, G_LARGEST_REFUSED).fetch_max(bytes, Relaxed);
            return Err(PoolRefusal {
                requested: bytes,
                used: self.w.gpu(g, G_USED).load(Relaxed),
                cap,
                own: self.w.member_gpu(self.slot, g, M_USED).load(Relaxed),
                left: false,
                waited_ms: 0,
                ceiling: None,
            });
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
        // Never more than this member holds: a forked child freeing memory its parent
        // allocated must not take it off the pool's count.
        self.change(g, self.slot, |pool, own| {
            let bytes = bytes.min(own);
            Some((pool.saturating_sub(bytes), own - bytes))
        });
        if self.w.gpu(g, G_WAITERS).load(Acquire) > 0 {
            self.wake_waiters(g);
        }
    }

    /// Runs `f` holding GPU entry `g`'s word lock (changes that need no journal).
    pub(super) fn locked<R>(&self, g: usize, f: impl FnOnce() -> R) -> R {
        self.lock_gpu(g);
        let r = f();
        self.w.gpu(g, G_LOCK).store(0, Release);
        r
    }

    /// One change of GPU entry `g`'s `used` and slot `target`'s use of it, under the
    /// GPU's word lock: `f` gets both and returns both new values, or None to change
    /// nothing. Returns what `f` returned. Peaks follow.
    pub(super) fn change(
        &self,
        g: usize,
        target: usize,
        f: impl FnOnce(u64, u64) -> Option<(u64, u64)>,
    ) -> Option<(u64, u64)> {
        self.lock_gpu(g);
        let used = self.w.gpu(g, G_USED);
        let own = self.w.member_gpu(target, g, M_USED);
        let result = f(used.load(Relaxed), own.load(Relaxed));
        if let Some((new_pool, new_own)) = result {
            let journal = |i| self.w.member_gpu(self.slot, g, i);
            journal(M_JOURNAL_POOL).store(new_pool, Relaxed);
            journal(M_JOURNAL_OWN).store(new_own, Relaxed);
            journal(M_JOURNAL).store(target as u64 + 1, Release);
            used.store(new_pool, Relaxed);
            own.store(new_own, Relaxed);
            journal(M_JOURNAL).store(0, Release);
            let peak = self.w.gpu(g, G_PEAK);
            if new_pool > peak.load(Relaxed) {
                peak.store(new_pool, Relaxed);
            }
            let own_peak = self.w.member_gpu(target, g, M_PEAK);
            if new_own > own_peak.load(Relaxed) {
                own_peak.store(new_own, Relaxed);
            }
        }
        self.w.gpu(g, G_LOCK).store(0, Release);
        result
    }

    /// Takes GPU entry `g`'s word lock. A holder found dead is taken over: its change
    /// finished from its journal, its share taken back, its slot emptied.
    fn lock_gpu(&self, g: usize) {
        let me = self.slot as u64 + 1;
        let lock = self.w.gpu(g, G_LOCK);
        let mut waits = 0u32;
        loop {
            let holder = match lock.compare_exchange_weak(0, me, Acquire, Relaxed) {
                Ok(_) => return,
                Err(0) => continue,
                Err(h) => h,
            };
            waits += 1;
            if waits < SPINS {
                std::hint::spin_loop();
                continue;
            }
            if holder != me && waits.is_multiple_of(YIELDS_PER_CHECK) {
                let d = (holder - 1) as usize;
                if d < MAX_SLOTS && self.locks.try_take(d) {
                    // The holder is dead, and we hold its slot now.
                    if self.w.slot(d, S_STATE).load(Acquire) == STATE_LIVE {
                        self.take_back(d);
                        self.empty(d);
                    } else if lock.load(Acquire) == holder {
                        self.redo(d, g);
                        let _ = lock.compare_exchange(holder, 0, Release, Relaxed);
                    }
                    self.locks.give_back(d);
                    continue;
                }
            }
            std::thread::yield_now();
        }
    }

    /// Writes again what dead member `d` had journaled for GPU entry `g` (it held the
    /// GPU's word lock, so nothing else changed those words since).
    pub(super) fn redo(&self, d: usize, g: usize) {
        let journal = |i| self.w.member_gpu(d, g, i);
        let target = journal(M_JOURNAL).load(Acquire);
        if target == 0 || target > MAX_SLOTS as u64 {
            return;
        }
        self.w
            .gpu(g, G_USED)
            .store(journal(M_JOURNAL_POOL).load(Relaxed), Relaxed);
        self.w
            .member_gpu(target as usize - 1, g, M_USED)
            .store(journal(M_JOURNAL_OWN).load(Relaxed), Relaxed);
        journal(M_JOURNAL).store(0, Release);
    }
}
