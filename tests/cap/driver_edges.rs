//! Driver-level edge cases HAMi-core's users reported (tests/c/edges.c): host-located VMM memory and memory imported from another API are
//! neither refused nor charged to a GPU, and stay destroyable; device memory is still
//! charged beside them. Each runs alone and in a pool, with the shim; without it the
//! program's checks of the cap fail (its refusals and capped figures are gpucap's).
//! `cuMemGetInfo` with a NULL figure is tests/c/misuse.c's (`bad_queries`).

use super::common;

use std::path::PathBuf;
use std::process::Output;

use common::*;

fn prog() -> PathBuf {
    compile_c("edges", "", &["-lcuda"])
}

/// Runs `edges args` on `devices` fake GPUs of 8 GiB with two host NUMA nodes, with the
/// shim and `GPUCAP_LIMIT=limit` when `limit` is given; `env` goes to the run too.
fn edges(
    args: &[&str],
    devices: u32,
    limit: Option<&str>,
    env: &[(&str, &str)],
) -> (Output, Vec<DevStats>) {
    let stats = scratch(&format!("edges-{}", args[0])).join("stats.json");
    let mut c = fake_cmd(prog(), &stats);
    c.env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", devices.to_string())
        .env("FAKECUDA_NUMA_NODES", "2");
    if let Some(limit) = limit {
        preload(&mut c).env("GPUCAP_LIMIT", limit);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(c.args(args));
    let s = read_stats(&stats);
    (o, s)
}

/// The environments each case runs in: alone, and as a member of a pool.
fn setups(tag: &str) -> Vec<Vec<(&'static str, String)>> {
    let dir = scratch(&format!("edges-{tag}-pool"));
    vec![
        vec![],
        vec![
            ("GPUCAP_POOL", tag.to_string()),
            ("GPUCAP_POOL_DIR", dir.to_str().unwrap().to_string()),
        ],
    ]
}

/// `cuMemCreate` with a host, host-NUMA (id 1) or current-host-NUMA (id 1) location:
/// host memory, never charged to a GPU, and location id 1 is never read as GPU 1 (whose
/// cap is 32 MiB: 256 MiB there would be refused); device memory is still charged, and
/// CUDA 13.4's device-locality memory (type 6) on the device its id names; a location
/// type gpucap does not know is refused with a line.
#[test]
fn host_located_vmm_memory_is_never_charged_to_a_gpu() {
    for env in setups("host-vmm") {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (o, s) = edges(
            &["host-vmm", "32Mi", "32Mi"],
            2,
            Some("0=32Mi,1=32Mi"),
            &env,
        );
        assert_passed(&o, &format!("host-vmm with the shim {env:?}"));
        let refused = refusals(&stderr(&o));
        let (granules, others): (Vec<&String>, Vec<&String>) = refused
            .iter()
            .partition(|r| r.contains("refused cuMemCreate of 2 MiB"));
        assert_eq!(
            granules.len(),
            2,
            "only the device granules past each cap are refused {env:?}: {refused:?}"
        );
        // Device-locality memory (type 6) is charged to the GPU its id's first byte names:
        // 256 MiB past GPU 1's cap refused as any device memory (before, every type 6
        // request was refused, one granule within the cap too, naming no GPU).
        let (locality, unknown): (Vec<&String>, Vec<&String>) = others
            .iter()
            .partition(|r| r.contains("refused cuMemCreate of 256 MiB on GPU 1"));
        assert_eq!(locality.len(), 1, "{refused:?}");
        // A location type gpucap does not know is refused before the driver is asked.
        assert_eq!(unknown.len(), 1, "{refused:?}");
        assert!(
            unknown[0].contains("cannot tell which GPU memory of location type 7 is on"),
            "{refused:?}"
        );
        for d in &s {
            assert!(d.peak_used <= 32 << 20, "{env:?}: {d:?}");
            assert_eq!(d.final_used, 0, "{d:?}");
        }
    }
    let (o, _) = edges(&["host-vmm", "32Mi", "32Mi"], 2, None, &[]);
    assert_failed(&o, "host-vmm without the shim");
}

/// Memory another API allocated and CUDA imported (`cuImportExternalMemory`, mapped
/// twice with `cuExternalMemoryGetMappedBuffer`): not refused, not charged (8 times
/// the cap imported, the cap still whole for CUDA's own memory), always destroyable.
#[test]
fn imported_external_memory_is_never_charged_and_always_destroyable() {
    for env in setups("external") {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (o, s) = edges(&["external", "64Mi"], 1, Some("64Mi"), &env);
        assert_passed(&o, &format!("external with the shim {env:?}"));
        let refused = refusals(&stderr(&o));
        assert_eq!(
            refused.len(),
            1,
            "only CUDA's own memory past the cap {env:?}: {refused:?}"
        );
        assert!(s[0].peak_used <= 64 << 20, "{env:?}: {:?}", s[0]);
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
    }
    let (o, _) = edges(&["external", "64Mi"], 1, None, &[]);
    assert_failed(&o, "external without the shim");
}

/// A multicast object (`FAKECUDA_MULTICAST=1`) takes no memory of its own, as NVIDIA
/// documents it; memory bound to it is charged once, at its `cuMemCreate`, and held by
/// the binding: released (and unmapped) while bound it stays charged, and what the cap
/// cannot take beside it is refused, until it is unbound or the object is released.
/// Alone and in a pool; the fake's own figure never passes the cap and ends at 0. A shim
/// that credits a bound handle at its release serves the refused allocations (the fake
/// then holds more than the cap); without multicast the calls answer
/// `CUDA_ERROR_NOT_SUPPORTED` through the shim too.
#[test]
fn memory_bound_to_a_multicast_object_is_charged_once_while_bound() {
    for env in setups("multicast") {
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.push(("FAKECUDA_MULTICAST", "1"));
        let (o, s) = edges(&["multicast", "1Gi"], 1, Some("1Gi"), &env);
        assert_passed(&o, &format!("multicast with the shim {env:?}"));
        // Both refusals (the program checks each) say the same, printed once.
        let refused = refusals(&stderr(&o));
        let line = format!(
            "gpucap: refused cuMemAlloc of 514 MiB on GPU 0: 512 MiB of {} 1 GiB cap in use",
            super::escapes::of_the(&env)
        );
        assert!(
            refused.len() == 1 && refused[0].starts_with(&line),
            "only the allocations past the bound memory {env:?}: {line:?} in {refused:?}"
        );
        assert!(s[0].peak_used <= 1 << 30, "{env:?}: {:?}", s[0]);
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
    }
    let (o, _) = edges(&["multicast", "1Gi"], 1, Some("1Gi"), &[]);
    assert_passed(&o, "multicast unsupported, with the shim");
    let (o, _) = edges(
        &["multicast", "1Gi"],
        1,
        None,
        &[("FAKECUDA_MULTICAST", "1")],
    );
    assert_failed(&o, "multicast without the shim");
}
