//! NVML under the shim: `nvmlDeviceGetMemoryInfo` and `_v2` report the cap as the
//! total and the capped free memory, consistently with `cuMemGetInfo_v2`, for the GPUs
//! CUDA sees in the process, matched by UUID (NVML numbers GPUs physically and ignores
//! `CUDA_VISIBLE_DEVICES`). GPUs CUDA does not see, and uncapped runs, show what the
//! driver reports. Under an invalid configuration they fail closed
//! (`NVML_ERROR_NO_PERMISSION`). Reading NVML never initialises CUDA: a monitor is not a
//! CUDA process (no `cuInit` in the fake's trace, no report, not counted by `--measure`).
//!
//! Readers: tests/c/nvml.c, linked with `-lnvidia-ml` and through dlopen + dlsym, and
//! the real client `nvidia-ml-py` (tests/clients/nvml_client.py) from the Python in
//! `GPUCAP_TEST_PYTHON_NVML` (scripts/test.sh creates target/venv-nvml). When that is
//! unset the pynvml test prints `SKIP: ...` and passes, unless
//! `GPUCAP_TEST_REQUIRE_CLIENTS=1`.

use super::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use common::*;

fn build_c(name: &str, suffix: &str, extra: &[&str]) -> PathBuf {
    fake_nvml();
    compile_c(name, suffix, extra)
}

fn nvml_prog() -> PathBuf {
    build_c("nvml", "", &["-lnvidia-ml", "-lcuda"])
}

/// One `dev ...` line.
#[derive(Debug, Clone, Default, PartialEq)]
struct Dev {
    uuid: String,
    total: u64,
    free: u64,
    used: u64,
    v2total: u64,
    v2reserved: u64,
    v2free: u64,
    v2used: u64,
}

impl Dev {
    /// (total, free, used, v2 total, v2 reserved, v2 free, v2 used).
    fn figures(&self) -> (u64, u64, u64, u64, u64, u64, u64) {
        (
            self.total,
            self.free,
            self.used,
            self.v2total,
            self.v2reserved,
            self.v2free,
            self.v2used,
        )
    }
}

/// What the fake driver's NVML reserves on each GPU by default (FAKECUDA_NVML_RESERVED):
/// in its total and v1's used, outside CUDA's total, as a real driver's NVML shows.
const RESERVED: u64 = 644_939_776;

fn devs(out: &str) -> BTreeMap<String, Dev> {
    let mut m = BTreeMap::new();
    for line in out.lines().filter(|l| l.starts_with("dev ")) {
        let mut words = line.split_whitespace().skip(1);
        let label = words.next().unwrap().to_string();
        let kv: BTreeMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let num = |k: &str| {
            kv[k]
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{k} in {line}"))
        };
        m.insert(
            label,
            Dev {
                uuid: kv["uuid"].to_string(),
                total: num("total"),
                free: num("free"),
                used: num("used"),
                v2total: num("v2total"),
                v2reserved: num("v2reserved"),
                v2free: num("v2free"),
                v2used: num("v2used"),
            },
        );
    }
    m
}

/// Three physical GPUs of 8 GiB; CUDA sees physical 2 as ordinal 0, physical 0 as 1.
fn three_gpus(cmd: &mut Command) -> &mut Command {
    cmd.env("FAKECUDA_DEVICES", "3")
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("CUDA_VISIBLE_DEVICES", "2,0")
}

const LIMIT: &str = "0=1Gi,1=2Gi";

/// What NVML must show under LIMIT with `three_gpus`: by physical index.
fn check_capped(d: &BTreeMap<String, Dev>, what: &str) {
    let gpu = |i: &str| {
        d.get(i)
            .unwrap_or_else(|| panic!("{what}: no NVML device {i} in {d:?}"))
    };
    assert_eq!(
        gpu("2").uuid,
        "GPU-face0000-0000-0000-0000-000000000002",
        "{what}"
    );
    for (index, cap) in [("2", GIB), ("0", 2 * GIB)] {
        let g = gpu(index);
        assert_eq!(
            g.figures(),
            (cap, cap, 0, cap, 0, cap, 0),
            "{what}: NVML device {index} (CUDA ordinal 0 is physical 2, 1 is physical 0)"
        );
    }
    assert_driver_figures(
        gpu("1"),
        8 * GIB,
        &format!("{what}: physical 1 is not visible"),
    );
}

/// An idle GPU of `cuda_total` as the driver's NVML shows it: its reserved memory in the
/// total and in v1's used, not in v2's.
#[track_caller]
fn assert_driver_figures(g: &Dev, cuda_total: u64, what: &str) {
    assert_eq!(
        g.figures(),
        (
            cuda_total + RESERVED,
            cuda_total,
            RESERVED,
            cuda_total + RESERVED,
            RESERVED,
            cuda_total,
            0
        ),
        "{what}"
    );
}

#[test]
fn nvml_shows_the_cap_of_each_visible_gpu_by_uuid() {
    let prog = nvml_prog();
    for how in ["linked", "dl"] {
        let stats = scratch("nvml").join("stats.json");
        let mut c = fake_cmd(&prog, &stats);
        three_gpus(&mut c);
        preload(&mut c).env("GPUCAP_LIMIT", LIMIT);
        let o = run(c.args(["list", how]));
        assert_passed(&o, &format!("nvml list {how} with the shim"));
        check_capped(&devs(&stdout(&o)), &format!("nvml list {how}"));

        // Control: without the shim every GPU shows its 8 GiB (and what the driver reserves).
        let mut c = fake_cmd(&prog, &stats);
        three_gpus(&mut c);
        let o = run(c.args(["list", how]));
        assert_passed(&o, &format!("nvml list {how} without the shim"));
        for (i, g) in devs(&stdout(&o)) {
            assert_driver_figures(&g, 8 * GIB, &format!("control, NVML device {i}"));
        }
    }
}

#[test]
fn nvml_without_a_limit_shows_the_driver_figures() {
    let stats = scratch("nvml-nolimit").join("stats.json");
    let mut c = fake_cmd(nvml_prog(), &stats);
    three_gpus(&mut c);
    preload(&mut c);
    let o = run(c.args(["list", "dl"]));
    assert_passed(&o, "nvml list without GPUCAP_LIMIT");
    let d = devs(&stdout(&o));
    assert_eq!(d.len(), 3);
    for (i, g) in &d {
        assert_driver_figures(g, 8 * GIB, &format!("no limit, NVML device {i}"));
    }
}

#[test]
fn nvml_agrees_with_cu_mem_get_info() {
    let prog = nvml_prog();
    for (how, context_mem) in [("linked", "0"), ("dl", "0"), ("dl", "64Mi")] {
        let stats = scratch("nvml-consistent").join("stats.json");
        let mut c = fake_cmd(&prog, &stats);
        three_gpus(&mut c).env("FAKECUDA_CONTEXT_MEM", context_mem);
        preload(&mut c).env("GPUCAP_LIMIT", LIMIT);
        let o = run(c.args(["consistent", how, "300Mi"]));
        assert_passed(
            &o,
            &format!("nvml consistent {how}, context memory {context_mem}"),
        );
        let line = stdout(&o)
            .lines()
            .find(|l| l.starts_with("cuda "))
            .unwrap()
            .to_string();
        let ctx = if context_mem == "0" { 0 } else { 64 * MIB };
        assert!(
            line.contains(&format!(
                "cuda free={} total={}",
                GIB - 300 * MIB - ctx,
                GIB
            )),
            "{how}: {line}"
        );
    }
}

#[test]
fn nvml_mig_instances_are_capped_their_gpus_are_not_cuda_devices() {
    let stats = scratch("nvml-mig").join("stats.json");
    let mut c = fake_cmd(nvml_prog(), &stats);
    c.env("FAKECUDA_DEVICES", "2")
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_MIG", "1");
    preload(&mut c).env("GPUCAP_LIMIT", "1Gi");
    let o = run(c.args(["list", "dl"]));
    assert_passed(&o, "nvml list with MIG");
    let d = devs(&stdout(&o));
    for i in ["0", "1"] {
        let (gpu, mig) = (&d[i], &d[&format!("{i}.mig")]);
        assert!(
            gpu.uuid.starts_with("GPU-") && mig.uuid.starts_with("MIG-"),
            "{d:?}"
        );
        assert_driver_figures(
            gpu,
            8 * GIB,
            &format!("GPU {i} itself is no CUDA device here"),
        );
        assert_eq!(
            (mig.total, mig.free),
            (GIB, GIB),
            "MIG instance of GPU {i} is CUDA ordinal {i}"
        );
    }
}

/// nvidia-ml-py, the real client: never initialises CUDA, like nvidia-smi.
#[test]
fn pynvml_sees_the_cap() {
    let Some(python) = client_python("GPUCAP_TEST_PYTHON_NVML", "nvidia-ml-py") else {
        return;
    };
    let _ = nvml_prog(); // makes sure the fake NVML is linked in the library directory
    let client = root().join("tests/clients/nvml_client.py");
    let stats = scratch("pynvml").join("stats.json");

    let mut c = fake_cmd(&python, &stats);
    three_gpus(&mut c)
        .arg(&client)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    preload(&mut c).env("GPUCAP_LIMIT", LIMIT);
    let o = run(&mut c);
    assert!(
        o.status.success() && stdout(&o).contains("done"),
        "pynvml: {}\n{}",
        stdout(&o),
        stderr(&o)
    );
    check_capped(&devs(&stdout(&o)), "pynvml");

    let mut c = fake_cmd(&python, &stats);
    three_gpus(&mut c)
        .arg(&client)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "pynvml without the shim: {}",
        stderr(&o)
    );
    for (i, g) in devs(&stdout(&o)) {
        assert_driver_figures(&g, 8 * GIB, &format!("pynvml control, NVML device {i}"));
    }

    // MIG: the instances are the CUDA devices.
    let mut c = fake_cmd(&python, &stats);
    c.env("FAKECUDA_DEVICES", "1")
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_MIG", "1");
    c.arg(&client).env("PYTHONDONTWRITEBYTECODE", "1");
    preload(&mut c).env(
        "GPUCAP_LIMIT",
        "MIG-face0001-0000-0000-0000-000000000000=3Gi",
    );
    let o = run(&mut c);
    assert!(
        o.status.success(),
        "pynvml with MIG: {}\n{}",
        stdout(&o),
        stderr(&o)
    );
    let d = devs(&stdout(&o));
    assert_eq!(
        (d["0"].total, d["0.mig"].total),
        (8 * GIB + RESERVED, 3 * GIB),
        "{d:?}"
    );
}

/// The `gpucap:` lines of a program's stderr.
fn gpucap_lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.starts_with("gpucap:")).collect()
}

/// Runs `nvml denied <how>` under the shim with `limit`: both memory calls must fail
/// with NVML_ERROR_NO_PERMISSION, with one message naming what is wrong.
fn assert_denied(limit: &str, visible: Option<&str>, says: &str) {
    let prog = nvml_prog();
    for how in ["linked", "dl"] {
        let stats = scratch("nvml-denied").join("stats.json");
        let mut c = fake_cmd(&prog, &stats);
        c.env("FAKECUDA_DEVICES", "3");
        if let Some(v) = visible {
            c.env("CUDA_VISIBLE_DEVICES", v);
        }
        preload(&mut c).env("GPUCAP_LIMIT", limit);
        let o = run(c.args(["denied", how]));
        assert_passed(&o, &format!("nvml denied {how} under GPUCAP_LIMIT={limit}"));
        let err = stderr(&o);
        let lines = gpucap_lines(&err);
        assert!(
            lines.len() == 1 && lines[0].contains(says),
            "{how}, GPUCAP_LIMIT={limit}: expected one gpucap line naming {says:?}:\n{err}"
        );
        assert!(
            !stats.exists(),
            "{how}: CUDA was initialised (stats written)"
        );
    }
}

/// A misconfigured cap never shows uncapped figures: every intercepted NVML call fails
/// as the CUDA calls do (CUDA_ERROR_NOT_PERMITTED there, NVML_ERROR_NO_PERMISSION
/// here), with the one message on stderr.
#[test]
fn nvml_fails_closed_under_an_invalid_configuration() {
    assert_denied("abc", None, "GPUCAP_LIMIT");
    // A UUID key that names no GPU CUDA would see (physical 1 is hidden).
    assert_denied(
        "GPU-face0000-0000-0000-0000-000000000001=1Gi",
        Some("2,0"),
        "GPU-face0000-0000-0000-0000-000000000001",
    );
    // Control: without the shim NVML answers.
    let stats = scratch("nvml-denied-control").join("stats.json");
    let mut c = fake_cmd(nvml_prog(), &stats);
    c.env("FAKECUDA_DEVICES", "3").env("GPUCAP_LIMIT", "abc");
    let o = run(c.args(["denied", "dl"]));
    assert_failed(&o, "nvml denied without the shim");

    // nvidia-ml-py raises its NVMLError_NoPermission.
    let Some(python) = client_python("GPUCAP_TEST_PYTHON_NVML", "nvidia-ml-py") else {
        return;
    };
    let stats = scratch("pynvml-denied").join("stats.json");
    let mut c = fake_cmd(&python, &stats);
    three_gpus(&mut c)
        .arg(root().join("tests/clients/nvml_client.py"))
        .env("PYTHONDONTWRITEBYTECODE", "1");
    preload(&mut c).env("GPUCAP_LIMIT", "abc");
    let o = run(&mut c);
    let out = stdout(&o);
    let denied: Vec<&str> = out.lines().filter(|l| l.starts_with("denied ")).collect();
    assert!(
        o.status.success() && out.contains("done") && !out.contains("\ndev "),
        "pynvml under GPUCAP_LIMIT=abc: {}",
        dump(&o)
    );
    assert_eq!(denied.len(), 3, "{out}");
    assert!(
        denied
            .iter()
            .all(|l| l.ends_with(" 4 NVMLError_NoPermission")),
        "{denied:?}"
    );
    let err = stderr(&o);
    assert_eq!(gpucap_lines(&err).len(), 1, "one message:\n{err}");
}

/// Figures still capped by ordinal and UUID keys when `CUDA_VISIBLE_DEVICES` reorders
/// the GPUs by UUID, in a process that never initialises CUDA.
#[test]
fn nvml_caps_by_uuid_keys_with_reordered_visible_devices() {
    let prog = nvml_prog();
    let stats = scratch("nvml-uuid-keys").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_DEVICES", "3")
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env(
            "CUDA_VISIBLE_DEVICES",
            // Physical 2 is ordinal 0, physical 0 (written in another case) ordinal 1.
            "GPU-face0000-0000-0000-0000-000000000002,gpu-FACE0000-0000-0000-0000-000000000000",
        );
    preload(&mut c).env(
        "GPUCAP_LIMIT",
        "0=1Gi,GPU-face0000-0000-0000-0000-000000000000=2Gi",
    );
    let o = run(c.args(["list", "dl"]));
    assert_passed(&o, "nvml list with UUID entries and keys");
    check_capped(&devs(&stdout(&o)), "UUID entries and keys");
    assert!(!stats.exists(), "CUDA was initialised (stats written)");
}

/// An NVML-only program (a monitor, like nvidia-smi) is not a CUDA process under the
/// shim: its figures are capped, yet it never calls cuInit, writes no GPUCAP_REPORT
/// report, and `gpucap run --measure` counts no process that used CUDA.
#[test]
fn reading_nvml_does_not_initialise_cuda() {
    let prog = nvml_prog();
    let dir = scratch("nvml-no-cuda");
    let stats = dir.join("stats.json");
    let report = dir.join("report.json");
    for how in ["linked", "dl"] {
        let mut c = fake_cmd(&prog, &stats);
        three_gpus(&mut c).env("FAKECUDA_TRACE", "1");
        preload(&mut c)
            .env("GPUCAP_LIMIT", LIMIT)
            .env("GPUCAP_REPORT", &report);
        let o = run(c.args(["list", how]));
        assert_passed(&o, &format!("nvml list {how}"));
        check_capped(&devs(&stdout(&o)), &format!("nvml list {how}"));
        let err = stderr(&o);
        assert!(
            !err.contains("fakecuda: cuInit("),
            "{how}: the shim initialised CUDA:\n{}",
            tail(&err, 20)
        );
        assert!(
            !stats.exists(),
            "{how}: CUDA was initialised (stats written)"
        );
        assert!(
            !report.exists(),
            "{how}: an NVML-only process wrote a report"
        );
    }

    // Control: a process that does use CUDA is traced, reported and stays capped.
    let mut c = fake_cmd(&prog, &stats);
    three_gpus(&mut c).env("FAKECUDA_TRACE", "1");
    preload(&mut c)
        .env("GPUCAP_LIMIT", LIMIT)
        .env("GPUCAP_REPORT", &report);
    let o = run(c.args(["consistent", "dl", "300Mi"]));
    assert_passed(&o, "nvml consistent");
    assert!(stderr(&o).contains("fakecuda: cuInit("));
    assert!(stats.exists() && report.exists());

    // gpucap run --measure counts no process that used CUDA.
    let mut c = fake_cmd(cli(), &stats);
    three_gpus(&mut c);
    let o = run(c
        .args(["run", "--measure", "--"])
        .arg(&prog)
        .args(["list", "dl"]));
    assert!(o.status.success(), "{}", dump(&o));
    assert!(
        stderr(&o)
            .contains("gpucap: measure: no figures: no process made a CUDA call under gpucap"),
        "{}",
        dump(&o)
    );

    // nvidia-ml-py: the same.
    let Some(python) = client_python("GPUCAP_TEST_PYTHON_NVML", "nvidia-ml-py") else {
        return;
    };
    let _ = std::fs::remove_file(&stats);
    let _ = std::fs::remove_file(&report);
    let mut c = fake_cmd(&python, &stats);
    three_gpus(&mut c)
        .arg(root().join("tests/clients/nvml_client.py"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("FAKECUDA_TRACE", "1");
    preload(&mut c)
        .env("GPUCAP_LIMIT", LIMIT)
        .env("GPUCAP_REPORT", &report);
    let o = run(&mut c);
    assert!(
        o.status.success() && stdout(&o).contains("done"),
        "{}",
        dump(&o)
    );
    check_capped(&devs(&stdout(&o)), "pynvml");
    assert!(!stderr(&o).contains("fakecuda: cuInit("), "{}", dump(&o));
    assert!(!stats.exists() && !report.exists());

    let mut c = fake_cmd(cli(), &stats);
    three_gpus(&mut c).env("PYTHONDONTWRITEBYTECODE", "1");
    let o = run(c
        .args(["run", "--measure", "--"])
        .arg(&python)
        .arg(root().join("tests/clients/nvml_client.py")));
    assert!(
        o.status.success()
            && stderr(&o)
                .contains("gpucap: measure: no figures: no process made a CUDA call under gpucap"),
        "{}",
        dump(&o)
    );
}

/// A process that reads NVML without CUDA (nvidia-smi, gpustat, a monitor) sees what a
/// CUDA process sees, `cuMemGetInfo`'s figures: for a fraction (of CUDA's total, not of
/// NVML's, which holds the driver's reserved memory too), a cap above the GPU (CUDA's
/// total, nothing shown used), and a cap handed down in `gpucap.env` that the
/// environment asks to raise (the ceiling holds). Before, the NVML-only process showed
/// 95 % of NVML's total, the CUDA process a 12 GiB cap's NVML total with the reserved
/// bytes as used (its own agreement check failed), and the environment's 4 GiB above
/// the file's 256 MiB.
#[test]
fn nvml_without_cuda_shows_what_cuda_shows_for_a_fraction_a_cap_above_the_gpu_and_a_ceiling() {
    let prog = nvml_prog();
    let dir = scratch("nvml-as-cuda");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let copy = home.join("libgpucap.so");
    std::fs::copy(shim(), &copy).unwrap();
    std::fs::write(home.join("gpucap.env"), "GPUCAP_LIMIT=256Mi\n").unwrap();
    let cases = [
        ("95%", shim(), "95%", (8 * GIB) * 95 / 100),
        ("a cap above the GPU", shim(), "12Gi", 8 * GIB),
        ("4Gi under a file's 256Mi", copy, "4Gi", 256 * MIB),
    ];
    for (what, lib, limit, cap) in cases {
        let cmd = |args: &[&str]| {
            let mut c = fake_cmd(&prog, &dir.join("stats.json"));
            c.env("FAKECUDA_TOTAL_MEM", "8Gi")
                .env("LD_PRELOAD", &lib)
                .env("GPUCAP_LIMIT", limit)
                .args(args);
            c
        };
        let o = run(&mut cmd(&["consistent", "dl", "1Mi"]));
        assert_passed(&o, &format!("{what}: nvml consistent (a CUDA process)"));
        let cuda = format!("cuda free={} total={cap}", cap - MIB);
        assert!(stdout(&o).contains(&cuda), "{what}: {cuda}\n{}", dump(&o));

        let o = run(&mut cmd(&["list", "dl"]));
        assert_passed(&o, &format!("{what}: nvml list (no CUDA)"));
        let d = devs(&stdout(&o));
        assert_eq!(
            d["0"].figures(),
            (cap, cap, 0, cap, 0, cap, 0),
            "{what}: NVML without CUDA\n{}",
            dump(&o)
        );
    }
}

/// A process that only reads NVML (nvidia-smi, gpustat in a capped container) is silent:
/// the configuration's notes (decimal units, HAMi-core's SM limit, which gpucap does not
/// act on) wait for the first `cuInit`, which says them once. Before, every NVML tool
/// printed them.
#[test]
fn a_process_that_only_reads_nvml_says_no_note() {
    let prog = nvml_prog();
    let stats = scratch("nvml-silent").join("stats.json");
    let notes = [
        "gpucap: note: GPUCAP_LIMIT's 8GB is in decimal units",
        "gpucap: note: CUDA_DEVICE_SM_LIMIT is HAMi-core's compute (SM) limit",
    ];
    for (args, said) in [
        (&["list", "dl"][..], false),
        (&["consistent", "dl", "1Mi"][..], true),
    ] {
        let mut c = fake_cmd(&prog, &stats);
        preload(&mut c)
            .env("GPUCAP_LIMIT", "8GB")
            .env("CUDA_DEVICE_SM_LIMIT", "50")
            .args(args);
        let o = run(&mut c);
        assert_passed(&o, &format!("nvml {args:?}"));
        let err = stderr(&o);
        for note in notes {
            assert_eq!(
                err.matches(note).count(),
                usize::from(said),
                "{args:?}: {note}\n{}",
                dump(&o)
            );
        }
        if !said {
            assert!(!err.contains("gpucap:"), "{}", dump(&o));
        }
    }
}
