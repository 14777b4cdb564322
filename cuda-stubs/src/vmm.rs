//! Virtual memory management (cuMemCreate / cuMemAddressReserve / cuMemMap ...) and
//! stream-ordered memory pools.
//!
//! A physical allocation is a memfd of the requested size (sparse, so no RAM until touched);
//! cuMemMap maps it MAP_SHARED|MAP_FIXED into a PROT_NONE reservation, so several mappings
//! alias the same bytes. Mappings stay PROT_NONE until cuMemSetAccess, as on a real GPU.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use once_cell::sync::Lazy;

use crate::context::current;
use crate::device::{cfg, check_dev};
use crate::ffi::*;
use crate::memory::{CUdeviceptr, Kind, PtrInfo, alloc, free, ledger, page_size};
use libc::{c_int, c_void};

pub const GRANULARITY: usize = 2 << 20;

/// CUmemLocation.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// CUmemAllocationProp (CUDA 12.9 layout, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: usize, // void*
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// CUmemPoolProps (CUDA 12.9 layout, 88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: CUmemLocation,
    pub win32_security_attributes: usize, // void*
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// CUmemAccessDesc.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

const _: () = assert!(std::mem::size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<CUmemPoolProps>() == 88);
const _: () = assert!(std::mem::size_of::<CUmemAccessDesc>() == 12);

const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;

struct Phys {
    fd: c_int,
    size: usize,
    dev: usize,
    prop: CUmemAllocationProp,
    /// cuMemCreate / cuMemRetainAllocationHandle references not yet released.
    handle_refs: u32,
    mappings: u32,
}

#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: usize,
    handle: u64,
    dev: usize,
    /// CUmemAccess_flags: 0 none, 1 read, 3 read-write.
    access: c_int,
}

#[derive(Default)]
struct Vmm {
    phys: HashMap<u64, Phys>,
    next_handle: u64,
    /// Reserved ranges: start -> size.
    reserved: BTreeMap<usize, usize>,
    mappings: BTreeMap<usize, Mapping>,
}

static VMM: Lazy<Mutex<Vmm>> = Lazy::new(Default::default);

fn vmm() -> std::sync::MutexGuard<'static, Vmm> {
    VMM.lock().unwrap_or_else(|e| e.into_inner())
}

impl Vmm {
    /// Drops one reference (handle or mapping); frees the memory when none are left.
    fn maybe_destroy(&mut self, handle: u64) {
        let done = self
            .phys
            .get(&handle)
            .is_some_and(|p| p.handle_refs == 0 && p.mappings == 0);
        if done {
            let p = self.phys.remove(&handle).unwrap();
            // SAFETY: closing the memfd this library created; no mapping uses the fd itself.
            unsafe { libc::close(p.fd) };
            if let Ok(l) = ledger() {
                l.release(p.dev, p.size as u64, false);
            }
        }
    }

    fn mapping_at(&self, ptr: usize) -> Option<(usize, Mapping)> {
        let (&base, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr < base + m.size).then_some((base, *m))
    }

    /// The reservation containing [ptr, ptr+size).
    fn reservation_of(&self, ptr: usize, size: usize) -> Option<(usize, usize)> {
        let (&b, &len) = self.reserved.range(..=ptr).next_back()?;
        (ptr.checked_add(size)? <= b + len).then_some((b, len))
    }

    /// Mappings fully inside [ptr, ptr+size), and whether they cover it without gaps.
    fn mappings_in(&self, ptr: usize, size: usize) -> (Vec<usize>, bool) {
        let end = ptr + size;
        let mut starts = Vec::new();
        let mut at = ptr;
        let mut contiguous = true;
        for (&b, m) in self.mappings.range(ptr..end) {
            if b != at {
                contiguous = false;
            }
            if b + m.size > end {
                contiguous = false;
                break;
            }
            starts.push(b);
            at = b + m.size;
        }
        (starts, contiguous && at == end)
    }
}

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

pub fn pointer_info(ptr: usize) -> Option<PtrInfo> {
    let (base, m) = vmm().mapping_at(ptr)?;
    Some(PtrInfo {
        base,
        size: m.size,
        dev: m.dev,
        ctx: current().map(|c| c.0).unwrap_or(0),
        managed: false,
        pool: 0,
        id: m.handle,
        host: false,
    })
}

fn check_alloc_prop(prop: &CUmemAllocationProp) -> Result<usize, CUresult> {
    if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED
        || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_dev(prop.location.id).map_err(|_| CUDA_ERROR_INVALID_DEVICE)
}

// ---- memory pools ----

#[derive(Debug, Clone, Copy)]
struct Pool {
    dev: usize,
    is_default: bool,
    release_threshold: u64,
    used: u64,
    used_high: u64,
    reserved_high: u64,
    reuse: [c_int; 3],
}

#[derive(Default)]
struct Pools {
    pools: HashMap<usize, Pool>,
    default: Vec<usize>,
    current: Vec<usize>,
}

static POOLS: Lazy<Mutex<Pools>> = Lazy::new(Default::default);

fn pools() -> std::sync::MutexGuard<'static, Pools> {
    POOLS.lock().unwrap_or_else(|e| e.into_inner())
}

fn new_pool(dev: usize, is_default: bool) -> Pool {
    Pool {
        dev,
        is_default,
        release_threshold: 0,
        used: 0,
        used_high: 0,
        reserved_high: 0,
        reuse: [1, 1, 1],
    }
}

impl Pools {
    fn ensure(&mut self, dev: usize) {
        while self.default.len() <= dev {
            let d = self.default.len();
            let h = Box::into_raw(Box::new(0u64)) as usize;
            self.pools.insert(h, new_pool(d, true));
            self.default.push(h);
            self.current.push(h);
        }
    }
}

/// Adds `delta` bytes to a pool's in-use count (called by memory::alloc / free).
pub fn pool_account(pool: usize, delta: i64) {
    if let Some(p) = pools().pools.get_mut(&pool) {
        p.used = p.used.saturating_add_signed(delta);
        p.used_high = p.used_high.max(p.used);
        p.reserved_high = p.reserved_high.max(p.used);
    }
}

fn pool_get(pool: usize) -> Result<Pool, CUresult> {
    cfg()?;
    pools()
        .pools
        .get(&pool)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn alloc_from(dptr: *mut CUdeviceptr, size: usize, pool: Option<usize>, stream: usize) -> CuResult {
    let (ctx, sdev) = crate::stream::context_of(stream)?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (pool, dev) = match pool {
        Some(p) => (p, pool_get(p)?.dev),
        None => {
            let mut ps = pools();
            ps.ensure(sdev);
            (ps.current[sdev], sdev)
        }
    };
    out(dptr, alloc(dev, ctx, size as u64, Kind::Pool(pool))?)
}

crate::ffi::exports! {
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
        let ledger = ledger()?;
        ledger.reserve(dev, size as u64)?;
        // SAFETY: memfd_create with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"fakecuda-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: sizing the memfd we just created (sparse: no memory is committed).
        if fd < 0 || unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            if fd >= 0 {
                // SAFETY: closing our own fd.
                unsafe { libc::close(fd) };
            }
            ledger.unreserve(dev, size as u64);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        let mut v = vmm();
        v.next_handle += 1;
        let h = 0xfac0_0000_0000 + v.next_handle;
        v.phys.insert(h, Phys { fd, size, dev, prop, handle_refs: 1, mappings: 0 });
        note(|| format!("handle={h:#x}"));
        out(handle, h)
    }

    fn cuMemRelease(handle: u64) {
        cfg()?;
        let mut v = vmm();
        let p = v.phys.get_mut(&handle).filter(|p| p.handle_refs > 0).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        p.handle_refs -= 1;
        if let Ok(l) = ledger() {
            l.count_free_call(p.dev);
        }
        v.maybe_destroy(handle);
        Ok(())
    }

    fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) {
        cfg()?;
        let mut v = vmm();
        let (_, m) = v.mapping_at(addr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        v.phys.get_mut(&m.handle).ok_or(CUDA_ERROR_INVALID_VALUE)?.handle_refs += 1;
        out(handle, m.handle)
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: u64) {
        cfg()?;
        let p = vmm().phys.get(&handle).map(|p| p.prop).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(prop, p)
    }

    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: u64, handle_type: c_int, flags: u64) {
        cfg()?;
        if handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags != 0 {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let fd = vmm().phys.get(&handle).map(|p| p.fd).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: duplicating our own memfd for the caller to own.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        out(shareable.cast::<c_int>(), dup)
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        cfg()?;
        let page = page_size();
        if ptr.is_null() || flags != 0 || size == 0 || !size.is_multiple_of(page) || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let align = alignment.max(GRANULARITY);
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
        crate::memory::unmap(raw, start - raw);
        if raw + len > start + size {
            crate::memory::unmap(start + size, raw + len - (start + size));
        }
        vmm().reserved.insert(start, size);
        note(|| format!("ptr={start:#x}"));
        out(ptr, start as CUdeviceptr)
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        cfg()?;
        let mut v = vmm();
        let ptr = ptr as usize;
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
        crate::memory::unmap(ptr, size);
        Ok(())
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: u64, flags: u64) {
        cfg()?;
        let ptr = ptr as usize;
        let mut v = vmm();
        let (fd, psize, dev) = v.phys.get(&handle).map(|p| (p.fd, p.size, p.dev)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let page = page_size();
        let fits = offset.checked_add(size).is_some_and(|e| e <= psize);
        if flags != 0 || size == 0 || !fits || !ptr.is_multiple_of(page) || !offset.is_multiple_of(page) || !size.is_multiple_of(page) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        v.reservation_of(ptr, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let overlaps = v.mapping_at(ptr).is_some() || v.mappings.range(ptr..ptr + size).next().is_some();
        if overlaps {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: replaces part of our own reservation with the physical allocation's memfd.
        let p = unsafe {
            libc::mmap(ptr as *mut c_void, size, libc::PROT_NONE, libc::MAP_SHARED | libc::MAP_FIXED, fd, offset as libc::off_t)
        };
        if p == libc::MAP_FAILED {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        v.mappings.insert(ptr, Mapping { size, handle, dev, access: 0 });
        v.phys.get_mut(&handle).unwrap().mappings += 1;
        Ok(())
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        cfg()?;
        let ptr = ptr as usize;
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
        let ptr = ptr as usize;
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

    fn cuMemGetAccess(flags: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr) {
        cfg()?;
        let loc = inp(location)?;
        let (_, m) = vmm().mapping_at(ptr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let access = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE { m.access } else { 0 };
        out(flags, access as u64)
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut usize, dev: c_int) {
        let dev = check_dev(dev)?;
        let mut ps = pools();
        ps.ensure(dev);
        out(pool, ps.default[dev])
    }

    fn cuDeviceGetMemPool(pool: *mut usize, dev: c_int) {
        let dev = check_dev(dev)?;
        let mut ps = pools();
        ps.ensure(dev);
        out(pool, ps.current[dev])
    }

    fn cuDeviceSetMemPool(dev: c_int, pool: usize) {
        let dev = check_dev(dev)?;
        let mut ps = pools();
        ps.ensure(dev);
        match ps.pools.get(&pool) {
            Some(p) if p.dev == dev => {
                ps.current[dev] = pool;
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemPoolCreate(pool: *mut usize, props: *const CUmemPoolProps) {
        cfg()?;
        let props = inp(props)?;
        if pool.is_null() || props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = check_dev(props.location.id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let h = Box::into_raw(Box::new(0u64)) as usize;
        let mut ps = pools();
        ps.ensure(dev);
        ps.pools.insert(h, new_pool(dev, false));
        note(|| format!("pool={h:#x}"));
        out(pool, h)
    }

    fn cuMemPoolDestroy(pool: usize) {
        cfg()?;
        let mut ps = pools();
        let p = ps.pools.get(&pool).copied().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if p.is_default {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        ps.pools.remove(&pool);
        if ps.current[p.dev] == pool {
            ps.current[p.dev] = ps.default[p.dev];
        }
        Ok(())
    }

    fn cuMemPoolTrimTo(pool: usize, min_bytes: usize) {
        let _ = min_bytes;
        pool_get(pool).map(|_| ())
    }

    fn cuMemPoolSetAttribute(pool: usize, attr: c_int, value: *mut c_void) {
        pool_get(pool)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut ps = pools();
        let p = ps.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        match attr {
            // SAFETY (all arms): the caller passes a value of the attribute's type.
            1..=3 => p.reuse[attr as usize - 1] = inp(value.cast::<c_int>())?,
            4 => p.release_threshold = inp(value.cast::<u64>())?,
            6 | 8 => {
                if inp(value.cast::<u64>())? != 0 {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                if attr == 6 { p.reserved_high = p.used } else { p.used_high = p.used }
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    fn cuMemPoolGetAttribute(pool: usize, attr: c_int, value: *mut c_void) {
        let p = pool_get(pool)?;
        match attr {
            1..=3 => out(value.cast::<c_int>(), p.reuse[attr as usize - 1]),
            4 => out(value.cast::<u64>(), p.release_threshold),
            5 | 7 => out(value.cast::<u64>(), p.used),
            6 => out(value.cast::<u64>(), p.reserved_high),
            8 => out(value.cast::<u64>(), p.used_high),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemPoolSetAccess(pool: usize, desc: *const CUmemAccessDesc, count: usize) {
        pool_get(pool)?;
        if desc.is_null() && count > 0 { Err(CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
    }

    fn cuMemPoolGetAccess(flags: *mut c_int, pool: usize, location: *const CUmemLocation) {
        pool_get(pool)?;
        let loc = inp(location)?;
        out(flags, if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE { 3 } else { 0 })
    }

    fn cuMemAllocAsync | cuMemAllocAsync_ptsz (dptr: *mut CUdeviceptr, bytesize: usize, stream: usize) {
        alloc_from(dptr, bytesize, None, stream)
    }

    fn cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz (dptr: *mut CUdeviceptr, bytesize: usize, pool: usize, stream: usize) {
        alloc_from(dptr, bytesize, Some(pool), stream)
    }

    fn cuMemFreeAsync | cuMemFreeAsync_ptsz (dptr: CUdeviceptr, stream: usize) {
        crate::stream::check(stream)?;
        free(dptr)
    }
}
