//! The book's published figures as the tests read them (a paragraph's figures, the
//! README's copies) and the benchmark scripts' JSON.

use super::*;
use std::process::{Command, Output};

/// The first `n` figures (`1,085,838`, `**142**`) after `from` in the paragraph of
/// `docs/src/<page>` that starts with `marker` (a published benchmark's figures).
pub fn book_figures(page: &str, marker: &str, from: &str, n: usize) -> Vec<i64> {
    let book = std::fs::read_to_string(root().join("docs/src").join(page)).unwrap();
    let para = &book[book
        .find(marker)
        .unwrap_or_else(|| panic!("{page} has no paragraph {marker:?}"))..];
    let para = &para[..para.find("\n\n").unwrap_or(para.len())];
    let text = &para[para
        .find(from)
        .unwrap_or_else(|| panic!("{page}, {marker:?}: no {from:?} in\n{para}"))
        + from.len()..];
    let figures: Vec<i64> = text
        .split(|c: char| !c.is_ascii_digit() && c != ',')
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
        .take(n)
        .map(|w| w.replace(',', "").parse().unwrap())
        .collect();
    assert_eq!(
        figures.len(),
        n,
        "{page}, {marker:?} after {from:?}: {figures:?}"
    );
    figures
}

/// `n` as the documents write it: thousands separated by commas (61,431).
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Whether README.md states `figure` (as the documents write it, `thousands`) followed by
/// `after`: a figure the front page repeats from the page that owns it.
pub fn readme_states(figure: i64, after: &str) -> bool {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    readme.contains(&format!("{}{after}", thousands(figure)))
}

/// Runs a benchmark script of `scripts/bench/` (with `args`, and `env` set) that writes its
/// figures to `BENCH_JSON`, against this tree's build (no `BENCH_SHIM`, no
/// `LD_PRELOAD`): its output and the figures.
pub fn bench_json(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, serde_json::Value) {
    let json = scratch(script).join("figures.json");
    let mut cmd = Command::new(root().join("scripts/bench").join(script));
    cmd.args(args)
        .env("BENCH_JSON", &json)
        .env_remove("BENCH_SHIM")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run(&mut cmd);
    assert_ok(&o);
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (o, v)
}
