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

use super::python_client::Client;
use super::scenarios;

const CUPY: Client = Client {
    script: "cupy_client.py",
    var: "GPUCAP_TEST_PYTHON_CUPY",
    what: "cupy-cuda13x",
    // CuPy's kernel cache stays in the scratch directory.
    caches: &["CUPY_CACHE_DIR"],
    oom: "OutOfMemoryError",
};

/// Without gpucap: cudart starts on the fake (device count and properties), memGetInfo
/// shows the device, CuPy's pool allocates until the device is full and CuPy refuses with
/// its own error, copies carry real bytes, an NVRTC-compiled kernel loads and launches.
#[test]
fn cupy_runs_on_the_fake_gpu() {
    scenarios::runs_on_the_fake_gpu(&CUPY);
}

/// The cap holds with CuPy's `OutOfMemoryError` and one gpucap line (CuPy retries after
/// freeing its cache).
#[test]
fn cupy_is_capped_with_its_own_out_of_memory_error() {
    scenarios::is_capped_with_its_own_out_of_memory_error(&CUPY);
}

#[test]
fn cupy_imported_with_rtld_deepbind_is_capped() {
    scenarios::imported_with_rtld_deepbind_is_capped(&CUPY);
}

#[test]
fn cupy_under_a_fraction_cap() {
    scenarios::under_a_fraction_cap(&CUPY);
}

/// cudart asks the private table for the primary context before it retains it; were the
/// context activated there, gpucap would measure nothing at the retain and the driver
/// would end above the cap.
#[test]
fn cupy_context_memory_counts_against_the_cap() {
    scenarios::context_memory_counts_against_the_cap(&CUPY);
}

/// `getDeviceProperties` and `memGetInfo` show each device's cap.
#[test]
fn cupy_per_gpu_caps_follow_cuda_visible_devices() {
    scenarios::per_gpu_caps_follow_cuda_visible_devices(&CUPY);
}

/// After `free_all_blocks()` the driver still holds the footprint.
#[test]
fn cupy_in_growth_mode_keeps_its_footprint() {
    scenarios::in_growth_mode_keeps_its_footprint(&CUPY);
}
