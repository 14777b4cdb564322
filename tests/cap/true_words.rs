//! Words that mean what they say: growth mode's refusal line says
//! what is in use apart from what is kept for reuse; the exit summary and the report
//! name the refused request's real size; `--limit 50` suggests 50Gi and 50%; sizes in
//! decimal units are read as documented (`8GB` and `8gb` alike: 10^9 bytes each) and
//! said in binary units on the run's first line; a share below 1 % gets a note.

use super::common;

use std::path::Path;
use std::process::Command;

use common::*;

fn script() -> std::path::PathBuf {
    compile_c("script", "", &["-lcuda"])
}

fn gpucap(dir: &Path, args: &[&str]) -> Command {
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.args(args).env("FAKECUDA_TOTAL_MEM", "4Gi");
    c
}

#[test]
fn growth_refusal_says_kept_for_reuse_and_the_request_is_named_whole() {
    let dir = scratch("words-growth");
    let report = dir.join("r.json");
    let mut c = fake_cmd(script(), &dir.join("stats.json"));
    let o = run(preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", "16Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_GROWTH", "1")
        .env("GPUCAP_LOG", "info")
        .env("GPUCAP_REPORT", &report)
        .args(["alloc:900Mi", "free", "alloc:1100Mi"]));
    let err = stderr(&o);
    let refusal = err
        .lines()
        .find(|l| l.contains("refused"))
        .unwrap_or_else(|| panic!("no refusal\n{}", dump(&o)));
    assert!(
        refusal.ends_with(": 0 B in use and 900 MiB kept for reuse of the 1 GiB cap"),
        "{refusal}"
    );
    assert!(refusal.contains("of 1.07 GiB on GPU 0"), "{refusal}");
    // The exit summary and the report: the request's 1,100 MiB, not the 200 MiB it
    // needed beyond what was kept.
    let summary = err
        .lines()
        .find(|l| l.contains("refused (largest"))
        .unwrap_or_else(|| panic!("no summary\n{}", dump(&o)));
    assert!(summary.contains("(largest 1.07 GiB)"), "{summary}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let d = &doc["processes"][0]["devices"][0];
    assert_eq!(d["largest_refused"], 1100u64 << 20, "{doc}");
}

#[test]
fn a_bare_number_suggests_both_a_size_and_a_percentage() {
    let dir = scratch("words-50");
    let o = run(&mut gpucap(&dir, &["check", "--limit", "50"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    let err = stderr(&o);
    assert!(
        err.contains("did you mean 50Gi? (or 50%, a share of the GPU?)"),
        "{err}"
    );
    // Above 100 no percentage is meant.
    let o = run(&mut gpucap(&dir, &["check", "--limit", "512"]));
    assert!(!stderr(&o).contains("512%"), "{}", dump(&o));
}

#[test]
fn decimal_units_read_alike_in_any_case_and_are_said_in_binary_units() {
    let dir = scratch("words-decimal");
    for spelled in ["8GB", "8gb", "8Gb"] {
        let o = run(&mut gpucap(&dir, &["check", "--limit", spelled]));
        assert_ok(&o);
        let all = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            all.contains("8000000000 bytes, 7.45 GiB"),
            "{spelled}\n{all}"
        );
        assert!(all.contains("write 8Gi"), "{spelled}\n{all}");
    }
    // The run's first line says it, before the program's own output.
    let script = script();
    let o = run(&mut gpucap(
        &dir,
        &[
            "run",
            "--limit",
            "1gb",
            "--",
            script.to_str().unwrap(),
            "alloc:1Mi",
        ],
    ));
    assert_ok(&o);
    let first = stderr(&o).lines().next().unwrap_or_default().to_string();
    assert!(
        first.contains("1000000000 bytes, 953.67 MiB"),
        "{}",
        dump(&o)
    );
}

#[test]
fn a_share_below_one_percent_gets_a_note() {
    let dir = scratch("words-small");
    for v in ["0.5%", "0.005"] {
        let o = run(&mut gpucap(&dir, &["check", "--limit", v]));
        assert_ok(&o);
        assert!(stdout(&o).contains("below 1 %"), "{v}\n{}", dump(&o));
    }
    let o = run(&mut gpucap(&dir, &["check", "--limit", "1%"]));
    assert!(!stdout(&o).contains("below 1 %"), "{}", dump(&o));
    let script = script();
    let o = run(&mut gpucap(
        &dir,
        &[
            "run",
            "--limit",
            "0.5%",
            "--",
            script.to_str().unwrap(),
            "alloc:1Mi",
        ],
    ));
    assert!(stderr(&o).contains("below 1 %"), "{}", dump(&o));
}
