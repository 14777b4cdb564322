//! One run of a Python framework client (`tests/clients/<name>_client.py`: steps on the
//! command line, one fact per line on stdout, `done` at the end) on the fake GPU, with or
//! without gpucap, and what the tests read of it: its lines, its `mem_get_info` figures,
//! its fills, gpucap's refusal lines and the fake driver's statistics.

use super::common;

use common::*;
use std::path::Path;
use std::process::Output;

/// A client: its script, the variable naming its Python, what that Python holds, and
/// the variables that keep its caches in the run's scratch directory.
pub struct Client {
    pub script: &'static str,
    pub var: &'static str,
    pub what: &'static str,
    pub caches: &'static [&'static str],
}

/// One run of a client.
pub struct Run {
    pub out: Output,
    pub stdout: String,
    pub stderr: String,
    pub stats: Vec<DevStats>,
}

impl Run {
    pub fn dump(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}--- stderr (tail)\n{}",
            self.out.status,
            self.stdout,
            tail(&self.stderr, 30)
        )
    }

    /// The lines of stdout that start with `prefix`.
    pub fn lines(&self, prefix: &str) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    /// Every `mem_get_info` line as (free, total).
    pub fn mem_info(&self) -> Vec<(u64, u64)> {
        self.lines("mem_get_info ")
            .iter()
            .map(|l| (field(l, "free="), field(l, "total=")))
            .collect()
    }

    /// The outcome of each `fill` step: (arrays allocated, the refusal as the client
    /// printed it after `err`: the exception class, and for some clients the driver's code).
    pub fn fills(&self) -> Vec<(usize, String)> {
        let mut fills = Vec::new();
        let mut ok = 0;
        for l in self.stdout.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["alloc", _, "ok"] => ok += 1,
                ["alloc", _, "err", e @ ..] => {
                    fills.push((ok, e.join(" ")));
                    ok = 0;
                }
                _ => {}
            }
        }
        fills
    }

    pub fn refusals(&self) -> Vec<String> {
        refusals(&self.stderr)
    }
}

pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// Runs `client` with `steps` on the fake GPU (`env`: FAKECUDA_*, CUDA_VISIBLE_DEVICES,
/// GPUCAP_*), under gpucap when `shim`; None (SKIP) where its Python is not configured
/// and not required. Fails unless the client ran to its end with no traceback, crash or
/// panic.
pub fn run_client(
    client: &Client,
    shim: bool,
    env: &[(&str, &str)],
    steps: &[&str],
) -> Option<Run> {
    let python = client_python(client.var, client.what)?;
    let dir = scratch(client.script.trim_end_matches(".py"));
    let stats_path = dir.join("stats.json");
    let mut cmd = fake_cmd(python, &stats_path);
    cmd.arg(root().join("tests/clients").join(client.script))
        .args(steps)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("CUDA_VISIBLE_DEVICES");
    for var in client.caches {
        cmd.env(var, dir.join("cache"));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if shim {
        preload(&mut cmd);
    }
    let out = run(&mut cmd);
    let stats = read_stats_if_written(&stats_path);
    let r = Run {
        stdout: stdout(&out),
        stderr: stderr(&out),
        out,
        stats,
    };
    assert!(
        r.out.status.success() && r.stdout.lines().any(|l| l == "done"),
        "{} did not run to its end:\n{}",
        client.script,
        r.dump()
    );
    for bad in ["panicked", "Segmentation", "Traceback"] {
        assert!(
            !r.stderr.contains(bad),
            "stderr mentions {bad:?}:\n{}",
            r.dump()
        );
    }
    Some(r)
}

fn read_stats_if_written(path: &Path) -> Vec<DevStats> {
    if path.exists() {
        read_stats(path)
    } else {
        Vec::new()
    }
}

/// The driver never held more than `cap` on `ordinal`, and held at least `at_least`.
#[track_caller]
pub fn assert_peak(r: &Run, ordinal: u64, cap: u64, at_least: u64) {
    let d = r
        .stats
        .iter()
        .find(|d| d.ordinal == ordinal)
        .unwrap_or_else(|| panic!("no stats for ordinal {ordinal}\n{}", r.dump()));
    assert!(
        d.peak_used <= cap && d.peak_used >= at_least,
        "ordinal {ordinal} peaked at {} bytes, expected within [{at_least}, {cap}]\n{}",
        d.peak_used,
        r.dump()
    );
}
