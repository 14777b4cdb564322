//! What programs read of memory: `cuMemGetInfo`, `cuDeviceTotalMem`, address ranges.

use std::ffi::c_int;

use super::current::current_device;
use super::pools::refresh_pools;
use super::{Word, arena, checked_device, memory, shim};
use crate::driver::forward::Real;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Dptr, Out};
use crate::state::Shim;
use gpucap_core::growth;
use gpucap_core::growth::GROWTH;

pub fn mem_get_info<W: Word>(
    real: Real<(Out<W>, Out<W>)>,
    free: Out<W>,
    total: Out<W>,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let rc = real.call(free, total);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    if free.is_null() || total.is_null() {
        // A driver that takes a NULL figure (CUDA 13.0 does) wrote the other one
        // uncapped: both are asked again into our own, and the caller's written capped.
        let (mut f, mut t) = (W::put(0), W::put(0));
        let rc = real.call(Out::from(&mut f), Out::from(&mut t));
        // The uncapped figure is never left: if the second ask failed, 0 and its error.
        let (f, t) = if rc == CUDA_SUCCESS {
            capped_info(shim, f.get(), t.get())
        } else {
            (0, 0)
        };
        // The caller's out-pointers, each written only when non-NULL.
        free.set(W::put(f));
        total.set(W::put(t));
        return rc;
    }
    // The driver succeeded and filled both out-pointers (checked non-NULL above).
    if let (Some(f), Some(t)) = (free.get(), total.get()) {
        let (f, t) = capped_info(shim, f.get(), t.get());
        free.set(W::put(f));
        total.set(W::put(t));
    }
    rc
}

/// Growth allocations are several page mappings: the driver would answer with one
/// page, so the range is answered from the mapping record.
pub fn mem_get_address_range(
    real: Real<(Out<Dptr>, Out<usize>, Dptr)>,
    base: Out<Dptr>,
    size: Out<usize>,
    dptr: Dptr,
) -> CuResult {
    if let Some((b, s)) = GROWTH.range_of(dptr) {
        // The caller's out-pointers; either may be NULL per the API.
        base.set(b);
        size.set(s as usize);
        return CUDA_SUCCESS;
    }
    real.call(base, size, dptr)
}

pub fn device_total_mem<W: Word>(
    real: Real<(Out<W>, c_int)>,
    bytes: Out<W>,
    dev: c_int,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let rc = real.call(bytes, dev);
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    // The driver succeeded and filled `bytes`.
    if let Some(d) = checked_device(shim, dev)
        && let Some(b) = bytes.get()
    {
        bytes.set(W::put(shim.total_mem(d, b.get())));
    }
    rc
}

/// The capped `(free, total)` of the current device, from the driver's figures.
pub(super) fn capped_info(shim: &Shim, free: u64, total: u64) -> (u64, u64) {
    match current_device().and_then(|d| checked_device(shim, d)) {
        Some(d) => {
            refresh_pools(d);
            if memory::growth() {
                arena::mem_info(shim, d, (free, total), growth::retained_bytes(d), true)
            } else {
                shim.mem_info(d, free, total, 0)
            }
        }
        None => (free, total),
    }
}
