//! Address ranges (cuMemAddressReserve, cuMemAddressFree) and the mappings in them
//! (cuMemMap, cuMemUnmap, cuMemSetAccess): a reservation is PROT_NONE address space; a
//! mapping maps a handle's memfd range MAP_SHARED|MAP_FIXED into it, inaccessible until
//! its access is set. Also whether a copy or a kernel may touch a range (`check_range`).

use libc::{c_int, c_void};

use super::{GRANULARITY, Mapping, vmm};
use crate::abi::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult,
};
use crate::model::os::unmap;

/// Replaces [ptr, ptr+len) with fresh inaccessible reserved address space.
fn remap_reserved(ptr: usize, len: usize) {
    // SAFETY: the range lies inside a reservation owned by this library.
    unsafe {
        libc::mmap(
            ptr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

fn prot_of(access: c_int) -> c_int {
    match access {
        3 => libc::PROT_READ | libc::PROT_WRITE,
        1 => libc::PROT_READ,
        _ => libc::PROT_NONE,
    }
}

/// Is [ptr, ptr+n) mapped VMM memory with enough access?
pub fn check_range(ptr: usize, n: usize, write: bool) -> bool {
    let v = vmm();
    let Some(end) = ptr.checked_add(n) else {
        return false;
    };
    let mut at = ptr;
    while at < end.max(ptr + 1) {
        let Some((base, m)) = v.mapping_at(at) else {
            return false;
        };
        let ok = if write {
            m.access == 3
        } else {
            m.access & 1 != 0
        };
        if !ok {
            return false;
        }
        at = base + m.size;
    }
    true
}

/// The mapping containing `ptr`: (its start, the mapping).
pub fn mapping_at(ptr: usize) -> Option<(usize, Mapping)> {
    vmm().mapping_at(ptr)
}

/// The reservation containing `ptr`: (its start, its size).
pub fn reservation_at(ptr: usize) -> Option<(usize, usize)> {
    vmm().reservation_of(ptr, 1)
}

/// Reserves `size` bytes of inaccessible address space aligned to `align` (a power of two,
/// at least the granularity), near `addr` if possible (cuMemAddressReserve).
pub fn reserve(size: usize, align: usize, addr: usize) -> Result<usize, CUresult> {
    let len = size.checked_add(align).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: a fresh inaccessible anonymous mapping; `addr` is only a hint.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let raw = p as usize;
    let start = raw.next_multiple_of(align);
    unmap(raw, start - raw);
    if raw + len > start + size {
        unmap(start + size, raw + len - (start + size));
    }
    vmm().reserved.insert(start, size);
    Ok(start)
}

/// Frees a whole reservation (cuMemAddressFree); its mappings go with it.
pub fn address_free(ptr: usize, size: usize) -> CuResult {
    let mut v = vmm();
    if v.reserved.get(&ptr) != Some(&size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (inside, _) = v.mappings_in(ptr, size);
    for b in inside {
        let m = v.mappings.remove(&b).unwrap();
        if let Some(p) = v.phys.get_mut(&m.handle) {
            p.mappings -= 1;
        }
        v.maybe_destroy(m.handle);
    }
    v.reserved.remove(&ptr);
    unmap(ptr, size);
    Ok(())
}

/// Maps `size` bytes of a handle from `offset` at `ptr`, inside a reservation and over no
/// other mapping (cuMemMap); inaccessible until `set_access`.
pub fn map(ptr: usize, size: usize, offset: usize, handle: u64, flags: u64) -> CuResult {
    let mut v = vmm();
    let p = v.phys.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let (psize, dev) = (p.size, p.dev);
    let (fd, base_off) = v.fd_of(p).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // Addresses, offsets and sizes in whole granules, as the real driver insists (a
    // mapping one page off the granularity is CUDA_ERROR_INVALID_VALUE there).
    let g = GRANULARITY;
    if flags != 0
        || size == 0
        || !ptr.is_multiple_of(g)
        || !offset.is_multiple_of(g)
        || !size.is_multiple_of(g)
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // A range past the end of the handle: CUDA_ERROR_NOT_SUPPORTED on the real driver.
    if offset.checked_add(size).is_none_or(|e| e > psize) {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    v.reservation_of(ptr, size)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let overlaps =
        v.mapping_at(ptr).is_some() || v.mappings.range(ptr..ptr + size).next().is_some();
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: replaces part of our own reservation with the physical allocation's memfd.
    let p = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            (base_off + offset as u64) as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    v.mappings.insert(
        ptr,
        Mapping {
            size,
            handle,
            dev,
            access: 0,
        },
    );
    v.phys.get_mut(&handle).unwrap().mappings += 1;
    Ok(())
}

/// Unmaps the mappings that exactly cover [ptr, ptr+size) (cuMemUnmap); the address space
/// stays reserved.
pub fn unmap_range(ptr: usize, size: usize) -> CuResult {
    let mut v = vmm();
    let (inside, covered) = v.mappings_in(ptr, size);
    if inside.is_empty() || !covered {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in inside {
        let m = v.mappings.remove(&b).unwrap();
        remap_reserved(b, m.size);
        if let Some(p) = v.phys.get_mut(&m.handle) {
            p.mappings -= 1;
        }
        v.maybe_destroy(m.handle);
    }
    Ok(())
}

/// Gives the mappings that exactly cover [ptr, ptr+size) the CUmemAccess_flags `access`
/// (cuMemSetAccess).
pub fn set_access(ptr: usize, size: usize, access: c_int) -> CuResult {
    let mut v = vmm();
    let (inside, covered) = v.mappings_in(ptr, size);
    if inside.is_empty() || !covered {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: changes protection of our own mappings only (the range is fully mapped).
    if unsafe { libc::mprotect(ptr as *mut c_void, size, prot_of(access)) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in inside {
        v.mappings.get_mut(&b).unwrap().access = access;
    }
    Ok(())
}
