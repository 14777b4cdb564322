//! scripts/gpu-check.sh, the real-GPU proof, run where CI runs: with no GPU, and on the
//! fake GPU through stand-ins of nvidia-smi and nvcc (tests/standins/: nvidia-smi answers
//! from NVML, here the fake one; nvcc builds the driver-API helper drvbench.cu with the
//! host C++ compiler). Frameworks (PyTorch, JAX, CuPy) and cudart are not here, so their
//! checks must SKIP with the reason; the rest of the script — its command line, the
//! GPU discovery, set-up, the nvidia-smi, NVML and context checks, the benchmarks and
//! their JSON — runs for real, and an uncapped control shows the checks can fail.
//!
//! The NVML check needs nvidia-ml-py: `GPUCAP_TEST_PYTHON_NVML` (scripts/test.sh sets it);
//! without it the check must SKIP, unless `GPUCAP_TEST_REQUIRE_CLIENTS=1`.

use super::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

fn script() -> PathBuf {
    root().join("scripts/gpu-check.sh")
}

fn standins() -> PathBuf {
    root().join("tests/standins/bin")
}

/// The Python that runs the probes: one with nvidia-ml-py where there is one.
fn python() -> (PathBuf, bool) {
    match client_python("GPUCAP_TEST_PYTHON_NVML", "nvidia-ml-py") {
        Some(p) => (p, true),
        None => (PathBuf::from("python3"), false), // then the nvml check must SKIP
    }
}

/// gpu-check.sh on a fake GPU of 16 GiB whose contexts take 300 MiB, shared between the
/// processes of the run (the observers see the others), with the stand-ins first on PATH.
fn on_fake_gpu(dir: &Path) -> Command {
    let _ = fake_nvml();
    let mut c = fake_cmd(script(), &dir.join("stats.json"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![standins()];
    paths.extend(std::env::split_paths(&path));
    c.env("PATH", std::env::join_paths(paths).unwrap())
        // NVML (so nvidia-smi) shows the card's 16 GiB plus what the driver reserves
        // (FAKECUDA_NVML_RESERVED, by default 615 MiB as on an H200): 16999 MiB.
        .env("FAKECUDA_TOTAL_MEM", "16Gi")
        .env("FAKECUDA_CONTEXT_MEM", "300Mi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu.state"))
        .env_remove("CUDA_VISIBLE_DEVICES")
        .arg("--lib")
        .arg(shim())
        .arg("--cli")
        .arg(cli())
        .arg("--logs")
        .arg(dir.join("logs"));
    c
}

/// The script's verdicts, in order: (status, check, detail), the detail being the reason
/// after `FAIL name: `/`SKIP name: `, or the line under `PASS name`.
fn verdicts(o: &Output) -> Vec<(String, String, String)> {
    let out = stdout(o);
    let lines: Vec<&str> = out.lines().collect();
    let mut v = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some((status, rest)) = l.split_once(' ') else {
            continue;
        };
        if !["PASS", "FAIL", "SKIP"].contains(&status) {
            continue;
        }
        let (name, detail) = match rest.split_once(": ") {
            Some((name, why)) => (name, why),
            None => (rest, lines.get(i + 1).map_or("", |d| d.trim())),
        };
        v.push((status.to_string(), name.to_string(), detail.to_string()));
    }
    v
}

/// The status and detail of one check.
fn verdict_of(o: &Output, name: &str) -> (String, String) {
    verdicts(o)
        .into_iter()
        .find(|(_, n, _)| n == name)
        .map(|(status, _, detail)| (status, detail))
        .unwrap_or_else(|| panic!("no verdict for {name}:\n{}", dump(o)))
}

fn last_line(o: &Output) -> String {
    stdout(o).lines().last().unwrap_or("").to_string()
}

const FRAMEWORK_CHECKS: [&str; 12] = [
    "torch-default",
    "torch-expandable-segments",
    "torch-cudaMallocAsync",
    "torch-release",
    "torch-growth",
    "torch-eager",
    "jax-preallocate",
    "jax-no-preallocate",
    "jax-platform-allocator",
    "cupy-default-pool",
    "cupy-async-pool",
    "numba",
];

#[test]
fn without_a_gpu_every_check_is_skipped_with_the_reason() {
    // A PATH without nvidia-smi: the script must say why it proves nothing, and pass.
    for d in ["/usr/bin", "/bin"] {
        if Path::new(d).join("nvidia-smi").exists() {
            eprintln!("SKIP: {d}/nvidia-smi exists: this machine has an NVIDIA driver");
            return;
        }
    }
    let o = run(Command::new(script())
        .arg("--bench")
        .env("PATH", "/usr/bin:/bin"));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let v = verdicts(&o);
    assert_eq!(v.len(), 53, "49 checks and 4 benchmarks: {}", dump(&o));
    for (status, name, why) in &v {
        assert_eq!(
            (status.as_str(), why.as_str()),
            ("SKIP", "no NVIDIA GPU (nvidia-smi not found)"),
            "{name}"
        );
    }
    assert_eq!(last_line(&o), "0 passed, 0 failed, 53 skipped");

    // nvidia-smi there, but it cannot reach a driver (no NVML): the same, with its words.
    let o = run(Command::new(script())
        .env("PATH", format!("{}:/usr/bin:/bin", standins().display()))
        .env("LD_LIBRARY_PATH", scratch("no-nvml"))
        .args(["--only", "nvml|^context"]));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let v = verdicts(&o);
    assert_eq!(
        v.iter()
            .map(|(s, n, _)| format!("{s} {n}"))
            .collect::<Vec<_>>(),
        ["SKIP nvml", "SKIP context-overhead"],
        "--only selects: {}",
        dump(&o)
    );
    assert!(
        v[0].2.starts_with("no NVIDIA GPU (nvidia-smi -L: ") && v[0].2.contains("driver"),
        "{}",
        dump(&o)
    );
    assert_eq!(last_line(&o), "0 passed, 0 failed, 2 skipped");
}

#[test]
fn a_bad_command_line_exits_2_naming_what_is_wrong() {
    let dir = scratch("gpu-check-usage");
    for (args, expect) in [
        (
            &["--cap-mib", "lots"][..],
            "--cap-mib wants a whole number, at least 64",
        ),
        (
            &["--cap-mib=32"][..],
            "--cap-mib wants a whole number, at least 64",
        ),
        (
            &["--timeout", "5"][..],
            "--timeout wants a whole number, at least 60",
        ),
        (&["--frobnicate"][..], "unknown option '--frobnicate'"),
        (&["now"][..], "unexpected argument 'now'"),
        (&["--reps"][..], "--reps needs a value"),
        (&["--gpu", "7"][..], "no GPU '7'"),
    ] {
        let o = run(on_fake_gpu(&dir).args(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", dump(&o));
        assert!(
            stderr(&o).contains(expect),
            "{args:?}: want {expect:?}: {}",
            dump(&o)
        );
        assert!(
            stderr(&o).contains("(see --help)"),
            "{args:?}: {}",
            dump(&o)
        );
    }
    let o = run(Command::new(script()).arg("--help"));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert!(stdout(&o).contains("--lib PATH"), "{}", dump(&o));

    // A cap that is not well below the card is refused before any check runs.
    let o = run(on_fake_gpu(&dir).args(["--cap-mib", "12000", "--only", "nvidia-smi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stdout(&o).contains("FAIL setup: --cap-mib 12000 is not well below the card's 16999 MiB"),
        "{}",
        dump(&o)
    );
    assert_eq!(
        verdict_of(&o, "nvidia-smi"),
        ("SKIP".into(), "set-up failed".into())
    );
}

#[test]
fn on_the_fake_gpu_the_checks_pass_and_the_benchmarks_are_written() {
    let dir = scratch("gpu-check-fake");
    let (py, has_pynvml) = python();
    let json = dir.join("bench.json");
    let o = run(on_fake_gpu(&dir)
        .arg("--python")
        .arg(&py)
        .args(["--bench", "--reps", "1", "--target-ms", "10", "--out"])
        .arg(&json)
        // everything but the cudart programs (the fake driver has no cudart)
        .args([
            "--only",
            "^(torch|jax|cupy|numba|nvidia-smi|nvml|context|bench)",
        ])
        // the step cost has its own test (tests/bench/gpu_run.rs)
        .args(["--except", "^bench-step$"]));
    let out = stdout(&o);
    assert!(
        out.starts_with(
            "gpu-check: FakeCUDA Device 0 (GPU-face0000-0000-0000-0000-000000000000), driver "
        ),
        "{}",
        dump(&o)
    );
    assert!(
        out.contains("gpu-check: cap 2048 MiB (2147483648 bytes)"),
        "{}",
        dump(&o)
    );

    let (s, detail) = verdict_of(&o, "nvidia-smi");
    assert_eq!(
        (s.as_str(), detail.as_str()),
        (
            "PASS",
            "nvidia-smi --query-gpu=memory.total inside gpucap run shows 2048 MiB (card: 16999 MiB)"
        ),
        "{}",
        dump(&o)
    );
    let (s, detail) = verdict_of(&o, "context-overhead");
    assert_eq!(s, "PASS", "{}", dump(&o));
    assert!(
        detail.starts_with("the first context takes 300.0 MiB of device memory (median of 3 runs; 300.0 MiB under gpucap)")
            && detail.contains("sees free 1748.0 MiB of the 2048.0 MiB cap"),
        "{detail}"
    );
    let (s, detail) = verdict_of(&o, "nvml");
    if has_pynvml {
        assert_eq!(
            (s.as_str(), detail.as_str()),
            (
                "PASS",
                "nvmlDeviceGetMemoryInfo and _v2 show total = cap (2048.0 MiB)"
            ),
            "{}",
            dump(&o)
        );
    } else {
        assert_eq!(s, "SKIP", "{}", dump(&o));
        assert!(detail.starts_with("pynvml not installed"), "{detail}");
    }
    for name in ["bench-alloc", "bench-churn"] {
        assert_eq!(verdict_of(&o, name).0, "PASS", "{name}: {}", dump(&o));
    }
    for name in FRAMEWORK_CHECKS.iter().chain(&["bench-torch-train"]) {
        let (s, why) = verdict_of(&o, name);
        assert_eq!(s, "SKIP", "{name}: {}", dump(&o));
        assert!(
            why.contains("not importable (No module named"),
            "{name}: {why}"
        );
    }
    let passed = if has_pynvml { 5 } else { 4 };
    assert_eq!(
        last_line(&o),
        format!("{passed} passed, 0 failed, {} skipped", 18 - passed),
        "{}",
        dump(&o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));

    // The benchmark file: the GPU it came from, every size in every mode, the context.
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("{}: {e}\n{}", json.display(), dump(&o)));
    let v: serde_json::Value = serde_json::from_str(&text).expect("bench JSON");
    assert_eq!(v["gpu"]["name"], "FakeCUDA Device 0", "{text}");
    assert_eq!(v["gpu"]["memory_total_mib"], 16999, "{text}");
    assert_eq!(v["cap_bytes"], 2147483648u64, "{text}");
    let sizes: Vec<u64> = v["alloc_free"]
        .as_array()
        .expect("alloc_free")
        .iter()
        .map(|r| {
            for mode in ["raw_ns", "gpucap_ns", "growth_ns"] {
                assert!(r[mode].as_f64().is_some_and(|ns| ns > 0.0), "{mode} in {r}");
            }
            let ratio = r["gpucap_ratio"].as_f64().expect("gpucap_ratio");
            let expect = r["gpucap_ns"].as_f64().unwrap() / r["raw_ns"].as_f64().unwrap();
            assert!((ratio - expect).abs() < 0.01, "ratio {ratio} in {r}");
            r["size"].as_u64().expect("size")
        })
        .collect();
    assert_eq!(sizes, [4096, 1 << 20, 256 << 20], "{text}");
    for mode in ["raw_ns", "gpucap_ns", "growth_ns"] {
        assert!(
            v["churn"][mode].as_f64().is_some_and(|ns| ns > 0.0),
            "churn {mode}: {text}"
        );
    }
    assert_eq!(
        v["torch_train"],
        serde_json::Value::Null,
        "no PyTorch here: {text}"
    );
    assert_eq!(
        v["context_overhead"]["ctx_overhead_raw_bytes"],
        300 * MIB,
        "the fake's contexts take 300 MiB: {text}"
    );
    assert_eq!(v["figures"]["ctx_charged_bytes"], 300 * MIB, "{text}");
    let checks = v["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 18, "{text}");
    assert!(
        checks
            .iter()
            .any(|c| c["name"] == "nvidia-smi" && c["status"] == "PASS"),
        "{text}"
    );
    let logs = dir.join("logs");
    assert!(logs.join("results.txt").exists() && logs.join("nvidia-smi.log").exists());
}

#[test]
fn an_uncapped_run_fails_the_checks() {
    // The control: a `gpucap` that runs the program without the shim. Each check that
    // can run here must then FAIL, saying what it saw, and the script exit 1.
    let dir = scratch("gpu-check-uncapped");
    let (py, has_pynvml) = python();
    let fake_cli = dir.join("gpucap");
    std::fs::write(
        &fake_cli,
        "#!/bin/sh\n\
         # an uncapped stand-in for gpucap: check passes, run execs the program as it is\n\
         case $1 in\n\
           --version) echo 'gpucap 0.0 (uncapped stand-in)'; exit 0 ;;\n\
           check) exit 0 ;;\n\
           run) while [ \"$1\" != -- ]; do shift; done; shift; exec \"$@\" ;;\n\
         esac\n\
         exit 2\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &fake_cli,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut c = on_fake_gpu(&dir);
    c.arg("--cli")
        .arg(&fake_cli)
        .arg("--python")
        .arg(&py)
        .args(["--only", "^(nvidia-smi|nvml|context-overhead)$"]);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert_eq!(
        verdict_of(&o, "nvidia-smi"),
        (
            "FAIL".into(),
            "nvidia-smi under gpucap shows memory.total 16999 MiB, not the 2048 MiB cap (card: 16999 MiB)".into()
        )
    );
    let (s, why) = verdict_of(&o, "context-overhead");
    assert_eq!(s, "FAIL");
    assert!(
        why.starts_with(
            "under gpucap the child's cuMemGetInfo total is 17179869184, not the cap 2147483648"
        ),
        "{why}"
    );
    let (s, why) = verdict_of(&o, "nvml");
    if has_pynvml {
        assert_eq!(s, "FAIL");
        assert!(
            // The card's 16 GiB and the driver's reserved 615 MiB (NVML's total).
            why.starts_with("nvmlDeviceGetMemoryInfo total is 17824808960"),
            "{why}"
        );
    } else {
        assert_eq!(s, "SKIP");
    }
    let failed = if has_pynvml { 3 } else { 2 };
    assert_eq!(
        last_line(&o),
        format!("0 passed, {failed} failed, {} skipped", 3 - failed)
    );
}

#[test]
fn the_report_probe_reads_gpucap_reports() {
    // scripts/gpu/probe.py `report` judges every capped check by gpucap's own JSON
    // report: it must read what gpucap writes, and say when the figures are wrong.
    let dir = scratch("gpu-check-report");
    let simple = compile_c("simple", "", &["-lcuda"]);
    let report = dir.join("report.json");
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.env("FAKECUDA_TOTAL_MEM", "1Gi")
        .args(["run", "--limit", "64Mi", "--report"])
        .arg(&report)
        .arg("--")
        .arg(&simple)
        .args(["32Mi", "48Mi"]);
    let o = run(&mut c);
    assert_ok(&o);
    let out = stdout(&o);
    let rcs: Vec<&str> = out.lines().filter(|l| l.starts_with("alloc ")).collect();
    assert_eq!(
        rcs,
        [
            format!("alloc {} 0", 32 * MIB),
            format!("alloc {} 2", 48 * MIB)
        ]
    );

    let probe = |args: &[&str]| {
        let o = run(Command::new("python3")
            .arg(root().join("scripts/gpu/probe.py"))
            .arg("report")
            .arg(&report)
            .args(args));
        (o.status.code(), last_line(&o))
    };
    let (rc, line) = probe(&[
        "--cap",
        "67108864",
        "--expect-refusal",
        "--min-peak",
        "33554432",
    ]);
    assert_eq!(rc, Some(0), "{line}");
    assert!(
        line.starts_with("OK: gpucap's report: 1 process(es), peak 32.0 MiB of the 64.0 MiB cap, 1 allocation(s), 1 refusal(s)"),
        "{line}"
    );
    let (rc, line) = probe(&["--cap", "134217728"]);
    assert_eq!(rc, Some(1), "{line}");
    assert!(line.contains("a cap of 67108864"), "{line}");
    let (rc, line) = probe(&["--cap", "67108864", "--min-peak", "50000000"]);
    assert_eq!(rc, Some(1), "{line}");
    assert!(line.contains("less than"), "{line}");
    let (rc, line) = probe(&["--cap", "67108864", "--growth"]);
    assert_eq!(rc, Some(1), "{line}");
    assert!(line.contains("did not run in growth mode"), "{line}");
    let (rc, line) = probe(&["--cap", "1"]);
    assert_eq!(rc, Some(1), "{line}");
    let missing = dir.join("none.json");
    let o = run(Command::new("python3")
        .arg(root().join("scripts/gpu/probe.py"))
        .arg("report")
        .arg(&missing)
        .args(["--cap", "1"]));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        last_line(&o).starts_with("FAIL: gpucap wrote no report at"),
        "{}",
        dump(&o)
    );
}
