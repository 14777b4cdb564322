//! Contexts end, and the cap gets back everything the driver freed with them: the
//! context's own memory and every allocation and array still live in it, whichever call
//! ended it (tests/c/ctxloop.c). Not a stream-ordered pool allocation: it belongs to no
//! context (cuCtxDestroy in cuda.h), so it outlives the context, still valid and still
//! charged, until the program frees it. A context the shim cannot measure is never
//! passed silently.
//!
//! Each loop runs 100 rounds with `FAKECUDA_CONTEXT_MEM` set, under a 1 GiB cap: a
//! round that leaked its 64 MiB block (or its context) would exhaust the cap by the
//! 16th round. Every round checks that `cuMemGetInfo_v2` shows the free memory of the
//! start less the pool allocation once the context ended (the control run without the
//! shim checks the same of the fake), then, once another context of the device freed
//! it, the free memory of the start again. The fake driver's statistics confirm what it
//! really held.

use super::common;

use std::path::PathBuf;

use common::*;

const CAP: &str = "1Gi";
const PHYS: &str = "8Gi";

fn ctxloop() -> PathBuf {
    compile_c("ctxloop", "", &["-lcuda"])
}

/// Runs `ctxloop loop <how>` with the shim under CAP and without it (control).
fn loop_both_ways(how: &str) {
    let prog = ctxloop();
    let stats = scratch(&format!("ctxloop-{how}")).join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS)
        .env("FAKECUDA_CONTEXT_MEM", "32Mi");
    preload(&mut c).env("GPUCAP_LIMIT", CAP);
    let o = run(c.args(["loop", how, "100", "64Mi", CAP, PHYS]));
    assert_passed(&o, &format!("ctxloop {how} with the shim"));
    assert!(
        refusals(&stderr(&o)).is_empty(),
        "{how}: nothing is refused in a loop that gives everything back:\n{}",
        tail(&stderr(&o), 10)
    );
    let s = &read_stats(&stats)[0];
    assert!(
        s.peak_used <= GIB,
        "{how}: the driver held more than the cap: {s:?}"
    );
    assert_eq!(
        s.final_used, 0,
        "{how}: the driver holds nothing once every context ended: {s:?}"
    );

    // Control: the program's expectations are the driver's own.
    let stats = scratch(&format!("ctxloop-{how}-control")).join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS)
        .env("FAKECUDA_CONTEXT_MEM", "32Mi");
    let o = run(c.args(["loop", how, "100", "64Mi", "-", PHYS]));
    assert_passed(&o, &format!("ctxloop {how} without the shim (control)"));
}

#[test]
fn a_destroyed_context_gives_back_what_it_held() {
    loop_both_ways("destroy");
    loop_both_ways("destroy_v1");
}

/// cuCtxDetach of a created context's only usage count; of the primary context's only
/// reference (on the fake, a release).
#[test]
fn the_last_detach_gives_back_what_the_context_held() {
    loop_both_ways("detach");
    loop_both_ways("detach_primary");
}

/// cuCtxAttach adds a usage count: the first cuCtxDetach leaves the context, its block
/// usable and still charged; the second ends it and gives everything back (so does
/// cuCtxDestroy, whatever the count, in odd rounds).
#[test]
fn an_attached_context_lives_until_its_last_detach() {
    loop_both_ways("attach");
}

/// The primary context retained twice: the first release leaves it (still charged),
/// the second ends it.
#[test]
fn the_last_primary_release_gives_back_what_it_held() {
    loop_both_ways("release");
    loop_both_ways("release_v1");
}

#[test]
fn a_primary_reset_gives_back_what_it_held() {
    loop_both_ways("reset");
    loop_both_ways("reset_v1");
}

/// The fake driver's statistics as JSON: `contexts_created` is not in `DevStats`.
fn contexts_created(stats: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(stats).expect("stats written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats JSON");
    v["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| {
            d["contexts_created"]
                .as_u64()
                .unwrap_or_else(|| panic!("contexts_created in {text}"))
        })
        .collect()
}

/// A directory with the fake libcuda only: no NVML on the library path.
fn lib_dir_without_nvml() -> PathBuf {
    let dir = profile_dir().join("fakecuda-no-nvml");
    std::fs::create_dir_all(&dir).unwrap();
    let fake = fake_lib_dir().join("libcuda.so.1");
    let target = std::fs::read_link(&fake).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok() != Some(target.clone()) {
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp).unwrap();
            std::fs::rename(&tmp, &link).unwrap();
        }
    }
    dir
}

/// How NVML is (not) there for a first-use run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Nvml {
    /// The fake NVML on the library path.
    Present,
    /// No libnvidia-ml.so.1 to load.
    Missing,
    /// Its nvmlInit fails (`FAKECUDA_NVML_FAIL=1`).
    InitFails,
    /// Each GPU is one MIG instance (`FAKECUDA_MIG=1`): NVML's figure is not used.
    Mig,
}

const CTX_MEM: u64 = 32 * MIB;

/// `ctxloop first <call> <devices> 1Mi` on 2 GPUs of 8 GiB, each context taking
/// CTX_MEM; with the shim (under 1 GiB per GPU, `GPUCAP_LOG=debug` unless `env` says) or
/// without.
/// Returns the fake's contexts made per device, the `first` lines (dev, free, total)
/// and stderr.
fn first_use(
    nvml: Nvml,
    call: &str,
    devices: usize,
    shim: bool,
    env: &[(&str, &str)],
) -> (Vec<u64>, Vec<(u64, u64, u64)>, String) {
    let prog = ctxloop();
    let stats = scratch(&format!("first-{call}")).join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_DEVICES", "2")
        .env("FAKECUDA_TOTAL_MEM", PHYS)
        .env("FAKECUDA_CONTEXT_MEM", "32Mi");
    match nvml {
        Nvml::Present => {}
        Nvml::Missing => {
            c.env("LD_LIBRARY_PATH", lib_dir_without_nvml());
        }
        Nvml::InitFails => {
            c.env("FAKECUDA_NVML_FAIL", "1");
        }
        Nvml::Mig => {
            c.env("FAKECUDA_MIG", "1");
        }
    }
    if shim {
        preload(&mut c)
            .env("GPUCAP_LIMIT", CAP)
            .env("GPUCAP_LOG", "debug");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(c.args(["first", call, &devices.to_string(), "1Mi"]));
    let what = format!("first use ({call}, {nvml:?}, shim {shim}, {env:?})");
    assert_passed(&o, &what);
    let lines = stdout(&o)
        .lines()
        .filter_map(|l| l.strip_prefix("first "))
        .map(|l| {
            let kv: std::collections::BTreeMap<&str, u64> = l
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k, v.parse().unwrap()))
                .collect();
            (kv["dev"], kv["free"], kv["total"])
        })
        .collect();
    (contexts_created(&stats), lines, stderr(&o))
}

/// Under the cap, what each first context sees: the cap less its own context.
#[track_caller]
fn assert_charged_exactly(lines: &[(u64, u64, u64)], devices: usize, what: &str) {
    assert_eq!(lines.len(), devices, "{what}: {lines:?}");
    for &(dev, free, total) in lines {
        assert_eq!(
            (total, free),
            (GIB, GIB - CTX_MEM),
            "{what}: GPU {dev} shows the cap less its context's {CTX_MEM} bytes"
        );
    }
}

/// First use: the first context on each GPU is measured from NVML's free memory before
/// and after the program's own call, so the driver makes exactly the contexts the
/// program asked for (before, gpucap made a temporary one beside each first context),
/// and the charge is still exactly the context's memory. With and without the shared
/// device file (the fake NVML reads what all processes hold from it), with CUDA's
/// ordinals in another order than NVML's, and, for the control, without the shim.
#[test]
fn the_first_context_on_a_gpu_is_measured_without_another_context() {
    for call in ["create", "retain"] {
        for case in ["alone", "shared", "reordered"] {
            let file = scratch("first-shared").join("devices");
            let env = match case {
                "shared" => vec![("FAKECUDA_SHARED", file.to_str().unwrap())],
                // Ordinal 0 is physical GPU 1: NVML (physical order) is asked by UUID.
                "reordered" => vec![("CUDA_VISIBLE_DEVICES", "1,0")],
                _ => vec![],
            };
            let (made, lines, err) = first_use(Nvml::Present, call, 2, true, &env);
            let what = format!("{call} {env:?}");
            assert_eq!(
                made,
                [1, 1],
                "{what}: one context per GPU, the program's own:\n{err}"
            );
            assert_charged_exactly(&lines, 2, &what);
            for d in 0..2 {
                let api = if call == "create" {
                    "cuCtxCreate"
                } else {
                    "cuDevicePrimaryCtxRetain"
                };
                let want = format!(
                    "gpucap: {api}: the first context on GPU {d} is measured by NVML's free memory"
                );
                assert!(err.contains(&want), "{what}: no line {want:?}:\n{err}");
            }
            assert!(!err.contains("temporary context"), "{what}:\n{err}");
        }
        // Control: the program alone makes the same contexts.
        let (made, lines, _) = first_use(Nvml::Present, call, 2, false, &[]);
        assert_eq!(made, [1, 1], "{call} without the shim");
        assert_eq!(lines.len(), 2);
    }
}

/// Where NVML cannot be used (no libnvidia-ml.so.1, an nvmlInit that fails, a MIG
/// instance), the first context is measured with a temporary context as before: the
/// charge is still exact, the driver makes one context more, and a debug line says
/// why.
#[test]
fn without_nvml_the_first_context_is_measured_with_a_temporary_context() {
    for (nvml, why) in [
        (Nvml::Missing, "libnvidia-ml.so.1 cannot be loaded"),
        (Nvml::InitFails, "nvmlInit_v2 failed (error 9)"),
        (Nvml::Mig, "NVML has no GPU GPU-face0001-"),
    ] {
        for call in ["create", "retain"] {
            let what = format!("{call}, {nvml:?}");
            let (made, lines, err) = first_use(nvml, call, 1, true, &[]);
            assert_eq!(
                made,
                [2, 0],
                "{what}: the program's context and the temporary one"
            );
            assert_charged_exactly(&lines, 1, &what);
            let line = err
                .lines()
                .find(|l| l.contains("measured with a temporary context"))
                .unwrap_or_else(|| panic!("{what}: no line on the temporary context:\n{err}"));
            assert!(
                line.starts_with("gpucap: ") && line.contains(why),
                "{what}: {line:?} does not say {why:?}"
            );
        }
    }
    // A debug line: not shown at the default level.
    let (_, _, err) = first_use(Nvml::Missing, "create", 1, true, &[("GPUCAP_LOG", "info")]);
    assert!(!err.contains("temporary context"), "{err}");
}

/// The first context of a device is measured without another context: a device with
/// room for exactly one context gets it, charged, under a cap (before, the temporary
/// context left no room, so it could not be measured and was refused).
#[test]
fn with_nvml_a_gpu_with_room_for_one_context_gets_it_charged() {
    let prog = ctxloop();
    for call in ["create", "retain"] {
        let stats = scratch("ctx-room-for-one-nvml").join("stats.json");
        let mut c = fake_cmd(&prog, &stats);
        c.env("FAKECUDA_TOTAL_MEM", "1Gi")
            .env("FAKECUDA_CONTEXT_MEM", "600Mi")
            .env("GPUCAP_LOG", "error");
        preload(&mut c).env("GPUCAP_LIMIT", "1Gi");
        let o = run(c.args(["first", call, "1", "1Mi"]));
        assert_passed(&o, &format!("{call}: room for one context"));
        assert!(
            !stderr(&o).contains("gpucap:"),
            "{call}: nothing refused:\n{}",
            stderr(&o)
        );
        assert!(
            stdout(&o).contains(&format!("free={} total={}", 424 * MIB, GIB)),
            "{call}: the context's 600 MiB charged:\n{}",
            stdout(&o)
        );
        assert_eq!(contexts_created(&stats), [1], "{call}");
    }
}

/// The first context of a device is measured with a temporary context beside it when
/// NVML cannot be used. On a device with room for only one context, gpucap must not
/// make the program's context fail for want of room it took itself: the call is made
/// again without the temporary context, which leaves nothing to measure with. Under a
/// cap such a context is refused (gpucap cannot charge it), with one line at error
/// level; without a cap it is allowed, with a line saying it is not counted.
#[test]
fn a_context_that_cannot_be_measured_is_never_passed_silently() {
    let prog = ctxloop();
    for call in ["create", "retain"] {
        for (limit, expect) in [(Some("1Gi"), "refused"), (None, "allowed")] {
            let stats = scratch("ctx-room-for-one").join("stats.json");
            let mut c = fake_cmd(&prog, &stats);
            c.env("FAKECUDA_TOTAL_MEM", "1Gi")
                .env("FAKECUDA_CONTEXT_MEM", "600Mi")
                .env("LD_LIBRARY_PATH", lib_dir_without_nvml())
                .env("GPUCAP_LOG", "error");
            preload(&mut c);
            if let Some(l) = limit {
                c.env("GPUCAP_LIMIT", l);
            }
            let o = run(c.args(["roomforone", call, expect]));
            let what = format!("{call} under {limit:?}");
            assert_passed(&o, &what);
            let err = stderr(&o);
            let api = if call == "create" {
                "cuCtxCreate"
            } else {
                "cuDevicePrimaryCtxRetain"
            };
            let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpucap:")).collect();
            let want = match limit {
                Some(_) => format!(
                    "gpucap: refused {api} on GPU 0: the memory the context takes could not be measured"
                ),
                None => format!(
                    "gpucap: {api} on GPU 0: the memory the context takes could not be measured"
                ),
            };
            assert!(
                lines.len() == 1 && lines[0].starts_with(&want),
                "{what}: expected one line starting {want:?}, got:\n{err}"
            );
            assert!(
                lines[0].contains("no room for the temporary context"),
                "{what}: {}",
                lines[0]
            );
            if limit.is_none() {
                assert!(
                    lines[0].ends_with("not counted (GPU 0 has no cap)"),
                    "{}",
                    lines[0]
                );
            }
            let s = &read_stats(&stats)[0];
            assert_eq!(s.final_used, 0, "{what}: {s:?}");
            assert!(
                s.peak_used <= 600 * MIB,
                "{what}: never two contexts at once on a device with room for one: {s:?}"
            );
        }
    }
    // Control: without the shim the context fits.
    let stats = scratch("ctx-room-for-one-control").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", "1Gi")
        .env("FAKECUDA_CONTEXT_MEM", "600Mi");
    let o = run(c.args(["roomforone", "create", "allowed"]));
    assert_passed(&o, "room for one context, without the shim");
}

/// The fake NVML answers as the real one, which the first-context measurement relies on:
/// a GPU's used memory counts this process's contexts and allocations (the driver's
/// own figures), with and without the shared device file. Without the shim.
#[test]
fn the_fake_nvml_counts_this_process_s_context_in_used_memory() {
    common::fake_nvml();
    let prog = compile_c("nvml", "", &["-lnvidia-ml", "-lcuda"]);
    for shared in [false, true] {
        let dir = scratch("nvml-ctx-used");
        let mut c = fake_cmd(&prog, &dir.join("stats.json"));
        c.env("FAKECUDA_TOTAL_MEM", PHYS)
            .env("FAKECUDA_CONTEXT_MEM", "32Mi");
        if shared {
            c.env("FAKECUDA_SHARED", dir.join("devices"));
        }
        let o = run(c.args(["consistent", "dl", "64Mi"]));
        assert_passed(&o, &format!("nvml consistent, shared {shared}"));
        let out = stdout(&o);
        let line = |prefix: &str| out.lines().find(|l| l.starts_with(prefix)).unwrap();
        // v2's used is the driver's own figure; v1's adds what the driver reserves.
        assert!(
            line("nvml v2 ").ends_with(&format!("used={}", 96 * MIB)),
            "shared {shared}: NVML's used is the context's 32 MiB and the 64 MiB block: {out}"
        );
        let reserved = 644_939_776; // the fake's default FAKECUDA_NVML_RESERVED
        assert!(
            line("cuda ").ends_with(&format!("used={}", 96 * MIB + reserved)),
            "shared {shared}: v1: {out}"
        );
    }
}
