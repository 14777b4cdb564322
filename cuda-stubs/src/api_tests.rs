//! End-to-end checks of the exported entry points, called directly (default configuration:
//! one device of 80 GiB). The tests share the process-wide ledger, so they take a lock.

use std::ffi::c_void;
use std::ptr::{null, null_mut};
use std::sync::Mutex;

use crate::abi::types::{CUmemAccessDesc, CUmemAllocationProp, CUmemLocation, CudaArrayDescriptor};
use crate::abi::{
    CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult, cstr,
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
use crate::api::tensor_map::{cuTensorMapEncodeIm2col, cuTensorMapEncodeTiled};
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

/// A CUtensorMap's storage, aligned as the driver requires (two, so that a misaligned one
/// can be made).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TensorMaps([[u64; 16]; 2]);

/// The arguments of a cuTensorMapEncodeTiled call.
#[derive(Clone)]
struct Tiled {
    data_type: i32,
    rank: u32,
    address: usize,
    dims: Vec<u64>,
    strides: Vec<u64>,
    boxes: Vec<u32>,
    element_strides: Vec<u32>,
    modes: [i32; 4],
}

impl Tiled {
    /// A FLOAT16 matrix of 256 x 128, tiles of 64 x 32, swizzled by 128 bytes.
    fn valid() -> Self {
        Tiled {
            data_type: 6,
            rank: 2,
            address: 0x7f00_0000_0100,
            dims: vec![256, 128],
            strides: vec![512],
            boxes: vec![64, 32],
            element_strides: vec![1, 1],
            modes: [0, 3, 2, 1],
        }
    }

    /// Encodes into `map` (the call's result).
    fn encode_at(&self, map: *mut [u64; 16]) -> CUresult {
        let [interleave, swizzle, l2, oob] = self.modes;
        let or_null = |v: &Vec<u64>| if v.is_empty() { null() } else { v.as_ptr() };
        // SAFETY: the arrays hold at least `rank` values (the strides `rank - 1`).
        unsafe {
            cuTensorMapEncodeTiled(
                map,
                self.data_type,
                self.rank,
                self.address as *mut c_void,
                self.dims.as_ptr(),
                or_null(&self.strides),
                self.boxes.as_ptr(),
                self.element_strides.as_ptr(),
                interleave,
                swizzle,
                l2,
                oob,
            )
        }
    }

    /// Rank 3 with a 32-byte interleave at `address`, with this swizzle (1: 32 bytes).
    fn interleaved(&mut self, address: usize, swizzle: i32) {
        (self.rank, self.address, self.modes) = (3, address, [2, swizzle, 0, 0]);
        self.dims.push(2);
        self.strides = vec![512, 65536];
        self.boxes = vec![4, 32, 2];
        self.element_strides.push(1);
    }

    /// Encodes into an aligned map: the result and the map.
    fn encode(&self) -> (CUresult, [u64; 16]) {
        let mut maps = TensorMaps([[0; 16]; 2]);
        let rc = self.encode_at(&mut maps.0[0]);
        (rc, maps.0[0])
    }
}

/// A named change to valid tensor map arguments.
type Edit = (&'static str, fn(&mut Tiled));

/// XLA-compiled code on compute capability 9 encodes tiled tensor maps (a stub until now):
/// the arguments are checked as CUDA's documentation states, and the map is a
/// deterministic encoding of them.
#[test]
fn tensor_maps_encode_valid_tiles_and_refuse_the_rest() {
    let _g = setup();
    let (rc, map) = Tiled::valid().encode();
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(map[0], 0x7f00_0000_0100, "the address");
    assert_eq!(
        Tiled::valid().encode().1,
        map,
        "the same arguments, the same map"
    );
    let mut other = Tiled::valid();
    other.boxes[1] = 16;
    assert_ne!(other.encode().1, map, "another box, another map");
    // At the limits of what is documented.
    let edges: [Edit; 4] = [
        ("a dimension of 2^32", |t| t.dims[1] = 1 << 32),
        ("rank 1, no strides", |t| {
            (t.rank, t.strides) = (1, vec![]);
        }),
        ("rank 5, boxes of 256", |t| {
            t.rank = 5;
            t.dims = vec![256, 4, 4, 4, 4];
            t.strides = vec![512, 2048, 8192, 32768];
            t.boxes = vec![64, 256, 256, 256, 256];
            t.element_strides = vec![8; 5];
        }),
        ("32-byte interleave, rank 3, 32-byte swizzle", |t| {
            t.interleaved(0x7f00_0000_0020, 1)
        }),
    ];
    for (why, edit) in edges {
        let mut t = Tiled::valid();
        edit(&mut t);
        assert_eq!(t.encode().0, CUDA_SUCCESS, "{why}");
    }
    let mut maps = TensorMaps([[0; 16]; 2]);
    let base = maps.0.as_mut_ptr();
    for (map, why) in [
        (null_mut(), "no map"),
        (
            base.cast::<u8>().wrapping_add(32).cast(),
            "a map not aligned to 64 bytes",
        ),
    ] {
        assert_eq!(
            Tiled::valid().encode_at(map),
            CUDA_ERROR_INVALID_VALUE,
            "{why}"
        );
    }
    let invalid: [Edit; 25] = [
        ("a data type past 16U6_ALIGN16B", |t| t.data_type = 16),
        ("a negative data type", |t| t.data_type = -1),
        ("rank 0", |t| t.rank = 0),
        ("rank 6", |t| {
            t.rank = 6;
            t.dims = vec![16; 6];
            t.strides = vec![512; 5];
            t.boxes = vec![8; 6];
            t.element_strides = vec![1; 6];
        }),
        ("rank 2 with an interleave", |t| t.modes[0] = 1),
        ("an address not aligned to 16 bytes", |t| t.address += 8),
        (
            "an address not aligned to 32 bytes, 32-byte interleave",
            |t| t.interleaved(0x7f00_0000_0010, 1),
        ),
        ("a dimension of 0", |t| t.dims[0] = 0),
        ("a dimension above 2^32", |t| t.dims[1] = (1 << 32) + 1),
        ("a stride not a multiple of 16", |t| t.strides[0] = 520),
        ("a stride of 2^40", |t| t.strides[0] = 1 << 40),
        ("a box of 0", |t| t.boxes[1] = 0),
        ("a box of 257", |t| t.boxes[1] = 257),
        ("an inner box of 8 bytes", |t| t.boxes[0] = 4),
        ("an element stride of 0", |t| t.element_strides[1] = 0),
        ("an element stride of 9", |t| t.element_strides[0] = 9),
        ("an interleave of 3", |t| t.modes[0] = 3),
        ("a swizzle of 7", |t| t.modes[1] = 7),
        ("an L2 promotion of 4", |t| t.modes[2] = 4),
        ("an OOB fill of 2", |t| t.modes[3] = 2),
        ("a NaN fill of integers", |t| t.data_type = 1),
        ("an inner box wider than a 64-byte swizzle", |t| {
            t.modes[1] = 2
        }),
        ("32-byte interleave without 32-byte swizzle", |t| {
            t.interleaved(0x7f00_0000_0020, 3)
        }),
        ("a packed 16-byte type with a box of 64", |t| {
            (t.data_type, t.dims[0], t.modes) = (14, 256, [0, 3, 0, 0]);
            t.address = 0x7f00_0000_0100;
        }),
        ("a packed 16-byte type with a 64-byte swizzle", |t| {
            (t.data_type, t.boxes[0], t.modes) = (14, 128, [0, 2, 0, 0]);
        }),
    ];
    for (why, edit) in invalid {
        let mut t = Tiled::valid();
        edit(&mut t);
        assert_eq!(t.encode().0, CUDA_ERROR_INVALID_VALUE, "{why}");
    }
    let mut no_dims = Tiled::valid();
    no_dims.rank = 1;
    let mut map = TensorMaps([[0; 16]; 2]);
    // SAFETY: NULL arrays: refused before anything is read.
    let rc = unsafe {
        cuTensorMapEncodeTiled(
            &mut map.0[0],
            6,
            1,
            null_mut(),
            null(),
            null(),
            no_dims.boxes.as_ptr(),
            no_dims.element_strides.as_ptr(),
            0,
            0,
            0,
            0,
        )
    };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE, "no dimensions");
}

/// cuTensorMapEncodeIm2col: rank 3 to 5, the box's corners within the range of the rank,
/// at most 256 channels per pixel and 1024 pixels per column.
#[test]
fn tensor_maps_encode_im2col_regions() {
    let _g = setup();
    // NHWC, FLOAT16: 64 channels, 16 x 16 pixels, 8 images.
    let dims = [64u64, 16, 16, 8];
    let strides = [128u64, 2048, 32768];
    let ones = [1u32; 4];
    let encode = |rank: u32, corner: i32, channels: u32, pixels: u32, swizzle: i32| {
        let mut maps = TensorMaps([[0; 16]; 2]);
        let (lower, upper) = ([corner, -1], [1, corner]);
        // SAFETY: arrays of `rank` values (strides `rank - 1`, corners `rank - 2`).
        let rc = unsafe {
            cuTensorMapEncodeIm2col(
                &mut maps.0[0],
                6,
                rank,
                0x7f00_0000_0100_usize as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                lower.as_ptr(),
                upper.as_ptr(),
                channels,
                pixels,
                ones.as_ptr(),
                0,
                swizzle,
                0,
                0,
            )
        };
        (rc, maps.0[0])
    };
    let (rc, map) = encode(4, -128, 64, 256, 3);
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(map, encode(4, -128, 64, 256, 3).1);
    assert_ne!(map, encode(4, -127, 64, 256, 3).1);
    assert_eq!(encode(3, -32768, 64, 1024, 3).0, CUDA_SUCCESS);
    for (rank, corner, channels, pixels, swizzle, why) in [
        (2, 0, 64, 256, 3, "rank 2"),
        (4, 128, 64, 256, 3, "a corner past 127 at rank 4"),
        (4, -129, 64, 256, 3, "a corner below -128 at rank 4"),
        (4, 0, 257, 256, 0, "257 channels"),
        (4, 0, 64, 1025, 3, "1025 pixels"),
        (
            4,
            0,
            128,
            256,
            3,
            "256 bytes of channels in a 128-byte swizzle",
        ),
    ] {
        let rc = encode(rank, corner, channels, pixels, swizzle).0;
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE, "{why}");
    }
}
