//! Escapes users found: ways a program got the driver to hold more than its cap
//! through VMM handles (tests/c/escapes.c). Each runs as the
//! user hit it, with the shim (the program's own checks must pass, the fake driver's
//! recorded peak must stay within the cap, gpucap must have refused) and without it
//! (the same checks must fail: the escape is real).

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::*;

fn prog() -> PathBuf {
    compile_c("escapes", "", &["-lcuda"])
}

/// Runs `escapes args` on `devices` fake GPUs of 8 GiB, with the shim and
/// `GPUCAP_LIMIT=limit` when `limit` is given; `env` goes to the run too.
fn escapes(
    args: &[&str],
    devices: u32,
    limit: Option<&str>,
    env: &[(&str, &str)],
) -> (Output, Vec<DevStats>) {
    let stats = scratch(&format!("escapes-{}", args[0])).join("stats.json");
    let mut c = fake_cmd(prog(), &stats);
    c.env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", devices.to_string());
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

/// The escape without the shim: the program's checks of the cap fail.
#[track_caller]
fn control_fails(args: &[&str], devices: u32) -> Vec<DevStats> {
    let (o, s) = escapes(args, devices, None, &[]);
    assert_failed(&o, &format!("{} without the shim", args[0]));
    s
}

#[track_caller]
fn count(lines: &[String], needle: &str) -> usize {
    lines.iter().filter(|l| l.contains(needle)).count()
}

/// cuMemCreate -> cuMemAddressReserve -> cuMemMap -> cuMemSetAccess -> cuMemRelease at
/// once (NVIDIA's documented idiom), 8 x 512 MiB under a 1 GiB cap: the mapping keeps
/// the memory, so the cap stays charged until the last unmap.
#[test]
fn vmm_memory_released_while_mapped_stays_charged() {
    for env in [&[][..], &[("GPUCAP_GROWTH", "1")][..]] {
        let (o, s) = escapes(&["vmm-idiom", "1Gi"], 1, Some("1Gi"), env);
        assert_passed(&o, &format!("vmm-idiom with the shim {env:?}"));
        assert!(
            s[0].peak_used <= GIB,
            "the driver held more than the 1 GiB cap {env:?}: {:?}",
            s[0]
        );
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let refused = refusals(&stderr(&o));
        assert_eq!(
            count(
                &refused,
                "refused cuMemCreate of 512 MiB on GPU 0: 1 GiB of the 1 GiB cap in use"
            ),
            6,
            "the third to eighth rounds were refused {env:?}: {refused:?}"
        );
    }
    let s = control_fails(&["vmm-idiom", "1Gi"], 1);
    assert_eq!(
        s[0].peak_used,
        4 * GIB,
        "without the shim the driver holds all eight: {:?}",
        s[0]
    );
}

/// One handle mapped twice; a reference added by cuMemRetainAllocationHandle; one
/// cuMemUnmap over two mappings, one the driver refuses, a cuMemAddressFree that takes
/// a mapping with it: charged exactly while the driver holds the memory.
#[test]
fn vmm_memory_is_credited_at_the_last_unmap_and_the_last_reference() {
    for mode in ["vmm-aliases", "vmm-retain", "vmm-unmap-many"] {
        let (o, s) = escapes(&[mode, "1Gi"], 1, Some("1Gi"), &[]);
        assert_passed(&o, &format!("{mode} with the shim"));
        assert!(s[0].peak_used <= GIB, "{mode}: {:?}", s[0]);
        assert_eq!(s[0].final_used, 0, "{mode}: {:?}", s[0]);
        let refused = refusals(&stderr(&o));
        let want = match mode {
            "vmm-unmap-many" => 0,
            _ => 1,
        };
        assert_eq!(
            count(
                &refused,
                "refused cuMemCreate of 768 MiB on GPU 0: 512 MiB of the 1 GiB cap in use"
            ),
            want,
            "{mode}: {refused:?}"
        );
        control_fails(&[mode, "1Gi"], 1);
    }
}
