//! Waiting for memory instead of failing (`GPUCAP_WAIT`): an allocation the pool cannot
//! take now takes a ticket and sleeps on the GPU's wake word until members free
//! memory; tickets are served in order, so a large request is not starved by a stream
//! of small ones. Nothing is held while sleeping: a waiter killed by a signal leaves
//! only its ticket, which the next member to notice its death takes back.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

use super::account::PoolRefusal;
use super::gpu_words::GpuWords;
use super::layout::{
    G_LARGEST_REFUSED, G_REFUSALS, G_TICKET, G_WAIT_MS, G_WAIT_SEQ, G_WAITERS, G_WAITS, M_USED,
    M_WAIT, S_WAIT_LOOK, STALE_WAITER_MS, STATE_LIVE, now_ms,
};
use super::member::Member;
use super::notes::WaitNote;

/// The longest a waiter sleeps before it looks again (dead members, their tickets).
const RECHECK_WAIT: Duration = Duration::from_millis(50);

impl Member<'_> {
    /// Whether this member waits (`GPUCAP_WAIT`) and other members wait on GPU entry `g`
    /// now: then a new request queues behind them, however small.
    #[inline]
    pub(super) fn queue_first_at(&self, h: &GpuWords<'_>) -> bool {
        self.wait.is_some() && h.gpu[G_WAITERS].load(Acquire) > 0
    }

    /// Waits for `bytes` on GPU entry `g` (CUDA ordinal `device`), up to `GPUCAP_WAIT`.
    pub(super) fn wait_for(
        &self,
        g: usize,
        device: usize,
        bytes: u64,
        cap: u64,
    ) -> Result<(), PoolRefusal> {
        let Some((max, note)) = self.wait else {
            return Err(self.refusal(g, bytes, cap, Duration::ZERO));
        };
        let start = Instant::now();
        // One waiting thread of this process per GPU; the others queue here first.
        let _turn = self.wait_turn[g].lock().unwrap_or_else(|p| p.into_inner());
        self.looked();
        let ticket = self.locked(g, || {
            self.w.gpu(g, G_WAITERS).fetch_add(1, AcqRel);
            let t = self.w.gpu(g, G_TICKET).fetch_add(1, AcqRel) + 1;
            self.w.member_gpu(self.slot, g, M_WAIT).store(t, Release);
            t
        });
        note(&WaitNote::Started {
            device,
            bytes,
            ahead: self.ahead_of(g, ticket),
        });
        let word = self.w.gpu(g, G_WAIT_SEQ);
        loop {
            let seen = word.load(Acquire);
            self.looked();
            // A resize's cap, once in force, serves the queue (or keeps it waiting).
            let (cap, cap_seen) = self.cap_now(g);
            // A ceiling lowered meanwhile (`gpucap pool set`) that this request is past
            // now: out of the queue, where it would hold up the others.
            if let Some(refusal) = self.past_ceiling(g, bytes) {
                let waited = start.elapsed();
                self.locked(g, || self.leave_queue(g));
                self.wait_ended(g, waited);
                note(&WaitNote::TimedOut {
                    device,
                    bytes,
                    waited,
                });
                return Err(PoolRefusal {
                    waited_ms: waited.as_millis() as u64,
                    ..refusal
                });
            }
            if self.ahead_of(g, ticket) == 0 {
                // Under the word lock (and so this process's gate: no second gate for a
                // ceiling): served and out of the queue in one step for the others.
                let served = self.locked(g, || {
                    let served = self.add(g, bytes, |pool, own| {
                        let h = self.hot(g)?;
                        if self.cap_changed(h, cap_seen) {
                            return None; // resized meanwhile: looked at again
                        }
                        self.fits(g, pool, own, bytes, cap)
                    });
                    if served {
                        self.leave_queue(g);
                    }
                    served
                });
                if served {
                    let waited = start.elapsed();
                    self.wait_ended(g, waited);
                    note(&WaitNote::Served {
                        device,
                        bytes,
                        waited,
                    });
                    return Ok(());
                }
            }
            let waited = start.elapsed();
            if waited >= max {
                self.locked(g, || self.leave_queue(g));
                self.wait_ended(g, waited);
                note(&WaitNote::TimedOut {
                    device,
                    bytes,
                    waited,
                });
                self.w.gpu(g, G_REFUSALS).fetch_add(1, Relaxed);
                self.w.gpu(g, G_LARGEST_REFUSED).fetch_max(bytes, Relaxed);
                return Err(self.refusal(g, bytes, cap, waited));
            }
            // Dead members: their memory and their tickets come back.
            self.sweep();
            if word.load(Acquire) == seen {
                self.locks
                    .sleep_on(word, seen, (max - waited).min(RECHECK_WAIT));
            }
        }
    }

    /// Waits, up to `GPUCAP_WAIT`, until `bytes` on GPU entry `g` (CUDA ordinal
    /// `device`) no longer take this member past its own ceiling (`refusal` says so):
    /// its own frees, or a raise of the ceiling (`gpucap pool set`, which wakes the GPU's
    /// waiters). Without a ticket: only this member can end such a wait, so it holds up
    /// no other member's request. Ok(when it began): under the ceiling now, the caller
    /// goes on; Err: the refusal, after waiting.
    pub(super) fn wait_at_ceiling(
        &self,
        g: usize,
        device: usize,
        bytes: u64,
        refusal: PoolRefusal,
    ) -> Result<Instant, PoolRefusal> {
        let Some((max, note)) = self.wait else {
            return Err(refusal);
        };
        let start = Instant::now();
        note(&WaitNote::AtCeiling {
            device,
            bytes,
            ceiling: refusal.ceiling.unwrap_or(u64::MAX),
        });
        let word = self.w.gpu(g, G_WAIT_SEQ);
        loop {
            let seen = word.load(Acquire);
            // A change of its ceiling, once in force, is taken here.
            self.refresh_cap(g);
            let Some(now) = self.past_ceiling(g, bytes) else {
                return Ok(start);
            };
            let waited = start.elapsed();
            if waited >= max {
                note(&WaitNote::TimedOut {
                    device,
                    bytes,
                    waited,
                });
                self.wait_ended(g, waited);
                return Err(PoolRefusal {
                    waited_ms: waited.as_millis() as u64,
                    ..now
                });
            }
            if word.load(Acquire) == seen {
                self.locks
                    .sleep_on(word, seen, (max - waited).min(RECHECK_WAIT));
            }
        }
    }

    /// A request that waited at its member's ceiling since `since` was served.
    pub(super) fn ceiling_served(&self, device: usize, bytes: u64, since: Instant) {
        if let Some((_, note)) = self.wait {
            note(&WaitNote::Served {
                device,
                bytes,
                waited: since.elapsed(),
            });
        }
    }

    /// How many live members hold a ticket before `ticket` on GPU entry `g`, and look at
    /// the queue: a waiter that has not looked for [`STALE_WAITER_MS`] (stopped) holds
    /// up no one behind it; it takes its turn again once it looks. Tickets only leave or
    /// come after, so none can appear ahead later.
    fn ahead_of(&self, g: usize, ticket: u64) -> usize {
        let now = now_ms();
        (0..self.w.slots())
            .filter(|&s| {
                let t = self.w.member_gpu(s, g, M_WAIT).load(Acquire);
                s != self.slot
                    && t != 0
                    && t < ticket
                    && self.locks.held(s)
                    && !stale_look(self.w.slot(s, S_WAIT_LOOK).load(Acquire), now)
            })
            .count()
    }

    /// A waiting thread of this member looks at its queue now.
    fn looked(&self) {
        self.w.slot(self.slot, S_WAIT_LOOK).store(now_ms(), Release);
    }

    /// Called holding GPU entry `g`'s word lock: this member stops waiting on it.
    fn leave_queue(&self, g: usize) {
        self.w.member_gpu(self.slot, g, M_WAIT).store(0, Release);
        let waiters = self.w.gpu(g, G_WAITERS);
        let _ = waiters.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
    }

    /// A wait ended: counted, and the next waiter looks again.
    fn wait_ended(&self, g: usize, waited: Duration) {
        self.w.gpu(g, G_WAITS).fetch_add(1, Relaxed);
        self.w
            .gpu(g, G_WAIT_MS)
            .fetch_add(waited.as_millis() as u64, Relaxed);
        self.wake_waiters(g);
    }

    /// Wakes whoever waits on GPU entry `g` (after memory was freed).
    pub(super) fn wake_waiters(&self, g: usize) {
        let word = self.w.gpu(g, G_WAIT_SEQ);
        word.fetch_add(1, AcqRel);
        self.locks.wake(word);
    }

    /// Counts the waiting tickets on GPU entry `g` again (a member died between its
    /// ticket and the count).
    pub(super) fn recount_waiters(&self, g: usize) {
        self.locked(g, || self.count_waiters(g));
    }

    /// Called holding GPU entry `g`'s word lock: the waiters count is the number of
    /// live slots with a ticket.
    pub(super) fn count_waiters(&self, g: usize) {
        let n = (0..self.w.slots())
            .filter(|&s| {
                self.w.state(s).load(Acquire) == STATE_LIVE
                    && self.w.member_gpu(s, g, M_WAIT).load(Acquire) != 0
            })
            .count();
        self.w.gpu(g, G_WAITERS).store(n as u64, Release);
    }

    fn refusal(&self, g: usize, bytes: u64, cap: u64, waited: Duration) -> PoolRefusal {
        PoolRefusal {
            requested: bytes,
            used: self.w.used(g),
            cap,
            own: self.w.member_gpu(self.slot, g, M_USED).load(Relaxed),
            left: false,
            waited_ms: waited.as_millis() as u64,
            ceiling: None,
            kept_for_others: self.others_unused(g),
        }
    }
}

/// Whether a waiter whose last look was `look` (0: never said) has not looked for
/// [`STALE_WAITER_MS`] at `now`.
fn stale_look(look: u64, now: u64) -> bool {
    look != 0 && now.saturating_sub(look) > STALE_WAITER_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_is_stale_only_after_a_look_it_said_and_a_second_without_one() {
        assert!(!stale_look(0, 1_000_000), "never said: counted, as before");
        assert!(!stale_look(1_000_000, 1_000_000 + STALE_WAITER_MS));
        assert!(stale_look(1_000_000, 1_000_001 + STALE_WAITER_MS));
        // A look after `now` (another clock's): not stale.
        assert!(!stale_look(2_000_000, 1_000_000));
    }
}
