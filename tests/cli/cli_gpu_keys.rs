//! The GPU keys of every per-GPU variable (`GPUCAP_LIMIT`, `GPUCAP_GUARANTEE`,
//! `GPUCAP_CEILING`, HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT_<n>`) are checked against the
//! visible GPUs, by ordinal and by UUID, the same way in three places: `gpucap check`
//! (exit 2), `gpucap run` (exit 2, the program never starts) and the shim under a bare
//! `LD_PRELOAD` (`cuInit` fails closed with `CUDA_ERROR_NOT_PERMITTED`, 800). All three
//! print the same one line, naming the variable, the key and the keys accepted, and
//! none of them creates anything (no pool file) when it refuses.
//!
//! The fake GPU here: two physical GPUs, `CUDA_VISIBLE_DEVICES=1`, so the process sees
//! one GPU, ordinal 0, whose UUID is physical GPU 1's; physical GPU 0 is hidden.

use super::common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// The UUID of the fake's physical GPU `p` (see cuda-stubs/README.md).
fn gpu(p: u8) -> String {
    format!("GPU-face0000-0000-0000-0000-{p:012x}")
}

/// What every refusal must say is accepted: the one visible GPU's ordinal and UUID.
fn accepted() -> String {
    format!("accepted keys: 0 or {}", gpu(1))
}

fn identity_prog() -> PathBuf {
    static PROG: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROG.get_or_init(|| compile_c("identity", "", &["-lcuda"]))
        .clone()
}

/// One row: the environment (beyond the fake GPU and the pool), and what is expected.
struct Case {
    env: Vec<(String, String)>,
    /// None: valid. Some(prefix): refused with one line starting so.
    refused: Option<String>,
    /// Whether a refusal must list the accepted keys (not for a value that does not
    /// parse at all: that is refused before any GPU is looked at).
    lists_accepted: bool,
}

/// The variables with GPU keys, each with the other variables it needs and how a key
/// and a value make its setting.
fn cases() -> Vec<Case> {
    let mut rows = Vec::new();
    let forms: Vec<(String, Option<String>)> = vec![
        // (key, None when valid / Some(how the message names it))
        ("0".into(), None),
        ("1".into(), Some("GPU 1".into())),
        ("7".into(), Some("GPU 7".into())),
        (gpu(1), None),
        // Any case, and the MIG- spelling of the same bytes: the same GPU.
        (gpu(1).to_uppercase().replacen("GPU", "gpu", 1), None),
        (gpu(1).replacen("GPU", "MIG", 1), None),
        // Physical GPU 0 exists but is hidden; GPU 9 does not exist.
        (gpu(0), Some(gpu(0))),
        (gpu(9), Some(gpu(9))),
        (
            gpu(9).to_uppercase().replacen("GPU", "Gpu", 1),
            Some(gpu(9)),
        ),
    ];
    for (var, value, others) in [
        ("GPUCAP_LIMIT", "1Gi", vec![]),
        ("GPUCAP_GUARANTEE", "1Gi", vec![("GPUCAP_LIMIT", "4Gi")]),
        ("GPUCAP_CEILING", "2Gi", vec![("GPUCAP_LIMIT", "4Gi")]),
    ] {
        for (key, bad) in &forms {
            let mut env: Vec<(String, String)> = others
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            env.push((var.into(), format!("{key}={value}")));
            rows.push(Case {
                env,
                refused: bad.as_ref().map(|k| format!("gpucap: {var} names {k}")),
                lists_accepted: true,
            });
        }
        // A bare UUID is no key at all: refused as an invalid value, before any GPU.
        let bare = gpu(1)[4..].to_string();
        let mut env: Vec<(String, String)> = others
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((var.into(), format!("{bare}={value}")));
        rows.push(Case {
            env,
            refused: Some(format!("gpucap: invalid {var}=")),
            lists_accepted: false,
        });
    }
    // HAMi-core's per-GPU limit: the key is in the variable's name.
    for (n, ok) in [(0, true), (1, false), (5, false)] {
        let var = format!("CUDA_DEVICE_MEMORY_LIMIT_{n}");
        rows.push(Case {
            env: vec![(var.clone(), "1g".into())],
            refused: (!ok).then(|| format!("gpucap: {var} names GPU {n}")),
            lists_accepted: true,
        });
    }
    // Keys in more than one variable: the first bad one is named.
    rows.push(Case {
        env: vec![
            ("GPUCAP_LIMIT".into(), "4Gi,0=2Gi".into()),
            ("GPUCAP_GUARANTEE".into(), format!("{}=1Gi", gpu(1))),
            ("GPUCAP_CEILING".into(), "1=2Gi".into()),
        ],
        refused: Some("gpucap: GPUCAP_CEILING names GPU 1".into()),
        lists_accepted: true,
    });
    rows
}

/// A command on the fake GPU with one visible GPU, in a pool of its own in `pools`.
fn on_fake(program: impl AsRef<std::ffi::OsStr>, dir: &Path, case: &Case) -> Command {
    let mut c = fake_cmd(program, &dir.join("stats.json"));
    c.env("FAKECUDA_DEVICES", "2")
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("CUDA_VISIBLE_DEVICES", "1")
        .env("GPUCAP_POOL", "keys")
        .env("GPUCAP_POOL_DIR", dir.join("pools"));
    for (k, v) in &case.env {
        c.env(k, v);
    }
    c
}

/// The `gpucap:` lines of stderr.
fn gpucap_lines(o: &Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("gpucap"))
        .map(str::to_owned)
        .collect()
}

/// Whatever is in `dir` (a pool directory must stay empty when everything refused).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            }
            found.push(e.path());
        }
    }
    found
}

#[test]
fn every_per_gpu_variable_has_its_keys_checked_by_check_run_and_the_shim_alike() {
    let mut failures = Vec::new();
    for case in cases() {
        let what = format!("{:?}", case.env);
        let dir = scratch("gpu-keys");
        let pools = dir.join("pools");
        std::fs::create_dir_all(&pools).unwrap();
        let marker = dir.join("started");

        let check = run(on_fake(cli(), &dir, &case).arg("check"));
        let mut run_cmd = on_fake(cli(), &dir, &case);
        run_cmd
            .args(["run", "--", "sh", "-c", "touch \"$0\""])
            .arg(&marker);
        let ran = run(&mut run_cmd);
        let cmd_left = entries(&pools);
        let shim = run(preload(&mut on_fake(identity_prog(), &dir, &case)).arg("1Mi"));

        let mut problems = Vec::new();
        match &case.refused {
            None => {
                if check.status.code() != Some(0) || !stdout(&check).contains("configuration OK") {
                    problems.push(format!("check should accept\n{}", dump(&check)));
                }
                if ran.status.code() != Some(0) || !marker.exists() {
                    problems.push(format!("run should start the program\n{}", dump(&ran)));
                }
                if !stdout(&shim).contains("init rc=0") || !shim.status.success() {
                    problems.push(format!("the shim should accept\n{}", dump(&shim)));
                }
            }
            Some(prefix) => {
                let lines = [&check, &ran, &shim].map(gpucap_lines);
                let line = lines[2].first().cloned().unwrap_or_default();
                if !line.starts_with(prefix.as_str()) {
                    problems.push(format!(
                        "the shim should refuse with a line starting {prefix:?}\n{}",
                        dump(&shim)
                    ));
                }
                if case.lists_accepted && !line.contains(&accepted()) {
                    problems.push(format!(
                        "the line should say what is accepted ({:?}): {line}",
                        accepted()
                    ));
                }
                if !stdout(&shim).contains("init rc=800") || !stdout(&shim).contains("after rc=800")
                {
                    problems.push(format!("the shim should fail closed\n{}", dump(&shim)));
                }
                for (name, o, l) in [("check", &check, &lines[0]), ("run", &ran, &lines[1])] {
                    if o.status.code() != Some(2) || *l != [line.clone()] {
                        problems.push(format!(
                            "{name} should exit 2 with the shim's one line {line:?}\n{}",
                            dump(o)
                        ));
                    }
                }
                if stdout(&check).contains("configuration OK") {
                    problems.push(format!("check said OK\n{}", dump(&check)));
                }
                if marker.exists() {
                    problems.push(format!("run started the program\n{}", dump(&ran)));
                }
                if !cmd_left.is_empty() {
                    problems.push(format!("check or run created {cmd_left:?}"));
                }
                let left = entries(&pools);
                if !left.is_empty() {
                    problems.push(format!("the refusing shim created {left:?}"));
                }
            }
        }
        if !problems.is_empty() {
            failures.push(format!("== {what}\n{}", problems.join("\n")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn run_flags_are_checked_like_the_variables() {
    for (flag, value) in [
        ("--guarantee", "1=1Gi"),
        ("--ceiling", "1=2Gi"),
        ("--limit", "1=1Gi"),
        ("--guarantee", &*format!("{}=1Gi", gpu(0))),
    ] {
        let dir = scratch("gpu-keys-flag");
        let marker = dir.join("started");
        let case = Case {
            env: vec![("GPUCAP_LIMIT".into(), "4Gi".into())],
            refused: None,
            lists_accepted: true,
        };
        let mut c = on_fake(cli(), &dir, &case);
        let args: Vec<OsString> = ["run", flag, value, "--", "sh", "-c", "touch \"$0\""]
            .into_iter()
            .map(OsString::from)
            .chain([marker.clone().into_os_string()])
            .collect();
        let o = run(c.args(&args));
        assert_eq!(o.status.code(), Some(2), "{flag} {value}\n{}", dump(&o));
        let lines = gpucap_lines(&o);
        assert_eq!(lines.len(), 1, "{}", dump(&o));
        assert!(
            lines[0].starts_with(&format!("gpucap: {flag} names "))
                && lines[0].contains(&accepted()),
            "{}",
            dump(&o)
        );
        assert!(!marker.exists(), "the program ran\n{}", dump(&o));
        assert!(entries(&dir.join("pools")).is_empty(), "{}", dump(&o));
    }
}
