//! End-to-end checks of the exported entry points, called directly (default configuration:
//! one device of 80 GiB). The tests share the process-wide ledger, so they take a lock.

use std::ptr::{null, null_mut};
use std::sync::Mutex;

use crate::abi::types::{CUmemAccessDesc, CUmemAllocationProp, CUmemLocation, CudaArrayDescriptor};
use crate::abi::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY, CUresult, cstr,
};
use crate::api::array::{cuArrayCreate_v2, cuArrayDestroy, cuArrayGetDescriptor_v2};
use crate::api::context::{
    cuCtxAttach, cuCtxCreate_v2, cuCtxDestroy_v2, cuCtxDetach, cuCtxGetCurrent, cuCtxGetDevice,
    cuCtxPopCurrent_v2, cuCtxSetCurrent, cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxRetain,
    cuProfilerInitialize, cuProfilerStart, cuProfilerStop,
};
use crate::api::copy::{cuMemcpyDtoH_v2, cuMemcpyHtoD_v2, cuMemsetD32_v2};
use crate::api::device::{
    cuDeviceGetAttribute, cuDeviceGetName, cuGetErrorName, cuGetErrorString, cuInit,
};
use crate::api::memory::{
    cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemFree_v2, cuMemGetAddressRange_v2, cuMemGetInfo_v2,
    cuPointerGetAttribute,
};
use crate::api::pool::{
    cuDeviceGetDefaultMemPool, cuMemAllocAsync, cuMemFreeAsync, cuMemFreeAsync_ptsz,
    cuMemPoolGetAttribute,
};
use crate::api::procaddr::{cuGetProcAddress, cuGetProcAddress_v2};
use crate::api::stream::{
    cuStreamCreate, cuStreamDestroy_v2, cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz,
    cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz, cuStreamGetCaptureInfo_v3,
    cuStreamGetCaptureInfo_v3_ptsz, cuStreamIsCapturing, cuStreamIsCapturing_ptsz,
    cuStreamSynchronize, cuThreadExchangeStreamCaptureMode,
};
use crate::api::vmm::{
    cuMemAddressFree, cuMemAddressReserve, cuMemCreate, cuMemGetAllocationGranularity, cuMemMap,
    cuMemRelease, cuMemSetAccess, cuMemUnmap,
};
use crate::procaddr::TABLE;

pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

/// cuInit + the primary context current on this thread; returns the context.
pub(crate) fn setup() -> (std::sync::MutexGuard<'static, ()>, usize) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut ctx = 0;
    // SAFETY (all calls in this file): valid pointers to locals, as a C caller would pass.
    unsafe {
        assert_eq!(cuInit(0), 0);
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), 0);
        assert_eq!(cuCtxSetCurrent(ctx), 0);
    }
    (guard, ctx)
}

pub(crate) fn used() -> usize {
    let (mut free, mut total) = (0, 0);
    assert_eq!(unsafe { cuMemGetInfo_v2(&mut free, &mut total) }, 0);
    total - free
}

#[test]
fn linear_memory_round_trip_and_errors() {
    let _g = setup();
    let before = used();
    let mut p = 0;
    unsafe {
        assert_eq!(cuMemAlloc_v2(&mut p, 1 << 20), 0);
        assert_eq!(used() - before, 1 << 20);
        let src: Vec<u8> = (0..=255).collect();
        let mut back = vec![0u8; 256];
        assert_eq!(cuMemcpyHtoD_v2(p + 1000, src.as_ptr().cast(), 256), 0);
        assert_eq!(cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p + 1000, 256), 0);
        assert_eq!(src, back);
        assert_eq!(cuMemsetD32_v2(p, 0xdeadbeef, 4), 0);
        let mut word = 0u32;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut word as *mut u32).cast(), p + 12, 4),
            0
        );
        assert_eq!(word, 0xdeadbeef);
        // Copies outside the allocation are refused, not performed.
        assert_eq!(
            cuMemcpyHtoD_v2(p + (1 << 20) - 10, src.as_ptr().cast(), 256),
            CUDA_ERROR_INVALID_VALUE
        );
        let (mut base, mut size) = (0, 0);
        assert_eq!(cuMemGetAddressRange_v2(&mut base, &mut size, p + 77), 0);
        assert_eq!((base, size), (p, 1 << 20));
        let mut ordinal = -1;
        assert_eq!(
            cuPointerGetAttribute((&mut ordinal as *mut i32).cast(), 9, p),
            0
        );
        assert_eq!(ordinal, 0);
        assert_eq!(cuMemFree_v2(p), 0);
        assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
        // Freeing NULL is a no-op, as on the real driver.
        assert_eq!(cuMemFree_v2(0), 0);
        assert_eq!(cuMemAlloc_v2(&mut p, 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemAlloc_v2(&mut p, usize::MAX), CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            cuMemAlloc_v2(&mut p, 81usize << 30),
            CUDA_ERROR_OUT_OF_MEMORY
        );
        // Tens of GiB cost nothing until touched.
        assert_eq!(cuMemAlloc_v2(&mut p, 70usize << 30), 0);
        assert_eq!(cuMemFree_v2(p), 0);
        let mut pitch = 0;
        assert_eq!(cuMemAllocPitch_v2(&mut p, &mut pitch, 1000, 3, 4), 0);
        assert_eq!(pitch, 1024);
        assert_eq!(used() - before, 3072);
        assert_eq!(cuMemFree_v2(p), 0);
    }
    assert_eq!(used(), before);
}

#[test]
fn no_context_and_threads() {
    let _g = setup();
    let t = std::thread::spawn(|| {
        let mut dev = 0;
        let mut p = 0;
        unsafe {
            assert_eq!(cuCtxGetDevice(&mut dev), CUDA_ERROR_INVALID_CONTEXT);
            assert_eq!(cuMemAlloc_v2(&mut p, 10), CUDA_ERROR_INVALID_CONTEXT);
        }
    });
    t.join().unwrap();
    let mut dev = -1;
    assert_eq!(unsafe { cuCtxGetDevice(&mut dev) }, 0);
    assert_eq!(dev, 0);
}

#[test]
fn pools_and_async() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut stream = 0;
        assert_eq!(cuStreamCreate(&mut stream, 0), 0);
        let mut pool = 0;
        assert_eq!(cuDeviceGetDefaultMemPool(&mut pool, 0), 0);
        let mut p = 0;
        assert_eq!(cuMemAllocAsync(&mut p, 5000, stream), 0);
        let mut v = 0u64;
        assert_eq!(
            cuMemPoolGetAttribute(pool, 7, (&mut v as *mut u64).cast()),
            0
        );
        assert_eq!(v, 5000);
        // The pool grew by a chunk (32 MiB), as the real driver's do.
        assert_eq!(used() - before, 32 << 20);
        assert_eq!(cuMemFreeAsync(p, stream), 0);
        assert_eq!(
            cuMemPoolGetAttribute(pool, 8, (&mut v as *mut u64).cast()),
            0
        );
        assert!(v >= 5000);
        assert_eq!(cuStreamSynchronize(stream), 0);
        assert_eq!(cuStreamDestroy_v2(stream), 0);
        assert_eq!(cuStreamSynchronize(stream), CUDA_ERROR_INVALID_HANDLE);
    }
    assert_eq!(used(), before);
}

#[test]
fn vmm_mappings_alias() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let mut prop: CUmemAllocationProp = std::mem::zeroed();
        prop.type_ = 1;
        prop.location = CUmemLocation { type_: 1, id: 0 };
        let mut g = 0;
        assert_eq!(cuMemGetAllocationGranularity(&mut g, &prop, 0), 0);
        let mut h = 0;
        assert_eq!(cuMemCreate(&mut h, g, &prop, 0), 0);
        assert_eq!(used() - before, g);
        let mut va = 0;
        assert_eq!(cuMemAddressReserve(&mut va, 2 * g, 0, 0, 0), 0);
        assert_eq!(cuMemMap(va, g, 0, h, 0), 0);
        assert_eq!(cuMemMap(va + g as u64, g, 0, h, 0), 0);
        // Not accessible before cuMemSetAccess.
        let x = 7u32;
        assert_eq!(
            cuMemcpyHtoD_v2(va, (&x as *const u32).cast(), 4),
            CUDA_ERROR_INVALID_VALUE
        );
        let desc = CUmemAccessDesc {
            location: CUmemLocation { type_: 1, id: 0 },
            flags: 3,
        };
        assert_eq!(cuMemSetAccess(va, 2 * g, &desc, 1), 0);
        assert_eq!(cuMemcpyHtoD_v2(va, (&x as *const u32).cast(), 4), 0);
        let mut y = 0u32;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut y as *mut u32).cast(), va + g as u64, 4),
            0
        );
        assert_eq!(y, 7);
        assert_eq!(cuMemRelease(h), 0);
        assert_eq!(used() - before, g, "still mapped");
        assert_eq!(cuMemUnmap(va, 2 * g), 0);
        assert_eq!(cuMemAddressFree(va, 2 * g), 0);
        assert_eq!(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    }
    assert_eq!(used(), before);
}

#[test]
fn arrays_take_device_memory() {
    let (_g, _) = setup();
    let before = used();
    unsafe {
        let desc = CudaArrayDescriptor {
            width: 256,
            height: 16,
            format: 0x20,
            num_channels: 4,
        };
        let mut a = 0;
        assert_eq!(cuArrayCreate_v2(&mut a, &desc), 0);
        assert_eq!(used() - before, 256 * 16 * 16);
        let mut back = CudaArrayDescriptor {
            width: 0,
            height: 0,
            format: 0,
            num_channels: 0,
        };
        assert_eq!(cuArrayGetDescriptor_v2(&mut back, a), 0);
        assert_eq!((back.width, back.height, back.num_channels), (256, 16, 4));
        assert_eq!(cuArrayDestroy(a), 0);
        assert_eq!(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
    }
    assert_eq!(used(), before);
}

#[test]
fn get_proc_address_returns_the_exports() {
    let _g = setup();
    unsafe {
        let mut f = null_mut();
        let mut st = -1;
        assert_eq!(
            cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut f, 12000, 0, &mut st),
            0
        );
        assert_eq!((f as usize, st), (cuMemAlloc_v2 as *const () as usize, 0));
        assert_eq!(
            cuGetProcAddress_v2(c"cuMemFreeAsync".as_ptr(), &mut f, 12000, 2, &mut st),
            0
        );
        assert_eq!(f as usize, cuMemFreeAsync_ptsz as *const () as usize);
        // Not found: success with a NULL pointer, the status says why (CUDA 13.0 answers so);
        // the status-less cuGetProcAddress says CUDA_ERROR_NOT_FOUND.
        assert_eq!(
            cuGetProcAddress_v2(c"cuMemAllocAsync".as_ptr(), &mut f, 11000, 0, &mut st),
            0
        );
        assert_eq!((f, st), (null_mut(), 2));
        assert_eq!(
            cuGetProcAddress_v2(c"cuNoSuchEntryPoint".as_ptr(), &mut f, 12000, 0, &mut st),
            0
        );
        assert_eq!((f, st), (null_mut(), 1));
        assert_eq!(
            cuGetProcAddress(c"cuNoSuchEntryPoint".as_ptr(), &mut f, 12000, 0),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!(
            cuGetProcAddress(c"cuMemAllocAsync".as_ptr(), &mut f, 11000, 0),
            CUDA_ERROR_NOT_FOUND
        );
        // A version above the driver's (13050 by default): INVALID_VALUE, no pointer.
        f = cuMemAlloc_v2 as *mut _;
        assert_eq!(
            cuGetProcAddress_v2(c"cuMemAlloc".as_ptr(), &mut f, 13060, 0, &mut st),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(f, null_mut());
        // The graphics interop entry points exist and answer as without graphics.
        assert_eq!(
            cuGetProcAddress_v2(c"cuGLInit".as_ptr(), &mut f, 12000, 0, &mut st),
            0
        );
        assert_eq!(
            (f as usize, st),
            (crate::api::interop::cuGLInit as *const () as usize, 0)
        );
        let gl_init: extern "C" fn() -> CUresult = std::mem::transmute(f);
        assert_eq!(gl_init(), 0);
        assert_eq!(
            cuGetProcAddress_v2(c"cuGLMapBufferObject".as_ptr(), &mut f, 7000, 2, &mut st),
            0
        );
        assert_eq!(
            f as usize,
            crate::api::interop::cuGLMapBufferObject_v2_ptds as *const () as usize
        );
        let mut n = 7u32;
        assert_eq!(
            crate::api::interop::cuGLGetDevices_v2(&mut n, null_mut(), 0, 1),
            219
        );
        assert_eq!(n, 0);
        assert_eq!(
            crate::api::interop::cuGraphicsEGLRegisterImage(null_mut(), null_mut(), 0),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            crate::api::interop::cuVDPAUGetDevice(null_mut(), 0, null_mut()),
            219
        );
        assert_eq!(
            cuGetProcAddress(null(), &mut f, 12000, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        // An unimplemented entry point exists and says NOT_SUPPORTED.
        assert_eq!(
            cuGetProcAddress(c"cuCtxEnablePeerAccess".as_ptr(), &mut f, 12000, 0),
            0
        );
        let stub: extern "C" fn() -> CUresult = std::mem::transmute(f);
        assert_eq!(stub(), CUDA_ERROR_NOT_SUPPORTED);
    }
}

#[test]
fn device_queries() {
    let _g = setup();
    unsafe {
        let mut v = 0;
        assert_eq!(cuDeviceGetAttribute(&mut v, 75, 0), 0);
        assert_eq!(v, 9);
        assert_eq!(cuDeviceGetAttribute(&mut v, 115, 0), 0);
        assert_eq!(v, 1);
        // numba's device listing prints it: 0 would be a device without FP64.
        assert_eq!(cuDeviceGetAttribute(&mut v, 87, 0), 0);
        assert_eq!(v, 2);
        assert_eq!(
            cuDeviceGetAttribute(&mut v, 75, 1),
            CUDA_ERROR_INVALID_DEVICE
        );
        let mut name = [0i8; 64];
        assert_eq!(cuDeviceGetName(name.as_mut_ptr(), 64, 0), 0);
        assert_eq!(cstr(name.as_ptr()), Some("FakeCUDA Device 0"));
        let mut s = null();
        assert_eq!(cuGetErrorName(2, &mut s), 0);
        assert_eq!(cstr(s), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(cuGetErrorString(801, &mut s), 0);
        assert_eq!(cstr(s), Some("operation not supported"));
        assert_eq!(cuGetErrorName(12345, &mut s), CUDA_ERROR_INVALID_VALUE);
    }
}

/// STUBS.md lists exactly the exports that build.rs made NOT_SUPPORTED stubs.
#[test]
fn stubs_listing_matches_the_build() {
    let total = TABLE
        .exports()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    fake_gpu::stubs_doc::check(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/STUBS.md")),
        "libcuda.so.1",
        crate::generated::STUBS,
        total,
    );
}

/// A stream not in capture: every capture query answers as the driver does outside one.
#[test]
fn stream_capture_queries_answer_not_capturing() {
    let _g = setup();
    unsafe {
        let mut stream = 0;
        assert_eq!(cuStreamCreate(&mut stream, 0), 0);
        // CU_STREAM_LEGACY (0 and 1), CU_STREAM_PER_THREAD (2), a created stream.
        for s in [0, 1, 2, stream] {
            for f in [cuStreamIsCapturing, cuStreamIsCapturing_ptsz] {
                let mut status = 99;
                assert_eq!(f(s, &mut status), 0, "stream {s:#x}");
                assert_eq!(status, 0, "CU_STREAM_CAPTURE_STATUS_NONE");
            }
            for f in [cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_ptsz] {
                let (mut status, mut id) = (99, 77u64);
                assert_eq!(f(s, &mut status, &mut id), 0);
                assert_eq!((status, id), (0, 0));
                assert_eq!(f(s, &mut status, null_mut()), 0, "the id is optional");
            }
            for f in [cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz] {
                let (mut status, mut id, mut graph, mut n) = (99, 77u64, 5usize, 9usize);
                let mut deps: *const usize = std::ptr::dangling();
                assert_eq!(f(s, &mut status, &mut id, &mut graph, &mut deps, &mut n), 0);
                assert_eq!((status, id, graph, deps, n), (0, 0, 0, null(), 0));
                let r = f(
                    s,
                    &mut status,
                    null_mut(),
                    null_mut(),
                    null_mut(),
                    null_mut(),
                );
                assert_eq!(r, 0, "every output but the status is optional");
            }
            for f in [cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz] {
                let (mut status, mut id, mut graph, mut n) = (99, 77u64, 5usize, 9usize);
                let mut deps: *const usize = std::ptr::dangling();
                let mut edges: *const libc::c_void = std::ptr::dangling::<u64>().cast();
                let r = f(
                    s,
                    &mut status,
                    &mut id,
                    &mut graph,
                    &mut deps,
                    &mut edges,
                    &mut n,
                );
                assert_eq!(r, 0);
                assert_eq!(
                    (status, id, graph, deps, edges, n),
                    (0, 0, 0, null(), null(), 0)
                );
                let r = f(
                    s,
                    &mut status,
                    null_mut(),
                    null_mut(),
                    null_mut(),
                    null_mut(),
                    null_mut(),
                );
                assert_eq!(r, 0);
                // The header: edge data needs the dependencies too.
                let r = f(
                    s,
                    &mut status,
                    null_mut(),
                    null_mut(),
                    null_mut(),
                    &mut edges,
                    null_mut(),
                );
                assert_eq!(r, CUDA_ERROR_INVALID_VALUE);
                let r = f(
                    s,
                    null_mut(),
                    &mut id,
                    null_mut(),
                    null_mut(),
                    null_mut(),
                    null_mut(),
                );
                assert_eq!(r, CUDA_ERROR_INVALID_VALUE, "the status is required");
            }
        }
        assert_eq!(
            cuStreamIsCapturing(stream, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuStreamDestroy_v2(stream), 0);
        let mut status = 0;
        assert_eq!(
            cuStreamIsCapturing(stream, &mut status),
            CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                null_mut(),
                null_mut(),
                null_mut(),
                null_mut(),
                null_mut()
            ),
            CUDA_ERROR_INVALID_HANDLE
        );
        // What cuGetProcAddress hands out for them is the implementation, not a stub.
        let mut f = null_mut();
        assert_eq!(
            cuGetProcAddress(c"cuStreamIsCapturing".as_ptr(), &mut f, 13050, 2),
            0
        );
        let is_capturing: unsafe extern "C" fn(usize, *mut i32) -> CUresult =
            std::mem::transmute(f);
        status = 99;
        assert_eq!((is_capturing(0, &mut status), status), (0, 0));
        assert_eq!(
            cuGetProcAddress(c"cuStreamGetCaptureInfo".as_ptr(), &mut f, 12030, 0),
            0
        );
        assert_eq!(f as usize, cuStreamGetCaptureInfo_v3 as *const () as usize);
    }
}

#[test]
fn capture_mode_is_exchanged_per_thread() {
    let _g = setup();
    unsafe {
        let mut mode = 2; // CU_STREAM_CAPTURE_MODE_RELAXED
        assert_eq!(cuThreadExchangeStreamCaptureMode(&mut mode), 0);
        assert_eq!(mode, 0, "a thread starts in CU_STREAM_CAPTURE_MODE_GLOBAL");
        // Another thread has its own mode.
        std::thread::spawn(|| {
            let mut mode = 1;
            assert_eq!(cuThreadExchangeStreamCaptureMode(&mut mode), 0);
            assert_eq!(mode, 0);
        })
        .join()
        .unwrap();
        mode = 3;
        assert_eq!(
            cuThreadExchangeStreamCaptureMode(&mut mode),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(mode, 3, "untouched on error");
        mode = -1;
        assert_eq!(
            cuThreadExchangeStreamCaptureMode(&mut mode),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuThreadExchangeStreamCaptureMode(null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        mode = 1;
        assert_eq!(cuThreadExchangeStreamCaptureMode(&mut mode), 0);
        assert_eq!(
            mode, 2,
            "the RELAXED mode set above, not changed by the errors"
        );
        mode = 0;
        assert_eq!(cuThreadExchangeStreamCaptureMode(&mut mode), 0);
        assert_eq!(mode, 1);
    }
}

#[test]
fn profiler_control_is_exported() {
    let _g = setup();
    unsafe {
        for name in [c"cuProfilerStart", c"cuProfilerStop"] {
            let mut f = null_mut();
            let mut st = -1;
            assert_eq!(
                cuGetProcAddress_v2(name.as_ptr(), &mut f, 13050, 0, &mut st),
                0
            );
            assert_eq!(st, 0);
            let start_or_stop: extern "C" fn() -> CUresult = std::mem::transmute(f);
            assert_eq!(start_or_stop(), 0, "{name:?} with a current context");
            let r = std::thread::spawn(move || start_or_stop()).join().unwrap();
            assert_eq!(r, CUDA_ERROR_INVALID_CONTEXT, "{name:?} without one");
        }
        assert_eq!(cuProfilerStart(), 0);
        assert_eq!(cuProfilerStop(), 0);
        let mut f = null_mut();
        assert_eq!(
            cuGetProcAddress(c"cuProfilerInitialize".as_ptr(), &mut f, 4000, 0),
            0
        );
        assert_eq!(f as usize, cuProfilerInitialize as *const () as usize);
        // cudaProfiler.h: since CUDA 12.0 it always returns NOT_SUPPORTED (the default
        // driver here is 13.5; process_tests checks an older one).
        assert_eq!(
            cuProfilerInitialize(c"cfg".as_ptr(), c"out".as_ptr(), 0),
            CUDA_ERROR_NOT_SUPPORTED
        );
    }
}

/// cuCtxAttach / cuCtxDetach: usage counts of created contexts; the primary context's is
/// its retain count.
#[test]
fn attach_and_detach_count_usages() {
    let (_g, primary) = setup();
    let before = used();
    unsafe {
        let mut c = 0;
        assert_eq!(cuCtxCreate_v2(&mut c, 0, 0), 0);
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 1 << 20), 0);
        let mut a = 0;
        assert_eq!(
            cuCtxAttach(&mut a, 1),
            CUDA_ERROR_INVALID_VALUE,
            "flags must be 0"
        );
        assert_eq!(cuCtxAttach(null_mut(), 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuCtxAttach(&mut a, 0), 0);
        assert_eq!(a, c, "the current context");
        // 2 usages: the first detach leaves it alive and current.
        assert_eq!(cuCtxDetach(c), 0);
        let mut cur = 0;
        assert_eq!(cuCtxGetCurrent(&mut cur), 0);
        assert_eq!(cur, c);
        assert_eq!(used() - before, 1 << 20);
        let (mut base, mut size) = (0, 0);
        assert_eq!(cuMemGetAddressRange_v2(&mut base, &mut size, p), 0);
        // The last one destroys it as cuCtxDestroy does: freed, popped.
        assert_eq!(cuCtxDetach(c), 0);
        assert_eq!(used(), before);
        assert_eq!(
            cuMemGetAddressRange_v2(&mut base, &mut size, p),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!(cuCtxGetCurrent(&mut cur), 0);
        assert_eq!(cur, primary, "popped: the primary context is current again");
        assert_eq!(cuCtxDetach(c), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxDestroy_v2(c), CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(cuCtxDetach(0), CUDA_ERROR_INVALID_CONTEXT);

        // cuCtxDestroy destroys whatever the count.
        assert_eq!(cuCtxCreate_v2(&mut c, 0, 0), 0);
        assert_eq!(cuCtxAttach(&mut a, 0), 0);
        assert_eq!(cuCtxAttach(&mut a, 0), 0);
        assert_eq!(cuMemAlloc_v2(&mut p, 1 << 20), 0);
        assert_eq!(cuCtxDestroy_v2(c), 0);
        assert_eq!(used(), before);
        assert_eq!(cuCtxDetach(c), CUDA_ERROR_INVALID_CONTEXT);

        // A detached context that is not current: destroyed, the current one stays.
        assert_eq!(cuCtxCreate_v2(&mut c, 0, 0), 0);
        assert_eq!(cuCtxPopCurrent_v2(null_mut()), 0);
        assert_eq!(cuCtxDetach(c), 0);
        assert_eq!(cuCtxGetCurrent(&mut cur), 0);
        assert_eq!(cur, primary);

        // The primary context: attach is a retain, detach a release.
        let (mut flags, mut active) = (0, 0);
        assert_eq!(cuCtxAttach(&mut a, 0), 0);
        assert_eq!(a, primary);
        assert_eq!(cuCtxDetach(primary), 0);
        assert_eq!(cuDevicePrimaryCtxGetState(0, &mut flags, &mut active), 0);
        assert_eq!(active, 1, "still retained by setup()");
        assert_eq!(cuCtxGetCurrent(&mut cur), 0);
        assert_eq!(cur, primary);

        // Without a current context there is nothing to attach to.
        let r = std::thread::spawn(|| {
            let mut a = 0;
            cuCtxAttach(&mut a, 0)
        });
        assert_eq!(r.join().unwrap(), CUDA_ERROR_INVALID_CONTEXT);
    }
}
