//! What programs read of memory: `cuMemGetInfo`, `cuDeviceTotalMem`, address ranges.

use super::*;

pub fn mem_get_info<W: Word>(
    real: unsafe extern "C" fn(*mut W, *mut W) -> CuResult,
    free: *mut W,
    total: *mut W,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(free, total) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    if free.is_null() || total.is_null() {
        // A driver that takes a NULL figure (CUDA 13.0 does) wrote the other one
        // uncapped: both are asked again into our own, and the caller's written capped.
        let (mut f, mut t) = (W::put(0), W::put(0));
        // SAFETY: valid out-pointers of our own.
        let rc = unsafe { real(&mut f, &mut t) };
        // The uncapped figure is never left: if the second ask failed, 0 and its error.
        let (f, t) = if rc == CUDA_SUCCESS {
            capped_info(shim, f.get(), t.get())
        } else {
            (0, 0)
        };
        // SAFETY: the caller's out-pointers, each written only when non-NULL.
        unsafe {
            if let Some(free) = free.as_mut() {
                *free = W::put(f);
            }
            if let Some(total) = total.as_mut() {
                *total = W::put(t);
            }
        }
        return rc;
    }
    // SAFETY: the driver succeeded and filled both out-pointers.
    unsafe {
        let (f, t) = capped_info(shim, (*free).get(), (*total).get());
        (*free, *total) = (W::put(f), W::put(t));
    }
    rc
}

/// Growth allocations are several page mappings: the driver would answer with one
/// page, so the range is answered from the mapping record.
pub fn mem_get_address_range(
    real: unsafe extern "C" fn(*mut Dptr, *mut usize, Dptr) -> CuResult,
    base: *mut Dptr,
    size: *mut usize,
    dptr: Dptr,
) -> CuResult {
    if let Some((b, s)) = GROWTH.range_of(dptr) {
        // SAFETY: the caller's out-pointers; either may be NULL per the API.
        unsafe {
            if let Some(base) = base.as_mut() {
                *base = b;
            }
            if let Some(size) = size.as_mut() {
                *size = s as usize;
            }
        }
        return CUDA_SUCCESS;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real(base, size, dptr) }
}

pub fn device_total_mem<W: Word>(
    real: unsafe extern "C" fn(*mut W, c_int) -> CuResult,
    bytes: *mut W,
    dev: c_int,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(bytes, dev) };
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    if let Some(d) = checked_device(shim, dev) {
        // SAFETY: the driver succeeded and filled `bytes`.
        unsafe { *bytes = W::put(shim.total_mem(d, (*bytes).get())) };
    }
    rc
}

/// The capped `(free, total)` of the current device, from the driver's figures.
pub(super) fn capped_info(shim: &Shim, free: u64, total: u64) -> (u64, u64) {
    match current_device().and_then(|d| checked_device(shim, d)) {
        Some(d) => {
            refresh_pools(d);
            if growth() {
                arena::mem_info(shim, d, (free, total), growth::retained_bytes(d), true)
            } else {
                shim.mem_info(d, free, total, 0)
            }
        }
        None => (free, total),
    }
}
