//! The VMM calls (`cuMemCreate`, map, unmap, release, and `cuMemMapArrayAsync`, which maps
//! such memory into arrays).

use std::ffi::c_void;

use super::{On, Target, reserve, shim};
use crate::driver::forward::Real;
use crate::driver::types::{
    ArrayMapInfo, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN,
    CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS, CuResult, Dptr, In, InArray, LocationPrefix, Out, Stream, localized_device,
};
use crate::log::log;
use crate::state::{SHIM, VMM};
use gpucap_core::ledger::Freeing;
use gpucap_core::vmm::{Pending, Place};

// ---------------------------------------------------------------------------
// VMM (see `vmm`): a handle is charged from cuMemCreate until the driver frees its
// memory, at its last release and last unmap. Growth mode's own handles (`arena`)
// are made with the driver's functions directly and never pass here.

pub fn mem_create(
    real: Real<(Out<u64>, usize, In<LocationPrefix>, u64)>,
    handle: Out<u64>,
    size: usize,
    prop: In<LocationPrefix>,
    flags: u64,
) -> CuResult {
    let device = match prop.get().map(|p| (p.location_type, p.location_id)) {
        Some((CU_MEM_LOCATION_TYPE_DEVICE, id)) => Some(id),
        // A portion of a device's memory: that device's (a driver that does not know the
        // type answers its own error, and the reservation is taken back).
        Some((CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN, id)) => Some(localized_device(id)),
        // Host-located physical memory takes no device memory: forwarded uncounted, as
        // is a call without properties or with the invalid type 0 (the driver's error).
        None
        | Some((0 | CU_MEM_LOCATION_TYPE_HOST..=CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, _)) => None,
        // A type this build does not know (CUDA 13.4's INVISIBLE, 5, "not visible but
        // device is accessible", names no device): refused, never passed uncounted.
        Some((other, _)) => {
            if let Err(rc) = shim() {
                return rc;
            }
            log!(
                Warn,
                "refused cuMemCreate of {}: gpucap cannot tell which GPU memory of location \
                 type {other} is on",
                gpucap_core::size::format_bytes(size as u64)
            );
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    };
    // The device is the handle's location, whatever context is current, if any.
    let target = match reserve("cuMemCreate", On::Named(device), size as u64, size as u64) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = real.call(handle, size, prop, flags);
    // The driver succeeded and filled the out-pointer.
    if let (CUDA_SUCCESS, Target::Charged(r), Some(h)) = (rc, target, handle.get()) {
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
    let announced = announce(&p);
    let rc = call();
    finish(rc, p, announced);
    rc
}

/// [`vmm_step`] for the steps of one driver call (`cuMemMapArrayAsync`'s list), each
/// finished or taken back alike.
fn vmm_steps(pending: Vec<Pending>, call: impl FnOnce() -> CuResult) -> CuResult {
    let steps: Vec<_> = pending
        .into_iter()
        .map(|p| {
            let announced = announce(&p);
            (p, announced)
        })
        .collect();
    let rc = call();
    for (p, announced) in steps {
        finish(rc, p, announced);
    }
    rc
}

/// What step `p` frees if the driver succeeds, announced to the pool.
fn announce(p: &Pending) -> Vec<Freeing> {
    p.frees()
        .into_iter()
        .map(|c| SHIM.ledger.announce(c))
        .collect()
}

/// Step `p` finished after the driver answered `rc` (done, or taken back), crediting what
/// the driver freed.
fn finish(rc: CuResult, p: Pending, announced: Vec<Freeing>) {
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
}

/// `cuMemMapArrayAsync`: a step mapping charged memory into a sparse or deferred-mapping
/// array pins its handle as a `cuMemMap` mapping does (released, it stays charged while
/// the array maps it); an unmapping takes out the mappings its region covers, crediting a
/// released handle nothing maps any more. Steps on memory the shim did not charge are the
/// driver's alone.
pub fn mem_map_array_async(
    real: Real<(InArray<ArrayMapInfo>, u32, Stream)>,
    list: InArray<ArrayMapInfo>,
    count: u32,
    stream: Stream,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let steps = list.items(count).iter().filter_map(tile_step).collect();
    vmm_steps(steps, || real.call(list, count, stream))
}

/// The book's step for one `CUarrayMapInfo`; None where it touches nothing charged (or is
/// malformed: the driver's error).
fn tile_step(info: &ArrayMapInfo) -> Option<Pending> {
    let [w0, w1, w2, w3] = info.subresource;
    let (lo, hi) = (|w: u64| w as u32, |w: u64| (w >> 32) as u32);
    let place = match info.subresource_type {
        0 => Place::Level {
            level: lo(w0),
            layer: hi(w0),
            offset: [lo(w1), hi(w1), lo(w2)],
            extent: [hi(w2), lo(w3), hi(w3)],
        },
        1 => Place::MipTail {
            layer: lo(w0),
            offset: w1,
            size: w2,
        },
        _ => return None,
    };
    match (info.operation, info.handle_type) {
        (1, 0) => VMM.map_array(info.resource, place, info.handle),
        (2, _) => VMM.unmap_array(info.resource, place),
        _ => None,
    }
}

/// `cuArrayDestroy` or `cuMipmappedArrayDestroy` of `array` (`call`): what is mapped into
/// it is unmapped with it.
pub(super) fn array_unmapped(array: u64, call: impl FnOnce() -> CuResult) -> CuResult {
    vmm_step(VMM.array_gone(array), call)
}

pub fn mem_release(real: Real<(u64,)>, handle: u64) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    vmm_step(VMM.release(handle), || real.call(handle))
}

pub fn mem_map(
    real: Real<(Dptr, usize, usize, u64, u64)>,
    ptr: Dptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    vmm_step(VMM.map(ptr, size as u64, handle), || {
        real.call(ptr, size, offset, handle, flags)
    })
}

/// `cuMemUnmap`, and `cuMemAddressFree`: freeing an address range takes the mappings
/// still in it (where the driver allows that at all), credited as by `cuMemUnmap`.
pub fn mem_unmap(real: Real<(Dptr, usize)>, ptr: Dptr, size: usize) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    vmm_step(VMM.unmap(ptr, size as u64), || real.call(ptr, size))
}

pub fn mem_retain_allocation_handle(
    real: Real<(Out<u64>, *mut c_void)>,
    handle: Out<u64>,
    addr: *mut c_void,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let pending = VMM.retain(addr as u64);
    let rc = real.call(handle, addr);
    // The driver succeeded and filled the out-pointer.
    let freed = if let (CUDA_SUCCESS, Some(h)) = (rc, handle.get()) {
        VMM.retained(pending, h)
    } else {
        pending.map(|p| VMM.undo(p)).unwrap_or_default()
    };
    for c in freed {
        SHIM.ledger.settle(c);
    }
    rc
}
