//! Virtual memory management (cuMemCreate, cuMemAddressReserve, cuMemMap, cuMemSetAccess ...)
//! and shareable handles (cuMemExportToShareableHandle, cuMemImportFromShareableHandle).

use crate::abi::types::{
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, CUarrayMapInfo, CUdeviceptr, CUmemAccessDesc,
    CUmemAllocationProp, CUmemLocation,
};
use crate::abi::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUresult, inp,
    note, out,
};
use crate::model::device::{cfg, check_dev, ledger};
use crate::model::os::page_size;
use crate::model::vmm::{self, GRANULARITY};
use libc::{c_int, c_uint, c_void};

/// Where a CUmemAllocationProp puts its memory: pinned memory of a visible device (its
/// ordinal), or of the host (`None`: never device memory, whatever `location.id` says).
/// As CUDA 13.5's `cuMemCreate` documents: `HOST` ignores the id and takes no
/// shareable handle types, `HOST_NUMA` names a host NUMA node (`FAKECUDA_NUMA_NODES`),
/// `HOST_NUMA_CURRENT` ignores the id (the calling thread's node).
fn check_alloc_prop(prop: &CUmemAllocationProp) -> Result<Option<usize>, CUresult> {
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = cfg()?.numa_nodes;
    match prop.location.type_ {
        CU_MEM_LOCATION_TYPE_DEVICE => check_dev(prop.location.id)
            .map(Some)
            .map_err(|_| CUDA_ERROR_INVALID_DEVICE),
        CU_MEM_LOCATION_TYPE_HOST if prop.requested_handle_types == 0 => Ok(None),
        CU_MEM_LOCATION_TYPE_HOST_NUMA
            if u32::try_from(prop.location.id).is_ok_and(|n| n < nodes) =>
        {
            Ok(None)
        }
        CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(None),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// One step of `cuMemMapArrayAsync`: a mapping of a `cuMemCreate` handle (the generic
/// handle type) into a region of a sparse level or a mip tail of a sparse or
/// deferred-mapping array, or an unmapping there.
fn tile_op(info: &CUarrayMapInfo) -> Result<vmm::TileOp, CUresult> {
    if !crate::model::array::mappable(info.resource_type, info.resource) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let [w0, w1, w2, w3] = info.subresource;
    let (lo, hi) = (|w: u64| w as u32, |w: u64| (w >> 32) as u32);
    let place = match info.subresource_type {
        0 => vmm::Place::Level {
            level: lo(w0),
            layer: hi(w0),
            offset: [lo(w1), hi(w1), lo(w2)],
            extent: [hi(w2), lo(w3), hi(w3)],
        },
        1 => vmm::Place::MipTail {
            layer: lo(w0),
            offset: w1,
            size: w2,
        },
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let map = match (info.mem_operation_type, info.mem_handle_type) {
        (1, 0) => Some(info.mem_handle),
        (2, _) => None,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    Ok(vmm::TileOp {
        array: info.resource,
        place,
        map,
    })
}

crate::abi::exports! {
    // Maps memory into (or out of) sparse and deferred-mapping arrays, in the list's order
    // and at once (the fake does no work in the stream): every step is checked first.
    fn cuMemMapArrayAsync | cuMemMapArrayAsync_ptsz (list: *const CUarrayMapInfo, count: c_uint, hstream: usize) {
        cfg()?;
        crate::model::stream::check(hstream)?;
        if list.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes `count` CUarrayMapInfo at `list` (non-null, checked).
        let infos = unsafe { std::slice::from_raw_parts(list, count as usize) };
        let ops = infos.iter().map(tile_op).collect::<Result<Vec<_>, _>>()?;
        note(|| format!("{} steps", ops.len()));
        vmm::map_array(&ops)
    }

    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: c_int) {
        cfg()?;
        check_alloc_prop(&inp(prop)?)?;
        if !matches!(option, 0 | 1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(granularity, GRANULARITY)
    }

    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const CUmemAllocationProp, flags: u64) {
        cfg()?;
        let prop = inp(prop)?;
        let dev = check_alloc_prop(&prop)?;
        if handle.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(GRANULARITY) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = vmm::create(dev, size, prop)?;
        note(|| format!("handle={h:#x}"));
        out(handle, h)
    }

    fn cuMemRelease(handle: u64) {
        cfg()?;
        vmm::release(handle)
    }

    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) {
        cfg()?;
        out(handle, vmm::retain(addr as usize)?)
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: u64) {
        cfg()?;
        out(prop, vmm::properties(handle)?)
    }

    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: u64, handle_type: c_int, flags: u64) {
        cfg()?;
        if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags != 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if shareable.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(shareable.cast::<c_int>(), vmm::export_fd(handle)?)
    }

    fn cuMemImportFromShareableHandle(handle: *mut u64, os_handle: *mut c_void, handle_type: c_int) {
        ledger()?;
        if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (h, size) = vmm::import(os_handle as usize as c_int)?;
        note(|| format!("handle={h:#x}, bytes={size}"));
        out(handle, h)
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        cfg()?;
        let page = page_size();
        if ptr.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(page) || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let start = vmm::reserve(size, alignment.max(GRANULARITY), addr as usize)?;
        note(|| format!("ptr={start:#x}"));
        out(ptr, start as CUdeviceptr)
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        cfg()?;
        vmm::address_free(ptr as usize, size)
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) {
        cfg()?;
        vmm::map(ptr as usize, size, offset, handle, flags)
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        cfg()?;
        vmm::unmap_range(ptr as usize, size)
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) {
        cfg()?;
        if desc.is_null() || count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut access = 0;
        for i in 0..count {
            // SAFETY: the caller passes an array of `count` descriptors.
            let d = inp(unsafe { desc.add(i) })?;
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE || !matches!(d.flags, 0 | 1 | 3) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            check_dev(d.location.id).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
            access |= d.flags;
        }
        vmm::set_access(ptr as usize, size, access)
    }

    fn cuMemGetAccess(flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr) {
        cfg()?;
        let loc = inp(location)?;
        let (_, m) = vmm::mapping_at(ptr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let access = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE { m.access } else { 0 };
        out(flags, access as u64)
    }
}
