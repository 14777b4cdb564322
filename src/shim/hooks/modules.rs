//! `cuModuleLoad*`, `cuModuleUnload`: the device memory a module takes at load (see
//! `gpucap_core::modules`), measured around the load in the context it is loaded in,
//! charged to that context's device, credited at unload or when the context is gone.

use std::ffi::{c_int, c_void};

use super::contexts::{context_lock, pool_marks};
use super::current::context_device;
use super::residents::{charge_undoable, judge_measured};
use super::shim;
use crate::driver::forward::Real;
use crate::driver::types::{CText, CUDA_SUCCESS, CuResult, Handle, Out};
use crate::driver::{kernel_queries, queries};
use crate::log::log;
use crate::state::{CONTEXTS, MODULES};
use gpucap_core::ledger::Charge;

pub fn module_load(
    real: Real<(Out<Handle>, CText)>,
    module: Out<Handle>,
    fname: CText,
) -> CuResult {
    module_loaded("cuModuleLoad", module, || real.call(module, fname))
}

pub fn module_load_data(
    real: Real<(Out<Handle>, *const c_void)>,
    module: Out<Handle>,
    image: *const c_void,
) -> CuResult {
    module_loaded("cuModuleLoadData", module, || real.call(module, image))
}

pub fn module_load_data_ex(
    real: Real<(
        Out<Handle>,
        *const c_void,
        u32,
        *mut c_int,
        *mut *mut c_void,
    )>,
    module: Out<Handle>,
    image: *const c_void,
    count: u32,
    options: *mut c_int,
    values: *mut *mut c_void,
) -> CuResult {
    module_loaded("cuModuleLoadDataEx", module, || {
        real.call(module, image, count, options, values)
    })
}

pub fn module_load_fat_binary(
    real: Real<(Out<Handle>, *const c_void)>,
    module: Out<Handle>,
    image: *const c_void,
) -> CuResult {
    module_loaded("cuModuleLoadFatBinary", module, || real.call(module, image))
}

/// Loads a module in the current context with what it takes measured (the driver's
/// free memory on the device before and after, other members' traffic taken out in a
/// pool), and charges it. What the cap cannot take is unloaded again and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, as a context is: the device held it only for that moment.
/// A load that cannot be measured is refused under a cap, never passed uncounted.
fn module_loaded(api: &str, out: Out<Handle>, mut call: impl FnMut() -> CuResult) -> CuResult {
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
    // The driver succeeded and wrote the module handle.
    let (CUDA_SUCCESS, Some(module)) = (rc, out.get()) else {
        return rc;
    };
    let unload = || kernel_queries::unload_module(module);
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
pub fn module_unload(real: Real<(Handle,)>, module: Handle) -> CuResult {
    let owners = [Some(module as u64)];
    let Some(loaded) = MODULES.take(module as u64) else {
        return super::launches::unloading(&owners, || real.call(module));
    };
    let _lock = CONTEXTS.lock(loaded.charge.device);
    let taken = vec![(module as u64, loaded)];
    super::residents::given_back(&MODULES, taken, || {
        super::launches::unloading(&owners, || real.call(module))
    })
}
