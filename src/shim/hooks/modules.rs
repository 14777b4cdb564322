//! `cuModuleLoad*`, `cuModuleUnload`: the device memory a module takes at load (see
//! `gpucap_core::modules`), measured around the load in the context it is loaded in,
//! charged to that context's device, credited at unload or when the context is gone.

use std::ffi::c_char;

use super::contexts::{context_lock, pool_marks};
use super::residents::{charge_undoable, judge_measured};
use super::*;

pub fn module_load(
    real: unsafe extern "C" fn(*mut Handle, *const c_char) -> CuResult,
    module: *mut Handle,
    fname: *const c_char,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    module_loaded("cuModuleLoad", module, || unsafe { real(module, fname) })
}

pub fn module_load_data(
    real: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult,
    module: *mut Handle,
    image: *const c_void,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    module_loaded("cuModuleLoadData", module, || unsafe {
        real(module, image)
    })
}

pub fn module_load_data_ex(
    real: unsafe extern "C" fn(
        *mut Handle,
        *const c_void,
        u32,
        *mut c_int,
        *mut *mut c_void,
    ) -> CuResult,
    module: *mut Handle,
    image: *const c_void,
    count: u32,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    module_loaded("cuModuleLoadDataEx", module, || unsafe {
        real(module, image, count, options, values)
    })
}

pub fn module_load_fat_binary(
    real: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult,
    module: *mut Handle,
    image: *const c_void,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    module_loaded("cuModuleLoadFatBinary", module, || unsafe {
        real(module, image)
    })
}

/// Loads a module in the current context with what it takes measured (the driver's
/// free memory on the device before and after, other members' traffic taken out in a
/// pool), and charges it. What the cap cannot take is unloaded again and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, as a context is: the device held it only for that moment.
/// A load that cannot be measured is refused under a cap, never passed uncounted.
fn module_loaded(api: &str, out: *mut Handle, mut call: impl FnMut() -> CuResult) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // No context (or none the driver names): the driver answers the call itself.
    let (Some(ctx), Some(device)) = (queries::current_context(), context_device()) else {
        return call();
    };
    let lock = match context_lock(shim, api, device) {
        Ok(Some(lock)) => lock,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    let d = lock.device();
    let (rc, measured, _) = lock.measure(&queries::Contexts, Some(ctx as u64), pool_marks(d), call);
    if rc != CUDA_SUCCESS || out.is_null() {
        return rc;
    }
    // SAFETY: the driver succeeded and wrote the module handle.
    let module = unsafe { *out };
    let unload = || queries::unload_module(module);
    let measured = measured.map(gpucap_core::residents::taken);
    let bytes = match judge_measured(api, "module", d, measured) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return rc,
        Err(refused) => {
            unload();
            return refused;
        }
    };
    if bytes == 0 {
        return rc;
    }
    // What the cap cannot take is unloaded again; the driver gives the memory back.
    if let Err(refused) = charge_undoable(api, d, None, bytes, unload) {
        return refused;
    }
    let loaded = super::residents::resident_in(ctx, &lock, Charge { device: d, bytes });
    // A handle the driver handed out again: the old module went with its context, and
    // the driver freed what it held.
    super::residents::record(&MODULES, module as u64, loaded);
    log!(
        Debug,
        "{api}: the module takes {} on GPU {d}",
        gpucap_core::size::format_bytes(bytes)
    );
    rc
}

/// `cuModuleUnload`: credits what the module was charged once the driver unloaded it
/// (announced to the pool first, as a free), under its device's lock, so that no
/// measurement on that device sees it go; and what its functions' first launches loaded.
pub fn module_unload(real: unsafe extern "C" fn(Handle) -> CuResult, module: Handle) -> CuResult {
    let owners = [Some(module as u64)];
    // SAFETY (closures): forwarding the caller's argument.
    let Some(loaded) = MODULES.take(module as u64) else {
        return super::launches::unloading(&owners, || unsafe { real(module) });
    };
    let _lock = CONTEXTS.lock(loaded.charge.device);
    let taken = vec![(module as u64, loaded)];
    // SAFETY (closure): forwarding the caller's argument.
    super::residents::given_back(&MODULES, taken, || {
        super::launches::unloading(&owners, || unsafe { real(module) })
    })
}
