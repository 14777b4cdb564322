//! Calls a test holds open at their middle: once a call took or gave back its memory it
//! creates `PATH.N` (FAKECUDA_LIMIT_HALFWAY, FAKECUDA_LOAD_HALFWAY: the process's Nth
//! such call) and waits until another path exists (FAKECUDA_LIMIT_UNTIL,
//! FAKECUDA_LOAD_UNTIL), so that a test can put another process's traffic inside it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The calls held so far, of one kind.
pub struct Held(AtomicU64);

impl Held {
    pub const fn new() -> Self {
        Held(AtomicU64::new(0))
    }

    /// Creates `halfway.N` for this kind's Nth call, then waits until `until` exists
    /// (polled every 5 ms, at most 60 s); each only where it is set.
    pub fn middle(&self, halfway: Option<&Path>, until: Option<&Path>) {
        if let Some(path) = halfway {
            let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
            let mut name = path.to_path_buf().into_os_string();
            name.push(format!(".{n}"));
            let _ = std::fs::File::create(name);
        }
        if let Some(path) = until {
            for _ in 0..12_000 {
                if path.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}
