//! No value of `GPUCAP_LIMIT` makes gpucap crash. Whatever text (multi-byte characters
//! where a `GPU-`/`MIG-` prefix or a number ends, separators, units) or bytes that are not
//! UTF-8, `gpucap check` either accepts it (exit 0) or refuses it (exit 2, with its
//! message), never exit 101 with a Rust backtrace; and under `LD_PRELOAD` the program's
//! `cuInit` returns 0 or `CUDA_ERROR_NOT_PERMITTED` (800), never `CUDA_ERROR_UNKNOWN`
//! (999, what a panic caught in a hook becomes).
//!
//! The values are generated from a fixed seed (the same every run), plus the inputs that
//! once panicked (`GPUé=1Gi`, `ab€=1`).

use super::common;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::process::Output;

use common::*;

/// A small deterministic generator (xorshift64*): the same values on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Pieces the parsers look at, and characters a byte offset would cut in two.
const PIECES: &[&str] = &[
    "GPU-",
    "MIG-",
    "GPU",
    "gpu-",
    "mig-",
    "MIG-GPU-",
    "face0000",
    "-0000",
    "000000000001",
    "é",
    "€",
    "𝄞",
    "ß",
    "\u{fffd}",
    "\u{a0}",
    "\u{3000}",
    "ab",
    "0",
    "1",
    "7",
    "63",
    "64",
    "99999999999999999999",
    ".",
    "..",
    "%",
    "=",
    ",",
    " ",
    "\t",
    "-",
    "+",
    "Gi",
    "MiB",
    "k",
    "B",
    "e9",
    "0x",
];

/// The values to try: the ones that once panicked, then generated ones, then a few that
/// are not UTF-8 (only the environment can carry those).
fn hostile_values() -> Vec<OsString> {
    let mut out: Vec<OsString> = [
        "GPUé=1Gi",
        "ab€=1",
        "MIG-é=1Gi",
        "MIG-abc€=1Gi",
        "1Gi,GPU€=2Gi",
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    while out.len() < 120 {
        let n = 1 + rng.below(8);
        let s: String = (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect();
        out.push(s.into());
    }
    for bytes in [
        &b"GPU\xff=1Gi"[..],
        b"0=1G\xe9i",
        b"\xc3=1Gi",
        b"GPU-\xe2\x82=1",
    ] {
        out.push(OsString::from_vec(bytes.to_vec()));
    }
    out
}

/// No sign of a panic in what a program printed.
#[track_caller]
fn no_panic(o: &Output, value: &OsString) {
    let err = stderr(o);
    for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace"] {
        assert!(
            !err.contains(bad),
            "GPUCAP_LIMIT={value:?}: {bad}\n{}",
            dump(o)
        );
    }
}

#[test]
fn gpucap_check_accepts_or_refuses_every_value_and_never_crashes() {
    let dir = scratch("hostile-check");
    for value in hostile_values() {
        let mut c = fake_cmd(cli(), &dir.join("stats.json"));
        c.arg("check").env("GPUCAP_LIMIT", &value);
        let o = run(&mut c);
        no_panic(&o, &value);
        match o.status.code() {
            Some(0) => assert!(
                stdout(&o).starts_with("gpucap: configuration OK\n"),
                "{value:?}\n{}",
                dump(&o)
            ),
            Some(2) => {
                // Refused in one line that says what was wrong.
                let err = stderr(&o);
                assert_eq!(err.lines().count(), 1, "{value:?}\n{}", dump(&o));
                assert!(
                    err.starts_with("gpucap: invalid GPUCAP_LIMIT=")
                        || err.starts_with("gpucap: GPUCAP_LIMIT names "),
                    "{value:?}\n{}",
                    dump(&o)
                );
            }
            _ => panic!(
                "GPUCAP_LIMIT={value:?}: exit status not 0 or 2\n{}",
                dump(&o)
            ),
        }
        // The same text as a flag, where it is one.
        if let Some(text) = value.to_str() {
            let o = run(fake_cmd(cli(), &dir.join("stats.json")).args(["check", "--limit", text]));
            no_panic(&o, &value);
            assert!(
                matches!(o.status.code(), Some(0 | 2)),
                "--limit {text:?}\n{}",
                dump(&o)
            );
        }
    }
}

fn identity_prog() -> PathBuf {
    compile_c("identity", "", &["-lcuda"])
}

#[test]
fn cuinit_under_the_shim_returns_0_or_800_for_every_value() {
    let prog = identity_prog();
    let dir = scratch("hostile-shim");
    let mut refused = 0;
    for value in hostile_values() {
        let mut c = fake_cmd(&prog, &dir.join("stats.json"));
        preload(&mut c).env("GPUCAP_LIMIT", &value).arg("1048576");
        let o = run(&mut c);
        no_panic(&o, &value);
        assert!(o.status.success(), "{value:?}\n{}", dump(&o));
        let out = stdout(&o);
        let init = out.lines().next().unwrap_or_default();
        match init {
            "init rc=0" => {}
            "init rc=800" => {
                refused += 1;
                // Fails closed: the next call is refused too, and stderr says why.
                assert!(out.contains("after rc=800"), "{value:?}\n{}", dump(&o));
                assert!(
                    stderr(&o).lines().any(|l| l.starts_with("gpucap: ")),
                    "{value:?}\n{}",
                    dump(&o)
                );
            }
            other => panic!(
                "GPUCAP_LIMIT={value:?}: cuInit gave {other:?}\n{}",
                dump(&o)
            ),
        }
    }
    // The values are hostile: most of them are refused.
    assert!(refused > 60, "only {refused} values refused");
}

#[test]
fn hami_variables_are_accepted_or_refused_for_every_value_never_a_crash() {
    let dir = scratch("hostile-hami");
    for var in ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0"] {
        for value in hostile_values() {
            let mut c = fake_cmd(cli(), &dir.join("stats.json"));
            c.arg("check").env(var, &value);
            let o = run(&mut c);
            no_panic(&o, &value);
            match o.status.code() {
                Some(0) => assert!(
                    stdout(&o).starts_with("gpucap: configuration OK\n"),
                    "{var}={value:?}\n{}",
                    dump(&o)
                ),
                Some(2) => {
                    let err = stderr(&o);
                    assert_eq!(err.lines().count(), 1, "{var}={value:?}\n{}", dump(&o));
                    assert!(
                        err.starts_with(&format!("gpucap: invalid {var}=")),
                        "{var}={value:?}\n{}",
                        dump(&o)
                    );
                }
                _ => panic!("{var}={value:?}: exit status not 0 or 2\n{}", dump(&o)),
            }
        }
    }
}

/// A bare number under 1 MiB (`8`: 8 bytes, surely 8 GiB meant) is refused in every
/// door like any other bad value: `gpucap check` exits 2 with the unit it lacks, and
/// under the shim `cuInit` fails closed (800), as do NVML's memory calls, with the same
/// line, for `GPUCAP_LIMIT` (one value, per GPU, by UUID) and HAMi-core's variables.
#[test]
fn a_bare_number_under_a_mebibyte_fails_closed_in_every_door() {
    let prog = identity_prog();
    fake_nvml();
    let nvml = compile_c("nvml", "", &["-lnvidia-ml", "-lcuda"]);
    let dir = scratch("hostile-bare");
    for (var, value, says) in [
        ("GPUCAP_LIMIT", "8", "did you mean 8Gi?"),
        ("GPUCAP_LIMIT", "0=8,1=4Gi", "did you mean 8Gi?"),
        ("GPUCAP_LIMIT", "4Gi,0=512", "did you mean 512Gi?"),
        (
            "GPUCAP_LIMIT",
            "GPU-face0000-0000-0000-0000-000000000001=4096",
            "did you mean 4096Mi?",
        ),
        ("CUDA_DEVICE_MEMORY_LIMIT", "8", "did you mean 8g?"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "8", "did you mean 8g?"),
    ] {
        let what = format!("{var}={value}");
        let o = run(fake_cmd(cli(), &dir.join("stats.json"))
            .arg("check")
            .env(var, value));
        assert_eq!(o.status.code(), Some(2), "{what}\n{}", dump(&o));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{what}\n{}", dump(&o));
        assert!(
            err.starts_with(&format!("gpucap: invalid {var}=")) && err.contains(says),
            "{what}\n{}",
            dump(&o)
        );

        let mut c = fake_cmd(&prog, &dir.join("stats.json"));
        preload(&mut c).env(var, value).arg("1048576");
        let o = run(&mut c);
        let out = stdout(&o);
        assert!(
            out.starts_with("init rc=800\n") && out.contains("after rc=800"),
            "{what}\n{}",
            dump(&o)
        );
        assert!(stderr(&o).contains(says), "{what}\n{}", dump(&o));

        let mut c = fake_cmd(&nvml, &dir.join("stats.json"));
        preload(&mut c).env(var, value).args(["denied", "dl"]);
        let o = run(&mut c);
        assert!(o.status.success(), "nvml under {what}\n{}", dump(&o));
        assert!(stderr(&o).contains(says), "nvml under {what}\n{}", dump(&o));
    }
    // From 1 MiB a bare number is bytes, in every door.
    let mut c = fake_cmd(&prog, &dir.join("stats.json"));
    preload(&mut c)
        .env("GPUCAP_LIMIT", "1048576")
        .arg("1048576");
    let o = run(&mut c);
    assert!(stdout(&o).starts_with("init rc=0\n"), "{}", dump(&o));
}
