//! Where pools are kept: the directory the per-user directories (and the container's
//! pool's) are made in, and whether this process may make files in a directory.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where the per-user directories are made when `GPUCAP_POOL_DIR` is not set, the first
/// that is a writable directory. Never `$XDG_RUNTIME_DIR`: a login session sets it, a
/// cron job, `sudo`, `su` or a service does not, and two processes of one user naming
/// one pool made two files, two budgets (before: 700 MiB served to each under a 1 GiB
/// pool's cap).
pub(crate) const DEFAULT_BASES: [&str; 2] = ["/dev/shm", "/tmp"];

/// The directory the per-user directories are made in.
pub(crate) fn base_dir(pool_dir: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(d) = pool_dir {
        return match std::fs::metadata(d) {
            Ok(m) if m.is_dir() => Ok(d.to_path_buf()),
            Ok(_) => Err(format!(
                "GPUCAP_POOL_DIR={} is not a directory",
                d.display()
            )),
            Err(e) => Err(format!("GPUCAP_POOL_DIR={}: {e}", d.display())),
        };
    }
    for c in DEFAULT_BASES.map(PathBuf::from) {
        if std::fs::metadata(&c).is_ok_and(|m| m.is_dir()) && writable(&c) {
            return Ok(c);
        }
    }
    Err(
        "no directory for the pool file: neither /dev/shm nor /tmp is a writable \
         directory; set GPUCAP_POOL_DIR"
            .into(),
    )
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; access only reads it.
    unsafe { crate::sys::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// Whether this process (its effective ids and groups) may make files in `dir`.
pub(crate) fn may_write(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path; faccessat only reads it.
    unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        ) == 0
    }
}

/// The file system `dir` is on where it keeps its files on a disk or over a network (its
/// name, or its type's number): None for a file system in memory (tmpfs, ramfs) or one
/// that cannot be read. A process capped alone makes and removes its file in the pool
/// directory at each start: on a disk that costs its journal's work every time
/// (docs/src/performance.md).
pub fn disk_file_system(dir: &Path) -> Option<String> {
    const TMPFS: i64 = 0x0102_1994;
    const RAMFS: i64 = 0x8584_58f6;
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: plain data filled by statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statfs to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let kind = st.f_type as i64;
    let name = match kind {
        TMPFS | RAMFS => return None,
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlayfs",
        0x6969 => "nfs",
        0x0102_1997 => "9p",
        0x6573_5546 => "fuse",
        _ => return Some(format!("a file system of type {kind:#x}")),
    };
    Some(name.to_string())
}
