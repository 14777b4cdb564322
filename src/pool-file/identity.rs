//! Who this process is, as the files record it: its effective uid, its PID namespace
//! and its command line.

use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// The effective uid of this process.
pub fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The start of this process's command line as `/proc/self/cmdline` holds it (its
/// arguments, each ending in a NUL; empty if unknown), at most 4 KiB, enough for the 63
/// bytes a member or a lone process shows of it (`gpucap_core::budget::member_command`).
/// From the arguments the C library handed the library's start (no system call: a first
/// read of /proc in a freshly forked process takes 9 to 11 us of its start); where there
/// are none (a hook run before the library's constructors), one read of
/// `/proc/self/cmdline`.
pub fn own_cmdline() -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut head: Vec<u8> = Vec::new();
    for arg in std::env::args_os() {
        if head.len() >= 4096 {
            break;
        }
        head.extend_from_slice(arg.as_bytes());
        head.push(0);
    }
    if head.is_empty() {
        return proc_cmdline();
    }
    head.truncate(4096);
    head
}

/// One read of up to 4 KiB of `/proc/self/cmdline` (three system calls, no `stat`).
fn proc_cmdline() -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open("/proc/self/cmdline") else {
        return Vec::new();
    };
    let mut head: Vec<u8> = Vec::with_capacity(4096);
    // SAFETY: reads at most the vector's capacity into its spare memory (not zeroed
    // first: 4 KiB of zeroes cost more than the rest of the read).
    let n = unsafe { libc::read(f.as_raw_fd(), head.as_mut_ptr().cast(), head.capacity()) };
    if let Ok(n) = usize::try_from(n) {
        // SAFETY: the read initialised the first `n` bytes (at most the capacity).
        unsafe { head.set_len(n.min(head.capacity())) };
    }
    head
}

/// The pid the cached namespace was read by (0: none yet) and the namespace's inode.
static NAMESPACE_OF: AtomicU32 = AtomicU32::new(0);
static NAMESPACE: AtomicU64 = AtomicU64::new(0);

/// The inode of this process's PID namespace (`/proc/self/ns/pid`; 0: unknown). A
/// process never changes its own PID namespace, so it is read once per pid: a look at
/// a /proc namespace file is one of the dearer calls of a start, and a start asks
/// several times (the lone file's name and header, NVML's pid, a member's record). A
/// forked child has another pid and reads its own (it may be in a namespace its parent
/// made with `unshare`).
pub fn own_pid_namespace() -> u64 {
    let pid = std::process::id();
    if NAMESPACE_OF.load(Acquire) == pid {
        return NAMESPACE.load(Relaxed);
    }
    let ns = read_namespace();
    if ns != 0 {
        // Two threads may both read it: they store the same figure.
        NAMESPACE.store(ns, Relaxed);
        NAMESPACE_OF.store(pid, Release);
    }
    ns
}

/// The inode of this process's PID namespace, as `readlink` of `/proc/self/ns/pid` names
/// it (`pid:[4026531836]`: the number is the namespace file's inode); 0 if unreadable.
/// A `stat` there would make the kernel open the namespace's file, a `readlink` only
/// prints its number (0.85 µs against 2.0 µs a call on the 2-core VM, warm).
fn read_namespace() -> u64 {
    let mut name = [0u8; 64];
    // SAFETY: a NUL-terminated path and a buffer of name.len() bytes.
    let n = unsafe {
        libc::readlink(
            c"/proc/self/ns/pid".as_ptr(),
            name.as_mut_ptr().cast(),
            name.len(),
        )
    };
    usize::try_from(n)
        .ok()
        .and_then(|n| name.get(..n))
        .and_then(|link| link.strip_prefix(b"pid:["))
        .and_then(|rest| rest.strip_suffix(b"]"))
        .and_then(|digits| std::str::from_utf8(digits).ok())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_command_line_is_the_one_proc_shows() {
        let mut whole = std::fs::read("/proc/self/cmdline").unwrap();
        whole.truncate(4096);
        assert!(!whole.is_empty());
        assert_eq!(own_cmdline(), whole);
        assert_eq!(proc_cmdline(), whole, "the fallback reads the same");
    }

    #[test]
    fn the_namespace_is_the_one_proc_shows_and_stays() {
        let proc = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
        assert_ne!(proc, 0, "/proc/self/ns/pid unreadable here");
        assert_eq!(own_pid_namespace(), proc);
        assert_eq!(own_pid_namespace(), proc, "the cached figure differs");
    }
}
