//! The test binaries' own profile (`test-release` in Cargo.toml, what scripts/test.sh
//! builds them with): a test binary in `target/test-release/deps` runs the shim, the CLI
//! and the fake GPU of `target/release`, the release build whose figures the documents
//! publish; one in any other `target/<profile>/deps` runs its own profile's.

use std::path::Path;
use std::process::Command;

use super::common::*;

#[test]
#[ignore = "a probe: run by the test below in a child process"]
fn probe_where_the_built_files_are() {
    println!("profile_dir={}", profile_dir().display());
}

/// Runs a copy of this test binary from `<dir>/<profile>/deps` and returns the directory
/// its probe says it runs the built files of.
fn profile_dir_of_a_copy_in(dir: &Path, profile: &str) -> String {
    let deps = dir.join(profile).join("deps");
    std::fs::create_dir_all(&deps).unwrap();
    let exe = std::env::current_exe().unwrap();
    let copy = deps.join(exe.file_name().unwrap());
    std::fs::copy(&exe, &copy).unwrap();
    let o = run(Command::new(&copy).args([
        "--ignored",
        "--exact",
        "test_profile::probe_where_the_built_files_are",
        "--nocapture",
        "--test-threads=1",
    ]));
    assert!(o.status.success(), "{}", dump(&o));
    stdout(&o)
        .lines()
        .find_map(|l| l.split_once("profile_dir=").map(|(_, dir)| dir))
        .unwrap_or_else(|| panic!("the probe printed no profile_dir\n{}", dump(&o)))
        .to_string()
}

#[test]
fn a_test_binary_of_the_test_profile_runs_the_release_build() {
    let dir = scratch("test-profile");
    assert_eq!(
        profile_dir_of_a_copy_in(&dir, TEST_PROFILE),
        dir.join("release").display().to_string()
    );
    for profile in ["release", "debug"] {
        assert_eq!(
            profile_dir_of_a_copy_in(&dir, profile),
            dir.join(profile).display().to_string()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
