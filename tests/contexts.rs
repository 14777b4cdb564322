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

mod common;

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

/// The first context of a device is measured with a temporary context beside it. On a
/// device with room for only one context, gpucap must not make the program's context
/// fail for want of room it took itself: the call is made again without the
/// temporary context, which leaves nothing to measure with. Under a cap such a context
/// is refused (gpucap cannot charge it), with one line at error level; without a cap
/// it is allowed, with a line saying it is not counted.
#[test]
fn a_context_that_cannot_be_measured_is_never_passed_silently() {
    let prog = ctxloop();
    for call in ["create", "retain"] {
        for (limit, expect) in [(Some("1Gi"), "refused"), (None, "allowed")] {
            let stats = scratch("ctx-room-for-one").join("stats.json");
            let mut c = fake_cmd(&prog, &stats);
            c.env("FAKECUDA_TOTAL_MEM", "1Gi")
                .env("FAKECUDA_CONTEXT_MEM", "600Mi")
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
