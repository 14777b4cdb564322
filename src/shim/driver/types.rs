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

use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;

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
/// CUDA 13.4's "portion of device memory, specified by the locality domain ID": the
/// location's id is then `localized`, a byte naming the device and one its domain
/// (`{ unsigned char deviceId; unsigned char localityDomainId; }` over the `int id`).
pub const CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN: u32 = 6;

/// The device a `CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN` location names: the first
/// byte of its id (`localized.deviceId`).
pub fn localized_device(id: c_int) -> c_int {
    id.to_ne_bytes()[0] as c_int
}

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
pub const CU_GRAPH_NODE_TYPE_KERNEL: c_int = 0;
pub const CU_GRAPH_NODE_TYPE_GRAPH: c_int = 4;
pub const CU_GRAPH_NODE_TYPE_MEM_ALLOC: c_int = 10;

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`: the flags come first; the rest the driver fills.
#[repr(C)]
pub struct InstantiateParams {
    pub flags: u64,
    pub upload_stream: Stream,
    pub err_node_out: Handle,
    pub result_out: c_int,
}

/// `nvmlProcessDetailList_v1_t`, which `nvmlDeviceGetRunningProcessDetailList` fills:
/// the program sets the version, the mode, the room and the array; the count comes back
/// in `num_proc_array_entries`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessDetailList<'a> {
    pub version: u32,
    pub mode: u32,
    pub num_proc_array_entries: u32,
    pub proc_array: OutArray<'a, gpucap_core::nvml::NvmlProcessDetailV1>,
}

// ---------------------------------------------------------------------------
// Pointer arguments, typed. The hooks receive the program's pointers as these types
// (each `repr(transparent)` over the raw pointer, so the exported symbols keep their C
// signature) and read or write through them without `unsafe`: each access checks for
// null, and the one `unsafe` inside states the driver API's contract it relies on.

/// An out-parameter: where the driver, or a hook in its place, writes one `T`. Made by
/// the program (an argument of a hooked call) or by the shim from `&mut T`.
#[repr(transparent)]
pub struct Out<'a, T>(*mut T, PhantomData<&'a mut T>);

impl<T> Clone for Out<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Out<'_, T> {}

impl<'a, T> From<&'a mut T> for Out<'a, T> {
    fn from(r: &'a mut T) -> Self {
        Out(r, PhantomData)
    }
}

impl<T> Out<'_, T> {
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// Writes `v`; false (nothing written) when the pointer is null.
    pub fn set(self, v: T) -> bool {
        if self.0.is_null() {
            return false;
        }
        // SAFETY: a non-null out-pointer of the driver API points to a writable `T`
        // (the program's contract with the driver), or is the shim's own `&mut T`.
        unsafe { self.0.write(v) };
        true
    }
}

impl<T: Copy> Out<'_, T> {
    /// What the pointer holds now (what the driver wrote, read after it succeeded; or
    /// what the program put there for an in-out parameter); None when null.
    #[inline(always)]
    pub fn get(self) -> Option<T> {
        // SAFETY: as in `set`: a non-null out-pointer points to a `T`, which the hook
        // reads only where the driver has written it or the API has the program fill it.
        (!self.0.is_null()).then(|| unsafe { self.0.read() })
    }
}

/// An array the driver, or a hook in its place, fills: `room` entries, a figure the
/// program gives beside the pointer (NVML's count protocol).
#[repr(transparent)]
pub struct OutArray<'a, T>(*mut T, PhantomData<&'a mut T>);

impl<T> Clone for OutArray<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutArray<'_, T> {}

impl<T> OutArray<'_, T> {
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }

    /// Writes `items` from the first entry on, at most `room` of them (the room the
    /// program said the array has); how many were written. Nothing when null.
    pub fn fill(self, room: u32, items: impl IntoIterator<Item = T>) -> u32 {
        if self.0.is_null() {
            return 0;
        }
        let mut n = 0;
        for item in items.into_iter().take(room as usize) {
            // SAFETY: the program's array holds `room` entries (the API's count
            // protocol); `n < room`. Unaligned: written as the driver would, byte-wise
            // where the program's struct is packed.
            unsafe { self.0.add(n as usize).write_unaligned(item) };
            n += 1;
        }
        n
    }
}

/// A descriptor the program passes for the hook (and the driver) to read.
#[repr(transparent)]
pub struct In<'a, T>(*const T, PhantomData<&'a T>);

impl<T> Clone for In<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for In<'_, T> {}

impl<'a, T> From<&'a T> for In<'a, T> {
    fn from(r: &'a T) -> Self {
        In(r, PhantomData)
    }
}

impl<'a, T> In<'a, T> {
    /// The descriptor; None when null.
    pub fn get(self) -> Option<&'a T> {
        // SAFETY: a non-null descriptor pointer of the driver API points to a valid,
        // aligned `T` that the program keeps for the call (the driver reads it too).
        unsafe { self.0.as_ref() }
    }
}

/// `CUgraphNodeParams` (CUDA 12.2, `cuGraphAddNode`, `cuGraphExecNodeSetParams`) through its
/// first bytes: the node's type and, for a kernel node (type 0), the union's
/// `CUDA_KERNEL_NODE_PARAMS_v3` (the `_v2` layout). The whole struct is 256 bytes, so a
/// pointer to one points to a valid head.
#[repr(C)]
pub struct GraphNodeParamsHead {
    pub node_type: c_int,
    pub reserved: [c_int; 3],
    pub kernel: KernelNodeParams,
}
// The header's layout, as cudarc's bindings of cuda.h give it.
const _: () = {
    use cudarc::driver::sys::CUgraphNodeParams as C;
    use std::mem::{offset_of, size_of};
    assert!(size_of::<GraphNodeParamsHead>() <= size_of::<C>());
    assert!(offset_of!(GraphNodeParamsHead, kernel) == offset_of!(C, __bindgen_anon_1));
};

/// An array of descriptors the program passes (`count` of them, its own argument) for the
/// hook and the driver to read.
#[repr(transparent)]
pub struct InArray<'a, T>(*const T, PhantomData<&'a [T]>);

impl<T> Clone for InArray<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for InArray<'_, T> {}

impl<'a, T> InArray<'a, T> {
    /// The first `n` descriptors; none when null.
    pub fn items(self, n: u32) -> &'a [T] {
        if self.0.is_null() {
            return &[];
        }
        // SAFETY: a non-null array argument of the driver API points to as many valid,
        // aligned `T` as its count argument says, kept by the program for the call.
        unsafe { std::slice::from_raw_parts(self.0, n as usize) }
    }
}

/// The values of a call's options (`void **values`, `n` of them: a module's or
/// library's JIT options, a library's options) as the program passed them, saved before
/// a call the hook may make again: the driver writes outputs into some of them (the log
/// buffers' sizes become the bytes filled, `CU_JIT_THREADS_PER_BLOCK` the count it
/// targeted, `CU_JIT_WALL_TIME`), which the next attempt must not take as its input.
pub struct SavedValues {
    at: *mut *mut c_void,
    values: Vec<*mut c_void>,
}

impl SavedValues {
    /// The `n` values at `at` (none when null, or past any count the driver's options
    /// reach: such a call is the driver's to refuse, nothing is read for it here).
    pub fn save(at: *mut *mut c_void, n: u32) -> Self {
        const MOST: u32 = 1024;
        let values = match at.is_null() || n > MOST {
            true => Vec::new(),
            // SAFETY: a non-null option values array of the driver API holds as many
            // values as its count argument says, kept by the program for the call.
            false => unsafe { std::slice::from_raw_parts(at, n as usize) }.to_vec(),
        };
        SavedValues { at, values }
    }

    /// Puts the saved values back where the program passed them.
    pub fn restore(&self) {
        if !self.at.is_null() {
            // SAFETY: as in `save`: the array holds `values.len()` writable values (the
            // driver writes its outputs there too), and the saved copy is the shim's own.
            unsafe {
                std::ptr::copy_nonoverlapping(self.values.as_ptr(), self.at, self.values.len())
            };
        }
    }
}

/// `CUarrayMapInfo` (CUDA 11.1), one step of `cuMemMapArrayAsync`. `subresource` is the
/// union of `sparseLevel` (eight u32: level, layer, offset x y z, extent w h d) and
/// `miptail` (u32 layer, u64 offset, u64 size), read as four little-endian words.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ArrayMapInfo {
    /// `CU_RESOURCE_TYPE_ARRAY` 0, `CU_RESOURCE_TYPE_MIPMAPPED_ARRAY` 1.
    pub resource_type: c_int,
    pub resource: u64,
    /// `CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL` 0, `_MIPTAIL` 1.
    pub subresource_type: c_int,
    pub subresource: [u64; 4],
    /// `CU_MEM_OPERATION_TYPE_MAP` 1, `_UNMAP` 2.
    pub operation: c_int,
    /// `CU_MEM_HANDLE_TYPE_GENERIC` 0.
    pub handle_type: c_int,
    pub handle: u64,
    pub offset: u64,
    pub device_bit_mask: u32,
    pub flags: u32,
    pub reserved: [u32; 2],
}
// The header's layout, as cudarc's bindings of cuda.h give it.
const _: () = {
    use cudarc::driver::sys::CUarrayMapInfo as C;
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ArrayMapInfo>() == size_of::<C>());
    assert!(offset_of!(ArrayMapInfo, resource) == offset_of!(C, resource));
    assert!(offset_of!(ArrayMapInfo, subresource) == offset_of!(C, subresource));
    assert!(offset_of!(ArrayMapInfo, operation) == offset_of!(C, memOperationType));
    assert!(offset_of!(ArrayMapInfo, handle) == offset_of!(C, memHandle));
};

/// `CUDA_LAUNCH_PARAMS`, one device's launch of `cuLaunchCooperativeKernelMultiDevice`: the
/// function, the grid and block, the shared memory, the stream (its context's device is
/// the launch's), the kernel's parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MultiDeviceLaunch {
    pub function: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Stream,
    pub params: *mut *mut c_void,
}
// The layout, as cudarc's bindings of cuda.h give it.
const _: () = {
    use cudarc::driver::sys::CUDA_LAUNCH_PARAMS as C;
    use std::mem::{offset_of, size_of};
    assert!(size_of::<MultiDeviceLaunch>() == size_of::<C>());
    assert!(offset_of!(MultiDeviceLaunch, function) == offset_of!(C, function));
    assert!(offset_of!(MultiDeviceLaunch, grid) == offset_of!(C, gridDimX));
    assert!(offset_of!(MultiDeviceLaunch, block) == offset_of!(C, blockDimX));
    assert!(offset_of!(MultiDeviceLaunch, shared_mem_bytes) == offset_of!(C, sharedMemBytes));
    assert!(offset_of!(MultiDeviceLaunch, stream) == offset_of!(C, hStream));
    assert!(offset_of!(MultiDeviceLaunch, params) == offset_of!(C, kernelParams));
};

/// `CUmemAllocationProp`, which the shim fills itself, seen through its leading fields
/// (the argument type of the hooked `cuMemCreate`).
impl<'a> From<&'a cudarc::driver::sys::CUmemAllocationProp> for In<'a, LocationPrefix> {
    fn from(prop: &'a cudarc::driver::sys::CUmemAllocationProp) -> Self {
        // `CUmemAllocationProp` begins with `LocationPrefix`'s fields (two enums, then
        // the `CUmemLocation`), so a pointer to it points to a valid prefix.
        In(std::ptr::from_ref(prop).cast(), PhantomData)
    }
}

/// A NUL-terminated string the program passes (a symbol or file name).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct CText<'a>(*const c_char, PhantomData<&'a CStr>);

impl<'a> CText<'a> {
    /// Its bytes, without the NUL; None when null.
    pub fn bytes(self) -> Option<&'a [u8]> {
        // SAFETY: a non-null string argument of the driver API is NUL-terminated and
        // kept by the program for the call.
        (!self.0.is_null()).then(|| unsafe { CStr::from_ptr(self.0) }.to_bytes())
    }
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (`cuGraphKernelNodeGetParams_v2`): the function (or NULL
/// and `kern`), grid, block, shared memory, arguments, the kernel and its context.
#[repr(C)]
pub struct KernelNodeParams {
    pub func: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: Handle,
    pub ctx: Handle,
}

/// `CUDA_KERNEL_NODE_PARAMS_v1` (CUDA 10's `cuGraphAddKernelNode`) through its leading
/// field, the function (the rest is the driver's to read).
#[repr(C)]
pub struct KernelNodeParamsV1 {
    pub func: Handle,
}

/// `CUlaunchConfig` (`cuLaunchKernelEx`) through its leading fields: grid, block, dynamic
/// shared memory and the stream the launch is made on.
#[repr(C)]
pub struct LaunchConfigHead {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: Stream,
}
