//! One run of a Python framework client (`tests/clients/<name>_client.py`: steps on the
//! command line, one fact per line on stdout, `done` at the end) on the fake GPU, with or
//! without gpucap, and what the tests read of it: its lines, its `mem_get_info` figures,
//! its fills, gpucap's refusal lines and the fake driver's statistics. A client may also
//! be started and left holding what it allocated (its `hold` step) while another runs.

use super::common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

/// A client: its script, the variable naming its Python, what that Python holds, and
/// the variables that keep its caches in the run's scratch directory.
pub struct Client {
    pub script: &'static str,
    pub var: &'static str,
    pub what: &'static str,
    pub caches: &'static [&'static str],
    /// Its refusal as its `fill` step prints it after `err`: the exception's class, and
    /// for some clients the driver's code.
    pub oom: &'static str,
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

/// The command that runs `client` with `steps` on the fake GPU (`env`: FAKECUDA_*,
/// CUDA_VISIBLE_DEVICES, GPUCAP_*), under gpucap when `shim`, and where the fake writes
/// its statistics; None (SKIP) where its Python is not configured and not required.
fn client_cmd(
    client: &Client,
    shim: bool,
    env: &[(&str, &str)],
    steps: &[&str],
) -> Option<(Command, PathBuf)> {
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
    Some((cmd, stats_path))
}

/// Runs `client` with `steps` (see [`client_cmd`]). Fails unless the client ran to its
/// end with no traceback, crash or panic.
pub fn run_client(
    client: &Client,
    shim: bool,
    env: &[(&str, &str)],
    steps: &[&str],
) -> Option<Run> {
    let (mut cmd, stats_path) = client_cmd(client, shim, env, steps)?;
    let out = run(&mut cmd);
    Some(finished(client, out, &stats_path))
}

/// A client started with a `hold` step, now holding what it allocated before it.
pub struct Held {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    before: String,
    stats_path: PathBuf,
    client: &'static Client,
}

/// Starts `client` with `steps` (see [`client_cmd`]), which must include `hold`, and
/// returns once it printed `holding` (or fails with what it printed).
pub fn start_client(
    client: &'static Client,
    shim: bool,
    env: &[(&str, &str)],
    steps: &[&str],
) -> Option<Held> {
    let (mut cmd, stats_path) = client_cmd(client, shim, env, steps)?;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {}: {e}", client.script));
    let stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut before = String::new();
    loop {
        let mut line = String::new();
        let n = stdout.read_line(&mut line).expect("the client's stdout");
        before.push_str(&line);
        if line == "holding\n" {
            break;
        }
        if n == 0 {
            let out = child.wait_with_output().expect("the client's end");
            panic!(
                "{} ended before it held:\n--- stdout\n{before}--- stderr\n{}",
                client.script,
                tail(&stderr(&out), 30)
            );
        }
    }
    Some(Held {
        child,
        stdin,
        stdout,
        before,
        stats_path,
        client,
    })
}

impl Held {
    /// Lets the client go on past its `hold` and waits for its end.
    pub fn release(mut self) -> Run {
        writeln!(self.stdin, "go").expect("the client's stdin");
        drop(self.stdin);
        let mut rest = String::new();
        self.stdout
            .read_to_string(&mut rest)
            .expect("the client's stdout");
        let mut out = self.child.wait_with_output().expect("the client's end");
        out.stdout = format!("{}{rest}", self.before).into_bytes();
        finished(self.client, out, &self.stats_path)
    }
}

/// The run of a client that ended with `out`; fails unless it ran to its end with no
/// traceback, crash or panic.
fn finished(client: &Client, out: Output, stats_path: &Path) -> Run {
    let stats = read_stats_if_written(stats_path);
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
    r
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
