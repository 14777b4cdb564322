//! Device identity: `GPUCAP_LIMIT` keys may be GPU UUIDs (`GPU-…`) and MIG UUIDs
//! (`MIG-…`) as well as ordinals; the shim maps them to the CUDA ordinals the process
//! sees (after `CUDA_VISIBLE_DEVICES`, as indices, UUIDs or MIG UUIDs, which the driver
//! applies) through `cuDeviceGetUuid_v2`. A key that names no visible device makes
//! `cuInit` fail with `CUDA_ERROR_NOT_PERMITTED` (800) and a message naming it, and
//! every later call fail the same way.
//!
//! The fake driver's physical GPU `P` has UUID `GPU-face0000-0000-0000-0000-00000000000P`,
//! its MIG instance (`FAKECUDA_MIG=1`) `MIG-face0001-0000-0000-0000-00000000000P`.

use super::common;

use std::path::PathBuf;
use std::process::Output;

use common::*;

fn prog() -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    compile_c("identity", "", &["-lcuda"])
}

fn gpu(p: u8) -> String {
    format!("GPU-face0000-0000-0000-0000-{p:012x}")
}

fn mig(p: u8) -> String {
    format!("MIG-face0001-0000-0000-0000-{p:012x}")
}

/// One `ordinal` line: (uuid hex, total, free, alloc rc).
#[derive(Debug, PartialEq)]
struct Ordinal {
    uuid: String,
    total: u64,
    free: u64,
    alloc: i32,
}

fn ordinals(o: &Output) -> Vec<Ordinal> {
    stdout(o)
        .lines()
        .filter(|l| l.starts_with("ordinal "))
        .map(|l| {
            let f = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .unwrap_or_else(|| panic!("{k} in {l}"))
                    .to_string()
            };
            Ordinal {
                uuid: f("uuid"),
                total: f("total").parse().unwrap(),
                free: f("free").parse().unwrap(),
                alloc: f("alloc").parse().unwrap(),
            }
        })
        .collect()
}

/// Runs the program with `devices` fake GPUs of 8 GiB, `env` extra, the shim and
/// `limit`, trying an allocation of `alloc`.
fn run_with(devices: &str, env: &[(&str, &str)], limit: &str, alloc: &str) -> Output {
    let stats = scratch("identity").join("stats.json");
    let mut c = fake_cmd(prog(), &stats);
    c.env("FAKECUDA_DEVICES", devices)
        .env("FAKECUDA_TOTAL_MEM", "8Gi");
    for (k, v) in env {
        c.env(k, v);
    }
    preload(&mut c).env("GPUCAP_LIMIT", limit);
    let o = run(c.arg(alloc));
    assert!(
        o.status.success(),
        "identity: {:?}\n{}\n{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    o
}

fn hex(uuid: &str) -> String {
    uuid[4..].replace('-', "")
}

#[test]
fn a_gpu_uuid_key_caps_the_ordinal_that_gpu_has_after_reordering() {
    // CUDA_VISIBLE_DEVICES=2,0: ordinal 0 is physical GPU 2.
    let o = run_with(
        "3",
        &[("CUDA_VISIBLE_DEVICES", "2,0")],
        &format!("{}=1Gi", gpu(2)),
        "1536Mi",
    );
    assert!(stdout(&o).contains("init rc=0"), "{}", stdout(&o));
    let ords = ordinals(&o);
    assert_eq!(
        ords,
        vec![
            Ordinal {
                uuid: hex(&gpu(2)),
                total: GIB,
                free: GIB,
                alloc: 2
            },
            Ordinal {
                uuid: hex(&gpu(0)),
                total: 8 * GIB,
                free: 8 * GIB,
                alloc: 0
            },
        ]
    );
    assert!(
        refusals(&stderr(&o)).iter().any(|l| l.contains("on GPU 0")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn uuid_and_ordinal_keys_mix_with_a_default() {
    // Visibility by UUID; the key of physical GPU 1 by UUID, ordinal 1 (physical 2) by
    // ordinal, the rest (physical 0, ordinal 2) by the default.
    let visible = format!("{},{},0", gpu(1), gpu(2));
    let o = run_with(
        "3",
        &[("CUDA_VISIBLE_DEVICES", &visible)],
        &format!(
            "3Gi,{}=2Gi,1=1Gi",
            gpu(1).to_uppercase().replacen("GPU", "gpu", 1)
        ),
        "1536Mi",
    );
    let totals: Vec<(String, u64, i32)> = ordinals(&o)
        .into_iter()
        .map(|d| (d.uuid, d.total, d.alloc))
        .collect();
    assert_eq!(
        totals,
        vec![
            (hex(&gpu(1)), 2 * GIB, 0),
            (hex(&gpu(2)), GIB, 2),
            (hex(&gpu(0)), 3 * GIB, 0)
        ]
    );
}

#[test]
fn a_mig_uuid_key_caps_that_instance() {
    let visible = format!("{},{}", mig(1), mig(0));
    let o = run_with(
        "2",
        &[("FAKECUDA_MIG", "1"), ("CUDA_VISIBLE_DEVICES", &visible)],
        &format!("{}=4Gi", mig(0)),
        "5Gi",
    );
    let ords = ordinals(&o);
    assert_eq!(ords.len(), 2, "{}", stdout(&o));
    assert_eq!(
        (ords[0].uuid.clone(), ords[0].total, ords[0].alloc),
        (hex(&mig(1)), 8 * GIB, 0)
    );
    assert_eq!(
        (ords[1].uuid.clone(), ords[1].total, ords[1].alloc),
        (hex(&mig(0)), 4 * GIB, 2)
    );
}

#[test]
fn a_key_that_matches_no_visible_device_fails_closed() {
    for (env, limit, needle) in [
        // Physical GPU 1 exists but is hidden.
        (
            vec![("CUDA_VISIBLE_DEVICES", "2,0")],
            format!("1Gi,{}=2Gi", gpu(1)),
            gpu(1),
        ),
        // No such GPU at all.
        (vec![], format!("{}=2Gi", gpu(9)), gpu(9)),
        // With MIG the CUDA devices are the instances: a GPU UUID names none of them.
        (
            vec![("FAKECUDA_MIG", "1")],
            format!("{}=2Gi", gpu(0)),
            gpu(0),
        ),
        // Named twice: by ordinal and by UUID.
        (
            vec![],
            format!("0=1Gi,{}=2Gi", gpu(0)),
            "names GPU 0 twice".to_string(),
        ),
    ] {
        let o = run_with("3", &env, &limit, "1Mi");
        let out = stdout(&o);
        assert!(
            out.contains("init rc=800") && out.contains("after rc=800"),
            "{limit}: {out}"
        );
        let err = stderr(&o);
        assert!(
            err.lines()
                .any(|l| l.starts_with("gpucap: GPUCAP_LIMIT names") && l.contains(&needle)),
            "{limit}: no message naming {needle}:\n{err}"
        );
    }
}

#[test]
fn ordinal_keys_follow_cuda_visible_devices_too() {
    let o = run_with("3", &[("CUDA_VISIBLE_DEVICES", "2,0")], "0=1Gi", "1536Mi");
    let ords = ordinals(&o);
    assert_eq!((ords[0].uuid.clone(), ords[0].total), (hex(&gpu(2)), GIB));
    assert_eq!(ords[1].total, 8 * GIB);
}

#[test]
fn an_ordinal_key_past_the_visible_gpus_fails_closed() {
    // Two GPUs, one of them visible: ordinal 1 names nothing, so `1=2Gi` would cap nothing.
    let o = run_with(
        "2",
        &[("CUDA_VISIBLE_DEVICES", "1")],
        "0=1Gi,1=2Gi",
        "1048576",
    );
    let out = stdout(&o);
    assert!(
        out.contains("init rc=800") && out.contains("after rc=800"),
        "{out}"
    );
    let lines: Vec<String> = stderr(&o)
        .lines()
        .filter(|l| l.starts_with("gpucap:"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        lines,
        [
            "gpucap: GPUCAP_LIMIT names GPU 1, but only 1 GPU is visible to CUDA (GPU 0); \
          ordinals count the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0; accepted keys: \
          0 or GPU-face0000-0000-0000-0000-000000000001"
        ],
        "one line naming the key and how many GPUs are visible"
    );
    // The control: with both GPUs visible the same limit is valid and caps both.
    let o = run_with(
        "2",
        &[("CUDA_VISIBLE_DEVICES", "0,1")],
        "0=1Gi,1=2Gi",
        "1536Mi",
    );
    assert!(stdout(&o).contains("init rc=0"), "{}", stdout(&o));
    let totals: Vec<(u64, i32)> = ordinals(&o).iter().map(|d| (d.total, d.alloc)).collect();
    assert_eq!(totals, [(GIB, 2), (2 * GIB, 0)]);
}
