//! The per-member locks: one byte of the pool file per slot, locked with an
//! open-file-description lock (`F_OFD_SETLK`). The kernel drops it when the last
//! descriptor of the open file closes, so when the process dies, however it dies; it
//! is not tied to a pid, so PID namespaces and recycled pids do not matter.
//! Past the slots' bytes, one byte per GPU entry: the pool's window for the first
//! context measured on that GPU ([`SlotLocks::first_context_window`]). Past those, one
//! byte per slot that a member's forked children read-lock while they hold its device
//! files ([`SlotLocks::hold_in_child`]). Past those (and past what a cleaner locks), one
//! byte per GPU entry: the turn of the one `gpucap pool resize` or `pool set` changing
//! that GPU now ([`MemberLocks::take_turn`]).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::sync::atomic::{
    AtomicI32, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use std::time::{Duration, Instant};

use gpucap_core::budget::{Exit, MAX_POOL_GPUS, MAX_SLOTS, MemberLocks, TurnLock};

use crate::kept::Kept;

/// Where the slots' lock bytes start (past the file's end: locks need no data).
pub(crate) const LOCK_BASE: i64 = 1 << 40;

/// Where the GPU entries' first-context window bytes start: past every slot's.
const CONTEXT_BASE: i64 = LOCK_BASE + MAX_SLOTS as i64;

/// Where the bytes of the slots' forked children start: past every GPU entry's window.
const CHILDREN_BASE: i64 = CONTEXT_BASE + MAX_POOL_GPUS as i64;

/// How many bytes from [`LOCK_BASE`] the pool's locks take (slots, windows, children):
/// what a cleaner locks at once (`removal`).
pub(crate) const LOCKS_LEN: i64 = CHILDREN_BASE + MAX_SLOTS as i64 - LOCK_BASE;

/// Where the GPU entries' turn bytes start (a resize's or `pool set`'s): past the rest.
const TURN_BASE: i64 = LOCK_BASE + LOCKS_LEN;

/// The locks of one open pool file.
pub struct SlotLocks {
    /// The open file whose locks are this process's (its slot, its windows). The
    /// program may close the number and reuse it for a file of its own: the file is then
    /// opened again by its path where that is still the same file, and where it is not,
    /// this process takes no lock, takes no member for dead and holds no window (before,
    /// every lock call went to the program's file, where every slot looked free: a live
    /// member's bytes were taken back as a dead one's).
    fd: Kept,
    /// The file's path (None: a reader's, never opened again).
    path: Option<CString>,
    /// The slots this process holds or is acting on: two threads of one process share
    /// the open file, so the kernel would let both take the same slot.
    mine: [AtomicU64; MAX_SLOTS / 64],
    /// The error of a slot's lock that was refused for another reason than another
    /// holder (a file system without these locks): 0 while none was.
    refused: AtomicI32,
}

/// Whether the file system of `fd` supports open-file-description locks: one lock test,
/// made where a pool file is made, on the new file before it is named (no lock on it
/// yet: each lock call walks every lock on the file, one a member, so a test made by
/// every joiner would cost each a walk of the whole list).
pub(crate) fn supports_locks(fd: RawFd) -> std::io::Result<()> {
    lock_call(fd, libc::F_OFD_GETLK, &mut flock(libc::F_RDLCK, 0))
}

/// One lock call `cmd` (`F_OFD_SETLK`, `F_OFD_GETLK`) with `f` on `fd`.
pub(crate) fn lock_call(fd: RawFd, cmd: i32, f: &mut libc::flock) -> std::io::Result<()> {
    // SAFETY: a valid flock for the duration of the call; a closed fd gives EBADF.
    match unsafe { libc::fcntl(fd, cmd, f as *mut libc::flock) } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// Whether another open file of `fd`'s file holds slot `s`'s lock or its children byte:
/// its member lives, or processes it forked do.
pub(crate) fn slot_or_children_held(fd: RawFd, s: usize) -> bool {
    [LOCK_BASE, CHILDREN_BASE].into_iter().any(|base| {
        let mut f = flock_range(libc::F_WRLCK, base + s as i64, 1);
        lock_call(fd, libc::F_OFD_GETLK, &mut f).is_ok() && i32::from(f.l_type) != libc::F_UNLCK
    })
}

/// The member slots whose children byte (taken by processes the slot's member forked,
/// [`SlotLocks::hold_in_child`]) another open file of `fd`'s file holds: their member's
/// GPU memory may still be the driver's, for them. None where the locks cannot be read.
pub(crate) fn slots_with_children(fd: RawFd) -> Vec<usize> {
    let mut found = Vec::new();
    let mut from = 0;
    while from < MAX_SLOTS {
        let mut f = flock_range(
            libc::F_WRLCK,
            CHILDREN_BASE + from as i64,
            (MAX_SLOTS - from) as i64,
        );
        if lock_call(fd, libc::F_OFD_GETLK, &mut f).is_err() || i32::from(f.l_type) == libc::F_UNLCK
        {
            break;
        }
        let s = usize::try_from(f.l_start - CHILDREN_BASE).unwrap_or(MAX_SLOTS);
        if s < from || s >= MAX_SLOTS {
            break;
        }
        found.push(s);
        from = s + 1;
    }
    found
}

/// What to tell of a pool file whose file system refuses its locks.
pub(crate) fn unsupported(e: &std::io::Error) -> String {
    format!(
        "its file system does not support open file description locks ({e}); put pools \
         on a local file system such as /dev/shm or a tmpfs"
    )
}

fn flock(kind: i32, slot: usize) -> libc::flock {
    flock_range(kind, LOCK_BASE + slot as i64, 1)
}

/// A lock request of `kind` over `len` bytes from `start` (a slot's byte, or every
/// slot's at once: see `removal`).
pub(crate) fn flock_range(kind: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as _;
    f.l_whence = libc::SEEK_SET as _;
    f.l_start = start;
    f.l_len = len;
    f
}

impl SlotLocks {
    /// The locks of the pool file open as `fd`; a member's (`path`: the file's, opened
    /// read-write) opens it again where the program took the number.
    pub fn new(fd: RawFd, path: Option<CString>) -> Self {
        SlotLocks {
            fd: Kept::new(fd),
            path,
            mine: [const { AtomicU64::new(0) }; MAX_SLOTS / 64],
            refused: AtomicI32::new(0),
        }
    }

    /// The pool file's descriptor: the one kept while it is still the file, else the
    /// file opened again by its path; None where neither is (the program closed the
    /// number and the path names another file, or none; or closed in a forked child).
    fn file(&self) -> Option<RawFd> {
        match &self.path {
            Some(p) => self.fd.get_or_reopen(p, libc::O_RDWR),
            None => self.fd.get(),
        }
    }

    /// One lock call on the pool file; an error with no errno ([`lost`]) where it cannot
    /// be reached ([`file`]).
    ///
    /// [`file`]: Self::file
    fn fcntl(&self, cmd: i32, f: &mut libc::flock) -> std::io::Result<()> {
        match self.file() {
            Some(fd) => lock_call(fd, cmd, f),
            None => Err(std::io::Error::other("the pool file cannot be reached")),
        }
    }

    /// The open file's descriptor (-1 where it cannot be reached: [`file`](Self::file)).
    pub(crate) fn fd(&self) -> RawFd {
        self.file().unwrap_or(-1)
    }

    /// Why a slot's lock was refused other than by another holder, if one was (a pool
    /// file on a file system without these locks, made elsewhere: every slot then looks
    /// held), as the line to tell.
    pub fn refused(&self) -> Option<String> {
        match self.refused.load(Relaxed) {
            0 => None,
            errno => Some(unsupported(&std::io::Error::from_raw_os_error(errno))),
        }
    }

    /// The pool-wide window for the first context measured on GPU entry `entry`: while a
    /// member holds it, no other member that also knows no figure for a context there
    /// makes one, so the first measurement (device-wide: `gpucap_core::contexts`) is a
    /// context's alone and becomes the figure every later member reserves and settles
    /// against. Waits, sleeping a little longer each time (0.2 ms to 5 ms), until the
    /// window is free, `known()` says a figure arrived meanwhile (the waiter goes on
    /// without the window), or `patience` ran out (a member stopped inside the window
    /// must not stop the others for good: the waiter goes on without it, and its
    /// measurement, overlapped, is charged whole). Where the file system refuses the
    /// lock, the window is not held. Threads of one process share the open file, so the
    /// kernel lets them share the byte too: the process's own per-device lock orders them.
    pub fn first_context_window(
        &self,
        entry: usize,
        patience: Duration,
        known: &dyn Fn() -> bool,
    ) -> ContextWindow<'_> {
        let start = Instant::now();
        let byte = CONTEXT_BASE + entry as i64;
        let mut nap = Duration::from_micros(200);
        loop {
            let mut f = flock_range(libc::F_WRLCK, byte, 1);
            let outcome = match self.fcntl(libc::F_OFD_SETLK, &mut f) {
                Ok(()) => Some(WindowOutcome::Held),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                    if known() {
                        Some(WindowOutcome::FigureKnown)
                    } else if start.elapsed() >= patience {
                        Some(WindowOutcome::OutOfPatience)
                    } else {
                        None
                    }
                }
                Err(e) if lost(&e) => Some(WindowOutcome::FileLost),
                Err(_) => Some(WindowOutcome::Unsupported),
            };
            if let Some(outcome) = outcome {
                return ContextWindow {
                    locks: self,
                    byte,
                    outcome,
                    waited: start.elapsed(),
                };
            }
            crate::sys::nap(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// In a forked child of the member of slot `own`, before [`forget_in_child`]: the
    /// child holds its parent's device files (`/dev/nvidia*`, inherited), and the driver
    /// keeps the parent's memory until the last of them closes, after the parent's death
    /// too (NVIDIA/Megatron-LM#3684: a killed rank's memory stays until its dataloader
    /// workers exit). So the child read-locks the slot's children byte through an open
    /// file of its own (the pool file opened again through `/proc/self/fd`, never by
    /// its path, which may name another file by now; close-on-exec, as the device files
    /// are), kept open and never used again: the kernel drops the lock when the child and
    /// every process that inherits the descriptor from it are gone or exec'd, and a
    /// member that finds the parent dead takes its bytes back only then
    /// ([`MemberLocks::descendants_hold`]). The slot's own lock stays the parent's alone,
    /// so a parent killed holding a GPU's word lock blocks nobody meanwhile. Only system
    /// calls (`open`, `fcntl`): safe in a fork handler. Without `/proc` nothing is held:
    /// the parent's bytes come back at its death, as before.
    ///
    /// [`forget_in_child`]: Self::forget_in_child
    pub fn hold_in_child(&self, own: usize) {
        let Some(fd) = self.file().filter(|_| own < MAX_SLOTS) else {
            return;
        };
        let path = proc_fd_path(fd);
        // SAFETY: a NUL-terminated path in a local buffer; open is async-signal-safe.
        let copy = unsafe {
            crate::sys::open(
                path.as_ptr().cast(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
                0,
            )
        };
        if copy < 0 {
            return;
        }
        let mut f = flock_range(libc::F_RDLCK, CHILDREN_BASE + own as i64, 1);
        if lock_call(copy, libc::F_OFD_SETLK, &mut f).is_err() {
            // SAFETY: the descriptor just opened, closed once.
            unsafe { libc::close(copy) };
        }
    }

    /// In a forked child: the open file is its parent's, so closing the child's copy
    /// keeps the parent's locks and lets the kernel drop them when the parent dies. A
    /// number the program reused is its file: left open.
    pub fn forget_in_child(&self) {
        self.fd.close();
        for m in &self.mine {
            m.store(0, Relaxed);
        }
    }
}

/// How [`SlotLocks::first_context_window`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowOutcome {
    /// The window is this process's until dropped.
    Held,
    /// Another member measured a context there meanwhile: its figure is known.
    FigureKnown,
    /// The holder kept it past the patience.
    OutOfPatience,
    /// The file system refused the lock.
    Unsupported,
    /// The pool file cannot be reached: the program closed this process's descriptor
    /// and its path names another file, or none.
    FileLost,
}

/// A GPU's first-context window of the pool ([`SlotLocks::first_context_window`]),
/// given back when dropped.
pub struct ContextWindow<'a> {
    locks: &'a SlotLocks,
    byte: i64,
    outcome: WindowOutcome,
    waited: Duration,
}

impl ContextWindow<'_> {
    /// How waiting for the window ended.
    pub fn outcome(&self) -> WindowOutcome {
        self.outcome
    }

    /// How long it waited.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

impl Drop for ContextWindow<'_> {
    fn drop(&mut self) {
        if self.outcome == WindowOutcome::Held {
            let mut f = flock_range(libc::F_UNLCK, self.byte, 1);
            let _ = self.locks.fcntl(libc::F_OFD_SETLK, &mut f);
        }
    }
}

impl MemberLocks for SlotLocks {
    fn try_take(&self, s: usize) -> bool {
        let (word, bit) = (&self.mine[s / 64], 1u64 << (s % 64));
        if word.fetch_or(bit, AcqRel) & bit != 0 {
            return false;
        }
        let mut f = flock(libc::F_WRLCK, s);
        match self.fcntl(libc::F_OFD_SETLK, &mut f) {
            Ok(()) => return true,
            Err(e) => {
                // Refused for another reason than another holder: the file system's
                // (a file that cannot be reached has no errno: never the file system's).
                if let Some(errno) = e
                    .raw_os_error()
                    .filter(|&n| n != libc::EAGAIN && n != libc::EACCES)
                {
                    self.refused.store(errno, Relaxed);
                }
            }
        }
        word.fetch_and(!bit, AcqRel);
        false
    }

    fn give_back(&self, s: usize) {
        let mut f = flock(libc::F_UNLCK, s);
        let _ = self.fcntl(libc::F_OFD_SETLK, &mut f);
        self.mine[s / 64].fetch_and(!(1u64 << (s % 64)), AcqRel);
    }

    fn sleep_on(&self, word: &AtomicU64, seen: u64, timeout: Duration) {
        let ts = crate::sys::timespec(timeout);
        // SAFETY: the word lives in the pool's shared mapping for the life of the
        // process; FUTEX_WAIT (not private: other processes wake it) reads its low half.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                low_half(word),
                libc::FUTEX_WAIT,
                seen as u32,
                &ts as *const libc::timespec,
            )
        };
    }

    fn wake(&self, word: &AtomicU64) {
        // SAFETY: as in sleep_on; FUTEX_WAKE only reads the address.
        unsafe { libc::syscall(libc::SYS_futex, low_half(word), libc::FUTEX_WAKE, i32::MAX) };
    }

    fn exiting(&self, pid: u32, pid_namespace: u64, start_ms: u64) -> Exit {
        exiting(pid, pid_namespace, start_ms)
    }

    fn descendants_hold(&self, s: usize) -> bool {
        if s >= MAX_SLOTS {
            return false;
        }
        // A write lock could be placed unless a child holds its read lock.
        let mut f = flock_range(libc::F_WRLCK, CHILDREN_BASE + s as i64, 1);
        self.asked(&mut f)
    }

    fn refusing(&self) -> bool {
        self.refused.load(Relaxed) != 0
    }

    fn take_turn(&self, g: usize, max: Duration) -> TurnLock {
        if g >= MAX_POOL_GPUS {
            return TurnLock::Untold;
        }
        let start = Instant::now();
        loop {
            let mut f = flock_range(libc::F_WRLCK, TURN_BASE + g as i64, 1);
            match self.fcntl(libc::F_OFD_SETLK, &mut f) {
                Ok(()) => return TurnLock::Taken,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                    if start.elapsed() >= max {
                        return TurnLock::Busy;
                    }
                    crate::sys::nap(Duration::from_millis(1));
                }
                Err(_) => return TurnLock::Untold,
            }
        }
    }

    fn give_back_turn(&self, g: usize) {
        let mut f = flock_range(libc::F_UNLCK, TURN_BASE + g as i64, 1);
        let _ = self.fcntl(libc::F_OFD_SETLK, &mut f);
    }

    fn held(&self, s: usize) -> bool {
        if self.mine[s / 64].load(Acquire) & (1u64 << (s % 64)) != 0 {
            return true;
        }
        let mut f = flock(libc::F_RDLCK, s);
        // A read lock could be placed unless someone holds the write lock.
        self.asked(&mut f)
    }
}

impl SlotLocks {
    /// Whether another open file holds a lock that `f` would conflict with; true where
    /// the pool file cannot be reached (never taken for a dead member's), false where
    /// the file system cannot tell.
    fn asked(&self, f: &mut libc::flock) -> bool {
        match self.fcntl(libc::F_OFD_GETLK, f) {
            Ok(()) => i32::from(f.l_type) != libc::F_UNLCK,
            Err(e) => lost(&e),
        }
    }
}

/// Whether a lock call failed because the pool file cannot be reached
/// (`SlotLocks::fcntl`), not by the kernel's answer.
fn lost(e: &std::io::Error) -> bool {
    e.raw_os_error().is_none()
}

/// What /proc shows of a dead member's process (see `gpucap_core::budget::reclaim`): a
/// process becomes a zombie with one thread left only after its exit teardown closed
/// all its files, the driver's device files included.
fn exiting(pid: u32, pid_namespace: u64, start_ms: u64) -> Exit {
    if pid == 0 {
        return Exit::Done; // no process was recorded: nothing to wait for
    }
    match crate::identity::own_pid_namespace() {
        ns if pid_namespace != 0 && ns == pid_namespace => {}
        _ => return Exit::Unknown,
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Exit::Done; // reaped
    };
    let Some(fields) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Exit::Unknown;
    };
    let f: Vec<&str> = fields.split_whitespace().collect();
    // The leader of a thread group is a zombie as soon as its own thread ended; the
    // process's files close with its last thread, so the group is done only when the
    // leader is all that is left of it (`num_threads`, field 20).
    let alone = f.get(17).and_then(|t| t.parse::<u64>().ok()) == Some(1);
    if matches!(f.first(), Some(&"Z") | Some(&"X")) && alone {
        return Exit::Done;
    }
    // Not exiting (the kernel sets PF_EXITING at the start of its exit, before the
    // teardown closes its files): the process exec'd (its device files, opened
    // close-on-exec, closed with the pool file's) or left the pool itself.
    if f.get(6)
        .and_then(|t| t.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING == 0)
    {
        return Exit::Done;
    }
    // A process that started well after the member joined has its pid, not its files.
    match (
        f.get(19).and_then(|t| t.parse::<u64>().ok()),
        boot_ms(),
        ticks(),
    ) {
        (Some(t), Some(boot), Some(hz)) if boot + t * 1000 / hz > start_ms + SLACK_MS => Exit::Done,
        _ => Exit::Running,
    }
}

/// The kernel's `PF_EXITING`, in /proc/PID/stat's `flags` field: set when a task's exit
/// begins.
const PF_EXITING: u64 = 0x4;

/// The error of a process start time worked out from /proc (boot time in whole seconds).
const SLACK_MS: u64 = 2000;

/// When the system booted, ms since the Unix epoch (/proc/stat `btime`).
fn boot_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("btime "))?;
    line[6..].trim().parse::<u64>().ok().map(|s| s * 1000)
}

/// Clock ticks per second, the unit of /proc/PID/stat's start time.
fn ticks() -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&h| h > 0)
}

/// `/proc/self/fd/FD` NUL-terminated, without allocating (a fork handler may not):
/// formatted into a local buffer whose last byte stays 0.
pub(crate) fn proc_fd_path(fd: RawFd) -> [u8; 32] {
    use std::io::Write;
    let mut path = [0u8; 32];
    let _ = write!(&mut path[..31], "/proc/self/fd/{fd}");
    path
}

/// The address of the low 32 bits of `word`, which a futex compares.
fn low_half(word: &AtomicU64) -> *const u32 {
    let p = word.as_ptr() as *const u32;
    if cfg!(target_endian = "big") {
        p.wrapping_add(1)
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpucap_core::budget::{JoinError, Member, MemberInfo, POOL_WORDS, Pool};

    /// A forked child's hold on its parent's memory: a lock of its own on the slot's
    /// children byte, which lasts while it lives and not past an exec (the device files
    /// are close-on-exec too), and never holds the slot's own byte.
    #[test]
    fn a_forked_child_holds_its_parents_memory_until_it_exits_or_execs() {
        let path = std::env::temp_dir().join(format!("gpucap-children-{}", std::process::id()));
        let open = || {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .unwrap();
            SlotLocks::new(std::os::fd::IntoRawFd::into_raw_fd(f), None)
        };
        let (parent, observer) = (open(), open());
        let s = 37;
        assert!(parent.try_take(s));
        assert!(!observer.descendants_hold(s));
        // exec: "sleep" instead of waiting on the pipe (its lock must be gone with exec).
        let child = |exec: bool| {
            let (mut ready, mut go) = ([0; 2], [0; 2]);
            // SAFETY: two pipes into local arrays (close-on-exec: other tests of this
            // process start programs meanwhile, which must not keep the write ends).
            assert!(unsafe {
                libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) == 0
                    && libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) == 0
            });
            let sleep = c"/bin/sleep";
            let args = [sleep.as_ptr(), c"30".as_ptr(), std::ptr::null()];
            // SAFETY: the child makes only async-signal-safe calls (open, fcntl, close,
            // write, read, execv, _exit) before it exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                parent.hold_in_child(s);
                parent.forget_in_child();
                // SAFETY: the child's own pipe ends and a NUL-terminated argument list.
                unsafe {
                    libc::close(ready[0]);
                    libc::close(go[1]);
                    libc::write(ready[1], b"r".as_ptr().cast(), 1);
                    if exec {
                        libc::execv(sleep.as_ptr(), args.as_ptr());
                    }
                    let mut b = 0u8;
                    libc::read(go[0], (&mut b as *mut u8).cast(), 1);
                    libc::_exit(0);
                }
            }
            let mut b = 0u8;
            // SAFETY: our pipe ends.
            unsafe {
                libc::close(ready[1]);
                libc::close(go[0]);
                libc::read(ready[0], (&mut b as *mut u8).cast(), 1);
                libc::close(ready[0]);
            }
            (pid, go[1])
        };
        let (pid, go) = child(false);
        // The parent lets its slot go (as at its death): the child still holds its memory.
        parent.give_back(s);
        assert!(!observer.held(s), "the child holds no slot");
        assert!(observer.descendants_hold(s));
        assert!(!observer.descendants_hold(s + 1));
        // SAFETY: our pipe end (the child reads its end), then the child we forked.
        unsafe {
            libc::close(go);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert!(!observer.descendants_hold(s), "its lock went with it");
        assert!(parent.try_take(s));
        let (pid, go) = child(true);
        let start = Instant::now();
        while observer.descendants_hold(s) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!observer.descendants_hold(s), "exec drops the child's hold");
        // SAFETY: the child we forked (now sleep), and our pipe end.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(go);
        }
        let _ = std::fs::remove_file(&path);
    }

    /// A lock refused for another reason than another holder (here by an inotify
    /// descriptor, which refuses every lock with EBADF, as a file system without these
    /// locks refuses them all) is kept and told, and a joiner that finds no slot for it
    /// does not wait for one.
    #[test]
    fn a_lock_refused_by_the_file_system_is_told_and_not_waited_for() {
        // SAFETY: no arguments but flags; the descriptor is the test's for its life.
        let refusing = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(refusing >= 0);
        let locks: &'static SlotLocks = Box::leak(Box::new(SlotLocks::new(refusing, None)));
        assert!(!locks.refusing() && locks.refused().is_none());
        assert!(!locks.try_take(0));
        assert!(locks.refusing());
        let why = locks.refused().unwrap();
        assert!(
            why.contains("does not support open file description locks"),
            "{why}"
        );
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        let pool = Pool::create(words, 0, 0).unwrap();
        let start = Instant::now();
        let joined =
            Member::join_waiting(pool, locks, &MemberInfo::default(), Duration::from_secs(30));
        assert!(matches!(joined, Err(JoinError::Full { .. })));
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "waited {:?}",
            start.elapsed()
        );
    }
}
