//! Whether a claim's members live, told by its directory: every process holding the
//! claim's memfd read-locks a byte of the claim's directory for life (an open file of the
//! directory of its own, close-on-exec, let go by a forked child), next to the pool
//! file's own locks. The file's locks go with the file: once it is removed, or replaced by
//! a copy, and the socket is gone too (a cleanup, `rm` of both, a co-tenant's `mv`), a
//! joiner found nothing that said members live, and made a file and words of its own: a
//! budget beside theirs (700 MiB served beside a member's 700 under a 1 GiB claim, from
//! another network namespace or through a copy, found by review). The directory's lock
//! stays while they live, through the file's removal or replacement: a joiner that sees it
//! waits for the members to bind their socket again and asks them, and is refused with a
//! line where none answers, never given a budget of its own. A directory removed and made
//! again (`rm -rf`, `mkdir`) is another directory: its lock says nothing of theirs.
//!
//! Only system calls (`open`, `fcntl`, `close`); the lock is one byte at the directory's
//! start (a directory has no bytes: any byte can be locked, the kernel keeps the lock on
//! its inode).

use std::os::fd::RawFd;
use std::path::Path;

use crate::locks::{flock_range, lock_call};
use crate::sys::cstr;

/// The byte of the directory the members read-lock.
const PRESENCE_BYTE: i64 = 0;
/// The byte of the directory the processes members forked read-lock (a member's child
/// that never execs keeps its GPU memory with the driver: see [`hold_children`]).
const CHILDREN_BYTE: i64 = 1;

/// The claim's directory of its pool file at `path`, opened to be locked (-1: it cannot
/// be opened).
fn open_dir(path: &Path) -> RawFd {
    let Ok(dir) = cstr(path.parent().unwrap_or(Path::new("/"))) else {
        return -1;
    };
    // SAFETY: a NUL-terminated path; opening a directory to read it changes nothing.
    unsafe {
        crate::sys::open(
            dir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK,
            0,
        )
    }
}

/// Read-locks the claim's directory of `path` for a holder of its memfd: the open file
/// that holds the lock (kept open for life), or -1 where it cannot be taken (a file
/// system without such locks: joiners then know members by the file's locks alone, as
/// before).
pub(super) fn hold(path: &Path) -> RawFd {
    let fd = open_dir(path);
    if fd < 0 {
        return -1;
    }
    let mut f = flock_range(libc::F_RDLCK, PRESENCE_BYTE, 1);
    if lock_call(fd, libc::F_OFD_SETLK, &mut f).is_err() {
        super::handover::close(fd);
        return -1;
    }
    fd
}

/// In a forked child of a holder of the claim's words, whose open file of the directory
/// is `dir` (the parent's lock, let go in the child): read-locks the directory's children
/// byte through an open file of its own (`/proc/self/fd/N`, close-on-exec, kept open and
/// never used again), as the slot's children byte of the pool file is (`SlotLocks::
/// hold_in_child`). That one goes with the file where the file is removed or replaced
/// under the members; the directory's stays: where the member is killed, a joiner of the
/// new file knows processes it forked may still hold its GPU memory (`decide`). Only
/// system calls (`open`, `fcntl`): safe in a fork handler.
pub(super) fn hold_children(dir: RawFd) {
    let path = crate::locks::proc_fd_path(dir);
    // SAFETY: a NUL-terminated path in a local buffer; open is async-signal-safe.
    let copy = unsafe {
        crate::sys::open(
            path.as_ptr().cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NONBLOCK,
            0,
        )
    };
    if copy < 0 {
        return;
    }
    let mut f = flock_range(libc::F_RDLCK, CHILDREN_BYTE, 1);
    if lock_call(copy, libc::F_OFD_SETLK, &mut f).is_err() {
        super::handover::close(copy);
    }
}

/// Whether processes forked by a holder of the claim's words (that never exec'd) hold
/// the claim's directory of `path` ([`hold_children`]).
pub(super) fn children_live(path: &Path) -> bool {
    byte_held(path, CHILDREN_BYTE)
}

/// Whether another open file read-locks the claim's directory of `path`: processes hold
/// the claim's memfd (or did: one stopped, or one whose exit is under way). False where
/// the directory cannot be opened or its locks read.
pub(crate) fn members_live(path: &Path) -> bool {
    byte_held(path, PRESENCE_BYTE)
}

/// Whether another open file holds `byte` of the claim's directory of `path`.
fn byte_held(path: &Path, byte: i64) -> bool {
    let fd = open_dir(path);
    if fd < 0 {
        return false;
    }
    let mut f = flock_range(libc::F_WRLCK, byte, 1);
    let held =
        lock_call(fd, libc::F_OFD_GETLK, &mut f).is_ok() && i32::from(f.l_type) != libc::F_UNLCK;
    super::handover::close(fd);
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_of_the_directory_says_members_live_until_it_lets_go() {
        let dir = std::env::temp_dir().join(format!("gpucap-presence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("gpucap.pool");
        assert!(!members_live(&file), "nobody holds it yet");
        let held = hold(&file);
        assert!(held >= 0);
        assert!(members_live(&file), "a holder's lock is seen");
        super::super::handover::close(held);
        assert!(!members_live(&file), "let go with its open file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
