//! scripts/bench/bench-start.sh, whose figures docs/src/performance.md publishes ("Starting many
//! processes"), runs on this tree: every way (raw, gpucap alone, a pool, a claim's pool) starts its
//! processes and each holds its block, with and without a context delay, and beside them the
//! floor (`--floor`: tests/c/start_floor.c, whose steps end the process if one fails); and the book's
//! start instructions (`--instructions`, counted by callgrind) are this tree's.

use super::common;

use std::process::Command;

use common::*;

fn bench(args: &[&str]) -> serde_json::Value {
    let o = run(Command::new(root().join("scripts/bench/bench-start.sh"))
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
    let four = ["raw", "alone", "pool", "claim"];
    let five = ["raw", "alone", "pool", "claim", "floor"];
    for (args, delay, expected) in [
        (&["-n", "8"][..], 0, &four[..]),
        (
            &["-n", "4", "--context-delay-ms", "100"][..],
            100,
            &four[..],
        ),
        (&["-n", "8", "--floor"][..], 0, &five[..]),
    ] {
        let v = bench(args);
        assert_eq!(v["context_delay_ms"], delay, "{v}");
        let results = v["results"].as_array().expect("results");
        let ways: Vec<&str> = results.iter().filter_map(|r| r["way"].as_str()).collect();
        assert_eq!(ways, expected, "{v}");
        for r in results {
            let all = r["all_ms_median"].as_f64().expect("all_ms_median");
            // Every process held its block: the start took at least one context's making.
            assert!(all >= delay as f64, "{r}");
            assert!(r["ratio_to_raw"].as_f64().is_some(), "{r}");
            // One ratio a round, each against the raw start of its round (raw's own: 1).
            let rounds = r["round_ratios"].as_array().expect("round_ratios");
            assert_eq!(rounds.len(), r["all_ms"].as_array().unwrap().len(), "{r}");
            if r["way"] == "raw" {
                assert!(rounds.iter().all(|x| x.as_f64() == Some(1.0)), "{r}");
            }
        }
    }
}

/// Within this many instructions a published start figure still holds (the counts repeat
/// exactly run to run: a fixed environment, fixed paths; this leaves room for a machine
/// whose C library picks other string routines).
const START_TOLERANCE: i64 = 3_000;

/// The book's start instructions (docs/src/performance.md, "**Start instructions.**": raw,
/// gpucap, added, pool, added) are what `scripts/bench/bench-start.sh --instructions` counts on
/// this tree, and the count does not depend on the caller's environment or directory.
#[test]
fn the_published_start_instructions_are_this_trees() {
    if !callgrind_benchmarks_run() {
        return;
    }
    let published = book_figures("performance.md", "**Start instructions.**", "raw ", 5);
    // The front page repeats the added figure from the book.
    assert!(
        readme_states(published[2], "]"),
        "README.md does not state the book's start figure ({})",
        thousands(published[2])
    );
    let count = |dir: &std::path::Path, extra: &[(&str, &str)]| {
        let json = scratch("start-instructions").join("figures.json");
        let mut cmd = Command::new(root().join("scripts/bench/bench-start.sh"));
        cmd.args(["--no-build", "--instructions"])
            .current_dir(dir)
            .env("BENCH_JSON", &json)
            .env_remove("LD_PRELOAD")
            .env_remove("BENCH_START_SHIM");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let o = run(&mut cmd);
        assert_ok(&o);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let get = |k: &str| v[k].as_i64().unwrap_or_else(|| panic!("no {k} in {v}"));
        (
            [
                get("raw"),
                get("gpucap"),
                get("added"),
                get("pool"),
                get("pool_added"),
            ],
            stdout(&o),
        )
    };
    let (measured, out) = count(&root(), &[]);
    for (what, (p, m)) in ["raw", "gpucap", "added", "pool", "pool added"]
        .iter()
        .zip(published.iter().zip(measured))
    {
        assert!(
            (p - m).abs() <= START_TOLERANCE,
            "docs/src/performance.md, start instructions, {what}: published {p}, this tree \
             counts {m} (scripts/bench/bench-start.sh --instructions; update the book)\n{out}"
        );
    }
    // Another directory, a larger environment, a deep TMPDIR: the same count.
    let deep = scratch("start-elsewhere").join("e".repeat(150));
    std::fs::create_dir_all(&deep).unwrap();
    let padding: Vec<(String, String)> = (0..50)
        .map(|i| (format!("PADDING_{i}"), "x".repeat(i)))
        .collect();
    let mut extra: Vec<(&str, &str)> = padding
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    extra.push(("TMPDIR", deep.to_str().unwrap()));
    let (elsewhere, out) = count(&deep, &extra);
    // Within a few hundred: the process's pid is printed into names and files (its
    // digits, and so the work of formatting them, change from run to run).
    for (a, b) in measured.iter().zip(elsewhere) {
        assert!(
            (a - b).abs() <= 500,
            "the start's count moved with the caller's directory and environment: \
             {measured:?} here, {elsewhere:?} there\n{out}"
        );
    }
}
