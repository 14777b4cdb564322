//! Checks of pools, many VMM handles, shareable handles, IPC, host memory and arrays through
//! the exports, in this process (default configuration: one 80 GiB device).

use std::ptr::null_mut;
use std::time::Instant;

use crate::abi::types::{
    CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUarrayMapInfo, CUipcMemHandle, CUmemAccessDesc,
    CUmemAllocationProp, CUmemLocation, CUmemPoolProps, CudaArray3dDescriptor,
    CudaArrayMemoryRequirements,
};
use crate::abi::{
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    CUresult,
};
use crate::api::array::{
    cuArray3DCreate_v2, cuArray3DGetDescriptor_v2, cuArrayDestroy, cuArrayGetMemoryRequirements,
    cuMipmappedArrayCreate, cuMipmappedArrayDestroy, cuMipmappedArrayGetLevel,
    cuMipmappedArrayGetMemoryRequirements,
};
use crate::api::context::{
    cuCtxCreate_v2, cuCtxDestroy_v2, cuCtxDetach, cuCtxGetDevice_v2, cuCtxSetCurrent,
    cuCtxSynchronize, cuCtxSynchronize_v2, cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxRetain,
};
use crate::api::copy::{cuMemcpyDtoH_v2, cuMemcpyHtoD_v2, cuMemsetD8_v2, cuMemsetD32_v2};
use crate::api::ipc::{
    cuIpcCloseMemHandle, cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2,
};
use crate::api::memory::{
    cuMemAlloc_v2, cuMemAllocHost_v2, cuMemAllocManaged, cuMemFree_v2, cuMemFreeHost,
    cuMemGetAddressRange_v2, cuMemHostAlloc, cuMemHostGetFlags, cuMemHostRegister_v2,
    cuMemHostUnregister, cuPointerGetAttribute,
};
use crate::api::pool::{
    cuDeviceGetDefaultMemPool, cuDeviceGetMemPool, cuDeviceSetMemPool, cuMemAllocAsync,
    cuMemAllocFromPoolAsync, cuMemFreeAsync, cuMemGetDefaultMemPool, cuMemGetMemPool,
    cuMemPoolCreate, cuMemPoolDestroy, cuMemPoolGetAccess, cuMemPoolGetAttribute,
    cuMemPoolSetAccess, cuMemPoolSetAttribute, cuMemPoolTrimTo, cuMemSetMemPool,
};
use crate::api::stream::{
    cuEventCreate, cuEventDestroy_v2, cuEventRecord, cuEventSynchronize, cuStreamCreate,
    cuStreamDestroy_v2, cuStreamGetGreenCtx, cuStreamSynchronize,
};
use crate::api::vmm::{
    cuMemAddressFree, cuMemAddressReserve, cuMemCreate, cuMemExportToShareableHandle,
    cuMemGetAllocationPropertiesFromHandle, cuMemImportFromShareableHandle, cuMemMap,
    cuMemMapArrayAsync, cuMemRelease, cuMemRetainAllocationHandle, cuMemSetAccess, cuMemUnmap,
};
use crate::api_tests::{setup, used};
use crate::model::device::ledger;
use crate::model::vmm::GRANULARITY;
use libc::c_void;

const MIB: usize = 1 << 20;

fn pool_attr(pool: usize, attr: i32) -> u64 {
    let mut v = 0u64;
    assert_eq!(
        unsafe { cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) },
        0
    );
    v
}

const RESERVED: i32 = 5;
const RESERVED_HIGH: i32 = 6;
const USED: i32 = 7;
const USED_HIGH: i32 = 8;

#[test]
fn pools_cache_freed_memory_until_a_synchronisation() {
    let (_g, _) = setup();
    let before = used();
    // SAFETY (all unsafe blocks in this file): valid pointers to locals, as a C caller passes.
    unsafe {
        let mut stream = 0;
        assert_eq!(cuStreamCreate(&mut stream, 0), 0);
        let mut pool = 0;
        assert_eq!(cuDeviceGetMemPool(&mut pool, 0), 0);
        let (mut a, mut b) = (0, 0);
        assert_eq!(cuMemAllocAsync(&mut a, 8 * MIB, stream), 0);
        assert_eq!(cuMemFreeAsync(a, stream), 0);
        // The pool grew by a 32 MiB chunk; freed to the pool, not to the device.
        assert_eq!(used() - before, 32 * MIB);
        assert_eq!(
            (pool_attr(pool, RESERVED), pool_attr(pool, USED)),
            (32 << 20, 0)
        );
        // Reused first: 5 MiB come from the cache, the pool does not grow.
        assert_eq!(cuMemAllocAsync(&mut b, 5 * MIB, stream), 0);
        assert_eq!(used() - before, 32 * MIB);
        // 30 more MiB: 27 cached, 3 missing: another chunk.
        assert_eq!(cuMemAllocFromPoolAsync(&mut a, 30 * MIB, pool, stream), 0);
        assert_eq!(used() - before, 64 * MIB);
        assert_eq!(
            (pool_attr(pool, RESERVED), pool_attr(pool, USED)),
            (64 << 20, 35 << 20)
        );
        assert_eq!(cuMemFreeAsync(a, stream), 0);
        assert_eq!(cuMemFreeAsync(b, stream), 0);
        assert_eq!(pool_attr(pool, USED_HIGH), 35 << 20);
        // Release threshold 0: the next synchronisation gives it all back.
        assert_eq!(cuStreamSynchronize(stream), 0);
        assert_eq!(used(), before);
        assert_eq!(pool_attr(pool, RESERVED), 0);
        assert_eq!(pool_attr(pool, RESERVED_HIGH), 64 << 20);
        let mut zero = 0u64;
        assert_eq!(
            cuMemPoolSetAttribute(pool, RESERVED_HIGH, (&mut zero as *mut u64).cast()),
            0
        );
        assert_eq!(pool_attr(pool, RESERVED_HIGH), 0);

        // A threshold keeps that much cached across synchronisations; TrimTo releases it.
        let mut threshold = 4u64 << 20;
        assert_eq!(
            cuMemPoolSetAttribute(pool, 4, (&mut threshold as *mut u64).cast()),
            0
        );
        assert_eq!(cuMemAllocAsync(&mut a, 10 * MIB, stream), 0);
        assert_eq!(cuMemFreeAsync(a, stream), 0);
        assert_eq!(cuCtxSynchronize(), 0);
        assert_eq!(pool_attr(pool, RESERVED), 4 << 20);
        assert_eq!(used() - before, 4 * MIB);
        // CUDA 13's cuCtxSynchronize_v2 (NULL: the current context) synchronises the same.
        assert_eq!(cuMemAllocAsync(&mut a, 6 * MIB, stream), 0);
        assert_eq!(cuMemFreeAsync(a, stream), 0);
        assert_eq!(
            pool_attr(pool, RESERVED),
            36 << 20,
            "4 cached, 2 missing: a chunk"
        );
        assert_eq!(cuCtxSynchronize_v2(0), 0);
        assert_eq!(pool_attr(pool, RESERVED), 4 << 20);
        assert_eq!(cuCtxSynchronize_v2(0xdead_0000), CUDA_ERROR_INVALID_CONTEXT);
        let mut dev = -1;
        assert_eq!(cuCtxGetDevice_v2(&mut dev, 0), 0);
        assert_eq!(dev, 0);
        assert_eq!(
            cuCtxGetDevice_v2(&mut dev, 0xdead_0000),
            CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(cuMemAllocAsync(&mut a, 3 * MIB, stream), 0);
        assert_eq!(cuMemPoolTrimTo(pool, 0), 0);
        assert_eq!(
            pool_attr(pool, RESERVED),
            4 << 20,
            "memory in use is never trimmed (nor the rest of its chunk)"
        );
        assert_eq!(cuMemFreeAsync(a, stream), 0);
        assert_eq!(cuMemPoolTrimTo(pool, 1 << 20), 0);
        assert_eq!(pool_attr(pool, RESERVED), 1 << 20);
        assert_eq!(cuMemPoolTrimTo(pool, 0), 0);
        threshold = 0;
        assert_eq!(
            cuMemPoolSetAttribute(pool, 4, (&mut threshold as *mut u64).cast()),
            0
        );
        // Events synchronise too.
        let mut ev = 0;
        assert_eq!(cuEventCreate(&mut ev, 0), 0);
        assert_eq!(cuMemAllocAsync(&mut a, MIB, stream), 0);
        assert_eq!(cuMemFreeAsync(a, stream), 0);
        assert_eq!(cuEventRecord(ev, stream), 0);
        assert_eq!(used() - before, 32 * MIB);
        assert_eq!(cuEventSynchronize(ev), 0);
        assert_eq!(cuEventDestroy_v2(ev), 0);
        assert_eq!(cuStreamDestroy_v2(stream), 0);
    }
    assert_eq!(used(), before);
}

#[test]
fn created_pools_max_size_set_and_destroy() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut props: CUmemPoolProps = std::mem::zeroed();
        props.alloc_type = 1;
        props.location = CUmemLocation { type_: 1, id: 0 };
        props.max_size = 4 * MIB;
        let mut pool = 0;
        assert_eq!(cuMemPoolCreate(&mut pool, &props), 0);
        let mut p = 0;
        assert_eq!(
            cuMemAllocFromPoolAsync(&mut p, 5 * MIB, pool, 0),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        assert_eq!(cuDeviceSetMemPool(0, pool), 0);
        let mut cur = 0;
        assert_eq!(cuDeviceGetMemPool(&mut cur, 0), 0);
        assert_eq!(cur, pool);
        assert_eq!(cuMemAllocAsync(&mut p, 3 * MIB, 0), 0);
        assert_eq!(pool_attr(pool, RESERVED), 4 << 20, "a chunk cut to maxSize");
        let mut info = std::mem::zeroed::<[u64; 1]>();
        assert_eq!(cuPointerGetAttribute(info.as_mut_ptr().cast(), 17, p), 0);
        assert_eq!(info[0] as usize, pool);
        // Destroyed with an allocation outstanding: it stays valid, the pool goes with it.
        assert_eq!(cuMemPoolDestroy(pool), 0);
        assert_eq!(cuDeviceGetMemPool(&mut cur, 0), 0);
        let mut default = 0;
        assert_eq!(cuDeviceGetDefaultMemPool(&mut default, 0), 0);
        assert_eq!(cur, default);
        assert_eq!(used() - before, 4 * MIB);
        assert_eq!(cuMemsetD8_v2(p, 1, 3 * MIB), 0);
        assert_eq!(cuMemFreeAsync(p, 0), 0);
        assert_eq!(used(), before, "a destroyed pool keeps nothing");
        assert_eq!(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemPoolDestroy(default), CUDA_ERROR_INVALID_VALUE);
    }
}

fn prop(handle_types: i32) -> CUmemAllocationProp {
    // SAFETY: a plain C struct, zero is its default.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = 1;
    prop.requested_handle_types = handle_types;
    prop.location = CUmemLocation { type_: 1, id: 0 };
    prop
}

const RW: CUmemAccessDesc = CUmemAccessDesc {
    location: CUmemLocation { type_: 1, id: 0 },
    flags: 3,
};

/// This process's fds that are VMM memfds (arenas or handles of their own).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| {
            let t = t.to_string_lossy();
            t.contains("memfd:fakecuda-arena") || t.contains("memfd:fakecuda-vmm")
        })
        .count()
}

/// gpucap's growth mode: a big footprint as thousands of 2 MiB handles, each mapped on its
/// own, and many reserve/map/unmap/free cycles. One fd per device, whatever the count.
#[test]
fn thousands_of_vmm_handles() {
    let (_g, _) = setup();
    let before = used();
    let g = GRANULARITY;
    let prop = prop(0);
    let fds = open_fds();
    unsafe {
        // 3 GiB in 1536 pages of one reservation.
        let n = 1536;
        let mut va = 0;
        assert_eq!(cuMemAddressReserve(&mut va, n * g, 0, 0, 0), 0);
        let mut handles = Vec::new();
        for i in 0..n {
            let mut h = 0;
            assert_eq!(cuMemCreate(&mut h, g, &prop, 0), 0, "handle {i}");
            assert_eq!(cuMemMap(va + (i * g) as u64, g, 0, h, 0), 0);
            assert_eq!(cuMemRelease(h), 0);
            handles.push(h);
        }
        assert_eq!(cuMemSetAccess(va, n * g, &RW, 1), 0);
        assert_eq!(used() - before, n * g);
        assert!(open_fds() <= fds + 1, "one arena fd, not one per handle");
        // Each page is its own memory.
        for i in (0..n).step_by(97) {
            assert_eq!(cuMemsetD32_v2(va + (i * g) as u64, i as u32, g / 4), 0);
        }
        for i in (0..n).step_by(97) {
            let mut w = [0u32; 2];
            let at = va + (i * g + g - 4) as u64;
            assert_eq!(cuMemcpyDtoH_v2(w.as_mut_ptr().cast(), at, 4), 0);
            assert_eq!(w[0], i as u32);
        }
        assert_eq!(cuMemUnmap(va, n * g), 0);
        assert_eq!(cuMemAddressFree(va, n * g), 0);
        assert_eq!(used(), before);

        // 512 create + reserve + map + unmap + free + release cycles.
        let t = Instant::now();
        for _ in 0..512 {
            let (mut h, mut va) = (0, 0);
            assert_eq!(cuMemCreate(&mut h, g, &prop, 0), 0);
            assert_eq!(cuMemAddressReserve(&mut va, g, 0, 0, 0), 0);
            assert_eq!(cuMemMap(va, g, 0, h, 0), 0);
            assert_eq!(cuMemSetAccess(va, g, &RW, 1), 0);
            assert_eq!(cuMemsetD8_v2(va, 0x5a, 4096), 0);
            assert_eq!(cuMemUnmap(va, g), 0);
            assert_eq!(cuMemAddressFree(va, g), 0);
            assert_eq!(cuMemRelease(h), 0);
        }
        let el = t.elapsed();
        eprintln!("512 VMM create+reserve+map+access+touch+unmap+free+release cycles: {el:?}");
        assert!(el.as_secs_f64() < 5.0, "{el:?}");
    }
    assert_eq!(used(), before);
    assert!(open_fds() <= fds + 1);
}

#[test]
fn mappings_of_one_handle_alias() {
    let (_g, _) = setup();
    let g = GRANULARITY;
    unsafe {
        let prop = prop(0);
        let mut h = 0;
        assert_eq!(cuMemCreate(&mut h, 2 * g, &prop, 0), 0);
        let (mut va1, mut va2) = (0, 0);
        assert_eq!(cuMemAddressReserve(&mut va1, 2 * g, 0, 0, 0), 0);
        assert_eq!(cuMemAddressReserve(&mut va2, g, 0, 0, 0), 0);
        assert_eq!(cuMemMap(va1, 2 * g, 0, h, 0), 0);
        // The second half of the handle, on its own.
        assert_eq!(cuMemMap(va2, g, g, h, 0), 0);
        assert_eq!(cuMemSetAccess(va1, 2 * g, &RW, 1), 0);
        assert_eq!(cuMemSetAccess(va2, g, &RW, 1), 0);
        let x = 0x1234_5678u32;
        assert_eq!(
            cuMemcpyHtoD_v2(va1 + g as u64 + 8, (&x as *const u32).cast(), 4),
            0
        );
        let mut y = 0u32;
        assert_eq!(cuMemcpyDtoH_v2((&mut y as *mut u32).cast(), va2 + 8, 4), 0);
        assert_eq!(y, x);
        assert_eq!(cuMemsetD8_v2(va2, 0xab, 1), 0);
        let mut b = 0u8;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut b as *mut u8).cast(), va1 + g as u64, 1),
            0
        );
        assert_eq!(b, 0xab);
        assert_eq!(cuMemRelease(h), 0);
        assert_eq!(cuMemUnmap(va1, 2 * g), 0);
        assert_eq!(cuMemUnmap(va2, g), 0);
        assert_eq!(cuMemAddressFree(va1, 2 * g), 0);
        assert_eq!(cuMemAddressFree(va2, g), 0);
    }
}

#[test]
fn shareable_fd_handles_import_without_charge() {
    let (_g, _) = setup();
    let before = used();
    let g = GRANULARITY;
    unsafe {
        let mut h = 0;
        assert_eq!(cuMemCreate(&mut h, g, &prop(1), 0), 0);
        let mut fd = -1i32;
        assert_eq!(
            cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 1, 0),
            0
        );
        assert!(fd >= 0);
        let mut imported = 0;
        assert_eq!(
            cuMemImportFromShareableHandle(&mut imported, fd as usize as *mut c_void, 1),
            0
        );
        libc::close(fd);
        assert_ne!(imported, h);
        assert_eq!(used() - before, g, "an imported handle costs nothing more");
        let mut back: CUmemAllocationProp = std::mem::zeroed();
        assert_eq!(
            cuMemGetAllocationPropertiesFromHandle(&mut back, imported),
            0
        );
        assert_eq!((back.location.id, back.requested_handle_types), (0, 1));
        let (mut va1, mut va2) = (0, 0);
        assert_eq!(cuMemAddressReserve(&mut va1, g, 0, 0, 0), 0);
        assert_eq!(cuMemAddressReserve(&mut va2, g, 0, 0, 0), 0);
        assert_eq!(cuMemMap(va1, g, 0, h, 0), 0);
        assert_eq!(cuMemMap(va2, g, 0, imported, 0), 0);
        assert_eq!(cuMemSetAccess(va1, g, &RW, 1), 0);
        assert_eq!(cuMemSetAccess(va2, g, &RW, 1), 0);
        assert_eq!(cuMemsetD32_v2(va1 + 64, 77, 1), 0);
        let mut y = 0u32;
        assert_eq!(cuMemcpyDtoH_v2((&mut y as *mut u32).cast(), va2 + 64, 4), 0);
        assert_eq!(y, 77);
        for (va, hh) in [(va1, h), (va2, imported)] {
            assert_eq!(cuMemUnmap(va, g), 0);
            assert_eq!(cuMemAddressFree(va, g), 0);
            assert_eq!(cuMemRelease(hh), 0);
        }
        assert_eq!(used(), before);
        // Without the fd handle type requested there is no fd to export.
        assert_eq!(cuMemCreate(&mut h, g, &prop(0), 0), 0);
        assert_eq!(
            cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 1, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, 2, 0),
            CUDA_ERROR_NOT_SUPPORTED
        );
        assert_eq!(cuMemRelease(h), 0);
        assert_eq!(
            cuMemImportFromShareableHandle(&mut imported, 12345usize as *mut c_void, 1),
            CUDA_ERROR_INVALID_VALUE
        );
    }
    assert_eq!(used(), before);
}

#[test]
fn ipc_handles_open_the_same_memory_without_charge() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 3 * MIB + 100), 0);
        assert_eq!(cuMemsetD32_v2(p, 0xfeed, 1024), 0);
        let mut h = CUipcMemHandle { reserved: [0; 64] };
        assert_eq!(cuIpcGetMemHandle(&mut h, p + 10), 0);
        // The content survived the move onto a memfd.
        let mut w = 0u32;
        assert_eq!(cuMemcpyDtoH_v2((&mut w as *mut u32).cast(), p + 4000, 4), 0);
        assert_eq!(w, 0xfeed);
        let mut q = 0;
        assert_eq!(cuIpcOpenMemHandle_v2(&mut q, h, 1), 0);
        assert_ne!(q, p);
        // 3 MiB + 100 takes two whole 2 MiB pages, as on the real driver.
        assert_eq!(used() - before, 4 * MIB, "opening is not an allocation");
        let mut q2 = 0;
        assert_eq!(cuIpcOpenMemHandle(&mut q2, h, 0), 0);
        assert_eq!(q2, q, "opened again: same address");
        assert_eq!(cuMemcpyDtoH_v2((&mut w as *mut u32).cast(), q + 8, 4), 0);
        assert_eq!(w, 0xfeed);
        assert_eq!(cuMemsetD8_v2(q + 3 * MIB as u64, 0x42, 100), 0);
        let mut b = 0u8;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut b as *mut u8).cast(), p + 3 * MIB as u64 + 99, 1),
            0
        );
        assert_eq!(b, 0x42);
        // Pointer queries know it as device memory of device 0.
        let (mut base, mut size) = (0, 0);
        assert_eq!(cuMemGetAddressRange_v2(&mut base, &mut size, q + 5), 0);
        assert_eq!((base, size), (q, 3 * MIB + 100));
        assert_eq!(
            cuMemFree_v2(q),
            CUDA_ERROR_INVALID_VALUE,
            "not an allocation of ours"
        );
        assert_eq!(cuIpcCloseMemHandle(q), 0);
        assert_eq!(cuIpcCloseMemHandle(q), 0);
        assert_eq!(cuIpcCloseMemHandle(q), CUDA_ERROR_INVALID_VALUE);
        // Exporting again gives an equivalent handle.
        let mut h2 = CUipcMemHandle { reserved: [0; 64] };
        assert_eq!(cuIpcGetMemHandle(&mut h2, p), 0);
        assert_eq!(h2.reserved, h.reserved);
        assert_eq!(cuMemFree_v2(p), 0);
        // Freed: the handle no longer opens.
        assert_eq!(
            cuIpcOpenMemHandle_v2(&mut q, h, 1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuIpcGetMemHandle(&mut h, 0x1000), CUDA_ERROR_INVALID_VALUE);
        // Managed and pool memory cannot be exported this way.
        assert_eq!(cuMemAllocManaged(&mut p, MIB, 1), 0);
        assert_eq!(cuIpcGetMemHandle(&mut h, p), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemFree_v2(p), 0);
    }
    assert_eq!(used(), before);
}

#[test]
fn pinned_host_memory_is_not_device_memory() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let (mut a, mut b) = (null_mut(), null_mut());
        assert_eq!(cuMemAllocHost_v2(&mut a, 64 * MIB), 0);
        assert_eq!(cuMemHostAlloc(&mut b, 64 * MIB, 0), 0);
        let mut buf = vec![0u8; 8 * MIB];
        let reg = buf.as_mut_ptr().cast::<c_void>();
        assert_eq!(cuMemHostRegister_v2(reg, buf.len(), 0), 0);
        assert_eq!(used(), before);
        assert_eq!(
            cuMemHostRegister_v2(reg.add(4096), 4096, 0),
            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        let mut flags = 9;
        assert_eq!(cuMemHostGetFlags(&mut flags, reg), 0);
        // Device <-> pinned copies work.
        let mut d = 0;
        assert_eq!(cuMemAlloc_v2(&mut d, 4096), 0);
        assert_eq!(cuMemsetD8_v2(d, 7, 4096), 0);
        assert_eq!(cuMemcpyDtoH_v2(a, d, 4096), 0);
        assert_eq!(*(a as *const u8).add(4095), 7);
        assert_eq!(cuMemFree_v2(d), 0);
        assert_eq!(
            cuMemFreeHost(reg),
            CUDA_ERROR_INVALID_VALUE,
            "registered, not allocated"
        );
        assert_eq!(cuMemHostUnregister(reg), 0);
        assert_eq!(
            cuMemHostUnregister(reg),
            CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        );
        assert_eq!(cuMemFreeHost(a), 0);
        assert_eq!(cuMemFreeHost(b), 0);
        assert_eq!(cuMemFreeHost(b), CUDA_ERROR_INVALID_VALUE);
    }
    assert_eq!(used(), before);
}

#[test]
fn array_requirements_match_the_charge() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut desc = CudaArray3dDescriptor {
            width: 100,
            height: 30,
            depth: 2,
            format: 0x20,
            num_channels: 2,
            flags: 0,
        };
        let mut a = 0;
        assert_eq!(cuArray3DCreate_v2(&mut a, &desc), 0);
        let mut r = CudaArrayMemoryRequirements::default();
        assert_eq!(cuArrayGetMemoryRequirements(&mut r, a, 0), 0);
        assert_eq!(
            (r.size, r.alignment),
            (48_128, 512),
            "100*30*2*2*4 = 48000, rounded up"
        );
        assert_eq!(used() - before, r.size);
        assert_eq!(
            cuArrayGetMemoryRequirements(&mut r, a, 3),
            CUDA_ERROR_INVALID_DEVICE
        );
        assert_eq!(cuArrayDestroy(a), 0);
        assert_eq!(
            cuArrayGetMemoryRequirements(&mut r, a, 0),
            CUDA_ERROR_INVALID_HANDLE
        );

        // Deferred mapping: nothing charged, same requirements.
        desc.flags = 0x80;
        assert_eq!(cuArray3DCreate_v2(&mut a, &desc), 0);
        assert_eq!(used(), before);
        assert_eq!(cuArrayGetMemoryRequirements(&mut r, a, 0), 0);
        assert_eq!(r.size, 48_128);
        assert_eq!(cuArrayDestroy(a), 0);

        // Mipmaps: the levels add up.
        desc = CudaArray3dDescriptor {
            width: 256,
            height: 64,
            depth: 0,
            format: 0x01,
            num_channels: 4,
            flags: 0,
        };
        let mut m = 0;
        assert_eq!(
            cuMipmappedArrayCreate(&mut m, &desc, 10),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMipmappedArrayCreate(&mut m, &desc, 4), 0);
        let want = 256 * 64 * 4 + 128 * 32 * 4 + 64 * 16 * 4 + 32 * 8 * 4;
        assert_eq!(cuMipmappedArrayGetMemoryRequirements(&mut r, m, 0), 0);
        assert_eq!((r.size, r.alignment), (want, 512));
        assert_eq!(used() - before, want);
        let mut level = 0;
        assert_eq!(cuMipmappedArrayGetLevel(&mut level, m, 2), 0);
        let mut ld = CudaArray3dDescriptor {
            width: 0,
            height: 0,
            depth: 0,
            format: 0,
            num_channels: 0,
            flags: 0,
        };
        assert_eq!(cuArray3DGetDescriptor_v2(&mut ld, level), 0);
        assert_eq!((ld.width, ld.height), (64, 16));
        assert_eq!(cuArrayGetMemoryRequirements(&mut r, level, 0), 0);
        assert_eq!(r.size, 64 * 16 * 4);
        assert_eq!(
            cuMipmappedArrayGetLevel(&mut level, m, 4),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuArrayDestroy(level),
            CUDA_ERROR_INVALID_HANDLE,
            "levels go with the mipmap"
        );
        assert_eq!(cuMipmappedArrayDestroy(m), 0);
        assert_eq!(cuMipmappedArrayDestroy(m), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            cuArray3DGetDescriptor_v2(&mut ld, level),
            CUDA_ERROR_INVALID_HANDLE
        );
    }
    assert_eq!(used(), before);
}

fn pool_int(pool: usize, attr: i32) -> Result<i32, CUresult> {
    let mut v = 0x5555_5555i32;
    match unsafe { cuMemPoolGetAttribute(pool, attr, (&mut v as *mut i32).cast()) } {
        0 => Ok(v),
        e => Err(e),
    }
}

fn device_pool_props(max_size: usize, handle_types: i32) -> CUmemPoolProps {
    // SAFETY: a plain C struct, zero is its default.
    let mut props: CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.alloc_type = 1;
    props.handle_types = handle_types;
    props.location = CUmemLocation { type_: 1, id: 0 };
    props.max_size = max_size;
    props
}

/// CUDA 13.2's pool attributes name the pool's device (the default driver here is 13.5;
/// process_tests checks that older drivers do not know them), and CUDA 13's by-location
/// calls find the same pools as the by-device ones.
#[test]
fn pools_say_where_they_live() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut default = 0;
        assert_eq!(cuDeviceGetDefaultMemPool(&mut default, 0), 0);
        let props = device_pool_props(8 * MIB, 1);
        let mut pool = 0;
        assert_eq!(cuMemPoolCreate(&mut pool, &props), 0);
        // ALLOCATION_TYPE, EXPORT_HANDLE_TYPES, LOCATION_ID, LOCATION_TYPE,
        // HW_DECOMPRESS_ENABLED, LOCALITY_DOMAIN_ID (int); MAX_POOL_SIZE (cuuint64_t).
        let ints = [9, 10, 11, 12, 14, 15];
        let got = |p: usize| ints.map(|a| pool_int(p, a));
        assert_eq!(got(default), [1, 0, 0, 1, 0, -1].map(Ok));
        assert_eq!(got(pool), [1, 1, 0, 1, 0, -1].map(Ok));
        assert_eq!((pool_attr(default, 13), pool_attr(pool, 13)), (0, 8 << 20));
        assert_eq!(pool_int(pool, 16), Err(CUDA_ERROR_INVALID_VALUE));
        let mut v = 1i32;
        assert_eq!(
            cuMemPoolSetAttribute(pool, 11, (&mut v as *mut i32).cast()),
            CUDA_ERROR_INVALID_VALUE,
            "read-only"
        );

        // The pool's own device has READWRITE access; there is no other device here.
        let mut flags = -1;
        let dev0 = CUmemLocation { type_: 1, id: 0 };
        for p in [default, pool] {
            assert_eq!(cuMemPoolGetAccess(&mut flags, p, &dev0), 0);
            assert_eq!(flags, 3);
        }
        let host = CUmemLocation { type_: 2, id: 0 };
        assert_eq!(cuMemPoolGetAccess(&mut flags, pool, &host), 0);
        assert_eq!(flags, 0);
        let dev1 = CUmemLocation { type_: 1, id: 1 };
        assert_eq!(
            cuMemPoolGetAccess(&mut flags, pool, &dev1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemPoolSetAccess(pool, &RW, 1), 0);
        let revoke = CUmemAccessDesc {
            location: dev0,
            flags: 0,
        };
        assert_eq!(
            cuMemPoolSetAccess(pool, &revoke, 1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemPoolGetAccess(&mut flags, pool, &dev0), 0);
        assert_eq!(flags, 3);

        // cuMemGetDefaultMemPool / cuMemGetMemPool / cuMemSetMemPool (device, pinned).
        let mut loc = dev0;
        let (mut got_default, mut current) = (0, 0);
        assert_eq!(cuMemGetDefaultMemPool(&mut got_default, &mut loc, 1), 0);
        assert_eq!(got_default, default);
        assert_eq!(cuMemGetMemPool(&mut current, &mut loc, 1), 0);
        assert_eq!(current, default);
        assert_eq!(cuMemSetMemPool(&mut loc, 1, pool), 0);
        assert_eq!(cuDeviceGetMemPool(&mut current, 0), 0);
        assert_eq!(current, pool, "the same setting as cuDeviceSetMemPool");
        assert_eq!(cuMemGetMemPool(&mut current, &mut loc, 1), 0);
        assert_eq!(current, pool);
        let mut p = 0;
        assert_eq!(cuMemAllocAsync(&mut p, MIB, 0), 0);
        assert_eq!(pool_attr(pool, USED), 1 << 20, "cuMemAllocAsync uses it");
        assert_eq!(cuMemFreeAsync(p, 0), 0);
        assert_eq!(cuDeviceSetMemPool(0, default), 0);
        assert_eq!(cuMemGetMemPool(&mut current, &mut loc, 1), 0);
        assert_eq!(current, default);
        // Managed and host pools are not modelled; the rest is invalid.
        let mut host = host;
        let cases = [
            (host, 1, CUDA_ERROR_NOT_SUPPORTED),
            (
                CUmemLocation { type_: 3, id: 0 },
                1,
                CUDA_ERROR_NOT_SUPPORTED,
            ),
            (dev0, 2, CUDA_ERROR_NOT_SUPPORTED),
            (
                CUmemLocation { type_: 0, id: 0 },
                2,
                CUDA_ERROR_NOT_SUPPORTED,
            ),
            (
                CUmemLocation { type_: 0, id: 0 },
                1,
                CUDA_ERROR_INVALID_VALUE,
            ),
            (
                CUmemLocation { type_: 4, id: 0 },
                1,
                CUDA_ERROR_INVALID_VALUE,
            ),
            (
                CUmemLocation { type_: 5, id: 0 },
                1,
                CUDA_ERROR_INVALID_VALUE,
            ),
            (dev0, 0, CUDA_ERROR_INVALID_VALUE),
            (dev0, 3, CUDA_ERROR_INVALID_VALUE),
            (dev1, 1, CUDA_ERROR_INVALID_VALUE),
        ];
        for (mut l, t, want) in cases {
            assert_eq!(
                cuMemGetMemPool(&mut current, &mut l, t),
                want,
                "{l:?} type {t}"
            );
            assert_eq!(cuMemSetMemPool(&mut l, t, default), want, "{l:?} type {t}");
            let want = if l.type_ == 1 && l.id == 1 {
                CUDA_ERROR_INVALID_DEVICE
            } else {
                want
            };
            assert_eq!(
                cuMemGetDefaultMemPool(&mut current, &mut l, t),
                want,
                "{l:?} type {t}"
            );
        }
        assert_eq!(
            cuMemGetMemPool(&mut current, null_mut(), 1),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemSetMemPool(&mut host, 1, pool),
            CUDA_ERROR_NOT_SUPPORTED
        );
        assert_eq!(cuMemPoolDestroy(pool), 0);
        assert_eq!(
            cuMemSetMemPool(&mut loc, 1, pool),
            CUDA_ERROR_INVALID_VALUE,
            "destroyed"
        );
        assert_eq!(pool_int(pool, 11), Err(CUDA_ERROR_INVALID_VALUE));
    }
    assert_eq!(used(), before);
}

/// VMM memory stays while anything references it: a handle (cuMemCreate or
/// cuMemRetainAllocationHandle) or a mapping; a handle maps at several addresses.
#[test]
fn vmm_memory_lives_until_the_last_reference() {
    let (_g, _) = setup();
    let before = used();
    let stats_used = || ledger().unwrap().stats(0).used;
    let stats_before = stats_used();
    let g = GRANULARITY;
    unsafe {
        let mut h = 0;
        assert_eq!(cuMemCreate(&mut h, 2 * g, &prop(0), 0), 0);
        let (mut va1, mut va2) = (0, 0);
        assert_eq!(cuMemAddressReserve(&mut va1, 2 * g, 0, 0, 0), 0);
        assert_eq!(cuMemAddressReserve(&mut va2, 2 * g, 0, 0, 0), 0);
        assert_eq!(cuMemMap(va1, 2 * g, 0, h, 0), 0);
        assert_eq!(cuMemMap(va2, 2 * g, 0, h, 0), 0);
        assert_eq!(cuMemSetAccess(va1, 2 * g, &RW, 1), 0);
        assert_eq!(cuMemSetAccess(va2, 2 * g, &RW, 1), 0);
        let x = 0xfeed_beefu32;
        assert_eq!(cuMemcpyHtoD_v2(va1 + 4096, (&x as *const u32).cast(), 4), 0);
        let mut y = 0u32;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut y as *mut u32).cast(), va2 + 4096, 4),
            0
        );
        assert_eq!(y, x, "one memory at two addresses");
        assert_eq!(used() - before, 2 * g, "charged once");

        let mut retained = 0;
        assert_eq!(
            cuMemRetainAllocationHandle(&mut retained, (va2 + 100) as *mut c_void),
            0
        );
        assert_eq!(retained, h);
        assert_eq!(cuMemRelease(h), 0);
        assert_eq!(cuMemUnmap(va1, 2 * g), 0);
        assert_eq!(cuMemUnmap(va2, 2 * g), 0);
        // Released once, unmapped everywhere, but the retained reference holds it.
        assert_eq!(used() - before, 2 * g);
        assert_eq!(stats_used() - stats_before, 2 * g as u64);
        assert_eq!(cuMemMap(va1, 2 * g, 0, h, 0), 0, "still a valid handle");
        assert_eq!(cuMemRelease(h), 0);
        // No handle left, one mapping: still there, and still the same bytes.
        assert_eq!(used() - before, 2 * g);
        assert_eq!(cuMemSetAccess(va1, 2 * g, &RW, 1), 0);
        assert_eq!(
            cuMemcpyDtoH_v2((&mut y as *mut u32).cast(), va1 + 4096, 4),
            0
        );
        assert_eq!(y, x);
        assert_eq!(
            cuMemRelease(h),
            CUDA_ERROR_INVALID_VALUE,
            "no reference left to release"
        );
        assert_eq!(cuMemUnmap(va1, 2 * g), 0);
        assert_eq!(used(), before, "the last mapping gone: freed");
        assert_eq!(stats_used(), stats_before);
        assert_eq!(cuMemMap(va1, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuMemAddressFree(va1, 2 * g), 0);
        assert_eq!(cuMemAddressFree(va2, 2 * g), 0);
    }
}

/// A `CUarrayMapInfo` step on `array` (`mipmapped`: a mipmapped array's mip tail, else a
/// level 0 region of 64 x 64): map `handle`, or unmap (`handle` None).
fn tile(mipmapped: bool, array: usize, handle: Option<u64>) -> CUarrayMapInfo {
    // SAFETY: CUarrayMapInfo is plain data; all zeros is a valid value.
    let mut m: CUarrayMapInfo = unsafe { std::mem::zeroed() };
    m.resource_type = mipmapped.into();
    m.resource = array;
    if mipmapped {
        m.subresource_type = 1;
        m.subresource = [0, 0, 2 << 20, 0]; // layer 0, offset 0, 2 MiB
    } else {
        m.subresource = [0, 0, 64 << 32, 64 | (1 << 32)]; // extent 64 x 64 x 1
    }
    m.mem_operation_type = if handle.is_some() { 1 } else { 2 };
    m.mem_handle = handle.unwrap_or(0);
    m.device_bit_mask = 1;
    m
}

/// Sparse and deferred-mapping arrays take no memory of their own; memory mapped into one
/// (`cuMemMapArrayAsync`) stays while the array maps it, released or not, and goes with an
/// unmapping that covers it or the array's end. Arrays of neither kind, other handle or
/// operation types and an empty list are refused, and a refused list maps nothing.
#[test]
fn memory_mapped_into_an_array_lives_until_it_is_unmapped() {
    let (_g, _) = setup();
    let before = used();
    let g = GRANULARITY;
    let desc = |flags| CudaArray3dDescriptor {
        width: 1024,
        height: 1024,
        depth: 0,
        format: 0x20,
        num_channels: 4,
        flags,
    };
    unsafe {
        let (mut deferred, mut sparse, mut plain, mut mip) = (0, 0, 0, 0);
        assert_eq!(cuArray3DCreate_v2(&mut deferred, &desc(0x80)), 0);
        assert_eq!(cuArray3DCreate_v2(&mut sparse, &desc(0x40)), 0);
        assert_eq!(cuMipmappedArrayCreate(&mut mip, &desc(0x40), 4), 0);
        assert_eq!(
            used(),
            before,
            "sparse and deferred-mapping arrays take nothing"
        );
        assert_eq!(cuArray3DCreate_v2(&mut plain, &desc(0)), 0);
        let plain_bytes = used() - before;
        let (mut h1, mut h2) = (0, 0);
        assert_eq!(cuMemCreate(&mut h1, 2 * g, &prop(0), 0), 0);
        assert_eq!(cuMemCreate(&mut h2, g, &prop(0), 0), 0);
        let mapped = plain_bytes + 3 * g;
        let refused = [
            (
                vec![tile(false, plain, Some(h1))],
                "an array neither sparse nor deferred",
            ),
            (vec![tile(false, deferred, Some(0xbad))], "no such handle"),
            (
                vec![
                    tile(false, deferred, Some(h1)),
                    tile(false, plain, Some(h2)),
                ],
                "one bad step in the list",
            ),
        ];
        for (list, what) in refused {
            assert_eq!(
                cuMemMapArrayAsync(list.as_ptr(), list.len() as u32, 0),
                CUDA_ERROR_INVALID_VALUE,
                "{what}"
            );
        }
        assert_eq!(
            cuMemMapArrayAsync(null_mut(), 0, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut bad = tile(false, deferred, Some(h1));
        bad.mem_handle_type = 1;
        assert_eq!(
            cuMemMapArrayAsync(&bad, 1, 0),
            CUDA_ERROR_INVALID_VALUE,
            "handle type"
        );
        bad = tile(false, deferred, Some(h1));
        bad.mem_operation_type = 3;
        assert_eq!(
            cuMemMapArrayAsync(&bad, 1, 0),
            CUDA_ERROR_INVALID_VALUE,
            "operation"
        );
        let list = [tile(false, deferred, Some(h1)), tile(true, mip, Some(h2))];
        assert_eq!(cuMemMapArrayAsync(list.as_ptr(), 2, 0), 0);
        assert_eq!(cuMemRelease(h1), 0);
        assert_eq!(cuMemRelease(h2), 0);
        assert_eq!(used() - before, mapped, "released, still mapped");
        // An unmapping of another level leaves it; one covering it frees it.
        let mut elsewhere = tile(false, deferred, None);
        elsewhere.subresource[0] = 1; // level 1
        assert_eq!(cuMemMapArrayAsync(&elsewhere, 1, 0), 0);
        assert_eq!(used() - before, mapped);
        assert_eq!(cuMemMapArrayAsync(&tile(false, deferred, None), 1, 0), 0);
        assert_eq!(used() - before, plain_bytes + g, "the level's handle freed");
        assert_eq!(cuMipmappedArrayDestroy(mip), 0);
        assert_eq!(
            used() - before,
            plain_bytes,
            "the mip tail's handle went with its array"
        );
        // Mapped into a sparse array, released, the array destroyed.
        assert_eq!(cuMemCreate(&mut h1, g, &prop(0), 0), 0);
        assert_eq!(cuMemMapArrayAsync(&tile(false, sparse, Some(h1)), 1, 0), 0);
        assert_eq!(cuMemRelease(h1), 0);
        assert_eq!(used() - before, plain_bytes + g);
        assert_eq!(cuArrayDestroy(sparse), 0);
        for a in [deferred, plain] {
            assert_eq!(cuArrayDestroy(a), 0);
        }
    }
    assert_eq!(used(), before);
}

/// cuMemFree_v2 of pool memory returns it to its pool; a pool destroyed before or after
/// its last allocation is freed releases everything once both happened, with no trim and
/// no synchronisation.
#[test]
fn pool_memory_freed_and_pools_destroyed_in_either_order() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut default = 0;
        assert_eq!(cuDeviceGetMemPool(&mut default, 0), 0);
        let mut p = 0;
        assert_eq!(cuMemAllocAsync(&mut p, 3 * MIB, 0), 0);
        assert_eq!(cuMemFree_v2(p), 0);
        assert_eq!(
            (pool_attr(default, RESERVED), pool_attr(default, USED)),
            (32 << 20, 0),
            "back in the pool, still reserved (a chunk)"
        );
        assert_eq!(used() - before, 32 * MIB);
        assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "freed once");
        assert_eq!(cuCtxSynchronize(), 0);
        assert_eq!(used(), before);

        // Freed first (cached in the pool), destroyed after: released at the destroy.
        let mut pool = 0;
        assert_eq!(cuMemPoolCreate(&mut pool, &device_pool_props(0, 0)), 0);
        assert_eq!(cuMemAllocFromPoolAsync(&mut p, 4 * MIB, pool, 0), 0);
        assert_eq!(cuMemFree_v2(p), 0);
        assert_eq!(pool_attr(pool, RESERVED), 32 << 20);
        assert_eq!(used() - before, 32 * MIB);
        assert_eq!(cuMemPoolDestroy(pool), 0);
        assert_eq!(used(), before);

        // Destroyed first, with two allocations out (in one chunk): released once the
        // chunk holds none.
        assert_eq!(cuMemPoolCreate(&mut pool, &device_pool_props(0, 0)), 0);
        let mut q = 0;
        assert_eq!(cuMemAllocFromPoolAsync(&mut p, 4 * MIB, pool, 0), 0);
        assert_eq!(cuMemAllocFromPoolAsync(&mut q, 2 * MIB, pool, 0), 0);
        assert_eq!(cuMemPoolDestroy(pool), 0);
        assert_eq!(
            cuMemAllocFromPoolAsync(&mut p, MIB, pool, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(used() - before, 32 * MIB);
        assert_eq!(cuMemFree_v2(p), 0);
        assert_eq!(used() - before, 32 * MIB, "q is still in the chunk");
        assert_eq!(
            cuMemcpyHtoD_v2(q, [7u8; 16].as_ptr().cast(), 16),
            0,
            "still valid"
        );
        assert_eq!(cuMemFree_v2(q), 0);
        assert_eq!(used(), before);
    }
}

/// cuCtxDestroy (or any other end of a context) leaves stream-ordered allocations alone:
/// cuda.h says they belong to no context and must be freed explicitly. They stay valid,
/// in use in their pool and on the device; the pool keeps its cache; freed later with
/// another context of the device current, they go back to the pool as always.
#[test]
fn pool_allocations_outlive_the_context_that_made_them() {
    let (_g, primary) = setup();
    let before = used();
    unsafe {
        let mut default = 0;
        assert_eq!(cuDeviceGetMemPool(&mut default, 0), 0);
        for end in ["destroy", "detach", "reset"] {
            let mut c = 0;
            if end == "reset" {
                // The primary context, with a created one current to observe from.
                assert_eq!(cuCtxCreate_v2(&mut c, 0, 0), 0);
                assert_eq!(cuCtxSetCurrent(primary), 0);
            } else {
                assert_eq!(cuCtxCreate_v2(&mut c, 0, 0), 0);
            }
            let (mut live, mut cached, mut plain) = (0, 0, 0);
            assert_eq!(cuMemAllocAsync(&mut live, 4 * MIB, 0), 0);
            assert_eq!(cuMemAllocAsync(&mut cached, 2 * MIB, 0), 0);
            assert_eq!(cuMemFreeAsync(cached, 0), 0);
            assert_eq!(cuMemAlloc_v2(&mut plain, MIB), 0);
            assert_eq!(used() - before, 33 * MIB, "{end}: a 32 MiB chunk and 1 MiB");
            match end {
                "destroy" => assert_eq!(cuCtxDestroy_v2(c), 0),
                "detach" => assert_eq!(cuCtxDetach(c), 0),
                _ => assert_eq!(cuDevicePrimaryCtxReset_v2(0), 0),
            }
            // An observer of the same device: the primary context, or the created one.
            let observer = if end == "reset" { c } else { primary };
            if end == "reset" {
                assert_eq!(cuDevicePrimaryCtxRetain(&mut 0, 0), 0);
            }
            assert_eq!(cuCtxSetCurrent(observer), 0);
            // The plain allocation went with the context; the pool allocation and the
            // pool's cache did not.
            assert_eq!(used() - before, 32 * MIB, "{end}");
            assert_eq!(
                (pool_attr(default, RESERVED), pool_attr(default, USED)),
                (32 << 20, 4 << 20),
                "{end}"
            );
            let (mut base, mut size) = (0, 0);
            assert_eq!(cuMemGetAddressRange_v2(&mut base, &mut size, live), 0);
            assert_eq!((base, size), (live, 4 * MIB), "{end}: still valid");
            let mut back = [0u8; 16];
            assert_eq!(cuMemcpyHtoD_v2(live, [9u8; 16].as_ptr().cast(), 16), 0);
            assert_eq!(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), live, 16), 0);
            assert_eq!(back, [9u8; 16], "{end}: still usable");
            // Freed with another context of the device current: back to the pool, and
            // released at the next synchronisation.
            assert_eq!(cuMemFreeAsync(live, 0), 0, "{end}");
            assert_eq!(
                (pool_attr(default, RESERVED), pool_attr(default, USED)),
                (32 << 20, 0),
                "{end}"
            );
            assert_eq!(cuCtxSynchronize(), 0);
            assert_eq!(used(), before, "{end}");
            assert_eq!(cuMemFree_v2(live), CUDA_ERROR_INVALID_VALUE, "freed once");
            if end == "reset" {
                assert_eq!(cuCtxDestroy_v2(c), 0);
                assert_eq!(cuCtxSetCurrent(primary), 0);
            }
        }
    }
}

/// cuMemCreate of host memory (CUDA 13.5's cuMemCreate: HOST ignores the id and takes no
/// shareable handle types, HOST_NUMA names a node, HOST_NUMA_CURRENT ignores the id)
/// takes no device memory; memory imported from another API neither, and its buffer is
/// the other API's bytes, freed with cuMemFree.
#[test]
fn host_vmm_and_external_memory_take_no_device_memory() {
    use crate::api::external::{
        cuDestroyExternalMemory, cuExternalMemoryGetMappedBuffer, cuImportExternalMemory,
    };
    let (_g, _) = setup();
    let before = used();
    let g = GRANULARITY;
    let at = |type_, id, handle_types| {
        let mut p = prop(handle_types);
        p.location = CUmemLocation { type_, id };
        p
    };
    unsafe {
        let mut h = 0;
        for p in [at(2, 7, 0), at(3, 0, 0), at(4, 9, 0)] {
            assert_eq!(cuMemCreate(&mut h, 4 * g, &p, 0), 0);
            assert_eq!(used(), before, "host memory is no device's");
            assert_eq!(cuMemRelease(h), 0);
        }
        assert_eq!(
            cuMemCreate(&mut h, g, &at(2, 0, 1), 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemCreate(&mut h, g, &at(3, 1, 0), 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemCreate(&mut h, g, &at(5, 0, 0), 0),
            CUDA_ERROR_INVALID_VALUE
        );

        let name = c"other-api";
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0 && libc::ftruncate(fd, (4 * g) as libc::off_t) == 0);
        let mut d: CUDA_EXTERNAL_MEMORY_HANDLE_DESC = std::mem::zeroed();
        d.type_ = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
        d.handle[0] = fd as u32 as u64;
        d.size = (8 * g) as u64;
        let mut ext = 0usize;
        assert_eq!(
            cuImportExternalMemory(&mut ext, &d),
            CUDA_ERROR_INVALID_VALUE,
            "too big"
        );
        d.size = (4 * g) as u64;
        d.type_ = 2;
        assert_eq!(
            cuImportExternalMemory(&mut ext, &d),
            CUDA_ERROR_NOT_SUPPORTED,
            "Windows"
        );
        d.type_ = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
        assert_eq!(cuImportExternalMemory(&mut ext, &d), 0);
        let mut b: CUDA_EXTERNAL_MEMORY_BUFFER_DESC = std::mem::zeroed();
        b.offset = g as u64;
        b.size = (4 * g) as u64;
        let mut p = 0;
        assert_eq!(
            cuExternalMemoryGetMappedBuffer(&mut p, ext, &b),
            CUDA_ERROR_INVALID_VALUE
        );
        b.size = g as u64;
        assert_eq!(cuExternalMemoryGetMappedBuffer(&mut p, ext, &b), 0);
        assert_eq!(used(), before, "the other API's memory");
        let x = 7u8;
        assert_eq!(
            libc::pwrite(fd, (&x as *const u8).cast(), 1, g as libc::off_t),
            1
        );
        let mut y = 0u8;
        assert_eq!(cuMemcpyDtoH_v2((&mut y as *mut u8).cast(), p, 1), 0);
        assert_eq!(y, 7, "the buffer is the imported memory");
        assert_eq!(cuDestroyExternalMemory(ext), 0);
        assert_eq!(cuDestroyExternalMemory(ext), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuMemFree_v2(p), 0, "freed after the destroy");
        assert_eq!(used(), before);
    }
}

/// cuDNN asks a side stream's green context (PyTorch's warm-up before a CUDA graph
/// capture): NULL for a stream of an ordinary context. As a stub it failed the
/// convolution with CUDNN_STATUS_INTERNAL_ERROR.
#[test]
fn a_stream_of_an_ordinary_context_has_no_green_context() {
    let _g = setup();
    unsafe {
        let mut stream = 0;
        assert_eq!(cuStreamCreate(&mut stream, 0), CUDA_SUCCESS);
        let mut green = 7usize;
        assert_eq!(cuStreamGetGreenCtx(stream, &mut green), CUDA_SUCCESS);
        assert_eq!(green, 0);
        assert_eq!(cuStreamGetGreenCtx(0, &mut green), CUDA_SUCCESS);
        assert_eq!(
            cuStreamGetGreenCtx(stream, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
        assert_eq!(
            cuStreamGetGreenCtx(stream, &mut green),
            CUDA_ERROR_INVALID_HANDLE
        );
    }
}

/// Green contexts (CUDA 12.4): the device's SMs split into partitions of at least 8 in
/// eights, a descriptor of one, a green context that retains the primary context (its
/// `cuCtxFromGreenCtx` handle) and knows the streams made in it; a bad type, flag or
/// handle refused.
#[test]
fn a_green_context_retains_the_primary_context_and_owns_its_streams() {
    use crate::api::green::{
        cuCtxFromGreenCtx, cuDevResourceGenerateDesc, cuDevSmResourceSplitByCount,
        cuDeviceGetDevResource, cuGreenCtxCreate, cuGreenCtxDestroy, cuGreenCtxGetDevResource,
        cuGreenCtxStreamCreate,
    };
    use crate::model::ctx::primary_state;
    use crate::model::green::DevResource;
    let (_g, primary) = setup();
    unsafe {
        let mut all = DevResource::sm(0);
        assert_eq!(cuDeviceGetDevResource(0, &mut all, 1), CUDA_SUCCESS);
        assert_eq!((all.ty, all.sm_count), (1, 132));
        assert_eq!(
            cuDeviceGetDevResource(0, &mut all, 7),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut n = 0u32;
        let split = |out: *mut DevResource, n: &mut u32, rest: *mut DevResource, min| {
            cuDevSmResourceSplitByCount(out, n, &all, rest, 0, min)
        };
        assert_eq!(split(null_mut(), &mut n, null_mut(), 9), CUDA_SUCCESS);
        assert_eq!(n, 8, "132 SMs hold 8 partitions of 16");
        let mut parts = [DevResource::sm(0); 2];
        let mut rest = DevResource::sm(0);
        n = 2;
        assert_eq!(
            split(parts.as_mut_ptr(), &mut n, &mut rest, 9),
            CUDA_SUCCESS
        );
        assert_eq!((n, parts[1].sm_count, rest.sm_count), (2, 16, 100));
        let mut desc = 0usize;
        assert_eq!(
            cuDevResourceGenerateDesc(&mut desc, parts.as_ptr(), 1),
            CUDA_SUCCESS
        );
        let refs = |dev| primary_state(dev).1;
        let mut green = 0usize;
        assert_eq!(
            cuGreenCtxCreate(&mut green, desc, 0, 2),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuGreenCtxCreate(&mut green, desc, 0, 1), CUDA_SUCCESS);
        let mut ctx = 0usize;
        assert_eq!(cuCtxFromGreenCtx(&mut ctx, green), CUDA_SUCCESS);
        assert_eq!(ctx, primary, "used through the primary context it retains");
        let mut mine = DevResource::sm(0);
        assert_eq!(cuGreenCtxGetDevResource(green, &mut mine, 1), CUDA_SUCCESS);
        assert_eq!(mine.sm_count, 16);
        let mut stream = 0usize;
        assert_eq!(
            cuGreenCtxStreamCreate(&mut stream, green, 0, 0),
            CUDA_ERROR_INVALID_VALUE,
            "a green context's stream must be non-blocking"
        );
        assert_eq!(
            cuGreenCtxStreamCreate(&mut stream, green, 1, 0),
            CUDA_SUCCESS
        );
        let mut of = 0usize;
        assert_eq!(cuStreamGetGreenCtx(stream, &mut of), CUDA_SUCCESS);
        assert_eq!(of, green);
        assert_eq!(cuGreenCtxDestroy(green), CUDA_SUCCESS);
        assert!(
            refs(0),
            "the test's own reference keeps the primary context"
        );
        assert_eq!(cuGreenCtxDestroy(green), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamGetGreenCtx(stream, &mut of), CUDA_SUCCESS);
        assert_eq!(of, 0, "the stream forgot its green context");
        assert_eq!(cuStreamDestroy_v2(stream), CUDA_SUCCESS);
    }
}
