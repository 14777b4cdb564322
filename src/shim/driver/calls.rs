//! Typed calls of the driver's functions that the shim uses without intercepting
//! them (and growth mode's VMM calls): each resolved once, through `resolve`, and
//! `None` when the driver lacks it. The hooked ones the shim calls itself are
//! `hooked::real`, typed by the hook table's rows.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicPtr,
    Ordering::{Acquire, Release},
};

use super::forward::Real;
use super::hooked::real;
use super::types::{
    Array3DDescriptor, CUDA_SUCCESS, CuResult, Handle, In, KernelNodeParams, MemAllocNodeParams,
    MemoryRequirements, Out, Stream,
};
use crate::resolve::driver_symbol;

/// The driver's export `name` (NUL-terminated), looked up once into `slot`.
fn resolved(slot: &AtomicPtr<c_void>, name: &'static str) -> *mut c_void {
    let mut p = slot.load(Acquire);
    if p.is_null() {
        p = driver_symbol(name);
        slot.store(p, Release);
    }
    p
}

/// Declares driver functions the shim calls but does not intercept.
macro_rules! driver_fns {
    ($( $name:ident : ($($ty:ty),*); )*) => {
        $(
                #[allow(non_snake_case)]
                pub fn $name() -> Option<unsafe extern "C" fn($($ty),*) -> CuResult> {
                    static P: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
                    let p = resolved(&P, concat!(stringify!($name), "\0"));
                    // SAFETY: the driver's export of this name has this C signature.
                    (!p.is_null()).then(|| unsafe {
                        std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> CuResult>(p)
                    })
                }
        )*
    };
}

/// Declares driver functions the hooks call but do not intercept, as safe calls: the
/// pointer arguments typed (`Out`, `In`), `None` when the driver lacks the function.
macro_rules! safe_fns {
    ($( $name:ident : ($($arg:ident : $ty:ty),*); )*) => {
        $(
                #[allow(non_snake_case)]
                pub fn $name($($arg: $ty),*) -> Option<CuResult> {
                    static P: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
                    let p = resolved(&P, concat!(stringify!($name), "\0"));
                    // SAFETY: the driver's export of this name has this C signature.
                    (!p.is_null()).then(|| unsafe { Real::<($($ty,)*)>::from_raw(p) }.call($($arg),*))
                }
        )*
    };
}

use cudarc::driver::sys::{CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationProp};

safe_fns! {
    cuCtxGetDevice: (dev: Out<c_int>);
    cuDeviceGetCount: (count: Out<c_int>);
    cuMemGetAllocationGranularity:
        (granularity: Out<usize>, prop: In<CUmemAllocationProp>, option: CUmemAllocationGranularity_flags);
    cuMemAddressReserve: (ptr: Out<u64>, size: usize, alignment: usize, addr: u64, flags: u64);
    cuMemSetAccess: (ptr: u64, size: usize, desc: In<CUmemAccessDesc>, count: usize);
}

driver_fns! {
    // Device identity.
    cuDeviceGetUuid_v2: (*mut [u8; 16], c_int);
    cuDeviceGetUuid: (*mut [u8; 16], c_int);
    // Pools.
    cuDeviceGetMemPool: (*mut Handle, c_int);
    cuDeviceGetDefaultMemPool: (*mut Handle, c_int);
    cuStreamGetDevice: (Stream, *mut c_int);
    cuStreamGetCtx: (Stream, *mut Handle);
    cuCtxGetCurrent: (*mut Handle);
    cuMemPoolGetAttribute: (Handle, c_int, *mut c_void);
    // Contexts: measuring and tearing down.
    cuDevicePrimaryCtxGetState: (c_int, *mut u32, *mut c_int);
    cuCtxGetId: (Handle, *mut u64);
    cuCtxGetApiVersion: (Handle, *mut u32);
    // Kernels: which library or module a function loaded at its first launch comes from.
    cuKernelGetLibrary: (*mut Handle, Handle);
    cuFuncGetModule: (*mut Handle, Handle);
    cuLibraryGetModule: (*mut Handle, Handle);
    // Whether the driver loads modules eagerly (CUDA_MODULE_LOADING=EAGER).
    cuModuleGetLoadingMode: (*mut c_int);
    // The local memory a kernel's threads take (a launch grows the stack to it).
    cuFuncGetAttribute: (*mut c_int, c_int, Handle);
    // A function loaded into its context (CUDA 12.4: lazy loading's explicit load).
    cuFuncLoad: (Handle);
    cuFuncIsLoaded: (*mut c_int, Handle);
    cuKernelGetAttribute: (*mut c_int, c_int, Handle, c_int);
    cuDeviceGetAttribute: (*mut c_int, c_int, c_int);
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
    // Graphs: the memory figures, whether a stream captures, a graph's alloc nodes.
    cuDeviceGetGraphMemAttribute: (c_int, c_int, *mut c_void);
    cuStreamIsCapturing: (Stream, *mut c_int);
    cuThreadExchangeStreamCaptureMode: (*mut c_int);
    cuGraphGetNodes: (Handle, *mut Handle, *mut usize);
    cuGraphNodeGetType: (Handle, *mut c_int);
    cuGraphMemAllocNodeGetParams: (Handle, *mut MemAllocNodeParams);
    cuGraphChildGraphNodeGetGraph: (Handle, *mut Handle);
    cuGraphKernelNodeGetParams_v2: (Handle, *mut KernelNodeParams);
}

/// The physical total of `device`, from the driver.
pub fn physical_total(device: usize) -> Option<u64> {
    let mut total = 0usize;
    let rc = real::cuDeviceTotalMem_v2(Out::from(&mut total), device as c_int)?;
    (rc == CUDA_SUCCESS).then_some(total as u64)
}
