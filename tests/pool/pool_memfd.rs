//! The design written in docs/src/threat-model.md for a claim's pool file truncated under
//! a live member, run small in its prototype (`tests/c/memfd_join.c`, not gpucap's code):
//! members that map the pool file die of SIGBUS when another process truncates it, members
//! whose words are a sealed memfd handed over by socket do not; and the claim's joining
//! protocol never leaves two sets of members with two budgets, while members are killed
//! as others join or every member is stopped, which the same protocol without its hold
//! lock does.

use super::common;

use common::*;
use std::path::PathBuf;
use std::process::Command;

/// A directory short enough for a socket's address (the test's scratch may not be), made
/// and removed by the prototype; named for this run alone (the time beside the pid: no
/// other run, now or before, shares its pool file or socket).
fn short_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    let d = std::env::temp_dir().join(format!("gpucap-memfd-{tag}-{}-{nanos}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn prototype(args: &[&str], dir: &PathBuf, no_hold: bool) -> (bool, String) {
    let out = Command::new(compile_c("memfd_join", "", &[]))
        .args(args)
        .arg(dir)
        .env("MEMFD_JOIN_NO_HOLD", if no_hold { "1" } else { "0" })
        .output()
        .expect("run memfd_join");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
    (out.status.success(), text)
}

#[test]
fn a_truncated_pool_file_kills_the_members_that_map_it_and_none_whose_words_are_a_sealed_memfd() {
    for (mode, killed) in [("file", 48), ("proc", 0), ("socket", 0), ("claim", 0)] {
        let (_, out) = prototype(&[mode, "48"], &short_dir(mode), false);
        assert!(
            out.contains(&format!(
                "joined 48  killed by a signal after the truncation: {killed}\n"
            )),
            "{mode}: {out}"
        );
    }
}

/// Each round starts up to 16 members while killing as many; round 5 stops every member
/// while two more join, until both have reported (nobody answers them in their 3 s).
/// Where members hold two memfds, the prototype prints each member's memfd, pool file and
/// whether it made its memfd or was handed it.
#[test]
fn members_killed_or_stopped_as_others_join_never_keep_two_budgets() {
    let (_, out) = prototype(&["churn", "16", "6"], &short_dir("churn"), false);
    assert!(out.contains(", 0 with more than one budget,"), "{out}");
    // The same rounds with the memfd made wherever nobody answers: the two joiners make
    // a second one while the others are stopped, and both sets live on.
    let (ok, out) = prototype(&["churn", "16", "6"], &short_dir("nohold"), true);
    assert!(!ok && out.contains("round 5: "), "{out}");
}
