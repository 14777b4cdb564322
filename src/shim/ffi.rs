//! The FFI edge. One table of hooked driver symbols drives all three ways a program
//! can reach them: the symbols this library exports (programs linked with
//! `-lcuda`), the answer of the `dlsym` override (programs that `dlopen` libcuda),
//! and the answer of the `cuGetProcAddress` wrappers (cudart, cuda-python).
//!
//! Nothing here may allocate, lock or read the environment on the `dlsym` path:
//! it can run before any constructor and re-entrantly. State is lazily set atomics.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering::*};

/// `CUresult` as the hooks return it: a plain integer, so an unknown code from the
/// driver is passed through rather than being undefined behaviour.
pub type CuResult = u32;
pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
pub const CUDA_ERROR_NOT_PERMITTED: CuResult = 800;
pub const CUDA_ERROR_UNKNOWN: CuResult = 999;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// One hooked driver symbol.
pub struct Hook {
    /// The exported variant this row stands for, NUL-terminated (`cuMemAlloc_v2\0`).
    pub name: &'static str,
    /// The name `cuGetProcAddress` is asked for (`cuMemAlloc`).
    pub base: &'static str,
    /// The CUDA version that introduced this variant (`3020`).
    pub since: i32,
    /// Whether this is the per-thread-default-stream variant (`_ptsz`/`_ptds`).
    pub per_thread: bool,
    /// Our exported function.
    pub hook: *const c_void,
    /// The driver's function of the same name, once known.
    real: AtomicPtr<c_void>,
}

// SAFETY: `hook` is the address of a function, immutable; `real` is atomic.
unsafe impl Sync for Hook {}

impl Hook {
    pub fn name_bytes(&self) -> &'static [u8] {
        &self.name.as_bytes()[..self.name.len() - 1]
    }

    /// The driver's function, resolved on first use.
    pub fn real(&self) -> *mut c_void {
        let p = self.real.load(Acquire);
        if !p.is_null() {
            return p;
        }
        let found = driver_symbol(self.name);
        self.learn(found);
        self.real.load(Acquire)
    }

    /// Records a driver address for this symbol found elsewhere (by a client's
    /// `dlsym` or `cuGetProcAddress`). Our own hooks are never taken for the driver.
    fn learn(&self, p: *mut c_void) {
        if !p.is_null() && !is_hook(p) {
            let _ = self.real.compare_exchange(null_mut(), p, AcqRel, Acquire);
        }
    }
}

/// Declares the hooked symbols: each row exports `extern "C" fn $sym` which looks
/// up the real function and hands it with the arguments to `$imp`, inside a panic
/// guard. The same rows fill [`HOOKS`].
macro_rules! hook_table {
    ($( $sym:ident = $base:literal @ $since:literal $($ptsz:ident)? : ($($arg:ident : $ty:ty),*) => $imp:path; )*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        enum Row { $($sym),* }

        const ROWS: usize = [$(stringify!($sym)),*].len();

        pub static HOOKS: [Hook; ROWS] = [$(
            Hook {
                name: concat!(stringify!($sym), "\0"),
                base: $base,
                since: $since,
                per_thread: hook_table!(@ptsz $($ptsz)?),
                hook: $sym as *const c_void,
                real: AtomicPtr::new(null_mut()),
            }
        ),*];

        $(
            #[unsafe(no_mangle)]
            #[allow(non_snake_case)]
            pub unsafe extern "C" fn $sym($($arg: $ty),*) -> CuResult {
                type Real = unsafe extern "C" fn($($ty),*) -> CuResult;
                let p = HOOKS[Row::$sym as usize].real();
                // SAFETY: `p` is the driver's export of this very name, whose C
                // signature is the one this row declares.
                let real = (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, Real>(p) });
                guard(|| match real {
                    Some(real) => $imp(real, $($arg),*),
                    None => CUDA_ERROR_NOT_FOUND,
                })
            }
        )*
    };
    (@ptsz ptsz) => { true };
    (@ptsz) => { false };
}

/// Runs a hook body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of crossing the
/// C boundary.
fn guard(f: impl FnOnce() -> CuResult) -> CuResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

use crate::hooks::{self as imp, Dptr, Handle, Stream};

hook_table! {
    cuInit = "cuInit" @ 2000 : (flags: u32) => imp::init;
    cuMemAlloc_v2 = "cuMemAlloc" @ 3020 : (dptr: *mut Dptr, size: usize) => imp::mem_alloc;
    cuMemAllocPitch_v2 = "cuMemAllocPitch" @ 3020 :
        (dptr: *mut Dptr, pitch: *mut usize, width: usize, height: usize, elem: u32) => imp::mem_alloc_pitch;
    cuMemAllocManaged = "cuMemAllocManaged" @ 6000 :
        (dptr: *mut Dptr, size: usize, flags: u32) => imp::mem_alloc_managed;
    cuMemFree_v2 = "cuMemFree" @ 3020 : (dptr: Dptr) => imp::mem_free;
    cuMemAllocAsync = "cuMemAllocAsync" @ 11020 :
        (dptr: *mut Dptr, size: usize, stream: Stream) => imp::mem_alloc_async;
    cuMemAllocAsync_ptsz = "cuMemAllocAsync" @ 11020 ptsz :
        (dptr: *mut Dptr, size: usize, stream: Stream) => imp::mem_alloc_async;
    cuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync" @ 11020 :
        (dptr: *mut Dptr, size: usize, pool: Handle, stream: Stream) => imp::mem_alloc_from_pool_async;
    cuMemAllocFromPoolAsync_ptsz = "cuMemAllocFromPoolAsync" @ 11020 ptsz :
        (dptr: *mut Dptr, size: usize, pool: Handle, stream: Stream) => imp::mem_alloc_from_pool_async;
    cuMemFreeAsync = "cuMemFreeAsync" @ 11020 : (dptr: Dptr, stream: Stream) => imp::mem_free_async;
    cuMemFreeAsync_ptsz = "cuMemFreeAsync" @ 11020 ptsz : (dptr: Dptr, stream: Stream) => imp::mem_free_async;
    cuMemPoolCreate = "cuMemPoolCreate" @ 11020 :
        (pool: *mut Handle, props: *const imp::LocationPrefix) => imp::mem_pool_create;
    cuMemCreate = "cuMemCreate" @ 10020 :
        (handle: *mut u64, size: usize, prop: *const imp::LocationPrefix, flags: u64) => imp::mem_create;
    cuMemRelease = "cuMemRelease" @ 10020 : (handle: u64) => imp::mem_release;
    cuMemMap = "cuMemMap" @ 10020 :
        (ptr: Dptr, size: usize, offset: usize, handle: u64, flags: u64) => imp::mem_map;
    cuMemUnmap = "cuMemUnmap" @ 10020 : (ptr: Dptr, size: usize) => imp::mem_unmap;
    cuMemAddressFree = "cuMemAddressFree" @ 10020 : (ptr: Dptr, size: usize) => imp::mem_address_free;
    cuMemRetainAllocationHandle = "cuMemRetainAllocationHandle" @ 11000 :
        (handle: *mut u64, addr: *mut c_void) => imp::mem_retain_allocation_handle;
    cuMemGetAddressRange_v2 = "cuMemGetAddressRange" @ 3020 :
        (base: *mut Dptr, size: *mut usize, dptr: Dptr) => imp::mem_get_address_range;
    cuMemGetInfo_v2 = "cuMemGetInfo" @ 3020 : (free: *mut usize, total: *mut usize) => imp::mem_get_info;
    cuDeviceTotalMem_v2 = "cuDeviceTotalMem" @ 3020 : (bytes: *mut usize, dev: c_int) => imp::device_total_mem;
    cuGetProcAddress = "cuGetProcAddress" @ 11030 :
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_address_v1;
    cuGetProcAddress_v2 = "cuGetProcAddress" @ 12000 :
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => get_proc_address_v2;
    // CUDA arrays.
    cuArrayCreate_v2 = "cuArrayCreate" @ 3020 :
        (handle: *mut Handle, desc: *const imp::ArrayDescriptor) => imp::array_create;
    cuArray3DCreate_v2 = "cuArray3DCreate" @ 3020 :
        (handle: *mut Handle, desc: *const imp::Array3DDescriptor) => imp::array_3d_create;
    cuArrayDestroy = "cuArrayDestroy" @ 2000 : (handle: Handle) => imp::array_destroy;
    cuMipmappedArrayCreate = "cuMipmappedArrayCreate" @ 5000 :
        (handle: *mut Handle, desc: *const imp::Array3DDescriptor, levels: u32) => imp::mipmapped_array_create;
    cuMipmappedArrayDestroy = "cuMipmappedArrayDestroy" @ 5000 : (handle: Handle) => imp::mipmapped_array_destroy;
    // Pools.
    cuMemPoolDestroy = "cuMemPoolDestroy" @ 11020 : (pool: Handle) => imp::mem_pool_destroy;
    cuMemPoolTrimTo = "cuMemPoolTrimTo" @ 11020 : (pool: Handle, keep: usize) => imp::mem_pool_trim_to;
    // Contexts.
    cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" @ 7000 :
        (pctx: *mut Handle, dev: c_int) => imp::primary_ctx_retain;
    cuDevicePrimaryCtxRelease = "cuDevicePrimaryCtxRelease" @ 7000 : (dev: c_int) => imp::primary_ctx_release;
    cuDevicePrimaryCtxRelease_v2 = "cuDevicePrimaryCtxRelease" @ 11000 : (dev: c_int) => imp::primary_ctx_release;
    cuDevicePrimaryCtxReset = "cuDevicePrimaryCtxReset" @ 7000 : (dev: c_int) => imp::primary_ctx_reset;
    cuDevicePrimaryCtxReset_v2 = "cuDevicePrimaryCtxReset" @ 11000 : (dev: c_int) => imp::primary_ctx_reset;
    cuCtxCreate = "cuCtxCreate" @ 2000 : (pctx: *mut Handle, flags: u32, dev: c_int) => imp::ctx_create;
    cuCtxCreate_v2 = "cuCtxCreate" @ 3020 : (pctx: *mut Handle, flags: u32, dev: c_int) => imp::ctx_create;
    cuCtxCreate_v3 = "cuCtxCreate" @ 11040 :
        (pctx: *mut Handle, params: *mut c_void, count: c_int, flags: u32, dev: c_int) => imp::ctx_create_v3;
    cuCtxCreate_v4 = "cuCtxCreate" @ 12050 :
        (pctx: *mut Handle, params: *mut c_void, flags: u32, dev: c_int) => imp::ctx_create_v4;
    cuCtxDestroy = "cuCtxDestroy" @ 2000 : (ctx: Handle) => imp::ctx_destroy;
    cuCtxDestroy_v2 = "cuCtxDestroy" @ 4000 : (ctx: Handle) => imp::ctx_destroy;
    cuCtxDetach = "cuCtxDetach" @ 2000 : (ctx: Handle) => imp::ctx_detach;
    // The CUDA 2.x/3.0 variants with 32-bit sizes and pointers, still exported and still
    // what cuGetProcAddress answers for versions before 3020.
    cuMemAlloc = "cuMemAlloc" @ 2000 : (dptr: *mut u32, size: u32) => imp::mem_alloc_v1;
    cuMemAllocPitch = "cuMemAllocPitch" @ 2000 :
        (dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, elem: u32) => imp::mem_alloc_pitch;
    cuMemFree = "cuMemFree" @ 2000 : (dptr: u32) => imp::mem_free;
    cuMemGetInfo = "cuMemGetInfo" @ 2000 : (free: *mut u32, total: *mut u32) => imp::mem_get_info;
    cuDeviceTotalMem = "cuDeviceTotalMem" @ 2000 : (bytes: *mut u32, dev: c_int) => imp::device_total_mem;
    cuArrayCreate = "cuArrayCreate" @ 2000 :
        (handle: *mut Handle, desc: *const imp::ArrayDescriptorV1) => imp::array_create_v1;
    cuArray3DCreate = "cuArray3DCreate" @ 2000 :
        (handle: *mut Handle, desc: *const imp::Array3DDescriptorV1) => imp::array_3d_create_v1;
    // Synchronisations: where pools give memory back (re-read then).
    cuStreamSynchronize = "cuStreamSynchronize" @ 2000 : (stream: Stream) => imp::stream_synchronize;
    cuStreamSynchronize_ptsz = "cuStreamSynchronize" @ 7000 ptsz : (stream: Stream) => imp::stream_synchronize;
    cuCtxSynchronize = "cuCtxSynchronize" @ 2000 : () => imp::ctx_synchronize;
    cuCtxSynchronize_v2 = "cuCtxSynchronize" @ 13000 : (ctx: Handle) => imp::handle_synchronize;
    cuEventSynchronize = "cuEventSynchronize" @ 2000 : (event: Handle) => imp::handle_synchronize;
    // NVML (looked up with dlsym on libnvidia-ml; NVML has no cuGetProcAddress).
    nvmlDeviceGetMemoryInfo = "nvmlDeviceGetMemoryInfo" @ 0 :
        (device: Handle, memory: *mut imp::NvmlMemory) => imp::nvml_memory_info;
    nvmlDeviceGetMemoryInfo_v2 = "nvmlDeviceGetMemoryInfo_v2" @ 0 :
        (device: Handle, memory: *mut imp::NvmlMemoryV2) => imp::nvml_memory_info;
}

fn is_hook(p: *const c_void) -> bool {
    HOOKS.iter().any(|h| h.hook == p)
}

/// The row for an exported variant name, without allocating.
fn row_named(name: &[u8]) -> Option<&'static Hook> {
    HOOKS.iter().find(|h| h.name_bytes() == name)
}

// ---------------------------------------------------------------------------
// Finding the driver's functions.

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`. Called only from this library's own code, so its notion of
/// "the caller" (for `RTLD_NEXT`) is libgpucap itself.
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Acquire);
    if p.is_null() {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: dlvsym with constant NUL-terminated strings; it is not hooked.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Release);
    }
    // SAFETY: `p` is glibc's dlsym, whose signature DlsymFn is.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// A handle to the libcuda the program uses, once one is known.
static LIBCUDA: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn libcuda() -> *mut c_void {
    let h = LIBCUDA.load(Acquire);
    if !h.is_null() {
        return h;
    }
    // Already loaded (linked, or dlopened even RTLD_LOCAL)? Take a reference to it;
    // else load it ourselves, as the program is evidently calling into CUDA.
    for flags in [libc::RTLD_LAZY | libc::RTLD_NOLOAD, libc::RTLD_LAZY] {
        for name in [c"libcuda.so.1", c"libcuda.so"] {
            // SAFETY: dlopen with a constant name; it is not hooked.
            let h = unsafe { libc::dlopen(name.as_ptr(), flags) };
            if !h.is_null() {
                return match LIBCUDA.compare_exchange(null_mut(), h, AcqRel, Acquire) {
                    Ok(_) => h,
                    Err(other) => other,
                };
            }
        }
    }
    null_mut()
}

/// Whether the program has libcuda loaded, without ever loading it (an NVML-only
/// process must not get the driver API loaded by the shim).
pub fn cuda_loaded() -> bool {
    if !LIBCUDA.load(Acquire).is_null() {
        return true;
    }
    for name in [c"libcuda.so.1", c"libcuda.so"] {
        // SAFETY: dlopen with a constant name and RTLD_NOLOAD: it never loads anything.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if !h.is_null() {
            if LIBCUDA
                .compare_exchange(null_mut(), h, AcqRel, Acquire)
                .is_err()
            {
                // SAFETY: the reference this dlopen took; another was kept first.
                unsafe { libc::dlclose(h) };
            }
            return true;
        }
    }
    false
}

/// A handle to the NVML library the program uses, once one is known. Never loaded by
/// the shim: NVML hooks run only in programs that loaded it.
static LIBNVML: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn libnvml() -> *mut c_void {
    let h = LIBNVML.load(Acquire);
    if !h.is_null() {
        return h;
    }
    // SAFETY: dlopen with a constant name and RTLD_NOLOAD: it never loads anything.
    let h = unsafe {
        libc::dlopen(
            c"libnvidia-ml.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return h;
    }
    match LIBNVML.compare_exchange(null_mut(), h, AcqRel, Acquire) {
        Ok(_) => h,
        Err(other) => other,
    }
}

/// Whether a symbol name is NVML's (`nvml…`) rather than the driver API's (`cu…`).
fn is_nvml(name: &[u8]) -> bool {
    name.starts_with(b"nvml")
}

/// The driver's export `name` (NUL-terminated), never one of our hooks. `nvml…`
/// names are looked up in NVML.
pub fn driver_symbol(name: &'static str) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return null_mut();
    };
    let cname = name.as_ptr().cast::<c_char>();
    let h = if is_nvml(name.as_bytes()) {
        libnvml()
    } else {
        libcuda()
    };
    // SAFETY: real dlsym with a live handle (or RTLD_NEXT) and a NUL-terminated name.
    let mut p = if h.is_null() {
        null_mut()
    } else {
        unsafe { dlsym(h, cname) }
    };
    if p.is_null() || is_hook(p) {
        // SAFETY: as above; RTLD_NEXT from our own code finds the next definition.
        p = unsafe { dlsym(libc::RTLD_NEXT, cname) };
    }
    if is_hook(p) { null_mut() } else { p }
}

/// Declares driver functions the hooks call but do not intercept.
macro_rules! driver_fns {
    ($( $name:ident : ($($ty:ty),*); )*) => {
        pub mod driver {
            use super::*;
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
        }
    };
}

use cudarc::driver::sys::{CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationProp};

driver_fns! {
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
    // Arrays.
    cuArrayGetMemoryRequirements: (*mut crate::hooks::MemoryRequirements, Handle, c_int);
    cuMipmappedArrayGetMemoryRequirements: (*mut crate::hooks::MemoryRequirements, Handle, c_int);
    cuArray3DGetDescriptor_v2: (*mut crate::hooks::Array3DDescriptor, Handle);
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
}

/// The physical total of `device`, from the driver.
pub fn physical_total(device: usize) -> Option<u64> {
    let real = HOOKS[Row::cuDeviceTotalMem_v2 as usize].real();
    if real.is_null() {
        return None;
    }
    // SAFETY: the driver's cuDeviceTotalMem_v2(size_t*, CUdevice).
    let f = unsafe {
        std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut usize, c_int) -> CuResult>(
            real,
        )
    };
    let mut total = 0usize;
    // SAFETY: valid out-pointer; the device index was bounds-checked by the caller.
    (unsafe { f(&mut total, device as c_int) } == CUDA_SUCCESS).then_some(total as u64)
}

// ---------------------------------------------------------------------------
// dlsym

#[repr(C)]
struct Decision {
    /// What `dlsym` returns when `forward` is null.
    value: *mut c_void,
    /// glibc's `dlsym`, to tail-jump to with the caller's own arguments.
    forward: *mut c_void,
}

/// Decides a `dlsym` call: our hook for a hooked driver symbol looked up on a
/// library handle, else "forward to glibc" so glibc sees the original caller.
extern "C" fn dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> Decision {
    let Some(real) = real_dlsym() else {
        // No glibc dlsym: nothing can be looked up at all.
        return Decision {
            value: null_mut(),
            forward: null_mut(),
        };
    };
    let forward = Decision {
        value: null_mut(),
        forward: real as *mut c_void,
    };
    // RTLD_DEFAULT already finds our exports first; RTLD_NEXT must stay relative to
    // the caller, which only glibc, reached by the tail jump, can know.
    if symbol.is_null() || handle == libc::RTLD_DEFAULT || handle == libc::RTLD_NEXT {
        return forward;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !name.starts_with(b"cu") && !is_nvml(name) {
        return forward;
    }
    let Some(row) = row_named(name) else {
        return forward;
    };
    // SAFETY: real dlsym on the caller's handle; the caller identity does not matter
    // for a handle lookup.
    let p = unsafe { real(handle, symbol) };
    if p.is_null() || is_hook(p) {
        return Decision {
            value: p,
            forward: null_mut(),
        };
    }
    let library = if is_nvml(name) { &LIBNVML } else { &LIBCUDA };
    let _ = library.compare_exchange(null_mut(), handle, AcqRel, Acquire);
    row.learn(p);
    Decision {
        value: row.hook as *mut c_void,
        forward: null_mut(),
    }
}

/// The exported `dlsym`. A naked entry so that forwarding is a tail jump: glibc
/// then sees the original return address and resolves `RTLD_NEXT` for the caller.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",             // 16-byte alignment for the call
        "call {decide}",          // rax = value, rdx = forward
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rdx, rdx",
        "jnz 2f",
        "ret",
        "2:",
        "jmp rdx",                // tail jump: glibc's dlsym returns to our caller
        decide = sym dlsym_decide,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",            // x0 = value, x1 = forward
        "mov x16, x1",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbnz x16, 2f",
        "ret",
        "2:",
        "br x16",                 // tail jump with the caller's x30 restored
        decide = sym dlsym_decide,
    )
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("gpucap's dlsym entry is written for x86_64 and aarch64");

// ---------------------------------------------------------------------------
// cuGetProcAddress

fn get_proc_address_v1(
    real: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    // SAFETY: forwarding the caller's own arguments to the driver.
    let rc = unsafe { real(symbol, pfn, version, flags) };
    substitute(rc, symbol, pfn, version, flags)
}

fn get_proc_address_v2(
    real: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    // SAFETY: forwarding the caller's own arguments to the driver.
    let rc = unsafe { real(symbol, pfn, version, flags, status) };
    substitute(rc, symbol, pfn, version, flags)
}

/// After the driver answered `cuGetProcAddress`, replaces its pointer by the hook
/// of exactly the variant it returned.
fn substitute(
    rc: CuResult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    if rc != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return rc;
    }
    // SAFETY: the driver succeeded, so `pfn` is a valid out-pointer it filled.
    let p = unsafe { *pfn };
    // SAFETY: the caller's NUL-terminated symbol name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if let Some(row) = identify(name, p, version, flags) {
        // SAFETY: as above.
        unsafe { *pfn = row.hook as *mut c_void };
    }
    rc
}

/// Which hooked variant the driver returned for a request, if any.
fn identify(name: &[u8], p: *mut c_void, version: c_int, flags: u64) -> Option<&'static Hook> {
    if p.is_null() || is_hook(p) {
        return None;
    }
    let candidates = || {
        HOOKS
            .iter()
            .filter(|h| h.base.as_bytes() == name || h.name_bytes() == name)
    };
    // The driver hands out its exports: find the one it returned.
    if let Some(row) = candidates().find(|h| h.real() == p) {
        return Some(row);
    }
    // Not one of the exports we know by address: pick by the version rules. Taken
    // only if that variant's export is unknown, so no two addresses compete.
    let pick = |per_thread: bool| {
        candidates()
            .filter(|h| h.since <= version && h.per_thread == per_thread)
            .max_by_key(|h| h.since)
    };
    let row = if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        pick(true).or_else(|| pick(false))
    } else {
        pick(false)
    }?;
    if row.real().is_null() {
        row.learn(p);
        return Some(row);
    }
    crate::shim::log!(
        Warn,
        "cuGetProcAddress({}, {version}, {flags}) returned an entry point gpucap does not recognise: it is not intercepted",
        String::from_utf8_lossy(name)
    );
    None
}

// ---------------------------------------------------------------------------
// Where this library is

/// The directory this library was loaded from, as the loader names it.
pub fn own_dir() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = own_dir as fn() -> Option<std::path::PathBuf> as *const std::ffi::c_void;
    // SAFETY: dladdr only reads `addr` (a function of this library) and fills `info`.
    if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised (and was zeroed before).
    let fname = unsafe { info.assume_init() }.dli_fname;
    if fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the loader's NUL-terminated name of this library, alive as
    // long as the library is loaded.
    let name = unsafe { std::ffi::CStr::from_ptr(fname) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    Some(
        path.parent()
            .unwrap_or(std::path::Path::new("."))
            .to_path_buf(),
    )
}

// ---------------------------------------------------------------------------
// Process exit

/// Runs at process exit: from `exit()` on any thread and on return from `main`, after
/// the program's own atexit handlers and destructors (`.fini_array` entries run from
/// the dynamic loader's exit handler, which is registered before any other), so the
/// figures are final. Not on `_exit()` or a fatal signal: see `after_refusal`.
#[used]
// SAFETY: a .fini_array entry is a plain `extern "C" fn()` the loader calls once.
#[unsafe(link_section = ".fini_array")]
static EXIT_HOOK: extern "C" fn() = exit_hook;

extern "C" fn exit_hook() {
    // Never unwind into the C runtime.
    let _ = std::panic::catch_unwind(|| crate::shim::SHIM.at_exit());
}
