//! `cuModuleLoad*`, `cuModuleUnload`: the device memory a module takes at load (see
//! `gpucap_core::modules`), measured around the load in the context it is loaded in,
//! charged to that context's device, credited at unload or when the context is gone.

use std::ffi::{c_int, c_void};

use super::contexts::{context_lock, pool_marks};
use super::current::context_device;
use super::residents::{Again, judge_measured, made_again, try_charge_undoable};
use super::shim;
use crate::driver::forward::Real;
use crate::driver::types::{CText, CUDA_SUCCESS, CuResult, Handle, Out, SavedValues};
use crate::driver::{kernel_queries, queries};
use crate::log::log;
use crate::state::{CONTEXTS, MODULES, SHIM};
use gpucap_core::ledger::Charge;
use gpucap_core::residents::{self, again::Loads};

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
    // A load made again passes the values the program passed, not the driver's outputs.
    let saved = SavedValues::save(values, count);
    let mut made = false;
    module_loaded("cuModuleLoadDataEx", module, || {
        if std::mem::replace(&mut made, true) {
            saved.restore();
        }
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
/// pool), and charges it. What the cap cannot take is unloaded again (announced to the
/// pool as a free, as any memory given back) and refused with
/// `CUDA_ERROR_OUT_OF_MEMORY`, as a context is: the device held it only for that moment.
/// A figure the cap cannot take that may be the pool's traffic, or memory taken outside
/// the pool (the first window only), is unloaded and loaded again
/// (`residents::again::Loads`). A load that cannot be measured is refused under a cap,
/// never passed uncounted.
fn module_loaded(api: &str, out: Out<Handle>, mut call: impl FnMut() -> CuResult) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // No context (or none the driver names): the driver answers the call itself.
    let (Some(ctx), Some(device)) = (queries::current_context(), context_device()) else {
        return call();
    };
    let mut loads = Loads::default();
    made_again(api, |last| {
        load_once(api, (shim, ctx, device), out, &mut call, last, &mut loads)
    })
}

/// One attempt of [`module_loaded`] (`last`: no other follows): Err where the module
/// was unloaded to be loaded again.
fn load_once(
    api: &str,
    (shim, ctx, device): (&'static crate::state::Shim, Handle, std::ffi::c_int),
    out: Out<Handle>,
    call: &mut impl FnMut() -> CuResult,
    last: bool,
    loads: &mut Loads,
) -> Result<CuResult, Again> {
    let lock = match context_lock(shim, api, device) {
        Ok(Some(lock)) => lock,
        Ok(None) => return Ok(call()),
        Err(rc) => return Ok(rc),
    };
    let d = lock.device();
    let (rc, measured, _, doubt) = lock.measure_with_doubt(
        &queries::Contexts,
        Some(ctx as u64),
        pool_marks(d),
        &mut *call,
    );
    // The driver succeeded and wrote the module handle.
    let (CUDA_SUCCESS, Some(module)) = (rc, out.get()) else {
        return Ok(rc);
    };
    let figure = match judge_measured(api, "module", d, measured.map(residents::taken)) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(rc),
        Err(refused) => {
            // Not measured: what it gave back at its unload is not known either.
            kernel_queries::unload_module(module);
            out.set(std::ptr::null_mut());
            return Ok(refused);
        }
    };
    if figure == 0 {
        return Ok(rc);
    }
    // What the cap cannot take is unloaded again; the driver gives the memory back (and
    // the program is handed no module).
    let unload = || {
        unload_announced(module, d, figure);
        out.set(std::ptr::null_mut());
    };
    // Memory the process's own pools only cache is trimmed first, as for an allocation.
    super::reclaim_for(shim, d, figure);
    let judged = loads.judge(0, (figure, doubt), last, |b| {
        SHIM.ledger.would_refuse_here(d, b)
    });
    let Some(bytes) = judged.bytes() else {
        unload();
        return Err(Again::Unsure);
    };
    // Refused where the check saw room: another member's guarantee holds it, or another
    // member took it meanwhile. Said at once, so that one load counts one refusal.
    if let Err(not_taken) = try_charge_undoable(d, None, bytes, bytes, unload) {
        return Ok(not_taken.say(api));
    }
    let loaded = super::residents::resident_in(ctx, &lock, Charge { device: d, bytes });
    // A handle the driver handed out again: the old module went with its context, and
    // the driver freed what it held.
    super::residents::record(&MODULES, module as u64, loaded);
    log!(
        Debug,
        "{api}: the module takes {} on GPU {d} (measured {}, of which up to {} may be the pool's traffic)",
        gpucap_core::size::format_bytes(bytes),
        gpucap_core::size::format_bytes(figure),
        gpucap_core::size::format_bytes(doubt)
    );
    Ok(rc)
}

/// Unloads `module`, which gpucap undid (refused, or to be loaded again) on device `d`:
/// `took`, the most its load may have taken, announced to the pool first as a free, so
/// that another member's window that holds the unload does not take it off its own
/// figure; withdrawn after, all of it unsure (such a window is that much high).
fn unload_announced(module: Handle, d: usize, took: u64) {
    let most = || {
        vec![Charge {
            device: d,
            bytes: took,
        }]
    };
    let unload = || {
        kernel_queries::unload_module(module);
        CUDA_SUCCESS
    };
    super::residents::announced_release(most, unload);
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
