//! scripts/bench/bench-raise.sh, whose figures docs/src/pools.md publishes ("How soon a
//! waiter is served after a raise"), runs on this tree: a member waiting for room is
//! served after a live pool's cap is raised (`gpucap pool resize`) and after its own
//! ceiling is raised (`gpucap pool set`), and the script reports both.

use super::common;

use std::process::Command;

use common::*;

#[test]
fn the_raise_benchmark_serves_each_waiter_and_reports_it() {
    let o = run(Command::new(root().join("scripts/bench/bench-raise.sh"))
        .args(["--no-build", "--rounds", "2"])
        .env(
            "BENCH_RAISE_JSON",
            scratch("bench-raise").join("raise.json"),
        )
        .env_remove("LD_PRELOAD"));
    assert_ok(&o);
    let last = stdout(&o).lines().last().unwrap_or_default().to_string();
    let v: serde_json::Value =
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: {last}\n{}", dump(&o)));
    let results = v["results"].as_array().expect("results");
    let kinds: Vec<&str> = results.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds, ["resize", "ceiling"], "{v}");
    for r in results {
        let served = r["served_ms"].as_array().expect("served_ms");
        assert_eq!(served.len(), 2, "a figure per round: {r}");
        assert!(
            served.iter().all(|x| x.as_f64().is_some_and(|ms| ms > 0.0)),
            "{r}"
        );
    }
}
