//! The caps the cluster's GPU drivers hand a container (src/core/config/sources), on the
//! fake GPU, with exactly each driver's variables (and a temporary directory standing for
//! the claim directory the driver mounts): the program is capped at the granted amount,
//! cuMemGetInfo and NVML show it, `gpucap check` says where the cap came from, two
//! processes of one claim share one budget while a process of another claim has its own,
//! and sources that disagree or a malformed value stop `check`, `run` and the shim.

use super::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The fake's GPU 0 (tests/common: cuda-stubs/common/src/identity.rs).
const GPU0: &str = "GPU-face0000-0000-0000-0000-000000000000";

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

fn nvml_prog() -> PathBuf {
    fake_nvml();
    compile_c("nvml", "", &["-lnvidia-ml", "-lcuda"])
}

/// A claim's directory as its driver makes it (mode 0777) under `root`.
fn claim_dir(root: &Path, rel: &str) -> PathBuf {
    let d = root.join(rel);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

/// HAMi's DRA kubelet plugin: the claim `uid`'s variables for one container (each gets
/// its own cache file in the claim's directory).
fn hami_dra(root: &Path, uid: &str, container: &str) -> Vec<(String, String)> {
    let dir = claim_dir(root, &format!("usr/local/vgpu/claims/{uid}"));
    vec![
        ("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "1024m".into()),
        ("CUDA_DEVICE_SM_LIMIT_0".into(), "60".into()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
            dir.join(format!("{container}.cache")).display().to_string(),
        ),
    ]
}

/// vgpu-manager's DRA driver: GPU 0 of the node is index 3 there (its index is the
/// node's); the claim's directory, mounted at /etc/vgpu-manager/config in a container,
/// is named by GPUCAP_CLAIM_DIR here.
fn vgpu_manager(root: &Path, uid: &str) -> Vec<(String, String)> {
    let dir = claim_dir(root, &format!("vgpu-manager/claims/{uid}/default/config"));
    [
        ("MANAGER_COMPATIBILITY_MODE", "37"),
        ("MANAGER_VISIBLE_DEVICES", ""),
        ("CUDA_MEM_RATIO", "1.00"),
        ("CUDA_CORE_LIMIT", ""),
        ("CUDA_MEM_LIMIT", ""),
        ("CUDA_MEM_RATIO_3", "1.00"),
        ("CUDA_MEM_OVERSOLD_3", "FALSE"),
        ("MANAGER_VISIBLE_DEVICE_3", GPU0),
        ("CUDA_CORE_LIMIT_3", "50"),
        ("CUDA_MEM_LIMIT_3", "1024m"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("GPUCAP_CLAIM_DIR".to_string(), dir.display().to_string())])
    .collect()
}

fn dra_example() -> Vec<(String, String)> {
    [
        ("GPU_DEVICE_0", "gpu-0"),
        ("GPU_DEVICE_0_SHARING_STRATEGY", "TimeSlicing"),
        ("GPU_DEVICE_0_TIMESLICE_INTERVAL", "Default"),
        ("GPU_DEVICE_0_MEMORY", "1Gi"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn nvidia_toolkit() -> Vec<(String, String)> {
    [
        ("NVIDIA_VISIBLE_DEVICES", GPU0),
        ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Every driver's hand-over of a 1 GiB grant, with the driver's name.
fn every_driver(root: &Path) -> Vec<(&'static str, Vec<(String, String)>)> {
    vec![
        ("HAMi DRA kubelet plugin", hami_dra(root, "c1a1", "ctr")),
        ("vgpu-manager", vgpu_manager(root, "c1a2")),
        ("DRA example driver", dra_example()),
        ("NVIDIA container toolkit", nvidia_toolkit()),
    ]
}

/// `program` on a 4 GiB fake GPU (shared by the test's processes) under the shim, with
/// `env`; named pools (a grant's container pool) in the test's own directory.
fn under_shim(program: &Path, dir: &Path, env: &[(String, String)], args: &[&str]) -> Command {
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let mut c = fake_cmd(program, &dir.join("stats.json"));
    preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
        .env("GPUCAP_POOL_DIR", &pools)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn line_value<'a>(out: &'a str, prefix: &str) -> Option<&'a str> {
    out.lines().find_map(|l| l.strip_prefix(prefix))
}

#[test]
fn each_drivers_grant_caps_the_program_and_cuda_and_nvml_show_it() {
    let root = scratch("handover-cap");
    for (driver, env) in every_driver(&root) {
        let dir = scratch("handover-cap-run");
        let o = run(&mut under_shim(
            &script(),
            &dir,
            &env,
            &["info", "fill:16777216"],
        ));
        assert!(o.status.success(), "{driver}\n{}", dump(&o));
        let out = stdout(&o);
        let info: Vec<u64> = line_value(&out, "info ")
            .unwrap_or_else(|| panic!("{driver}: no info line\n{}", dump(&o)))
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(info[1], GIB, "{driver}: cuMemGetInfo total\n{}", dump(&o));
        let filled: u64 = line_value(&out, "filled ").unwrap().trim().parse().unwrap();
        assert_eq!(filled * 16 * MIB, GIB, "{driver}: filled\n{}", dump(&o));
        assert!(
            !refusals(&stderr(&o)).is_empty(),
            "{driver}: no refusal line\n{}",
            dump(&o)
        );

        let o = run(&mut under_shim(
            &nvml_prog(),
            &dir,
            &env,
            &["list", "linked"],
        ));
        let dev = line_value(&stdout(&o), "dev 0 ")
            .unwrap_or_else(|| panic!("{driver}: no NVML device\n{}", dump(&o)))
            .to_string();
        assert!(
            dev.contains(&format!("total={GIB} ")) && dev.contains(&format!("v2total={GIB} ")),
            "{driver}: NVML shows {dev}"
        );
    }
}

#[test]
fn check_says_which_variable_and_driver_each_cap_came_from() {
    let root = scratch("handover-check");
    for (driver, env) in every_driver(&root) {
        let mut c = fake_cmd(cli(), &root.join("stats.json"));
        c.arg("check").env("FAKECUDA_TOTAL_MEM", "4Gi");
        for (k, v) in &env {
            c.env(k, v);
        }
        let o = run(&mut c);
        assert_ok(&o);
        let out = stdout(&o);
        let var = match driver {
            "HAMi DRA kubelet plugin" => "CUDA_DEVICE_MEMORY_LIMIT_0=\"1024m\"",
            "vgpu-manager" => "CUDA_MEM_LIMIT_3=\"1024m\"",
            "DRA example driver" => "GPU_DEVICE_0_MEMORY=\"1Gi\"",
            _ => "NVIDIA_GPU_MEMORY_LIMIT=\"1024\"",
        };
        let gpu = if driver == "vgpu-manager" {
            GPU0
        } else {
            "every GPU"
        };
        for want in [
            format!("cap from {var} ({driver}), for {gpu}"),
            format!("GPU 0: cap {GIB} bytes (1 GiB) of"),
            format!("(from {var} ({driver}))"),
        ] {
            assert!(
                out.contains(&want),
                "{driver}: missing {want:?}\n{}",
                dump(&o)
            );
        }
        if driver == "HAMi DRA kubelet plugin" || driver == "vgpu-manager" {
            assert!(
                out.contains("pool: one per claim, ") && out.contains("gpucap.pool"),
                "{driver}: no claim pool\n{}",
                dump(&o)
            );
        }
    }
}

/// A process of a claim that allocates `steps` and then holds until `release` exists.
fn holder(dir: &Path, env: &[(String, String)], tag: &str, steps: &[&str]) -> Child {
    holder_as(0, dir, env, tag, steps)
}

/// [`under_shim`] run as `uid` (`setpriv` from root; 0: as the test runs), with a
/// statistics file of its own.
fn under_shim_as(
    uid: u32,
    program: &Path,
    dir: &Path,
    env: &[(String, String)],
    args: &[&str],
) -> Command {
    let mut c = under_shim(program, dir, env, args);
    c.env("FAKECUDA_STATS", dir.join(format!("stats-{uid}.json")));
    if uid == 0 {
        return c;
    }
    as_user(uid, &c)
}

/// [`holder`] run as `uid` ([`under_shim_as`]).
fn holder_as(uid: u32, dir: &Path, env: &[(String, String)], tag: &str, steps: &[&str]) -> Child {
    let ready = dir.join(format!("{tag}.ready"));
    let mut args: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
    args.push(format!("touch:{}", ready.display()));
    args.push(format!("wait:{}", dir.join("release").display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = under_shim_as(uid, &script(), dir, env, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut child, &ready, tag);
    child
}

fn alloc_rc(o: &Output, size: u64) -> String {
    line_value(&stdout(o), &format!("alloc {size} "))
        .unwrap_or_else(|| panic!("no alloc line\n{}", dump(o)))
        .trim()
        .to_string()
}

#[test]
fn processes_of_one_claim_share_its_grant_and_another_claim_has_its_own() {
    const SIZE: u64 = 600 * MIB;
    let size = SIZE.to_string();
    let alloc = format!("alloc:{size}");
    type Claim = fn(&Path, &str, &str) -> Vec<(String, String)>;
    let drivers: [(&str, Claim); 2] = [
        ("HAMi DRA kubelet plugin", hami_dra),
        ("vgpu-manager", |root, uid, _| vgpu_manager(root, uid)),
    ];
    for (driver, claim) in drivers {
        let dir = scratch("handover-claims");
        // Two containers of claim A (each its own cache file), one of claim B.
        let a1 = holder(&dir, &claim(&dir, "aaaa-1111", "a1"), "a1", &[&alloc]);
        let a2 = run(&mut under_shim(
            &script(),
            &dir,
            &claim(&dir, "aaaa-1111", "a2"),
            &[&alloc],
        ));
        let b = run(&mut under_shim(
            &script(),
            &dir,
            &claim(&dir, "bbbb-2222", "b"),
            &[&alloc],
        ));
        std::fs::write(dir.join("release"), b"").unwrap();
        let a1 = a1.wait_with_output().unwrap();
        assert_eq!(alloc_rc(&a1, SIZE), "0", "{driver}: A1\n{}", dump(&a1));
        assert_ne!(
            alloc_rc(&a2, SIZE),
            "0",
            "{driver}: the claim's second container took 600 MiB beside the first's 600 of \
             its 1 GiB\n{}",
            dump(&a2)
        );
        assert!(
            refusals(&stderr(&a2))
                .iter()
                .any(|l| l.contains("pool") && l.contains("gpucap.pool")),
            "{driver}: A2's refusal names no pool\n{}",
            dump(&a2)
        );
        assert_eq!(
            alloc_rc(&b, SIZE),
            "0",
            "{driver}: claim B was refused\n{}",
            dump(&b)
        );
    }
}

/// A grant that no claim directory comes with (the DRA example driver's, the toolkit's)
/// is the container's: its processes share it in the container's pool, and neither
/// `GPUCAP_POOL=off` nor another pool takes a process out of it.
#[test]
fn processes_of_one_container_share_a_grant_that_names_no_claim_directory() {
    const SIZE: u64 = 600 * MIB;
    let alloc = format!("alloc:{SIZE}");
    for (driver, env) in [
        ("DRA example driver", dra_example()),
        ("NVIDIA container toolkit", nvidia_toolkit()),
    ] {
        let dir = scratch("handover-container");
        let first = holder(&dir, &env, "first", &[&alloc]);
        let second = run(&mut under_shim(&script(), &dir, &env, &[&alloc]));
        let mut off = env.clone();
        off.push(("GPUCAP_POOL".into(), "off".into()));
        let off = run(&mut under_shim(&script(), &dir, &off, &[&alloc]));
        let mut mine = env.clone();
        mine.push(("GPUCAP_POOL".into(), "mine".into()));
        let mine = run(&mut under_shim(&script(), &dir, &mine, &[&alloc]));
        // A claim's directory of its own, beside a driver that has no claims.
        let mut own_claim = env.clone();
        let own = claim_dir(&dir, "own-claim");
        own_claim.push(("GPUCAP_CLAIM_DIR".into(), own.display().to_string()));
        let own_claim = run(&mut under_shim(&script(), &dir, &own_claim, &[&alloc]));
        std::fs::write(dir.join("release"), b"").unwrap();
        let first = first.wait_with_output().unwrap();
        assert_eq!(
            alloc_rc(&first, SIZE),
            "0",
            "{driver}: first\n{}",
            dump(&first)
        );
        for (what, o) in [
            ("second", &second),
            ("GPUCAP_POOL=off", &off),
            ("GPUCAP_POOL=mine", &mine),
            ("GPUCAP_CLAIM_DIR", &own_claim),
        ] {
            assert_ne!(
                alloc_rc(o, SIZE),
                "0",
                "{driver}: a {what} process of the container took 600 MiB beside the \
                 first's 600 of the 1 GiB grant\n{}",
                dump(o)
            );
            assert!(
                refusals(&stderr(o))
                    .iter()
                    .any(|l| l.contains("of the pool's 1 GiB cap") && l.contains("container-")),
                "{driver}: {what}'s refusal names no container pool\n{}",
                dump(o)
            );
        }
        for (v, o) in [("off", &off), ("mine", &mine)] {
            assert!(
                stderr(o).contains(&format!(
                    "GPUCAP_POOL=\"{v}\" would leave the container's pool, which shares "
                )),
                "{driver}: GPUCAP_POOL={v} said nothing\n{}",
                dump(o)
            );
        }
    }
}

/// A container's processes share its grant whatever their user (an entrypoint as root
/// beside a program as another user, `su`, `setpriv`): the container's pool is one
/// directory every user of the container may make files in (mode 0777, its file 0666;
/// not sticky, so that one user's process may replace the socket another's left).
/// Before, each user had a pool of the whole grant: root held 600 MiB of the 1 GiB and
/// uid 65534 was served 600 more.
#[test]
fn a_containers_processes_share_its_grant_whatever_their_user() {
    if !as_root("two users in one container") {
        return;
    }
    const SIZE: u64 = 600 * MIB;
    let alloc = format!("alloc:{SIZE}");
    for (first, second) in [(0, 65534), (65534, 0)] {
        let dir = scratch("handover-users");
        for d in [dir.clone(), dir.join("pools")] {
            std::fs::create_dir_all(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let env = dra_example();
        let held = holder_as(first, &dir, &env, "first", &[&alloc]);
        // The fake GPU's state is the test's, not gpucap's: every user may write it.
        std::fs::set_permissions(dir.join("fake-gpu"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let other = run(&mut under_shim_as(second, &script(), &dir, &env, &[&alloc]));
        std::fs::write(dir.join("release"), b"").unwrap();
        let held = held.wait_with_output().unwrap();
        assert_eq!(alloc_rc(&held, SIZE), "0", "uid {first}\n{}", dump(&held));
        // Once the first user's processes are gone, the other user's next process has
        // the grant (the socket they left replaced: the directory is not sticky).
        let after = run(&mut under_shim_as(second, &script(), &dir, &env, &[&alloc]));
        assert_eq!(
            alloc_rc(&after, SIZE),
            "0",
            "uid {second} alone after uid {first}'s processes exited\n{}",
            dump(&after)
        );
        assert_ne!(
            alloc_rc(&other, SIZE),
            "0",
            "uid {second} took 600 MiB beside uid {first}'s 600 of the container's 1 GiB \
             grant\n{}",
            dump(&other)
        );
        assert!(
            refusals(&stderr(&other))
                .iter()
                .any(|l| l.contains("of the pool's 1 GiB cap") && l.contains("gpucap-container-")),
            "uid {second}'s refusal names no container pool\n{}",
            dump(&other)
        );
        // One directory, made for every user; one file in it, which every user may write.
        let made: Vec<_> = std::fs::read_dir(dir.join("pools"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("gpucap-container-")
            })
            .collect();
        assert_eq!(made.len(), 1, "{made:?}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&made[0]), 0o777, "{}", made[0].display());
        assert_eq!(mode(&made[0].join("gpucap.pool")), 0o666);
    }
}

/// A process of the container that reads NVML without using CUDA (nvidia-smi, a
/// monitoring agent) sees the container's pool: the grant as the total and what the
/// container's processes hold as used. Before, it read `container-mntns.pool` in its
/// user's directory (the name unresolved), a file no member makes: the pool looked empty.
#[test]
fn an_nvml_reader_of_a_container_sees_what_its_processes_hold() {
    const SIZE: u64 = 600 * MIB;
    let dir = scratch("handover-nvml-reader");
    let env = dra_example();
    let held = holder(&dir, &env, "first", &[&format!("alloc:{SIZE}")]);
    let o = run(&mut under_shim(
        &nvml_prog(),
        &dir,
        &env,
        &["list", "linked"],
    ));
    std::fs::write(dir.join("release"), b"").unwrap();
    let held = held.wait_with_output().unwrap();
    assert_eq!(alloc_rc(&held, SIZE), "0", "{}", dump(&held));
    let dev = line_value(&stdout(&o), "dev 0 ")
        .unwrap_or_else(|| panic!("no NVML device\n{}", dump(&o)))
        .to_string();
    let used: u64 = dev
        .split_whitespace()
        .find_map(|f| f.strip_prefix("used="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no used figure: {dev}"));
    assert!(
        dev.contains(&format!("total={GIB} ")) && used >= SIZE,
        "NVML shows {dev}: the container's 600 MiB are not in its pool's used figure\n{}",
        dump(&o)
    );
}

/// Where `/dev/shm` is root's alone (mode 0755) and no `GPUCAP_POOL_DIR` is set, the
/// container's users still find one pool: `/dev/shm`'s, which root's first process made
/// every user's. Before, a user who may not write `/dev/shm` took `/tmp`, another pool:
/// root held 600 MiB of the 1 GiB grant and uid 65534 was served 600 more (found by
/// review).
#[test]
fn a_root_only_dev_shm_keeps_the_containers_users_in_one_pool() {
    if !as_root("a root-only /dev/shm in a mount namespace") {
        return;
    }
    const SIZE: u64 = 600 * MIB;
    let dir = scratch("handover-shm");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ready, release) = (dir.join("ready"), dir.join("release"));
    let sh = format!(
        "mount -t tmpfs -o mode=0755 none /dev/shm || exit 97\n\
         \"$0\" alloc:{SIZE} touch:{r} wait:{x} > {d}/first.out 2>&1 &\n\
         while [ ! -e {r} ]; do sleep 0.02; done\n\
         setpriv --reuid=65534 --regid=65534 --clear-groups -- \"$0\" alloc:{SIZE}\n\
         touch {x}; wait; cat {d}/first.out",
        r = ready.display(),
        x = release.display(),
        d = dir.display()
    );
    let mut c = fake_cmd("unshare", &dir.join("stats.json"));
    preload(&mut c)
        .env_remove("FAKECUDA_STATS")
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .args(["-m", "--propagation", "private", "sh", "-c", &sh])
        .arg(script());
    for (k, v) in dra_example() {
        c.env(k, v);
    }
    let o = run(&mut c);
    let rcs: Vec<String> = stdout(&o)
        .lines()
        .filter_map(|l| {
            l.strip_prefix(&format!("alloc {SIZE} "))
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        rcs.len(),
        2,
        "the other user's line, then root's\n{}",
        dump(&o)
    );
    assert_eq!(rcs[1], "0", "root held its 600 MiB\n{}", dump(&o));
    assert_ne!(
        rcs[0],
        "0",
        "uid 65534 took 600 MiB beside root's 600 of the 1 GiB grant\n{}",
        dump(&o)
    );
}

/// A process of the container that cannot read its mount namespace (no `/proc`: a
/// sandbox inside the container) is refused with a line, never put in a pool of its own
/// (`gpucap-container`) beside its siblings' (before: 600 MiB each under a 1 GiB grant,
/// found by review).
#[test]
fn a_process_that_cannot_tell_its_mount_namespace_is_refused_not_pooled_alone() {
    if !as_root("a mount namespace without /proc") {
        return;
    }
    let dir = scratch("handover-noproc");
    let mut c = under_shim(Path::new("unshare"), &dir, &dra_example(), &[]);
    c.args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /proc || exit 97; exec \"$0\" alloc:1048576",
    ])
    .arg(script());
    let o = run(&mut c);
    assert!(
        !stdout(&o).contains("alloc 1048576 0")
            && stderr(&o).contains("this process cannot tell its own (/proc/self/ns/mnt"),
        "{}",
        dump(&o)
    );
}

/// `gpucap status` and `top` with the pool directory named (`GPUCAP_POOL_DIR`) and no
/// pool in the environment show the container's pool kept there, every user's
/// (`gpucap-container-NS`). Before, that directory's view showed its users' own pools
/// only: "no capped process" while a member held 300 MiB (found by review).
#[test]
fn the_pool_directorys_view_shows_the_containers_pool() {
    const SIZE: u64 = 300 * MIB;
    let dir = scratch("handover-dir-view");
    let held = holder(&dir, &dra_example(), "first", &[&format!("alloc:{SIZE}")]);
    let pid = held.id();
    let view = |args: &[&str]| {
        let mut c = fake_cmd(cli(), &dir.join("stats-view.json"));
        c.args(args).env("GPUCAP_POOL_DIR", dir.join("pools"));
        run(&mut c)
    };
    let status = view(&["status", "--json"]);
    let top = view(&["top", "--once"]);
    std::fs::write(dir.join("release"), b"").unwrap();
    let held = held.wait_with_output().unwrap();
    assert_eq!(alloc_rc(&held, SIZE), "0", "{}", dump(&held));
    assert_ok(&status);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert!(
        doc["processes"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["pid"].as_u64() == Some(u64::from(pid)))),
        "{doc}"
    );
    assert_ok(&top);
    assert!(
        stdout(&top)
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(pid.to_string().as_str())),
        "{}",
        dump(&top)
    );
}

fn gpucap_check(env: &[(&str, &str)]) -> Output {
    let dir = scratch("handover-refuse");
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.arg("check").env("FAKECUDA_TOTAL_MEM", "4Gi");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

/// A case: the environment, and what the one line must name.
type Case<'a> = (Vec<(&'a str, &'a str)>, &'a [&'a str]);

#[test]
fn disagreeing_sources_and_malformed_values_fail_closed_with_one_line() {
    let cases: Vec<Case> = vec![
        (
            vec![
                ("GPUCAP_LIMIT", "2Gi"),
                ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
            ],
            &[
                "gpucap: invalid NVIDIA_GPU_MEMORY_LIMIT=\"1024\": ",
                "1 GiB from NVIDIA_GPU_MEMORY_LIMIT=\"1024\" (NVIDIA container toolkit)",
                "2 GiB from GPUCAP_LIMIT=\"2Gi\"",
            ],
        ),
        (
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "512m"),
                ("CUDA_MEM_LIMIT_3", "1024m"),
                ("MANAGER_VISIBLE_DEVICE_3", GPU0),
            ],
            &[
                "gpucap: invalid CUDA_MEM_LIMIT_3=\"1024m\": two sources give GPU 0 (GPU-face",
                "1 GiB from CUDA_MEM_LIMIT_3=\"1024m\" (vgpu-manager)",
                "512 MiB from CUDA_DEVICE_MEMORY_LIMIT_0=\"512m\" (HAMi device plugin)",
            ],
        ),
        (
            vec![
                ("NVIDIA_GPU_MEMORY_LIMIT", "1Gi"),
                ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
            ],
            &[
                "gpucap: invalid NVIDIA_GPU_MEMORY_LIMIT=\"1Gi\": not a whole number of MiB",
                "; accepted: a whole number of MiB",
            ],
        ),
        (
            vec![("NVIDIA_GPU_MEMORY_LIMIT", "1024")],
            &[
                "gpucap: invalid NVIDIA_GPU_MEMORY_LIMIT=\"1024\": NVIDIA_GPU_MEMORY_REQUEST is not set",
            ],
        ),
        (
            vec![("GPU_DEVICE_0_MEMORY", "1.5Gb")],
            &[
                "gpucap: invalid GPU_DEVICE_0_MEMORY=\"1.5Gb\": unknown suffix",
                "accepted: a Kubernetes quantity",
            ],
        ),
        // `none` beside a driver's grant: not uncapped, a conflict.
        (
            vec![("GPUCAP_LIMIT", "none"), ("GPU_DEVICE_0_MEMORY", "1Gi")],
            &[
                "gpucap: invalid GPUCAP_LIMIT=\"none\": none asks for no cap, and ",
                "GPU_DEVICE_0_MEMORY=\"1Gi\" (DRA example driver) grants one",
            ],
        ),
        (
            vec![("CUDA_MEM_LIMIT_3", "1024m")],
            &[
                "gpucap: invalid CUDA_MEM_LIMIT_3=\"1024m\": no MANAGER_VISIBLE_DEVICE_3 names the GPU",
            ],
        ),
    ];
    let dir = scratch("handover-refuse-shim");
    for (env, wants) in cases {
        let o = gpucap_check(&env);
        assert_eq!(o.status.code(), Some(2), "{env:?}\n{}", dump(&o));
        let err = stderr(&o);
        let line = err
            .lines()
            .find(|l| l.starts_with(wants[0]))
            .unwrap_or_else(|| panic!("{env:?}: no line {:?}\n{}", wants[0], dump(&o)));
        for w in wants {
            assert!(line.contains(w), "{env:?}: {w:?} not in {line:?}");
        }
        // The shim refuses every allocation under the same configuration, saying why.
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let o = run(&mut under_shim(&script(), &dir, &env, &["alloc:1048576"]));
        assert!(
            stderr(&o).lines().any(|l| l.starts_with(wants[0])),
            "{env:?}: the shim did not say it\n{}",
            dump(&o)
        );
        assert_ne!(
            line_value(&stdout(&o), "alloc 1048576 ").map(str::trim),
            Some("0"),
            "{env:?}: the shim let it allocate\n{}",
            dump(&o)
        );
    }
}

#[test]
fn agreeing_sources_are_fine() {
    let o = gpucap_check(&[
        ("GPUCAP_LIMIT", "1Gi"),
        ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
        ("NVIDIA_GPU_MEMORY_REQUEST", "1024"),
        ("GPU_DEVICE_0_MEMORY", "1Gi"),
        ("CUDA_MEM_LIMIT_3", "1024m"),
        ("MANAGER_VISIBLE_DEVICE_3", GPU0),
    ]);
    assert_ok(&o);
    let out = stdout(&o);
    // One cap, and every source that gives it named.
    for want in [
        format!("GPU 0: cap {GIB} bytes (1 GiB) of"),
        "cap from GPUCAP_LIMIT=\"1Gi\"".to_string(),
        "cap from NVIDIA_GPU_MEMORY_LIMIT=\"1024\" (NVIDIA container toolkit)".to_string(),
        "cap from GPU_DEVICE_0_MEMORY=\"1Gi\" (DRA example driver)".to_string(),
        format!("cap from CUDA_MEM_LIMIT_3=\"1024m\" (vgpu-manager), for {GPU0}"),
    ] {
        assert!(out.contains(&want), "missing {want:?}\n{}", dump(&o));
    }
}

/// HAMi's classic device plugin numbers `CUDA_DEVICE_MEMORY_LIMIT_<i>` in the order of
/// `NVIDIA_VISIBLE_DEVICES`; here it lists the fake's GPU 1 first, so `_0` (1 GiB) is GPU
/// 1's and `_1` (2 GiB) GPU 0's, though CUDA numbers GPU 0 first: each cap follows its
/// GPU's UUID, in `gpucap check` and in what NVML shows the program.
#[test]
fn hamis_classic_caps_follow_their_gpus_uuid_not_cudas_order() {
    const GPU1: &str = "GPU-face0000-0000-0000-0000-000000000001";
    let visible = format!("{GPU1},{GPU0}");
    let pairs = [
        ("NVIDIA_VISIBLE_DEVICES", visible.as_str()),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
        ("CUDA_DEVICE_SM_LIMIT", "50"),
        ("FAKECUDA_DEVICES", "2"),
    ];
    let o = gpucap_check(&pairs);
    assert_ok(&o);
    let out = stdout(&o);
    for want in [
        format!("GPU 0: cap {} bytes (2 GiB) of", 2 * GIB),
        format!("GPU 1: cap {GIB} bytes (1 GiB) of"),
        format!("cap from CUDA_DEVICE_MEMORY_LIMIT_0=\"1024m\" (HAMi device plugin), for {GPU1}"),
    ] {
        assert!(out.contains(&want), "missing {want:?}\n{}", dump(&o));
    }
    let env: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let dir = scratch("handover-hami-uuid");
    let o = run(&mut under_shim(
        &nvml_prog(),
        &dir,
        &env,
        &["list", "linked"],
    ));
    let out = stdout(&o);
    for (n, total) in [(0, 2 * GIB), (1, GIB)] {
        let dev = line_value(&out, &format!("dev {n} "))
            .unwrap_or_else(|| panic!("no NVML device {n}\n{}", dump(&o)));
        assert!(
            dev.contains(&format!("total={total} ")),
            "NVML's GPU {n}: {dev}\n{}",
            dump(&o)
        );
    }
}

/// `gpucap run --limit none` in a container the NVIDIA toolkit granted 1 GiB: the
/// program does not start uncapped; one line names both.
#[test]
fn run_with_limit_none_beside_a_grant_does_not_start() {
    let dir = scratch("handover-run-none");
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.args(["run", "--limit", "none"])
        .arg(script())
        .arg("alloc:1048576")
        .env("FAKECUDA_TOTAL_MEM", "4Gi");
    for (k, v) in nvidia_toolkit() {
        c.env(k, v);
    }
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        !stdout(&o).contains("alloc "),
        "the program ran\n{}",
        dump(&o)
    );
    let err = stderr(&o);
    assert!(
        err.lines().any(|l| l
            .starts_with("gpucap: invalid --limit=\"none\": none asks for no cap")
            && l.contains("NVIDIA_GPU_MEMORY_LIMIT=\"1024\" (NVIDIA container toolkit)")),
        "{}",
        dump(&o)
    );
}

/// A claim's pool is where every process of the claim belongs, not a warning: at the
/// default log level a process of a claim (each driver's that makes one, and
/// `GPUCAP_CLAIM_DIR`) says nothing of it; at `GPUCAP_LOG=info` it says it once, and
/// `gpucap check` prints it (above).
#[test]
fn a_claims_process_says_its_pool_at_info_level_only() {
    let root = scratch("handover-claim-quiet");
    let explicit = claim_dir(&root, "explicit-claim");
    let claims = [
        ("HAMi DRA kubelet plugin", hami_dra(&root, "c5a1", "ctr")),
        ("vgpu-manager", vgpu_manager(&root, "c5a2")),
        (
            "GPUCAP_CLAIM_DIR",
            vec![
                ("GPUCAP_LIMIT".to_string(), "1Gi".to_string()),
                (
                    "GPUCAP_CLAIM_DIR".to_string(),
                    explicit.display().to_string(),
                ),
            ],
        ),
    ];
    for (what, env) in claims {
        for (log, lines) in [(None, 0), (Some("warn"), 0), (Some("info"), 1)] {
            let mut c = under_shim(&script(), &root, &env, &[&format!("alloc:{MIB}")]);
            if let Some(level) = log {
                c.env("GPUCAP_LOG", level);
            }
            let o = run(&mut c);
            assert_ok(&o);
            let said = stderr(&o)
                .lines()
                .filter(|l| l.contains("pool: one per claim, "))
                .count();
            assert_eq!(
                said,
                lines,
                "{what}, GPUCAP_LOG={log:?}: {said} claim lines\n{}",
                dump(&o)
            );
        }
    }
}
