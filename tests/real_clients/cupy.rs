//! CuPy, unmodified from its pip wheels (`cupy-cuda13x` with its statically linked CUDA
//! runtime, NVRTC from `nvidia-cuda-nvrtc`), on the fake GPU: first alone (the fake serves
//! NVIDIA's cudart, private export tables included), then under gpucap (the cap holds with
//! CuPy's own OutOfMemoryError and gpucap's line, memGetInfo shows the cap, growth mode
//! keeps the footprint, per-GPU caps follow CUDA_VISIBLE_DEVICES, a fraction cap). The
//! fake's statistics show the driver never held more than the cap.
//!
//! The client is tests/clients/cupy_client.py. Its Python comes from
//! `GPUCAP_TEST_PYTHON_CUPY` (scripts/test.sh creates target/venv-cupy). When that is unset
//! the tests print SKIP and pass, unless `GPUCAP_TEST_REQUIRE_CLIENTS=1` or `CI` is set,
//! when they fail.

use super::common;
use super::python_client::{Client, Run, assert_peak, run_client};

use common::*;

const CUPY: Client = Client {
    script: "cupy_client.py",
    var: "GPUCAP_TEST_PYTHON_CUPY",
    what: "cupy-cuda13x",
    // CuPy's kernel cache stays in the scratch directory.
    caches: &["CUPY_CACHE_DIR"],
};

/// Runs the CuPy client with `steps` on the fake GPU (`env`: FAKECUDA_*,
/// CUDA_VISIBLE_DEVICES, GPUCAP_*), under gpucap when `shim`.
fn run_cupy(shim: bool, env: &[(&str, &str)], steps: &[&str]) -> Option<Run> {
    run_client(&CUPY, shim, env, steps)
}

/// Without gpucap: cudart starts on the fake (device count and properties), memGetInfo
/// shows the device, CuPy's pool allocates until the device is full and CuPy refuses with
/// its own error, copies carry real bytes, an NVRTC-compiled kernel loads and launches.
#[test]
fn cupy_runs_on_the_fake_gpu() {
    let env = [("FAKECUDA_DEVICES", "2"), ("FAKECUDA_TOTAL_MEM", "1Gi")];
    let steps = [
        "info", "meminfo", "fill:256", "free", "meminfo", "copy:16", "kernel",
    ];
    let Some(r) = run_cupy(false, &env, &steps) else {
        return;
    };
    assert_eq!(r.lines("count "), ["count 2"], "{}", r.dump());
    assert_eq!(
        r.lines("device "),
        [
            "device 0 name=FakeCUDA_Device_0 total=1073741824 cc=9.0",
            "device 1 name=FakeCUDA_Device_1 total=1073741824 cc=9.0"
        ],
        "{}",
        r.dump()
    );
    assert_eq!(r.mem_info(), [(GIB, GIB), (GIB, GIB)], "{}", r.dump());
    assert_eq!(
        r.fills(),
        [(4, "OutOfMemoryError".to_string())],
        "four 256 MiB arrays fill the 1 GiB device\n{}",
        r.dump()
    );
    assert_eq!(r.lines("copy "), ["copy 16 ok"], "{}", r.dump());
    assert_eq!(r.lines("kernel "), ["kernel ok shape=1024"], "{}", r.dump());
    assert!(r.refusals().is_empty(), "no gpucap here\n{}", r.dump());
    assert_eq!(r.stats[0].peak_used, GIB, "{}", r.dump());
}

/// Under gpucap with a 600 MiB cap on a 1 GiB device: memGetInfo shows the cap, CuPy gets
/// six 100 MiB arrays, then its own OutOfMemoryError with gpucap's line, once (CuPy retries
/// after freeing its cache: the same request refused again at once prints no second line;
/// at GPUCAP_LOG=debug every attempt does), the driver never held more than the cap;
/// copies still carry real bytes. The control run above got all of the device.
#[test]
fn cupy_is_capped_with_its_own_out_of_memory_error() {
    let env = [("FAKECUDA_TOTAL_MEM", "1Gi"), ("GPUCAP_LIMIT", "600MiB")];
    let Some(r) = run_cupy(true, &env, &["meminfo", "fill:100", "free", "copy:16"]) else {
        return;
    };
    let cap = 600 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(
        r.fills(),
        [(6, "OutOfMemoryError".to_string())],
        "{}",
        r.dump()
    );
    let line = "gpucap: refused cuMemAlloc of 100 MiB on GPU 0: 600 MiB of the 600 MiB cap in use";
    assert_eq!(
        r.refusals(),
        [line],
        "one OutOfMemoryError, one line\n{}",
        r.dump()
    );
    assert_eq!(r.lines("copy "), ["copy 16 ok"], "{}", r.dump());
    assert_peak(&r, 0, cap, cap);

    // CuPy asked more than once: at debug every refusal has its line.
    let debug = [env[0], env[1], ("GPUCAP_LOG", "debug")];
    let Some(d) = run_cupy(true, &debug, &["fill:100"]) else {
        return;
    };
    assert_eq!(
        d.fills(),
        [(6, "OutOfMemoryError".to_string())],
        "{}",
        d.dump()
    );
    let attempts = d.refusals();
    assert!(
        attempts.len() > 1 && attempts.iter().all(|l| l == line),
        "CuPy retries: {attempts:?}\n{}",
        d.dump()
    );

    // The same without gpucap gets past the cap: the test fails if the shim does nothing.
    let Some(c) = run_cupy(false, &env, &["fill:100"]) else {
        return;
    };
    assert_eq!(
        c.fills(),
        [(10, "OutOfMemoryError".to_string())],
        "{}",
        c.dump()
    );
}

/// A fraction cap: 25% of a 2 GiB device is 512 MiB.
#[test]
fn cupy_under_a_fraction_cap() {
    let env = [("FAKECUDA_TOTAL_MEM", "2Gi"), ("GPUCAP_LIMIT", "25%")];
    let Some(r) = run_cupy(true, &env, &["meminfo", "fill:128"]) else {
        return;
    };
    let cap = 512 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(
        r.fills(),
        [(4, "OutOfMemoryError".to_string())],
        "{}",
        r.dump()
    );
    assert!(!r.refusals().is_empty(), "{}", r.dump());
    assert_peak(&r, 0, cap, cap);
}

/// Growth mode: CuPy fills the 1 GiB cap, frees everything and empties its pool
/// (`free_all_blocks`), yet the driver still holds the footprint at exit (it never shrinks),
/// the program sees it as free, and a second fill is served from it without a new page.
/// Without growth mode the same program gives the memory back to the driver.
#[test]
fn cupy_in_growth_mode_keeps_its_footprint() {
    let env = [
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("GPUCAP_LIMIT", "1Gi"),
        ("GPUCAP_GROWTH", "1"),
    ];
    let steps = ["fill:100", "free", "meminfo", "fill:100"];
    let Some(r) = run_cupy(true, &env, &steps) else {
        return;
    };
    let held = 1000 * MIB; // ten 100 MiB arrays (whole 2 MiB pages)
    assert_eq!(
        r.fills(),
        [
            (10, "OutOfMemoryError".to_string()),
            (10, "OutOfMemoryError".to_string())
        ],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.mem_info(),
        [(GIB, GIB)],
        "after free_all_blocks the retained pages are free to the process\n{}",
        r.dump()
    );
    let d = &r.stats[0];
    assert_eq!(
        d.final_used,
        held,
        "the footprint never shrinks\n{}",
        r.dump()
    );
    assert_eq!(
        d.alloc_calls,
        held / (2 * MIB),
        "the second fill created no page\n{}",
        r.dump()
    );
    assert_peak(&r, 0, GIB, held);

    // Control: without growth mode the freed memory goes back to the driver.
    let env = [("FAKECUDA_TOTAL_MEM", "2Gi"), ("GPUCAP_LIMIT", "1Gi")];
    let Some(c) = run_cupy(true, &env, &["fill:100", "free"]) else {
        return;
    };
    assert_eq!(c.stats[0].final_used, 0, "{}", c.dump());
}

/// Per-GPU caps with CUDA_VISIBLE_DEVICES=2,0 on three GPUs: ordinal 0 (physical GPU 2) is
/// capped at 300 MiB and ordinal 1 (physical GPU 0) at 500 MiB; CuPy sees each cap in
/// memGetInfo and is refused at each.
#[test]
fn cupy_per_gpu_caps_follow_cuda_visible_devices() {
    let env = [
        ("FAKECUDA_DEVICES", "3"),
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("CUDA_VISIBLE_DEVICES", "2,0"),
        ("GPUCAP_LIMIT", "0=300MiB,1=500MiB"),
    ];
    let steps = [
        "info", "device:0", "meminfo", "fill:100", "device:1", "meminfo", "fill:100",
    ];
    let Some(r) = run_cupy(true, &env, &steps) else {
        return;
    };
    assert_eq!(r.lines("count "), ["count 2"], "{}", r.dump());
    assert_eq!(
        r.lines("device "),
        [
            "device 0 name=FakeCUDA_Device_2 total=314572800 cc=9.0",
            "device 1 name=FakeCUDA_Device_0 total=524288000 cc=9.0"
        ],
        "cudaGetDeviceProperties shows each cap as the total\n{}",
        r.dump()
    );
    assert_eq!(
        r.mem_info(),
        [(300 * MIB, 300 * MIB), (500 * MIB, 500 * MIB)],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.fills(),
        [
            (3, "OutOfMemoryError".to_string()),
            (5, "OutOfMemoryError".to_string())
        ],
        "{}",
        r.dump()
    );
    let lines = r.refusals();
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("on GPU 0: 300 MiB of the 300 MiB cap in use"))
            && lines
                .iter()
                .any(|l| l.ends_with("on GPU 1: 500 MiB of the 500 MiB cap in use")),
        "{}",
        r.dump()
    );
    assert_peak(&r, 0, 300 * MIB, 300 * MIB);
    assert_peak(&r, 1, 500 * MIB, 500 * MIB);
    assert_eq!(r.stats[0].total, 2 * GIB);
}

/// The context cudart makes is charged to the cap: with 300 MiB of context memory
/// (FAKECUDA_CONTEXT_MEM) a 1 GiB cap leaves CuPy seven 100 MiB arrays, and memGetInfo
/// shows what is left. cudart asks the private table for the primary context before it
/// retains it; were the context activated there, gpucap would measure nothing at the
/// retain and the driver would end above the cap.
#[test]
fn cupy_context_memory_counts_against_the_cap() {
    let env = [
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("FAKECUDA_CONTEXT_MEM", "300MiB"),
        ("GPUCAP_LIMIT", "1Gi"),
    ];
    let Some(r) = run_cupy(true, &env, &["meminfo", "fill:100"]) else {
        return;
    };
    assert_eq!(r.mem_info(), [(GIB - 300 * MIB, GIB)], "{}", r.dump());
    assert_eq!(
        r.fills(),
        [(7, "OutOfMemoryError".to_string())],
        "{}",
        r.dump()
    );
    assert_peak(&r, 0, GIB, GIB - 24 * MIB);
}
