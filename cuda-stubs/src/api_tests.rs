//! End-to-end checks of the exported entry points, called directly (default configuration:
//! one device of 80 GiB). The tests share the process-wide ledger, so they take a lock.

use std::ptr::{null, null_mut};
use std::sync::Mutex;

use crate::array::*;
use crate::context::*;
use crate::device::*;
use crate::ffi::*;
use crate::memory::*;
use crate::pool::*;
use crate::procaddr::*;
use crate::stream::*;
use crate::vmm::*;

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
        assert_eq!(cuMemFree_v2(0), CUDA_ERROR_INVALID_VALUE);
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
        assert_eq!(used() - before, 5000);
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
        assert_eq!(
            cuGetProcAddress_v2(c"cuMemAllocAsync".as_ptr(), &mut f, 11000, 0, &mut st),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!((f, st), (null_mut(), 2));
        assert_eq!(
            cuGetProcAddress_v2(c"cuGLInit".as_ptr(), &mut f, 12000, 0, &mut st),
            CUDA_ERROR_NOT_FOUND
        );
        assert_eq!((f, st), (null_mut(), 1));
        assert_eq!(
            cuGetProcAddress(null(), &mut f, 12000, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        // An unimplemented entry point exists and says NOT_SUPPORTED.
        assert_eq!(
            cuGetProcAddress(c"cuModuleLoad".as_ptr(), &mut f, 12000, 0),
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
