//! Bad input that was taken silently, now refused with a line naming what was wrong (exit
//! 2): `top --user` naming nobody, an option of `pool resize`/`pool set` given twice,
//! `OFF` for `off`, a `cdi generate --root` that does not exist; and `check --write-env`
//! no longer writes the flags it was typed with into `gpucap.env`; a misspelt option of
//! `cdi generate` or `jupyter install` gets its "did you mean"; `check` says what a
//! `--report` that is a directory, or a `GPUCAP_POOL_DIR` that is none, will not do.

use super::common;

use super::never_uncapped_cli::gpucap;
use common::*;
use std::path::Path;
use std::process::Command;

fn refused(dir: &Path, args: &[&str], line: &str) {
    let o = run(&mut gpucap(args, dir));
    assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
    assert!(
        stderr(&o).contains(line),
        "{args:?}: no line {line:?}\n{}",
        dump(&o)
    );
}

#[test]
fn values_that_name_nothing_are_refused() {
    let dir = scratch("cli-bad-input");
    refused(
        &dir,
        &["top", "--once", "--user", "no-such-user-here"],
        "no such user in /etc/passwd",
    );
    refused(&dir, &["top", "--once", "--user="], "an empty --user");
    refused(
        &dir,
        &["top", "--once", "--user", "99999999999"],
        "not a uid",
    );
    let o = run(&mut gpucap(&["top", "--once", "--user", "root"], &dir));
    assert_ok(&o);
    refused(
        &dir,
        &[
            "pool",
            "set",
            "p",
            "1",
            "--guarantee",
            "1Gi",
            "--guarantee",
            "2Gi",
        ],
        "--guarantee given more than once",
    );
    refused(
        &dir,
        &["pool", "resize", "p", "5Gi", "--gpu", "0", "--gpu", "1"],
        "--gpu given more than once",
    );
    refused(
        &dir,
        &["pool", "resize", "p", "5Gi", "--dir", "/a", "--dir", "/b"],
        "--dir given more than once",
    );
    for args in [
        &["check", "--limit", "1Gi", "--pool", "OFF"][..],
        &["run", "--limit", "1Gi", "--pool", "Off", "--", "true"][..],
    ] {
        refused(&dir, args, "off (lower case) is no pool");
    }
    let root = dir.join("no-such-root");
    refused(
        &dir,
        &[
            "cdi",
            "generate",
            "--limit",
            "8Gi",
            "--output",
            "/o.json",
            "--root",
            root.to_str().unwrap(),
        ],
        "is not a directory",
    );
    assert!(!root.exists(), "cdi generate made the root it was given");
}

#[test]
fn write_env_writes_no_typed_flags() {
    let dir = scratch("cli-write-env");
    let file = dir.join("gpucap.env");
    let o = run(&mut gpucap(
        &[
            "check",
            "--limit",
            "8GB",
            "--write-env",
            file.to_str().unwrap(),
        ],
        &dir,
    ));
    assert_ok(&o);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("GPUCAP_LIMIT=8GB\n"), "{text}");
    assert!(
        !text.contains("GPUCAP_TYPED"),
        "the file names the flags check was typed with\n{text}"
    );
}

#[test]
fn misspelt_options_and_paths_that_cannot_serve_are_said() {
    let dir = scratch("cli-said");
    refused(
        &dir,
        &["cdi", "generate", "--limt", "8Gi", "--output", "/x.json"],
        "unknown option '--limt' (did you mean --limit?)",
    );
    refused(
        &dir,
        &["jupyter", "install", "--limt", "8Gi"],
        "unknown option '--limt' (did you mean --limit?)",
    );
    let o = run(&mut gpucap(
        &["check", "--limit", "1Gi", "--report", dir.to_str().unwrap()],
        &dir,
    ));
    assert_ok(&o);
    assert!(
        stdout(&o).contains("it is a directory: nothing will be written"),
        "{}",
        dump(&o)
    );
    let o =
        run(gpucap(&["check", "--limit", "1Gi"], &dir).env("GPUCAP_POOL_DIR", dir.join("none")));
    assert_ok(&o);
    assert!(
        stderr(&o)
            .contains("is not a directory: a process capped alone will not show in gpucap status"),
        "{}",
        dump(&o)
    );
}

/// A pool directory on a disk's file system costs every start of a process capped alone
/// its file's making and removal there (performance.md: x1.6-x1.8 of a raw start of
/// 1,000 against x1.3 in /dev/shm): `gpucap check` says so where it is, never for a
/// tmpfs. `/` is the disk here (asked of `stat -f`, the test follows what it says).
#[test]
fn check_notes_a_pool_directory_on_a_disk() {
    let dir = scratch("cli-pool-dir-disk");
    let note = "not in memory (a tmpfs): a process capped alone makes and removes its file";
    let kind = |d: &str| {
        let o = run(Command::new("stat").args(["-f", "-c", "%T", d]));
        assert_ok(&o);
        stdout(&o).trim().to_string()
    };
    for d in ["/", "/dev/shm"] {
        let in_memory = matches!(kind(d).as_str(), "tmpfs" | "ramfs");
        let o = run(gpucap(&["check", "--limit", "1Gi"], &dir).env("GPUCAP_POOL_DIR", d));
        assert_ok(&o);
        assert_eq!(
            stderr(&o).contains(note),
            !in_memory,
            "{d} ({}): {}",
            kind(d),
            dump(&o)
        );
    }
    // In a pool, no process makes a file of its own there at its start (the pool's file
    // is made once): no note where it is on the disk.
    let o =
        run(gpucap(&["check", "--limit", "1Gi", "--pool", "p"], &dir).env("GPUCAP_POOL_DIR", "/"));
    assert_ok(&o);
    assert!(
        stdout(&o).contains("pool: p") && !stderr(&o).contains(note),
        "{}",
        dump(&o)
    );
}

#[test]
fn flags_that_would_do_nothing_are_refused() {
    let dir = scratch("cli-no-effect");
    refused(
        &dir,
        &["status", "--pool", "p", "--uuid"],
        "--uuid goes with no pool named",
    );
    refused(
        &dir,
        &["status", "--prometheus", "--uuid"],
        "--uuid and --prometheus exclude each other",
    );
    refused(
        &dir,
        &["top", "--once", "--interval", "5"],
        "--once and --interval exclude each other",
    );
    refused(
        &dir,
        &["run", "--measure", "--quiet", "--", "true"],
        "drop --quiet",
    );
    refused(
        &dir,
        &["run", "--measure", "--guarantee", "1Gi", "--", "true"],
        "outside any pool: drop --guarantee",
    );
}
