//! The container's pool ([`CONTAINER_POOL`]: what a driver's grant without a claim
//! directory, and the CDI device `capped`, put a container's processes in): one pool
//! for every process of the container, whatever its user. A named pool is its user's
//! alone (`gpucap-UID`, mode 0700), so a container whose processes ran as two users
//! had two pools, each the whole grant: a process that changed its user (`su`,
//! `setpriv`, an image's `USER` beside a root entrypoint) escaped what the others held.
//! The container's pool is instead a claim's pool ([`PoolSpec::Claim`], shared by
//! whoever may write its directory) in `gpucap-container-NS` under the pool directory
//! (`NS`: the container's mount namespace, see [`PoolSpec::per_container`]), a
//! directory the first process makes mode 0777, so its file is made mode 0666
//! (`sharing::new_claim_file`). Not sticky (1777): there a user could not replace the
//! claim's socket (`<file>.sock`) that another user's departed members left, and would
//! be refused at `cuInit` until that user came back.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use gpucap_core::config::{CONTAINER_POOL, PoolSpec};

use crate::bases::{DEFAULT_BASES, base_dir, may_write};
use crate::identity::own_uid;

/// The pool `spec` names for this process: the container's pool as its shared
/// directory (made, with `create`, if missing), another `-mntns` name with this mount
/// namespace's number ([`PoolSpec::per_container`]), any other as it is.
pub fn resolve(spec: &PoolSpec, pool_dir: Option<&Path>, create: bool) -> Result<PoolSpec, String> {
    match spec {
        spec if spec.is_container_pool() => {
            let dir = dir_of(pool_dir)?;
            if create {
                make(&dir)?;
            }
            Ok(PoolSpec::Claim(dir))
        }
        other => Ok(other.per_container()),
    }
}

/// `gpucap-container-NS` in the pool directory. Every process of the container must
/// find the same one, whatever its user: so the mount namespace must be read (a process
/// that could not read it would name `gpucap-container` and hold the grant beside its
/// siblings), and without `GPUCAP_POOL_DIR` the directory is `/dev/shm` wherever it
/// exists, whether or not this user may write it (a user who may not write a root-only
/// `/dev/shm` took `/tmp`, another pool: 600 MiB each under a 1 GiB grant, found by
/// review), `/tmp` only where there is no `/dev/shm`.
fn dir_of(pool_dir: Option<&Path>) -> Result<PathBuf, String> {
    let ns = std::fs::read_link("/proc/self/ns/mnt").map_err(|e| {
        format!(
            "the container's pool is one per mount namespace, and this process cannot tell \
             its own (/proc/self/ns/mnt: {e}): it would not share the container's grant with \
             the container's other processes; mount /proc, or name a pool (GPUCAP_POOL)"
        )
    })?;
    let name =
        PoolSpec::Name(CONTAINER_POOL.into()).in_mount_namespace(Some(&ns.to_string_lossy()));
    let PoolSpec::Name(name) = name else {
        unreachable!("a name stays a name");
    };
    Ok(base_of(pool_dir)?.join(format!("gpucap-{name}")))
}

/// The directory the containers' pool directories are made in: `GPUCAP_POOL_DIR`, else
/// `/dev/shm` wherever it exists ([`dir_of`]).
fn base_of(pool_dir: Option<&Path>) -> Result<PathBuf, String> {
    match pool_dir {
        Some(_) => base_dir(pool_dir),
        None => DEFAULT_BASES
            .map(PathBuf::from)
            .into_iter()
            .find(|b| std::fs::metadata(b).is_ok_and(|m| m.is_dir()))
            .ok_or_else(|| {
                "no directory for the container's pool: neither /dev/shm nor /tmp is there; \
                 set GPUCAP_POOL_DIR"
                    .into()
            }),
    }
}

/// The containers' pools kept where this process would keep its container's
/// (`GPUCAP_POOL_DIR`, else `/dev/shm`): `gpucap.pool` of each real `gpucap-container-…`
/// directory there (a link is not followed), a regular file, with its owner, or one removed
/// while its members run (the directory says they live); sorted.
/// Every container of a pod shares the pod's `/dev/shm`: a reader (a metrics sidecar,
/// `gpucap status` in one container) sees the others' pools too.
pub fn container_pools(pool_dir: Option<&Path>) -> Vec<(PathBuf, u32)> {
    let Some(entries) = base_of(pool_dir)
        .ok()
        .and_then(|b| std::fs::read_dir(b).ok())
    else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, u32)> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("gpucap-container-"))
        })
        // DirEntry::metadata does not follow a link.
        .filter(|e| e.metadata().is_ok_and(|m| m.is_dir()))
        .map(|e| e.path().join(gpucap_core::config::CLAIM_POOL_FILE))
        .filter_map(|f| match std::fs::symlink_metadata(&f) {
            Ok(m) => m.is_file().then(|| (f, m.uid())),
            // Removed while its members run (their directory says they live): read
            // through them; its directory's owner for the file's.
            Err(_) if crate::live::members_live(&f) => {
                let owner = std::fs::symlink_metadata(f.parent()?).ok()?.uid();
                Some((f, owner))
            }
            Err(_) => None,
        })
        .collect();
    found.sort();
    found
}

/// Makes the container's directory (mode 0777) if missing, and checks that this
/// process may make files in it: else it could not share the container's grant.
fn make(dir: &Path) -> Result<(), String> {
    if matches!(std::fs::symlink_metadata(dir), Err(e) if e.kind() == ErrorKind::NotFound) {
        made_whole(dir)?;
    }
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("the container's pool directory {}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!(
            "the container's pool directory {} is not a directory (a symbolic link or a file \
             is refused)",
            dir.display()
        ));
    }
    if !may_write(dir) {
        return Err(format!(
            "the container's pool directory {} (mode {:o}, uid {}) may not be written by this \
             process (uid {}), so it cannot share the container's grant with the container's \
             other processes: the first process makes it mode 0777 for every user of the \
             container; chmod 0777 it, or remove it while no process of the container runs",
            dir.display(),
            m.mode() & 0o7777,
            m.uid(),
            own_uid()
        ));
    }
    Ok(())
}

/// Makes `dir` mode 0777 at once: under a name of its own, given its mode, then renamed
/// into place (never over one another process made meanwhile, which is kept). Made in
/// place, it would be the umask's 0755 or 0700 for a moment, and another user's process
/// of the container checking it then would be refused.
fn made_whole(dir: &Path) -> Result<(), String> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.with_file_name(format!(".{name}.{}.{nanos:x}.new", std::process::id()));
    let cannot = |e: std::io::Error| {
        format!(
            "cannot create the container's pool directory {}: {e}",
            dir.display()
        )
    };
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .map_err(cannot)?;
    let t = crate::sys::cstr(&tmp)?;
    // By system calls: std's chmod and rmdir would be two more symbols for the loader to
    // look up in every process the shim is loaded into (some 800 instructions each).
    // SAFETY: a NUL-terminated path; fchmodat only reads it.
    let moded = unsafe {
        libc::syscall(
            libc::SYS_fchmodat,
            libc::AT_FDCWD,
            t.as_ptr(),
            0o777 as libc::c_uint,
        )
    } == 0;
    let placed = match moded {
        true => rename_no_replace(&tmp, dir),
        false => Err(std::io::Error::last_os_error()),
    };
    // Gone where it was renamed.
    // SAFETY: a NUL-terminated path; unlinkat only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_unlinkat,
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::AT_REMOVEDIR,
        )
    };
    match placed {
        Ok(()) => Ok(()),
        // Another process made it first: theirs is the container's.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => Ok(()),
        Err(e) => Err(cannot(e)),
    }
}

/// `rename(from, to)` that never replaces what is at `to` (`RENAME_NOREPLACE`); where the
/// file system has no such rename, a plain one (a directory replaces only an empty one).
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    let (f, t) = (crate::sys::cstr(from), crate::sys::cstr(to));
    let (Ok(f), Ok(t)) = (f, t) else {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: two NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    match rc {
        0 => Ok(()),
        _ => match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EINVAL) => std::fs::rename(from, to),
            e => Err(e),
        },
    }
}
