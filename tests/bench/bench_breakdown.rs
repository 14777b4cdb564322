//! scripts/bench/bench-breakdown.sh: a bad N is named, and (with valgrind, which scripts/test.sh
//! installs) a short run on the fake GPU attributes the shim's instructions per pair to
//! its source files, the pool's share to the pool's files.

use super::common;

use common::*;
use std::process::{Command, Output};

fn breakdown(args: &[&str]) -> Output {
    let mut c = Command::new(root().join("scripts/bench/bench-breakdown.sh"));
    c.args(args).env_remove("LD_PRELOAD");
    run(&mut c)
}

#[test]
fn a_bad_count_is_named() {
    for (args, want) in [
        (
            vec!["abc"],
            "N must be a whole number of pairs, 1 to 9999999 (got 'abc')",
        ),
        (
            vec!["0"],
            "N must be a whole number of pairs, 1 to 9999999 (got '0')",
        ),
        (vec!["10", "20"], "one argument at most, N (got 2)"),
    ] {
        let o = breakdown(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains(want),
            "{args:?}: expected {want:?}\n{}",
            dump(&o)
        );
    }
}

/// The instructions per pair of one way (`alone:` or `pool:`), and its rows by file.
fn way<'a>(out: &'a str, name: &str) -> (u64, Vec<(u64, &'a str)>) {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(name));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no {name} in\n{out}"));
    let total = head
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no total in {head:?}"));
    let rows = lines
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            let mut w = l.split_whitespace();
            let n = w.next().unwrap().parse().unwrap();
            (n, w.nth(2).unwrap())
        })
        .collect();
    (total, rows)
}

#[test]
fn a_short_run_attributes_each_way_s_instructions_to_its_files() {
    if !callgrind_benchmarks_run() {
        return;
    }
    let o = breakdown(&["200"]);
    assert!(o.status.success(), "{}", dump(&o));
    let out = stdout(&o);
    let (alone, alone_rows) = way(&out, "alone:");
    let (pool, pool_rows) = way(&out, "pool:");
    let files = |rows: &[(u64, &str)]| rows.iter().map(|r| r.1.to_string()).collect::<Vec<_>>();
    // Each way's rows add up to its total (whole instructions, rounded per row).
    for (total, rows) in [(alone, &alone_rows), (pool, &pool_rows)] {
        let sum: u64 = rows.iter().map(|r| r.0).sum();
        assert!(
            sum.abs_diff(total) <= rows.len() as u64,
            "{sum} vs {total}\n{out}"
        );
    }
    // Alone: the hooks, the ledger and the live map, nothing of a pool's.
    for f in [
        "shim/table.rs",
        "core/ledger/device.rs",
        "core/live_map/front.rs",
    ] {
        assert!(files(&alone_rows).contains(&f.to_string()), "{f}\n{out}");
    }
    assert!(
        !files(&alone_rows)
            .iter()
            .any(|f| f.starts_with("core/budget/")),
        "a lone process runs no pool code\n{out}"
    );
    // In a pool: the pool's own files too, and more instructions in all.
    for f in ["core/budget/used.rs", "core/budget/marks.rs"] {
        assert!(files(&pool_rows).contains(&f.to_string()), "{f}\n{out}");
    }
    assert!(pool > alone, "{pool} vs {alone}\n{out}");
}
