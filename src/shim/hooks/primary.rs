//! The device's primary context (`cuDevicePrimaryCtxRetain`, `Release`, `Reset`): its
//! first reference makes it, measured and charged as a created context is
//! (`contexts::make_context`); its last release or a reset ends it, credited with what
//! lived in it. A green context's creation takes its reference through the same path
//! (`green`).

use std::ffi::c_int;

use super::contexts::{Announced, context_ended, context_lock, make_context};
use super::current::moves_current;
use super::{checked_device, shim, written_handle};
use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Handle, Out};
use crate::state::CONTEXTS;
use gpucap_core::contexts::{CtxDriver, Ending};

pub fn primary_ctx_retain(
    real: Real<(Out<Handle>, c_int)>,
    pctx: Out<Handle>,
    dev: c_int,
) -> CuResult {
    primary_retained("cuDevicePrimaryCtxRetain", pctx, dev, || {
        real.call(pctx, dev)
    })
}

/// A reference on `dev`'s primary context taken by `call` (a `cuDevicePrimaryCtxRetain`
/// writing the handle to `pctx`; `api` names the program's call): the first one makes the
/// context, measured and charged, refused before the driver makes it where the cap cannot
/// take what a context is expected to take.
pub(super) fn primary_retained(
    api: &str,
    pctx: Out<Handle>,
    dev: c_int,
    call: impl FnMut() -> CuResult,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let mut call = call;
    let mut lock = match context_lock(shim, api, dev) {
        Ok(Some(lock)) => lock,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    if pctx.is_null() || lock.primary_active(&queries::Contexts) {
        return call(); // nothing is created
    }
    match make_context(shim, api, &mut lock, call, || queries::release_primary(dev)) {
        Ok(bytes) => {
            // The driver succeeded and filled the out-pointer (checked non-null).
            lock.set_primary(written_handle(pctx) as u64, bytes);
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    }
}

pub fn primary_ctx_release(real: Real<(c_int,)>, dev: c_int) -> CuResult {
    moves_current(|| primary_gone(dev, false, || real.call(dev)))
}

pub fn primary_ctx_reset(real: Real<(c_int,)>, dev: c_int) -> CuResult {
    moves_current(|| primary_gone(dev, true, || real.call(dev)))
}

/// A release (the context goes when its last reference does, as the driver says
/// afterwards) or a reset (it goes now).
pub(super) fn primary_gone(dev: c_int, reset: bool, call: impl FnOnce() -> CuResult) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let Some(mut lock) = checked_device(shim, dev).and_then(|d| CONTEXTS.lock(d)) else {
        return call();
    };
    let announced = Announced::before(lock.device(), lock.primary_charge());
    let rc = call();
    if rc != CUDA_SUCCESS {
        context_ended("", lock.device(), Ending::Alive, announced);
        return rc;
    }
    let d = lock.device();
    let ending = if reset {
        Ending::Gone(lock.take_primary())
    } else {
        match queries::Contexts.primary_active(d) {
            Some(false) => Ending::Gone(lock.take_primary()),
            Some(true) => Ending::Alive,
            None => Ending::Unknown,
        }
    };
    let api = if reset {
        "cuDevicePrimaryCtxReset"
    } else {
        "cuDevicePrimaryCtxRelease"
    };
    context_ended(api, d, ending, announced);
    rc
}
