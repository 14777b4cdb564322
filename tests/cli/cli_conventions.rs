//! The command line's conventions: a usage error is one line, the command's own usage
//! and where to read more; `--version`/`--help` take nothing after them; warnings go to
//! stderr with `gpucap:` first (see tests/cli/cli.rs for the no-driver line); `run --wait`
//! is `GPUCAP_WAIT`; a size without a unit under 1 MiB is refused with the unit it
//! lacks; a library whose path LD_PRELOAD cannot hold is refused; messages say what
//! the program does (a missing GPUCAP_POOL_DIR, HAMi-core's per-GPU variables).

use super::common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// `gpucap ARGS` on a 4 GiB fake GPU.
fn gpucap(dir: &Path, args: &[&str]) -> Command {
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.args(args).env("FAKECUDA_TOTAL_MEM", "4Gi");
    c
}

/// A usage error: exit status 2, nothing on stdout, and stderr exactly `lines`.
#[track_caller]
fn assert_usage_error(o: &Output, lines: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "{}", dump(o));
    assert_eq!(stdout(o), "", "{}", dump(o));
    assert_eq!(stderr(o).lines().collect::<Vec<_>>(), lines, "{}", dump(o));
}

#[test]
fn a_usage_error_is_one_line_then_the_commands_own_usage_and_a_hint() {
    let dir = scratch("conv-usage");
    let o = run(&mut gpucap(&dir, &["metrics", "--bogus"]));
    assert_usage_error(
        &o,
        &[
            "gpucap: unknown option '--bogus'",
            "usage: gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all] [--hami]",
            "(see 'gpucap help metrics')",
        ],
    );
    let o = run(&mut gpucap(&dir, &["status", "now"]));
    assert_usage_error(
        &o,
        &[
            "gpucap: unexpected argument 'now' (status takes only options)",
            "usage: gpucap status [--pool NAME|PATH | --all] [--json] [--uuid]",
            "       gpucap status --prometheus [--pool NAME|PATH]... [--all] [--hami]",
            "(see 'gpucap help status')",
        ],
    );
    let o = run(&mut gpucap(&dir, &["run", "--limit", "1Gi"]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(err.starts_with("gpucap: no command to run"), "{err}");
    assert!(err.contains("\nusage: gpucap run ["), "{err}");
    assert!(err.ends_with("(see 'gpucap help run')\n"), "{err}");
    for other in ["check", "status", "top", "metrics"] {
        assert!(!err.contains(&format!("gpucap {other} ")), "{err}");
    }
    // A mistake before any command: the line and where to read.
    let o = run(&mut gpucap(&dir, &["frobnicate"]));
    assert_eq!(stderr(&o).lines().count(), 2, "{}", dump(&o));
    assert!(
        stderr(&o).ends_with("\n(see 'gpucap --help')\n"),
        "{}",
        dump(&o)
    );
}

#[test]
fn version_and_help_take_nothing_after_them() {
    let dir = scratch("conv-version");
    for args in [
        &["--version", "--bogus"][..],
        &["-V", "x"],
        &["version", "--bogus"],
        &["--help", "--bogus"],
    ] {
        let o = run(&mut gpucap(&dir, args));
        assert_usage_error(
            &o,
            &[
                &format!(
                    "gpucap: unexpected argument '{}' after {} (it takes no arguments)",
                    args[1], args[0]
                ),
                "(see 'gpucap --help')",
            ],
        );
    }
    let o = run(&mut gpucap(&dir, &["--version"]));
    assert_ok(&o);
    assert!(stdout(&o).starts_with("gpucap "), "{}", dump(&o));
    // A command's --help as well (before: `check --help extra` showed the help, exit 0):
    // the line, then that command's usage and where to read.
    for args in [
        &["check", "--help", "extra"][..],
        &["status", "--help", "extra"],
        &["run", "--limit", "1Gi", "-h", "extra"],
        &["top", "--help", "--once"],
        &["metrics", "--help", "x"],
        &["pool", "list", "--help", "x"],
        &["pool", "resize", "--help", "x"],
        &["jupyter", "list", "--help", "x"],
        &["cdi", "generate", "--help", "x"],
    ] {
        let o = run(&mut gpucap(&dir, args));
        let n = args.len();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert_eq!(stdout(&o), "", "{args:?}\n{}", dump(&o));
        assert_eq!(
            err.lines().next(),
            Some(
                format!(
                    "gpucap: unexpected argument '{}' after {} (it takes no arguments)",
                    args[n - 1],
                    args[n - 2]
                )
                .as_str()
            ),
            "{args:?}\n{}",
            dump(&o)
        );
        assert!(
            err.ends_with(&format!("(see 'gpucap help {}')\n", args[0])),
            "{args:?}\n{}",
            dump(&o)
        );
    }
    for args in [&["check", "--help"][..], &["run", "--limit", "1Gi", "-h"]] {
        let o = run(&mut gpucap(&dir, args));
        assert_ok(&o);
        assert!(stdout(&o).starts_with("usage: gpucap "), "{}", dump(&o));
    }
}

/// Every document the help names (`docs/src/pools.md`, `README.md`) exists, and every
/// section it names in one (`README.md, "Without a GPU"`) is one of that file's headings
/// (backticks aside; a name may wrap across lines). Before, `help status` and `help
/// metrics` sent the reader to README.md's "Watching a pool" and "Metrics", which it
/// does not have (they are docs/src/pools.md's and docs/src/metrics.md's).
#[test]
fn the_help_names_documents_and_sections_that_exist() {
    let dir = scratch("conv-help-refs");
    let mut named = 0;
    for topic in [
        "", "run", "check", "status", "top", "metrics", "jupyter", "cdi", "pool",
    ] {
        let mut args = vec!["help"];
        args.extend((!topic.is_empty()).then_some(topic));
        let o = run(&mut gpucap(&dir, &args));
        assert_ok(&o);
        let text = stdout(&o).split_whitespace().collect::<Vec<_>>().join(" ");
        let mut from = 0;
        while let Some(at) = text[from..].find(".md").map(|i| from + i) {
            from = at + 3;
            let start = text[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c)))
                .map_or(0, |i| i + 1);
            let path = &text[start..from];
            let file = root().join(path);
            let doc = std::fs::read_to_string(&file).unwrap_or_else(|e| {
                panic!("help {topic} names {path}, which cannot be read ({e})")
            });
            named += 1;
            let Some(section) = text[from..]
                .strip_prefix(", \"")
                .and_then(|rest| rest.split('"').next())
            else {
                continue;
            };
            let headings: Vec<String> = doc
                .lines()
                .filter(|l| l.starts_with('#'))
                .map(|l| l.trim_start_matches('#').trim().replace('`', ""))
                .collect();
            assert!(
                headings.iter().any(|h| h == section),
                "help {topic} names the section \"{section}\" of {path}, which has none \
                 such; its headings: {headings:?}"
            );
        }
    }
    assert!(named > 3, "the help names documents");
}

#[test]
fn run_wait_is_gpucap_wait_and_needs_a_pool_as_the_variable_does() {
    let dir = scratch("conv-wait");
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    // The help names both.
    let o = run(&mut gpucap(&dir, &["--help"]));
    assert!(stdout(&o).contains("\n  GPUCAP_WAIT "), "{}", dump(&o));
    let o = run(&mut gpucap(&dir, &["help", "run"]));
    assert!(stdout(&o).contains("\n  --wait DURATION"), "{}", dump(&o));

    // With a pool, the program gets GPUCAP_WAIT.
    let o = run(gpucap(
        &dir,
        &[
            "run",
            "--pool",
            "p",
            "--wait",
            "5s",
            "--",
            "sh",
            "-c",
            "echo \"$GPUCAP_WAIT\"",
        ],
    )
    .env("GPUCAP_POOL_DIR", &pools));
    assert_ok(&o);
    assert_eq!(stdout(&o), "5s\n", "{}", dump(&o));
    let o = run(gpucap(
        &dir,
        &[
            "run",
            "--pool",
            "p",
            "--wait=1m",
            "--",
            "sh",
            "-c",
            "echo \"$GPUCAP_WAIT\"",
        ],
    )
    .env("GPUCAP_POOL_DIR", &pools)
    .env("GPUCAP_WAIT", "0"));
    assert_ok(&o);
    assert_eq!(
        stdout(&o),
        "1m\n",
        "the flag overrides the variable\n{}",
        dump(&o)
    );

    // Without a pool: the variable's error, naming the flag.
    let marker = dir.join("started");
    let touch = ["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()];
    let by_var =
        run(gpucap(&dir, &[&["run", "--"][..], &touch].concat()).env("GPUCAP_WAIT", "30s"));
    let by_flag = run(&mut gpucap(
        &dir,
        &[&["run", "--wait", "30s", "--"][..], &touch].concat(),
    ));
    for (o, name) in [(&by_var, "GPUCAP_WAIT"), (&by_flag, "--wait")] {
        assert_eq!(o.status.code(), Some(2), "{}", dump(o));
        assert_eq!(
            stderr(o).trim_end(),
            format!(
                "gpucap: invalid {name}=\"30s\": waiting needs a pool (GPUCAP_POOL): only other \
                 members of a pool free memory an allocation could wait for"
            ),
            "{}",
            dump(o)
        );
    }
    assert!(!marker.exists());
    // A bad duration, and check takes it too.
    let o =
        run(gpucap(&dir, &["check", "--pool", "p", "--wait", "30"]).env("GPUCAP_POOL_DIR", &pools));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).starts_with("gpucap: invalid --wait=\"30\": no unit"),
        "{}",
        dump(&o)
    );
    // --measure runs alone: no pool, so no wait.
    let o = run(&mut gpucap(
        &dir,
        &["run", "--measure", "--wait", "5s", "--", "true"],
    ));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("drop --wait"), "{}", dump(&o));
}

#[test]
fn a_bare_number_under_a_mebibyte_is_refused_with_the_unit_it_lacks() {
    let dir = scratch("conv-bare");
    let marker = dir.join("started");
    let touch = ["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()];
    for (flags, var, says) in [
        (
            &["--limit", "8"][..],
            None,
            "invalid --limit=\"8\": 8 has no unit",
        ),
        (&[], Some("8"), "invalid GPUCAP_LIMIT=\"8\": 8 has no unit"),
        (&["--limit", "0=8,1=4Gi"], None, "did you mean 8Gi?"),
        (&["--limit", "512"], None, "did you mean 512Gi?"),
        (&["--limit", "65536"], None, "did you mean 65536Mi?"),
    ] {
        for cmd in ["run", "check"] {
            let mut args = vec![cmd];
            args.extend(flags);
            if cmd == "run" {
                args.push("--");
                args.extend(touch);
            }
            let mut c = gpucap(&dir, &args);
            if let Some(v) = var {
                c.env("GPUCAP_LIMIT", v);
            }
            let o = run(&mut c);
            assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
            let err = stderr(&o);
            assert_eq!(err.lines().count(), 1, "{args:?}\n{}", dump(&o));
            assert!(
                err.contains(says) && err.contains("did you mean"),
                "{args:?}\n{}",
                dump(&o)
            );
            assert!(!marker.exists(), "{args:?}: the program ran");
        }
    }
    // A unit, a fraction, or 1 MiB and more without a unit: accepted.
    for limit in ["8Gi", "8B", "0.5", "1.0", "50%", "1048576"] {
        let o = run(&mut gpucap(&dir, &["check", "--limit", limit]));
        assert_ok(&o);
    }
}

#[test]
fn run_refuses_a_library_path_ld_preload_cannot_hold() {
    let dir = scratch("conv-space");
    let marker = dir.join("started");
    let touch = ["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()];
    for name in ["lib dir", "lib:dir"] {
        let odd = dir.join(name);
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::copy(shim(), odd.join("libgpucap.so")).unwrap();
        let o = run(gpucap(
            &dir,
            &[&["run", "--limit", "1Gi", "--"][..], &touch].concat(),
        )
        .env("GPUCAP_LIB", odd.join("libgpucap.so")));
        assert_eq!(o.status.code(), Some(2), "{name}\n{}", dump(&o));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{name}\n{}", dump(&o));
        assert!(
            err.starts_with("gpucap: the path of libgpucap.so (")
                && err.contains("contains a space or a colon, which LD_PRELOAD cannot express"),
            "{name}\n{}",
            dump(&o)
        );
        assert!(!marker.exists(), "{name}: the program ran without the shim");
    }
}

#[test]
fn a_missing_pool_dir_is_an_error_and_the_messages_say_so() {
    let dir = scratch("conv-pooldir");
    let missing = dir.join("no-such-dir");
    let o = run(gpucap(&dir, &["check", "--pool", "p"]).env("GPUCAP_POOL_DIR", &missing));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains(missing.to_str().unwrap()),
        "{}",
        dump(&o)
    );
    assert!(!missing.exists(), "check made the directory");
    // The variable's own error says what is accepted: an existing directory.
    let o = run(gpucap(&dir, &["check"]).env("GPUCAP_POOL_DIR", "rel/dir"));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    let err = stderr(&o);
    assert!(
        err.contains("accepted: the absolute path of an existing directory"),
        "{err}"
    );
    assert!(!err.contains("created if missing"), "{err}");
    let o = run(&mut gpucap(&dir, &["--help"]));
    assert!(
        stdout(&o).contains("one that does not exist is an error"),
        "{}",
        dump(&o)
    );
}

/// `CUDA_DEVICE_MEMORY_LIMIT_0=8g GPUCAP_LIMIT=8Gi`: GPUCAP_LIMIT caps every GPU, HAMi-core
/// GPU 0 only, so they disagree on GPU 1; the message names the variable that was set.
#[test]
fn hami_and_gpucap_limit_disagreeing_on_a_gpu_name_the_variables_set() {
    let dir = scratch("conv-hami");
    let o = run(gpucap(&dir, &["check"])
        .env("FAKECUDA_DEVICES", "1")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "8g")
        .env("GPUCAP_LIMIT", "8Gi"));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("no variable"), "{err}");
    assert!(
        err.contains("but no cap from HAMi-core's variables (CUDA_DEVICE_MEMORY_LIMIT_0 set")
            && err.contains("GPUCAP_LIMIT=0=8Gi alone"),
        "{err}"
    );
}
