//! A pool's allocation path under load: members' threads allocate and free 1 MiB again
//! and again (`tests/c/pool_pairs.c`), with and without guarantees, on the short path
//! (`cuMemAlloc_v2`) and the full one (`cuMemAllocManaged`). Every member's use stays
//! far below the pool's cap (its context and a block per thread, guarantees included:
//! a few GiB of 64 GiB), so every refusal counted is one made with room under the cap,
//! and any fails the test. The cases run one after another, each with the machine to
//! itself: the race this guards against needs two threads of one member on two cores
//! at once, which cases side by side on a 2-core machine make rare.

use super::common;

use common::*;
use std::path::Path;
use std::process::{Child, Stdio};

/// Pairs per thread: `GPUCAP_STRESS_PAIRS` if set, else the case's own (sized so that
/// the cases take a few seconds on an idle 2-core machine, 20 to 30 on a loaded one).
fn pairs(case: &Case) -> u64 {
    std::env::var("GPUCAP_STRESS_PAIRS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(case.pairs)
}

/// One run of the pool's members, all pairing at once.
struct Case {
    members: usize,
    threads: usize,
    /// Pairs per thread (see [`pairs`]).
    pairs: u64,
    /// `plain`, `managed` or `mixed` (see `pool_pairs.c`).
    kind: &'static str,
    /// `GPUCAP_GUARANTEE` of every other member (the first, third, ...), if any.
    guarantee: Option<&'static str>,
}

fn member(dir: &Path, i: usize, case: &Case) -> Child {
    let prog = compile_c("pool_pairs", "", &["-lcuda"]);
    let mut c = fake_cmd(prog, &dir.join(format!("stats{i}.json")));
    preload(&mut c)
        .env("FAKECUDA_ARENA", "1")
        .env("FAKECUDA_CONTEXT_MEM", "256Mi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
        .env("GPUCAP_LIMIT", "64Gi")
        .env("GPUCAP_POOL", "stress")
        .env("GPUCAP_POOL_DIR", dir);
    if let Some(g) = case.guarantee.filter(|_| i.is_multiple_of(2)) {
        c.env("GPUCAP_GUARANTEE", g);
    }
    c.arg(case.threads.to_string())
        .arg(pairs(case).to_string())
        .args(["1Mi", case.kind])
        .arg(dir.join(format!("ready{i}")))
        .arg(dir.join("go"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pool_pairs")
}

/// Runs `case` in a fresh pool: a line per member that was refused (its count and its
/// first refusal line), empty if none was.
fn run_case(tag: &str, case: &Case) -> Vec<String> {
    let dir = scratch(tag);
    let mut children: Vec<Child> = (0..case.members).map(|i| member(&dir, i, case)).collect();
    for (i, c) in children.iter_mut().enumerate() {
        wait_ready(
            c,
            &dir.join(format!("ready{i}")),
            &format!("{tag}: member {i}"),
        );
    }
    std::fs::write(dir.join("go"), "").unwrap();
    let mut report = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{tag}: member {i}: {}", dump(&o));
        let out = stdout(&o);
        let count = |key: &str| -> u64 {
            out.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{tag}: member {i}: no {key} in its line\n{}", dump(&o)))
        };
        let (ok, refused) = (count("ok="), count("refused="));
        assert_eq!(
            ok + refused,
            case.threads as u64 * pairs(case),
            "{tag}: member {i}: not every pair was made\n{}",
            dump(&o)
        );
        if refused > 0 {
            let first = refusals(&stderr(&o)).into_iter().next().unwrap_or_default();
            report.push(format!(
                "{tag} ({} members x {} threads x {} pairs, {}{}): member {i}: {refused} \
                 refused; first: {first}",
                case.members,
                case.threads,
                pairs(case),
                case.kind,
                case.guarantee
                    .map_or(String::new(), |g| format!(", guarantees of {g}")),
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    report
}

#[test]
fn pair_loops_in_a_pool_are_never_refused_below_the_cap() {
    let cases = [
        // The loop: one member, two threads, the short path.
        (
            "two-threads",
            Case {
                members: 1,
                threads: 2,
                pairs: 1_000_000,
                kind: "plain",
                guarantee: None,
            },
        ),
        // The full path alone: nothing retries a refusal there.
        (
            "full-path",
            Case {
                members: 1,
                threads: 4,
                pairs: 300_000,
                kind: "managed",
                guarantee: None,
            },
        ),
        (
            "members",
            Case {
                members: 3,
                threads: 3,
                pairs: 100_000,
                kind: "mixed",
                guarantee: None,
            },
        ),
        (
            "guarantees",
            Case {
                members: 4,
                threads: 2,
                pairs: 100_000,
                kind: "mixed",
                guarantee: Some("2Gi"),
            },
        ),
    ];
    let report: Vec<String> = cases
        .iter()
        .flat_map(|(tag, case)| run_case(tag, case))
        .collect();
    assert!(
        report.is_empty(),
        "refusals with room under the pool's 64 GiB cap:\n{}",
        report.join("\n")
    );
}
