//! The book's quick start (docs/src/quickstart.md) works as written: its shell blocks,
//! run in order by bash from the repository root on the fake GPU, do what the page says
//! (the third allocation refused under 1 GiB, `--measure` suggesting a limit, the second
//! member of the pool refused what the first holds, `status` showing the holder).
//! Two lines differ from the page: the `cargo build` line is left out (the test runs
//! in the built tree) and `sleep 2` waits instead until the first member holds its
//! 512 MiB (a loaded machine may take longer than 2 s to start it).

use super::common;

use std::process::Command;

use common::*;

/// The ```sh blocks of a Markdown page, in order.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn the_quick_start_runs_as_written() {
    let page = std::fs::read_to_string(root().join("docs/src/quickstart.md")).unwrap();
    let blocks = sh_blocks(&page);
    assert!(
        blocks.len() >= 6,
        "the quick start lost its commands: {blocks:?}"
    );
    let wait_for_holder = "until gpucap status --pool demo --json 2>/dev/null | \
        grep -q '\"used\":536870912'; do sleep 0.1; done";
    let script: String = blocks
        .concat()
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .map(|l| if l == "sleep 2" { wait_for_holder } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    let dir = scratch("quickstart");
    let mut bash = Command::new("bash");
    // A new user's shell: no variable of gpucap's or the fake's from the test run
    // (scripts/test.sh exports GPUCAP_TEST_*, which gpucap refuses as typos).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("GPUCAP_") || k.starts_with("FAKECUDA_") {
            bash.env_remove(&*k);
        }
    }
    let o = run(bash
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(&script)
        .current_dir(root())
        .env(
            "PATH",
            format!(
                "{}:{}",
                profile_dir().display(),
                std::env::var("PATH").unwrap()
            ),
        )
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .env("GPUCAP_POOL_DIR", &dir));
    assert_ok(&o);
    let out = format!("{}{}", stdout(&o), stderr(&o));
    for expected in [
        "alloc 600 err CUDA_ERROR_OUT_OF_MEMORY",
        "gpucap: refused cuMemAllocAsync of 600 MiB on GPU 0: 512 MiB of the 1 GiB cap in use",
        "--limit",
        "alloc 256 ok",
        "alloc 512 err CUDA_ERROR_OUT_OF_MEMORY",
        "cudarc-client 512 sleep:10",
    ] {
        assert!(
            out.contains(expected),
            "the quick start did not print {expected:?}:\n{out}"
        );
    }
}
