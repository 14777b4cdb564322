//! Green contexts (CUDA 12.4): `cuGreenCtxCreate` retains the device's primary context for
//! the green context's life (NVIDIA's documentation: "This API will retain the primary
//! context on device dev, which will is released when the green context is destroyed"),
//! so a green context made while the primary context is inactive makes it: a whole
//! context's memory. gpucap takes its own reference on the primary context first, through
//! the primary context's measured path (charged, refused before the driver makes it where
//! the cap cannot take a context), then makes the green context, measured as a module load
//! is (what it takes of its own, charged as a resident of the primary context), then lets
//! its own reference go. `cuGreenCtxDestroy` credits what the green context took, and the
//! primary context where that was its last reference.

use std::ffi::c_int;
use std::ptr::null_mut;

use super::contexts::{context_lock, pool_marks};
use super::current::moves_current;
use super::primary::{primary_gone, primary_retained};
use super::residents::{charge_undoable, judge_measured, record, resident_in};
use super::shim;
use crate::driver::forward::Real;
use crate::driver::hooked::real;
use crate::driver::queries;
use crate::driver::types::{CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CuResult, Handle, Out};
use crate::log::log;
use crate::state::GREENS;
use gpucap_core::ledger::Charge;

const API: &str = "cuGreenCtxCreate";

pub fn green_ctx_create(
    real: Real<(Out<Handle>, Handle, c_int, u32)>,
    ph: Out<Handle>,
    desc: Handle,
    dev: c_int,
    flags: u32,
) -> CuResult {
    moves_current(|| created(ph, dev, || real.call(ph, desc, dev, flags)))
}

/// The green context made by `call` on `dev` (written to `ph`), between gpucap's own
/// reference on the primary context and its release.
fn created(ph: Out<Handle>, dev: c_int, call: impl FnMut() -> CuResult) -> CuResult {
    let mut primary: Handle = null_mut();
    let held = Out::from(&mut primary);
    let rc = primary_retained(API, held, dev, || {
        real::cuDevicePrimaryCtxRetain(held, dev).unwrap_or(CUDA_ERROR_NOT_FOUND)
    });
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let rc = measured(ph, dev, held.get(), call);
    // The green context holds the primary context now; where it was not made, the primary
    // context goes with gpucap's reference if that was the last (credited then).
    let released = primary_gone(dev, false, || {
        real::cuDevicePrimaryCtxRelease_v2(dev).unwrap_or(CUDA_ERROR_NOT_FOUND)
    });
    if released != CUDA_SUCCESS {
        log!(
            Warn,
            "{API}: gpucap's own reference on GPU {dev}'s primary context could not be released (error {released}): the context stays until the process ends"
        );
    }
    rc
}

/// `call` (the green context's making, the primary context `primary` active) measured on
/// `dev` as a module load is: what it took charged as a resident of the primary context
/// (the green context destroyed again where the cap cannot take it), recorded under the
/// green context.
fn measured(
    ph: Out<Handle>,
    dev: c_int,
    primary: Option<Handle>,
    call: impl FnMut() -> CuResult,
) -> CuResult {
    let mut call = call;
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let (Some(primary), Ok(Some(lock))) = (primary, context_lock(shim, API, dev)) else {
        return call();
    };
    let d = lock.device();
    let (rc, taken, _) = lock.measure(
        &queries::Contexts,
        Some(primary as u64),
        pool_marks(d),
        &mut call,
    );
    let (CUDA_SUCCESS, Some(green)) = (rc, ph.get()) else {
        return rc;
    };
    let destroy = || {
        let _ = real::cuGreenCtxDestroy(green);
    };
    let bytes = match judge_measured(
        API,
        "green context",
        d,
        taken.map(gpucap_core::residents::taken),
    ) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => 0,
        Err(refused) => {
            destroy();
            return refused;
        }
    };
    if bytes > 0
        && let Err(refused) = charge_undoable(API, d, None, bytes, destroy)
    {
        return refused;
    }
    // Recorded even at 0 bytes: its end asks whether the primary context went with it.
    record(
        &GREENS,
        green as u64,
        resident_in(primary, &lock, Charge { device: d, bytes }),
    );
    log!(
        Debug,
        "{API}: the green context takes {} of its own on GPU {d}",
        gpucap_core::size::format_bytes(bytes)
    );
    rc
}

/// `cuGreenCtxDestroy`: what the green context took credited once the driver destroyed
/// it, and the primary context too where that was its last reference.
pub fn green_ctx_destroy(real: Real<(Handle,)>, green: Handle) -> CuResult {
    let Some(held) = GREENS.take(green as u64) else {
        return real.call(green); // not made under gpucap's count
    };
    let dev = held.charge.device as c_int;
    // Under the device's context lock (`primary_gone`), as a module's unload is.
    moves_current(|| {
        primary_gone(dev, false, || {
            super::residents::given_back(&GREENS, vec![(green as u64, held)], || real.call(green))
        })
    })
}
