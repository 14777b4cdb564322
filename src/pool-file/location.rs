//! Which file a pool is, and whether its directory is safe to keep a budget in.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpucap_core::config::{CLAIM_POOL_FILE, PoolSpec};

use crate::bases::{DEFAULT_BASES, base_dir, may_write};
use crate::identity::own_uid;
use crate::sharing::{Owned, unwritable_claim_dir};

/// The file of `spec`: a path as given, or `<name>.pool` in `gpucap-<uid>` under the
/// pool directory (`GPUCAP_POOL_DIR`, else `/dev/shm`, else `/tmp`: never a directory
/// the environment names, see [`DEFAULT_BASES`]). With `create`, the per-user directory
/// is made (mode 0700) if missing.
/// Either way its checks must pass: see `check_dir`.
pub fn locate(spec: &PoolSpec, pool_dir: Option<&Path>, create: bool) -> Result<PathBuf, String> {
    match &crate::container::resolve(spec, pool_dir, create)? {
        PoolSpec::Path(p) => {
            let parent = p.parent().unwrap_or(Path::new("/"));
            check_parent(parent).map_err(|e| claims_file(e, p))?;
            Ok(p.clone())
        }
        PoolSpec::Claim(dir) => {
            check_claim_dir(dir)?;
            Ok(dir.join(CLAIM_POOL_FILE))
        }
        PoolSpec::Name(name) => {
            let dir = per_user_dir(pool_dir)?;
            made_and_checked(&dir, create)?;
            Ok(dir.join(format!("{name}.pool")))
        }
    }
}

/// The per-user directory `dir`, made (mode 0700) first with `create`, then checked
/// ([`check_dir`]).
fn made_and_checked(dir: &Path, create: bool) -> Result<(), String> {
    // Usually there already: looked at first, without `mkdir`'s lock of the directory
    // above it (every process of a mass start would take it in turn).
    let seen = match std::fs::symlink_metadata(dir) {
        Err(e) if create && e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(format!(
                        "cannot create the pool directory {}: {e}",
                        dir.display()
                    ));
                }
            }
            std::fs::symlink_metadata(dir)
        }
        seen => seen,
    };
    check_dir(dir, seen)
}

/// The path `spec` names, without checking or creating anything (to name a file that
/// does not exist yet).
pub fn path_of(spec: &PoolSpec, pool_dir: Option<&Path>) -> Result<PathBuf, String> {
    Ok(match &crate::container::resolve(spec, pool_dir, false)? {
        PoolSpec::Path(p) => p.clone(),
        PoolSpec::Claim(dir) => dir.join(CLAIM_POOL_FILE),
        PoolSpec::Name(name) => per_user_dir(pool_dir)?.join(format!("{name}.pool")),
    })
}

/// This user's directory of pools and lone processes (`gpucap-<uid>` in the pool
/// directory), checked as [`locate`] checks it; with `create`, made (mode 0700) if
/// missing. `Ok(None)`: it does not exist (and `create` was not asked).
pub fn user_dir(pool_dir: Option<&Path>, create: bool) -> Result<Option<PathBuf>, String> {
    let dir = per_user_dir(pool_dir)?;
    if !create
        && matches!(std::fs::symlink_metadata(&dir), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    {
        return Ok(None);
    }
    made_and_checked(&dir, create)?;
    Ok(Some(dir))
}

/// Every user's directory (`gpucap-<uid>`) where pools are made by default or in
/// `pool_dir`: what root's `gpucap status` reads. The user's own first; each at most once.
/// Only a real directory (never a link to one) owned by the uid its name gives: one
/// another user made under that name (a squatter) is not read.
pub fn every_user_dir(pool_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Some(d) = pool_dir {
        bases.push(d.to_path_buf());
    } else {
        bases.extend(DEFAULT_BASES.map(PathBuf::from));
    }
    let mut dirs: Vec<PathBuf> = per_user_dir(pool_dir)
        .into_iter()
        .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == own_uid()))
        .collect();
    for b in bases {
        let Ok(entries) = std::fs::read_dir(&b) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name();
            let uid = name
                .to_str()
                .and_then(|n| n.strip_prefix("gpucap-"))
                .filter(|uid| !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|uid| uid.parse::<u32>().ok());
            let path = e.path();
            // DirEntry::metadata does not follow a link.
            let owned = e
                .metadata()
                .is_ok_and(|m| m.is_dir() && Some(m.uid()) == uid);
            if owned && !dirs.contains(&path) {
                dirs.push(path);
            }
        }
    }
    dirs
}

/// `gpucap-<uid>` in the pool directory.
fn per_user_dir(pool_dir: Option<&Path>) -> Result<PathBuf, String> {
    Ok(base_dir(pool_dir)?.join(format!("gpucap-{}", own_uid())))
}

/// [`locate`] for a reader (NVML's figures in a process that never joins): creates
/// nothing. `Ok(None)` when the pool's file (or its per-user directory) does not exist
/// yet: no member joined, the pool is empty.
pub fn locate_existing(
    spec: &PoolSpec,
    pool_dir: Option<&Path>,
) -> Result<Option<PathBuf>, String> {
    let missing = |p: &Path| matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    let dir = match &crate::container::resolve(spec, pool_dir, false)? {
        PoolSpec::Name(_) => Some(per_user_dir(pool_dir)?),
        // The container's directory, made by its first member.
        PoolSpec::Claim(d) if spec.is_container_pool() => Some(d.clone()),
        _ => None,
    };
    if dir.is_some_and(|d| missing(&d)) {
        return Ok(None);
    }
    let path = locate(spec, pool_dir, false)?;
    Ok((!missing(&path)).then_some(path))
}

/// The per-user directory: a real directory (not a symbolic link), owned by this user,
/// that nobody else may write in.
/// `seen`: what `lstat` said of it.
fn check_dir(dir: &Path, seen: std::io::Result<std::fs::Metadata>) -> Result<(), String> {
    let m = seen.map_err(|e| format!("the pool directory {}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!(
            "the pool directory {} is not a directory (a symbolic link or a file is refused)",
            dir.display()
        ));
    }
    if m.uid() != own_uid() {
        return Err(format!(
            "the pool directory {} belongs to uid {}, not to this process's uid {}: \
             another user could change or reset the budget",
            dir.display(),
            m.uid(),
            own_uid()
        ));
    }
    if m.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "the pool directory {} is writable by group or others (mode {:o}): another user \
             could replace the pool file; chmod 700 it",
            dir.display(),
            m.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

/// The directory of a pool file given as a path: others may not write in it unless it
/// is sticky (then they cannot remove or rename this user's file).
fn check_parent(dir: &Path) -> Result<(), String> {
    let m = std::fs::metadata(dir)
        .map_err(|e| format!("the directory of the pool file, {}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let mode = m.permissions().mode();
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(format!(
            "the directory of the pool file, {}, is writable by other users and not sticky \
             (mode {:o}): another user could replace the pool file; give GPUCAP_POOL a \
             name and GPUCAP_POOL_DIR that directory (a directory of your own is made in it)",
            dir.display(),
            mode & 0o7777
        ));
    }
    Ok(())
}

/// `e`, for the pool file `path` named as a path: where that is a claim's file
/// (`gpucap.pool`, in a directory every container of the claim may write), with how a
/// claim's pool is named (its directory, `GPUCAP_CLAIM_DIR`), which such a directory
/// passes.
fn claims_file(e: String, path: &Path) -> String {
    match (path.file_name(), path.parent()) {
        (Some(n), Some(dir)) if n == CLAIM_POOL_FILE => format!(
            "{e}; a claim's pool ({CLAIM_POOL_FILE} in the directory its containers share) is \
             named by that directory: GPUCAP_CLAIM_DIR={}",
            dir.display()
        ),
        _ => e,
    }
}

/// A claim's directory: the driver mounts it read-write in every container of the claim
/// and nowhere else, and its mode or group says who shares the claim's budget (see
/// [`crate::sharing`]): it must be a real directory this process may write in, else the
/// process could not share the claim's budget (refused with how to share it).
fn check_claim_dir(dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {
            if may_write(dir) {
                Ok(())
            } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::EROFS) {
                // Its mode and group are not the cause: the advice to change them is not
                // the fix.
                Err(format!(
                    "the claim's directory {} is on a read-only mount, so this process cannot \
                     share the claim's budget: mount the claim's volume read-write in every \
                     container of the claim",
                    dir.display()
                ))
            } else {
                Err(unwritable_claim_dir(dir, Owned::of(&m), own_uid()))
            }
        }
        Ok(_) => Err(format!(
            "the claim's directory {} is not a directory (a symbolic link or a file is \
             refused)",
            dir.display()
        )),
        Err(e) => Err(format!(
            "the claim's directory {}: {e} (the driver mounts it in every container of the \
             claim)",
            dir.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_file_named_as_a_path_says_how_a_claim_is_named() {
        let dir = std::env::temp_dir().join(format!("gpucap-location-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let claims = PoolSpec::Path(dir.join(CLAIM_POOL_FILE));
        let e = locate(&claims, None, false).unwrap_err();
        assert!(
            e.contains("writable by other users")
                && e.ends_with(&format!("GPUCAP_CLAIM_DIR={}", dir.display())),
            "{e}"
        );
        // Another file there: the error as it was, with no word of claims.
        let other = PoolSpec::Path(dir.join("train.pool"));
        let e = locate(&other, None, false).unwrap_err();
        assert!(
            e.contains("writable by other users") && !e.contains("claim"),
            "{e}"
        );
        // The directory named as a claim's passes.
        assert_eq!(
            locate(&PoolSpec::Claim(dir.clone()), None, false),
            Ok(dir.join(CLAIM_POOL_FILE))
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
