//! The per-member locks: one byte of the pool file per slot, locked with an
//! open-file-description lock (`F_OFD_SETLK`). The kernel drops it when the last
//! descriptor of the open file closes, so when the process dies, however it dies; it
//! is not tied to a pid, so PID namespaces and recycled pids do not matter.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};
use std::time::Duration;

use gpucap_core::budget::{MAX_SLOTS, MemberLocks};

/// Where the slots' lock bytes start (past the file's end: locks need no data).
const LOCK_BASE: i64 = 1 << 40;

/// The locks of one open pool file.
pub struct SlotLocks {
    fd: AtomicI32,
    /// The slots this process holds or is acting on: two threads of one process share
    /// the open file, so the kernel would let both take the same slot.
    mine: [AtomicU64; MAX_SLOTS / 64],
}

fn flock(kind: i32, slot: usize) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as _;
    f.l_whence = libc::SEEK_SET as _;
    f.l_start = LOCK_BASE + slot as i64;
    f.l_len = 1;
    f
}

impl SlotLocks {
    pub fn new(fd: RawFd) -> Self {
        SlotLocks {
            fd: AtomicI32::new(fd),
            mine: [const { AtomicU64::new(0) }; MAX_SLOTS / 64],
        }
    }

    fn fcntl(&self, cmd: i32, f: &mut libc::flock) -> std::io::Result<()> {
        // SAFETY: a valid flock for the duration of the call; a closed fd gives EBADF.
        match unsafe { libc::fcntl(self.fd.load(Relaxed), cmd, f as *mut libc::flock) } {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        }
    }

    /// Whether the file system supports these locks (asked once when the file opens).
    pub fn probe(&self) -> std::io::Result<()> {
        let mut f = flock(libc::F_RDLCK, 0);
        self.fcntl(libc::F_OFD_GETLK, &mut f)
    }

    /// In a forked child: the open file is its parent's, so closing the child's copy
    /// keeps the parent's locks and lets the kernel drop them when the parent dies.
    pub fn forget_in_child(&self) {
        let fd = self.fd.swap(-1, Relaxed);
        if fd >= 0 {
            // SAFETY: the child's own descriptor, closed once (swapped out above).
            unsafe { libc::close(fd) };
        }
        for m in &self.mine {
            m.store(0, Relaxed);
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
        if self.fcntl(libc::F_OFD_SETLK, &mut f).is_ok() {
            return true;
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
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
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

    fn held(&self, s: usize) -> bool {
        if self.mine[s / 64].load(Acquire) & (1u64 << (s % 64)) != 0 {
            return true;
        }
        let mut f = flock(libc::F_RDLCK, s);
        // A read lock could be placed unless someone holds the write lock.
        self.fcntl(libc::F_OFD_GETLK, &mut f).is_ok() && i32::from(f.l_type) != libc::F_UNLCK
    }
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
