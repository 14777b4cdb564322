//! The calls that load a "partially loaded" function (CUDA 12.4): under lazy loading
//! `cuModuleEnumerateFunctions` hands out functions whose code is not loaded yet, and
//! "CUDA APIs may load the function automatically when called with partially loaded
//! function handle" (its documentation). The program's `cuFuncLoad` loads one; so do its
//! attribute calls (`cuFuncGetAttribute`, `cuFuncSetAttribute`: the fake loads there, as
//! the real driver's record will tell, `module.enumerated_*`). Each is measured as a first
//! use (`first_use::partial_load`): its code charged, or the call refused before it loads
//! where the cap cannot take what its module took before. Its first launch and a graph's
//! node are measured in `launches`. Until the program lists a module's functions no
//! partially loaded handle exists: the attribute calls pay one flag's read.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::current::{current_device, known_device};
use super::first_use::{load_if_partial, partial_load, seen, takes_nothing_at_launch};
use crate::driver::forward::Real;
use crate::driver::types::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CuResult, Handle};
use crate::state::LAUNCHED;
use gpucap_core::kernels::launch_key;

/// Whether the program has listed a module's functions (`cuModuleEnumerateFunctions`
/// answered): only then can a function handle be partially loaded.
static LISTED: AtomicBool = AtomicBool::new(false);

/// The current context's device: where a function of it loads.
fn device() -> Option<usize> {
    known_device().or_else(|| current_device().and_then(|d| usize::try_from(d).ok()))
}

/// `cuModuleEnumerateFunctions` (CUDA 12.4): the functions it lists take nothing at the
/// call; from now on the calls that may load one ask whether it is loaded.
pub fn module_enumerate_functions(
    real: Real<(*mut Handle, u32, Handle)>,
    functions: *mut Handle,
    n: u32,
    module: Handle,
) -> CuResult {
    let rc = real.call(functions, n, module);
    if rc == CUDA_SUCCESS && n > 0 {
        LISTED.store(true, Relaxed);
    }
    rc
}

/// `cuFuncLoad` (CUDA 12.4): a partially loaded function's code loaded by the program,
/// measured as a first use (see [`load_if_partial`]); then seen as `cuModuleGetFunction`
/// leaves a function, where its launch takes nothing more (else its first launch grows the
/// stack).
pub fn func_load(real: Real<(Handle,)>, f: Handle) -> CuResult {
    let call = || real.call(f);
    let Some(d) = device() else {
        return call();
    };
    let Some(rc) = partial_load("cuFuncLoad", f, d, call) else {
        return call();
    };
    if rc == CUDA_SUCCESS && takes_nothing_at_launch(f) {
        seen(launch_key(f as u64, d)); // as a function asked for by name
    }
    rc
}

/// `cuFuncGetAttribute`: a partially loaded function is loaded first (measured).
pub fn func_get_attribute(
    real: Real<(*mut c_int, c_int, Handle)>,
    value: *mut c_int,
    attribute: c_int,
    f: Handle,
) -> CuResult {
    match load_listed("cuFuncGetAttribute", f) {
        CUDA_ERROR_OUT_OF_MEMORY => CUDA_ERROR_OUT_OF_MEMORY,
        _ => real.call(value, attribute, f),
    }
}

/// `cuFuncSetAttribute`: a partially loaded function is loaded first (measured).
pub fn func_set_attribute(
    real: Real<(Handle, c_int, c_int)>,
    f: Handle,
    attribute: c_int,
    value: c_int,
) -> CuResult {
    match load_listed("cuFuncSetAttribute", f) {
        CUDA_ERROR_OUT_OF_MEMORY => CUDA_ERROR_OUT_OF_MEMORY,
        _ => real.call(f, attribute, value),
    }
}

/// Before a call `api` that may load function `f`: where a module's functions were
/// listed and `f` was never launched here, a partially loaded `f` is loaded by gpucap,
/// measured; `CUDA_ERROR_OUT_OF_MEMORY` where the cap cannot take it (refused before it
/// loads). Anything else: the call is the driver's to answer.
#[inline]
fn load_listed(api: &str, f: Handle) -> CuResult {
    if !LISTED.load(Relaxed) {
        return CUDA_SUCCESS;
    }
    load_listed_function(api, f)
}

#[cold]
#[inline(never)]
fn load_listed_function(api: &str, f: Handle) -> CuResult {
    match device() {
        Some(d) if !LAUNCHED.contains(launch_key(f as u64, d)) => load_if_partial(api, f, d),
        _ => CUDA_SUCCESS,
    }
}
