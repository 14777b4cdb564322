//! Which refusal lines the shim prints: one per refusal the program sees. Programs
//! that free their own cache and retry after an out-of-memory error (CuPy's memory pool
//! does, twice) make the same request again at once; the program then sees one error,
//! so the line is printed once. A refusal by the same entry point, of the same size on
//! the same GPU, within [`REPEAT_WINDOW_MS`] of the last printed one is not printed again
//! (at `GPUCAP_LOG=debug` every one is); every refusal is counted all the same (reports,
//! the pool's figures).
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
            at_ms: AtomicU64::new(0),
        }
    }

    /// Should the refusal by entry point `api` of `bytes` on `device` at `now_ms` print
    /// its line? Yes unless the last printed line was the same request less than
    /// [`REPEAT_WINDOW_MS`] before (a clock that went back prints); a yes records this one
    /// as the last printed.
    pub fn should_print(&self, api: &str, device: usize, bytes: u64, now_ms: u64) -> bool {
        let dev = device as u64 + 1;
        let api = fnv1a(api);
        let at = self.at_ms.load(Relaxed);
        if self.device.load(Relaxed) == dev
            && self.api.load(Relaxed) == api
            && self.bytes.load(Relaxed) == bytes
            && (at..at.saturating_add(REPEAT_WINDOW_MS)).contains(&now_ms)
        {
            return false;
        }
        self.device.store(dev, Relaxed);
        self.api.store(api, Relaxed);
        self.bytes.store(bytes, Relaxed);
        self.at_ms.store(now_ms, Relaxed);
        true
    }
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

    #[test]
    fn the_same_request_again_at_once_is_quiet_another_is_not() {
        let r = RefusalLines::new();
        assert!(r.should_print("cuMemAlloc", 0, 100 << 20, 10_000));
        assert!(
            !r.should_print("cuMemAlloc", 0, 100 << 20, 10_001),
            "CuPy's retry"
        );
        assert!(!r.should_print("cuMemAlloc", 0, 100 << 20, 10_999));
        assert!(
            r.should_print("cuMemAlloc", 0, 100 << 20, 11_000),
            "a second later"
        );
        assert!(
            r.should_print("cuMemAlloc", 1, 100 << 20, 11_001),
            "another GPU"
        );
        assert!(
            r.should_print("cuMemAlloc", 0, 100 << 20, 11_002),
            "back to GPU 0: printed"
        );
        assert!(
            r.should_print("cuMemAlloc", 0, 200 << 20, 11_003),
            "another size"
        );
        assert!(!r.should_print("cuMemAlloc", 0, 200 << 20, 11_004));
        assert!(
            r.should_print("cuMemAllocAsync", 0, 200 << 20, 11_005),
            "another entry point"
        );
        // A clock that went back prints: never quiet for longer than the window.
        assert!(r.should_print("cuMemAllocAsync", 0, 200 << 20, 9_000));
        // The first refusal prints, whatever the clock says.
        assert!(RefusalLines::new().should_print("cuMemAlloc", 0, 0, 0));
    }
}
