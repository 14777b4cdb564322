//! Which refusal lines the shim prints: one per refusal the program sees. Two ways of
//! asking again make one error of many refusals, so they print one line:
//! - *A retry*: programs that free their own cache and retry after an out-of-memory
//!   error (CuPy's memory pool does, twice) make the same request again at once.
//! - *A back-off*: allocators that shrink the request until it fits (TensorFlow's BFC
//!   allocator asks for a region a tenth smaller each time, down to what the tensor
//!   needs) make a run of smaller requests, holding the same memory all the while.
//!
//! So a refusal by the same entry point on the same GPU within [`REPEAT_WINDOW_MS`] of
//! the last printed line prints none when it asks for the same size, or for less while
//! the process holds what it held then, no allocation served in between ([`Holding`];
//! at `GPUCAP_LOG=debug` every one prints); a larger request, one made after the
//! process's memory changed, or one a window later prints its line. Every refusal is
//! counted all the same (reports, the pool's figures).
//! Lock-free: two threads refusing at the same instant may both print.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How long the same refusal stays quiet after its line was printed, in ms.
pub const REPEAT_WINDOW_MS: u64 = 1000;

/// The last refusal line printed: what it was about, and when.
pub struct RefusalLines {
    /// The device of the last printed line, plus 1 (0: none yet).
    device: AtomicU64,
    /// A hash of its entry point's name.
    api: AtomicU64,
    /// The bytes it asked for.
    bytes: AtomicU64,
    /// What the process held on the GPU then, as its line said.
    held: AtomicU64,
    /// How many allocations it had been served there then.
    served: AtomicU64,
    /// When it was printed, in ms on the caller's clock.
    at_ms: AtomicU64,
}

impl Default for RefusalLines {
    fn default() -> Self {
        Self::new()
    }
}

impl RefusalLines {
    pub const fn new() -> RefusalLines {
        RefusalLines {
            device: AtomicU64::new(0),
            api: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            held: AtomicU64::new(0),
            served: AtomicU64::new(0),
            at_ms: AtomicU64::new(0),
        }
    }

    /// Should the refusal by entry point `api` of `bytes` on `device` at `now_ms`, the
    /// process's memory there as `holding` says, print its line? Yes unless the last
    /// printed line was by the same entry point on the same GPU less than
    /// [`REPEAT_WINDOW_MS`] before (a clock that went back prints) and this is a retry
    /// (the same size) or a back-off (less, `holding` unchanged); a yes records this one
    /// as the last printed.
    pub fn should_print(
        &self,
        api: &str,
        device: usize,
        bytes: u64,
        holding: Holding,
        now_ms: u64,
    ) -> bool {
        let dev = device as u64 + 1;
        let api = fnv1a(api);
        let at = self.at_ms.load(Relaxed);
        let last = self.bytes.load(Relaxed);
        let retry = bytes == last;
        let back_off = bytes < last
            && holding.bytes == self.held.load(Relaxed)
            && holding.served == self.served.load(Relaxed);
        if self.device.load(Relaxed) == dev
            && self.api.load(Relaxed) == api
            && (retry || back_off)
            && (at..at.saturating_add(REPEAT_WINDOW_MS)).contains(&now_ms)
        {
            return false;
        }
        self.device.store(dev, Relaxed);
        self.api.store(api, Relaxed);
        self.bytes.store(bytes, Relaxed);
        self.held.store(holding.bytes, Relaxed);
        self.served.store(holding.served, Relaxed);
        self.at_ms.store(now_ms, Relaxed);
        true
    }
}

/// A process's memory on a GPU at a refusal: the bytes it holds (a pool member: its own
/// share) and how many allocations it has been served there. Two refusals with the same
/// holding had nothing served in between and, unless it freed as much as it took again
/// by other doors, nothing freed.
#[derive(Debug, Clone, Copy)]
pub struct Holding {
    pub bytes: u64,
    pub served: u64,
}

/// FNV-1a of `s`: tells entry points apart without keeping their names.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H0: Holding = Holding {
        bytes: 0,
        served: 0,
    };

    #[test]
    fn the_same_request_again_at_once_is_quiet_another_is_not() {
        let r = RefusalLines::new();
        assert!(r.should_print("cuMemAlloc", 0, 100 << 20, H0, 10_000));
        assert!(
            !r.should_print("cuMemAlloc", 0, 100 << 20, H0, 10_001),
            "CuPy's retry"
        );
        assert!(!r.should_print("cuMemAlloc", 0, 100 << 20, H0, 10_999));
        assert!(
            r.should_print("cuMemAlloc", 0, 100 << 20, H0, 11_000),
            "a second later"
        );
        assert!(
            r.should_print("cuMemAlloc", 1, 100 << 20, H0, 11_001),
            "another GPU"
        );
        assert!(
            r.should_print("cuMemAlloc", 0, 100 << 20, H0, 11_002),
            "back to GPU 0: printed"
        );
        assert!(
            r.should_print("cuMemAlloc", 0, 200 << 20, H0, 11_003),
            "a larger size"
        );
        assert!(!r.should_print("cuMemAlloc", 0, 200 << 20, H0, 11_004));
        assert!(
            r.should_print("cuMemAllocAsync", 0, 200 << 20, H0, 11_005),
            "another entry point"
        );
        // A clock that went back prints: never quiet for longer than the window.
        assert!(r.should_print("cuMemAllocAsync", 0, 200 << 20, H0, 9_000));
        // The first refusal prints, whatever the clock says.
        assert!(RefusalLines::new().should_print("cuMemAlloc", 0, 0, H0, 0));
    }

    #[test]
    fn a_back_off_holding_the_same_memory_is_quiet_a_change_prints() {
        let r = RefusalLines::new();
        let h = |mib: u64, served: u64| Holding {
            bytes: mib << 20,
            served,
        };
        // TensorFlow's BFC allocator: a region a tenth smaller each time.
        assert!(r.should_print("cuMemAlloc", 0, 900 << 20, h(500, 1), 5_000));
        for (i, mib) in [810u64, 729, 656, 590].into_iter().enumerate() {
            assert!(
                !r.should_print("cuMemAlloc", 0, mib << 20, h(500, 1), 5_001 + i as u64),
                "{mib} MiB"
            );
        }
        // The back-off is measured against the printed line, not the last quiet one.
        assert!(!r.should_print("cuMemAlloc", 0, 899 << 20, h(500, 1), 5_010));
        // It was served more in between: the smaller request says something new.
        assert!(
            r.should_print("cuMemAlloc", 0, 300 << 20, h(900, 2), 5_020),
            "memory taken in between"
        );
        assert!(
            r.should_print("cuMemAlloc", 0, 200 << 20, h(500, 2), 5_030),
            "memory freed in between"
        );
        // Freed and taken again to the same figure: the count of allocations moved.
        assert!(
            r.should_print("cuMemAlloc", 0, 100 << 20, h(500, 130), 5_040),
            "the same figure, other blocks"
        );
        // A retry of the same size prints none even after a free (CuPy's pool).
        assert!(!r.should_print("cuMemAlloc", 0, 100 << 20, h(0, 130), 5_041));
        // Another entry point or GPU, or a window later, prints.
        assert!(r.should_print("cuMemAllocAsync", 0, 100 << 20, H0, 5_042));
        assert!(r.should_print("cuMemAllocAsync", 1, 50 << 20, H0, 5_043));
        assert!(r.should_print("cuMemAllocAsync", 1, 40 << 20, H0, 6_043));
    }
}
