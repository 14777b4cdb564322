//! scripts/bench-hami.sh: bad input is named, a "HAMi-core" that does not cap stops the
//! comparison, and (with GPUCAP_TEST_HAMI_SRC, a HAMi-core source folder, and valgrind) a
//! short run on the fake GPU measures all four ways and records the HAMi-core commit.

mod common;

use common::*;
use std::process::{Command, Output};

fn bench(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(root().join("scripts/bench-hami.sh"));
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

#[test]
fn a_short_run_beside_hami_core_on_the_fake() {
    let Ok(src) = std::env::var("GPUCAP_TEST_HAMI_SRC") else {
        eprintln!("GPUCAP_TEST_HAMI_SRC not set (a HAMi-core source folder): skipped");
        return;
    };
    let out = scratch("bench-hami-run").join("hami.json");
    let small = [
        ("REPS", "1"),
        ("PAIRS", "500"),
        ("STARTUP_RUNS", "3"),
        ("BENCH_HAMI_N", "50"),
    ];
    let o = bench(&[&src, "--out", out.to_str().unwrap()], &small);
    assert!(o.status.success(), "{}", dump(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["hami_core_commit"].as_str().unwrap().len(), 40, "{v}");
    for way in ["raw", "hami", "gpucap", "pool"] {
        for case in ["pair", "live10k", "first"] {
            assert!(
                v["instructions"][case][way].as_u64().unwrap() > 0,
                "{case} {way}: {v}"
            );
        }
        assert!(v["medians"]["churn"][way].as_f64().unwrap() > 0.0, "{v}");
    }
    // The floor any preloaded library pays at start, measured beside the ways.
    assert!(
        v["medians"]["start"]["empty"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(
        v["table"]
            .as_str()
            .unwrap()
            .contains("start with an empty C library preloaded"),
        "{v}"
    );
    assert!(
        v["table"]
            .as_str()
            .unwrap()
            .contains("| 1 MiB pair, instructions"),
        "{v}"
    );
}
