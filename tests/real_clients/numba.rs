//! numba, unmodified from its pip wheels (`numba-cuda` over NVIDIA's `cuda-bindings`, its
//! kernels compiled by NVVM), on the fake GPU: first alone (device properties, memory
//! info, device arrays until the driver refuses, copies of real bytes, a `@cuda.jit`
//! kernel compiled, loaded and launched), then under gpucap (the cap holds with numba's
//! own `CudaAPIError` carrying `CUDA_ERROR_OUT_OF_MEMORY` and gpucap's line, the memory
//! info shows the cap, a fraction cap, the context's memory counts, per-GPU caps follow
//! CUDA_VISIBLE_DEVICES, growth mode keeps the footprint). The fake's statistics show the
//! driver never held more than the cap. Two numba processes in one pool share its cap. numba reaches the driver by `dlopen` and
//! `cuGetProcAddress` (through cuda-bindings), not through cudart as CuPy does.
//!
//! The client is tests/clients/numba_client.py. Its Python comes from
//! `GPUCAP_TEST_PYTHON_NUMBA` (scripts/test.sh creates target/venv-numba). When that is
//! unset the tests print SKIP and pass, unless `GPUCAP_TEST_REQUIRE_CLIENTS=1` or `CI` is
//! set, when they fail.

use super::common;
use super::python_client::{Client, Run, assert_peak, run_client, start_client};

use common::*;

const NUMBA: Client = Client {
    script: "numba_client.py",
    var: "GPUCAP_TEST_PYTHON_NUMBA",
    what: "numba-cuda",
    caches: &["NUMBA_CACHE_DIR"],
};

/// numba's refusal as the client prints it: its exception and the driver's code.
const OOM: &str = "CudaAPIError CUDA_ERROR_OUT_OF_MEMORY";

fn run_numba(shim: bool, env: &[(&str, &str)], steps: &[&str]) -> Option<Run> {
    run_client(&NUMBA, shim, env, steps)
}

/// Without gpucap: numba finds the fake's devices with their properties, the memory info
/// shows each device whole, device arrays are allocated until the driver refuses with
/// `CUDA_ERROR_OUT_OF_MEMORY`, freed arrays give the memory back, copies carry real bytes,
/// and an NVVM-compiled kernel loads and launches.
#[test]
fn numba_runs_on_the_fake_gpu() {
    let env = [("FAKECUDA_DEVICES", "2"), ("FAKECUDA_TOTAL_MEM", "1Gi")];
    let steps = [
        "info", "meminfo", "fill:256", "free", "meminfo", "copy:16", "kernel",
    ];
    let Some(r) = run_numba(false, &env, &steps) else {
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
        [(4, OOM.to_string())],
        "four 256 MiB arrays fill the 1 GiB device\n{}",
        r.dump()
    );
    assert_eq!(r.lines("copy "), ["copy 16 ok"], "{}", r.dump());
    assert_eq!(r.lines("kernel "), ["kernel ok shape=1024"], "{}", r.dump());
    assert!(r.refusals().is_empty(), "no gpucap here\n{}", r.dump());
    assert_eq!(r.stats[0].peak_used, GIB, "{}", r.dump());
}

/// Under gpucap with a 600 MiB cap on a 1 GiB device: the memory info shows the cap, numba
/// gets six 100 MiB arrays, then its own `CudaAPIError` with gpucap's line, once (numba
/// flushes its pending frees and asks again: the same request refused again at once prints
/// no second line; at GPUCAP_LOG=debug every attempt does); the driver never held more
/// than the cap; copies and a kernel still run. Without gpucap the same fill gets ten.
#[test]
fn numba_is_capped_with_its_own_out_of_memory_error() {
    let env = [("FAKECUDA_TOTAL_MEM", "1Gi"), ("GPUCAP_LIMIT", "600MiB")];
    let steps = ["meminfo", "fill:100", "free", "copy:16", "kernel"];
    let Some(r) = run_numba(true, &env, &steps) else {
        return;
    };
    let cap = 600 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(r.fills(), [(6, OOM.to_string())], "{}", r.dump());
    let line = "gpucap: refused cuMemAlloc of 100 MiB on GPU 0: 600 MiB of the 600 MiB cap in use";
    assert_eq!(r.refusals(), [line], "one refusal, one line\n{}", r.dump());
    assert_eq!(r.lines("copy "), ["copy 16 ok"], "{}", r.dump());
    assert_eq!(r.lines("kernel "), ["kernel ok shape=1024"], "{}", r.dump());
    assert_peak(&r, 0, cap, cap);

    // numba asked more than once: at debug every refusal has its line.
    let debug = [env[0], env[1], ("GPUCAP_LOG", "debug")];
    let Some(d) = run_numba(true, &debug, &["fill:100"]) else {
        return;
    };
    assert_eq!(d.fills(), [(6, OOM.to_string())], "{}", d.dump());
    let attempts = d.refusals();
    assert!(
        attempts.len() > 1 && attempts.iter().all(|l| l == line),
        "numba retries: {attempts:?}\n{}",
        d.dump()
    );

    // The same without gpucap gets past the cap: the test fails if the shim does nothing.
    let Some(c) = run_numba(false, &env, &["fill:100"]) else {
        return;
    };
    assert_eq!(c.fills(), [(10, OOM.to_string())], "{}", c.dump());
}

/// A fraction cap: 25% of a 2 GiB device is 512 MiB.
#[test]
fn numba_under_a_fraction_cap() {
    let env = [("FAKECUDA_TOTAL_MEM", "2Gi"), ("GPUCAP_LIMIT", "25%")];
    let Some(r) = run_numba(true, &env, &["meminfo", "fill:128"]) else {
        return;
    };
    let cap = 512 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(r.fills(), [(4, OOM.to_string())], "{}", r.dump());
    assert!(!r.refusals().is_empty(), "{}", r.dump());
    assert_peak(&r, 0, cap, cap);
}

/// The primary context numba retains is charged to the cap: with 300 MiB of context
/// memory (FAKECUDA_CONTEXT_MEM) a 1 GiB cap leaves numba seven 100 MiB arrays, and the
/// memory info shows what is left.
#[test]
fn numba_context_memory_counts_against_the_cap() {
    let env = [
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("FAKECUDA_CONTEXT_MEM", "300MiB"),
        ("GPUCAP_LIMIT", "1Gi"),
    ];
    let Some(r) = run_numba(true, &env, &["meminfo", "fill:100"]) else {
        return;
    };
    assert_eq!(r.mem_info(), [(GIB - 300 * MIB, GIB)], "{}", r.dump());
    assert_eq!(r.fills(), [(7, OOM.to_string())], "{}", r.dump());
    assert_peak(&r, 0, GIB, GIB - 24 * MIB);
}

/// Per-GPU caps with CUDA_VISIBLE_DEVICES=2,0 on three GPUs: ordinal 0 (physical GPU 2) is
/// capped at 300 MiB and ordinal 1 (physical GPU 0) at 500 MiB; numba sees each cap in the
/// memory info of a context on each device and is refused at each.
#[test]
fn numba_per_gpu_caps_follow_cuda_visible_devices() {
    let env = [
        ("FAKECUDA_DEVICES", "3"),
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("CUDA_VISIBLE_DEVICES", "2,0"),
        ("GPUCAP_LIMIT", "0=300MiB,1=500MiB"),
    ];
    let steps = [
        "info", "device:0", "meminfo", "fill:100", "device:1", "meminfo", "fill:100",
    ];
    let Some(r) = run_numba(true, &env, &steps) else {
        return;
    };
    assert_eq!(r.lines("count "), ["count 2"], "{}", r.dump());
    assert_eq!(
        r.lines("device "),
        [
            "device 0 name=FakeCUDA_Device_2 total=314572800 cc=9.0",
            "device 1 name=FakeCUDA_Device_0 total=524288000 cc=9.0"
        ],
        "{}",
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
        [(3, OOM.to_string()), (5, OOM.to_string())],
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
}

/// Growth mode: numba fills the 1 GiB cap and frees every array (its queue of pending
/// frees flushed), yet the driver still holds the footprint at exit (it never shrinks),
/// the program sees it as free, and a second fill is served from it without a new page.
/// Without growth mode the same program gives the memory back to the driver.
#[test]
fn numba_in_growth_mode_keeps_its_footprint() {
    let env = [
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("GPUCAP_LIMIT", "1Gi"),
        ("GPUCAP_GROWTH", "1"),
    ];
    let steps = ["fill:100", "free", "meminfo", "fill:100"];
    let Some(r) = run_numba(true, &env, &steps) else {
        return;
    };
    let held = 1000 * MIB; // ten 100 MiB arrays (whole 2 MiB pages)
    assert_eq!(
        r.fills(),
        [(10, OOM.to_string()), (10, OOM.to_string())],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.mem_info(),
        [(GIB, GIB)],
        "after the frees the retained pages are free to the process\n{}",
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
    let Some(c) = run_numba(true, &env, &["fill:100", "free", "meminfo"]) else {
        return;
    };
    assert_eq!(c.mem_info(), [(GIB, GIB)], "{}", c.dump());
    assert_eq!(c.stats[0].final_used, 0, "{}", c.dump());
    assert_eq!(c.stats[0].free_calls, 10, "{}", c.dump());
}

/// Two numba processes in one pool (`GPUCAP_POOL`) on one fake GPU of 4 GiB share its
/// 1 GiB cap: the first holds six 100 MiB arrays while the second is shown what is left
/// and is refused after four, with the pool's line; the GPU's peak over both never passes
/// the cap. Without gpucap the second gets ten.
#[test]
fn two_numba_processes_share_a_pool() {
    let dir = scratch("numba-pool");
    let (gpu, pools) = (dir.join("fake-gpu"), dir.join("pools"));
    std::fs::create_dir_all(&pools).expect("the pool directory");
    let env = [
        ("FAKECUDA_TOTAL_MEM", "4Gi"),
        ("FAKECUDA_SHARED", gpu.to_str().unwrap()),
        ("GPUCAP_LIMIT", "1GiB"),
        ("GPUCAP_POOL", "numba"),
        ("GPUCAP_POOL_DIR", pools.to_str().unwrap()),
    ];
    let Some(first) = start_client(&NUMBA, true, &env, &["fill:100:6", "hold"]) else {
        return;
    };
    let Some(second) = run_numba(true, &env, &["meminfo", "fill:100"]) else {
        return;
    };
    let first = first.release();
    assert_eq!(
        first.fills(),
        [],
        "the first took six, unrefused\n{}",
        first.dump()
    );
    assert_eq!(
        first.lines("filled "),
        ["filled 6 arrays"],
        "{}",
        first.dump()
    );
    assert_eq!(
        second.mem_info(),
        [(GIB - 600 * MIB, GIB)],
        "the pool's cap less the first's arrays\n{}",
        second.dump()
    );
    assert_eq!(second.fills(), [(4, OOM.to_string())], "{}", second.dump());
    let line = "gpucap: refused cuMemAlloc of 100 MiB on GPU 0: 1000 MiB of the pool's 1 GiB cap \
                in use, 400 MiB of it by this process (pool ";
    let lines = second.refusals();
    assert!(
        lines.len() == 1 && lines[0].starts_with(line),
        "{lines:?}\n{}",
        second.dump()
    );
    for r in [&first, &second] {
        let peak = r.stats[0].shared_peak_used;
        assert!(
            (1000 * MIB..=GIB).contains(&peak),
            "the GPU's peak over both: {peak}\n{}",
            r.dump()
        );
    }

    // Without gpucap the second takes what the first left of the whole GPU.
    let control = scratch("numba-pool-control");
    let gpu = control.join("fake-gpu");
    let env = [
        ("FAKECUDA_TOTAL_MEM", "4Gi"),
        ("FAKECUDA_SHARED", gpu.to_str().unwrap()),
    ];
    let Some(first) = start_client(&NUMBA, false, &env, &["fill:100:6", "hold"]) else {
        return;
    };
    let Some(second) = run_numba(false, &env, &["fill:100:10"]) else {
        return;
    };
    first.release();
    assert_eq!(
        second.lines("filled "),
        ["filled 10 arrays"],
        "{}",
        second.dump()
    );
}
