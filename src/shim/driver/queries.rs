//! The real driver behind the safe modules: the queries `pools`, `contexts`,
//! `identity` and the array and teardown hooks need, each a plain driver call. A
//! driver that lacks a function answers "unknown" (None), and the callers then keep
//! the charge they have: never less than what is allocated.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;

use super::calls;
use super::hooked::{Row, SLOTS, real};
use super::types::{
    Array3DDescriptor, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, Handle,
    MemoryRequirements, Out,
};
use gpucap_core::contexts::{Ctx, CtxDriver};
use gpucap_core::nvml::{NvmlGpu, NvmlMig, PciInfo};

/// `CUDA_ERROR_INVALID_HANDLE`, `CUDA_ERROR_INVALID_CONTEXT`, `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
const CUDA_ERROR_INVALID_HANDLE: u32 = 400;
const CUDA_ERROR_INVALID_CONTEXT: u32 = 201;
const CUDA_ERROR_CONTEXT_IS_DESTROYED: u32 = 709;
use gpucap_core::pools::{LocationAnswer, PoolDriver, PoolLocation, PoolLocator};

/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`,
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (cuuint64_t).
const RELEASE_THRESHOLD: c_int = 4;
const RESERVED_MEM_CURRENT: c_int = 5;
const USED_MEM_CURRENT: c_int = 7;
/// CUDA 13's `CU_MEMPOOL_ATTR_LOCATION_ID` and `CU_MEMPOOL_ATTR_LOCATION_TYPE` (int).
const LOCATION_ID: c_int = 11;
const LOCATION_TYPE: c_int = 12;
/// `CUmemLocationType`: DEVICE, then HOST, HOST_NUMA, HOST_NUMA_CURRENT, INVISIBLE.
const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST: c_int = 2;
const LOCATION_HOST_NUMA_CURRENT: c_int = 4;
const LOCATION_INVISIBLE: c_int = 5;

/// The UUIDs of the visible CUDA devices, by ordinal. Calls `cuInit(0)` first (it is
/// idempotent); NVML hooks reach this only when the program initialised CUDA itself.
pub fn visible_uuids() -> Option<Vec<[u8; 16]>> {
    let uuid = calls::cuDeviceGetUuid_v2().or_else(calls::cuDeviceGetUuid)?;
    let mut n: c_int = 0;
    if real::cuInit(0)? != CUDA_SUCCESS
        || calls::cuDeviceGetCount(Out::from(&mut n))? != CUDA_SUCCESS
    {
        return None;
    }
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        (0..n.max(0))
            .map(|d| {
                let mut u = [0u8; 16];
                (uuid(&mut u, d) == CUDA_SUCCESS).then_some(u)
            })
            .collect()
    }
}

/// The pool `cuMemAllocAsync` takes from on `device` (its current pool).
pub fn current_pool(device: c_int) -> Option<u64> {
    let get = calls::cuDeviceGetMemPool()?;
    let mut pool: Handle = null_mut();
    // SAFETY: valid out-pointer.
    (unsafe { get(&mut pool, device) } == CUDA_SUCCESS && !pool.is_null()).then_some(pool as u64)
}

/// The device of a stream's context (cuMemAllocAsync takes from that device's current
/// pool); None if the driver cannot say (an invalid stream: its own error follows).
pub fn stream_device(stream: Handle) -> Option<c_int> {
    let mut dev: c_int = -1;
    if let Some(get) = calls::cuStreamGetDevice() {
        // SAFETY: valid out-pointer; the caller's stream.
        return (unsafe { get(stream, &mut dev) } == CUDA_SUCCESS).then_some(dev);
    }
    // Before CUDA 12.8: the stream's context, and its device.
    let ctx = stream_context(stream)?;
    let current = calls::cuCtxGetCurrent()?;
    let mut cur: Handle = null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { current(&mut cur) } == CUDA_SUCCESS && cur == ctx {
        let rc = calls::cuCtxGetDevice(Out::from(&mut dev))?;
        return (rc == CUDA_SUCCESS).then_some(dev);
    }
    context_device(ctx).and_then(|d| c_int::try_from(d).ok())
}

/// The context a stream belongs to; None if the driver cannot say (an invalid stream: its
/// own error follows).
pub fn stream_context(stream: Handle) -> Option<Handle> {
    let get = calls::cuStreamGetCtx()?;
    let mut ctx: Handle = null_mut();
    // SAFETY: a valid out-pointer; the caller's stream.
    (unsafe { get(stream, &mut ctx) } == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

/// The default pool of `device`.
fn default_pool(device: c_int) -> Option<u64> {
    let get = calls::cuDeviceGetDefaultMemPool()?;
    let mut pool: Handle = null_mut();
    // SAFETY: valid out-pointer.
    (unsafe { get(&mut pool, device) } == CUDA_SUCCESS && !pool.is_null()).then_some(pool as u64)
}

/// Frees a pool allocation the shim refuses after the fact.
pub fn free_async(ptr: u64, stream: *mut c_void) {
    // Freeing the allocation the driver just made, on the caller's stream.
    let _ = real::cuMemFreeAsync(ptr, stream);
}

/// The driver's pools.
pub struct Pools;

fn pool_attribute(pool: u64, attr: c_int) -> Option<u64> {
    let get = calls::cuMemPoolGetAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: the attributes asked here are cuuint64_t, written to a valid out-pointer.
    (unsafe { get(pool as Handle, attr, (&mut v as *mut u64).cast()) } == CUDA_SUCCESS).then_some(v)
}

fn pool_int_attribute(pool: u64, attr: c_int) -> Option<c_int> {
    let get = calls::cuMemPoolGetAttribute()?;
    let mut v: c_int = 0;
    // SAFETY: both location attributes are `int`-sized, written to a valid out-pointer.
    (unsafe { get(pool as Handle, attr, (&mut v as *mut c_int).cast()) } == CUDA_SUCCESS)
        .then_some(v)
}

impl PoolLocator for Pools {
    fn location(&self, pool: u64) -> LocationAnswer {
        match pool_int_attribute(pool, LOCATION_TYPE) {
            Some(LOCATION_DEVICE) => match pool_int_attribute(pool, LOCATION_ID)
                .and_then(|id| usize::try_from(id).ok())
            {
                Some(d) => LocationAnswer::At(PoolLocation::Device(d)),
                None => LocationAnswer::Silent,
            },
            Some(LOCATION_HOST..=LOCATION_HOST_NUMA_CURRENT) => {
                LocationAnswer::At(PoolLocation::Host)
            }
            Some(LOCATION_INVISIBLE) => LocationAnswer::Invisible,
            _ => LocationAnswer::Silent,
        }
    }

    fn device_count(&self) -> usize {
        let mut n: c_int = 0;
        if calls::cuDeviceGetCount(Out::from(&mut n)) != Some(CUDA_SUCCESS) {
            return 0;
        }
        usize::try_from(n).unwrap_or(0)
    }

    fn is_device_pool(&self, device: usize, pool: u64) -> bool {
        let dev = device as c_int;
        default_pool(dev) == Some(pool) || current_pool(dev) == Some(pool)
    }
}

impl PoolDriver for Pools {
    fn reserved(&self, pool: u64) -> Option<u64> {
        pool_attribute(pool, RESERVED_MEM_CURRENT)
    }
    fn used(&self, pool: u64) -> Option<u64> {
        pool_attribute(pool, USED_MEM_CURRENT)
    }
    fn release_threshold(&self, pool: u64) -> Option<u64> {
        pool_attribute(pool, RELEASE_THRESHOLD)
    }
    fn trim_to(&self, pool: u64, keep: u64) {
        // A pool handle the driver gave the program.
        let _ = real::cuMemPoolTrimTo(pool as Handle, keep as usize);
    }
}

/// The driver's contexts.
pub struct Contexts;

impl CtxDriver for Contexts {
    fn free_with(&self, ctx: Ctx) -> Result<u64, u32> {
        if [
            Row::cuCtxPushCurrent_v2,
            Row::cuCtxPopCurrent_v2,
            Row::cuMemGetInfo_v2,
        ]
        .iter()
        .any(|&r| SLOTS[r as usize].real().is_null())
        {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        // A measurement, maybe inside a capture (a first launch there): relaxed.
        super::graph_queries::relaxed(|| {
            let (mut free, mut total) = (0usize, 0usize);
            let mut popped: Handle = null_mut();
            // `ctx` is a live context of this process; it is popped again right after the
            // query, leaving the thread's stack as it was.
            let rc = real::cuCtxPushCurrent_v2(ctx as Handle).unwrap_or(CUDA_ERROR_NOT_FOUND);
            if rc != CUDA_SUCCESS {
                return Err(rc);
            }
            let rc = real::cuMemGetInfo_v2(Out::from(&mut free), Out::from(&mut total))
                .unwrap_or(CUDA_ERROR_NOT_FOUND);
            let _ = real::cuCtxPopCurrent_v2(Out::from(&mut popped));
            if rc == CUDA_SUCCESS {
                Ok(free as u64)
            } else {
                Err(rc)
            }
        })
    }

    fn free_without_context(&self, device: usize) -> Result<u64, String> {
        super::nvml_direct::device_free(device)
    }

    fn create_floating(&self, device: usize) -> Result<Ctx, u32> {
        if SLOTS[Row::cuCtxPopCurrent_v2 as usize].real().is_null() {
            return Err(CUDA_ERROR_NOT_FOUND);
        }
        let mut ctx: Handle = null_mut();
        let mut popped: Handle = null_mut();
        let dev = device as c_int;
        // cuCtxCreate_v4 takes NULL parameters; the new context is pushed by the driver
        // and popped at once, so the thread's stack is unchanged. _v4 is for drivers
        // that no longer export _v2.
        let rc = real::cuCtxCreate_v2(Out::from(&mut ctx), 0, dev)
            .or_else(|| real::cuCtxCreate_v4(Out::from(&mut ctx), null_mut(), 0, dev))
            .unwrap_or(CUDA_ERROR_NOT_FOUND);
        if rc != CUDA_SUCCESS {
            return Err(rc);
        }
        let _ = real::cuCtxPopCurrent_v2(Out::from(&mut popped));
        Ok(ctx as Ctx)
    }

    fn destroy(&self, ctx: Ctx) {
        // A context `create_floating` made, not current anywhere.
        let _ = real::cuCtxDestroy_v2(ctx as Handle);
    }

    fn primary_active(&self, device: usize) -> Option<bool> {
        let state = calls::cuDevicePrimaryCtxGetState()?;
        let (mut flags, mut active) = (0u32, 0 as c_int);
        // SAFETY: valid out-pointers.
        (unsafe { state(device as c_int, &mut flags, &mut active) } == CUDA_SUCCESS)
            .then_some(active != 0)
    }

    fn id(&self, ctx: Ctx) -> Option<u64> {
        let get = calls::cuCtxGetId()?;
        let mut id = 0u64;
        // SAFETY: valid out-pointer; a context handle of the program's.
        (unsafe { get(ctx as Handle, &mut id) } == CUDA_SUCCESS).then_some(id)
    }

    fn exists(&self, ctx: Ctx, id: Option<u64>) -> Option<bool> {
        if ctx == 0 {
            return None;
        }
        // The id (CUDA 12.0) also tells a handle reused for a new context from the old
        // one; older drivers answer cuCtxGetApiVersion for any live context.
        let rc = match (calls::cuCtxGetId(), id) {
            (Some(get), Some(was)) => {
                let mut now = 0u64;
                // SAFETY: valid out-pointer.
                let rc = unsafe { get(ctx as Handle, &mut now) };
                if rc == CUDA_SUCCESS {
                    return Some(now == was);
                }
                rc
            }
            _ => {
                let version = calls::cuCtxGetApiVersion()?;
                let mut v = 0u32;
                // SAFETY: valid out-pointer.
                unsafe { version(ctx as Handle, &mut v) }
            }
        };
        match rc {
            CUDA_SUCCESS => Some(true),
            rc if context_unknown(rc) => Some(false),
            _ => None,
        }
    }
}

/// Whether an answer says "no such context".
fn context_unknown(rc: u32) -> bool {
    matches!(
        rc,
        CUDA_ERROR_INVALID_CONTEXT
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_INVALID_HANDLE
            | CUDA_ERROR_INVALID_VALUE
    )
}

/// Whether an answer says "no such allocation/handle" (rather than, say, "no current
/// context", which says nothing about the allocation).
fn unknown_to_driver(rc: u32) -> bool {
    matches!(
        rc,
        CUDA_ERROR_INVALID_VALUE | CUDA_ERROR_INVALID_HANDLE | CUDA_ERROR_NOT_FOUND
    )
}

/// Whether the driver may still hold `ptr` as the start of a linear allocation (after
/// a context teardown). Anything but a clear "unknown" counts as alive.
pub fn pointer_alive(ptr: u64) -> bool {
    let (mut base, mut size) = (0u64, 0usize);
    let Some(rc) = real::cuMemGetAddressRange_v2(Out::from(&mut base), Out::from(&mut size), ptr)
    else {
        return true;
    };
    if rc == CUDA_SUCCESS {
        base == ptr
    } else {
        !unknown_to_driver(rc)
    }
}

/// Whether the driver may still hold a CUDA array handle.
pub fn array_alive(handle: u64) -> bool {
    let Some(get) = calls::cuArray3DGetDescriptor_v2() else {
        return true;
    };
    let mut desc = Array3DDescriptor::default();
    // SAFETY: valid out-pointer.
    !unknown_to_driver(unsafe { get(&mut desc, handle as Handle) })
}

/// Whether the driver may still hold a mipmapped array handle.
pub fn mipmapped_alive(handle: u64) -> bool {
    let Some(level) = calls::cuMipmappedArrayGetLevel() else {
        return true;
    };
    let mut array: Handle = null_mut();
    // SAFETY: valid out-pointer; level 0 exists in every mipmapped array.
    !unknown_to_driver(unsafe { level(&mut array, handle as Handle, 0) })
}

/// The memory the driver says an array takes, if it says.
pub fn array_size(handle: Handle, device: c_int, mipmapped: bool) -> Option<u64> {
    let get = if mipmapped {
        calls::cuMipmappedArrayGetMemoryRequirements()?
    } else {
        calls::cuArrayGetMemoryRequirements()?
    };
    let mut req = MemoryRequirements {
        size: 0,
        alignment: 0,
        reserved: [0; 4],
    };
    // SAFETY: valid out-pointer, a handle the driver just made.
    (unsafe { get(&mut req, handle, device) } == CUDA_SUCCESS).then_some(req.size as u64)
}

/// Destroys an array the shim refuses after the fact.
pub fn destroy_array(handle: Handle, mipmapped: bool) {
    // The handle the driver just made.
    let _ = if mipmapped {
        real::cuMipmappedArrayDestroy(handle)
    } else {
        real::cuArrayDestroy(handle)
    };
}

/// The calling thread's current context (None: none, or the driver cannot say).
pub fn current_context() -> Option<Handle> {
    let get = calls::cuCtxGetCurrent()?;
    let mut ctx: Handle = null_mut();
    // SAFETY: valid out-pointer.
    (unsafe { get(&mut ctx) } == CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

/// Whether a context the process had still exists (false only when the driver says so).
pub fn context_gone(ctx: Handle, id: Option<u64>) -> bool {
    Contexts.exists(ctx as Ctx, id) == Some(false)
}

impl gpucap_core::residents::Gauge for Contexts {
    /// The device memory the driver counts for this process on `device` (NVML; None:
    /// NVML does not list this process), or why it cannot be read.
    fn own_used(&self, device: usize) -> Result<Option<u64>, String> {
        super::nvml_direct::own_used(device)
    }

    fn graph_reserved(&self, device: usize) -> Option<u64> {
        // A measurement, maybe inside a capture (a first launch there): relaxed.
        super::graph_queries::relaxed(|| super::graph_queries::graph_reserved(device))
    }
}

/// The current context's value of `limit` (None: no context, or no such limit).
pub fn context_limit(limit: c_int) -> Option<usize> {
    let get = calls::cuCtxGetLimit()?;
    let mut value = 0usize;
    // SAFETY: valid out-pointer.
    (unsafe { get(&mut value, limit) } == CUDA_SUCCESS).then_some(value)
}

/// Destroys a context the shim refuses after the fact.
pub fn destroy_context(ctx: Handle) {
    Contexts.destroy(ctx as Ctx);
}

/// The id of a context (before a call that may end it), for [`CtxDriver::exists`].
pub fn context_id(ctx: Handle) -> Option<u64> {
    Contexts.id(ctx as Ctx)
}

/// Releases a primary context retained by a call the shim refuses after the fact.
pub fn release_primary(device: c_int) {
    // Undoing the retain the driver just did.
    let _ = real::cuDevicePrimaryCtxRelease_v2(device);
}

/// The device of a context (pushed for the question).
pub fn context_device(ctx: Handle) -> Option<usize> {
    if [Row::cuCtxPushCurrent_v2, Row::cuCtxPopCurrent_v2]
        .iter()
        .any(|&r| SLOTS[r as usize].real().is_null())
    {
        return None;
    }
    let mut dev: c_int = -1;
    let mut popped: Handle = null_mut();
    // The caller's context, pushed and popped again.
    if real::cuCtxPushCurrent_v2(ctx)? != CUDA_SUCCESS {
        return None;
    }
    let rc = calls::cuCtxGetDevice(Out::from(&mut dev));
    let _ = real::cuCtxPopCurrent_v2(Out::from(&mut popped));
    (rc == Some(CUDA_SUCCESS))
        .then(|| usize::try_from(dev).ok())
        .flatten()
}

/// The UUID NVML gives a device handle.
pub fn nvml_uuid(device: Handle) -> Option<[u8; 16]> {
    let get = calls::nvmlDeviceGetUUID()?;
    let mut buf = [0 as c_char; 96];
    // SAFETY: a buffer of the stated length for a NUL-terminated string.
    if unsafe { get(device, buf.as_mut_ptr(), buf.len() as u32) } != 0 {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into the buffer (zeroed beforehand).
    let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    gpucap_core::identity::parse_uuid(&text.to_string_lossy())
}

/// What the driver keeps back of an NVML device's memory (`nvmlDeviceGetMemoryInfo_v2`'s
/// `reserved`): NVML's total less it is CUDA's (`cuDeviceTotalMem`; H100 and H200, driver
/// 580, `tests/driver-answers`). None where NVML has no `_v2` or refuses it.
pub fn nvml_reserved(device: Handle) -> Option<u64> {
    let mut m = gpucap_core::nvml::NvmlMemoryV2 {
        version: gpucap_core::nvml::MEMORY_V2_VERSION,
        ..Default::default()
    };
    (real::nvmlDeviceGetMemoryInfo_v2(device, Out::from(&mut m))? == NVML_SUCCESS)
        .then_some(m.reserved)
}

/// The GPU and compute instance ids of a MIG device handle; None for a whole GPU.
pub fn nvml_instance_ids(device: Handle) -> Option<(u32, u32)> {
    let id = |f: Option<unsafe extern "C" fn(Handle, *mut u32) -> u32>| {
        let mut v = 0u32;
        // SAFETY: valid out-pointer; NVML refuses a handle that is no MIG device.
        f.filter(|f| unsafe { f(device, &mut v) } == NVML_SUCCESS)
            .map(|_| v)
    };
    id(calls::nvmlDeviceGetGpuInstanceId()).zip(id(calls::nvmlDeviceGetComputeInstanceId()))
}

/// `NVML_SUCCESS`, `NVML_DEVICE_MIG_ENABLE`.
const NVML_SUCCESS: u32 = 0;
const NVML_MIG_ENABLE: u32 = 1;

/// NVML's GPUs, with their PCI addresses and MIG devices (for `nvml::cuda_view`).
/// None when NVML cannot list them.
pub fn nvml_gpus() -> Option<Vec<NvmlGpu>> {
    let count = calls::nvmlDeviceGetCount_v2()?;
    let by_index = calls::nvmlDeviceGetHandleByIndex_v2()?;
    let mut n = 0u32;
    // SAFETY: valid out-pointer.
    if unsafe { count(&mut n) } != NVML_SUCCESS {
        return None;
    }
    (0..n)
        .map(|i| {
            let mut h: Handle = null_mut();
            // SAFETY: valid out-pointer; an index below NVML's count.
            if unsafe { by_index(i, &mut h) } != NVML_SUCCESS {
                return None;
            }
            Some(NvmlGpu {
                uuid: nvml_uuid(h)?,
                pci: nvml_pci(h),
                migs: nvml_migs(h),
            })
        })
        .collect()
}

fn nvml_pci(gpu: Handle) -> Option<(u32, u32, u32)> {
    let get = calls::nvmlDeviceGetPciInfo_v3()?;
    let mut info = PciInfo::default();
    // SAFETY: valid out-pointer of the struct's size.
    (unsafe { get(gpu, &mut info) } == NVML_SUCCESS).then_some((info.domain, info.bus, info.device))
}

/// The MIG devices of a GPU in MIG mode (None when MIG is off or unsupported).
fn nvml_migs(gpu: Handle) -> Option<Vec<NvmlMig>> {
    let mode = calls::nvmlDeviceGetMigMode()?;
    let (mut current, mut pending) = (0u32, 0u32);
    // SAFETY: valid out-pointers.
    if unsafe { mode(gpu, &mut current, &mut pending) } != NVML_SUCCESS
        || current != NVML_MIG_ENABLE
    {
        return None;
    }
    let (max, by_index) = (
        calls::nvmlDeviceGetMaxMigDeviceCount()?,
        calls::nvmlDeviceGetMigDeviceHandleByIndex()?,
    );
    let mut n = 0u32;
    // SAFETY: valid out-pointer.
    if unsafe { max(gpu, &mut n) } != NVML_SUCCESS {
        return None;
    }
    let id = |f: Option<unsafe extern "C" fn(Handle, *mut u32) -> u32>, h: Handle| {
        let mut v = 0u32;
        // SAFETY: valid out-pointer; a MIG handle NVML gave.
        f.filter(|f| unsafe { f(h, &mut v) } == NVML_SUCCESS)
            .map(|_| v)
    };
    let mut migs = Vec::new();
    for i in 0..n {
        let mut h: Handle = null_mut();
        // SAFETY: valid out-pointer; NVML answers NOT_FOUND for an empty slot.
        if unsafe { by_index(gpu, i, &mut h) } != NVML_SUCCESS {
            continue;
        }
        let Some(uuid) = nvml_uuid(h) else { continue };
        let gi = id(calls::nvmlDeviceGetGpuInstanceId(), h);
        let ci = id(calls::nvmlDeviceGetComputeInstanceId(), h);
        migs.push(NvmlMig {
            uuid,
            gi_ci: gi.zip(ci),
        });
    }
    Some(migs)
}

/// Whether the process itself initialised CUDA (asked of the driver only if it is
/// loaded, and without initialising it: `cuDeviceGetCount` answers
/// `CUDA_ERROR_NOT_INITIALIZED` until `cuInit`).
pub fn cuda_initialised() -> bool {
    if !crate::resolve::cuda_loaded() {
        return false;
    }
    let mut n: c_int = 0;
    calls::cuDeviceGetCount(Out::from(&mut n)) == Some(CUDA_SUCCESS)
}
