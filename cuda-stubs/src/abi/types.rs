//! The C types and enum values of the driver API that the fake reads and writes (CUDA 12.9
//! layouts, unchanged in 13.x): handles, descriptors, flags.

use libc::{c_int, c_uint, c_void};

/// CUdeviceptr: a device address (in the fake, the host address of the memory).
pub type CUdeviceptr = u64;

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

/// CUmemAccessDesc.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

const _: () = assert!(std::mem::size_of::<CUmemAllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<CUmemAccessDesc>() == 12);

// CUmemLocationType
pub const CU_MEM_LOCATION_TYPE_NONE: c_int = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: c_int = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: c_int = 4;
pub const CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN: c_int = 6;

// CUmemAllocationType
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
pub const CU_MEM_ALLOCATION_TYPE_MANAGED: c_int = 2;

/// CUmemAllocationHandleType: a POSIX file descriptor.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;

// CUmemAccess_flags
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: c_int = 0;
pub const CU_MEM_ACCESS_FLAGS_PROT_READ: c_int = 1;
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;

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

const _: () = assert!(std::mem::size_of::<CUmemPoolProps>() == 88);

/// CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS (CUmemPoolProps.usage).
pub const CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS: u16 = 2;

// CUmemPool_attribute
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: c_int = 4;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: c_int = 6;
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: c_int = 7;
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: c_int = 8;
// Added by CUDA 13.2 (read-only): the pool's kind and where it lives.
pub const CU_MEMPOOL_ATTR_ALLOCATION_TYPE: c_int = 9;
pub const CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES: c_int = 10;
pub const CU_MEMPOOL_ATTR_LOCATION_ID: c_int = 11;
pub const CU_MEMPOOL_ATTR_LOCATION_TYPE: c_int = 12;
pub const CU_MEMPOOL_ATTR_MAX_POOL_SIZE: c_int = 13;
pub const CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED: c_int = 14;
// Added by CUDA 13.4 (read-only): -1 when the pool is not localized.
pub const CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID: c_int = 15;

/// CUDA_ARRAY_DESCRIPTOR (v2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// CUDA_ARRAY3D_DESCRIPTOR (v2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaArray3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

// CUDA_ARRAY3D_DESCRIPTOR flags
pub const CUDA_ARRAY3D_LAYERED: c_uint = 0x01;
pub const CUDA_ARRAY3D_CUBEMAP: c_uint = 0x04;
pub const CUDA_ARRAY3D_SPARSE: c_uint = 0x40;
pub const CUDA_ARRAY3D_DEFERRED_MAPPING: c_uint = 0x80;
/// The flags of an array that takes no memory of its own (memory is mapped into it with
/// `cuMemMapArrayAsync`).
pub const CUDA_ARRAY3D_MAPPED: c_uint = CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING;

/// CUgraphNodeParams (CUDA 12.2): a node's type, then its parameters (a union of 232 bytes
/// at offset 16: the node type's own parameter struct), then a reserved word.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUgraphNodeParams {
    /// CUgraphNodeType: KERNEL 0, MEMCPY 1, MEMSET 2, ..., MEM_ALLOC 10, MEM_FREE 11.
    pub type_: c_int,
    pub reserved0: [c_int; 3],
    pub params: [u64; 29],
    pub reserved2: i64,
}
const _: () = assert!(std::mem::size_of::<CUgraphNodeParams>() == 256);

/// CUarrayMapInfo (CUDA 11.1): one step of `cuMemMapArrayAsync`. `subresource` is the
/// union of `sparseLevel` (eight u32: level, layer, offset x y z, extent w h d) and
/// `miptail` (u32 layer, u64 offset, u64 size), as eight native-endian words.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUarrayMapInfo {
    /// CU_RESOURCE_TYPE_ARRAY 0, CU_RESOURCE_TYPE_MIPMAPPED_ARRAY 1.
    pub resource_type: c_int,
    pub resource: usize,
    /// CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL 0, _MIPTAIL 1.
    pub subresource_type: c_int,
    pub subresource: [u64; 4],
    /// CU_MEM_OPERATION_TYPE_MAP 1, _UNMAP 2.
    pub mem_operation_type: c_int,
    /// CU_MEM_HANDLE_TYPE_GENERIC 0.
    pub mem_handle_type: c_int,
    pub mem_handle: u64,
    pub offset: u64,
    pub device_bit_mask: c_uint,
    pub flags: c_uint,
    pub reserved: [c_uint; 2],
}
const _: () = assert!(std::mem::size_of::<CUarrayMapInfo>() == 96);

/// CUDA_ARRAY_MEMORY_REQUIREMENTS.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaArrayMemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [c_uint; 4],
}

const _: () = assert!(std::mem::size_of::<CudaArrayMemoryRequirements>() == 32);

/// CUipcMemHandle: 64 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

/// CU_STREAM_CAPTURE_STATUS_NONE.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// CU_STREAM_CAPTURE_MODE_GLOBAL, the default mode of a thread.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: c_int = 0;
/// CU_STREAM_CAPTURE_MODE_RELAXED, the last valid mode.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// CUhostFn.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;
/// CUstreamCallback: (stream, status, user data).
pub type StreamCallback = Option<unsafe extern "C" fn(usize, u32, *mut c_void)>;

/// `CUexternalMemoryHandleType`: an fd (Linux), Windows handles, D3D resources, NvSciBuf.
pub const CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD: c_int = 1;
pub const CU_EXTERNAL_MEMORY_HANDLE_TYPE_NVSCIBUF: c_int = 8;
/// `CUDA_EXTERNAL_MEMORY_DEDICATED`, the one flag of a handle description.
pub const CUDA_EXTERNAL_MEMORY_DEDICATED: u32 = 1;

/// `CUDA_EXTERNAL_MEMORY_HANDLE_DESC`: the handle (at offset 8) is a union of an fd, a
/// Windows (handle, name) pair and an NvSciBuf object; only the fd is read here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
    pub type_: c_int,
    pub handle: [u64; 2],
    pub size: u64,
    pub flags: u32,
    pub reserved: [u32; 16],
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
    pub offset: u64,
    pub size: u64,
    pub flags: u32,
    pub reserved: [u32; 16],
}
/// CU_STREAM_CAPTURE_STATUS_ACTIVE.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
/// CU_STREAM_CAPTURE_STATUS_INVALIDATED: a capture an unsafe call ended (its end fails).
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: c_int = 2;

/// CUDA_MEM_ALLOC_NODE_PARAMS (v1, 120 bytes): `dptr` is written by the driver.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaMemAllocNodeParams {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const CUmemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

const _: () = assert!(std::mem::size_of::<CudaMemAllocNodeParams>() == 120);

/// CUDA_KERNEL_NODE_PARAMS_v1 (56 bytes): what `cuGraphAddKernelNode` (CUDA 10) reads.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaKernelNodeParamsV1 {
    pub func: usize,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

const _: () = assert!(std::mem::size_of::<CudaKernelNodeParamsV1>() == 56);

/// CUDA_KERNEL_NODE_PARAMS_v2 (72 bytes, `cuGraphAddKernelNode_v2`): v1 and then `kern`,
/// launched when `func` is NULL, in `ctx` (NULL: the current context; ignored with `func`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaKernelNodeParams {
    pub v1: CudaKernelNodeParamsV1,
    pub kern: usize,
    pub ctx: usize,
}

const _: () = assert!(std::mem::size_of::<CudaKernelNodeParams>() == 72);

/// CUmemorytype.
pub const CU_MEMORYTYPE_HOST: c_int = 1;
pub const CU_MEMORYTYPE_DEVICE: c_int = 2;
pub const CU_MEMORYTYPE_UNIFIED: c_int = 4;

/// One side of a CUDA_MEMCPY3D (88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Memcpy3dSide {
    pub x_in_bytes: usize,
    pub y: usize,
    pub z: usize,
    pub lod: usize,
    pub memory_type: c_int,
    pub host: usize,
    pub device: CUdeviceptr,
    pub array: usize,
    pub reserved: usize,
    pub pitch: usize,
    pub height: usize,
}

/// CUDA_MEMCPY3D (v2, 200 bytes): source, destination, then the extent.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaMemcpy3d {
    pub src: Memcpy3dSide,
    pub dst: Memcpy3dSide,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

const _: () = assert!(std::mem::size_of::<CudaMemcpy3d>() == 200);

/// CUDA_MEMSET_NODE_PARAMS (v1, 40 bytes): `width` elements of `element_size` bytes (1, 2
/// or 4) per row, `height` rows `pitch` bytes apart (the pitch unused for one row).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaMemsetNodeParams {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: c_uint,
    pub element_size: c_uint,
    pub width: usize,
    pub height: usize,
}

const _: () = assert!(std::mem::size_of::<CudaMemsetNodeParams>() == 40);

/// CUDA_GRAPH_INSTANTIATE_PARAMS (32 bytes): `err_node_out` and `result_out` are written.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaGraphInstantiateParams {
    pub flags: u64,
    pub upload_stream: usize,
    pub err_node_out: usize,
    pub result_out: c_int,
}

const _: () = assert!(std::mem::size_of::<CudaGraphInstantiateParams>() == 32);

// CUgraphNodeType: the kinds of node the fake makes.
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub const CU_GRAPH_NODE_TYPE_MEMCPY: c_int = 1;
pub const CU_GRAPH_NODE_TYPE_MEMSET: c_int = 2;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
pub const CU_GRAPH_NODE_TYPE_MEM_FREE: c_int = 11;

// CUgraphInstantiate_flags
pub const CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: u64 = 1;
pub const CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD: u64 = 2;

// CUgraphMem_attribute
pub const CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: c_int = 0;
pub const CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: c_int = 1;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: c_int = 2;
pub const CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: c_int = 3;
