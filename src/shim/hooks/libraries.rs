//! `cuLibraryLoadData`, `cuLibraryLoadFromFile`: under CUDA's lazy loading (the default)
//! a library takes nothing at its load, and each context takes its copy at a first use
//! there (`launches`). Under eager loading (`CUDA_MODULE_LOADING=EAGER`) the driver loads
//! it into every context of the process at the load (NVIDIA's `cuLibraryLoadData`
//! documentation; an H200 with PyTorch: 732 MiB more with its context, cuBLAS's first
//! matmul 512 MiB against 98 MiB lazily, docs/gpu-runs/2026-11-26-h100): measured on each
//! GPU where the process holds a context, charged there, and recorded with each
//! context's copy (credited when that context ends or the library is unloaded).
//! A later context takes its copies at its creation, measured with it.

use std::ffi::{c_int, c_void};

use super::contexts::pool_marks;
use super::residents::{charge_undoable, judge_measured, record_more, resident_in};
use super::shim;
use crate::driver::forward::Real;
use crate::driver::types::{CText, CUDA_SUCCESS, CuResult, Handle, Out};
use crate::driver::{kernel_queries, queries};
use crate::log::log;
use crate::state::{CONTEXTS, KERNELS};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::contexts::{DeviceLock, Unmeasured};
use gpucap_core::ledger::Charge;

/// A `cuLibraryLoad*` call: the library, the code (an image, or a file's name), options.
type Load<'a, Code> = Real<(
    Out<'a, Handle>,
    Code,
    *mut c_int,
    *mut *mut c_void,
    u32,
    *mut c_int,
    *mut *mut c_void,
    u32,
)>;

/// What a library is loaded from, which names the entry point.
pub trait Code: Copy {
    const API: &'static str;
}
/// `cuLibraryLoadData`'s image.
impl Code for *const c_void {
    const API: &'static str = "cuLibraryLoadData";
}
/// `cuLibraryLoadFromFile`'s file name.
impl Code for CText<'_> {
    const API: &'static str = "cuLibraryLoadFromFile";
}

/// `cuLibraryLoadData` and `cuLibraryLoadFromFile`: both rows of the hook table name this
/// function, `C` told apart by its argument.
#[allow(clippy::too_many_arguments)]
pub fn library_load<C: Code>(
    real: Load<'_, C>,
    library: Out<Handle>,
    code: C,
    jit_options: *mut c_int,
    jit_values: *mut *mut c_void,
    num_jit: u32,
    lib_options: *mut c_int,
    lib_values: *mut *mut c_void,
    num_lib: u32,
) -> CuResult {
    library_loaded(C::API, library, || {
        real.call(
            library,
            code,
            jit_options,
            jit_values,
            num_jit,
            lib_options,
            lib_values,
            num_lib,
        )
    })
}

/// A library load made by `call`, its handle written to `out`. Lazily: forwarded. Under
/// eager loading, with the device lock of every GPU where the process holds a context
/// (taken in ascending order; every other path holds one at a time), the free memory of
/// each is measured around the load (other members' traffic taken out in a pool), as a
/// module load is. What the cap (or the pool) cannot take on any of them is unloaded
/// again and refused with `CUDA_ERROR_OUT_OF_MEMORY`, as a module load is: the driver
/// held it only for that moment. A load that cannot be measured is refused under a cap.
fn library_loaded(api: &str, out: Out<Handle>, mut call: impl FnMut() -> CuResult) -> CuResult {
    if !kernel_queries::eager_loading() {
        return call();
    }
    if let Err(rc) = shim() {
        return rc;
    }
    let locks: Vec<DeviceLock<'static>> = (0..MAX_DEVICES)
        .filter_map(|d| CONTEXTS.lock(d))
        .filter(|lock| !lock.contexts().is_empty())
        .collect();
    if locks.is_empty() {
        return call(); // no context yet: each takes its copies at its creation
    }
    let mut measured = Vec::with_capacity(locks.len());
    let rc = measure_each(&locks, &mut call, &mut measured);
    // The driver succeeded and wrote the library's handle.
    let (CUDA_SUCCESS, Some(lib)) = (rc, out.get()) else {
        return rc;
    };
    let owners = [Some(lib as u64), kernel_queries::library_module(lib)];
    // Unloads it, crediting the copies charged so far.
    let unload = || {
        let _ = super::launches::unloading(&owners, || kernel_queries::unload_library(lib));
    };
    for (lock, measured) in locks.iter().zip(measured) {
        let d = lock.device();
        let measured = measured.map(gpucap_core::contexts::taken);
        let bytes = match judge_measured(api, "library", d, measured) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(refused) => {
                unload();
                return refused;
            }
        };
        if bytes == 0 {
            continue;
        }
        if let Err(refused) = charge_undoable(api, d, None, bytes, unload) {
            return refused;
        }
        record_copies(lib, lock, bytes);
        log!(
            Debug,
            "{api}: the library takes {} on GPU {d} (loaded eagerly into {} context(s))",
            gpucap_core::size::format_bytes(bytes),
            lock.contexts().len()
        );
    }
    rc
}

/// Runs `call` measured on each of `locks`' devices (one measurement inside the next),
/// pushing each device's measurement to `measured` in the order of `locks` (an eager load
/// here; a launch on several devices in one call, `multi_device`).
pub(super) fn measure_each(
    locks: &[DeviceLock<'static>],
    call: &mut dyn FnMut() -> CuResult,
    measured: &mut Vec<Result<i128, Unmeasured>>,
) -> CuResult {
    let Some((lock, rest)) = locks.split_first() else {
        return call();
    };
    let d = lock.device();
    let mut inner = Vec::with_capacity(rest.len());
    let (rc, taken, _) = lock.measure(&queries::Contexts, None, pool_marks(d), || {
        measure_each(rest, &mut *call, &mut inner)
    });
    measured.push(taken);
    measured.append(&mut inner);
    rc
}

/// Records `bytes`, what library `lib` took on `lock`'s device, as one copy in each of
/// the process's contexts there (each the same size; the rest of the division with the
/// first), under (context, library, library) in the kernels' charges: each copy is
/// credited when its context ends, all at the library's unload.
fn record_copies(lib: Handle, lock: &DeviceLock<'_>, bytes: u64) {
    let contexts = lock.contexts();
    let n = contexts.len().max(1) as u64;
    for (i, &ctx) in contexts.iter().enumerate() {
        let share = bytes / n + if i == 0 { bytes % n } else { 0 };
        let device = lock.device();
        let held = resident_in(
            ctx as Handle,
            lock,
            Charge {
                device,
                bytes: share,
            },
        );
        record_more(&KERNELS, (ctx, lib as u64, lib as u64), held);
    }
}
