//! scripts/bench/bench-instructions.sh: (with valgrind, which scripts/test.sh installs) a short
//! run measures the build `BENCH_SHIM` names in every row, so that an older build can be
//! measured beside the current one.

use super::common;

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
    let o = run(
        Command::new(root().join("scripts/bench/bench-instructions.sh"))
            .args(["200", "0"])
            .env("BENCH_SHIM", &empty)
            .env("BENCH_JSON", &json)
            .env("BSIZES", "4Ki")
            .env_remove("LD_PRELOAD"),
    );
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

/// How far a published instruction figure may be from what the tree measures, in
/// instructions per pair: runs of the same tree agree within 3, and the README's pool
/// figure (scripts/bench/bench-hami.sh's run) and the book's (scripts/bench/bench-instructions.sh's)
/// differ by 5; a change to the path of an allocation of more than this must update them.
const TOLERANCE: i64 = 10;

/// The figure in a table cell: `818`, `+1,776`, `**169**`.
fn figure(cell: &str) -> i64 {
    let digits: String = cell
        .chars()
        .filter(|c| !matches!(c, '+' | ',' | '*' | ' '))
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no figure in the cell {cell:?}"))
}

/// The cells after the label of the table row of `text` that starts with `| label |`.
fn row<'a>(text: &'a str, label: &str, file: &str) -> Vec<&'a str> {
    let start = format!("| {label} |");
    let line = text
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("{file} has no row starting {start:?}"));
    line[start.len()..]
        .trim_end_matches('|')
        .split('|')
        .map(str::trim)
        .collect()
}

/// scripts/bench/bench-instructions.sh's first rows (BENCH_ONLY=pair), 2,000 vs 4,000 pairs of
/// `size` blocks: (raw, gpucap alone, gpucap in a pool) per pair.
fn measure_pairs(size: &str) -> (i64, i64, i64) {
    let dir = scratch("bench-instructions-published");
    let json = dir.join("pair.json");
    let o = run(
        Command::new(root().join("scripts/bench/bench-instructions.sh"))
            .arg("2000")
            .env("BENCH_ONLY", "pair")
            .env("BSIZE", size)
            .env("BENCH_JSON", &json)
            .env_remove("BENCH_SHIM")
            .env_remove("LD_PRELOAD"),
    );
    assert_ok(&o);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let get = |k: &str| v[k].as_i64().unwrap_or_else(|| panic!("no {k} in {v}"));
    eprintln!("{size} blocks: {}", stdout(&o).trim());
    (
        get("raw_per_pair"),
        get("gpucap_per_pair"),
        get("pool_per_pair"),
    )
}

/// The instruction figures the README and the book publish for one allocation and free
/// (README "Performance", 1 MiB blocks: raw, gpucap alone, in a pool; its row with
/// 10,000 blocks live is bench_hami's; docs/src/performance.md's 4 KiB rows)
/// are read from the files themselves and measured on this tree: each within TOLERANCE,
/// or the test fails (a change that moves them must update the figures). The launch row:
/// [`the_published_launch_figures_are_this_trees`].
#[test]
fn the_published_instruction_figures_are_this_trees() {
    if !callgrind_benchmarks_run() {
        return;
    }
    let mut wrong = Vec::new();
    let mut check = |what: String, published: i64, measured: i64| {
        let ok = (published - measured).abs() <= TOLERANCE;
        eprintln!(
            "{what}: published {published}, measured {measured}{}",
            if ok { "" } else { "  <-- off" }
        );
        if !ok {
            wrong.push(format!(
                "{what}: published {published}, this tree measures {measured}"
            ));
        }
    };

    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let perf = &readme[readme
        .find("\n## Performance")
        .expect("README.md has a Performance section")..];
    let cells = row(
        perf,
        "1 MiB `cuMemAlloc`+`cuMemFree`, instructions",
        "README.md",
    );
    assert_eq!(cells.len(), 4, "raw, HAMi-core, alone, pool: {cells:?}");
    let (raw, alone, pool) = measure_pairs("1Mi");
    check(
        "README, 1 MiB pair, raw driver".into(),
        figure(cells[0]),
        raw,
    );
    check(
        "README, 1 MiB pair, gpucap alone (added)".into(),
        figure(cells[2]),
        alone - raw,
    );
    check(
        "README, 1 MiB pair, gpucap in a pool (added)".into(),
        figure(cells[3]),
        pool - raw,
    );

    let book = std::fs::read_to_string(root().join("docs/src/performance.md")).unwrap();
    let (raw, alone, pool) = measure_pairs("4Ki");
    for (label, what, measured) in [
        ("one visible GPU, 1 thread", "alone", alone),
        ("as a member of a pool (`GPUCAP_POOL`)", "in a pool", pool),
    ] {
        let cells = row(&book, label, "docs/src/performance.md");
        let file = "docs/src/performance.md, 4 KiB pair";
        check(format!("{file}, {what}: raw"), figure(cells[0]), raw);
        check(
            format!("{file}, {what}: gpucap"),
            figure(cells[1]),
            measured,
        );
        check(
            format!("{file}, {what}: added"),
            figure(cells[2]),
            measured - raw,
        );
    }
    assert!(
        wrong.is_empty(),
        "published instruction figures off by more than {TOLERANCE} per pair from this tree \
         (measure with scripts/bench/bench-instructions.sh and update README.md's Performance \
         table and docs/src/performance.md):\n{}",
        wrong.join("\n")
    );
}

/// The book's cost of a kernel launch after its first (docs/src/performance.md, "Cost per
/// kernel launch": raw, gpucap, added, the first three figures after "raw fake") is
/// measured on this tree (`BENCH_ONLY=launch`): each within TOLERANCE. The figure
/// published before (added 78) was left from before kernel handles were keyed by
/// context, when the tree measured 258.
#[test]
fn the_published_launch_figures_are_this_trees() {
    if !callgrind_benchmarks_run() {
        return;
    }
    let published = book_figures(
        "performance.md",
        "**Cost per kernel launch.**",
        "raw fake",
        3,
    );
    let (o, v) = bench_json(
        "bench-instructions.sh",
        &["2000"],
        &[("BENCH_ONLY", "launch")],
    );
    let get = |k: &str| v[k].as_i64().unwrap_or_else(|| panic!("no {k} in {v}"));
    let measured = [get("launch_raw"), get("launch_gpucap"), get("launch_added")];
    for (what, (p, m)) in ["raw", "gpucap", "added"]
        .iter()
        .zip(published.iter().zip(measured))
    {
        assert!(
            (p - m).abs() <= TOLERANCE,
            "docs/src/performance.md, kernel launch, {what}: published {p}, this tree measures {m} \
             (scripts/bench/bench-instructions.sh's launch row; update the book)\n{}",
            stdout(&o)
        );
    }
}
