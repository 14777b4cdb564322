//! scripts/bench-instructions.sh: (with valgrind, which scripts/test.sh installs) a short
//! run measures the build `BENCH_SHIM` names in every row, so that an older build can be
//! measured beside the current one.

mod common;

use common::*;
use std::process::Command;

/// Every "added N" figure of the script's output.
fn added_figures(out: &str) -> Vec<(i64, &str)> {
    out.lines()
        .flat_map(|l| {
            l.split("added ").skip(1).map(move |rest| {
                let n = rest
                    .split(|c: char| c != '-' && !c.is_ascii_digit())
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("no figure after 'added' in {l:?}"));
                (n, l)
            })
        })
        .collect()
}

#[test]
fn every_row_measures_the_build_bench_shim_names() {
    if !callgrind_benchmarks_run() {
        return;
    }
    // A library that does nothing, in place of the shim: every row adds next to nothing
    // to the raw driver (200 pairs: with 20 the set-up's own variation left up to 22 per
    // pair; gpucap adds 78 or more to every row). Before, the pool's guarantee row
    // measured target/release's libgpucap.so whatever BENCH_SHIM said: ~400 added here.
    let dir = scratch("bench-instructions");
    std::fs::write(dir.join("empty.c"), "int bench_empty;\n").unwrap();
    let empty = dir.join("libempty.so");
    assert_ok(&run(Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&empty)
        .arg(dir.join("empty.c"))));
    let json = dir.join("out.json");
    let o = run(Command::new(root().join("scripts/bench-instructions.sh"))
        .args(["200", "0"])
        .env("BENCH_SHIM", &empty)
        .env("BENCH_JSON", &json)
        .env("BSIZES", "4Ki")
        .env_remove("LD_PRELOAD"));
    assert_ok(&o);
    let out = stdout(&o);
    let figures = added_figures(&out);
    // The pair, the pool, the guarantee row, two GPUs, two threads, the launch, 0 live,
    // two growth rows.
    assert!(figures.len() >= 9, "{out}");
    for (a, line) in figures {
        assert!(
            a.abs() < 20,
            "{a} added by a library that does nothing: {line}\n{out}"
        );
    }
    let written = std::fs::read_to_string(&json).unwrap();
    assert!(written.contains("\"shares_added_per_pair\":"), "{written}");
}
