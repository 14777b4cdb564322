//! The one list of hooked driver functions, with their C signatures. Each row names the
//! exported variant (`cuMemAlloc_v2`), the name `cuGetProcAddress` is asked for
//! (`cuMemAlloc`), the CUDA version that introduced the variant, `ptsz` for a
//! per-thread-default-stream variant, the C arguments as the hooks see them (pointers
//! typed as [`Out`], [`In`], [`OutArray`], [`CText`]; see `types`) and the hook.
//!
//! [`hooked!`] hands the rows to a macro. The hook table (`table.rs`) makes the exported
//! functions from them; here they make [`SLOTS`], the driver's function of each row once
//! known, and [`real`], a typed call of each that the shim itself makes (to measure, or
//! to undo a call it refuses after the fact). A row's hook is named by its family's path
//! (`hooks::memory::mem_alloc`: the file of `hooks/` it lives in), which the table
//! resolves; this module only passes it on.
//!
//! Nothing here may allocate, lock or read the environment: the `dlsym` override reads
//! the slots, before any constructor and re-entrantly.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicPtr,
    Ordering::{AcqRel, Acquire},
};

use super::types::{
    Array3DDescriptor, Array3DDescriptorV1, ArrayDescriptor, ArrayDescriptorV1, ArrayMapInfo,
    CText, CuResult, Dptr, GraphNodeParamsHead, Handle, In, InArray, InstantiateParams,
    KernelNodeParams, KernelNodeParamsV1, LaunchConfigHead, LocationPrefix, MultiDeviceLaunch,
    NvmlProcessDetailList, Out, OutArray, Stream,
};
use crate::resolve::{driver_symbol, in_main_program};
use gpucap_core::nvml::{NvmlMemory, NvmlMemoryV2, NvmlProcessV1, NvmlProcessV2};

/// Hands the rows to `$then!`.
macro_rules! hooked {
    ($then:ident) => {
        $then! {
            cuInit = "cuInit" @ 2000 : (flags: u32) => hooks::init::init;
            cuMemAlloc_v2 = "cuMemAlloc" @ 3020 : (dptr: Out<Dptr>, size: usize) => hooks::memory::mem_alloc;
            cuMemAllocPitch_v2 = "cuMemAllocPitch" @ 3020 :
                (dptr: Out<Dptr>, pitch: Out<usize>, width: usize, height: usize, elem: u32) => hooks::memory::mem_alloc_pitch;
            cuMemAllocManaged = "cuMemAllocManaged" @ 6000 :
                (dptr: Out<Dptr>, size: usize, flags: u32) => hooks::memory::mem_alloc_managed;
            cuMemFree_v2 = "cuMemFree" @ 3020 : (dptr: Dptr) => hooks::memory::mem_free;
            cuMemAllocAsync = "cuMemAllocAsync" @ 11020 :
                (dptr: Out<Dptr>, size: usize, stream: Stream) => hooks::pools::mem_alloc_async;
            cuMemAllocAsync_ptsz = "cuMemAllocAsync" @ 11020 ptsz :
                (dptr: Out<Dptr>, size: usize, stream: Stream) => hooks::pools::mem_alloc_async;
            cuMemAllocFromPoolAsync = "cuMemAllocFromPoolAsync" @ 11020 :
                (dptr: Out<Dptr>, size: usize, pool: Handle, stream: Stream) => hooks::pools::mem_alloc_from_pool_async;
            cuMemAllocFromPoolAsync_ptsz = "cuMemAllocFromPoolAsync" @ 11020 ptsz :
                (dptr: Out<Dptr>, size: usize, pool: Handle, stream: Stream) => hooks::pools::mem_alloc_from_pool_async;
            cuMemFreeAsync = "cuMemFreeAsync" @ 11020 : (dptr: Dptr, stream: Stream) => hooks::pools::mem_free_async;
            cuMemFreeAsync_ptsz = "cuMemFreeAsync" @ 11020 ptsz : (dptr: Dptr, stream: Stream) => hooks::pools::mem_free_async;
            cuMemPoolCreate = "cuMemPoolCreate" @ 11020 :
                (pool: Out<Handle>, props: In<LocationPrefix>) => hooks::pools::mem_pool_create;
            cuMemCreate = "cuMemCreate" @ 10020 :
                (handle: Out<u64>, size: usize, prop: In<LocationPrefix>, flags: u64) => hooks::vmm::mem_create;
            cuMemRelease = "cuMemRelease" @ 10020 : (handle: u64) => hooks::vmm::mem_release;
            cuMemMap = "cuMemMap" @ 10020 :
                (ptr: Dptr, size: usize, offset: usize, handle: u64, flags: u64) => hooks::vmm::mem_map;
            cuMemUnmap = "cuMemUnmap" @ 10020 : (ptr: Dptr, size: usize) => hooks::vmm::mem_unmap;
            cuMemMapArrayAsync = "cuMemMapArrayAsync" @ 11010 :
                (list: InArray<ArrayMapInfo>, count: u32, stream: Stream) => hooks::vmm::mem_map_array_async;
            cuMemMapArrayAsync_ptsz = "cuMemMapArrayAsync" @ 11010 ptsz :
                (list: InArray<ArrayMapInfo>, count: u32, stream: Stream) => hooks::vmm::mem_map_array_async;
            cuMemAddressFree = "cuMemAddressFree" @ 10020 : (ptr: Dptr, size: usize) => hooks::vmm::mem_unmap;
            cuMemRetainAllocationHandle = "cuMemRetainAllocationHandle" @ 11000 :
                (handle: Out<u64>, addr: *mut c_void) => hooks::vmm::mem_retain_allocation_handle;
            // Multicast objects: charged nothing; a binding holds what it binds, as a mapping does.
            cuMulticastCreate = "cuMulticastCreate" @ 12010 :
                (handle: Out<u64>, prop: *const c_void) => hooks::multicast::multicast_create;
            cuMulticastAddDevice = "cuMulticastAddDevice" @ 12010 :
                (handle: u64, dev: c_int) => hooks::multicast::multicast_add_device;
            cuMulticastBindMem = "cuMulticastBindMem" @ 12010 :
                (handle: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) => hooks::multicast::multicast_bind_mem;
            cuMulticastBindMem_v2 = "cuMulticastBindMem" @ 13010 :
                (handle: u64, dev: c_int, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) => hooks::multicast::multicast_bind_mem_v2;
            cuMulticastBindAddr = "cuMulticastBindAddr" @ 12010 :
                (handle: u64, mc_offset: usize, ptr: Dptr, size: usize, flags: u64) => hooks::multicast::multicast_bind_addr;
            cuMulticastBindAddr_v2 = "cuMulticastBindAddr" @ 13010 :
                (handle: u64, dev: c_int, mc_offset: usize, ptr: Dptr, size: usize, flags: u64) => hooks::multicast::multicast_bind_addr_v2;
            cuMulticastUnbind = "cuMulticastUnbind" @ 12010 :
                (handle: u64, dev: c_int, mc_offset: usize, size: usize) => hooks::multicast::multicast_unbind;
            cuMemGetAddressRange_v2 = "cuMemGetAddressRange" @ 3020 :
                (base: Out<Dptr>, size: Out<usize>, dptr: Dptr) => hooks::info::mem_get_address_range;
            cuMemGetInfo_v2 = "cuMemGetInfo" @ 3020 : (free: Out<usize>, total: Out<usize>) => hooks::info::mem_get_info;
            cuDeviceTotalMem_v2 = "cuDeviceTotalMem" @ 3020 : (bytes: Out<usize>, dev: c_int) => hooks::info::device_total_mem;
            cuGetProcAddress = "cuGetProcAddress" @ 11030 :
                (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_address_v1;
            cuGetProcAddress_v2 = "cuGetProcAddress" @ 12000 :
                (symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => get_proc_address_v2;
            // Forwarded untouched; hooked only so `GPUCAP_LOG=debug` names the tables asked for.
            cuGetExportTable = "cuGetExportTable" @ 3000 :
                (table: *mut *const c_void, id: *const [u8; 16]) => get_export_table;
            // CUDA arrays.
            cuArrayCreate_v2 = "cuArrayCreate" @ 3020 :
                (handle: Out<Handle>, desc: In<ArrayDescriptor>) => hooks::arrays::array_create;
            cuArray3DCreate_v2 = "cuArray3DCreate" @ 3020 :
                (handle: Out<Handle>, desc: In<Array3DDescriptor>) => hooks::arrays::array_3d_create;
            cuArrayDestroy = "cuArrayDestroy" @ 2000 : (handle: Handle) => hooks::arrays::array_destroy;
            cuMipmappedArrayCreate = "cuMipmappedArrayCreate" @ 5000 :
                (handle: Out<Handle>, desc: In<Array3DDescriptor>, levels: u32) => hooks::arrays::mipmapped_array_create;
            cuMipmappedArrayDestroy = "cuMipmappedArrayDestroy" @ 5000 : (handle: Handle) => hooks::arrays::mipmapped_array_destroy;
            // Modules: what loading one takes.
            cuModuleLoad = "cuModuleLoad" @ 2000 : (module: Out<Handle>, fname: CText) => hooks::modules::module_load;
            cuModuleLoadData = "cuModuleLoadData" @ 2000 :
                (module: Out<Handle>, image: *const c_void) => hooks::modules::module_load_data;
            cuModuleLoadDataEx = "cuModuleLoadDataEx" @ 2010 :
                (module: Out<Handle>, image: *const c_void, count: u32, options: *mut c_int, values: *mut *mut c_void) => hooks::modules::module_load_data_ex;
            cuModuleLoadFatBinary = "cuModuleLoadFatBinary" @ 2000 :
                (module: Out<Handle>, image: *const c_void) => hooks::modules::module_load_fat_binary;
            cuModuleUnload = "cuModuleUnload" @ 2000 : (module: Handle) => hooks::modules::module_unload;
            // Launches: the first of each function on a device loads its kernels.
            cuLaunchKernel = "cuLaunchKernel" @ 4000 :
                (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
                 params: *mut *mut c_void, extra: *mut *mut c_void) => hooks::launches::launch_kernel;
            cuLaunchKernel_ptsz = "cuLaunchKernel" @ 7000 ptsz :
                (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
                 params: *mut *mut c_void, extra: *mut *mut c_void) => hooks::launches::launch_kernel;
            cuLaunchCooperativeKernel = "cuLaunchCooperativeKernel" @ 9000 :
                (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
                 params: *mut *mut c_void) => hooks::launches::launch_cooperative_kernel;
            cuLaunchCooperativeKernel_ptsz = "cuLaunchCooperativeKernel" @ 9000 ptsz :
                (f: Handle, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shared: u32, stream: Stream,
                 params: *mut *mut c_void) => hooks::launches::launch_cooperative_kernel;
            // Deprecated since CUDA 11.3: a launch on each of several devices in one call.
            cuLaunchCooperativeKernelMultiDevice = "cuLaunchCooperativeKernelMultiDevice" @ 9000 :
                (list: InArray<MultiDeviceLaunch>, n: u32, flags: u32) => hooks::multi_device::launch_cooperative_kernel_multi_device;
            cuLaunchKernelEx = "cuLaunchKernelEx" @ 11060 :
                (config: In<LaunchConfigHead>, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) => hooks::launches::launch_kernel_ex;
            cuLaunchKernelEx_ptsz = "cuLaunchKernelEx" @ 11060 ptsz :
                (config: In<LaunchConfigHead>, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void) => hooks::launches::launch_kernel_ex;
            // The deprecated launches (replaced by cuLaunchKernel in CUDA 4.0): the same first use.
            cuLaunch = "cuLaunch" @ 2000 : (f: Handle) => hooks::launches::launch;
            cuLaunchGrid = "cuLaunchGrid" @ 2000 : (f: Handle, w: c_int, h: c_int) => hooks::launches::launch_grid;
            cuLaunchGridAsync = "cuLaunchGridAsync" @ 2000 :
                (f: Handle, w: c_int, h: c_int, stream: Stream) => hooks::launches::launch_grid_async;
            cuModuleGetFunction = "cuModuleGetFunction" @ 2000 :
                (out: Out<Handle>, module: Handle, name: CText) => hooks::launches::module_get_function;
            cuKernelGetFunction = "cuKernelGetFunction" @ 12000 :
                (out: Out<Handle>, kernel: Handle) => hooks::launches::kernel_get_function;
            // Partially loaded functions (CUDA 12.4): the calls that may load one.
            cuModuleEnumerateFunctions = "cuModuleEnumerateFunctions" @ 12040 :
                (functions: *mut Handle, n: u32, module: Handle) => hooks::functions::module_enumerate_functions;
            cuFuncLoad = "cuFuncLoad" @ 12040 : (f: Handle) => hooks::functions::func_load;
            cuFuncGetAttribute = "cuFuncGetAttribute" @ 2020 :
                (value: *mut c_int, attribute: c_int, f: Handle) => hooks::functions::func_get_attribute;
            cuFuncSetAttribute = "cuFuncSetAttribute" @ 9000 :
                (f: Handle, attribute: c_int, value: c_int) => hooks::functions::func_set_attribute;
            cuLibraryGetModule = "cuLibraryGetModule" @ 12000 :
                (module: Out<Handle>, library: Handle) => hooks::globals::library_get_module;
            cuModuleGetGlobal = "cuModuleGetGlobal" @ 2000 :
                (dptr: *mut u32, bytes: *mut u32, module: Handle, name: CText) => hooks::globals::module_get_global_v1;
            cuModuleGetGlobal_v2 = "cuModuleGetGlobal" @ 3020 :
                (dptr: *mut u64, bytes: *mut usize, module: Handle, name: CText) => hooks::globals::module_get_global;
            cuLibraryGetGlobal = "cuLibraryGetGlobal" @ 12000 :
                (dptr: *mut u64, bytes: *mut usize, library: Handle, name: CText) => hooks::globals::library_get_global;
            cuLibraryGetManaged = "cuLibraryGetManaged" @ 12000 :
                (dptr: *mut u64, bytes: *mut usize, library: Handle, name: CText) => hooks::globals::library_get_managed;
            cuLibraryUnload = "cuLibraryUnload" @ 12000 : (lib: Handle) => hooks::launches::library_unload;
            // Libraries: loaded into every context at the load under eager loading.
            cuLibraryLoadData = "cuLibraryLoadData" @ 12000 :
                (library: Out<Handle>, code: *const c_void, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit: u32,
                 lib_options: *mut c_int, lib_values: *mut *mut c_void, num_lib: u32) => hooks::libraries::library_load;
            cuLibraryLoadFromFile = "cuLibraryLoadFromFile" @ 12000 :
                (library: Out<Handle>, fname: CText, jit_options: *mut c_int, jit_values: *mut *mut c_void, num_jit: u32,
                 lib_options: *mut c_int, lib_values: *mut *mut c_void, num_lib: u32) => hooks::libraries::library_load;
            // Limits: a larger stack takes device memory at the call.
            cuCtxSetLimit = "cuCtxSetLimit" @ 3010 : (limit: c_int, value: usize) => hooks::limits::ctx_set_limit;
            // Pools.
            cuMemPoolDestroy = "cuMemPoolDestroy" @ 11020 : (pool: Handle) => hooks::pools::mem_pool_destroy;
            cuMemPoolTrimTo = "cuMemPoolTrimTo" @ 11020 : (pool: Handle, keep: usize) => hooks::pools::mem_pool_trim_to;
            // Contexts.
            cuDevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" @ 7000 :
                (pctx: Out<Handle>, dev: c_int) => hooks::primary::primary_ctx_retain;
            cuDevicePrimaryCtxRelease = "cuDevicePrimaryCtxRelease" @ 7000 : (dev: c_int) => hooks::primary::primary_ctx_release;
            // Green contexts (CUDA 12.4): each retains its device's primary context.
            cuGreenCtxCreate = "cuGreenCtxCreate" @ 12040 :
                (ph: Out<Handle>, desc: Handle, dev: c_int, flags: u32) => hooks::green::green_ctx_create;
            cuGreenCtxDestroy = "cuGreenCtxDestroy" @ 12040 : (green: Handle) => hooks::green::green_ctx_destroy;
            cuDevicePrimaryCtxRelease_v2 = "cuDevicePrimaryCtxRelease" @ 11000 : (dev: c_int) => hooks::primary::primary_ctx_release;
            cuDevicePrimaryCtxReset = "cuDevicePrimaryCtxReset" @ 7000 : (dev: c_int) => hooks::primary::primary_ctx_reset;
            cuDevicePrimaryCtxReset_v2 = "cuDevicePrimaryCtxReset" @ 11000 : (dev: c_int) => hooks::primary::primary_ctx_reset;
            cuCtxCreate = "cuCtxCreate" @ 2000 : (pctx: Out<Handle>, flags: u32, dev: c_int) => hooks::contexts::ctx_create;
            cuCtxCreate_v2 = "cuCtxCreate" @ 3020 : (pctx: Out<Handle>, flags: u32, dev: c_int) => hooks::contexts::ctx_create;
            cuCtxCreate_v3 = "cuCtxCreate" @ 11040 :
                (pctx: Out<Handle>, params: *mut c_void, count: c_int, flags: u32, dev: c_int) => hooks::contexts::ctx_create_v3;
            cuCtxCreate_v4 = "cuCtxCreate" @ 12050 :
                (pctx: Out<Handle>, params: *mut c_void, flags: u32, dev: c_int) => hooks::contexts::ctx_create_v4;
            cuCtxDestroy = "cuCtxDestroy" @ 2000 : (ctx: Handle) => hooks::contexts::ctx_destroy;
            cuCtxDestroy_v2 = "cuCtxDestroy" @ 4000 : (ctx: Handle) => hooks::contexts::ctx_destroy;
            cuCtxDetach = "cuCtxDetach" @ 2000 : (ctx: Handle) => hooks::contexts::ctx_detach;
            // What is current on a thread: the device its allocations are charged to.
            cuCtxSetCurrent = "cuCtxSetCurrent" @ 4000 : (ctx: Handle) => hooks::current::ctx_set_current;
            cuCtxPushCurrent = "cuCtxPushCurrent" @ 2000 : (ctx: Handle) => hooks::current::ctx_push_current;
            cuCtxPushCurrent_v2 = "cuCtxPushCurrent" @ 4000 : (ctx: Handle) => hooks::current::ctx_push_current;
            cuCtxPopCurrent = "cuCtxPopCurrent" @ 2000 : (pctx: Out<Handle>) => hooks::current::ctx_pop_current;
            cuCtxPopCurrent_v2 = "cuCtxPopCurrent" @ 4000 : (pctx: Out<Handle>) => hooks::current::ctx_pop_current;
            // The deprecated graphics-interop creators make and push a context: followed (what is
            // current on the thread is asked again), not charged.
            cuGLCtxCreate = "cuGLCtxCreate" @ 2000 : (pctx: Out<Handle>, flags: u32, dev: c_int) => hooks::current::gl_ctx_create;
            cuGLCtxCreate_v2 = "cuGLCtxCreate" @ 3020 : (pctx: Out<Handle>, flags: u32, dev: c_int) => hooks::current::gl_ctx_create;
            cuVDPAUCtxCreate = "cuVDPAUCtxCreate" @ 3010 :
                (pctx: Out<Handle>, flags: u32, dev: c_int, vdp: u32, get: *mut c_void) => hooks::current::vdpau_ctx_create;
            cuVDPAUCtxCreate_v2 = "cuVDPAUCtxCreate" @ 3020 :
                (pctx: Out<Handle>, flags: u32, dev: c_int, vdp: u32, get: *mut c_void) => hooks::current::vdpau_ctx_create;
            // The CUDA 2.x/3.0 variants with 32-bit sizes and pointers, still exported and still
            // what cuGetProcAddress answers for versions before 3020.
            cuMemAlloc = "cuMemAlloc" @ 2000 : (dptr: Out<u32>, size: u32) => hooks::memory::mem_alloc_v1;
            cuMemAllocPitch = "cuMemAllocPitch" @ 2000 :
                (dptr: Out<u32>, pitch: Out<u32>, width: u32, height: u32, elem: u32) => hooks::memory::mem_alloc_pitch;
            cuMemFree = "cuMemFree" @ 2000 : (dptr: u32) => hooks::memory::mem_free;
            cuMemGetInfo = "cuMemGetInfo" @ 2000 : (free: Out<u32>, total: Out<u32>) => hooks::info::mem_get_info;
            cuDeviceTotalMem = "cuDeviceTotalMem" @ 2000 : (bytes: Out<u32>, dev: c_int) => hooks::info::device_total_mem;
            cuArrayCreate = "cuArrayCreate" @ 2000 :
                (handle: Out<Handle>, desc: In<ArrayDescriptorV1>) => hooks::arrays::array_create_v1;
            cuArray3DCreate = "cuArray3DCreate" @ 2000 :
                (handle: Out<Handle>, desc: In<Array3DDescriptorV1>) => hooks::arrays::array_3d_create_v1;
            // Synchronisations: where pools give memory back (re-read then).
            cuStreamSynchronize = "cuStreamSynchronize" @ 2000 : (stream: Stream) => hooks::sync::stream_synchronize;
            cuStreamSynchronize_ptsz = "cuStreamSynchronize" @ 7000 ptsz : (stream: Stream) => hooks::sync::stream_synchronize;
            cuCtxSynchronize = "cuCtxSynchronize" @ 2000 : () => hooks::sync::ctx_synchronize;
            cuCtxSynchronize_v2 = "cuCtxSynchronize" @ 13000 : (ctx: Handle) => hooks::sync::handle_synchronize;
            cuEventSynchronize = "cuEventSynchronize" @ 2000 : (event: Handle) => hooks::sync::handle_synchronize;
            // CUDA graph memory (graph memory nodes): charged as the driver reserves it, around
            // the calls that may move the device's figure. `cuGraphInstantiateWithFlags` is also
            // what the driver hands out for `cuGraphInstantiate` from version 12000 on.
            cuGraphInstantiate = "cuGraphInstantiate" @ 10000 :
                (exec: Out<Handle>, graph: Handle, err_node: Out<Handle>, log: *mut c_char, size: usize) => hooks::graphs::graph_instantiate;
            cuGraphInstantiate_v2 = "cuGraphInstantiate" @ 11000 :
                (exec: Out<Handle>, graph: Handle, err_node: Out<Handle>, log: *mut c_char, size: usize) => hooks::graphs::graph_instantiate;
            cuGraphInstantiateWithFlags = "cuGraphInstantiate" @ 12000 :
                (exec: Out<Handle>, graph: Handle, flags: u64) => hooks::graphs::graph_instantiate_with_flags;
            cuGraphInstantiateWithParams = "cuGraphInstantiateWithParams" @ 12000 :
                (exec: Out<Handle>, graph: Handle, params: *mut InstantiateParams) => hooks::graphs::graph_instantiate_with_params;
            cuGraphInstantiateWithParams_ptsz = "cuGraphInstantiateWithParams" @ 12000 ptsz :
                (exec: Out<Handle>, graph: Handle, params: *mut InstantiateParams) => hooks::graphs::graph_instantiate_with_params;
            // A graph's kernel node: its kernel is loaded into its context for the graph
            // (measured before the driver's call, as a first use).
            cuGraphAddKernelNode = "cuGraphAddKernelNode" @ 10000 :
                (node: Out<Handle>, graph: Handle, deps: *const Handle, n: usize, params: In<KernelNodeParamsV1>) => hooks::graphs::graph_add_kernel_node_v1;
            cuGraphExecKernelNodeSetParams = "cuGraphExecKernelNodeSetParams" @ 10010 :
                (exec: Handle, node: Handle, params: In<KernelNodeParamsV1>) => hooks::graphs::graph_exec_kernel_node_set_params_v1;
            cuGraphAddKernelNode_v2 = "cuGraphAddKernelNode" @ 12000 :
                (node: Out<Handle>, graph: Handle, deps: *const Handle, n: usize, params: In<KernelNodeParams>) => hooks::graphs::graph_add_kernel_node;
            cuGraphExecKernelNodeSetParams_v2 = "cuGraphExecKernelNodeSetParams" @ 12000 :
                (exec: Handle, node: Handle, params: In<KernelNodeParams>) => hooks::graphs::graph_exec_kernel_node_set_params;
            // CUDA 12.2's generic node calls: a kernel node's kernel loaded first alike.
            cuGraphAddNode = "cuGraphAddNode" @ 12020 :
                (node: Out<Handle>, graph: Handle, deps: *const Handle, n: usize, params: In<GraphNodeParamsHead>) => hooks::graphs::graph_add_node;
            cuGraphAddNode_v2 = "cuGraphAddNode" @ 12030 :
                (node: Out<Handle>, graph: Handle, deps: *const Handle, edges: *const c_void, n: usize, params: In<GraphNodeParamsHead>) => hooks::graphs::graph_add_node_v2;
            cuGraphAddNode_v3 = "cuGraphAddNode" @ 13040 :
                (node: Out<Handle>, graph: Handle, deps: *const Handle, edges: *const c_void, n: usize, params: In<GraphNodeParamsHead>) => hooks::graphs::graph_add_node_v2;
            // A graph's own node given another kernel: loaded first alike, so that no graph
            // holds a kernel gpucap has not loaded (an exec updated from it takes it).
            cuGraphKernelNodeSetParams = "cuGraphKernelNodeSetParams" @ 10000 :
                (node: Handle, params: In<KernelNodeParamsV1>) => hooks::graphs::graph_kernel_node_set_params_v1;
            cuGraphKernelNodeSetParams_v2 = "cuGraphKernelNodeSetParams" @ 12000 :
                (node: Handle, params: In<KernelNodeParams>) => hooks::graphs::graph_kernel_node_set_params;
            cuGraphNodeSetParams = "cuGraphNodeSetParams" @ 12020 :
                (node: Handle, params: In<GraphNodeParamsHead>) => hooks::graphs::graph_node_set_params;
            cuGraphNodeSetParams_v2 = "cuGraphNodeSetParams" @ 13040 :
                (node: Handle, params: In<GraphNodeParamsHead>) => hooks::graphs::graph_node_set_params;
            cuGraphExecNodeSetParams = "cuGraphExecNodeSetParams" @ 12020 :
                (exec: Handle, node: Handle, params: In<GraphNodeParamsHead>) => hooks::graphs::graph_exec_node_set_params;
            cuGraphUpload = "cuGraphUpload" @ 11010 : (exec: Handle, stream: Stream) => hooks::graphs::graph_upload;
            cuGraphUpload_ptsz = "cuGraphUpload" @ 11010 ptsz : (exec: Handle, stream: Stream) => hooks::graphs::graph_upload;
            cuGraphLaunch = "cuGraphLaunch" @ 10000 : (exec: Handle, stream: Stream) => hooks::graphs::graph_launch;
            cuGraphLaunch_ptsz = "cuGraphLaunch" @ 10000 ptsz : (exec: Handle, stream: Stream) => hooks::graphs::graph_launch;
            cuGraphExecDestroy = "cuGraphExecDestroy" @ 10000 : (exec: Handle) => hooks::graphs::graph_exec_destroy;
            cuDeviceGraphMemTrim = "cuDeviceGraphMemTrim" @ 11040 : (dev: c_int) => hooks::graphs::device_graph_mem_trim;
            // NVML (looked up with dlsym on libnvidia-ml; NVML has no cuGetProcAddress).
            nvmlDeviceGetMemoryInfo = "nvmlDeviceGetMemoryInfo" @ 0 :
                (device: Handle, memory: Out<NvmlMemory>) => hooks::nvml::nvml_memory_info;
            nvmlDeviceGetMemoryInfo_v2 = "nvmlDeviceGetMemoryInfo_v2" @ 0 :
                (device: Handle, memory: Out<NvmlMemoryV2>) => hooks::nvml::nvml_memory_info;
            nvmlDeviceGetComputeRunningProcesses = "nvmlDeviceGetComputeRunningProcesses" @ 0 :
                (device: Handle, count: Out<u32>, infos: OutArray<NvmlProcessV1>) => hooks::nvml::nvml_compute_processes;
            nvmlDeviceGetComputeRunningProcesses_v2 = "nvmlDeviceGetComputeRunningProcesses_v2" @ 0 :
                (device: Handle, count: Out<u32>, infos: OutArray<NvmlProcessV2>) => hooks::nvml::nvml_compute_processes;
            // `_v3` fills the same 24-byte nvmlProcessInfo_t as `_v2` (see gpucap_core::nvml).
            nvmlDeviceGetComputeRunningProcesses_v3 = "nvmlDeviceGetComputeRunningProcesses_v3" @ 0 :
                (device: Handle, count: Out<u32>, infos: OutArray<NvmlProcessV2>) => hooks::nvml::nvml_compute_processes;
            nvmlDeviceGetRunningProcessDetailList = "nvmlDeviceGetRunningProcessDetailList" @ 0 :
                (device: Handle, list: Out<NvmlProcessDetailList>) => hooks::nvml::nvml_process_detail_list;
        }
    };
}
pub(crate) use hooked;

/// One hooked driver function: its names, and the driver's function once known.
pub struct Slot {
    /// The exported variant this row stands for, NUL-terminated (`cuMemAlloc_v2\0`).
    pub name: &'static str,
    /// The name `cuGetProcAddress` is asked for (`cuMemAlloc`).
    pub base: &'static str,
    /// The CUDA version that introduced this variant (`3020`).
    pub since: i32,
    /// Whether this is the per-thread-default-stream variant (`_ptsz`/`_ptds`).
    pub per_thread: bool,
    /// The driver's function of the same name, once known.
    real: AtomicPtr<c_void>,
}

impl Slot {
    pub fn name_bytes(&self) -> &'static [u8] {
        &self.name.as_bytes()[..self.name.len() - 1]
    }

    /// The driver's function as known now (null: not looked up yet), looking nothing up.
    pub fn known(&self) -> *mut c_void {
        self.real.load(Acquire)
    }

    /// The driver's function, resolved on first use; null when the driver lacks it.
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
        // `driver_symbol` never answers one of our exports; a main program's address
        // (a non-PIE program's canonical PLT entry) leads back to the hook.
        let found = driver_symbol(self.name);
        if !in_main_program(found) {
            self.record(found);
        }
        self.real.load(Acquire)
    }

    /// Records `p` as the driver's function unless one is known; the caller has checked
    /// that `p` is not one of our hooks (see `table::never_the_driver`).
    pub fn record(&self, p: *mut c_void) {
        if !p.is_null() {
            let _ = self.real.compare_exchange(null_mut(), p, AcqRel, Acquire);
        }
    }
}

/// Makes [`Row`], [`SLOTS`] and [`real`] from the rows.
macro_rules! slots {
    ($( $sym:ident = $base:literal @ $since:literal $($ptsz:ident)? : ($($arg:ident : $ty:ty),*) => $hook:path; )*) => {
        /// The rows, in order: `SLOTS[Row::cuMemAlloc_v2 as usize]`.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy)]
        pub enum Row { $($sym),* }

        pub const ROWS: usize = [$(stringify!($sym)),*].len();

        pub static SLOTS: [Slot; ROWS] = [$(
            Slot {
                name: concat!(stringify!($sym), "\0"),
                base: $base,
                since: $since,
                per_thread: slots!(@ptsz $($ptsz)?),
                real: AtomicPtr::new(null_mut()),
            }
        ),*];

        /// The driver's hooked functions, called by the shim itself: `None` when the
        /// driver lacks the function, else its result.
        pub mod real {
            use super::*;
            use crate::driver::forward::Real;
            $(
                #[allow(non_snake_case, dead_code, clippy::too_many_arguments)]
                pub fn $sym($($arg: $ty),*) -> Option<CuResult> {
                    let p = SLOTS[Row::$sym as usize].real();
                    // SAFETY: `p` is the driver's export of this very name, whose C
                    // signature is the one this row declares.
                    (!p.is_null()).then(|| unsafe { Real::<($($ty,)*)>::from_raw(p) }.call($($arg),*))
                }
            )*
        }
    };
    (@ptsz ptsz) => { true };
    (@ptsz) => { false };
}

hooked!(slots);
