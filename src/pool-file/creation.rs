//! Making a pool file: whole (every byte allocated: a full file system is an error here,
//! never a fault later), its owner, group and mode what its sharing asks, its header
//! written, under a temporary name linked into place, so no process ever sees a
//! half-written one. Opening and mapping it is `mapping.rs`.

use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::AtomicU64;

use gpucap_core::budget::{Pool, pool_file_bytes};

use crate::identity::own_uid;
use crate::sharing::{Owned, Sharing, new_claim_file};
use crate::sys::{cstr, os_err};

/// Makes a whole pool file of `slots` members under a temporary name and links it to
/// `path` (true), or finds that another process did (true as well: the caller opens it).
pub(crate) fn create(path: &Path, sharing: Sharing, slots: usize) -> Result<bool, String> {
    let bytes = pool_file_bytes(slots);
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A name no other creator uses: two first joiners can have the same pid (in two PID
    // namespaces), so the pid alone is not enough. One that exists already is another
    // creator's: never removed, another name is drawn (three tries).
    let mut made = None;
    for _ in 0..3 {
        let tmp = dir.join(format!(
            ".{name}.{}.{}.new",
            std::process::id(),
            crate::hex::hex16(unique())
        ));
        let ct = cstr(&tmp)?;
        // SAFETY: a NUL-terminated path; O_EXCL never follows or reuses an existing entry.
        let fd = unsafe {
            crate::sys::open(
                ct.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd >= 0 {
            made = Some((tmp, ct, fd));
            break;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
            return Err(os_err("cannot create the pool file", &tmp));
        }
    }
    let Some((tmp, ct, fd)) = made else {
        return Err(format!(
            "cannot create the pool file {}: three temporary names were taken",
            path.display()
        ));
    };
    let result = (|| {
        crate::locks::supports_locks(fd).map_err(|e| {
            format!(
                "the pool file {}: {}",
                path.display(),
                crate::locks::unsupported(&e)
            )
        })?;
        share(fd, &tmp, sharing)?;
        allocate(fd, bytes, &tmp)?;
        let words = map(fd, bytes, true).ok_or_else(|| os_err("cannot map the pool file", &tmp))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Pool::create_with(words, slots, now, u64::from(own_uid())).map_err(|e| e.to_string())?;
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(words.as_ptr() as *mut libc::c_void, bytes) };
        let cp = cstr(path)?;
        // SAFETY: two NUL-terminated paths; link never replaces an existing file.
        if unsafe { libc::link(ct.as_ptr(), cp.as_ptr()) } != 0
            && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(os_err("cannot link the new pool file to", path));
        }
        Ok(true)
    })();
    // SAFETY: our descriptor and our temporary name, both done with.
    unsafe {
        libc::close(fd);
        libc::unlink(ct.as_ptr());
    }
    result
}

/// Whether a pool file of `slots` members can be made at `path` (not made yet): an
/// unnamed file (`O_TMPFILE`) of its whole size allocated in its directory, or in the
/// nearest directory above that exists (the first member makes the rest), and dropped.
/// What `gpucap check` asks, so that a full file system (Docker's 64 MiB `/dev/shm`
/// filled by a program's workers) is said before a program is refused at `cuInit`.
pub fn can_make(path: &Path, slots: usize) -> Result<(), String> {
    let bytes = pool_file_bytes(slots);
    let dir = path
        .ancestors()
        .skip(1)
        .find(|d| d.is_dir())
        .unwrap_or(Path::new("/"));
    let cd = cstr(dir)?;
    // SAFETY: a NUL-terminated directory path; O_TMPFILE makes a file with no name.
    let fd = unsafe {
        crate::sys::open(
            cd.as_ptr(),
            libc::O_RDWR | libc::O_TMPFILE | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        // A file system without unnamed files (an old NFS) says nothing of its room.
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::EISDIR) => Ok(()),
            _ => Err(os_err("cannot make a file in", dir)),
        };
    }
    // SAFETY: our descriptor; posix_fallocate returns the error instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(fd, 0, bytes as libc::off_t) };
    // SAFETY: our descriptor, done with; its file goes with it.
    unsafe { libc::close(fd) };
    match rc {
        0 => Ok(()),
        rc => Err(format!(
            "the pool file {} cannot be made: {} has no room for its {} ({}): a process \
             naming the pool would be refused at cuInit; free room there, or set \
             GPUCAP_POOL_DIR to a directory with room",
            path.display(),
            dir.display(),
            gpucap_core::size::format_bytes(bytes as u64),
            std::io::Error::from_raw_os_error(rc)
        )),
    }
}

/// Gives the new file `fd` (at `tmp`) its `bytes`, every block allocated now
/// (`posix_fallocate`): a full file system is an error here, at creation, never a fault
/// at the first write through the mapping of a sparse file (SIGBUS on a full tmpfs).
fn allocate(fd: RawFd, bytes: usize, tmp: &Path) -> Result<(), String> {
    // SAFETY: our descriptor; posix_fallocate returns the error instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(fd, 0, bytes as libc::off_t) };
    if rc != 0 {
        return Err(format!(
            "cannot allocate the {bytes} bytes of {}: {} (its file system is full or \
             refuses them)",
            tmp.display(),
            std::io::Error::from_raw_os_error(rc)
        ));
    }
    Ok(())
}

/// Gives the new file `fd` (at `tmp`) the mode of its sharing, and for a claim the
/// group or owner its directory asks ([`new_claim_file`]). fchmod undoes the umask.
fn share(fd: RawFd, tmp: &Path, sharing: Sharing) -> Result<(), String> {
    let new = match sharing {
        Sharing::Private => None,
        Sharing::Claim => Some(new_claim_file(dir_of(tmp)?)),
    };
    let mode = new.map_or(0o600, |n| n.mode);
    let (uid, gid) = new.map_or((None, None), |n| (n.uid.filter(|_| own_uid() == 0), n.gid));
    if uid.is_some() || gid.is_some() {
        let [u, g] = [uid, gid].map(|i| i.unwrap_or(u32::MAX)); // -1: unchanged
        // SAFETY: our descriptor.
        if unsafe { libc::fchown(fd, u, g) } != 0 {
            return Err(format!(
                "cannot give the pool file {} the claim directory's {} ({}); make the \
                 directory setgid (chmod g+s) so that new files take its group",
                tmp.display(),
                if gid.is_some() { "group" } else { "owner" },
                std::io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: our descriptor.
    unsafe { libc::fchmod(fd, mode as libc::mode_t) };
    Ok(())
}

/// 64 bits no other creator draws: the kernel's random bytes, else the clock's
/// nanoseconds mixed with this process's stack address.
fn unique() -> u64 {
    let mut r = [0u8; 8];
    // SAFETY: an 8-byte buffer; GRND_NONBLOCK never waits for the entropy pool.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), 8, libc::GRND_NONBLOCK) };
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let here = &r as *const _ as u64;
    if n == 8 {
        u64::from_le_bytes(r) ^ clock
    } else {
        clock ^ here.rotate_left(32)
    }
}

/// The owner, group and mode of `path`'s directory.
pub(crate) fn dir_of(path: &Path) -> Result<Owned, String> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::symlink_metadata(dir)
        .map(|m| Owned::of(&m))
        .map_err(|e| format!("the claim's directory {}: {e}", dir.display()))
}

/// Maps the whole file, `bytes` long (a multiple of 8), as words (None: mmap failed).
pub(crate) fn map(fd: RawFd, bytes: usize, write: bool) -> Option<&'static [AtomicU64]> {
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh shared mapping of a file at least `bytes` long.
    let p = unsafe { crate::sys::mmap(std::ptr::null_mut(), bytes, prot, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return None;
    }
    if write {
        // A forked child must not inherit a member's mapping: it would keep the open
        // file, and with it the member's locks, alive after the member died.
        // SAFETY: advice on the mapping just made.
        unsafe { libc::madvise(p, bytes, libc::MADV_DONTFORK) };
    }
    // SAFETY: page-aligned, `bytes` long, never unmapped; every access to it is atomic
    // (other processes write it too).
    Some(unsafe { std::slice::from_raw_parts(p as *const AtomicU64, bytes / 8) })
}
