//! scripts/bench/bench-hami.sh: bad input is named, a "HAMi-core" that does not cap stops the
//! comparison; a short run on the fake GPU (valgrind) with gpucap in HAMi-core's place
//! measures all four ways within bounds, everywhere, CI included; and with
//! GPUCAP_TEST_HAMI_SRC (a HAMi-core source folder: CI has none, no registry it reaches
//! has HAMi-core) HAMi-core itself, each of gpucap's figures below HAMi-core's, and the
//! HAMi-core commit recorded.

use super::common;

use common::*;
use std::process::{Command, Output};

fn bench(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(root().join("scripts/bench/bench-hami.sh"));
    c.args(args)
        .env("BENCH_HAMI_SHIM", shim())
        .env("BENCH_HAMI_DRIVER", "fake")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn bad_input_is_named() {
    let dir = scratch("bench-hami-bad");
    let d = dir.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--bogus"],
            "unknown option --bogus (accepted: --so FILE, --out FILE, --build-only)",
        ),
        (
            vec![d],
            "is not a HAMi-core source folder (no src/libvgpu.c)",
        ),
        (
            vec!["--so", "/nonexistent/libvgpu.so"],
            "no HAMi-core build at /nonexistent/libvgpu.so",
        ),
        (vec![d, d], "one HAMI_SRC only"),
    ] {
        let o = bench(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains(want),
            "{args:?}: expected {want:?}\n{}",
            dump(&o)
        );
    }
}

/// The fake driver itself preloaded as if it were HAMi-core: nothing caps, so nothing is
/// compared (exit 1, said), rather than a table of an uncapped run.
#[test]
fn a_layer_that_does_not_cap_is_refused() {
    let fake = profile_dir().join("libcuda.so");
    let out = scratch("bench-hami-nocap").join("hami.json");
    let o = bench(
        &[
            "--so",
            fake.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stderr(&o).contains("hami did not refuse 128 MiB under a 64 MiB limit: it is not capping"),
        "{}",
        dump(&o)
    );
    assert!(!out.exists());
}

/// A short run of the whole comparison: REPS 1, 500 pairs, 3 starts, N pairs for the
/// instructions (callgrind); `so` the layer in HAMi-core's place, or `src` a HAMi-core
/// source folder to build. The JSON it wrote.
fn short_run(layer: &[&str], tag: &str) -> serde_json::Value {
    let out = scratch(tag).join("hami.json");
    let small = [
        ("REPS", "1"),
        ("PAIRS", "500"),
        ("STARTUP_RUNS", "3"),
        ("BENCH_HAMI_N", "200"),
    ];
    let mut args = layer.to_vec();
    args.extend(["--out", out.to_str().unwrap()]);
    let o = bench(&args, &small);
    assert!(o.status.success(), "{}", dump(&o));
    eprintln!("{}", stderr(&o));
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

/// An instruction figure of the run: `case` (pair, live10k, first) of `way`.
fn ir(v: &serde_json::Value, case: &str, way: &str) -> i64 {
    v["instructions"][case][way]
        .as_i64()
        .unwrap_or_else(|| panic!("no instructions.{case}.{way} in {v}"))
}

/// What every run must show of the raw driver and gpucap's two ways, whatever stands in
/// HAMi-core's place: each figure within sane bounds (the published ones, 2026-12-07: raw
/// 835 per 1 MiB pair, 2,127 with 10,000 live; gpucap +174 alone, +363 in a pool, +237 /
/// +430 live; first use x1.99 / x2.09 of 277,015), the pool's pair dearer than alone's (it
/// also reserves in the pool file), and the table and the JSON complete.
fn assert_gpucap_ways(v: &serde_json::Value) {
    let raw = ir(v, "pair", "raw");
    assert!((300..5_000).contains(&raw), "raw pair {raw}: {v}");
    let alone = ir(v, "pair", "gpucap") - raw;
    let pool = ir(v, "pair", "pool") - raw;
    assert!(
        (1..1_000).contains(&alone),
        "gpucap alone adds {alone} per pair: {v}"
    );
    assert!(
        alone < pool && pool < 2_000,
        "gpucap in a pool adds {pool} per pair, alone {alone}: {v}"
    );
    let live_raw = ir(v, "live10k", "raw");
    assert!(
        live_raw > raw && live_raw < 20_000,
        "raw with 10,000 live: {live_raw}: {v}"
    );
    for way in ["gpucap", "pool"] {
        let added = ir(v, "live10k", way) - live_raw;
        assert!(
            (-1_000..2_000).contains(&added),
            "{way} adds {added} per pair with 10,000 live: {v}"
        );
    }
    let first_raw = ir(v, "first", "raw");
    assert!(
        (10_000..100_000_000).contains(&first_raw),
        "raw first use {first_raw}: {v}"
    );
    for way in ["gpucap", "pool"] {
        let r = ir(v, "first", way) as f64 / first_raw as f64;
        assert!(
            (1.0..5.0).contains(&r),
            "{way}'s first use x{r:.2} of raw: {v}"
        );
    }
    for way in ["raw", "hami", "gpucap", "pool"] {
        for case in ["churn", "start"] {
            let ns = v["medians"][case][way].as_f64().unwrap();
            assert!(ns > 0.0 && ns < 1e9, "{case} {way}: {ns} (ns or us): {v}");
        }
    }
    // The floor any preloaded library pays at start, measured beside the ways.
    assert!(
        v["medians"]["start"]["empty"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let table = v["table"].as_str().unwrap();
    assert!(
        table.contains("start with an empty C library preloaded")
            && table.contains("| 1 MiB pair, instructions"),
        "{v}"
    );
}

/// The whole comparison runs everywhere, CI included (HAMi-core's source is not: see
/// below), with gpucap itself in HAMi-core's place: it takes HAMi-core's variables
/// (CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE: a pool in that file), so
/// that column must read as gpucap in a pool does.
#[test]
fn the_comparison_runs_on_the_fake_with_gpucap_in_hami_cores_place() {
    if !callgrind_benchmarks_run() {
        return;
    }
    let so = shim();
    let v = short_run(&["--so", so.to_str().unwrap()], "bench-hami-standin");
    assert_gpucap_ways(&v);
    let raw = ir(&v, "pair", "raw");
    let (standin, pool) = (ir(&v, "pair", "hami") - raw, ir(&v, "pair", "pool") - raw);
    assert!(
        (standin - pool).abs() <= 20,
        "gpucap in HAMi-core's place (a pool through HAMi-core's variables) adds {standin} \
         per pair, gpucap in a pool {pool}: the ways are not measured alike\n{v}"
    );
    // The README's row with 10,000 blocks live is this script's: its raw figure and
    // gpucap's two are this tree's, within LIVE_TOLERANCE (each counted run in a pool of
    // its own: before, this test's 200 pairs read +132 in a pool where 2,000 read +399).
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let perf = &readme[readme
        .find("\n## Performance")
        .expect("a Performance section")..];
    let line = perf
        .lines()
        .find(|l| l.starts_with("| the same with 10,000 blocks live |"))
        .expect("README's row with 10,000 blocks live");
    let cells: Vec<i64> = line
        .split('|')
        .skip(2)
        .filter(|c| !c.trim().is_empty())
        .map(|c| {
            c.chars()
                .filter(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap()
        })
        .collect();
    let live_raw = ir(&v, "live10k", "raw");
    let measured = [
        live_raw,
        ir(&v, "live10k", "gpucap") - live_raw,
        ir(&v, "live10k", "pool") - live_raw,
    ];
    let published = [cells[0], cells[2], cells[3]];
    assert!(
        published
            .iter()
            .zip(measured)
            .all(|(p, m)| (p - m).abs() <= LIVE_TOLERANCE),
        "README's 10,000-live row (raw, alone, pool) says {published:?}, this tree measures \
         {measured:?}: update the row from scripts/bench/bench-hami.sh\n{v}"
    );
}

/// How far the README's figures with 10,000 blocks live may be from this tree's, in
/// instructions per pair (this test's 200 pairs against the published run's 2,000: runs
/// of one tree agree within 3 where both are the script's; but the fifty-third session's
/// tree read +218 to +220 alone in this test where the script itself read +229 to +231,
/// at 200, 500, 1,000 and 2,000 pairs and with its environment padded: the live map's
/// probes follow the blocks' addresses, which this test's process is handed otherwise).
const LIVE_TOLERANCE: i64 = 16;

/// HAMi-core itself (GPUCAP_TEST_HAMI_SRC: a HAMi-core source folder, built by the
/// script): gpucap's ways within their bounds, and each of gpucap's added figures below
/// HAMi-core's (published, 2026-12-07: +1,782 against +174 / +363 a pair, +101,790
/// against +237 / +430 with 10,000 live, first use x4.70 against x1.99 / x2.09). HAMi-core's source is
/// on GitHub only: CI reaches crates.io, PyPI, Debian and npm, none of which has it, and
/// the repository does not carry it, so CI runs the comparison with gpucap in its place
/// (above) and this test says it did not run.
#[test]
fn a_short_run_beside_hami_core_on_the_fake() {
    let Ok(src) = std::env::var("GPUCAP_TEST_HAMI_SRC") else {
        eprintln!(
            "NOT RUN: GPUCAP_TEST_HAMI_SRC is not set (a HAMi-core source folder; CI has none: \
             no registry it reaches has HAMi-core). The comparison itself ran with gpucap in \
             HAMi-core's place (the_comparison_runs_on_the_fake_with_gpucap_in_hami_cores_place)"
        );
        return;
    };
    assert!(
        callgrind_benchmarks_run(),
        "GPUCAP_TEST_HAMI_SRC is set: the comparison needs valgrind and a release build"
    );
    let v = short_run(&[&src], "bench-hami-run");
    assert_eq!(v["hami_core_commit"].as_str().unwrap().len(), 40, "{v}");
    assert_gpucap_ways(&v);
    for case in ["pair", "live10k"] {
        let raw = ir(&v, case, "raw");
        let hami = ir(&v, case, "hami") - raw;
        for way in ["gpucap", "pool"] {
            let ours = ir(&v, case, way) - raw;
            assert!(
                ours < hami,
                "{case}: gpucap ({way}) adds {ours} per pair, HAMi-core {hami}\n{v}"
            );
        }
    }
    let first_raw = ir(&v, "first", "raw");
    for way in ["gpucap", "pool"] {
        assert!(
            ir(&v, "first", way) < ir(&v, "first", "hami"),
            "first use: gpucap ({way}) {} instructions, HAMi-core {} (raw {first_raw})\n{v}",
            ir(&v, "first", way),
            ir(&v, "first", "hami")
        );
    }
}
