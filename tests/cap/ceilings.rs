//! Ceilings: a 256 MiB cap in a configuration file (`gpucap.env` beside a copy of the
//! library, or `/etc/gpucap/gpucap.env`) holds whatever ONE more variable of the
//! program's environment says. Each row of the table of doors sets one variable (every
//! `GPUCAP_*` one, HAMi-core's, each driver's hand-over, and malformed names) and runs a
//! program on the fake GPU (4 GiB) that allocates 200 MiB, then 1 GiB: the 1 GiB is
//! never served, and the row's line is said. `/etc` is never written: the `/etc/gpucap`
//! rows run in a mount namespace (`unshare -rm`) where an overlay adds the file.

use super::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The fake's GPU 0 (cuda-stubs/common/src/identity.rs).
const GPU0: &str = "GPU-face0000-0000-0000-0000-000000000000";
const SMALL: u64 = 200 * MIB;

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// What a row must show, besides the 1 GiB refused.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// The file's cap holds, nothing to say: 200 MiB served.
    Holds,
    /// The environment asked more (the text of what it asked): held at the ceiling,
    /// said in one line; 200 MiB served.
    Held(&'static str),
    /// The environment lowered the cap below 200 MiB: refused too, no ceiling line.
    Lowered,
    /// The file's pool binds: the line says the process stays in it.
    StaysInPool,
    /// The configuration fails closed with a line naming the variable.
    Fails(&'static str),
    /// The process is refused at `cuInit` with this line.
    Refused(&'static str),
}

/// Every door: one variable of the environment each, against the file's 256 MiB.
fn doors(dir: &Path) -> Vec<(Vec<(String, String)>, Expect)> {
    let d = dir.display().to_string();
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let p = pools.display().to_string();
    let rows: Vec<(Vec<(&str, String)>, Expect)> = vec![
        (vec![], Expect::Holds),
        (vec![("GPUCAP_LOG", "warn".into())], Expect::Holds),
        (vec![("GPUCAP_LOG", "debug".into())], Expect::Holds),
        (vec![("GPUCAP_LOG", "info".into())], Expect::Holds),
        (vec![("GPUCAP_POOL_DIR", p.clone())], Expect::Holds),
        (vec![("GPUCAP_POOL", "off".into())], Expect::Holds),
        (
            vec![
                ("GPUCAP_POOL", "mine".into()),
                ("GPUCAP_POOL_DIR", p.clone()),
            ],
            Expect::Holds,
        ),
        (
            vec![("GPUCAP_POOL", format!("{p}/abs.pool"))],
            Expect::Holds,
        ),
        (vec![("GPUCAP_CLAIM_DIR", p.clone())], Expect::Holds),
        (
            vec![("CUDA_DEVICE_MEMORY_SHARED_CACHE", format!("{p}/hami.cache"))],
            Expect::Holds,
        ),
        (vec![("GPUCAP_GROWTH", "1".into())], Expect::Holds),
        (
            vec![("GPUCAP_REPORT", format!("{d}/r.json"))],
            Expect::Holds,
        ),
        (vec![("GPUCAP_POOL_MEMBERS", "8".into())], Expect::Holds),
        (vec![("GPUCAP_LD_SO_PRELOAD", "1".into())], Expect::Holds),
        (vec![("GPUCAP_HOME", d.clone())], Expect::Holds),
        (vec![("GPUCAP_TYPED", "--limit".into())], Expect::Holds),
        (vec![("GPUCAP_ORDINALS", "all".into())], Expect::Holds),
        (
            vec![
                ("GPUCAP_LIMIT", "0=4Gi".into()),
                ("GPUCAP_ORDINALS", "all".into()),
            ],
            Expect::Held("GPUCAP_LIMIT=\"0=4Gi\""),
        ),
        // A frame that moves the environment's key 1 (4 GiB) onto GPU 0: held there.
        (
            vec![
                ("GPUCAP_LIMIT", "1=4Gi".into()),
                ("GPUCAP_ORDINALS", "1,0".into()),
            ],
            Expect::Held("GPUCAP_LIMIT=\"1=4Gi\""),
        ),
        // One that would move a driver's grant off GPU 0: fails closed.
        (
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "128m".into()),
                ("GPUCAP_ORDINALS", "1".into()),
            ],
            Expect::Fails("GPUCAP_ORDINALS"),
        ),
        (
            vec![("GPUCAP_ORDINALS", "first".into())],
            Expect::Fails("GPUCAP_ORDINALS"),
        ),
        (
            vec![
                ("GPUCAP_LIMIT", "4Gi".into()),
                ("GPUCAP_TYPED", "--limit,--pool".into()),
            ],
            Expect::Held("--limit=\"4Gi\""),
        ),
        (
            vec![("GPUCAP_LIB", format!("{d}/libgpucap.so"))],
            Expect::Holds,
        ),
        (
            vec![
                ("GPUCAP_POOL", "shares".into()),
                ("GPUCAP_POOL_DIR", p.clone()),
                ("GPUCAP_CEILING", "4Gi".into()),
            ],
            Expect::Refused("the ceiling (4 GiB) is above the pool's cap (256 MiB"),
        ),
        (
            vec![
                ("GPUCAP_POOL", "shares".into()),
                ("GPUCAP_POOL_DIR", p.clone()),
                ("GPUCAP_CEILING", "100Mi".into()),
            ],
            Expect::Lowered,
        ),
        (
            vec![
                ("GPUCAP_POOL", "waits".into()),
                ("GPUCAP_POOL_DIR", p.clone()),
                ("GPUCAP_WAIT", "0".into()),
                ("GPUCAP_GUARANTEE", "100Mi".into()),
            ],
            Expect::Holds,
        ),
        (
            vec![("GPUCAP_LIMIT", "4Gi".into())],
            Expect::Held("GPUCAP_LIMIT=\"4Gi\""),
        ),
        (
            vec![("GPUCAP_LIMIT", "90%".into())],
            Expect::Held("GPUCAP_LIMIT=\"90%\""),
        ),
        (
            vec![("GPUCAP_LIMIT", "none".into())],
            Expect::Held("GPUCAP_LIMIT=\"none\""),
        ),
        (
            vec![("GPUCAP_LIMIT", "0=4Gi".into())],
            Expect::Held("GPUCAP_LIMIT=\"0=4Gi\""),
        ),
        (
            vec![("GPUCAP_LIMIT", format!("{GPU0}=4Gi"))],
            Expect::Held("GPUCAP_LIMIT="),
        ),
        (
            vec![
                ("GPUCAP_LIMIT", "4Gi".into()),
                ("GPUCAP_POOL", "off".into()),
            ],
            Expect::Held("GPUCAP_LIMIT=\"4Gi\""),
        ),
        (vec![("GPUCAP_LIMIT", "128Mi".into())], Expect::Lowered),
        (vec![("GPUCAP_LIMIT", "3%".into())], Expect::Lowered),
        (
            vec![("CUDA_DEVICE_MEMORY_LIMIT", "4096m".into())],
            Expect::Held("CUDA_DEVICE_MEMORY_LIMIT=\"4096m\""),
        ),
        (
            vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "4g".into())],
            Expect::Held("CUDA_DEVICE_MEMORY_LIMIT_0=\"4g\""),
        ),
        (
            vec![
                ("NVIDIA_GPU_MEMORY_LIMIT", "4096".into()),
                ("NVIDIA_GPU_MEMORY_REQUEST", "1024".into()),
            ],
            Expect::Held("NVIDIA_GPU_MEMORY_LIMIT=\"4096\""),
        ),
        (
            vec![("NVIDIA_GPU_MEMORY_LIMIT", "4096".into())],
            Expect::Fails("NVIDIA_GPU_MEMORY_LIMIT"),
        ),
        (
            vec![("CUDA_MEM_LIMIT", "4096m".into())],
            Expect::Held("CUDA_MEM_LIMIT=\"4096m\""),
        ),
        (
            vec![("GPU_DEVICE_0_MEMORY", "4Gi".into())],
            Expect::Held("GPU_DEVICE_0_MEMORY=\"4Gi\""),
        ),
        (
            vec![("GPU_DEVICE_gpu-0_MEMORY", "4Gi".into())],
            Expect::Fails("GPU_DEVICE_gpu-0_MEMORY"),
        ),
        (
            vec![("CUDA_DEVICE_MEMORY_LIMIT_00", "4g".into())],
            Expect::Fails("CUDA_DEVICE_MEMORY_LIMIT_00"),
        ),
        (
            vec![("CUDA_MEM_LIMIT_x", "4096m".into())],
            Expect::Fails("CUDA_MEM_LIMIT_x"),
        ),
        (
            vec![("NVIDIA_GPU_MEMORY_LIMITS", "4096".into())],
            Expect::Fails("NVIDIA_GPU_MEMORY_LIMITS"),
        ),
        (
            vec![("gpucap_limit", "4Gi".into())],
            Expect::Fails("gpucap_limit"),
        ),
        (
            vec![("GPUCAP_LIMT", "4Gi".into())],
            Expect::Fails("GPUCAP_LIMT"),
        ),
        (
            vec![("GPUCAP_LOG", "loud".into())],
            Expect::Fails("GPUCAP_LOG"),
        ),
    ];
    rows.into_iter()
        .map(|(vars, e)| {
            (
                vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                e,
            )
        })
        .collect()
}

/// A copy of the library in `home`, with `gpucap.env` holding `file` if given.
pub(crate) fn library_in(home: &Path, file: Option<&str>) -> PathBuf {
    std::fs::create_dir_all(home).unwrap();
    let lib = home.join("libgpucap.so");
    std::fs::copy(shim(), &lib).unwrap();
    if let Some(text) = file {
        std::fs::write(home.join("gpucap.env"), text).unwrap();
    }
    lib
}

/// Where the file lies.
#[derive(Clone, Copy, Debug)]
enum Place {
    BesideLibrary,
    Etc,
}

/// The script under the library `lib`, with `vars`; for [`Place::Etc`], inside a mount
/// namespace whose `/etc/gpucap/gpucap.env` is `etc_file` (an overlay on a tmpfs). With
/// `private_shm` (where such a namespace can be made), in a mount namespace of its own
/// whose `/dev/shm` is a tmpfs of its own, in both places: a driver's hand-over (a row's
/// variable) puts the process in the container's pool, kept in `/dev/shm` by default,
/// which the test must not leave in the machine's.
fn under(
    lib: &Path,
    dir: &Path,
    vars: &[(String, String)],
    place: Place,
    etc_file: &Path,
    private_shm: bool,
) -> Output {
    let args = [format!("alloc:{SMALL}"), format!("alloc:{GIB}")];
    let mut c = match (place, private_shm) {
        (Place::BesideLibrary, false) => {
            let mut c = fake_cmd(script(), &dir.join("stats.json"));
            c.env("LD_PRELOAD", lib).args(&args);
            for (k, v) in vars {
                c.env(k, v);
            }
            c
        }
        _ => {
            let tmp = dir.join("etc-overlay");
            std::fs::create_dir_all(&tmp).unwrap();
            let etc = matches!(place, Place::Etc);
            let mut c = fake_cmd("unshare", &dir.join("stats.json"));
            c.args(["-rm", "sh", "-c"]).arg(
                "set -e; t=$1; f=$2; lib=$3; etc=$4; shift 4; \
                 mount -t tmpfs none /dev/shm; \
                 if [ \"$etc\" = 1 ]; then \
                 mount -t tmpfs none \"$t\"; mkdir -p \"$t/u/gpucap\" \"$t/w\"; \
                 cp \"$f\" \"$t/u/gpucap/gpucap.env\"; \
                 mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$t/u\",workdir=\"$t/w\" /etc; \
                 fi; \
                 exec env LD_PRELOAD=\"$lib\" \"$@\"",
            );
            // The variables go through env(1): a shell drops a name it cannot hold
            // (`GPU_DEVICE_gpu-0_MEMORY`).
            c.arg("sh")
                .arg(&tmp)
                .arg(etc_file)
                .arg(lib)
                .arg(if etc { "1" } else { "0" });
            c.args(vars.iter().map(|(k, v)| format!("{k}={v}")));
            c.arg(script()).args(&args);
            c
        }
    };
    c.env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"));
    run(&mut c)
}

/// The driver's answer to the script's allocation of `size` (`alloc SIZE RC`).
pub(crate) fn alloc_rc(o: &Output, size: u64) -> Option<String> {
    stdout(o)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("alloc {size} ")))
        .map(|s| s.trim().to_string())
}

fn check_row(o: &Output, vars: &[(String, String)], expect: Expect, place: Place) {
    let row = format!("{place:?} {vars:?} ({expect:?})\n{}", dump(o));
    let err = stderr(o);
    assert_ne!(
        alloc_rc(o, GIB).as_deref(),
        Some("0"),
        "1 GiB served under the file's 256 MiB: {row}"
    );
    // One prefix a line (the ceiling's notes carried their own, and the shim added one).
    assert!(!err.contains("gpucap: gpucap:"), "a prefix twice: {row}");
    let ceiling_line = "asks more than the ceiling of GPU 0, 256 MiB";
    match expect {
        Expect::Holds | Expect::StaysInPool | Expect::Held(_) => {
            assert_eq!(alloc_rc(o, SMALL).as_deref(), Some("0"), "200 MiB: {row}");
        }
        Expect::Lowered | Expect::Refused(_) => {
            assert_ne!(alloc_rc(o, SMALL).as_deref(), Some("0"), "200 MiB: {row}");
        }
        Expect::Fails(_) => {}
    }
    match expect {
        Expect::Held(asked) => {
            let lines: Vec<&str> = err.lines().filter(|l| l.contains(ceiling_line)).collect();
            assert_eq!(lines.len(), 1, "one ceiling line: {row}");
            assert!(lines[0].contains(asked), "the line names {asked}: {row}");
            assert!(
                lines[0].contains("gpucap.env"),
                "the line names the file: {row}"
            );
        }
        Expect::StaysInPool => {
            assert!(err.contains("the process stays in"), "{row}");
        }
        Expect::Fails(var) => {
            assert!(
                err.lines()
                    .any(|l| l.starts_with("gpucap: invalid ") && l.contains(var)),
                "a line naming {var}: {row}"
            );
        }
        Expect::Refused(line) => {
            assert!(err.contains(line), "{row}");
        }
        Expect::Holds | Expect::Lowered => {
            assert!(!err.contains(ceiling_line), "no ceiling line: {row}");
        }
    }
}

#[test]
fn no_variable_of_the_environment_lifts_a_files_cap_beside_the_library_or_in_etc() {
    let dir = scratch("ceilings");
    let file = "GPUCAP_LIMIT=256Mi\n";
    let beside = library_in(&dir.join("beside"), Some(file));
    let bare = library_in(&dir.join("bare"), None);
    let etc_file = dir.join("etc-gpucap.env");
    std::fs::write(&etc_file, file).unwrap();
    let etc = etc_overlay_works(&dir);
    for (vars, expect) in doors(&dir) {
        let o = under(&beside, &dir, &vars, Place::BesideLibrary, &etc_file, etc);
        check_row(&o, &vars, expect, Place::BesideLibrary);
        if etc {
            let o = under(&bare, &dir, &vars, Place::Etc, &etc_file, true);
            check_row(&o, &vars, expect, Place::Etc);
        }
    }
}

/// A copy of the library with a `gpucap.env` of its own beside it (a user's: any
/// directory will do) is under `/etc/gpucap/gpucap.env` where that file exists: its file
/// may lower the cap, never raise or remove it, with or without variables of the
/// environment. Before, the file beside the copy was read in place of /etc's: 1 GiB
/// served under /etc's 256 MiB.
#[test]
fn a_file_beside_a_copy_of_the_library_is_under_etcs_ceiling() {
    let dir = scratch("ceiling-copy-etc");
    let etc_file = dir.join("etc-gpucap.env");
    std::fs::write(&etc_file, "GPUCAP_LIMIT=256Mi\n").unwrap();
    if !etc_overlay_works(&dir) {
        return;
    }
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], Expect);
    let rows: [Row; 7] = [
        (
            "GPUCAP_LIMIT=4Gi\n",
            &[],
            Expect::Held("GPUCAP_LIMIT=\"4Gi\" in "),
        ),
        ("GPUCAP_LIMIT=none\n", &[], Expect::Holds),
        ("# nothing\n", &[], Expect::Holds),
        (
            "GPUCAP_LIMIT=4Gi\n",
            &[("GPUCAP_LIMIT", "80Gi")],
            Expect::Holds,
        ),
        (
            "GPUCAP_LIMIT=90%\n",
            &[("GPUCAP_LIMIT", "none")],
            Expect::Holds,
        ),
        (
            "GPUCAP_LOG=debug\n",
            &[("GPUCAP_LIMIT", "4Gi")],
            Expect::Held("GPUCAP_LIMIT=\"4Gi\""),
        ),
        (
            "GPUCAP_LIMIT=128Mi\n",
            &[("GPUCAP_LIMIT", "4Gi")],
            Expect::Lowered,
        ),
    ];
    for (i, (file, vars, expect)) in rows.into_iter().enumerate() {
        let lib = library_in(&dir.join(format!("copy{i}")), Some(file));
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let o = under(&lib, &dir, &vars, Place::Etc, &etc_file, true);
        let row = format!("{file:?} {vars:?}\n{}", dump(&o));
        assert_ne!(
            alloc_rc(&o, GIB).as_deref(),
            Some("0"),
            "1 GiB served under /etc's 256 MiB: {row}"
        );
        let small = alloc_rc(&o, SMALL);
        match expect {
            Expect::Lowered => assert_ne!(small.as_deref(), Some("0"), "{row}"),
            Expect::Held(asked) => {
                assert_eq!(small.as_deref(), Some("0"), "{row}");
                assert!(
                    stderr(&o).contains(asked)
                        && stderr(&o).contains("asks more than the ceiling of GPU 0"),
                    "the held line: {row}"
                );
            }
            _ => assert_eq!(small.as_deref(), Some("0"), "{row}"),
        }
    }
}

/// A file's ceiling keyed by ordinal (`8Gi,1=256Mi`) under a program's own
/// `CUDA_VISIBLE_DEVICES=1,0`: the GPU the file held at 256 MiB is then ordinal 0, which
/// the file's ordinals give 8 GiB. Each GPU is held at the least of the file's figures,
/// with a line. Before, the program was served 1 GiB on the GPU the file held at 256
/// MiB. With `CUDA_VISIBLE_DEVICES=1` (one GPU visible) the file's key 1 names no GPU:
/// refused at `cuInit`, with the environment's cap as without it (before, with
/// `GPUCAP_LIMIT=8Gi`, served at 8 GiB).
#[test]
fn a_ceiling_keyed_by_ordinal_holds_where_the_program_picks_its_gpus() {
    let dir = scratch("ceiling-ordinals");
    let lib = library_in(&dir.join("home"), Some("GPUCAP_LIMIT=8Gi,1=256Mi\n"));
    let etc_file = dir.join("unused");
    let s = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    for (visible, limit) in [
        ("1,0", None),
        ("1,0", Some("8Gi")),
        ("1", None),
        ("1", Some("8Gi")),
    ] {
        let mut vars = s(&[("FAKECUDA_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", visible)]);
        vars.extend(limit.map(|l| ("GPUCAP_LIMIT".to_string(), l.to_string())));
        let o = under(&lib, &dir, &vars, Place::BesideLibrary, &etc_file, false);
        let row = format!("{vars:?}\n{}", dump(&o));
        assert_ne!(
            alloc_rc(&o, GIB).as_deref(),
            Some("0"),
            "1 GiB served on the GPU the file holds at 256 MiB: {row}"
        );
        if visible == "1" {
            assert!(stdout(&o).contains("cuInit 800"), "{row}");
            assert!(
                stderr(&o).contains("names GPU 1, but only 1 GPU is visible"),
                "{row}"
            );
            continue;
        }
        assert_eq!(alloc_rc(&o, SMALL).as_deref(), Some("0"), "{row}");
        assert!(
            stderr(&o).contains("names GPUs by ordinal, and CUDA_VISIBLE_DEVICES chooses"),
            "the line: {row}"
        );
    }
}

/// The table of doors has a row for every variable gpucap knows: the shim names them all
/// when it meets a `GPUCAP_*` name it does not know, so a variable added later without a
/// row here fails this test.
#[test]
fn the_table_of_doors_has_a_row_for_every_variable_gpucap_knows() {
    let dir = scratch("ceilings-known");
    let mut c = fake_cmd(script(), &dir.join("stats.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_QQQQQQQQQQQQ", "1")
        .arg(format!("alloc:{SMALL}"));
    let o = run(preload(&mut c));
    let err = stderr(&o);
    let known: Vec<&str> = err
        .lines()
        .find_map(|l| l.split("the known variables are ").nth(1))
        .unwrap_or_else(|| panic!("no list of the known variables: {}", dump(&o)))
        .split(", ")
        .map(str::trim)
        .collect();
    assert!(
        known.len() >= 10 && known.iter().all(|n| n.starts_with("GPUCAP_")),
        "{known:?}"
    );
    let rows = doors(&dir);
    for name in known {
        assert!(
            rows.iter()
                .any(|(vars, _)| vars.iter().any(|(k, _)| k == name)),
            "the table of doors has no row setting {name}"
        );
    }
}

#[test]
fn a_pool_the_file_names_binds_and_a_pool_chosen_under_the_ceiling_holds_it() {
    let dir = scratch("ceiling-pools");
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let file = format!(
        "GPUCAP_LIMIT=256Mi\nGPUCAP_POOL=ctr\nGPUCAP_POOL_DIR={}\n",
        pools.display()
    );
    let lib = library_in(&dir.join("home"), Some(&file));
    let etc_file = dir.join("unused");
    let s = |v: &[(&str, String)]| -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    };
    for vars in [
        s(&[("GPUCAP_POOL", "off".into())]),
        s(&[("GPUCAP_POOL", "mine".into())]),
        s(&[
            ("GPUCAP_POOL", "ctr".into()),
            ("GPUCAP_POOL_DIR", other.display().to_string()),
        ]),
        s(&[("GPUCAP_POOL_DIR", other.display().to_string())]),
        s(&[("GPUCAP_CLAIM_DIR", other.display().to_string())]),
    ] {
        let o = under(&lib, &dir, &vars, Place::BesideLibrary, &etc_file, false);
        check_row(&o, &vars, Expect::StaysInPool, Place::BesideLibrary);
        assert!(
            !other.join("gpucap-0").exists() && !other.join("gpucap.pool").exists(),
            "{vars:?}: a pool file was made in the other directory\n{}",
            dump(&o)
        );
    }
}

#[test]
fn without_a_file_the_environment_alone_is_as_before() {
    let dir = scratch("ceiling-none");
    let lib = library_in(&dir.join("home"), None);
    let etc_file = dir.join("unused");
    for (limit, served) in [("4Gi", true), ("none", true), ("256Mi", false)] {
        let vars = vec![("GPUCAP_LIMIT".to_string(), limit.to_string())];
        let o = under(&lib, &dir, &vars, Place::BesideLibrary, &etc_file, false);
        assert_eq!(
            alloc_rc(&o, GIB).as_deref() == Some("0"),
            served,
            "GPUCAP_LIMIT={limit}\n{}",
            dump(&o)
        );
        assert!(!stderr(&o).contains("ceiling"), "{}", dump(&o));
    }
}

#[test]
fn check_and_run_show_each_figure_where_it_came_from_and_the_ceiling_that_holds() {
    let dir = scratch("ceiling-cli");
    let home = dir.join("home");
    let lib = library_in(&home, Some("GPUCAP_LIMIT=256Mi\n"));
    let gpucap = home.join("gpucap");
    std::fs::copy(cli(), &gpucap).unwrap();
    let env_file = home.join("gpucap.env").display().to_string();
    let cmd = |args: &[&str]| {
        let mut c = fake_cmd(&gpucap, &dir.join("s.json"));
        c.env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
            .env("GPUCAP_LIB", &lib)
            .env("GPUCAP_LIMIT", "4Gi")
            .args(args);
        c
    };
    let o = run(&mut cmd(&["check"]));
    assert_ok(&o);
    let out = stdout(&o);
    for want in [
        format!("configuration: the environment's, under the ceiling of {env_file}"),
        format!("ceiling: every GPU: 256 MiB (268435456 bytes) (from {env_file}"),
        "asked: GPUCAP_LIMIT=\"4Gi\"".to_string(),
        "limit: on each GPU the smaller of the ceiling and the environment's".to_string(),
    ] {
        assert!(out.contains(&want), "missing {want:?}\n{}", dump(&o));
    }
    let gpu0 = out
        .lines()
        .find(|l| l.starts_with("GPU 0: "))
        .unwrap_or_default();
    assert!(
        gpu0.starts_with("GPU 0: cap 268435456 bytes (256 MiB) of 4294967296 (4 GiB)")
            && gpu0.ends_with(&format!(
                "(the ceiling from {env_file}, 256 MiB: GPUCAP_LIMIT=\"4Gi\" asks more, 4 GiB)"
            )),
        "{}",
        dump(&o)
    );
    // run: the ceiling and what was asked (at info), and the shim's one line.
    let o = run(cmd(&["run", "--", script().to_str().unwrap()])
        .arg(format!("alloc:{GIB}"))
        .env("GPUCAP_LOG", "info"));
    let err = stderr(&o);
    assert_ne!(alloc_rc(&o, GIB).as_deref(), Some("0"), "{}", dump(&o));
    for want in [
        format!("gpucap: ceiling: every GPU: 256 MiB (268435456 bytes) (from {env_file}"),
        "gpucap: asked: GPUCAP_LIMIT=\"4Gi\"".to_string(),
        format!(
            "gpucap: GPUCAP_LIMIT=\"4Gi\" asks more than the ceiling of GPU 0, 256 MiB (from \
             {env_file}): the program runs at the ceiling"
        ),
    ] {
        assert!(err.contains(&want), "missing {want:?}\n{}", dump(&o));
    }
    assert!(!err.contains("no cap is set"), "{}", dump(&o));
    // run --limit: every line, the CLI's and the shim's, names the flag as typed.
    let o = run(
        cmd(&["run", "--limit", "3Gi", "--", script().to_str().unwrap()])
            .arg(format!("alloc:{GIB}"))
            .env("GPUCAP_LOG", "info"),
    );
    let err = stderr(&o);
    assert_ne!(alloc_rc(&o, GIB).as_deref(), Some("0"), "{}", dump(&o));
    for want in [
        "gpucap: asked: --limit=\"3Gi\"".to_string(),
        format!(
            "gpucap: --limit=\"3Gi\" asks more than the ceiling of GPU 0, 256 MiB (from \
             {env_file}): the program runs at the ceiling"
        ),
    ] {
        assert!(err.contains(&want), "missing {want:?}\n{}", dump(&o));
    }
    assert!(!err.contains("GPUCAP_LIMIT=\"3Gi\""), "{}", dump(&o));
}

/// The script under `lib` in pool `pool` of `pools` (the fake GPU of 8 GiB shared in
/// `dir`) with `vars` and `steps`, started in the background.
fn pool_process(
    dir: &Path,
    lib: &Path,
    pool: &str,
    vars: &[(&str, &str)],
    steps: &[String],
) -> std::process::Child {
    let mut c = fake_cmd(script(), &dir.join(format!("{pool}-stats.json")));
    c.env("LD_PRELOAD", lib)
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
        .env("GPUCAP_POOL", pool)
        .env("GPUCAP_POOL_DIR", dir.join("pools"))
        .args(steps)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in vars {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// A pool `pool` made by a member without a file at `cap` (it holds `first`, waits for
/// the joiner to be done, then allocates `then`), and the joiner (the script under `lib`
/// with `vars` doing `steps`, started once the maker is in). Their outputs: maker, joiner.
fn maker_and_joiner(
    dir: &Path,
    pool: &str,
    cap: &str,
    (first, then): (u64, u64),
    lib: &Path,
    vars: &[(&str, &str)],
    steps: &[String],
) -> (Output, Output) {
    let bare = dir.join("bare").join("libgpucap.so");
    if !bare.exists() {
        library_in(&dir.join("bare"), None);
    }
    let ready = dir.join(format!("{pool}-maker-ready"));
    let done = dir.join(format!("{pool}-joiner-done"));
    let mut maker = pool_process(
        dir,
        &bare,
        pool,
        &[("GPUCAP_LIMIT", cap)],
        &[
            format!("alloc:{first}"),
            format!("touch:{}", ready.display()),
            format!("wait:{}", done.display()),
            format!("alloc:{then}"),
        ],
    );
    // The joiner joins at its cuInit: once the maker made the pool.
    wait_ready(&mut maker, &ready, "the pool's maker");
    let joiner = pool_process(dir, lib, pool, vars, steps)
        .wait_with_output()
        .unwrap();
    // The joiner may have been refused at cuInit: the maker goes on all the same.
    std::fs::write(&done, "").unwrap();
    (maker.wait_with_output().unwrap(), joiner)
}

#[test]
fn a_process_under_a_files_ceiling_joins_a_larger_pool_held_at_its_ceiling() {
    let dir = scratch("ceiling-join");
    std::fs::create_dir_all(dir.join("pools")).unwrap();
    let lib = library_in(&dir.join("home"), Some("GPUCAP_LIMIT=256Mi\n"));
    let env_file = dir.join("home").join("gpucap.env").display().to_string();
    let steps = [format!("alloc:{SMALL}"), format!("alloc:{}", 300 * MIB)];
    // Nothing more in the environment than the pool, or a raise as well.
    for (i, vars) in [vec![], vec![("GPUCAP_LIMIT", "4Gi")]].iter().enumerate() {
        let pool = format!("big{i}");
        let (maker, joiner) =
            maker_and_joiner(&dir, &pool, "4Gi", (GIB, 2 * GIB), &lib, vars, &steps);
        let both = format!(
            "{vars:?}\nmaker:\n{}\njoiner:\n{}",
            dump(&maker),
            dump(&joiner)
        );
        assert_eq!(alloc_rc(&joiner, SMALL).as_deref(), Some("0"), "{both}");
        assert_ne!(alloc_rc(&joiner, 300 * MIB).as_deref(), Some("0"), "{both}");
        let want = format!(
            "gpucap: the pool {pool} holds GPU 0 to 4 GiB, more than this process may hold \
             under the ceiling of {env_file}: it joins the pool held at 256 MiB"
        );
        let err = stderr(&joiner);
        assert_eq!(
            err.lines()
                .filter(|l| l.contains("joins the pool held at"))
                .count(),
            1,
            "{both}"
        );
        assert!(err.lines().any(|l| l == want), "missing {want:?}\n{both}");
        // The other member still gets its memory: the pool's cap is its.
        assert_eq!(alloc_rc(&maker, GIB).as_deref(), Some("0"), "{both}");
        assert_eq!(alloc_rc(&maker, 2 * GIB).as_deref(), Some("0"), "{both}");
    }
    // An environment that lowered the cap under the ceiling joins held at its own cap.
    let steps = [format!("alloc:{}", 100 * MIB), format!("alloc:{SMALL}")];
    let vars = [("GPUCAP_LIMIT", "128Mi")];
    let (maker, joiner) = maker_and_joiner(&dir, "big2", "4Gi", (GIB, GIB), &lib, &vars, &steps);
    let both = format!("maker:\n{}\njoiner:\n{}", dump(&maker), dump(&joiner));
    assert_eq!(alloc_rc(&joiner, 100 * MIB).as_deref(), Some("0"), "{both}");
    assert_ne!(alloc_rc(&joiner, SMALL).as_deref(), Some("0"), "{both}");
    assert!(
        stderr(&joiner).contains("it joins the pool held at 128 MiB"),
        "{both}"
    );
    assert_eq!(alloc_rc(&maker, GIB).as_deref(), Some("0"), "{both}");
}

#[test]
fn under_a_ceiling_a_smaller_pool_cap_holds_and_without_a_file_the_caps_must_agree() {
    let dir = scratch("ceiling-join-small");
    std::fs::create_dir_all(dir.join("pools")).unwrap();
    let lib = library_in(&dir.join("home"), Some("GPUCAP_LIMIT=256Mi\n"));
    // A pool of 128 MiB: its cap holds for a process whose ceiling is 256 MiB.
    let steps = [format!("alloc:{}", 32 * MIB), format!("alloc:{SMALL}")];
    let (maker, joiner) = maker_and_joiner(&dir, "small", "128Mi", (0, 0), &lib, &[], &steps);
    let both = format!("maker:\n{}\njoiner:\n{}", dump(&maker), dump(&joiner));
    assert_eq!(alloc_rc(&joiner, 32 * MIB).as_deref(), Some("0"), "{both}");
    assert_ne!(alloc_rc(&joiner, SMALL).as_deref(), Some("0"), "{both}");
    assert!(
        !stderr(&joiner).contains("joins the pool held at"),
        "{both}"
    );
    // Without a file, a member capped at 256 MiB may not join a pool of 4 GiB.
    let bare = dir.join("bare").join("libgpucap.so");
    let (_, joiner) = maker_and_joiner(
        &dir,
        "agree",
        "4Gi",
        (0, 0),
        &bare,
        &[("GPUCAP_LIMIT", "256Mi")],
        &steps,
    );
    assert!(
        stderr(&joiner).contains("every member of a pool must set the same GPUCAP_LIMIT"),
        "{}",
        dump(&joiner)
    );
    assert_eq!(alloc_rc(&joiner, 32 * MIB), None, "{}", dump(&joiner));
}

/// Touches a file when dropped: the processes waiting for it go on, even when a test
/// fails first.
struct Release(PathBuf);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "");
    }
}

#[test]
fn status_marks_a_process_held_at_a_ceiling_handed_down_and_says_where_from() {
    let dir = scratch("ceiling-status");
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let pool_dir = pools.display().to_string();
    // The file names the pool directory too: a process with no variable of its own (the
    // file alone) shows itself there.
    let file = format!("GPUCAP_LIMIT=256Mi\nGPUCAP_POOL_DIR={pool_dir}\n");
    let lib = library_in(&dir.join("home"), Some(&file));
    let bare = library_in(&dir.join("bare"), None);
    let done = Release(dir.join("status-done"));
    let mut started = Vec::new();
    // The script under `lib` with `vars` (`first`: allocated before the rest), holding
    // 100 MiB until the test is done.
    let mut start = |tag: &str, lib: &Path, first: Option<u64>, vars: &[(&str, &str)]| {
        let mut steps: Vec<String> = first.map(|b| format!("alloc:{b}")).into_iter().collect();
        steps.extend([
            format!("alloc:{}", 100 * MIB),
            format!("touch:{}", dir.join(tag).display()),
            format!("wait:{}", done.0.display()),
        ]);
        let mut c = fake_cmd(script(), &dir.join(format!("{tag}.json")));
        c.env("LD_PRELOAD", lib)
            .env("FAKECUDA_TOTAL_MEM", "8Gi")
            .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
            .args(&steps)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in vars {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap();
        wait_ready(&mut child, &dir.join(tag), tag);
        let pid = child.id();
        started.push(child);
        pid
    };
    let in_dir = ("GPUCAP_POOL_DIR", pool_dir.as_str());
    // The pool's maker holds 1 GiB: past what the other member may hold.
    let maker = start(
        "maker",
        &bare,
        Some(GIB),
        &[("GPUCAP_LIMIT", "4Gi"), ("GPUCAP_POOL", "p"), in_dir],
    );
    let member = start("member", &lib, None, &[("GPUCAP_POOL", "p")]);
    let alone = start("alone", &lib, None, &[]);
    let lowered = start("lowered", &lib, None, &[("GPUCAP_LIMIT", "128Mi")]);
    let hami = start(
        "hami",
        &bare,
        None,
        &[("CUDA_DEVICE_MEMORY_LIMIT", "512m"), in_dir],
    );
    let own = start("own", &bare, None, &[("GPUCAP_LIMIT", "1Gi"), in_dir]);
    let status = |args: &[&str]| {
        let mut c = fake_cmd(cli(), &dir.join("status.json"));
        c.env("GPUCAP_POOL_DIR", &pools)
            .env("COLUMNS", "200")
            .env("FAKECUDA_TOTAL_MEM", "8Gi")
            .args(args);
        let o = run(&mut c);
        assert_ok(&o);
        stdout(&o)
    };
    let json = status(&["status", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let of = |pid: u32| {
        let rows: Vec<&serde_json::Value> = doc["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["pid"] == pid)
            .collect();
        assert_eq!(rows.len(), 1, "pid {pid}: {json}");
        (rows[0]["cap"].as_u64(), rows[0]["ceiling_from"].as_str())
    };
    let beside = Some("gpucap.env beside the library");
    assert_eq!(of(member), (Some(256 * MIB), beside), "{json}");
    assert_eq!(of(alone), (Some(256 * MIB), beside), "{json}");
    assert_eq!(
        of(hami),
        (Some(512 * MIB), Some("HAMi device plugin's hand-over")),
        "{json}"
    );
    assert_eq!(of(lowered), (Some(128 * MIB), None), "{json}");
    assert_eq!(of(own), (Some(GIB), None), "{json}");
    assert_eq!(of(maker), (Some(4 * GIB), None), "{json}");
    // The table: the cap marked, and a line per place ceilings came from.
    let text = status(&["status"]);
    let row = |pid: u32| {
        text.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no row for pid {pid}\n{text}"))
            .to_string()
    };
    assert!(row(member).contains(" 256Mi^ "), "{text}");
    assert!(row(alone).contains(" 256Mi^ "), "{text}");
    assert!(row(hami).contains(" 512Mi^ "), "{text}");
    assert!(
        !row(lowered).contains('^') && !row(own).contains('^'),
        "{text}"
    );
    let (a, m) = (alone.min(member), alone.max(member));
    for want in [
        format!("^ the cap is a ceiling from gpucap.env beside the library (pid {a}, {m})"),
        format!("^ the cap is a ceiling from HAMi device plugin's hand-over (pid {hami})"),
    ] {
        assert!(text.lines().any(|l| l == want), "missing {want:?}\n{text}");
    }
    // The metrics: a series per process held at a ceiling handed down, with its source.
    let prom = status(&["status", "--prometheus", "--all"]);
    let series: Vec<&str> = prom
        .lines()
        .filter(|l| l.starts_with("gpucap_ceiling_handed_down_bytes{"))
        .collect();
    for (pid, from, bytes) in [
        (member, "gpucap.env beside the library", 256 * MIB),
        (alone, "gpucap.env beside the library", 256 * MIB),
        (hami, "HAMi device plugin's hand-over", 512 * MIB),
    ] {
        assert!(
            series.iter().any(|l| l.contains(&format!("pid=\"{pid}\""))
                && l.contains(&format!("from=\"{from}\""))
                && l.ends_with(&format!(" {bytes}"))),
            "pid {pid}: {series:#?}\n{prom}"
        );
    }
    assert_eq!(series.len(), 3, "{prom}");
    drop(done);
    for c in started {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", dump(&o));
    }
}
