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
//! while the driver still holds them, and the GPU holds more than the cap (a kill storm
//! once put 1,360 MiB in a 1 GiB pool).
//!
//! The process becomes a zombie (or vanishes, once reaped) only after its whole file
//! teardown, device files included. So the taker asks the kernel
//! (`MemberLocks::exiting`): while the dead member's process is still there and not a
//! zombie, its bytes stay in the pool's `used` and the slot is left for a later look
//! (the next refusal, join or wait), up to [`EXIT_MAX`] since this process first found
//! it so (a process stuck in its teardown, or a recycled pid taken for it).
//!
//! A forked child holds its parent's device files (inherited; close-on-exec, so until
//! it execs or exits) and the driver keeps the parent's memory until the last of them
//! closes, after the parent's death too: while a dead member's descendants hold them
//! (`MemberLocks::descendants_hold`, a lock each child takes in a fork handler) its
//! bytes stay, for as long as that lasts (no bound: the driver holds them as long).
//!
//! Where the kernel cannot tell (the member lived in another PID namespace), the driver
//! is asked, through the view the shim gives ([`show_driver`]; NVML): the bytes come
//! back on each GPU the member held bytes on once the driver shows them released: its
//! process is no longer in NVML's process list (where its host pid is known: it lived
//! in the initial PID namespace, see `pid_namespace`), or the GPU's device-wide used
//! figure fell by at least its bytes since it was first found dead. While NVML still
//! lists its process they wait up to [`EXIT_MAX`]; where the driver cannot say (no
//! NVML, a MIG instance, other processes' traffic hiding the fall), up to
//! [`EXIT_GRACE`].

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::layout::{
    G_KEY, M_USED, MAX_POOL_GPUS, S_GENERATION, S_PID, S_PIDNS, S_START_MS, Words,
};
use crate::pid_namespace::INITIAL_PID_NAMESPACE;
use std::sync::atomic::Ordering::Relaxed;

/// The longest a dead member's bytes are held back while its process is still seen
/// tearing down.
pub const EXIT_MAX: Duration = Duration::from_secs(10);

/// How long a dead member's bytes are held back where its process cannot be seen and
/// the driver does not show them released. A bound chosen, not measured: what a real
/// driver takes from a SIGKILL to the release of the process's memory is to be measured
/// on a GPU (`scripts/gpu/`'s SIGKILL-to-release probe) and this set from it
/// (`docs/src/pools.md` says so).
pub const EXIT_GRACE: Duration = Duration::from_millis(200);

/// What the driver shows of one GPU: the pids NVML lists on it (read whole; None: it
/// cannot say) and its device-wide used memory (None: it cannot say).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverShows {
    pub pids: Option<Vec<u32>>,
    pub used: Option<u64>,
}

/// The driver's view of a GPU named by its UUID, given by the shim (NVML).
pub type DriverView = fn(&[u8; 16]) -> DriverShows;

static VIEW: OnceLock<DriverView> = OnceLock::new();

/// Sets the driver's view this process asks about a dead member in another PID
/// namespace (once; a process that sets none waits [`EXIT_GRACE`]).
pub fn show_driver(view: DriverView) {
    let _ = VIEW.set(view);
}

/// One GPU a dead member held bytes on, as the driver shows it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shown {
    /// The member's bytes there.
    bytes: u64,
    /// Whether NVML lists the member's process there (None: its host pid is not known,
    /// or NVML cannot say).
    listed: Option<bool>,
    /// The device-wide used figure (None: the driver cannot say).
    used: Option<u64>,
}

/// What the driver's figures say of a dead member's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// Released on every GPU it held bytes on.
    Released,
    /// NVML still lists its process on a GPU.
    Holds,
    /// The figures prove neither.
    CannotSay,
}

/// The rule: `now` of each GPU against the used figures when the member was first found
/// dead (`first`, in the same order; None: not read then).
fn driver_says(now: &[Shown], first: &[Option<u64>]) -> Driver {
    let mut all = true;
    for (i, g) in now.iter().enumerate() {
        match g.listed {
            Some(true) => return Driver::Holds,
            Some(false) => continue,
            None => {}
        }
        let fell = match (first.get(i).copied().flatten(), g.used) {
            (Some(before), Some(used)) => before.saturating_sub(used) >= g.bytes,
            _ => false,
        };
        all &= fell;
    }
    if all {
        Driver::Released
    } else {
        Driver::CannotSay
    }
}

/// Slot `s`'s GPUs with bytes, as the driver shows them ([`VIEW`]): empty when no view
/// was set.
fn shown(w: Words<'_>, s: usize, host_pid: Option<u32>) -> Vec<Shown> {
    let Some(view) = VIEW.get() else {
        return Vec::new();
    };
    (0..MAX_POOL_GPUS)
        .filter(|&g| w.gpu(g, G_KEY).load(Relaxed) != 0)
        .filter_map(|g| {
            let bytes = w.member_gpu(s, g, M_USED).load(Relaxed);
            (bytes > 0).then(|| {
                let d = view(&w.uuid(g));
                Shown {
                    bytes,
                    listed: host_pid.zip(d.pids).map(|(p, pids)| pids.contains(&p)),
                    used: d.used,
                }
            })
        })
        .collect()
}

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

/// Dead slots whose bytes are held back: (slot, generation, pid, first found, the used
/// figures of its GPUs then).
type HeldBack = (usize, u64, u64, Instant, Vec<Option<u64>>);
static HELD_BACK: Mutex<Vec<HeldBack>> = Mutex::new(Vec::new());

/// Called holding dead slot `s`'s lock: whether its bytes may be taken back now (the
/// driver released them, or the wait for it is over). `descendants_hold`: its forked
/// children still hold its device files (`MemberLocks::descendants_hold`); `exiting`
/// asks the kernel (`MemberLocks::exiting`).
pub(super) fn released(
    w: Words<'_>,
    s: usize,
    descendants_hold: bool,
    exiting: impl Fn(u32, u64, u64) -> Exit,
) -> bool {
    if descendants_hold {
        return false;
    }
    let pid = w.slot(s, S_PID).load(Relaxed);
    let generation = w.slot(s, S_GENERATION).load(Relaxed);
    let pidns = w.slot(s, S_PIDNS).load(Relaxed);
    // A pid that cannot be one (0: a slot written by no member) names no process to wait
    // for: the kernel's answer for pid 0 (none) decides.
    let pid32 = super::layout::word_pid(pid);
    let exit = exiting(pid32, pidns, w.slot(s, S_START_MS).load(Relaxed));
    let now = match exit {
        // A member of the initial PID namespace is listed by NVML under its pid.
        Exit::Unknown => shown(
            w,
            s,
            (pidns == INITIAL_PID_NAMESPACE && pid32 != 0).then_some(pid32),
        ),
        _ => Vec::new(),
    };
    decide(exit, (s, generation, pid), &now, Instant::now())
}

/// The rule, for a dead slot keyed (slot, generation, pid) found at `now`, the driver
/// showing `shown` of its GPUs.
fn decide(exit: Exit, key: (usize, u64, u64), shown: &[Shown], now: Instant) -> bool {
    let mut held = HELD_BACK.lock().unwrap_or_else(|p| p.into_inner());
    let found = held
        .iter()
        .position(|e| (e.0, e.1, e.2) == key)
        .map(|i| (held[i].3, held[i].4.clone()));
    let bound = match exit {
        Exit::Done => None,
        Exit::Running => Some(EXIT_MAX),
        Exit::Unknown if shown.is_empty() => Some(EXIT_GRACE),
        Exit::Unknown => {
            let first = found.as_ref().map_or(&[][..], |(_, f)| f.as_slice());
            match driver_says(shown, first) {
                Driver::Released => None,
                Driver::Holds => Some(EXIT_MAX),
                Driver::CannotSay => Some(EXIT_GRACE),
            }
        }
    };
    let release = match (bound, found) {
        (None, _) => true,
        (Some(max), Some((first, _))) => now.duration_since(first) >= max,
        (Some(_), None) => {
            // Keep the list short: entries of slots taken back meanwhile by others.
            held.retain(|e| e.0 != key.0 && now.duration_since(e.3) < EXIT_MAX * 2);
            let used = shown.iter().map(|g| g.used).collect();
            held.push((key.0, key.1, key.2, now, used));
            false
        }
    };
    if release {
        held.retain(|e| (e.0, e.1, e.2) != key);
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
        assert!(decide(Exit::Done, (900, 1, 7), &[], t0));
        // Still tearing down: held back, until it is done or EXIT_MAX passed.
        assert!(!decide(Exit::Running, (901, 1, 7), &[], t0));
        assert!(!decide(Exit::Running, (901, 1, 7), &[], t0 + EXIT_MAX / 2));
        assert!(decide(Exit::Done, (901, 1, 7), &[], t0 + EXIT_MAX / 2));
        assert!(!decide(Exit::Running, (902, 1, 7), &[], t0));
        assert!(decide(Exit::Running, (902, 1, 7), &[], t0 + EXIT_MAX));
        // Not visible: a short grace.
        assert!(!decide(Exit::Unknown, (903, 1, 7), &[], t0));
        assert!(!decide(
            Exit::Unknown,
            (903, 1, 7),
            &[],
            t0 + EXIT_GRACE / 2
        ));
        assert!(decide(Exit::Unknown, (903, 1, 7), &[], t0 + EXIT_GRACE));
        // Another member of the same slot is a new wait.
        assert!(!decide(Exit::Running, (904, 1, 7), &[], t0));
        assert!(!decide(Exit::Running, (904, 2, 8), &[], t0 + EXIT_MAX));
    }

    const MIB: u64 = 1 << 20;

    fn gpu(bytes: u64, listed: Option<bool>, used: Option<u64>) -> Shown {
        Shown {
            bytes,
            listed,
            used,
        }
    }

    #[test]
    fn an_unseen_members_bytes_come_back_when_the_driver_shows_them_released() {
        let t0 = Instant::now();
        let soon = t0 + EXIT_GRACE / 4;
        // NVML no longer lists its process (its host pid known): at once.
        assert!(decide(
            Exit::Unknown,
            (910, 1, 7),
            &[gpu(100 * MIB, Some(false), None)],
            t0
        ));
        // Still listed: held back past the short bound, up to EXIT_MAX.
        let listed = [gpu(100 * MIB, Some(true), Some(900 * MIB))];
        assert!(!decide(Exit::Unknown, (911, 1, 7), &listed, t0));
        assert!(!decide(
            Exit::Unknown,
            (911, 1, 7),
            &listed,
            t0 + EXIT_GRACE
        ));
        assert!(decide(Exit::Unknown, (911, 1, 7), &listed, t0 + EXIT_MAX));
        // The device's used figure fell by at least its bytes since first found dead.
        let at_first = [gpu(100 * MIB, None, Some(900 * MIB))];
        assert!(!decide(Exit::Unknown, (912, 1, 7), &at_first, t0));
        let fell_less = [gpu(100 * MIB, None, Some(850 * MIB))];
        assert!(!decide(Exit::Unknown, (912, 1, 7), &fell_less, soon));
        let fell = [gpu(100 * MIB, None, Some(800 * MIB))];
        assert!(decide(Exit::Unknown, (912, 1, 7), &fell, soon));
        // Every GPU it held bytes on must show it.
        let two = [
            gpu(100 * MIB, None, Some(900 * MIB)),
            gpu(50 * MIB, None, Some(400 * MIB)),
        ];
        assert!(!decide(Exit::Unknown, (913, 1, 7), &two, t0));
        let one_fell = [
            gpu(100 * MIB, None, Some(700 * MIB)),
            gpu(50 * MIB, None, Some(400 * MIB)),
        ];
        assert!(!decide(Exit::Unknown, (913, 1, 7), &one_fell, soon));
        let both = [
            gpu(100 * MIB, None, Some(700 * MIB)),
            gpu(50 * MIB, Some(false), None),
        ];
        assert!(decide(Exit::Unknown, (913, 1, 7), &both, soon));
        // Figures that prove nothing: the short bound, as without a driver view.
        let blind = [gpu(100 * MIB, None, None)];
        assert!(!decide(Exit::Unknown, (914, 1, 7), &blind, t0));
        assert!(!decide(Exit::Unknown, (914, 1, 7), &blind, soon));
        assert!(decide(Exit::Unknown, (914, 1, 7), &blind, t0 + EXIT_GRACE));
        // Other processes' traffic raised the figure: the fall is not seen, the bound holds.
        let risen = [gpu(100 * MIB, None, Some(1000 * MIB))];
        assert!(!decide(Exit::Unknown, (915, 1, 7), &at_first, t0));
        assert!(!decide(Exit::Unknown, (915, 1, 7), &risen, soon));
        assert!(decide(Exit::Unknown, (915, 1, 7), &risen, t0 + EXIT_GRACE));
    }
}
