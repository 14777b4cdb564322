//! The documents' figures about the pool file are this tree's: every size of the file
//! that README.md, the book's pages and the Kubernetes manifests give (in KiB, per
//! member, and the bytes of a truncated-file message) is the size a pool file made by
//! this tree's shim has on disk, and the `--json` table's layout version is the one
//! `gpucap status --json` reports. A layout change that grows the file fails here until
//! every document says the new size.

use super::common;

use std::path::{Path, PathBuf};

use common::pool_scratch::*;
use common::*;

/// The size on disk, in bytes, of a pool file made with `members` slots (the fake GPU,
/// one member holding 1 MiB), and the layout version `gpucap status --json` reads in it.
fn pool_file(members: usize) -> (u64, u64) {
    let s = Scratch::new(&format!("doc-figures-{members}"));
    let mut c = fake_cmd(script(), &s.dir.join("stats.json"));
    let o = run(preload(&mut c)
        .arg("alloc:1Mi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_POOL", "figures")
        .env("GPUCAP_POOL_DIR", &s.pools)
        .env("GPUCAP_POOL_MEMBERS", members.to_string()));
    assert_ok(&o);
    let bytes = std::fs::metadata(s.pool_file("figures")).unwrap().len();
    let o = run(&mut s.gpucap(&["status", "--pool", "figures", "--json"]));
    assert_ok(&o);
    let json: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    (
        bytes,
        json["version"]
            .as_u64()
            .expect("status --json has a version"),
    )
}

/// The documents that describe the pool file: README.md, the book and the Kubernetes
/// examples, less performance.md and its log (their KiB are allocation sizes of benchmark
/// runs and the history of the pool file's sizes).
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = ["README.md", "scripts/k8s/README.md"]
        .iter()
        .map(|p| root().join(p))
        .collect();
    for dir in ["docs/src", "scripts/k8s"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md" || e == "yaml")
                && !path.ends_with("performance.md")
                && !path.ends_with("performance-log.md")
            {
                docs.push(path);
            }
        }
    }
    docs.sort();
    docs.dedup();
    docs
}

/// Every figure `<number> KiB` of a line that speaks of the file (`file`, `mapping`; not a
/// lone process's file mapped over the `ledger`'s figures, watching.md), with the text after it:
/// (document:line, figure, what follows).
fn kib_figures(path: &Path, text: &str) -> Vec<(String, f64, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        if (!lower.contains("file") && !lower.contains("mapping")) || lower.contains("ledger") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find(" KiB") {
            let before = &rest[..i];
            let start = before
                .rfind(|c: char| !(c.is_ascii_digit() || c == ',' || c == '.'))
                .map_or(0, |j| j + 1);
            let figure = before[start..].replace(',', "");
            if let Ok(v) = figure.trim_end_matches('.').parse::<f64>() {
                let where_ = format!("{}:{}", path.strip_prefix(root()).unwrap().display(), n + 1);
                out.push((where_, v, rest[i + 4..].chars().take(12).collect()));
            }
            rest = &rest[i + 4..];
        }
    }
    out
}

#[test]
fn the_documents_pool_file_figures_are_the_files_on_disk() {
    let sizes: Vec<(usize, u64)> = [256, 1000, 4096]
        .iter()
        .map(|&m| (m, pool_file(m).0))
        .collect();
    let (default_bytes, version) = pool_file(256);
    assert_eq!(default_bytes, sizes[0].1);
    let kib = |b: u64| (b as f64 / 1024.0).round();
    let per_member = (sizes[2].1 - sizes[0].1) as f64 / (4096.0 - 256.0) / 1024.0;
    let mut wrong = Vec::new();
    let mut seen = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (at, figure, after) in kib_figures(&doc, &text) {
            seen += 1;
            let ok = if after.starts_with(" per member") {
                (figure - per_member).abs() < 0.05 + 1e-9
            } else {
                sizes.iter().any(|&(_, b)| figure == kib(b))
            };
            if !ok {
                wrong.push(format!("{at}: {figure} KiB{after}"));
            }
        }
        // The truncated-file message's figure: "a version N pool file of its members is B".
        for (n, line) in text.lines().enumerate() {
            if let Some(i) = line.find("pool file of its members is ") {
                let b: String = line[i + 28..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                seen += 1;
                if b.parse::<u64>() != Ok(default_bytes) {
                    wrong.push(format!("{}:{}: {b} bytes", doc.display(), n + 1));
                }
            }
            if let Some(i) = line.find("the file's layout version (") {
                let v: String = line[i + 27..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                seen += 1;
                if v.parse::<u64>() != Ok(version) {
                    wrong.push(format!("{}:{}: layout version {v}", doc.display(), n + 1));
                }
            }
        }
    }
    assert!(
        seen >= 8,
        "found only {seen} figures: the scan lost its documents"
    );
    assert!(
        wrong.is_empty(),
        "figures that are not the pool file's (on disk: {} for 256, 1,000, 4,096 members; \
         {per_member:.2} KiB per member; layout version {version}):\n{}",
        sizes
            .iter()
            .map(|&(m, b)| format!("{m}: {b} B = {} KiB", kib(b)))
            .collect::<Vec<_>>()
            .join(", "),
        wrong.join("\n")
    );
}

/// The scan finds a figure that is wrong (the control: it cannot pass by finding none).
#[test]
fn the_figure_scan_reads_kib_figures_of_lines_about_the_file() {
    let text = "its file is 613 KiB, sparse\nthe stack takes 16 KiB per thread\nabout 3.1 KiB per member: 3,133 KiB for 1,000";
    let got = kib_figures(&root().join("x.md"), text);
    let figures: Vec<f64> = got.iter().map(|g| g.1).collect();
    assert_eq!(figures, vec![613.0]);
    let got = kib_figures(
        &root().join("x.md"),
        "the pool file is about 3.1 KiB per member: 3,133 KiB for 1,000",
    );
    let figures: Vec<(f64, bool)> = got
        .iter()
        .map(|g| (g.1, g.2.starts_with(" per member")))
        .collect();
    assert_eq!(figures, vec![(3.1, true), (3133.0, false)]);
}
