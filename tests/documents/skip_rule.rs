//! The one skip rule of the tests (`tests/common`'s `skip`): a test whose tool, virtual
//! environment or build is missing prints `SKIP: ...` and passes, except where tests
//! are required (`CI` set and not "", "0" or "false", or `GPUCAP_TEST_REQUIRE_CLIENTS=1`):
//! there it fails, naming what is missing. Each probe below asks for something missing
//! and runs in a child process of this test binary with the environment a case gives.

use super::common;

use std::process::{Command, Output};

use common::*;

/// A variable no one sets.
const NEVER_SET: &str = "GPUCAP_TEST_NEVER_SET_FOR_THE_SKIP_RULE";

#[test]
#[ignore = "a probe: run by the tests below in a child process"]
fn probe_a_missing_client() {
    assert!(client_python(NEVER_SET, "nothing").is_none());
}

#[test]
#[ignore = "a probe: run by the tests below in a child process"]
fn probe_a_missing_checker() {
    assert!(checker_tool(NEVER_SET, "gpucap-no-such-checker", "the skip rule's probe").is_none());
}

#[test]
#[ignore = "a probe: run by the tests below in a child process"]
fn probe_the_published_figures() {
    let _ = callgrind_benchmarks_run();
}

/// Runs probe `name` of this binary with `env` (and neither `CI` nor
/// `GPUCAP_TEST_REQUIRE_CLIENTS` unless given).
fn probe(name: &str, env: &[(&str, &str)]) -> Output {
    // This file is the module `skip_rule` of its test binary.
    let test = format!("skip_rule::{name}");
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        test.as_str(),
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("CI")
    .env_remove("GPUCAP_TEST_REQUIRE_CLIENTS")
    .env_remove(NEVER_SET);
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

/// What a probe printed, stdout and stderr.
fn said(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

const REQUIRED: &[&[(&str, &str)]] = &[
    &[("CI", "true")],
    &[("CI", "1")],
    &[("GPUCAP_TEST_REQUIRE_CLIENTS", "1")],
];
const NOT_REQUIRED: &[&[(&str, &str)]] = &[
    &[],
    &[("CI", "false")],
    &[("CI", "0")],
    &[("CI", "")],
    &[("GPUCAP_TEST_REQUIRE_CLIENTS", "0")],
];

#[test]
fn a_missing_client_or_checker_fails_where_tests_are_required_and_skips_elsewhere() {
    for name in ["probe_a_missing_client", "probe_a_missing_checker"] {
        for env in REQUIRED {
            let o = probe(name, env);
            assert!(
                !o.status.success() && said(&o).contains("must run here"),
                "{name} {env:?}: a missing tool must fail the test\n{}",
                dump(&o)
            );
        }
        for env in NOT_REQUIRED {
            let o = probe(name, env);
            assert!(
                o.status.success() && said(&o).contains("SKIP: "),
                "{name} {env:?}: a missing tool skips the test outside CI\n{}",
                dump(&o)
            );
        }
    }
}

/// The published figures (the callgrind benchmarks) are measured on a release build
/// with valgrind: under CI, a debug build or no valgrind fails them instead of passing
/// them empty.
#[test]
fn the_published_figures_fail_under_ci_where_they_cannot_be_measured() {
    let release = profile_dir().file_name().is_some_and(|p| p == "release");
    let valgrind = Command::new("valgrind").arg("--version").output().is_ok();
    let o = probe("probe_the_published_figures", &[("CI", "true")]);
    if release && valgrind {
        assert!(o.status.success(), "{}", dump(&o));
    } else {
        assert!(
            !o.status.success() && said(&o).contains("must run here"),
            "release {release}, valgrind {valgrind}: the figures cannot be measured, and CI is set\n{}",
            dump(&o)
        );
    }
    let o = probe("probe_the_published_figures", &[]);
    assert!(o.status.success(), "{}", dump(&o));
}

#[test]
fn ci_and_require_clients_both_mean_required() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(kk, _)| *kk == k)
                .map(|(_, v)| v.to_string())
        }
    };
    for pairs in REQUIRED {
        assert!(required_by(env(pairs)), "{pairs:?}");
    }
    for pairs in NOT_REQUIRED {
        assert!(!required_by(env(pairs)), "{pairs:?}");
    }
}
