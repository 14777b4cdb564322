//! A context is charged to the GPU it is made on, through every call that makes one
//! (`cuDevicePrimaryCtxRetain`, `cuCtxCreate`, `_v2`, `_v3`, `_v4`), whether or not a
//! context is current and whichever GPU that one is on; one the cap cannot take is
//! undone and refused with `CUDA_ERROR_OUT_OF_MEMORY` and gpucap's line. Once a context
//! of a GPU was measured, the next is checked against the cap before the driver makes
//! it: the driver never holds more than the cap (tests/c/ctxcharge.c, on the fake GPU
//! with `FAKECUDA_CONTEXT_MEM`; the pool's case is in tests/pool/pool/contexts.rs).

use super::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

const MIB: u64 = 1 << 20;
const OOM: i32 = 2;

/// Every call that makes a context: the program's step and the API gpucap names.
const PATHS: [(&str, &str); 5] = [
    ("retain", "cuDevicePrimaryCtxRetain"),
    ("create", "cuCtxCreate"),
    ("create_v1", "cuCtxCreate"),
    ("create_v3", "cuCtxCreate_v3"),
    ("create_v4", "cuCtxCreate_v4"),
];

fn ctxcharge() -> PathBuf {
    compile_c("ctxcharge", "", &["-lcuda"])
}

/// Runs ctxcharge's `steps` under `limit` on `gpus` fake GPUs of 1 GiB whose contexts
/// take 16 MiB each; returns its output and its stats file.
fn charge(tag: &str, limit: &str, gpus: u32, steps: &[&str]) -> (Output, PathBuf) {
    let stats = scratch(tag).join("stats.json");
    let mut c = fake_cmd(ctxcharge(), &stats);
    c.env("FAKECUDA_TOTAL_MEM", "1Gi")
        .env("FAKECUDA_DEVICES", gpus.to_string())
        .env("FAKECUDA_CONTEXT_MEM", "16Mi");
    preload(&mut c).env("GPUCAP_LIMIT", limit);
    let o = run(c.args(steps));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    (o, stats)
}

/// `field` of GPU `ordinal` in the fake's stats.
fn stat(stats: &Path, ordinal: u64, field: &str) -> u64 {
    let text = std::fs::read_to_string(stats).expect("stats written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats JSON");
    v["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["ordinal"].as_u64() == Some(ordinal))
        .and_then(|d| d[field].as_u64())
        .unwrap_or_else(|| panic!("{field} of GPU {ordinal} in {text}"))
}

fn says(o: &Output, line: &str) -> bool {
    stdout(o).lines().any(|l| l == line)
}

/// The case: a 10 MiB cap, contexts of 16 MiB, no context current. Each call
/// that makes a context is refused, the context undone, one line says so; a second
/// try is refused before the driver is even asked (the size is known by then), and
/// prints no second line (the same refusal again at once).
#[test]
fn a_context_that_breaks_the_cap_is_refused_with_no_context_current() {
    for (step, api) in PATHS {
        let what = format!("{step} under a 10 MiB cap");
        let (o, stats) = charge(
            &format!("ctx-over-{step}"),
            "10Mi",
            1,
            &[&format!("{step}:0"), &format!("{step}:0")],
        );
        let want = format!("{step} 0 {OOM}");
        assert_eq!(
            stdout(&o).lines().filter(|l| *l == want).count(),
            2,
            "{what}: both refused with CUDA_ERROR_OUT_OF_MEMORY\n{}",
            dump(&o)
        );
        // Both calls refused (above); the second, the same request again at once, prints
        // no second line (one line per refusal the program sees: docs/src/counting.md).
        let lines = refusals(&stderr(&o));
        assert_eq!(
            lines.len(),
            1,
            "{what}: one line for the repeat\n{}",
            dump(&o)
        );
        for l in &lines {
            assert!(
                l.starts_with(&format!("gpucap: refused {api} of 16 MiB on GPU 0: "))
                    && l.ends_with("of the 10 MiB cap in use"),
                "{what}: {l}"
            );
        }
        assert_eq!(stat(&stats, 0, "final_used"), 0, "{what}: undone");
        assert_eq!(
            stat(&stats, 0, "contexts_created"),
            1,
            "{what}: the second was refused before the driver made it"
        );
    }
}

/// Contexts that fit are charged, with no context current; the one that would break
/// the cap is refused before the driver makes it: the driver never holds more than the
/// cap, even for a moment.
#[test]
fn once_a_context_was_measured_the_next_is_checked_before_it_is_made() {
    for (step, api) in PATHS {
        let what = format!("{step} under a 40 MiB cap");
        // A retain makes nothing once the primary context is active: the two that fit
        // are created contexts, the third is the call under test.
        let (o, stats) = charge(
            &format!("ctx-precheck-{step}"),
            "40Mi",
            1,
            &["create:0", "create:0", &format!("{step}:0"), "info:0"],
        );
        assert!(says(&o, "create 0 0"), "{what}\n{}", dump(&o));
        assert!(says(&o, &format!("{step} 0 {OOM}")), "{what}\n{}", dump(&o));
        assert!(
            says(&o, &format!("info 0 {} {}", 8 * MIB, 40 * MIB)),
            "{what}: two contexts of 16 MiB charged\n{}",
            dump(&o)
        );
        let lines = refusals(&stderr(&o));
        assert!(
            lines.len() == 1
                && lines[0].starts_with(&format!("gpucap: refused {api} of 16 MiB on GPU 0: ")),
            "{what}: {lines:?}"
        );
        assert_eq!(stat(&stats, 0, "contexts_created"), 2, "{what}");
        let peak = stat(&stats, 0, "peak_used");
        assert!(
            peak <= 40 * MIB,
            "{what}: the driver held {peak} bytes, over the 40 MiB cap"
        );
    }
}

/// Two GPUs, GPU 1's primary context current: a context made on GPU 0 is charged to
/// GPU 0 (GPU 1 keeps its room), and one that breaks GPU 0's cap is refused whatever
/// GPU 1 has left.
#[test]
fn a_context_is_charged_to_its_own_gpu_while_another_gpus_context_is_current() {
    for (step, api) in PATHS {
        let what = format!("{step} on GPU 0 with GPU 1 current");
        let (o, stats) = charge(
            &format!("ctx-two-gpus-{step}"),
            "40Mi",
            2,
            &[
                "retain:1",
                "current:1",
                "create:0",
                &format!("{step}:0"),
                "info:0",
                "info:1",
                "alloc:24Mi",
                "alloc:1Mi",
            ],
        );
        let out = dump(&o);
        assert!(
            says(&o, "retain 1 0") && says(&o, "current 1 0"),
            "{what}\n{out}"
        );
        let second_ok = if step == "create" {
            stdout(&o).lines().filter(|l| *l == "create 0 0").count() == 2
        } else {
            says(&o, &format!("{step} 0 0"))
        };
        assert!(second_ok, "{what}: two contexts fit on GPU 0\n{out}");
        assert!(
            says(&o, &format!("info 0 {} {}", 8 * MIB, 40 * MIB)),
            "{what}: GPU 0 charged both\n{out}"
        );
        assert!(
            says(&o, &format!("info 1 {} {}", 24 * MIB, 40 * MIB)),
            "{what}: GPU 1 charged its own context only\n{out}"
        );
        assert!(
            says(&o, &format!("alloc {} 0", 24 * MIB)),
            "{what}: GPU 1 has its 24 MiB\n{out}"
        );
        assert!(says(&o, &format!("alloc {} {OOM}", MIB)), "{what}\n{out}");
        assert!(stat(&stats, 0, "peak_used") <= 40 * MIB, "{what}");
        // The third context on GPU 0 breaks its cap, GPU 1 current.
        let (o, stats) = charge(
            &format!("ctx-two-gpus-over-{step}"),
            "40Mi",
            2,
            &[
                "retain:1",
                "current:1",
                "create:0",
                "create:0",
                &format!("{step}:0"),
            ],
        );
        assert!(says(&o, &format!("{step} 0 {OOM}")), "{what}\n{}", dump(&o));
        let lines = refusals(&stderr(&o));
        assert!(
            lines.len() == 1
                && lines[0].starts_with(&format!("gpucap: refused {api} of 16 MiB on GPU 0: ")),
            "{what}: {lines:?}"
        );
        assert!(stat(&stats, 0, "peak_used") <= 40 * MIB, "{what}");
        assert_eq!(stat(&stats, 0, "contexts_created"), 2, "{what}");
    }
}
