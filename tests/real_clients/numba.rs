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
use super::python_client::{Client, run_client, start_client};
use super::scenarios;

use common::*;

const NUMBA: Client = Client {
    script: "numba_client.py",
    var: "GPUCAP_TEST_PYTHON_NUMBA",
    what: "numba-cuda",
    caches: &["NUMBA_CACHE_DIR"],
    // numba's exception, with the driver's code it carries.
    oom: "CudaAPIError CUDA_ERROR_OUT_OF_MEMORY",
};

/// Without gpucap: `numba.cuda.gpus` lists the fake's devices, `get_memory_info` shows
/// each whole, `cuda.device_array` until the driver refuses, freed arrays give the memory
/// back (numba's pending frees flushed), `to_device(...).copy_to_host()` carries real
/// bytes, a `@cuda.jit` kernel compiled by NVVM loads and launches.
#[test]
fn numba_runs_on_the_fake_gpu() {
    scenarios::runs_on_the_fake_gpu(&NUMBA);
}

/// The cap holds with numba's `CudaAPIError` and one gpucap line (numba flushes its
/// pending frees and asks again).
#[test]
fn numba_is_capped_with_its_own_out_of_memory_error() {
    scenarios::is_capped_with_its_own_out_of_memory_error(&NUMBA);
}

#[test]
fn numba_under_a_fraction_cap() {
    scenarios::under_a_fraction_cap(&NUMBA);
}

/// The primary context numba retains is charged to the cap.
#[test]
fn numba_context_memory_counts_against_the_cap() {
    scenarios::context_memory_counts_against_the_cap(&NUMBA);
}

/// Each device's cap in `get_memory_info` of a context on it (`cuda.select_device`).
#[test]
fn numba_per_gpu_caps_follow_cuda_visible_devices() {
    scenarios::per_gpu_caps_follow_cuda_visible_devices(&NUMBA);
}

#[test]
fn numba_in_growth_mode_keeps_its_footprint() {
    scenarios::in_growth_mode_keeps_its_footprint(&NUMBA);
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
    let Some(second) = run_client(&NUMBA, true, &env, &["meminfo", "fill:100"]) else {
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
    assert_eq!(
        second.fills(),
        [(4, NUMBA.oom.to_string())],
        "{}",
        second.dump()
    );
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
    let Some(second) = run_client(&NUMBA, false, &env, &["fill:100:10"]) else {
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
