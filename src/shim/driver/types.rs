//! The driver API's C types as the shim sees them: result codes, handles and the
//! descriptor structs.
//!
//! Structs the driver writes and that hold no enum come from cudarc's `driver::sys`
//! (`CUDA_ARRAY_MEMORY_REQUIREMENTS`; `CUmemAllocationProp` and `CUmemAccessDesc`,
//! which the shim itself fills, in `hooks/arena.rs`). The descriptors a hook reads from
//! the *program's* memory are declared here with their enum fields as integers: cudarc
//! gives those fields Rust enums (`CUarray_format`, `CUmemLocationType`), and a value
//! outside the enum — an invalid or newer one the driver would answer with its own
//! error — would be undefined behaviour in Rust before the driver ever saw it. The
//! CUDA 2.x `_v1` descriptors (32-bit sizes) are not in cudarc at all.

use std::ffi::{c_int, c_void};

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

pub type Dptr = u64;
pub type Stream = *mut c_void;
pub type Handle = *mut c_void;

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Array3DDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (CUDA 2.x: 32-bit sizes).
#[repr(C)]
pub struct ArrayDescriptorV1 {
    pub width: u32,
    pub height: u32,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1`.
#[repr(C)]
pub struct Array3DDescriptorV1 {
    pub width: u32,
    pub height: u32,
    pub depth: u32,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`, written by the driver.
pub use cudarc::driver::sys::CUDA_ARRAY_MEMORY_REQUIREMENTS as MemoryRequirements;

/// The leading fields shared by `CUmemAllocationProp` and `CUmemPoolProps`: two
/// enums, then the `CUmemLocation`. Read as integers, so an unknown enum value from
/// the caller is harmless.
#[repr(C)]
pub struct LocationPrefix {
    pub kind: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: c_int,
}

/// `CUmemLocationType`: a device, or host memory (pinned, of a NUMA node, of the
/// calling thread's NUMA node).
pub const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: u32 = 4;

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1, 120 bytes): the pool's properties (88 bytes, the
/// location first, as [`LocationPrefix`]), access descriptors, the size and the address.
#[repr(C)]
pub struct MemAllocNodeParams {
    pub pool_props: LocationPrefix,
    pub pool_props_rest: [u8; 72],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: Dptr,
}

const _: () = assert!(std::mem::size_of::<MemAllocNodeParams>() == 120);

/// `CUgraphNodeType`: a child graph, a memory allocation.
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;
