//! Growth mode's driver side: serving `cuMemAlloc` from retained physical pages
//! with the driver's virtual memory management, and taking frees back into them.
//! The bookkeeping and the design are `gpucap_core::growth`; this file only
//! sequences driver calls (never under one of its locks) and undoes what it did
//! when one of them fails.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::driver::sys::{
    CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationCompType, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationProp_st__bindgen_ty_1,
    CUmemAllocationType, CUmemLocation, CUmemLocationType,
};

use crate::driver::calls::{cuMemAddressReserve, cuMemGetAllocationGranularity, cuMemSetAccess};
use crate::driver::hooked::real::{
    cuCtxSynchronize, cuMemAddressFree, cuMemCreate, cuMemMap, cuMemRelease, cuMemUnmap,
};
use crate::driver::types::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    CuResult, In, Out,
};
use crate::log::log;
use crate::state::{SHIM, Shim};
use gpucap_core::growth::slab::is_small;
use gpucap_core::growth::{self, GROWTH, Live, Mapping, pages_for};
use gpucap_core::live_map::Charge;

fn location(device: usize) -> CUmemLocation {
    CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device as i32,
    }
}

/// Pinned device memory on `device`, no export handles: what `cuMemAlloc` gives.
fn page_prop(device: usize) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: location(device),
        win32HandleMetaData: null_mut::<c_void>(),
        allocFlags: CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: CUmemAllocationCompType::CU_MEM_ALLOCATION_COMP_NONE as u8,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// A driver call; `CUDA_ERROR_NOT_FOUND` when the driver lacks the function.
macro_rules! call {
    ($f:ident($($arg:expr),*)) => {
        $f($($arg),*).unwrap_or(CUDA_ERROR_NOT_FOUND)
    };
}

/// The device's page size: its minimum VMM granularity.
fn page_size(device: usize) -> Result<u64, CuResult> {
    let known = GROWTH.page(device);
    if known != 0 {
        return Ok(known);
    }
    let prop = page_prop(device);
    let mut g = 0usize;
    let rc = call!(cuMemGetAllocationGranularity(
        Out::from(&mut g),
        In::from(&prop),
        CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
    ));
    if rc != CUDA_SUCCESS || g == 0 {
        log!(
            Error,
            "growth mode: cannot read the VMM granularity of GPU {device} (error {rc})"
        );
        return Err(if rc == CUDA_SUCCESS {
            CUDA_ERROR_OUT_OF_MEMORY
        } else {
            rc
        });
    }
    GROWTH.set_page(device, g as u64);
    Ok(GROWTH.page(device))
}

/// `(free, total)` as a program in growth mode sees them, from the driver's
/// figures and the process's `retained` bytes: new memory in whole pages plus the
/// retained bytes (`growth::free_figure`). `ask` lets the page size be asked of the
/// driver if not yet known (a CUDA call with a context current); NVML's hook
/// passes false.
pub fn mem_info(
    shim: &Shim,
    device: usize,
    (free, total): (u64, u64),
    retained: u64,
    ask: bool,
) -> (u64, u64) {
    let (f, t) = shim.mem_info(device, free, total, 0);
    let page = if ask {
        page_size(device).unwrap_or(0)
    } else {
        GROWTH.page(device)
    };
    (growth::free_figure(f, page, retained, t), t)
}

fn release_pages(pages: &[u64]) {
    for &h in pages {
        let _ = call!(cuMemRelease(h));
    }
}

/// Creates `n` new pages on `device`, charging them to the cap for good, for a request
/// of `requested` bytes that took `in_hand` pages kept for reuse already.
fn grow(
    api: &str,
    device: usize,
    requested: u64,
    page: u64,
    n: u64,
    in_hand: u64,
) -> Result<Vec<u64>, CuResult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    // A size past a `u64` is asked as the most there is: refused by the cap, counted
    // and said as any refusal (a bare error here was neither).
    let bytes = n.saturating_mul(page);
    let reservation = SHIM
        .reserve(api, device, requested, bytes, in_hand.saturating_mul(page))
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let prop = page_prop(device);
    let mut pages = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let mut h = 0u64;
        let rc = call!(cuMemCreate(
            Out::from(&mut h),
            page as usize,
            In::from(&prop),
            0
        ));
        if rc != CUDA_SUCCESS {
            release_pages(&pages);
            return Err(rc); // the reservation rolls back as it drops
        }
        pages.push(h);
    }
    reservation.keep();
    Ok(pages)
}

/// Maps `pages` at a fresh address range, readable and writable by `device`.
fn map(device: usize, page: u64, pages: &[u64]) -> Result<u64, CuResult> {
    let bytes = page * pages.len() as u64;
    let mut base = 0u64;
    let rc = call!(cuMemAddressReserve(
        Out::from(&mut base),
        bytes as usize,
        0,
        0,
        0
    ));
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let undo = |mapped: usize| {
        if mapped > 0 {
            let _ = call!(cuMemUnmap(base, mapped * page as usize));
        }
        let _ = call!(cuMemAddressFree(base, bytes as usize));
    };
    for (i, &h) in pages.iter().enumerate() {
        let rc = call!(cuMemMap(base + i as u64 * page, page as usize, 0, h, 0));
        if rc != CUDA_SUCCESS {
            undo(i);
            return Err(rc);
        }
    }
    let access = CUmemAccessDesc {
        location: location(device),
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let rc = call!(cuMemSetAccess(base, bytes as usize, In::from(&access), 1));
    if rc != CUDA_SUCCESS {
        undo(pages.len());
        return Err(rc);
    }
    Ok(base)
}

/// Serves an allocation of `size` bytes on `device`: small ones from slabs, larger
/// ones with whole pages (retained first, new pages charged to the cap for the rest).
pub fn alloc(api: &str, device: usize, size: u64) -> Result<u64, CuResult> {
    let page = page_size(device)?;
    if is_small(size, page) {
        return alloc_small(api, device, size, page);
    }
    let n = pages_for(size, page).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // Fast path: a freed allocation of the same page count, still mapped.
    if let Some((base, m)) = usize::try_from(n)
        .ok()
        .and_then(|n| GROWTH.take_cached(device, n))
    {
        SHIM.ledger.count_alloc(device);
        GROWTH.record(base, Mapping { size, ..m });
        return Ok(base);
    }
    // Unmap cached allocations of other sizes, then empty slabs, until the loose
    // pages suffice.
    while GROWTH.loose_pages(device) < n {
        let Some((base, m)) = GROWTH
            .evict_cached(device)
            .or_else(|| GROWTH.evict_empty_slab(device))
        else {
            break;
        };
        unmap(base, &m);
    }
    let mut pages = GROWTH.take_pages(device, n);
    let fresh = n - pages.len() as u64;
    match grow(api, device, size, page, fresh, pages.len() as u64) {
        Ok(new) => pages.extend(new),
        Err(rc) => {
            GROWTH.give_back(device, pages);
            return Err(rc);
        }
    }
    match map(device, page, &pages) {
        Ok(base) => {
            SHIM.ledger.count_alloc(device);
            GROWTH.record(
                base,
                Mapping {
                    device,
                    size,
                    page,
                    pages,
                },
            );
            Ok(base)
        }
        Err(rc) => {
            // The pages are the process's now: keep them for the next request.
            GROWTH.give_back(device, pages);
            Err(rc)
        }
    }
}

/// Serves a small request from a slab; with no room in any, makes a new slab of
/// one page: a loose page, else one of a cached mapping (unmapped), else a new one.
fn alloc_small(api: &str, device: usize, size: u64, page: u64) -> Result<u64, CuResult> {
    // Each round maps one more slab; the new slab has room (a small request is at most
    // half a page) unless other threads filled it meanwhile: then another round.
    loop {
        if let Some(ptr) = GROWTH.carve(device, size) {
            SHIM.ledger.count_alloc(device);
            return Ok(ptr);
        }
        let mut pages = GROWTH.take_pages(device, 1);
        while pages.is_empty() {
            let Some((base, m)) = GROWTH.evict_cached(device) else {
                break;
            };
            unmap(base, &m);
            pages = GROWTH.take_pages(device, 1);
        }
        if pages.is_empty() {
            pages = grow(api, device, size, page, 1, 0)?;
        }
        match map(device, page, &pages) {
            Ok(base) => GROWTH.add_slab(device, base, pages),
            Err(rc) => {
                GROWTH.give_back(device, pages);
                return Err(rc);
            }
        }
    }
}

/// Before a request growth mode does not serve (pitch, managed, stream-ordered, a VMM
/// handle, a context, ...) that the cap would refuse: the retained pages no allocation
/// needs (loose ones, then those of cached mappings and empty slabs, unmapped) are given
/// back to the driver and to the cap, one at a time, until the request fits; none where
/// it would not fit even with all of them. They are what the free figure counted as free (`mem_info`); without this, only
/// `cuMemAlloc` could reuse them and such a request was refused below that figure.
pub fn release_for(device: usize, bytes: u64) {
    // Nothing goes back for a request that would not fit even then: the retained pages
    // stay the process's (growth mode's promise), and the request is refused.
    let releasable = growth::retained_bytes(device);
    if SHIM
        .ledger
        .would_refuse(device, bytes.saturating_sub(releasable))
    {
        return;
    }
    while SHIM.ledger.would_refuse(device, bytes) {
        let page = GROWTH.page(device);
        let mut pages = GROWTH.take_pages(device, 1);
        if pages.is_empty() {
            let Some((base, m)) = GROWTH
                .evict_cached(device)
                .or_else(|| GROWTH.evict_empty_slab(device))
            else {
                return; // nothing retained that no allocation needs
            };
            unmap(base, &m);
            pages = GROWTH.take_pages(device, 1);
            if pages.is_empty() {
                return; // the driver would not unmap it: its pages stay charged
            }
        }
        for h in pages {
            let freeing = SHIM.ledger.announce(Charge {
                device,
                bytes: page,
            });
            if call!(cuMemRelease(h)) == CUDA_SUCCESS {
                SHIM.ledger.settle_announced(freeing);
            } else {
                SHIM.ledger.withdraw(freeing);
                log!(
                    Error,
                    "growth mode: cuMemRelease of a retained page of GPU {device} failed; it stays retained"
                );
                GROWTH.give_back(device, [h]);
                return;
            }
        }
    }
}

/// Unmaps a cached allocation and makes its pages loose. A range the driver will
/// not unmap stays mapped and its pages are not reused (they stay charged).
fn unmap(base: u64, m: &Mapping) {
    let rc = call!(cuMemUnmap(base, m.mapped() as usize));
    if rc != CUDA_SUCCESS {
        log!(
            Error,
            "growth mode: cuMemUnmap of {base:#x} failed with error {rc}; its pages are not reused"
        );
        return;
    }
    let _ = call!(cuMemAddressFree(base, m.mapped() as usize));
    GROWTH.give_back(m.device, m.pages.iter().copied());
}

/// Frees a growth allocation: `None` if `ptr` is not one. A page allocation stays
/// mapped, retained, for the next request of its page count; a small block goes
/// back to its slab.
#[inline(never)]
pub fn free(ptr: u64) -> Option<CuResult> {
    let live = GROWTH.remove(ptr)?;
    // cuMemFree waits for the device to finish with the memory; so must we before
    // it can serve another allocation. A synchronisation as the program's are: the
    // driver's pools release what they cache then (announced to a pool of processes,
    // re-read after).
    let _ = super::sync::synchronized(|| call!(cuCtxSynchronize()));
    match live {
        Live::Pages(m) => GROWTH.cache(ptr, m),
        Live::Block(b) => GROWTH.release_block(ptr, b),
    }
    Some(CUDA_SUCCESS)
}
