//! The VMM calls (`cuMemCreate`, map, unmap, release).

use super::*;

// ---------------------------------------------------------------------------
// VMM (see `vmm`): a handle is charged from cuMemCreate until the driver frees its
// memory, at its last release and last unmap. Growth mode's own handles (`arena`)
// are made with the driver's functions directly and never pass here.

pub fn mem_create(
    real: unsafe extern "C" fn(*mut u64, usize, *const LocationPrefix, u64) -> CuResult,
    handle: *mut u64,
    size: usize,
    prop: *const LocationPrefix,
    flags: u64,
) -> CuResult {
    // SAFETY: a non-null prop is the caller's CUmemAllocationProp.
    let device = unsafe { prop.as_ref() }
        .filter(|p| p.location_type == CU_MEM_LOCATION_TYPE_DEVICE)
        .map(|p| p.location_id);
    // Host-located physical memory takes no device memory: forwarded uncounted.
    let target = match reserve("cuMemCreate", device, size as u64) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(handle, size, prop, flags) };
    if let (CUDA_SUCCESS, Target::Charged(r)) = (rc, target) {
        // SAFETY: the driver succeeded and filled the out-pointer.
        let h = unsafe { *handle };
        let charge = r.charge();
        r.keep();
        SHIM.ledger.count_alloc(charge.device);
        if let Some(stale) = VMM.created(h, charge) {
            SHIM.ledger.settle(stale);
        }
    }
    rc
}

/// Calls the driver for a VMM step prepared in the book, then finishes it (or takes it
/// back if the driver failed), crediting what the driver freed. What the step frees if
/// the driver succeeds (a last release or unmap) is announced to the pool first (see
/// `Ledger::announce`).
pub(super) fn vmm_step(pending: Option<Pending>, call: impl FnOnce() -> CuResult) -> CuResult {
    let Some(p) = pending else {
        return call();
    };
    let announced: Vec<_> = p
        .frees()
        .into_iter()
        .map(|c| SHIM.ledger.announce(c))
        .collect();
    let rc = call();
    if rc == CUDA_SUCCESS {
        let freed = VMM.done(p);
        if announced.is_empty() {
            // A map that found stale mappings the driver had replaced.
            freed.into_iter().for_each(|c| SHIM.ledger.settle(c));
        } else {
            // `done` gives back what `frees` said.
            announced
                .into_iter()
                .for_each(|f| SHIM.ledger.settle_announced(f));
        }
    } else {
        announced.into_iter().for_each(|f| SHIM.ledger.withdraw(f));
        VMM.undo(p).into_iter().for_each(|c| SHIM.ledger.settle(c));
    }
    rc
}

pub fn mem_release(real: unsafe extern "C" fn(u64) -> CuResult, handle: u64) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's argument.
    vmm_step(VMM.release(handle), || unsafe { real(handle) })
}

pub fn mem_map(
    real: unsafe extern "C" fn(Dptr, usize, usize, u64, u64) -> CuResult,
    ptr: Dptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's arguments.
    vmm_step(VMM.map(ptr, size as u64, handle), || unsafe {
        real(ptr, size, offset, handle, flags)
    })
}

/// `cuMemUnmap`, and `cuMemAddressFree`: freeing an address range takes the mappings
/// still in it (where the driver allows that at all), credited as by `cuMemUnmap`.
pub fn mem_unmap(
    real: unsafe extern "C" fn(Dptr, usize) -> CuResult,
    ptr: Dptr,
    size: usize,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's arguments.
    vmm_step(VMM.unmap(ptr, size as u64), || unsafe { real(ptr, size) })
}

pub fn mem_retain_allocation_handle(
    real: unsafe extern "C" fn(*mut u64, *mut c_void) -> CuResult,
    handle: *mut u64,
    addr: *mut c_void,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let pending = VMM.retain(addr as u64);
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(handle, addr) };
    let freed = if rc == CUDA_SUCCESS && !handle.is_null() {
        // SAFETY: the driver succeeded and filled the (non-null) out-pointer.
        VMM.retained(pending, unsafe { *handle })
    } else {
        pending.map(|p| VMM.undo(p)).unwrap_or_default()
    };
    for c in freed {
        SHIM.ledger.settle(c);
    }
    rc
}
