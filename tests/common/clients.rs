//! The real clients' helpers (tests/cudarc-client, tests/clients/bindings_client.py,
//! the C test programs of tests/c): shared by tests/real_clients/real_clients.rs,
//! tests/cli/cli.rs and the C programs' tests.

use super::*;
use std::path::PathBuf;
use std::process::Output;

/// `target/<profile>/cudarc-client`, an unmodified cudarc program.
pub fn cudarc_client() -> PathBuf {
    built("cudarc-client")
}

/// What a real client printed (see tests/cudarc-client/src/main.rs for the format).
#[derive(Debug, Default)]
pub struct ClientReport {
    /// `device 0 total_mem=`: cuDeviceTotalMem.
    pub total_mem: Option<u64>,
    /// Every `mem_get_info free= total=` line, in order: (free, total).
    pub mem_info: Vec<(u64, u64)>,
    /// Every allocation: (kind `alloc`/`alloc_async`, MiB, `ok` or the error text).
    pub allocs: Vec<(String, u64, Result<(), String>)>,
    /// `init err <name>` when the driver could not be initialised.
    pub init_err: Option<String>,
    /// The client reached its end (`done`).
    pub done: bool,
}

impl ClientReport {
    pub fn parse(out: &str) -> ClientReport {
        let mut r = ClientReport::default();
        let field = |line: &str, key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        for line in out.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["device", "0", ..] => r.total_mem = Some(field(line, "total_mem=")),
                ["mem_get_info", ..] => r
                    .mem_info
                    .push((field(line, "free="), field(line, "total="))),
                [kind @ ("alloc" | "alloc_async"), mib, rest @ ..] => {
                    let res = match rest {
                        ["ok"] => Ok(()),
                        ["err", e @ ..] => Err(e.join(" ")),
                        other => Err(other.join(" ")),
                    };
                    r.allocs
                        .push((kind.to_string(), mib.parse().expect("MiB"), res));
                }
                ["init", "err", e @ ..] => r.init_err = Some(e.join(" ")),
                ["done"] => r.done = true,
                _ => {}
            }
        }
        r
    }

    /// The outcome of each allocation as `"<MiB> ok"` / `"<MiB> <error>"`, to compare
    /// against expectations in one assertion.
    pub fn outcomes(&self) -> Vec<String> {
        self.allocs
            .iter()
            .map(|(_, mib, res)| match res {
                Ok(()) => format!("{mib} ok"),
                Err(e) => format!("{mib} {e}"),
            })
            .collect()
    }
}

/// The `gpucap: refused ...` lines of a program's stderr.
pub fn refusals(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.starts_with("gpucap: refused"))
        .map(str::to_owned)
        .collect()
}

/// The fake NVML, `libnvidia_ml.so` (SONAME `libnvidia-ml.so.1`; [`fake_lib_dir`] links
/// `libnvidia-ml.so.1` to it).
pub fn fake_nvml() -> PathBuf {
    built("libnvidia_ml.so")
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Panics unless a C test program (tests/c) passed all its checks, printed its
/// summary line, and left no crash or panic on stderr; shows its output otherwise.
#[track_caller]
pub fn assert_passed(o: &Output, what: &str) {
    let out = stdout(o);
    assert!(
        o.status.success() && !out.contains("FAIL") && out.contains("summary:"),
        "{what}: {:?}\n--- failed checks\n{}\n--- stdout (tail)\n{}\n--- stderr (tail)\n{}",
        o.status,
        out.lines()
            .filter(|l| l.starts_with("FAIL") || l.starts_with("FATAL") || l.starts_with("error"))
            .collect::<Vec<_>>()
            .join("\n"),
        tail(&out, 40),
        tail(&stderr(o), 20),
    );
    let err = stderr(o);
    for bad in ["panicked", "RUST_BACKTRACE", "Segmentation", "libother:"] {
        assert!(
            !err.contains(bad),
            "{what}: stderr mentions {bad:?}:\n{}",
            tail(&err, 40)
        );
    }
}

/// Panics unless a C test program reported failed checks (a control run without the
/// shim that expects the cap).
#[track_caller]
pub fn assert_failed(o: &Output, what: &str) {
    let out = stdout(o);
    assert!(
        !o.status.success() && out.lines().any(|l| l.starts_with("FAIL")),
        "{what}: expected failed checks without the shim, got {:?}\n{}",
        o.status,
        tail(&out, 40)
    );
}
