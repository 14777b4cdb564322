//! Who may use a pool file. A named pool or a pool given as a path is its creator's
//! alone (mode 0600, every member the same user). A claim's pool is shared by exactly
//! those who may write the claim's directory, since in Kubernetes the containers of one
//! claim may run as different users (`runAsUser`), sharing the directory by its mode
//! (HAMi and vgpu-manager make theirs 0777) or by its group (`fsGroup`: group-writable and
//! setgid). So a claim's file takes its mode and group from the directory, and a file
//! found there must give nobody a write the directory does not give.

use std::path::Path;

use gpucap_core::config::PoolSpec;

/// Who may use a pool file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Its creator only: the per-user directory's pools and pools given as a path.
    Private,
    /// Whoever may write the claim's directory (its parent).
    Claim,
}

impl Sharing {
    /// The sharing of `spec`'s file.
    pub fn of(spec: &PoolSpec) -> Sharing {
        match spec {
            PoolSpec::Claim(_) => Sharing::Claim,
            // Every user of the container shares it (`container.rs`).
            s if s.is_container_pool() => Sharing::Claim,
            PoolSpec::Name(_) | PoolSpec::Path(_) => Sharing::Private,
        }
    }
}

/// The owner, group and permission bits (with setgid and sticky) of a file or directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owned {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

impl Owned {
    pub fn of(m: &std::fs::Metadata) -> Owned {
        use std::os::unix::fs::MetadataExt;
        Owned {
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        }
    }

    fn others_write(&self) -> bool {
        self.mode & 0o002 != 0
    }

    fn group_writes(&self) -> bool {
        self.mode & 0o020 != 0
    }

    /// `mode 2770, uid 0, gid 5000`.
    fn describe(&self) -> String {
        format!("mode {:o}, uid {}, gid {}", self.mode, self.uid, self.gid)
    }
}

/// What a new claim file is given: its mode, and the group and owner it must have
/// (None: whatever the kernel gave it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewFile {
    pub mode: u32,
    pub gid: Option<u32>,
    pub uid: Option<u32>,
}

/// The mode (and group or owner) of a new pool file in the claim directory `dir`: a
/// directory every user may write gives a file every user may write (0666); a
/// group-writable one, a file of its group that the group may write (0660); otherwise
/// the file is the directory owner's (0600; root making it gives it to that owner).
pub fn new_claim_file(dir: Owned) -> NewFile {
    if dir.others_write() {
        NewFile {
            mode: 0o666,
            gid: None,
            uid: None,
        }
    } else if dir.group_writes() {
        NewFile {
            mode: 0o660,
            gid: Some(dir.gid),
            uid: None,
        }
    } else {
        NewFile {
            mode: 0o600,
            gid: None,
            uid: Some(dir.uid),
        }
    }
}

/// How to let every container of a claim write its directory.
const FIX: &str = "every container of the claim must be able to write it: give the pod a \
     securityContext.fsGroup (Kubernetes then makes a volume group-writable and setgid, and \
     adds the group to every container), or make the directory writable by all (chmod 0777, \
     as HAMi and vgpu-manager make theirs; not 1777: in a sticky directory the claim's socket \
     a departed user's process left cannot be replaced by another user's)";

/// The error of a claim directory this process (`uid`) may not write: it cannot share
/// the claim's budget, so nothing runs uncapped beside it.
pub fn unwritable_claim_dir(dir: &Path, d: Owned, uid: u32) -> String {
    let how = if d.group_writes() {
        format!(
            "run the container in its group {} (Kubernetes: the pod's securityContext.fsGroup \
             or supplementalGroups; podman and docker: --group-add {})",
            d.gid, d.gid
        )
    } else {
        FIX.to_string()
    };
    format!(
        "the claim's directory {} ({}) may not be written by this process (uid {uid}), so it \
         cannot share the claim's budget; {how}",
        dir.display(),
        d.describe()
    )
}

/// Checks a claim's existing pool file (`file`) against its directory (`dir`): it may
/// give a write to nobody who may not write the directory (that user could change or
/// reset the claim's budget), so its owner must be one who may (the directory's owner,
/// this process, root, anyone where everyone may, or the file being of the directory's
/// group where the group may: only a member, the owner or root can give it that group).
pub fn check_claim_file(file: Owned, dir: Owned, own_uid: u32) -> Result<(), String> {
    let group_ok = dir.others_write() || (dir.group_writes() && file.gid == dir.gid);
    let refuse = |why: String| {
        Err(format!(
            "{why}, though the claim's directory ({}) lets only {} write in it: another \
             user could change or reset the claim's budget; remove the file once no process \
            uses it",
            dir.describe(),
            writers(dir)
        ))
    };
    if file.others_write() && !dir.others_write() {
        return refuse(format!(
            "it is writable by every user ({})",
            file.describe()
        ));
    }
    if file.group_writes() && !group_ok {
        return refuse(format!(
            "it is writable by its group {} ({})",
            file.gid,
            file.describe()
        ));
    }
    let owner_ok = [dir.uid, own_uid, 0].contains(&file.uid) || group_ok;
    if !owner_ok {
        return refuse(format!(
            "it belongs to uid {} ({})",
            file.uid,
            file.describe()
        ));
    }
    Ok(())
}

/// Who may write `dir`, in words.
fn writers(dir: Owned) -> String {
    if dir.group_writes() {
        format!("uid {} and group {}", dir.uid, dir.gid)
    } else {
        format!("uid {}", dir.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(uid: u32, gid: u32, mode: u32) -> Owned {
        Owned { uid, gid, mode }
    }

    #[test]
    fn a_new_claim_file_is_shared_as_its_directory_is() {
        let new = |mode, gid, uid| NewFile { mode, gid, uid };
        // HAMi's and vgpu-manager's 0777, and a sticky 1777: every user.
        // fsGroup's 2770 (and a group-writable one without setgid): the group.
        // Only its owner writes it: the owner's file.
        for (modes, dir, file) in [
            ([0o777, 0o1777, 0o733], d(0, 0, 0), new(0o666, None, None)),
            (
                [0o2770, 0o2775, 0o770],
                d(0, 5000, 0),
                new(0o660, Some(5000), None),
            ),
            (
                [0o755, 0o700, 0o2755],
                d(1000, 1000, 0),
                new(0o600, None, Some(1000)),
            ),
        ] {
            for mode in modes {
                let dir = Owned { mode, ..dir };
                assert_eq!(new_claim_file(dir), file, "{mode:o}");
            }
        }
    }

    #[test]
    fn a_claim_file_gives_a_write_to_nobody_the_directory_does_not() {
        // What new_claim_file makes passes, whoever made it.
        for (dir, made_by) in [
            (d(0, 0, 0o777), 1000),
            (d(0, 0, 0o1777), 1001),
            (d(0, 5000, 0o2770), 1001),
            (d(1000, 1000, 0o755), 1000),
        ] {
            let new = new_claim_file(dir);
            let file = d(
                new.uid.unwrap_or(made_by),
                new.gid.unwrap_or(made_by),
                new.mode,
            );
            assert_eq!(check_claim_file(file, dir, 1002), Ok(()), "{dir:?}");
        }
        // Writable by others where only the owner (or the group) may write the directory.
        let e = check_claim_file(d(1000, 1000, 0o666), d(1000, 1000, 0o755), 1000).unwrap_err();
        assert!(
            e.starts_with("it is writable by every user (mode 666"),
            "{e}"
        );
        assert!(e.contains("lets only uid 1000 write in it"), "{e}");
        assert!(check_claim_file(d(1000, 5000, 0o666), d(0, 5000, 0o2770), 1000).is_err());
        // Writable by a group that is not the directory's.
        let e = check_claim_file(d(1000, 6000, 0o660), d(0, 5000, 0o2770), 1000).unwrap_err();
        assert!(e.starts_with("it is writable by its group 6000"), "{e}");
        assert!(e.contains("lets only uid 0 and group 5000"), "{e}");
        // A stranger's file in a directory he may not write (the directory's owner and
        // this process are others): refused even at 0600.
        let e = check_claim_file(d(4242, 4242, 0o600), d(1000, 1000, 0o755), 1000).unwrap_err();
        assert!(e.starts_with("it belongs to uid 4242"), "{e}");
        let e = check_claim_file(d(4242, 4242, 0o600), d(0, 5000, 0o2770), 1000).unwrap_err();
        assert!(e.starts_with("it belongs to uid 4242"), "{e}");
        // ... but in the directory's group, or where everyone may write, he may be a
        // member of the claim like any other.
        assert_eq!(
            check_claim_file(d(4242, 5000, 0o660), d(0, 5000, 0o2770), 1000),
            Ok(())
        );
        assert_eq!(
            check_claim_file(d(4242, 4242, 0o666), d(0, 0, 0o1777), 1000),
            Ok(())
        );
        // Root's file, the directory owner's, this process's own.
        for uid in [0, 1000, 1001] {
            assert_eq!(
                check_claim_file(d(uid, uid, 0o600), d(1000, 1000, 0o755), 1001),
                Ok(())
            );
        }
    }

    #[test]
    fn an_unwritable_claim_directory_says_how_to_share_it() {
        let dir = Path::new("/usr/local/vgpu/claims/abc");
        let e = unwritable_claim_dir(dir, d(1000, 1000, 0o755), 1001);
        assert!(
            e.starts_with(
                "the claim's directory /usr/local/vgpu/claims/abc (mode 755, uid 1000, gid \
                 1000) may not be written by this process (uid 1001)"
            ),
            "{e}"
        );
        assert!(e.contains("fsGroup") && e.contains("chmod 0777"), "{e}");
        let e = unwritable_claim_dir(dir, d(0, 5000, 0o2770), 1001);
        assert!(
            e.contains("run the container in its group 5000") && e.contains("--group-add 5000"),
            "{e}"
        );
    }
}
