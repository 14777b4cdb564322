//! One budget per claim, whichever users the claim's containers run as.

use super::*;

/// Two containers of claim A (1 GiB) and one of claim B (1 GiB), all on GPU 0, each as
/// another user (`--user` 1000, 1001, 1002: a pod's containers may have their own
/// `runAsUser`) in the driver's world-writable claim directories: A's first holds 600
/// MiB, so A's second is refused 600 MiB but gets 400 (it shares A's budget), while B
/// gets both. `driver` sets a container up as a driver would for a claim.
pub fn one_budget_per_claim(tag: &str, driver: fn(&mut Container, &Path, &str, u64)) {
    let Some(rt) = runtime() else { return };
    let dir = host_dir(tag);
    let sync = dir.join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    set_mode(&sync, 0o777);
    let container = |name: &str, claim: &str, steps: &[&str]| {
        let mut c = Container::new(name);
        driver(&mut c, &dir, claim, 1024);
        let user = match name {
            "holder" => "1000:1000",
            "second" => "1001:1001",
            _ => "1002:1002",
        };
        c.option(&format!("--user={user}"))
            .mount(&sync, "/sync")
            .script(steps);
        c
    };
    let (a2, b) = &while_holding(&rt, &sync, container, "claim-a", "claim-b");
    assert_eq!(
        script_allocs(a2),
        SHARED,
        "claim A's second container (another user) did not share the claim's 1 GiB\n{}",
        dump(a2)
    );
    assert_eq!(script_allocs(b), OWN, "claim B's container\n{}", dump(b));
}

#[test]
fn two_containers_of_one_hami_claim_share_its_budget() {
    one_budget_per_claim("ctr-claim-hami", hami_dra);
}

#[test]
fn two_containers_of_one_vgpu_manager_claim_share_its_budget() {
    one_budget_per_claim("ctr-claim-vgpu-manager", vgpu_manager);
}

/// The group Kubernetes gives a pod's volumes and containers with `fsGroup`.
const FS_GROUP: u32 = 5000;

/// A claim directory shared by group, as Kubernetes' `fsGroup` shares a volume (owned by
/// root, group 5000, mode 2770: group-writable and setgid, and the group added to every
/// container): two containers of users 1000 and 1001 in that group share the claim's
/// budget, in a file of the group that the group may write (0660); a container of the
/// claim whose user is not in the group is refused with one line saying how to share.
#[test]
fn containers_of_one_claim_in_its_fs_group_share_its_budget_and_others_are_refused() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-claim-fsgroup");
    let sync = dir.join("sync");
    let claim = dir.join("claims/claim-g");
    for d in [&sync, &claim] {
        std::fs::create_dir_all(d).unwrap();
    }
    set_mode(&sync, 0o777);
    let o = run(Command::new("chown")
        .arg(format!("0:{FS_GROUP}"))
        .arg(&claim));
    assert_ok(&o);
    set_mode(&claim, 0o2770);
    let container = |name: &str, claim: &str, steps: &[&str]| {
        let mut c = Container::new(name);
        hami_dra(&mut c, &dir, claim, 1024);
        let user = match name {
            "holder" => format!("--user=1000:1000 --group-add={FS_GROUP}"),
            "second" => format!("--user=1001:1001 --group-add={FS_GROUP}"),
            _ => "--user=1002:1002".to_string(), // not in the group
        };
        for o in user.split(' ') {
            c.option(o);
        }
        c.mount(&sync, "/sync").script(steps);
        c
    };
    let (second, stranger) = &while_holding(&rt, &sync, container, "claim-g", "claim-g");
    assert_eq!(
        script_allocs(second),
        SHARED,
        "user 1001 of the fsGroup did not share the claim's 1 GiB\n{}",
        dump(second)
    );
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::metadata(claim.join("gpucap.pool")).unwrap();
    assert_eq!(
        (file.mode() & 0o7777, file.gid()),
        (0o660, FS_GROUP),
        "the claim's pool file"
    );
    // Not in the group: nothing granted, and the one line says why and how.
    assert!(
        script_allocs(stranger).iter().all(|&(_, rc)| rc != 0),
        "user 1002, outside the fsGroup, was granted memory\n{}",
        dump(stranger)
    );
    let err = stderr(stranger);
    let line = err
        .lines()
        .find(|l| l.contains("the claim's directory /usr/local/vgpu/claims/claim-g"))
        .unwrap_or_else(|| panic!("no line naming the claim's directory\n{}", dump(stranger)));
    for want in [
        "(mode 2770, uid 0, gid 5000) may not be written by this process (uid 1002)",
        "--group-add 5000",
        "fsGroup",
    ] {
        assert!(line.contains(want), "{want:?} not in {line:?}");
    }
}
