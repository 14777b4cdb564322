//! A counter many threads add to at once without sharing a cache line (the ledger's
//! count of allocations, on every allocation's path).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Lines a [`Counter`] is spread over.
pub const COUNTER_LINES: usize = 8;

/// Bytes between two parts of a [`Counter`] (`repr(C)`: part k at k lines).
pub const LINE_BYTES: usize = std::mem::size_of::<Line>();

/// A counter many threads add to at once: one cache line per part, a thread adding to the
/// part its stack address picks (threads' stacks lie megabytes apart, so two threads
/// rarely share a part; sharing one is only slower, never wrong). Read as the sum.
#[derive(Debug)]
#[repr(C)]
pub struct Counter([Line; COUNTER_LINES]);

#[derive(Debug)]
#[repr(C, align(64))]
struct Line(AtomicU64, [AtomicU64; 7]);

impl Default for Counter {
    fn default() -> Self {
        Self::new()
    }
}

impl Counter {
    pub const fn new() -> Self {
        Counter(
            [const { Line(AtomicU64::new(0), [const { AtomicU64::new(0) }; 7]) }; COUNTER_LINES],
        )
    }

    #[inline]
    pub fn add(&self, n: u64) {
        let probe = 0u8;
        // The calling thread's stack, in 2 MiB steps, hashed to a part.
        let at = (std::ptr::addr_of!(probe) as usize as u64) >> 21;
        let part = (at.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61) as usize % COUNTER_LINES;
        self.0[part].0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|l| l.0.load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_adding_at_once_sum_to_every_add() {
        let c = Counter::new();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| (0..10_000).for_each(|_| c.add(1)));
            }
        });
        c.add(5);
        assert_eq!(c.get(), 80_005);
    }
}
