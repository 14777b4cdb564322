//! Typed calls of the driver's functions that the hooks use without intercepting
//! them (and growth mode's VMM calls): each resolved once, through `resolve`, and
//! `None` when the driver lacks it.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering::*};

use super::types::*;
use crate::resolve::driver_symbol;

/// Declares driver functions the hooks call but do not intercept.
macro_rules! driver_fns {
    ($( $name:ident : ($($ty:ty),*); )*) => {
        $(
                #[allow(non_snake_case)]
                pub fn $name() -> Option<unsafe extern "C" fn($($ty),*) -> CuResult> {
                    static P: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
                    let mut p = P.load(Acquire);
                    if p.is_null() {
                        p = driver_symbol(concat!(stringify!($name), "\0"));
                        P.store(p, Release);
                    }
                    // SAFETY: the driver's export of this name has this C signature.
                    (!p.is_null()).then(|| unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> CuResult>(p)
                    })
                }
        )*
    };
}

use cudarc::driver::sys::{CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationProp};

driver_fns! {
    cuDeviceTotalMem_v2: (*mut usize, c_int);
    cuCtxGetDevice: (*mut c_int);
    cuCtxSynchronize: ();
    cuMemFree_v2: (u64);
    cuMemCreate: (*mut u64, usize, *const CUmemAllocationProp, u64);
    cuMemRelease: (u64);
    cuMemGetAllocationGranularity: (*mut usize, *const CUmemAllocationProp, CUmemAllocationGranularity_flags);
    cuMemAddressReserve: (*mut u64, usize, usize, u64, u64);
    cuMemAddressFree: (u64, usize);
    cuMemMap: (u64, usize, usize, u64, u64);
    cuMemUnmap: (u64, usize);
    cuMemSetAccess: (u64, usize, *const CUmemAccessDesc, usize);
    // Device identity.
    cuDeviceGetCount: (*mut c_int);
    cuDeviceGetUuid_v2: (*mut [u8; 16], c_int);
    cuDeviceGetUuid: (*mut [u8; 16], c_int);
    // Pools.
    cuDeviceGetMemPool: (*mut Handle, c_int);
    cuDeviceGetDefaultMemPool: (*mut Handle, c_int);
    cuStreamGetDevice: (Stream, *mut c_int);
    cuStreamGetCtx: (Stream, *mut Handle);
    cuCtxGetCurrent: (*mut Handle);
    cuMemPoolGetAttribute: (Handle, c_int, *mut c_void);
    cuMemFreeAsync: (u64, Stream);
    // Contexts: measuring and tearing down.
    cuMemGetInfo_v2: (*mut usize, *mut usize);
    cuCtxPushCurrent_v2: (Handle);
    cuCtxPopCurrent_v2: (*mut Handle);
    cuDevicePrimaryCtxGetState: (c_int, *mut u32, *mut c_int);
    cuCtxGetId: (Handle, *mut u64);
    cuCtxGetApiVersion: (Handle, *mut u32);
    cuMemGetAddressRange_v2: (*mut u64, *mut usize, u64);
    // Modules: one the cap cannot take is unloaded again.
    cuModuleUnload: (Handle);
    // Kernels: which library or module a function loaded at its first launch comes from.
    cuKernelGetLibrary: (*mut Handle, Handle);
    cuFuncGetModule: (*mut Handle, Handle);
    cuLibraryGetModule: (*mut Handle, Handle);
    // Limits: the old value, set back when the cap cannot take the new one.
    cuCtxGetLimit: (*mut usize, c_int);
    // Arrays.
    cuArrayGetMemoryRequirements: (*mut MemoryRequirements, Handle, c_int);
    cuMipmappedArrayGetMemoryRequirements: (*mut MemoryRequirements, Handle, c_int);
    cuArray3DGetDescriptor_v2: (*mut Array3DDescriptor, Handle);
    cuMipmappedArrayGetLevel: (*mut Handle, Handle, u32);
    // NVML (its return codes are plain integers too): the devices, to learn which
    // CUDA sees without initialising CUDA.
    nvmlDeviceGetUUID: (Handle, *mut c_char, u32);
    nvmlDeviceGetCount_v2: (*mut u32);
    nvmlDeviceGetHandleByIndex_v2: (u32, *mut Handle);
    nvmlDeviceGetMigMode: (Handle, *mut u32, *mut u32);
    nvmlDeviceGetMaxMigDeviceCount: (Handle, *mut u32);
    nvmlDeviceGetMigDeviceHandleByIndex: (Handle, u32, *mut Handle);
    nvmlDeviceGetPciInfo_v3: (Handle, *mut gpucap_core::nvml::PciInfo);
    nvmlDeviceGetGpuInstanceId: (Handle, *mut u32);
    nvmlDeviceGetComputeInstanceId: (Handle, *mut u32);
    // Hooked entry points the shim itself calls on the driver (to measure, or to undo
    // a call it refuses after the fact).
    cuInit: (u32);
    cuMemPoolTrimTo: (Handle, usize);
    cuCtxCreate_v2: (*mut Handle, u32, c_int);
    cuCtxCreate_v4: (*mut Handle, *mut c_void, u32, c_int);
    cuCtxDestroy_v2: (Handle);
    cuDevicePrimaryCtxRelease_v2: (c_int);
    cuArrayDestroy: (Handle);
    cuMipmappedArrayDestroy: (Handle);
    cuDeviceGetGraphMemAttribute: (c_int, c_int, *mut c_void);
    cuStreamIsCapturing: (Stream, *mut c_int);
    cuGraphGetNodes: (Handle, *mut Handle, *mut usize);
    cuGraphNodeGetType: (Handle, *mut c_int);
    cuGraphMemAllocNodeGetParams: (Handle, *mut MemAllocNodeParams);
    cuGraphChildGraphNodeGetGraph: (Handle, *mut Handle);
}

/// The physical total of `device`, from the driver.
pub fn physical_total(device: usize) -> Option<u64> {
    let f = cuDeviceTotalMem_v2()?;
    let mut total = 0usize;
    // SAFETY: valid out-pointer; the device index was bounds-checked by the caller.
    (unsafe { f(&mut total, device as c_int) } == CUDA_SUCCESS).then_some(total as u64)
}
