//! A descriptor this library keeps while the program runs (a pool file's, a claim's
//! memfd and socket, a lone process's file), with the file it was when kept (its device
//! and inode). The program may close any descriptor and reuse its number (a server
//! closing every descriptor it did not open, then opening files of its own): the library
//! acts on a number only while it is still the file it kept, so it never locks, writes,
//! sends or closes one of the program's files, and where the number is lost it opens the
//! file again by its path (checked to be the same file) or goes without. A program
//! closing and reusing the number between the check and the call that follows it is not
//! guarded against. Only system calls (`fstat`, `open`, `close`): usable in a fork handler.

use std::ffi::CStr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

/// What `fd` is now (`fstat`), None where it is not open.
pub(crate) fn stat_of(fd: RawFd) -> Option<crate::sys::stat> {
    if fd < 0 {
        return None;
    }
    // SAFETY: plain data filled by fstat.
    let mut st: crate::sys::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor number and a stat to fill.
    (unsafe { crate::sys::fstat(fd, &mut st) } == 0).then_some(st)
}

/// What is at the NUL-terminated `path` now (`lstat`: not followed), None where nothing
/// is; no allocation.
pub(crate) fn lstat_of(path: *const libc::c_char) -> Option<crate::sys::stat> {
    // SAFETY: plain data filled by lstat.
    let mut st: crate::sys::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a stat to fill.
    (unsafe { crate::sys::lstat(path, &mut st) } == 0).then_some(st)
}

/// Why [`open_regular`] opened nothing.
pub(crate) enum Refused {
    /// The name could not be looked up (`ENOENT`: nothing there), or the file looked at
    /// could not be opened with the access asked for (`EACCES`).
    Open(std::io::Error),
    /// What is there is not a regular file, or not the one the caller wants.
    Other,
}

/// The regular file at `path`, opened with `access` (`O_CLOEXEC`, `O_NOCTTY` and
/// `O_NONBLOCK` added) only once it is known to be one that `want` accepts: the name is
/// first opened with `O_PATH` (and `how`: `O_NOFOLLOW` for a path, 0 for a kernel's link
/// to follow), which runs no driver's `open` and waits on no FIFO (a device or a FIFO is
/// never opened: opening `/dev/watchdog` arms it), looked at (`fstat`), and only then
/// opened for reading or writing through `/proc/self/fd/M`: the very file looked at,
/// whatever the name names by then. A new open file description of this process's own
/// (its locks are this process's).
pub(crate) fn open_regular(
    path: &CStr,
    how: i32,
    access: i32,
    want: impl Fn(&crate::sys::stat) -> bool,
) -> Result<RawFd, Refused> {
    // SAFETY: a NUL-terminated path; O_PATH opens nothing but the name.
    let looked =
        unsafe { crate::sys::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | how, 0) };
    if looked < 0 {
        return Err(Refused::Open(std::io::Error::last_os_error()));
    }
    let fits =
        stat_of(looked).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && want(&st));
    if !fits {
        close_fd(looked);
        return Err(Refused::Other);
    }
    let mut buf = [0u8; 32];
    let again = fd_link(looked, &mut buf);
    // SAFETY: a NUL-terminated path naming our O_PATH descriptor's file.
    let fd = unsafe {
        crate::sys::open(
            again.as_ptr(),
            access | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK,
            0,
        )
    };
    let err = std::io::Error::last_os_error();
    close_fd(looked);
    if fd < 0 {
        return Err(Refused::Open(err));
    }
    Ok(fd)
}

/// `/proc/self/fd/N` for descriptor `fd`, written into `buf` (no allocation: usable in a
/// fork handler).
fn fd_link(fd: RawFd, buf: &mut [u8; 32]) -> &CStr {
    const HEAD: &[u8] = b"/proc/self/fd/";
    buf[..HEAD.len()].copy_from_slice(HEAD);
    let mut digits = [0u8; 10];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (i, d) in digits[..len].iter().rev().enumerate() {
        buf[HEAD.len() + i] = *d;
    }
    buf[HEAD.len() + len] = 0;
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/proc/self/fd/-")
}

/// The regular file `id` (device, inode) the kernel's link `link` names
/// (`/proc/PID/fd/N`), opened with `access` as an open file of this process's own (an
/// open file description of its own: its locks are this process's), followed on purpose;
/// never waits on what is there, and opens nothing that is not that regular file
/// ([`open_regular`]: a device announced is looked at, never opened). Err: why not.
pub(crate) fn open_link(link: &CStr, id: (u64, u64), access: i32) -> Result<RawFd, String> {
    open_link_if(link, access, |st| (st.st_dev, st.st_ino) == id)
}

/// [`open_link`] of the regular file that `want` accepts.
pub(crate) fn open_link_if(
    link: &CStr,
    access: i32,
    want: impl Fn(&crate::sys::stat) -> bool,
) -> Result<RawFd, String> {
    open_regular(link, 0, access, want).map_err(|r| match r {
        Refused::Open(e) => format!("cannot open {}: {e}", link.to_string_lossy()),
        Refused::Other => format!("{} is no longer that file", link.to_string_lossy()),
    })
}

/// The file `fd` is now (its device and inode), None where it is not open.
pub(crate) fn identity(fd: RawFd) -> Option<(u64, u64)> {
    stat_of(fd).map(|st| (st.st_dev, st.st_ino))
}

/// A kept descriptor: its number (-1: none) and the file it was when kept.
pub struct Kept {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

impl Kept {
    /// None kept yet.
    pub const fn none() -> Self {
        Kept {
            fd: AtomicI32::new(-1),
            dev: AtomicU64::new(0),
            ino: AtomicU64::new(0),
        }
    }

    /// `fd`, kept as the file it is now.
    pub fn new(fd: RawFd) -> Self {
        let k = Kept::none();
        k.keep(fd);
        k
    }

    /// Keeps `fd` as the file it is now (an entry of a static table, taken again).
    pub fn keep(&self, fd: RawFd) {
        let (dev, ino) = identity(fd).unwrap_or((0, 0));
        self.dev.store(dev, Relaxed);
        self.ino.store(ino, Relaxed);
        self.fd.store(fd, Relaxed);
    }

    /// Whether `fd` is the file kept (a copy of it, say).
    pub fn is(&self, fd: RawFd) -> bool {
        self.fd.load(Relaxed) >= 0
            && identity(fd) == Some((self.dev.load(Relaxed), self.ino.load(Relaxed)))
    }

    /// The number, while it is still the file kept; None once the program closed it or
    /// took the number for a file of its own (or none is kept).
    pub fn get(&self) -> Option<RawFd> {
        let fd = self.fd.load(Relaxed);
        self.is(fd).then_some(fd)
    }

    /// The number as kept, whatever it is now.
    pub fn number(&self) -> RawFd {
        self.fd.load(Relaxed)
    }

    /// [`get`](Self::get), or where the number is lost, `path` opened again with `flags`
    /// (`O_CLOEXEC` and `O_NOFOLLOW` added) and kept under its new number if it is still
    /// the file kept: None where it is not (removed, replaced) or cannot be opened. The
    /// new number is a new open file: locks the old one held stay the old one's. The
    /// caller keeps the file itself alive meanwhile (a mapping of it): a file's inode
    /// number, once the file is gone, may be a new file's.
    pub fn get_or_reopen(&self, path: &CStr, flags: i32) -> Option<RawFd> {
        if let Some(fd) = self.get() {
            return Some(fd);
        }
        let was = self.fd.load(Relaxed);
        if was < 0 {
            return None;
        }
        // SAFETY: a NUL-terminated path; never follows a link, never waits on a FIFO.
        let fd = unsafe {
            crate::sys::open(
                path.as_ptr(),
                flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return None;
        }
        if identity(fd) != Some((self.dev.load(Relaxed), self.ino.load(Relaxed))) {
            close_fd(fd);
            return None;
        }
        // Another thread may have opened it again at the same time: one number is kept.
        match self.fd.compare_exchange(was, fd, Relaxed, Relaxed) {
            Ok(_) => Some(fd),
            Err(_) => {
                close_fd(fd);
                self.get()
            }
        }
    }

    /// Forgets the number, closing it only where it is still the file kept (in a forked
    /// child, say: never one of the program's files).
    pub fn close(&self) {
        let fd = self.fd.load(Relaxed);
        let ours = self.is(fd);
        if self.fd.swap(-1, Relaxed) == fd && ours {
            close_fd(fd);
        }
    }

    /// Forgets the number, closing nothing.
    pub fn forget(&self) {
        self.fd.store(-1, Relaxed);
    }
}

fn close_fd(fd: RawFd) {
    // SAFETY: a descriptor this module opened or checked to be the file kept.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("gpucap-kept-{tag}-{}", std::process::id()));
        std::fs::write(&p, b"").unwrap();
        p
    }

    /// `other` opened under `fd`'s number (`dup2` closes what was there): the program's
    /// own file under the kept number, as after its `close` and `open`.
    fn reuse(fd: RawFd, other: &std::path::Path) -> RawFd {
        let o = std::fs::File::open(other).unwrap().into_raw_fd();
        // SAFETY: two descriptors of this test.
        assert_eq!(unsafe { libc::dup2(o, fd) }, fd);
        close_fd(o);
        fd
    }

    #[test]
    fn a_number_the_program_took_back_is_neither_used_nor_closed() {
        let (mine, theirs) = (scratch("mine"), scratch("theirs"));
        let fd = std::fs::File::open(&mine).unwrap().into_raw_fd();
        let kept = Kept::new(fd);
        assert_eq!(kept.get(), Some(fd));
        let program = reuse(fd, &theirs);
        assert_eq!(kept.get(), None, "the number is the program's file now");
        kept.close();
        assert!(identity(program).is_some(), "the program's file was closed");
        assert_eq!(kept.number(), -1);
        close_fd(program);
        for p in [mine, theirs] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn a_lost_number_is_opened_again_by_its_path_only_where_it_names_the_same_file() {
        let (mine, theirs) = (scratch("mine2"), scratch("theirs2"));
        let c = std::ffi::CString::new(mine.to_str().unwrap()).unwrap();
        let fd = std::fs::File::open(&mine).unwrap().into_raw_fd();
        let kept = Kept::new(fd);
        // The file stays alive, as a mapping keeps it: its inode is no new file's.
        let _pin = std::fs::File::open(&mine).unwrap();
        let program = reuse(fd, &theirs);
        let again = kept
            .get_or_reopen(&c, libc::O_RDONLY)
            .expect("opened again");
        assert_ne!(again, program);
        assert_eq!(kept.get(), Some(again));
        // The path now names another file: not taken for the one kept.
        reuse(again, &theirs);
        std::fs::remove_file(&mine).unwrap();
        std::fs::write(&mine, b"another").unwrap();
        assert_eq!(kept.get_or_reopen(&c, libc::O_RDONLY), None);
        close_fd(program);
        close_fd(again);
        for p in [mine, theirs] {
            std::fs::remove_file(p).unwrap();
        }
    }

    /// Whether an open-file-description lock on `fd`'s whole file is granted.
    fn lock(fd: RawFd) -> bool {
        // SAFETY: plain data; l_pid 0 as OFD locks want.
        let mut f: libc::flock = unsafe { std::mem::zeroed() };
        f.l_type = libc::F_WRLCK as _;
        // SAFETY: a descriptor of this test and a flock for the call.
        unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut f as *mut libc::flock) == 0 }
    }

    #[test]
    fn a_number_still_kept_is_closed() {
        let mine = scratch("mine3");
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&mine)
                .unwrap()
                .into_raw_fd()
        };
        let fd = open();
        assert!(lock(fd));
        let kept = Kept::new(fd);
        let other = open();
        assert!(!lock(other), "held through the kept number");
        kept.close();
        // Its open file closed, its lock went with it (the number itself may be another
        // test's by now).
        assert!(lock(other));
        assert_eq!(kept.number(), -1);
        close_fd(other);
        std::fs::remove_file(mine).unwrap();
    }
}
