//! A dead member's bytes are taken back only once the driver has released them.
//!
//! A member's slot lock is an open-file-description lock on the pool file, which the
//! kernel drops when the pool file's last descriptor closes. A killed process's
//! descriptors all close in its exit teardown (`exit_files`), the pool file's among
//! them, and the driver frees the process's memory when its own device files
//! (`/dev/nvidia*`) are released in that same teardown: in an order of descriptors that
//! nothing fixes, and the driver may even defer the release (or a forked child may
//! still hold the device files). So a free slot lock says the member is dead, not that
//! its memory is free: taking its bytes back at once lets another member allocate them
//! while the driver still holds them, and the GPU holds more than the cap (issue 34.8:
//! 1,360 MiB in a 1 GiB pool in a kill storm).
//!
//! The process becomes a zombie (or vanishes, once reaped) only after its whole file
//! teardown, device files included. So the taker asks the kernel
//! (`MemberLocks::exiting`): while the dead member's process is still there and not a
//! zombie, its bytes stay in the pool's `used` and the slot is left for a later look
//! (the next refusal, join or wait), up to [`EXIT_MAX`] since this process first found
//! it so (a process stuck in its teardown, or a recycled pid taken for it). Where the
//! kernel cannot tell (the member lived in another PID namespace), the bytes are held
//! back for [`EXIT_GRACE`] since first found dead.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::layout::*;
use std::sync::atomic::Ordering::Relaxed;

/// The longest a dead member's bytes are held back while its process is still seen
/// tearing down.
pub const EXIT_MAX: Duration = Duration::from_secs(10);

/// How long a dead member's bytes are held back where its process cannot be seen.
pub const EXIT_GRACE: Duration = Duration::from_millis(200);

/// What `MemberLocks::exiting` finds of a dead member's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Gone, a zombie, or another process now has its pid: its files are all closed.
    Done,
    /// Still there and not a zombie: its device files may still be open.
    Running,
    /// Not visible from here (another PID namespace, no /proc).
    Unknown,
}

/// Dead slots whose bytes are held back: (slot, generation, pid, first found).
static HELD_BACK: Mutex<Vec<(usize, u64, u64, Instant)>> = Mutex::new(Vec::new());

/// Called holding dead slot `s`'s lock: whether its bytes may be taken back now (the
/// driver released them, or the wait for it is over). `exiting` asks the kernel
/// (`MemberLocks::exiting`).
pub(super) fn released(w: Words<'_>, exiting: impl Fn(u32, u64, u64) -> Exit, s: usize) -> bool {
    let pid = w.slot(s, S_PID).load(Relaxed);
    let generation = w.slot(s, S_GENERATION).load(Relaxed);
    // A pid that cannot be one (0, or past 32 bits: a slot written by no member) names no
    // process to wait for: the kernel's answer for pid 0 (none) decides.
    let exit = exiting(
        u32::try_from(pid).unwrap_or(0),
        w.slot(s, S_PIDNS).load(Relaxed),
        w.slot(s, S_START_MS).load(Relaxed),
    );
    decide(exit, (s, generation, pid), Instant::now())
}

/// The rule, for a dead slot keyed (slot, generation, pid) found at `now`.
fn decide(exit: Exit, key: (usize, u64, u64), now: Instant) -> bool {
    let mut held = HELD_BACK.lock().unwrap_or_else(|p| p.into_inner());
    let bound = match exit {
        Exit::Done => None,
        Exit::Running => Some(EXIT_MAX),
        Exit::Unknown => Some(EXIT_GRACE),
    };
    let found = held
        .iter()
        .position(|&(s, g, p, _)| (s, g, p) == key)
        .map(|i| held[i].3);
    let release = match (bound, found) {
        (None, _) => true,
        (Some(max), Some(first)) => now.duration_since(first) >= max,
        (Some(_), None) => {
            // Keep the list short: entries of slots taken back meanwhile by others.
            held.retain(|&(s, _, _, t)| s != key.0 && now.duration_since(t) < EXIT_MAX * 2);
            held.push((key.0, key.1, key.2, now));
            false
        }
    };
    if release {
        held.retain(|&(s, g, p, _)| (s, g, p) != key);
    }
    release
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dying_members_bytes_wait_for_its_teardown_boundedly() {
        let t0 = Instant::now();
        // Gone: at once.
        assert!(decide(Exit::Done, (900, 1, 7), t0));
        // Still tearing down: held back, until it is done or EXIT_MAX passed.
        assert!(!decide(Exit::Running, (901, 1, 7), t0));
        assert!(!decide(Exit::Running, (901, 1, 7), t0 + EXIT_MAX / 2));
        assert!(decide(Exit::Done, (901, 1, 7), t0 + EXIT_MAX / 2));
        assert!(!decide(Exit::Running, (902, 1, 7), t0));
        assert!(decide(Exit::Running, (902, 1, 7), t0 + EXIT_MAX));
        // Not visible: a short grace.
        assert!(!decide(Exit::Unknown, (903, 1, 7), t0));
        assert!(!decide(Exit::Unknown, (903, 1, 7), t0 + EXIT_GRACE / 2));
        assert!(decide(Exit::Unknown, (903, 1, 7), t0 + EXIT_GRACE));
        // Another member of the same slot is a new wait.
        assert!(!decide(Exit::Running, (904, 1, 7), t0));
        assert!(!decide(Exit::Running, (904, 2, 8), t0 + EXIT_MAX));
    }
}
