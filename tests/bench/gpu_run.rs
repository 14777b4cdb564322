//! scripts/gpu-run.sh, the one command of a device run, end to end on the fake GPU with
//! the stand-ins of nvidia-smi and nvcc (tests/standins/, as tests/bench/gpu_check.rs uses
//! them): every part runs, the checks that need no framework PASS (the pool of four
//! members, its metrics, NVML in a PID namespace, a member's contexts while others churn,
//! growth, the escapes, the accounting),
//! the framework ones SKIP with the reason, the hooks' files come back, and everything
//! fits in at most 8 files. The control (a `gpucap` that runs programs without the shim)
//! must FAIL those checks; a part running past the budget is stopped and the rest
//! skipped.
//!
//! The NVML check needs nvidia-ml-py (`GPUCAP_TEST_PYTHON_NVML`); without it, it SKIPs.

use super::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use common::*;

fn script() -> PathBuf {
    root().join("scripts/gpu-run.sh")
}

fn python() -> (PathBuf, bool) {
    match client_python("GPUCAP_TEST_PYTHON_NVML", "nvidia-ml-py") {
        Some(p) => (p, true),
        None => (PathBuf::from("python3"), false),
    }
}

/// An executable shell script at `path`.
fn write_script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// Stand-in hooks: each writes its file (and a log line) into the folder it is given.
/// The probe's stand-in runs a capped program with the environment the hooks get (the
/// first H200 run's hook passed GPUCAP_CLI, which every capped child refused).
fn hooks(dir: &Path) -> (PathBuf, PathBuf) {
    let probe = dir.join("probe-driver.sh");
    let hami = dir.join("bench-hami.sh");
    write_script(
        &probe,
        "test -n \"$GPUCAP_LIB\" && test -n \"$GPU_RUN_DEADLINE\" || exit 3\n\
         \"$GPU_RUN_CLI\" run --limit 1Gi -- true || exit 4\n\
         echo '{\"driver\": \"stand-in\"}' > \"$1/driver-answers.json\"; echo probed > \"$1/probe.log\"\n",
    );
    write_script(
        &hami,
        "echo '{\"hami\": \"stand-in\"}' > \"$1/hami.json\"\n",
    );
    (probe, hami)
}

/// gpu-run.sh OUT on two fake GPUs of 16 GiB whose contexts take 300 MiB, shared between
/// the run's processes, with the stand-ins first on PATH, quick benchmark settings. The
/// checks see GPU 0 (gpu-check.sh sets CUDA_VISIBLE_DEVICES), but for another GPU's pool.
fn on_fake_gpu(dir: &Path, out: &Path) -> Command {
    let _ = fake_nvml();
    let mut c = fake_cmd(script(), &dir.join("stats.json"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![root().join("tests/standins/bin")];
    paths.extend(std::env::split_paths(&path));
    let (py, _) = python();
    c.env("PATH", std::env::join_paths(paths).unwrap())
        .env("FAKECUDA_TOTAL_MEM", "16Gi")
        .env("FAKECUDA_DEVICES", "2")
        .env("FAKECUDA_CONTEXT_MEM", "300Mi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu.state"))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .arg(out)
        .arg("--lib")
        .arg(shim())
        .arg("--cli")
        .arg(cli())
        .arg("--python")
        .arg(py)
        .args(["--reps", "1", "--target-ms", "10", "--first-reps", "2"])
        .args(["--pool-members", "16"]);
    c
}

fn results(out: &Path, o: &Output) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("results.json: {e}\n{}", dump(o)));
    serde_json::from_str(&text).expect("results.json")
}

/// name -> (status, detail) of the parts or the checks.
fn statuses(v: &serde_json::Value, what: &str) -> BTreeMap<String, (String, String)> {
    v[what]
        .as_array()
        .unwrap_or_else(|| panic!("no {what} in {v}"))
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["detail"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

fn files(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The checks the fake GPU can run without a framework.
const ON_THE_FAKE: [&str; 32] = [
    "nvidia-smi",
    "context-overhead",
    "growth-footprint",
    "escape-vmm-release",
    "escape-pool-cumemfree",
    "escape-pool-other-gpu",
    "escape-page-rounding",
    "escape-module-globals",
    "escape-stack-limit",
    "escape-local-stack",
    "escape-legacy-launch",
    "escape-multi-device",
    "escape-lazy-kernels",
    "escape-library-global",
    "escape-capture-lazy",
    "escape-graph-node",
    "escape-graph-generic-node",
    "escape-green-context",
    "escape-deepbind",
    "accounting-driver",
    "pool",
    "pool-metrics",
    "pool-pidns",
    "pool-contexts",
    "graphs",
    "nccl",
    "vllm-sizing",
    "pool-64",
    "kill-storm",
    "fork-hold",
    "bench-alloc",
    "bench-churn",
];

/// The parts the first tests run: every part but the first set's own (tested below), so
/// that the checks part runs every check, the new ones included.
const OLD_PARTS: &str = "checks,bench,probe-driver,bench-hami,first-use";

#[test]
fn on_the_fake_gpu_every_part_runs_and_packs_into_at_most_8_files() {
    let dir = scratch("gpu-run-fake");
    let out = dir.join("out");
    let (probe, hami) = hooks(&dir);
    let (_, has_pynvml) = python();
    let t = Instant::now();
    let o = run(on_fake_gpu(&dir, &out)
        .args(["--parts", OLD_PARTS])
        .arg("--probe-driver")
        .arg(&probe)
        .arg("--bench-hami")
        .arg(&hami));
    eprintln!(
        "gpu-run.sh on the fake GPU took {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert_eq!(
        files(&out),
        [
            "driver-answers.json",
            "first-use.json",
            "gpu-bench.json",
            "hami.json",
            "logs.tar.gz",
            "results.json",
            "summary.txt"
        ],
        "{}",
        dump(&o)
    );
    let v = results(&out, &o);
    let parts = statuses(&v, "parts");
    for name in [
        "env",
        "checks",
        "bench",
        "probe-driver",
        "bench-hami",
        "first-use",
    ] {
        assert_eq!(
            parts[name].0,
            "PASS",
            "part {name}: {parts:?}\n{}",
            dump(&o)
        );
        assert!(
            stdout(&o).contains(&format!("== {name}: PASS in ")),
            "the part's seconds: {}",
            dump(&o)
        );
    }
    let checks = statuses(&v, "checks");
    for name in ON_THE_FAKE
        .iter()
        .chain(if has_pynvml { &["nvml"][..] } else { &[] })
    {
        assert_eq!(checks[*name].0, "PASS", "{name}: {checks:?}");
    }
    let skipped = |name: &str, why: &str| {
        let (s, d) = &checks[name];
        assert!(s == "SKIP" && d.contains(why), "{name}: {s} {d}");
    };
    for name in [
        "torch-default",
        "torch-expandable-segments",
        "torch-cudaMallocAsync",
        "torch-release",
        "torch-growth",
        "torch-eager",
        "accounting-torch",
        "bench-torch-train",
    ] {
        skipped(name, "PyTorch not importable");
    }
    skipped("graphs-torch", "PyTorch not importable");
    for name in [
        "jax-preallocate",
        "jax-no-preallocate",
        "jax-platform-allocator",
        "accounting-jax",
    ] {
        skipped(name, "JAX not importable");
    }
    for name in ["cupy-default-pool", "cupy-async-pool", "accounting-cupy"] {
        skipped(name, "CuPy not importable");
    }
    skipped("numba", "numba not importable");
    skipped("cuda-static", "no CUDA runtime (libcudart_static.a)");
    skipped("cuda-shared", "no CUDA runtime (libcudart.so*)");
    assert_eq!(checks.len(), 52, "{checks:?}");
    assert!(checks.values().all(|(s, _)| s != "FAIL"), "{checks:?}");
    // what the checks said, in the figures they were asked for
    let pool = &checks["pool"].1;
    assert!(
        pool.starts_with("4 driver members shared the 8192.0 MiB cap")
            && pool.contains("the 5th block was refused with the pool's line"),
        "{pool}"
    );
    // a context made 300 MiB on the fake is charged at least that while the others churn
    let contexts = &checks["pool-contexts"].1;
    assert!(
        contexts.contains("contexts made and destroyed")
            && contexts.contains("the maker's charge with a context 300.0 MiB..")
            && contexts.ends_with("(a context: 300.0 MiB)"),
        "{contexts}"
    );
    // the fifth member, in the monitors' namespace, is pid 2 there (1: pool_check.py)
    let pidns = &checks["pool-pidns"].1;
    assert!(
        pidns.contains("NVML lists its 5 members by their own pids [2, ")
            && pidns.contains("nvidia-smi this namespace's [2]"),
        "{pidns}"
    );
    assert!(
        checks["accounting-driver"]
            .1
            .ends_with("the first context measured by NVML, no temporary context"),
        "{checks:?}"
    );
    assert_eq!(
        v["figures"]["accounting_driver_ctx_charge_bytes"],
        300 * MIB
    );
    assert_eq!(v["bench"]["gpu"]["name"], "FakeCUDA Device 0");
    assert_eq!(v["first_use"]["cases"].as_array().map(Vec::len), Some(6));
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(
        summary.contains("PASS pool (") && summary.contains("parts:"),
        "{summary}"
    );
    // the logs: every check's, the hooks' own files
    let o = run(Command::new("tar").arg("-tzf").arg(out.join("logs.tar.gz")));
    let listed = stdout(&o);
    for f in [
        "./checks/pool.log",
        "./checks/pool/scrape2.prom",
        "./checks/pool/member0.err",
        "./checks/escape-vmm-release.log",
        "./bench/bench-alloc.log",
        "./driver-answers.json.d/probe.log",
        "./env.log",
    ] {
        assert!(listed.lines().any(|l| l == f), "{f} not in\n{listed}");
    }
}

#[test]
fn without_the_shim_the_checks_fail() {
    // The control: `gpucap run` runs the program as it is (the other subcommands are the
    // real gpucap's). Every check the fake can run must then FAIL, and the run exit 1.
    let dir = scratch("gpu-run-uncapped");
    let out = dir.join("out");
    let fake_cli = dir.join("gpucap");
    write_script(
        &fake_cli,
        &format!(
            "# gpucap without the shim: run execs the program as it is\n\
             if [ \"$1\" = run ]; then while [ \"$1\" != -- ]; do shift; done; shift; exec \"$@\"; fi\n\
             exec '{}' \"$@\"\n",
            cli().display()
        ),
    );
    let (_, has_pynvml) = python();
    let o = run(on_fake_gpu(&dir, &out)
        .args(["--parts", OLD_PARTS])
        .arg("--cli")
        .arg(&fake_cli));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    let v = results(&out, &o);
    let checks = statuses(&v, "checks");
    let benches = ["bench-alloc", "bench-churn"]; // measure, do not judge the cap
    for name in ON_THE_FAKE
        .iter()
        .chain(if has_pynvml { &["nvml"][..] } else { &[] })
    {
        let (s, why) = &checks[*name];
        if benches.contains(name) {
            assert_eq!(s, "PASS", "{name}: {why}");
        } else {
            assert_eq!(s, "FAIL", "{name} passed without the shim: {why}");
        }
    }
    let why = |name: &str| checks[name].1.clone();
    assert!(
        why("escape-vmm-release").contains("not the cap"),
        "{checks:?}"
    );
    assert!(
        why("growth-footprint").contains("not the cap"),
        "{checks:?}"
    );
    assert!(why("pool").contains("gpucap status --pool"), "{checks:?}");
    // no pool without the shim: nothing refused, the churners take the GPU past the cap
    assert!(
        why("pool-contexts").contains("the driver's figure for the pool's members was over the"),
        "{checks:?}"
    );
    // no pool: the dead member's memory, still the fake driver's, is served again
    assert!(why("fork-hold").contains("was served again"), "{checks:?}");
    assert_eq!(statuses(&v, "parts")["checks"].0, "FAIL");
}

#[test]
fn a_part_running_late_is_stopped_and_the_rest_skipped() {
    // A budget of 30 s leaves 20 s after packing's 10: the checks (60 s at least) and the
    // benchmarks (30 s) are skipped, a hook that never ends is stopped at the budget, and
    // the run still packs its files.
    let dir = scratch("gpu-run-late");
    let out = dir.join("out");
    let hang = dir.join("hang.sh");
    write_script(&hang, "echo started; exec sleep 600\n");
    let t = Instant::now();
    let o = run(on_fake_gpu(&dir, &out)
        .args(["--budget", "30", "--probe-driver"])
        .arg(&hang)
        .arg("--bench-hami")
        .arg(&hang));
    let took = t.elapsed().as_secs();
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        took < 45,
        "the run took {took} s with a 30 s budget\n{}",
        dump(&o)
    );
    let v = results(&out, &o);
    let parts = statuses(&v, "parts");
    for name in ["checks", "bench", "bench-hami", "first-use"] {
        let (s, why) = &parts[name];
        assert!(
            s == "SKIP" && why.starts_with("the time budget is spent"),
            "{name}: {s} {why}"
        );
    }
    let (s, why) = &parts["probe-driver"];
    assert!(
        s == "FAIL" && why.starts_with("stopped after "),
        "{s} {why}"
    );
    assert_eq!(files(&out), ["logs.tar.gz", "results.json", "summary.txt"]);
}

/// gpu-run.sh OUT ARGS with no NVIDIA driver (a PATH without nvidia-smi, no libcuda),
/// or None where this machine has one.
fn without_a_gpu(name: &str, args: &[&str]) -> Option<(PathBuf, Output)> {
    for d in ["/usr/bin", "/bin"] {
        if Path::new(d).join("nvidia-smi").exists() {
            eprintln!("SKIP: {d}/nvidia-smi exists: this machine has an NVIDIA driver");
            return None;
        }
    }
    let dir = scratch(name);
    let out = dir.join("out");
    let o = run(Command::new(script())
        .arg(&out)
        .args(args)
        .env("PATH", "/usr/bin:/bin")
        .env("LD_LIBRARY_PATH", dir.join("no-driver")));
    Some((out, o))
}

#[test]
fn without_a_gpu_every_check_and_the_first_use_skip() {
    let Some((out, o)) = without_a_gpu("gpu-run-no-gpu", &["--parts", "checks,first-use,diag"])
    else {
        return;
    };
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let v = results(&out, &o);
    let checks = statuses(&v, "checks");
    assert_eq!(checks.len(), 49, "{checks:?}");
    for (name, (s, why)) in &checks {
        assert_eq!(
            (s.as_str(), why.as_str()),
            ("SKIP", "no NVIDIA GPU (nvidia-smi not found)"),
            "{name}"
        );
    }
    let parts = statuses(&v, "parts");
    assert_eq!(parts["checks"].0, "PASS", "{parts:?}");
    let log = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(log.contains("parts:"), "{log}");
    let (s, why) = &parts["first-use"];
    assert!(
        s == "SKIP" && why.starts_with("SKIP: no NVIDIA driver (libcuda.so.1"),
        "{s} {why}"
    );
    let (s, why) = &parts["diag"];
    assert!(
        s == "SKIP" && why.starts_with("no NVIDIA GPU here (nvidia-smi not found)"),
        "{s} {why}"
    );
}

#[test]
fn another_gpus_pool_is_skipped_with_one_gpu() {
    let dir = scratch("gpu-run-one-gpu");
    let o = run(fake_cmd(cli(), &dir.join("stats.json"))
        .args(["run", "--limit", "1Gi", "--", "python3"])
        .arg(root().join("scripts/gpu/escapes.py"))
        .args(["pool-other-gpu", "--cap", "1073741824"]));
    assert_eq!(o.status.code(), Some(77), "{}", dump(&o));
    assert!(
        stdout(&o).ends_with(
            "SKIP: one GPU visible (cuDeviceGetCount = 1): another GPU's pool needs two\n"
        ),
        "{}",
        dump(&o)
    );
}

#[test]
fn a_bad_command_line_exits_2_naming_what_is_wrong() {
    let dir = scratch("gpu-run-usage");
    let full = dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("old.txt"), "").unwrap();
    let dir_s = dir.join("x").display().to_string();
    let full_s = full.display().to_string();
    for (args, expect) in [
        (vec![], "give OUTDIR"),
        (vec![full_s.as_str()], "is not empty"),
        (
            vec![dir_s.as_str(), "--budget", "5"],
            "--budget wants a whole number, at least 30",
        ),
        (vec![dir_s.as_str(), "--frob"], "unknown option '--frob'"),
        (vec![dir_s.as_str(), "two"], "unexpected argument 'two'"),
        (
            vec![dir_s.as_str(), "--parts", "checks,nope"],
            "--parts: no part 'nope'",
        ),
    ] {
        let o = run(Command::new(script()).args(&args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", dump(&o));
        assert!(
            stderr(&o).contains(expect),
            "{args:?}: want {expect:?}: {}",
            dump(&o)
        );
    }
}

/// The parts of the first set that run the new checks (the step cost, then one part a
/// check), without the re-checks and the probe.
const NEW_PARTS: &str = "step-cost,graphs,nccl,vllm-sizing,pool-64,kill-storm";

/// What the new checks said on the fake GPU, by name.
const NEW_CHECKS: [&str; 6] = [
    "bench-step",
    "graphs",
    "nccl",
    "vllm-sizing",
    "pool-64",
    "kill-storm",
];

#[test]
fn the_first_set_passes_on_the_fake_gpu_and_writes_the_step_cost() {
    // `--parts first`: the step cost, the new checks, the re-checks and the probe (its
    // stand-in), each its own part; the checks part and the rest are not asked for.
    let dir = scratch("gpu-run-first");
    let out = dir.join("out");
    let (probe, hami) = hooks(&dir);
    let o = run(on_fake_gpu(&dir, &out)
        // a budget no loaded machine spends: every part runs
        .args(["--parts", "first", "--budget", "1500", "--probe-driver"])
        .arg(&probe)
        .arg("--bench-hami")
        .arg(&hami));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert_eq!(
        files(&out),
        [
            "driver-answers.json",
            "logs.tar.gz",
            "results.json",
            "step-cost.json",
            "summary.txt"
        ],
        "{}",
        dump(&o)
    );
    let v = results(&out, &o);
    let parts = statuses(&v, "parts");
    for name in NEW_PARTS
        .split(',')
        .chain(["env", "recheck", "probe-driver", "diag"])
    {
        assert_eq!(
            parts[name].0,
            "PASS",
            "part {name}: {parts:?}\n{}",
            dump(&o)
        );
    }
    // the diagnostics ran to their end, raw and (capture-lazy) under gpucap
    let said = stdout(&o);
    for line in [
        "a launch of grab",
        "the graph of grab launched",
        "exit  parent held ",
        "under gpucap: no",
        "under gpucap: yes",
        "cuCtxSynchronize (control)",
    ] {
        assert!(said.contains(line), "{line}: {}", dump(&o));
    }
    for name in ["checks", "bench", "bench-hami", "first-use"] {
        let (s, why) = &parts[name];
        assert!(
            s == "SKIP" && why.starts_with("not asked for"),
            "{name}: {s} {why}"
        );
    }
    let checks = statuses(&v, "checks");
    for name in NEW_CHECKS.iter().chain(&["pool-contexts"]) {
        assert_eq!(checks[*name].0, "PASS", "{name}: {checks:?}");
    }
    assert_eq!(checks["graphs-torch"].0, "SKIP", "{checks:?}");
    assert_eq!(checks["accounting-jax"].0, "SKIP", "{checks:?}");
    assert_eq!(checks.len(), 9, "{checks:?}");
    // the fake reserves graph memory at instantiation (cuda-stubs/README.md)
    let graphs = &checks["graphs"].1;
    assert!(
        graphs.contains("the driver reserved its memory at instantiate")
            && graphs.contains("refused at instantiate")
            && graphs.contains("given back after trim"),
        "{graphs}"
    );
    assert_eq!(v["figures"]["graphs_reserved_at"], "instantiate");
    let pool = &checks["pool-64"].1;
    // A member's measurement counts in what it cannot tell apart (charged more, never
    // less): the 17th may then be refused at its context, with the pool's line all the same.
    assert!(
        pool.starts_with("16 processes at once held their first block")
            && (pool.contains("member 17, past the room, was refused: gpucap: refused cuMemAlloc")
                || pool.contains(
                    "member 17, past the room, was refused at its context: gpucap: refused"
                )),
        "{pool}"
    );
    assert!(
        checks["kill-storm"].1.contains("within the pool's"),
        "{checks:?}"
    );
    assert!(
        checks["nccl"].1.starts_with("NCCL (driver) world size 1: ")
            && checks["nccl"]
                .1
                .contains("two members of a 4096.0 MiB pool"),
        "{checks:?}"
    );
    assert!(
        checks["vllm-sizing"].1.contains("with no out-of-memory"),
        "{checks:?}"
    );
    // the step cost: 8 rounds of each driver-API loop (no PyTorch here), three ways (no
    // HAMi-core build carried), ratios with their intervals, in the file and the results
    let sc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("step-cost.json")).unwrap())
            .unwrap();
    assert_eq!(sc, v["step_cost"]);
    assert_eq!(sc["ways"], serde_json::json!(["raw", "gpucap", "pool"]));
    let workloads = sc["workloads"].as_object().unwrap();
    assert_eq!(workloads.keys().collect::<Vec<_>>(), ["graph", "launch"]);
    for (w, e) in workloads {
        assert_eq!(e["rounds"].as_array().unwrap().len(), 8, "{w}: {e}");
        for way in ["gpucap", "pool"] {
            let r = &e["ratios"][way];
            let (lo, med, hi) = (
                r["low"].as_f64().unwrap(),
                r["median"].as_f64().unwrap(),
                r["high"].as_f64().unwrap(),
            );
            assert!(lo <= med && med <= hi && lo > 0.0, "{w} {way}: {r}");
            assert_eq!(r["rounds"], 8, "{w} {way}: {r}");
        }
    }
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(summary.contains("step cost: ratio to raw"), "{summary}");
}

#[test]
fn without_the_shim_the_new_checks_fail() {
    // The control of the test above: `gpucap run` runs the program as it is. Each new
    // check must FAIL, the step cost among them (its "gpucap" ways were not capped).
    let dir = scratch("gpu-run-first-uncapped");
    let out = dir.join("out");
    let fake_cli = dir.join("gpucap");
    write_script(
        &fake_cli,
        &format!(
            "if [ \"$1\" = run ]; then while [ \"$1\" != -- ]; do shift; done; shift; exec \"$@\"; fi\n\
             exec '{}' \"$@\"\n",
            cli().display()
        ),
    );
    let o = run(on_fake_gpu(&dir, &out)
        .args(["--parts", NEW_PARTS, "--budget", "1500"])
        .arg("--cli")
        .arg(&fake_cli));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    let v = results(&out, &o);
    let checks = statuses(&v, "checks");
    for name in NEW_CHECKS {
        assert_eq!(
            checks[name].0, "FAIL",
            "{name} passed without the shim: {}",
            checks[name].1
        );
    }
    assert!(
        checks["bench-step"]
            .1
            .contains("it was not capped, so it measures nothing"),
        "{checks:?}"
    );
    assert!(checks["graphs"].1.contains("not the cap"), "{checks:?}");
    assert!(checks["kill-storm"].1.contains("past its"), "{checks:?}");
    assert!(!out.join("step-cost.json").exists());
}

#[test]
fn the_step_cost_statistics_pass_their_unit_tests() {
    // scripts/gpu/stats.py: medians, percentiles, the bootstrap interval, the rotation
    let o = run(Command::new("python3")
        .args(["-m", "unittest", "discover", "-s"])
        .arg(root().join("scripts/gpu"))
        .args(["-p", "test_stats.py", "-v"]));
    assert!(o.status.success(), "{}", dump(&o));
    assert!(stderr(&o).contains("Ran 12 tests"), "{}", dump(&o));
}

#[test]
fn the_rest_leaves_out_what_the_first_set_ran() {
    // `--parts rest`, the second command of a lent GPU: its checks part runs every check
    // but those of the first set's parts (run by `--parts first`). Without a GPU each
    // check is listed, skipped, so the list is the checks part's selection.
    let Some((out, o)) = without_a_gpu("gpu-run-rest", &["--parts", "rest", "--budget", "120"])
    else {
        return;
    };
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let v = results(&out, &o);
    let parts = statuses(&v, "parts");
    for name in NEW_PARTS
        .split(',')
        .chain(["recheck", "probe-driver", "diag"])
    {
        let (s, why) = &parts[name];
        assert!(
            s == "SKIP" && why.starts_with("not asked for"),
            "{name}: {s} {why}"
        );
    }
    let checks = statuses(&v, "checks");
    for name in [
        "graphs",
        "graphs-torch",
        "nccl",
        "vllm-sizing",
        "pool-64",
        "kill-storm",
        "pool-contexts",
        "accounting-jax",
        "bench-step",
    ] {
        assert!(!checks.contains_key(name), "{name} in the rest: {checks:?}");
    }
    assert!(
        checks.contains_key("pool") && checks.contains_key("accounting-driver"),
        "{checks:?}"
    );
    assert_eq!(checks.len(), 41 + 3, "{checks:?}");
}
