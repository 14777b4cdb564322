//! The container's pool ([`CONTAINER_POOL`]: what a driver's grant without a claim
//! directory, and the CDI device `capped`, put a container's processes in): one pool
//! for every process of the container, whatever its user. A named pool is its user's
//! alone (`gpucap-UID`, mode 0700), so a container whose processes ran as two users
//! had two pools, each the whole grant: a process that changed its user (`su`,
//! `setpriv`, an image's `USER` beside a root entrypoint) escaped what the others held.
//! The container's pool is instead a claim's pool ([`PoolSpec::Claim`], shared by
//! whoever may write its directory) in `gpucap-container-NS` under the pool directory
//! (`NS`: the container's mount namespace, see [`PoolSpec::per_container`]), a
//! directory the first process makes mode 1777 (every user may make files in it, none
//! may remove another's), so its file is made mode 0666 (`sharing::new_claim_file`).

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use gpucap_core::config::{CONTAINER_POOL, PoolSpec};

use crate::identity::own_uid;
use crate::location::{base_dir, may_write};

/// The pool `spec` names for this process: the container's pool as its shared
/// directory (made, with `create`, if missing), another `-mntns` name with this mount
/// namespace's number ([`PoolSpec::per_container`]), any other as it is.
pub fn resolve(spec: &PoolSpec, pool_dir: Option<&Path>, create: bool) -> Result<PoolSpec, String> {
    match spec {
        PoolSpec::Name(n) if n == CONTAINER_POOL => {
            let dir = dir_of(pool_dir)?;
            if create {
                make(&dir)?;
            }
            Ok(PoolSpec::Claim(dir))
        }
        other => Ok(other.per_container()),
    }
}

/// Whether `spec` is the container's pool (shared as a claim's is).
pub fn is_container_pool(spec: &PoolSpec) -> bool {
    matches!(spec, PoolSpec::Name(n) if n == CONTAINER_POOL)
}

/// `gpucap-container-NS` in the pool directory.
fn dir_of(pool_dir: Option<&Path>) -> Result<PathBuf, String> {
    let PoolSpec::Name(name) = PoolSpec::Name(CONTAINER_POOL.into()).per_container() else {
        unreachable!("a name stays a name");
    };
    Ok(base_dir(pool_dir)?.join(format!("gpucap-{name}")))
}

/// Makes the container's directory (mode 1777) if missing, and checks that this
/// process may make files in it: else it could not share the container's grant.
fn make(dir: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        // Made here: given every user (the umask took the bits `mode` asked for).
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(|e| {
                format!(
                    "cannot open the container's pool directory {}: {e}",
                    dir.display()
                )
            })?
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!(
                "cannot create the container's pool directory {}: {e}",
                dir.display()
            ));
        }
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
             other processes: the first process makes it mode 1777 for every user of the \
             container; chmod 1777 it, or remove it while no process of the container runs",
            dir.display(),
            m.mode() & 0o7777,
            m.uid(),
            own_uid()
        ));
    }
    Ok(())
}
