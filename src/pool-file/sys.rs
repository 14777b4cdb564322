//! The C library's file calls this crate makes, under the names Rust's std imports too:
//! glibc's 64-bit `open64`, `mmap64`, `fstat64`, `lstat64` (the same calls as `open`,
//! `mmap`, `fstat`, `lstat` on 64-bit Linux), and `access` as `faccessat`. Each other name
//! would be one more import of libgpucap.so, which the dynamic loader looks up in every
//! process the shim is preloaded into, CUDA or not, at its start. Beside them, a path as
//! the C string they take, the message of one that failed, a Unix socket and one bound to
//! an abstract name (raw system calls, as every socket call of this crate's), and every
//! descriptor this crate makes moved above the standard three.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub use libc::{fstat64 as fstat, lstat64 as lstat, mmap64 as mmap, stat64 as stat};

/// `open(path, flags, mode)`, its descriptor [above the standard three](above_stdio).
///
/// # Safety
/// `path` is a NUL-terminated string.
pub unsafe fn open(path: *const libc::c_char, flags: libc::c_int, mode: libc::c_uint) -> RawFd {
    // SAFETY: the caller's NUL-terminated path; `mode` is read only with O_CREAT.
    above_stdio(unsafe { libc::open64(path, flags, mode) })
}

/// `memfd_create(name, flags)`, its descriptor [above the standard three](above_stdio).
pub fn memfd(name: &std::ffi::CStr, flags: libc::c_uint) -> RawFd {
    // SAFETY: a NUL-terminated name.
    above_stdio(unsafe { libc::memfd_create(name.as_ptr(), flags) })
}

/// A close-on-exec Unix socket of `kind` (`SOCK_STREAM`, `SOCK_DGRAM`), by a raw system
/// call (the C library's `socket` would be one more import the loader looks up at every
/// process's start), its descriptor [above the standard three](above_stdio); negative
/// where it failed (`errno` says why).
pub fn unix_socket(kind: libc::c_int) -> RawFd {
    // SAFETY: no pointers.
    above_stdio(unsafe {
        libc::syscall(
            libc::SYS_socket,
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC,
            0,
        )
    } as RawFd)
}

/// A descriptor this crate just made (a file, a memfd, a socket, one received), moved to a
/// number above 2 where it got 0, 1 or 2: a program that closed its standard input, output
/// or error before its first CUDA call would otherwise find gpucap's file there, its own
/// lines and gpucap's written into the file, and its later `dup2` onto the number would
/// close gpucap's descriptor (and with it the locks that show a member alive). The copy
/// is close-on-exec, as every descriptor of this crate's; where no copy can be made the
/// descriptor stays as it was. A negative `fd` (a failed call) is returned as it is.
pub fn above_stdio(fd: RawFd) -> RawFd {
    if !(0..=2).contains(&fd) {
        return fd;
    }
    // SAFETY: our descriptor; the copy takes the lowest free number from 3.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return fd;
    }
    // SAFETY: the original, replaced by its copy.
    unsafe { libc::close(fd) };
    copy
}

/// `access(path, mode)`: the real ids' permission to `path`.
///
/// # Safety
/// `path` is a NUL-terminated string.
pub unsafe fn access(path: *const libc::c_char, mode: libc::c_int) -> libc::c_int {
    // SAFETY: the caller's NUL-terminated path; faccessat without flags is access.
    unsafe { libc::faccessat(libc::AT_FDCWD, path, mode, 0) }
}

/// `p` as the NUL-terminated string the C calls take (an error for a path with a NUL).
pub fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("the path {} has a NUL byte", p.display()))
}

/// The little-endian word `index` (in words from the start) of the file open as `fd`,
/// read with `pread` (a file that may be truncated is never mapped for it); None where it
/// cannot be read whole.
pub fn read_word(fd: RawFd, index: usize) -> Option<u64> {
    let mut word = [0u8; 8];
    // SAFETY: a descriptor and a buffer of 8 bytes.
    let n = unsafe { libc::pread(fd, word.as_mut_ptr().cast(), 8, (index * 8) as libc::off_t) };
    (n == 8).then(|| u64::from_le_bytes(word))
}

/// Writes `word` (little-endian) as word `index` of the file open as `fd`, with
/// `pwrite`: whether it was written whole.
pub fn write_word(fd: RawFd, index: usize, word: u64) -> bool {
    let bytes = word.to_le_bytes();
    // SAFETY: a descriptor and 8 bytes of a local word.
    unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), 8, (index * 8) as libc::off_t) == 8 }
}

/// "`what` `p`: " and the error of the C call that just failed (`errno`).
pub fn os_err(what: &str, p: &Path) -> String {
    format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    )
}

/// Binds the Unix socket `s` to the abstract name `name` (a NUL byte, then `name`, no NUL
/// after): false where it is too long or bind refused it (`errno` says why).
pub fn bind_abstract(s: RawFd, name: &[u8]) -> bool {
    // SAFETY: plain data, zeroed is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if name.len() + 1 > addr.sun_path.len() {
        return false;
    }
    for (d, b) in addr.sun_path[1..].iter_mut().zip(name) {
        *d = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    // SAFETY: a socket and an address of `len` bytes.
    unsafe {
        libc::syscall(
            libc::SYS_bind,
            s,
            &addr as *const libc::sockaddr_un,
            len as libc::socklen_t,
        ) == 0
    }
}

/// Sleeps `d` by a raw system call: glibc's `nanosleep` is a cancellation point, whose
/// unwind (`pthread_cancel` of the program's thread waiting here, in the shim) could not
/// cross the shim's Rust frames; a raw system call is none.
pub fn nap(d: std::time::Duration) {
    let ts = timespec(d);
    // SAFETY: a relative sleep on the monotonic clock; `ts` lives across the call, and
    // the remaining time is not asked for.
    unsafe {
        libc::syscall(
            libc::SYS_clock_nanosleep,
            libc::CLOCK_MONOTONIC,
            0,
            &ts as *const libc::timespec,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
}

/// `d` as the kernel's `timespec`.
pub fn timespec(d: std::time::Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}
