//! Multicast objects (`cuMulticastCreate`, `cuMulticastAddDevice`, `cuMulticastBindMem`,
//! `cuMulticastBindAddr` and their `_v2`, `cuMulticastUnbind`). NVIDIA documents an
//! object as taking no physical memory of its own (its size is what can be bound per
//! device), so nothing is charged or refused here; memory bound to an object is
//! `cuMemCreate` memory, charged there once, and held by the binding as by a mapping
//! (see `gpucap_core::vmm`): a bound handle released and unmapped stays charged until it
//! is unbound or the object is freed.

use std::ffi::{c_int, c_void};

use super::shim;
use super::vmm::vmm_step;
use crate::driver::forward::Real;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Dptr, Out};
use crate::state::VMM;
use gpucap_core::vmm::Pending;

/// A bind or unbind: the book's step (taken once the shim is up), then the driver's call.
fn bound(pending: impl FnOnce() -> Option<Pending>, call: impl FnOnce() -> CuResult) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    vmm_step(pending(), call)
}

/// A CUdevice as the ordinal the ledger keys by (None for a negative one: the driver's
/// error).
fn ordinal(dev: c_int) -> Option<usize> {
    usize::try_from(dev).ok()
}

pub fn multicast_create(
    real: Real<(Out<u64>, *const c_void)>,
    handle: Out<u64>,
    prop: *const c_void,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let rc = real.call(handle, prop);
    // The driver succeeded and filled the out-pointer.
    if let (CUDA_SUCCESS, Some(h)) = (rc, handle.get()) {
        VMM.multicast(h);
    }
    rc
}

/// `cuMulticastAddDevice`: an object imported from another process is first seen here
/// (every device is added before memory is bound or the object mapped).
pub fn multicast_add_device(real: Real<(u64, c_int)>, handle: u64, dev: c_int) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let rc = real.call(handle, dev);
    if rc == CUDA_SUCCESS {
        VMM.multicast(handle);
    }
    rc
}

pub fn multicast_bind_mem(
    real: Real<(u64, usize, u64, usize, usize, u64)>,
    handle: u64,
    mc_offset: usize,
    mem: u64,
    mem_offset: usize,
    size: usize,
    flags: u64,
) -> CuResult {
    bound(
        || VMM.bind(handle, None, mc_offset as u64, mem, size as u64),
        || real.call(handle, mc_offset, mem, mem_offset, size, flags),
    )
}

#[allow(clippy::too_many_arguments)] // the driver's seven, and its function
pub fn multicast_bind_mem_v2(
    real: Real<(u64, c_int, usize, u64, usize, usize, u64)>,
    handle: u64,
    dev: c_int,
    mc_offset: usize,
    mem: u64,
    mem_offset: usize,
    size: usize,
    flags: u64,
) -> CuResult {
    bound(
        || ordinal(dev).and_then(|d| VMM.bind(handle, Some(d), mc_offset as u64, mem, size as u64)),
        || real.call(handle, dev, mc_offset, mem, mem_offset, size, flags),
    )
}

pub fn multicast_bind_addr(
    real: Real<(u64, usize, Dptr, usize, u64)>,
    handle: u64,
    mc_offset: usize,
    ptr: Dptr,
    size: usize,
    flags: u64,
) -> CuResult {
    bound(
        || VMM.bind_addr(handle, None, mc_offset as u64, ptr, size as u64),
        || real.call(handle, mc_offset, ptr, size, flags),
    )
}

pub fn multicast_bind_addr_v2(
    real: Real<(u64, c_int, usize, Dptr, usize, u64)>,
    handle: u64,
    dev: c_int,
    mc_offset: usize,
    ptr: Dptr,
    size: usize,
    flags: u64,
) -> CuResult {
    bound(
        || {
            ordinal(dev)
                .and_then(|d| VMM.bind_addr(handle, Some(d), mc_offset as u64, ptr, size as u64))
        },
        || real.call(handle, dev, mc_offset, ptr, size, flags),
    )
}

/// `cuMulticastUnbind`: what the binding held is credited if nothing else holds it.
pub fn multicast_unbind(
    real: Real<(u64, c_int, usize, usize)>,
    handle: u64,
    dev: c_int,
    mc_offset: usize,
    size: usize,
) -> CuResult {
    bound(
        || ordinal(dev).and_then(|d| VMM.unbind(handle, d, mc_offset as u64, size as u64)),
        || real.call(handle, dev, mc_offset, size),
    )
}
