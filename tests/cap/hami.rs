//! HAMi-core's CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_MEMORY_LIMIT_<n> on the fake GPU:
//! the shim caps at them, `gpucap check` says where the cap came from, bad values and
//! disagreements stop `check`/`run` (exit 2) and the shim (fail closed).

use super::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MIB: u64 = 1 << 20;

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// `script STEPS` on a 1 GiB fake GPU under the shim, with `env` set.
fn capped(stats: &Path, env: &[(&str, &str)], steps: &[&str]) -> Output {
    let mut c = fake_cmd(script(), stats);
    preload(&mut c).env("FAKECUDA_TOTAL_MEM", "1Gi").args(steps);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

/// The N of the `filled N` line.
fn filled(o: &Output) -> u64 {
    stdout(o)
        .lines()
        .find_map(|l| l.strip_prefix("filled "))
        .unwrap_or_else(|| panic!("no filled line\n{}", dump(o)))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn the_device_plugins_per_gpu_mib_cap_binds_like_gpucap_limit() {
    let dir = scratch("hami-oom");
    for (env, cap) in [
        (vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "64m")], 64 * MIB),
        (vec![("CUDA_DEVICE_MEMORY_LIMIT", "96m")], 96 * MIB),
        (vec![("CUDA_DEVICE_MEMORY_LIMIT", "131072k")], 128 * MIB),
        (
            vec![
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "32M"),
            ],
            32 * MIB,
        ),
        // Agreeing with GPUCAP_LIMIT is allowed.
        (
            vec![
                ("GPUCAP_LIMIT", "48Mi"),
                ("CUDA_DEVICE_MEMORY_LIMIT", "48m"),
            ],
            48 * MIB,
        ),
    ] {
        let stats = dir.join("s.json");
        let o = capped(&stats, &env, &["fill:16777216", "info"]);
        assert!(o.status.success(), "{env:?}\n{}", dump(&o));
        // Blocks of 16 MiB until one is refused: exactly cap / 16 MiB fit.
        assert_eq!(filled(&o) * 16 * MIB, cap, "{env:?}\n{}", dump(&o));
        let peak = read_stats(&stats)[0].peak_used;
        assert!(peak <= cap, "{env:?}: driver peak {peak} > cap {cap}");
        let refused = refusals(&stderr(&o));
        assert!(
            !refused.is_empty(),
            "{env:?}: no refusal line\n{}",
            dump(&o)
        );
    }
    // Control: without a variable the same program fills far more of the 1 GiB GPU.
    let stats = dir.join("s.json");
    let o = capped(&stats, &[], &["fill:16777216"]);
    assert!(filled(&o) * 16 * MIB > 128 * MIB, "{}", dump(&o));
}

#[test]
fn values_hami_core_reads_otherwise_fail_closed_in_the_shim() {
    let dir = scratch("hami-bad");
    for (name, value, why) in [
        ("CUDA_DEVICE_MEMORY_LIMIT", "1Gi", "1 byte there"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "010m", "octal"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "abc", "no limit"),
        ("CUDA_DEVICE_MEMORY_LIMT", "8g", "a typo?"),
    ] {
        let stats = dir.join("s.json");
        let o = capped(&stats, &[(name, value)], &["alloc:1048576"]);
        let err = stderr(&o);
        let line = format!("gpucap: invalid {name}={value:?}: ");
        assert!(
            err.lines().any(|l| l.starts_with(&line) && l.contains(why)),
            "{name}={value}\n{}",
            dump(&o)
        );
        assert!(
            !stdout(&o).contains("alloc 1048576 0"),
            "{name}={value}: allocated\n{}",
            dump(&o)
        );
    }
}

fn gpucap(args: &[&str], stats: &Path, env: &[(&str, &str)]) -> Command {
    let mut c = fake_cmd(cli(), stats);
    c.args(args).env("FAKECUDA_TOTAL_MEM", "4Gi");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

#[test]
fn check_says_where_the_limit_came_from() {
    let dir = scratch("hami-check");
    let stats = dir.join("s.json");
    let env = [
        ("FAKECUDA_DEVICES", "2"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_1", "8192m"),
        ("CUDA_DEVICE_SM_LIMIT", "50"),
    ];
    let o = run(&mut gpucap(&["check"], &stats, &env));
    assert_ok(&o);
    let out = stdout(&o);
    for want in [
        "limit source: from CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_1",
        "GPU 0: cap 2147483648 bytes (2 GiB) of",
        "(from CUDA_DEVICE_MEMORY_LIMIT)",
        "GPU 1: cap 8589934592 bytes (8 GiB) of",
        "(from CUDA_DEVICE_MEMORY_LIMIT_1)",
        "note: CUDA_DEVICE_SM_LIMIT is HAMi-core's compute (SM) limit",
    ] {
        assert!(out.contains(want), "missing {want:?}\n{}", dump(&o));
    }

    // --write-env writes the resolved GPUCAP_LIMIT, which the shim reads back.
    let file = dir.join("gpucap.env");
    let o = run(&mut gpucap(
        &["check", "--write-env", file.to_str().unwrap()],
        &stats,
        &env,
    ));
    assert_ok(&o);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.lines()
            .any(|l| l == "GPUCAP_LIMIT=2147483648,1=8589934592"),
        "{text}"
    );
}

#[test]
fn check_and_run_refuse_disagreement_bad_values_and_invisible_gpus() {
    let dir = scratch("hami-refuse");
    let stats = dir.join("s.json");
    let marker = dir.join("started");
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("GPUCAP_LIMIT", "8Gi"), ("CUDA_DEVICE_MEMORY_LIMIT", "4g")],
            "gpucap: invalid GPUCAP_LIMIT=\"8Gi\": disagrees with HAMi-core's",
        ),
        (
            vec![("CUDA_DEVICE_MEMORY_LIMIT_0", "8GiB")],
            "gpucap: invalid CUDA_DEVICE_MEMORY_LIMIT_0=\"8GiB\": HAMi-core reads only the last character",
        ),
        (
            vec![("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")],
            "gpucap: CUDA_DEVICE_MEMORY_LIMIT_1 names GPU 1, but only 1 GPU is visible",
        ),
    ];
    for (env, want) in cases {
        let o = run(&mut gpucap(&["check"], &stats, &env));
        assert_eq!(o.status.code(), Some(2), "{env:?}\n{}", dump(&o));
        assert!(
            stderr(&o).lines().any(|l| l.starts_with(want)),
            "{env:?}\n{}",
            dump(&o)
        );
        let m = marker.to_str().unwrap();
        let o = run(&mut gpucap(&["run", "--", "touch", m], &stats, &env));
        assert_eq!(o.status.code(), Some(2), "{env:?}\n{}", dump(&o));
        assert!(
            stderr(&o).lines().any(|l| l.starts_with(want)),
            "{env:?}\n{}",
            dump(&o)
        );
        assert!(!marker.exists(), "{env:?}: the program ran\n{}", dump(&o));
    }
    // The shim stops a program at cuInit on an invisible ordinal, with the same line.
    let o = capped(
        &stats,
        &[("CUDA_DEVICE_MEMORY_LIMIT_1", "1g")],
        &["alloc:1048576"],
    );
    assert!(
        stderr(&o).lines().any(
            |l| l.starts_with("gpucap: CUDA_DEVICE_MEMORY_LIMIT_1 names GPU 1, but only 1 GPU")
        ),
        "{}",
        dump(&o)
    );
    assert!(!stdout(&o).contains("alloc 1048576 0"), "{}", dump(&o));
}

/// HAMi-core variables gpucap does not act on are said in the program's stderr at the
/// default log level, never passed over silently: the SM limit. (The shared cache is
/// the pool's file: tests/pool/pool/sharing.rs.)
#[test]
fn variables_gpucap_does_not_act_on_are_said_at_the_default_level() {
    let dir = scratch("hami-notes");
    let stats = dir.join("s.json");
    let env = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "64m"),
        ("CUDA_DEVICE_SM_LIMIT", "50"),
    ];
    let o = capped(&stats, &env, &["fill:16777216"]);
    assert!(o.status.success(), "{}", dump(&o));
    let err = stderr(&o);
    {
        let name = "CUDA_DEVICE_SM_LIMIT";
        assert_eq!(
            err.lines().filter(|l| l.contains(name)).count(),
            1,
            "one line naming {name}\n{}",
            dump(&o)
        );
    }
    assert_eq!(filled(&o) * 16 * MIB, 64 * MIB, "{}", dump(&o));
}
