//! scripts/bench-start.sh, whose figures docs/src/performance.md publishes ("Starting many
//! processes"), runs on this tree: every way (raw, gpucap alone, a pool) starts its
//! processes and each holds its block, with and without a context delay.

mod common;

use std::process::Command;

use common::*;

fn bench(args: &[&str]) -> serde_json::Value {
    let o = run(Command::new(root().join("scripts/bench-start.sh"))
        .args(["--no-build", "--rounds", "1"])
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("BENCH_START_SHIM"));
    assert_ok(&o);
    let last = stdout(&o).lines().last().unwrap_or_default().to_string();
    serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}\n{}", dump(&o)))
}

#[test]
fn the_start_benchmark_starts_every_way_and_reports_it() {
    for (args, delay) in [
        (&["-n", "8"][..], 0),
        (&["-n", "4", "--context-delay-ms", "100"][..], 100),
    ] {
        let v = bench(args);
        assert_eq!(v["context_delay_ms"], delay, "{v}");
        let results = v["results"].as_array().expect("results");
        let ways: Vec<&str> = results.iter().filter_map(|r| r["way"].as_str()).collect();
        assert_eq!(ways, ["raw", "alone", "pool"], "{v}");
        for r in results {
            let all = r["all_ms_median"].as_f64().expect("all_ms_median");
            // Every process held its block: the start took at least one context's making.
            assert!(all >= delay as f64, "{r}");
            assert!(r["ratio_to_raw"].as_f64().is_some(), "{r}");
        }
    }
}
