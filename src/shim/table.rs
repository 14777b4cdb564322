//! The one list of hooked symbols. It drives all three ways a program can reach them: the symbols this library exports (programs linked with
//! `-lcuda`), the answer of the `dlsym` override (programs that `dlopen` libcuda),
//! and the answer of the `cuGetProcAddress` wrappers (cudart, cuda-python).
//!
//! Nothing here may allocate, lock or read the environment on the `dlsym` path:
//! it can run before any constructor and re-entrantly. State is lazily set atomics.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering::*};

use crate::driver::types::{
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CuResult, PER_THREAD_DEFAULT_STREAM,
};
use crate::resolve::driver_symbol;

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
    #[inline(always)]
    pub fn real(&self) -> *mut c_void {
        let p = self.real.load(Acquire);
        if !p.is_null() {
            return p;
        }
        self.resolve()
    }

    /// The first use: looks the driver's function up. Out of line, so that every hook's
    /// frame is that of its own path, not of the lookup's.
    #[cold]
    #[inline(never)]
    fn resolve(&self) -> *mut c_void {
        let found = driver_symbol(self.name);
        self.learn(found);
        self.real.load(Acquire)
    }

    /// Records a driver address for this symbol found elsewhere (by a client's
    /// `dlsym` or `cuGetProcAddress`). Our own hooks are never taken for the driver.
    pub fn learn(&self, p: *mut c_void) {
        if !p.is_null() && !never_the_driver(p) {
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

use crate::driver::types::{self, Dptr, Handle, Stream};
use crate::hooks as imp;

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
        (pool: *mut Handle, props: *const types::LocationPrefix) => imp::mem_pool_create;
    cuMemCreate = "cuMemCreate" @ 10020 :
        (handle: *mut u64, size: usize, prop: *const types::LocationPrefix, flags: u64) => imp::mem_create;
    cuMemRelease = "cuMemRelease" @ 10020 : (handle: u64) => imp::mem_release;
    cuMemMap = "cuMemMap" @ 10020 :
        (ptr: Dptr, size: usize, offset: usize, handle: u64, flags: u64) => imp::mem_map;
    cuMemUnmap = "cuMemUnmap" @ 10020 : (ptr: Dptr, size: usize) => imp::mem_unmap;
    cuMemAddressFree = "cuMemAddressFree" @ 10020 : (ptr: Dptr, size: usize) => imp::mem_unmap;
    cuMemRetainAllocationHandle = "cuMemRetainAllocationHandle" @ 11000 :
        (handle: *mut u64, addr: *mut c_void) => imp::mem_retain_allocation_handle;
    // Multicast objects: charged nothing; a binding holds what it binds, as a mapping does.
    cuMulticastCreate = "cuMulticastCreate" @ 12010 :
        (handle: *mut u64, prop: *const c_void) => imp::multicast_create;
    cuMulticastAddDevice = "cuMulticastAddDevice" @ 12010 :
        (handle: u64, dev: c_int) => imp::multicast_add_device;
    cuMulticastBindMem = "cuMulticastBindMem" @ 12010 :
        (handle: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) => imp::multicast_bind_mem;
    cuMulticastBindMem_v2 = "cuMulticastBindMem" @ 13010 :
        (handle: u64, dev: c_int, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) => imp::multicast_bind_mem_v2;
    cuMulticastBindAddr = "cuMulticastBindAddr" @ 12010 :
        (handle: u64, mc_offset: usize, ptr: Dptr, size: usize, flags: u64) => imp::multicast_bind_addr;
    cuMulticastBindAddr_v2 = "cuMulticastBindAddr" @ 13010 :
        (handle: u64, dev: c_int, mc_offset: usize, ptr: Dptr, size: usize, flags: u64) => imp::multicast_bind_addr_v2;
    cuMulticastUnbind = "cuMulticastUnbind" @ 12010 :
        (handle: u64, dev: c_int, mc_offset: usize, size: usize) => imp::multicast_unbind;
    cuMemGetAddressRange_v2 = "cuMemGetAddressRange" @ 3020 :
        (base: *mut Dptr, size: *mut usize, dptr: Dptr) => imp::mem_get_address_range;
    cuMemGetInfo_v2 = "cuMemGetInfo" @ 3020 : (free: *mut usize, total: *mut usize) => imp::mem_get_info;
    cuDeviceTotalMem_v2 = "cuDeviceTotalMem" @ 3020 : (bytes: *mut usize, dev: c_int) => imp::device_total_mem;
    cuGetProcAddress = "cuGetProcAddress" @ 11030 :
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_address_v1;
    cuGetProcAddress_v2 = "cuGetProcAddress" @ 12000 :
        (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => get_proc_address_v2;
    // Forwarded untouched; hooked only so `GPUCAP_LOG=debug` names the tables asked for.
    cuGetExportTable = "cuGetExportTable" @ 3000 :
        (table: *mut *const c_void, id: *const [u8; 16]) => get_export_table;
    // CUDA arrays.
    cuArrayCreate_v2 = "cuArrayCreate" @ 3020 :
        (handle: *mut Handle, desc: *const types::ArrayDescriptor) => imp::array_create;
    cuArray3DCreate_v2 = "cuArray3DCreate" @ 3020 :
        (handle: *mut Handle, desc: *const types::Array3DDescriptor) => imp::array_3d_create;
    cuArrayDestroy = "cuArrayDestroy" @ 2000 : (handle: Handle) => imp::array_destroy;
    cuMipmappedArrayCreate = "cuMipmappedArrayCreate" @ 5000 :
        (handle: *mut Handle, desc: *const types::Array3DDescriptor, levels: u32) => imp::mipmapped_array_create;
    cuMipmappedArrayDestroy = "cuMipmappedArrayDestroy" @ 5000 : (handle: Handle) => imp::mipmapped_array_destroy;
    // Modules: what loading one takes.
    cuModuleLoad = "cuModuleLoad" @ 2000 : (module: *mut Handle, fname: *const c_char) => imp::module_load;
    cuModuleLoadData = "cuModuleLoadData" @ 2000 :
        (module: *mut Handle, image: *const c_void) => imp::module_load_data;
    cuModuleLoadDataEx = "cuModuleLoadDataEx" @ 2010 :
        (module: *mut Handle, image: *const c_void, count: u32, options: *mut c_int, values: *mut *mut c_void) => imp::module_load_data_ex;
    cuModuleLoadFatBinary = "cuModuleLoadFatBinary" @ 2000 :
        (module: *mut Handle, image: *const c_void) => imp::module_load_fat_binary;
    cuModuleUnload = "cuModuleUnload" @ 2000 : (module: Handle) => imp::module_unload;
    // Launches: the first of each function on a device loads its kernels.
    cuLaunchKernel = "cuLaunchKernel" @ 4000 :
        (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
         params: *mut *mut c_void, extra: *mut *mut c_void) => imp::launch_kernel;
    cuLaunchKernel_ptsz = "cuLaunchKernel" @ 7000 ptsz :
        (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
         params: *mut *mut c_void, extra: *mut *mut c_void) => imp::launch_kernel;
    cuLaunchCooperativeKernel = "cuLaunchCooperativeKernel" @ 9000 :
        (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
         params: *mut *mut c_void) => imp::launch_cooperative_kernel;
    cuLaunchCooperativeKernel_ptsz = "cuLaunchCooperativeKernel" @ 9000 ptsz :
        (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
         params: *mut *mut c_void) => imp::launch_cooperative_kernel;
    cuLaunchKernelEx = "cuLaunchKernelEx" @ 11060 :
        (config: *const c_void, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) => imp::launch_kernel_ex;
    cuLaunchKernelEx_ptsz = "cuLaunchKernelEx" @ 11060 ptsz :
        (config: *const c_void, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) => imp::launch_kernel_ex;
    cuModuleGetFunction = "cuModuleGetFunction" @ 2000 :
        (out: *mut Handle, module: Handle, name: *const c_char) => imp::module_get_function;
    cuKernelGetFunction = "cuKernelGetFunction" @ 12000 :
        (out: *mut Handle, kernel: Handle) => imp::kernel_get_function;
    cuLibraryUnload = "cuLibraryUnload" @ 12000 : (lib: Handle) => imp::library_unload;
    // Limits: a larger stack takes device memory at the call.
    cuCtxSetLimit = "cuCtxSetLimit" @ 3010 : (limit: c_int, value: usize) => imp::ctx_set_limit;
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
    // What is current on a thread: the device its allocations are charged to.
    cuCtxSetCurrent = "cuCtxSetCurrent" @ 4000 : (ctx: Handle) => imp::ctx_set_current;
    cuCtxPushCurrent = "cuCtxPushCurrent" @ 2000 : (ctx: Handle) => imp::ctx_push_current;
    cuCtxPushCurrent_v2 = "cuCtxPushCurrent" @ 4000 : (ctx: Handle) => imp::ctx_push_current;
    cuCtxPopCurrent = "cuCtxPopCurrent" @ 2000 : (pctx: *mut Handle) => imp::ctx_pop_current;
    cuCtxPopCurrent_v2 = "cuCtxPopCurrent" @ 4000 : (pctx: *mut Handle) => imp::ctx_pop_current;
    // The deprecated graphics-interop creators make and push a context: followed (what is
    // current on the thread is asked again), not charged.
    cuGLCtxCreate = "cuGLCtxCreate" @ 2000 : (pctx: *mut Handle, flags: u32, dev: c_int) => imp::gl_ctx_create;
    cuGLCtxCreate_v2 = "cuGLCtxCreate" @ 3020 : (pctx: *mut Handle, flags: u32, dev: c_int) => imp::gl_ctx_create;
    cuVDPAUCtxCreate = "cuVDPAUCtxCreate" @ 3010 :
        (pctx: *mut Handle, flags: u32, dev: c_int, vdp: u32, get: *mut c_void) => imp::vdpau_ctx_create;
    cuVDPAUCtxCreate_v2 = "cuVDPAUCtxCreate" @ 3020 :
        (pctx: *mut Handle, flags: u32, dev: c_int, vdp: u32, get: *mut c_void) => imp::vdpau_ctx_create;
    // The CUDA 2.x/3.0 variants with 32-bit sizes and pointers, still exported and still
    // what cuGetProcAddress answers for versions before 3020.
    cuMemAlloc = "cuMemAlloc" @ 2000 : (dptr: *mut u32, size: u32) => imp::mem_alloc_v1;
    cuMemAllocPitch = "cuMemAllocPitch" @ 2000 :
        (dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, elem: u32) => imp::mem_alloc_pitch;
    cuMemFree = "cuMemFree" @ 2000 : (dptr: u32) => imp::mem_free;
    cuMemGetInfo = "cuMemGetInfo" @ 2000 : (free: *mut u32, total: *mut u32) => imp::mem_get_info;
    cuDeviceTotalMem = "cuDeviceTotalMem" @ 2000 : (bytes: *mut u32, dev: c_int) => imp::device_total_mem;
    cuArrayCreate = "cuArrayCreate" @ 2000 :
        (handle: *mut Handle, desc: *const types::ArrayDescriptorV1) => imp::array_create_v1;
    cuArray3DCreate = "cuArray3DCreate" @ 2000 :
        (handle: *mut Handle, desc: *const types::Array3DDescriptorV1) => imp::array_3d_create_v1;
    // Synchronisations: where pools give memory back (re-read then).
    cuStreamSynchronize = "cuStreamSynchronize" @ 2000 : (stream: Stream) => imp::stream_synchronize;
    cuStreamSynchronize_ptsz = "cuStreamSynchronize" @ 7000 ptsz : (stream: Stream) => imp::stream_synchronize;
    cuCtxSynchronize = "cuCtxSynchronize" @ 2000 : () => imp::ctx_synchronize;
    cuCtxSynchronize_v2 = "cuCtxSynchronize" @ 13000 : (ctx: Handle) => imp::handle_synchronize;
    cuEventSynchronize = "cuEventSynchronize" @ 2000 : (event: Handle) => imp::handle_synchronize;
    // CUDA graph memory (graph memory nodes): charged as the driver reserves it, around
    // the calls that may move the device's figure. `cuGraphInstantiateWithFlags` is also
    // what the driver hands out for `cuGraphInstantiate` from version 12000 on.
    cuGraphInstantiate = "cuGraphInstantiate" @ 10000 :
        (exec: *mut Handle, graph: Handle, err_node: *mut Handle, log: *mut c_char, size: usize) => imp::graph_instantiate;
    cuGraphInstantiate_v2 = "cuGraphInstantiate" @ 11000 :
        (exec: *mut Handle, graph: Handle, err_node: *mut Handle, log: *mut c_char, size: usize) => imp::graph_instantiate;
    cuGraphInstantiateWithFlags = "cuGraphInstantiate" @ 12000 :
        (exec: *mut Handle, graph: Handle, flags: u64) => imp::graph_instantiate_with_flags;
    cuGraphInstantiateWithParams = "cuGraphInstantiateWithParams" @ 12000 :
        (exec: *mut Handle, graph: Handle, params: *mut imp::InstantiateParams) => imp::graph_instantiate_with_params;
    cuGraphInstantiateWithParams_ptsz = "cuGraphInstantiateWithParams" @ 12000 ptsz :
        (exec: *mut Handle, graph: Handle, params: *mut imp::InstantiateParams) => imp::graph_instantiate_with_params;
    cuGraphUpload = "cuGraphUpload" @ 11010 : (exec: Handle, stream: Stream) => imp::graph_upload;
    cuGraphUpload_ptsz = "cuGraphUpload" @ 11010 ptsz : (exec: Handle, stream: Stream) => imp::graph_upload;
    cuGraphLaunch = "cuGraphLaunch" @ 10000 : (exec: Handle, stream: Stream) => imp::graph_launch;
    cuGraphLaunch_ptsz = "cuGraphLaunch" @ 10000 ptsz : (exec: Handle, stream: Stream) => imp::graph_launch;
    cuGraphExecDestroy = "cuGraphExecDestroy" @ 10000 : (exec: Handle) => imp::graph_exec_destroy;
    cuDeviceGraphMemTrim = "cuDeviceGraphMemTrim" @ 11040 : (dev: c_int) => imp::device_graph_mem_trim;
    // NVML (looked up with dlsym on libnvidia-ml; NVML has no cuGetProcAddress).
    nvmlDeviceGetMemoryInfo = "nvmlDeviceGetMemoryInfo" @ 0 :
        (device: Handle, memory: *mut imp::NvmlMemory) => imp::nvml_memory_info;
    nvmlDeviceGetMemoryInfo_v2 = "nvmlDeviceGetMemoryInfo_v2" @ 0 :
        (device: Handle, memory: *mut imp::NvmlMemoryV2) => imp::nvml_memory_info;
    nvmlDeviceGetComputeRunningProcesses = "nvmlDeviceGetComputeRunningProcesses" @ 0 :
        (device: Handle, count: *mut u32, infos: *mut imp::NvmlProcessV1) => imp::nvml_compute_processes;
    nvmlDeviceGetComputeRunningProcesses_v2 = "nvmlDeviceGetComputeRunningProcesses_v2" @ 0 :
        (device: Handle, count: *mut u32, infos: *mut imp::NvmlProcessV2) => imp::nvml_compute_processes;
    // `_v3` fills the same 24-byte nvmlProcessInfo_t as `_v2` (see gpucap_core::nvml).
    nvmlDeviceGetComputeRunningProcesses_v3 = "nvmlDeviceGetComputeRunningProcesses_v3" @ 0 :
        (device: Handle, count: *mut u32, infos: *mut imp::NvmlProcessV2) => imp::nvml_compute_processes;
    nvmlDeviceGetRunningProcessDetailList = "nvmlDeviceGetRunningProcessDetailList" @ 0 :
        (device: Handle, list: *mut imp::NvmlProcessDetailList) => imp::nvml_process_detail_list;
}

pub fn is_hook(p: *const c_void) -> bool {
    HOOKS.iter().any(|h| h.hook == p)
}

/// Whether `p`, an answer of the loader or the driver, can never be the driver's own
/// function: one of our hooks, or an address in the main program (a non-PIE program's
/// canonical PLT entry of a hooked name, which leads back to the hook; see
/// `resolve::in_main_program`).
pub fn never_the_driver(p: *const c_void) -> bool {
    is_hook(p) || crate::resolve::in_main_program(p)
}

/// The row for an exported variant name, without allocating.
pub fn row_named(name: &[u8]) -> Option<&'static Hook> {
    HOOKS.iter().find(|h| h.name_bytes() == name)
}

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
    log_procaddr(rc, symbol, version, flags);
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
    log_procaddr(rc, symbol, version, flags);
    substitute(rc, symbol, pfn, version, flags)
}

/// Whether `GPUCAP_LOG=debug`: reads the configuration (the environment) on the first
/// request, which may come before any other hooked call. Only on the `cuGetProcAddress`
/// and `cuGetExportTable` paths, called by the client, never from `dlsym`.
fn debug_enabled() -> bool {
    let _ = crate::state::SHIM.config_quiet();
    crate::log::LEVEL.load(Relaxed) >= gpucap_core::config::LogLevel::Debug as u8
}

/// `gpucap: driver request: procaddr NAME VERSION FLAGS -> RC` at debug level: what the
/// client asked for (scripts/gpu/probe-driver.sh asks the real driver the same).
fn log_procaddr(rc: CuResult, symbol: *const c_char, version: c_int, flags: u64) {
    if symbol.is_null() || !debug_enabled() {
        return;
    }
    // SAFETY: the caller's NUL-terminated symbol name (checked non-null).
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    // cudart asks for the empty name first: written "" so the line keeps its fields.
    let name = if name.is_empty() { "\"\"".into() } else { name };
    crate::log::log!(
        Debug,
        "driver request: procaddr {name} {version} {flags} -> {rc}"
    );
}

fn get_export_table(
    real: unsafe extern "C" fn(*mut *const c_void, *const [u8; 16]) -> CuResult,
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CuResult {
    // SAFETY: forwarding the caller's own arguments to the driver.
    let rc = unsafe { real(table, id) };
    if !id.is_null() && debug_enabled() {
        // SAFETY: the caller's 16-byte UUID (checked non-null).
        let u = unsafe { *id };
        crate::log::log!(
            Debug,
            "driver request: export {} -> {rc}",
            gpucap_core::nvml::uuid_text("", &u)
        );
    }
    rc
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
    if p.is_null() || never_the_driver(p) {
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
    crate::log::log!(
        Warn,
        "cuGetProcAddress({}, {version}, {flags}) returned an entry point gpucap does not recognise: it is not intercepted",
        String::from_utf8_lossy(name)
    );
    None
}
