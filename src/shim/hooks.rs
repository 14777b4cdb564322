//! What each hook does: find the device, ask the ledger, call the driver, record.
//! Each function receives the driver's real function as its first argument (the
//! table in `ffi` looks it up) followed by the C arguments, untouched.

use std::ffi::{c_int, c_void};

use crate::arena;
use crate::ffi::{
    self, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_SUCCESS, CuResult,
};
use crate::real;
use crate::shim::{SHIM, Shim, log};
use gpucap_core::arrays::{self, Shape};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::contexts::{self, ContextBook, CtxDriver, Ending, Unmeasured, Verdict};
use gpucap_core::growth::{self, GROWTH};
use gpucap_core::identity;
use gpucap_core::ledger::{Kind, LiveMap, Reservation};
use gpucap_core::nvml;
use gpucap_core::pools::{PoolBook, PoolDriver, PoolLocation};
use gpucap_core::vmm::{Pending, VmmBook};

pub type Dptr = u64;
pub type Stream = *mut c_void;
pub type Handle = *mut c_void;

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
const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
const CU_MEM_LOCATION_TYPE_HOST: u32 = 2;
const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: u32 = 4;

/// The shim, or the error every call gets when the configuration is invalid (or
/// names a device UUID that is not visible).
fn shim() -> Result<&'static Shim, CuResult> {
    if identity::failed().is_some() {
        return Err(CUDA_ERROR_NOT_PERMITTED);
    }
    SHIM.config()
        .map(|_| &SHIM)
        .map_err(|_| CUDA_ERROR_NOT_PERMITTED)
}

/// A device index the ledger can hold, with its cap resolved.
fn checked_device(shim: &Shim, device: c_int) -> Option<usize> {
    let d = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES)?;
    shim.resolve_cap(d, || ffi::physical_total(d));
    Some(d)
}

/// The device of the calling thread's current context.
fn current_device() -> Option<c_int> {
    let get = ffi::driver::cuCtxGetDevice()?;
    let mut dev: c_int = -1;
    // SAFETY: valid out-pointer.
    (unsafe { get(&mut dev) } == CUDA_SUCCESS).then_some(dev)
}

/// Where an allocation is charged, or the error to return without calling the driver.
enum Target<'a> {
    /// Reserved: call the driver, then commit.
    Charged(Reservation<'a>),
    /// No device to charge (no current context): the driver will answer the call
    /// itself, with its own error or success, and nothing is recorded.
    Unknown,
}

fn reserve(api: &str, device: Option<c_int>, bytes: u64) -> Result<Target<'static>, CuResult> {
    let shim = shim()?;
    let Some(device) = device else {
        return Ok(Target::Unknown);
    };
    let Some(d) = checked_device(shim, device) else {
        log!(
            Error,
            "refused {api}: device index {device} is out of the range gpucap tracks"
        );
        return Err(CUDA_ERROR_INVALID_DEVICE);
    };
    reclaim_for(shim, d, bytes);
    shim.reserve(api, d, bytes)
        .map(Target::Charged)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

/// Before a request the cap cannot take: memory the process's own pools only cache
/// is trimmed and re-read, so the program is not refused what it is itself holding.
fn reclaim_for(shim: &Shim, d: usize, bytes: u64) {
    if POOLS.any_on(d) && shim.ledger.usage(d).is_some_and(|u| u.headroom() < bytes) {
        POOLS.reclaim(&shim.ledger, &real::Pools, d);
    }
}

/// Calls the driver with a reservation held; commits under the key `key()` reads
/// once the driver succeeded, rolls back otherwise.
fn charged(
    api: &str,
    device: Option<c_int>,
    bytes: u64,
    kind: Kind,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let target = match reserve(api, device, bytes) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = call();
    if let (CUDA_SUCCESS, Target::Charged(r)) = (rc, target) {
        r.commit(kind, key());
    }
    rc
}

/// Frees a device pointer through the driver (`cuMemFree*`, `cuMemFreeAsync*`),
/// crediting the cap only once the driver succeeded. A plain allocation is taken out
/// of the ledger first (the common case, one lock-free lookup); pool memory goes back
/// to its pool, which stays charged for what it reserves.
fn pointer_freed(dptr: u64, call: impl FnOnce() -> CuResult) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    if let Some(c) = SHIM.ledger.take(Kind::Pointer, dptr) {
        let rc = call();
        if rc == CUDA_SUCCESS {
            SHIM.ledger.settle(c);
        } else {
            SHIM.ledger.restore(Kind::Pointer, dptr, c);
        }
        return rc;
    }
    if let Some(t) = POOLS.take_freed(dptr) {
        let rc = call();
        if rc == CUDA_SUCCESS {
            POOLS.settle_freed(&SHIM.ledger, t);
        } else {
            POOLS.restore_freed(t);
        }
        return rc;
    }
    call()
}

/// Reads the pointer the driver wrote (only after it succeeded).
fn written(dptr: *mut Dptr) -> u64 {
    // SAFETY: called only after the driver returned success for this out-pointer.
    unsafe { *dptr }
}

/// How many GPUs the driver shows this process (after `CUDA_VISIBLE_DEVICES`), or None
/// when it cannot say. Asked after a successful `cuInit`, for the key check.
fn visible_count() -> Option<usize> {
    let count = ffi::driver::cuDeviceGetCount()?;
    let mut n: c_int = 0;
    // SAFETY: a plain driver call with a valid out-pointer.
    (unsafe { count(&mut n) } == CUDA_SUCCESS)
        .then(|| usize::try_from(n).ok())
        .flatten()
}

pub fn init(real: unsafe extern "C" fn(u32) -> CuResult, flags: u32) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's argument.
    let rc = unsafe { real(flags) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    // Every key of GPUCAP_LIMIT (ordinal or UUID) must name a visible device: checked
    // now, fail closed. UUIDs are asked of the driver only when a key is one.
    let Ok(config) = shim.config() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    if let Some(spec) = config.limit.as_ref().filter(|s| !s.devices.is_empty())
        && let Err(msg) = identity::check_keys(spec, visible_count(), || {
            identity::visible(crate::real::visible_uuids)
        })
    {
        // Always shown, whatever GPUCAP_LOG says: the program is being stopped.
        eprintln!("{}", identity::latch(msg));
        return CUDA_ERROR_NOT_PERMITTED;
    }
    rc
}

pub fn mem_alloc(
    real: unsafe extern "C" fn(*mut Dptr, usize) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
) -> CuResult {
    let api = "cuMemAlloc";
    if growth() && !dptr.is_null() {
        let Some(device) = current_device() else {
            // SAFETY: forwarding; without a context the driver answers with its error.
            return unsafe { real(dptr, size) };
        };
        let Some(d) = checked_device(&SHIM, device) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        return match arena::alloc(api, d, size as u64) {
            Ok(base) => {
                // SAFETY: the caller's out-pointer, checked non-null above.
                unsafe { *dptr = base };
                CUDA_SUCCESS
            }
            Err(rc) => rc,
        };
    }
    // SAFETY (closure): forwarding the caller's arguments.
    charged(
        api,
        current_device(),
        size as u64,
        Kind::Pointer,
        || unsafe { real(dptr, size) },
        || written(dptr),
    )
}

/// Whether growth-only mode is on (false while misconfigured: callers fail then).
fn growth() -> bool {
    SHIM.config().is_ok_and(|c| c.growth)
}

/// Frees `dptr` if growth mode served it.
fn growth_free(dptr: Dptr) -> Option<CuResult> {
    if growth() && GROWTH.has_mappings() {
        arena::free(dptr)
    } else {
        None
    }
}

pub fn mem_alloc_managed(
    real: unsafe extern "C" fn(*mut Dptr, usize, u32) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
    flags: u32,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    charged(
        "cuMemAllocManaged",
        current_device(),
        size as u64,
        Kind::Pointer,
        || unsafe { real(dptr, size, flags) },
        || written(dptr),
    )
}

/// Pitch alignment the reservation assumes before the driver says the real pitch.
const PITCH_GUESS: u64 = 512;

/// `cuMemAllocPitch_v2`, and the CUDA 2.x `cuMemAllocPitch` (32-bit pointer and sizes).
pub fn mem_alloc_pitch<P: Word, W: Word>(
    real: unsafe extern "C" fn(*mut P, *mut W, W, W, u32) -> CuResult,
    dptr: *mut P,
    pitch: *mut W,
    width: W,
    height: W,
    elem: u32,
) -> CuResult {
    let api = "cuMemAllocPitch";
    let guess = width
        .get()
        .checked_next_multiple_of(PITCH_GUESS)
        .and_then(|w| w.checked_mul(height.get()))
        .unwrap_or(u64::MAX);
    let target = match reserve(api, current_device(), guess) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(dptr, pitch, width, height, elem) };
    let (CUDA_SUCCESS, Target::Charged(mut r)) = (rc, target) else {
        return rc;
    };
    // SAFETY: the driver succeeded and filled both out-pointers.
    let (ptr, actual) = unsafe { ((*dptr).get(), (*pitch).get().saturating_mul(height.get())) };
    if let Err(refusal) = SHIM.ledger.resize(&mut r, actual) {
        // The driver padded more than the cap allows: give it back and refuse.
        SHIM.refused(api, r.charge().device, actual, refusal);
        if let Some(free) = ffi::driver::cuMemFree_v2() {
            // SAFETY: freeing the allocation the driver just made.
            unsafe { free(ptr) };
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r.commit(Kind::Pointer, ptr);
    rc
}

/// `cuMemFree_v2`, and the CUDA 2.x `cuMemFree` (32-bit pointer). Stream-ordered
/// (pool) memory may be freed this way too.
pub fn mem_free<P: Word>(real: unsafe extern "C" fn(P) -> CuResult, dptr: P) -> CuResult {
    if let Some(rc) = growth_free(dptr.get()) {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's argument.
    pointer_freed(dptr.get(), || unsafe { real(dptr) })
}

pub fn mem_alloc_async(
    real: unsafe extern "C" fn(*mut Dptr, usize, Stream) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
    stream: Stream,
) -> CuResult {
    // The pool is the current pool of the stream's device, which need not be the
    // current context's.
    let device = if is_context_stream(stream) {
        current_device()
    } else {
        real::stream_device(stream).or_else(current_device)
    };
    let pool = device.and_then(real::current_pool);
    // SAFETY (closure): forwarding the caller's arguments.
    pool_charged(
        "cuMemAllocAsync",
        device,
        pool,
        size,
        dptr,
        stream,
        || unsafe { real(dptr, size, stream) },
    )
}

pub fn mem_alloc_from_pool_async(
    real: unsafe extern "C" fn(*mut Dptr, usize, Handle, Stream) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
    pool: Handle,
    stream: Stream,
) -> CuResult {
    let api = "cuMemAllocFromPoolAsync";
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(dptr, size, pool, stream) };
    if pool.is_null() {
        // No pool: the driver's own error. Charged to the current device should it
        // allocate anyway.
        return pool_charged(api, current_device(), None, size, dptr, stream, call);
    }
    if let Err(rc) = shim() {
        return rc;
    }
    // The pool's own device, whichever context is current.
    let key = pool as u64;
    match POOLS.locate(&real::Pools, key) {
        Some(PoolLocation::Device(d)) => {
            let device = c_int::try_from(d).unwrap_or(c_int::MAX);
            pool_charged(api, Some(device), Some(key), size, dptr, stream, call)
        }
        // Host memory: not device memory.
        Some(PoolLocation::Host) => call(),
        None => unlocated_pool(api, key, size, dptr, stream, call),
    }
}

/// An allocation from a pool gpucap cannot locate: refused, never passed uncounted.
/// A handle the driver does not know as a pool gets the driver's own error.
fn unlocated_pool(
    api: &str,
    pool: u64,
    size: usize,
    dptr: *mut Dptr,
    stream: Stream,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    if real::Pools.reserved(pool).is_none() {
        let rc = call();
        if rc != CUDA_SUCCESS {
            return rc;
        }
        // The driver allocated from it after all: given back, and refused.
        real::free_async(written(dptr), stream);
    }
    log!(
        Warn,
        "refused {api} of {}: gpucap cannot tell which GPU memory pool {pool:#x} is on",
        gpucap_core::size::format_bytes(size as u64)
    );
    CUDA_ERROR_OUT_OF_MEMORY
}

/// NULL, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD` (2): the current context's
/// default streams.
fn is_context_stream(stream: Stream) -> bool {
    (stream as usize) <= 2
}

/// A stream-ordered allocation: the request is reserved (the cap check), the driver
/// called, then the pool's charge settled to what it now reserves (see `pools`).
fn pool_charged(
    api: &str,
    device: Option<c_int>,
    pool: Option<u64>,
    size: usize,
    dptr: *mut Dptr,
    stream: Stream,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    // The whole request is reserved, even if the pool may serve it from its cache: the
    // driver, not the shim, decides that, and a concurrent allocation may take the cache
    // first. Near the cap the pools are trimmed instead (`reserve`), which is safe.
    let target = match reserve(api, device, size as u64) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let bytes = size as u64;
    let pool = match &target {
        Target::Charged(r) => pool.map(|p| (p, r.charge().device)),
        Target::Unknown => None,
    };
    if let Some((p, d)) = pool {
        POOLS.begin(p, d, bytes);
    }
    let rc = call();
    let (CUDA_SUCCESS, Target::Charged(r)) = (rc, target) else {
        if let Some((p, _)) = pool {
            POOLS.abandoned(p, bytes);
        }
        return rc;
    };
    let Some((pool, d)) = pool else {
        // No pool to read (the driver gave none): charged as a plain allocation.
        r.commit(Kind::Pointer, written(dptr));
        return rc;
    };
    let ptr = written(dptr);
    if let Err((refusal, r)) = POOLS.allocated(&SHIM.ledger, &real::Pools, pool, d, ptr, bytes, r) {
        // The pool grew past what the cap allows: give the memory back and refuse. The
        // reservation is held until the memory is back, so no one else can take it.
        SHIM.refused(api, d, bytes, refusal);
        real::free_async(ptr, stream);
        POOLS.reclaim(&SHIM.ledger, &real::Pools, d);
        POOLS.abandoned(pool, bytes);
        drop(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc
}

pub fn mem_free_async(
    real: unsafe extern "C" fn(Dptr, Stream) -> CuResult,
    dptr: Dptr,
    stream: Stream,
) -> CuResult {
    if let Some(rc) = growth_free(dptr) {
        return rc;
    }
    // A plain allocation freed stream-ordered is credited when the free is enqueued,
    // as the program sees it.
    // SAFETY (closure): forwarding the caller's arguments.
    pointer_freed(dptr, || unsafe { real(dptr, stream) })
}

/// The pools the program allocated from or created, with what each reserves.
static POOLS: PoolBook = PoolBook::new();

pub fn mem_pool_create(
    real: unsafe extern "C" fn(*mut Handle, *const LocationPrefix) -> CuResult,
    pool: *mut Handle,
    props: *const LocationPrefix,
) -> CuResult {
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(pool, props) };
    if rc == CUDA_SUCCESS {
        // SAFETY: the driver accepted `props` and filled `pool`.
        let (loc, handle) = unsafe { (&*props, *pool) };
        match loc.location_type {
            CU_MEM_LOCATION_TYPE_DEVICE => {
                if let Ok(device) = usize::try_from(loc.location_id) {
                    POOLS.register(handle as u64, device);
                }
            }
            CU_MEM_LOCATION_TYPE_HOST..=CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => {
                POOLS.register_host(handle as u64)
            }
            // Anything else is located by asking the driver when it is allocated from.
            _ => {}
        }
    }
    rc
}

pub fn mem_pool_destroy(real: unsafe extern "C" fn(Handle) -> CuResult, pool: Handle) -> CuResult {
    // SAFETY: forwarding the caller's argument.
    let rc = unsafe { real(pool) };
    if rc == CUDA_SUCCESS {
        POOLS.destroyed(&SHIM.ledger, pool as u64);
    }
    rc
}

pub fn mem_pool_trim_to(
    real: unsafe extern "C" fn(Handle, usize) -> CuResult,
    pool: Handle,
    keep: usize,
) -> CuResult {
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(pool, keep) };
    if rc == CUDA_SUCCESS {
        POOLS.refresh_pool(&SHIM.ledger, &real::Pools, pool as u64);
    }
    rc
}

/// Re-reads what the pools of `device` reserve: for the figures `cuMemGetInfo` and
/// NVML show.
pub fn refresh_pools(device: usize) {
    POOLS.refresh(&SHIM.ledger, &real::Pools, device);
}

/// After a synchronisation succeeded: pools release what they cache above their
/// release threshold then, so every pool is re-read (one load when there are none).
fn synchronized(rc: CuResult) -> CuResult {
    if rc == CUDA_SUCCESS {
        POOLS.refresh_all(&SHIM.ledger, &real::Pools);
    }
    rc
}

pub fn stream_synchronize(
    real: unsafe extern "C" fn(Stream) -> CuResult,
    stream: Stream,
) -> CuResult {
    // SAFETY: forwarding the caller's argument.
    synchronized(unsafe { real(stream) })
}

pub fn ctx_synchronize(real: unsafe extern "C" fn() -> CuResult) -> CuResult {
    // SAFETY: forwarding the call.
    synchronized(unsafe { real() })
}

/// `cuEventSynchronize(event)` and CUDA 13's `cuCtxSynchronize_v2(ctx)`.
pub fn handle_synchronize(
    real: unsafe extern "C" fn(Handle) -> CuResult,
    handle: Handle,
) -> CuResult {
    // SAFETY: forwarding the caller's argument.
    synchronized(unsafe { real(handle) })
}

// ---------------------------------------------------------------------------
// VMM (see `vmm`): a handle is charged from cuMemCreate until the driver frees its
// memory, at its last release and last unmap. Growth mode's own handles (`arena`)
// are made with the driver's functions directly and never pass here.

static VMM: VmmBook = VmmBook::new();

pub fn mem_create(
    real: unsafe extern "C" fn(*mut u64, usize, *const LocationPrefix, u64) -> CuResult,
    handle: *mut u64,
    size: usize,
    prop: *const LocationPrefix,
    flags: u64,
) -> CuResult {
    // SAFETY: a non-null prop is the caller's CUmemAllocationProp.
    let device = unsafe { prop.as_ref() }
        .filter(|p| p.location_type == CU_MEM_LOCATION_TYPE_DEVICE)
        .map(|p| p.location_id);
    // Host-located physical memory takes no device memory: forwarded uncounted.
    let target = match reserve("cuMemCreate", device, size as u64) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(handle, size, prop, flags) };
    if let (CUDA_SUCCESS, Target::Charged(r)) = (rc, target) {
        // SAFETY: the driver succeeded and filled the out-pointer.
        let h = unsafe { *handle };
        let charge = r.charge();
        r.keep();
        SHIM.ledger.count_alloc(charge.device);
        if let Some(stale) = VMM.created(h, charge) {
            SHIM.ledger.settle(stale);
        }
    }
    rc
}

/// Calls the driver for a VMM step prepared in the book, then finishes it (or takes it
/// back if the driver failed), crediting what the driver freed.
fn vmm_step(pending: Option<Pending>, call: impl FnOnce() -> CuResult) -> CuResult {
    let rc = call();
    if let Some(p) = pending {
        let freed = if rc == CUDA_SUCCESS {
            VMM.done(p)
        } else {
            VMM.undo(p)
        };
        for c in freed {
            SHIM.ledger.settle(c);
        }
    }
    rc
}

pub fn mem_release(real: unsafe extern "C" fn(u64) -> CuResult, handle: u64) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's argument.
    vmm_step(VMM.release(handle), || unsafe { real(handle) })
}

pub fn mem_map(
    real: unsafe extern "C" fn(Dptr, usize, usize, u64, u64) -> CuResult,
    ptr: Dptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's arguments.
    vmm_step(VMM.map(ptr, size as u64, handle), || unsafe {
        real(ptr, size, offset, handle, flags)
    })
}

pub fn mem_unmap(
    real: unsafe extern "C" fn(Dptr, usize) -> CuResult,
    ptr: Dptr,
    size: usize,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's arguments.
    vmm_step(VMM.unmap(ptr, size as u64), || unsafe { real(ptr, size) })
}

/// Freeing an address range takes the mappings still in it (where the driver allows
/// that at all): credited as by `cuMemUnmap`.
pub fn mem_address_free(
    real: unsafe extern "C" fn(Dptr, usize) -> CuResult,
    ptr: Dptr,
    size: usize,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's arguments.
    vmm_step(VMM.unmap(ptr, size as u64), || unsafe { real(ptr, size) })
}

pub fn mem_retain_allocation_handle(
    real: unsafe extern "C" fn(*mut u64, *mut c_void) -> CuResult,
    handle: *mut u64,
    addr: *mut c_void,
) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let pending = VMM.retain(addr as u64);
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(handle, addr) };
    let freed = if rc == CUDA_SUCCESS && !handle.is_null() {
        // SAFETY: the driver succeeded and filled the (non-null) out-pointer.
        VMM.retained(pending, unsafe { *handle })
    } else {
        pending.map(|p| VMM.undo(p)).unwrap_or_default()
    };
    for c in freed {
        SHIM.ledger.settle(c);
    }
    rc
}

pub fn mem_get_info<W: Word>(
    real: unsafe extern "C" fn(*mut W, *mut W) -> CuResult,
    free: *mut W,
    total: *mut W,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(free, total) };
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    // SAFETY: the driver succeeded and filled both out-pointers.
    unsafe {
        let (f, t) = capped_info(shim, (*free).get(), (*total).get());
        (*free, *total) = (W::put(f), W::put(t));
    }
    rc
}

/// Growth allocations are several page mappings: the driver would answer with one
/// page, so the range is answered from the mapping record.
pub fn mem_get_address_range(
    real: unsafe extern "C" fn(*mut Dptr, *mut usize, Dptr) -> CuResult,
    base: *mut Dptr,
    size: *mut usize,
    dptr: Dptr,
) -> CuResult {
    if let Some((b, s)) = GROWTH.range_of(dptr) {
        // SAFETY: the caller's out-pointers; either may be NULL per the API.
        unsafe {
            if let Some(base) = base.as_mut() {
                *base = b;
            }
            if let Some(size) = size.as_mut() {
                *size = s as usize;
            }
        }
        return CUDA_SUCCESS;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real(base, size, dptr) }
}

pub fn device_total_mem<W: Word>(
    real: unsafe extern "C" fn(*mut W, c_int) -> CuResult,
    bytes: *mut W,
    dev: c_int,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(bytes, dev) };
    if rc != CUDA_SUCCESS || bytes.is_null() {
        return rc;
    }
    if let Some(d) = checked_device(shim, dev) {
        // SAFETY: the driver succeeded and filled `bytes`.
        unsafe { *bytes = W::put(shim.total_mem(d, (*bytes).get())) };
    }
    rc
}

/// The width of a size or device pointer in the driver API: `size_t`/`CUdeviceptr`, or
/// `unsigned int` in the CUDA 2.x entry points (whose figures saturate at 4 GiB - 1, as they cannot say more).
pub trait Word: Copy {
    fn get(self) -> u64;
    fn put(v: u64) -> Self;
}

impl Word for usize {
    fn get(self) -> u64 {
        self as u64
    }
    fn put(v: u64) -> Self {
        v as usize
    }
}

impl Word for u64 {
    fn get(self) -> u64 {
        self
    }
    fn put(v: u64) -> Self {
        v
    }
}

impl Word for u32 {
    fn get(self) -> u64 {
        self.into()
    }
    fn put(v: u64) -> Self {
        v.min(u32::MAX.into()) as u32
    }
}

// ---------------------------------------------------------------------------
// CUDA arrays (see `arrays` for the estimate and why the size is asked afterwards).

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

/// `CUDA_ARRAY_MEMORY_REQUIREMENTS`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct MemoryRequirements {
    pub size: usize,
    pub alignment: usize,
    pub reserved: [u32; 4],
}

/// Live CUDA arrays and mipmapped arrays, by handle.
static ARRAYS: LiveMap = LiveMap::new();
static MIPMAPS: LiveMap = LiveMap::new();

fn array_map(mipmapped: bool) -> &'static LiveMap {
    if mipmapped { &MIPMAPS } else { &ARRAYS }
}

/// Reserves the estimate, calls the driver, resizes to the size the driver reports;
/// destroys the array and refuses if that breaks the cap.
fn array_charged(
    api: &str,
    shape: Option<Shape>,
    levels: u32,
    mipmapped: bool,
    handle: *mut Handle,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    let Some(shape) = shape.filter(|s| !s.takes_no_memory()) else {
        // No descriptor (the driver's error), or memory mapped in later from
        // cuMemCreate handles (charged there).
        if let Err(rc) = shim() {
            return rc;
        }
        return call();
    };
    let device = current_device();
    let target = match reserve(api, device, arrays::estimate(&shape, levels)) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = call();
    let (CUDA_SUCCESS, Target::Charged(mut r)) = (rc, target) else {
        return rc;
    };
    // SAFETY: the driver succeeded and filled the handle.
    let h = unsafe { *handle };
    let dev = r.charge().device;
    if let Some(actual) = real::array_size(h, dev as c_int, mipmapped)
        && let Err(refusal) = SHIM.ledger.resize(&mut r, actual)
    {
        SHIM.refused(api, dev, actual, refusal);
        real::destroy_array(h, mipmapped);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    array_map(mipmapped).insert(h as u64, r.charge());
    r.keep();
    SHIM.ledger.count_alloc(dev);
    rc
}

/// Destroys through the driver, crediting the array once the driver succeeded.
fn array_released(mipmapped: bool, handle: Handle, call: impl FnOnce() -> CuResult) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let map = array_map(mipmapped);
    let taken = map.remove(handle as u64);
    let rc = call();
    match (rc, taken) {
        (CUDA_SUCCESS, Some(c)) => SHIM.ledger.settle(c),
        (_, Some(c)) => map.insert(handle as u64, c),
        _ => {}
    }
    rc
}

fn shape_2d(desc: *const ArrayDescriptor) -> Option<Shape> {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY_DESCRIPTOR.
    unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: 0,
        format: d.format,
        channels: d.channels,
        flags: 0,
    })
}

fn shape_3d(desc: *const Array3DDescriptor) -> Option<Shape> {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY3D_DESCRIPTOR.
    unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width as u64,
        height: d.height as u64,
        depth: d.depth as u64,
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    })
}

pub fn array_create(
    real: unsafe extern "C" fn(*mut Handle, *const ArrayDescriptor) -> CuResult,
    handle: *mut Handle,
    desc: *const ArrayDescriptor,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged(
        "cuArrayCreate",
        shape_2d(desc),
        1,
        false,
        handle,
        || unsafe { real(handle, desc) },
    )
}

pub fn array_3d_create(
    real: unsafe extern "C" fn(*mut Handle, *const Array3DDescriptor) -> CuResult,
    handle: *mut Handle,
    desc: *const Array3DDescriptor,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged(
        "cuArray3DCreate",
        shape_3d(desc),
        1,
        false,
        handle,
        || unsafe { real(handle, desc) },
    )
}

pub fn array_create_v1(
    real: unsafe extern "C" fn(*mut Handle, *const ArrayDescriptorV1) -> CuResult,
    handle: *mut Handle,
    desc: *const ArrayDescriptorV1,
) -> CuResult {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY_DESCRIPTOR_v1.
    let shape = unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width.into(),
        height: d.height.into(),
        depth: 0,
        format: d.format,
        channels: d.channels,
        flags: 0,
    });
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged("cuArrayCreate", shape, 1, false, handle, || unsafe {
        real(handle, desc)
    })
}

pub fn array_3d_create_v1(
    real: unsafe extern "C" fn(*mut Handle, *const Array3DDescriptorV1) -> CuResult,
    handle: *mut Handle,
    desc: *const Array3DDescriptorV1,
) -> CuResult {
    // SAFETY: a non-null descriptor is the caller's CUDA_ARRAY3D_DESCRIPTOR_v1.
    let shape = unsafe { desc.as_ref() }.map(|d| Shape {
        width: d.width.into(),
        height: d.height.into(),
        depth: d.depth.into(),
        format: d.format,
        channels: d.channels,
        flags: d.flags,
    });
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged("cuArray3DCreate", shape, 1, false, handle, || unsafe {
        real(handle, desc)
    })
}

pub fn array_destroy(real: unsafe extern "C" fn(Handle) -> CuResult, handle: Handle) -> CuResult {
    // SAFETY (closure): forwarding the caller's argument.
    array_released(false, handle, || unsafe { real(handle) })
}

pub fn mipmapped_array_create(
    real: unsafe extern "C" fn(*mut Handle, *const Array3DDescriptor, u32) -> CuResult,
    handle: *mut Handle,
    desc: *const Array3DDescriptor,
    levels: u32,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    array_charged(
        "cuMipmappedArrayCreate",
        shape_3d(desc),
        levels,
        true,
        handle,
        || unsafe { real(handle, desc, levels) },
    )
}

pub fn mipmapped_array_destroy(
    real: unsafe extern "C" fn(Handle) -> CuResult,
    handle: Handle,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's argument.
    array_released(true, handle, || unsafe { real(handle) })
}

// ---------------------------------------------------------------------------
// Contexts (see `contexts`): charged what they take, credited when they go, and
// the allocations the driver frees with them credited too.

static CONTEXTS: ContextBook = ContextBook::new();

/// The device a context call names, with its cap resolved and its context operations
/// serialised. Err when the shim cannot charge a context there (a device index beyond
/// those it tracks): the call is refused, never passed uncounted. Ok(None) for an index
/// the driver itself will reject (negative).
fn context_lock(
    shim: &Shim,
    api: &str,
    dev: c_int,
) -> Result<Option<gpucap_core::contexts::DeviceLock<'static>>, CuResult> {
    if dev < 0 {
        return Ok(None);
    }
    match checked_device(shim, dev).and_then(|d| CONTEXTS.lock(d)) {
        Some(lock) => Ok(Some(lock)),
        None => {
            log!(
                Error,
                "refused {api} on GPU {dev}: gpucap tracks GPUs 0 to {}",
                MAX_DEVICES - 1
            );
            Err(CUDA_ERROR_INVALID_DEVICE)
        }
    }
}

/// Charges a context the driver just made (`measured`: the bytes it took, or why
/// they could not be measured); Err (the context already undone by `undo`) if the cap
/// cannot take it, or if it could not be measured and the device has a cap.
fn charge_context(
    api: &str,
    d: usize,
    measured: Result<u64, Unmeasured>,
    undo: impl FnOnce(),
) -> Result<u64, CuResult> {
    let capped = SHIM
        .ledger
        .usage(d)
        .is_some_and(|u| u.cap != gpucap_core::ledger::NO_CAP);
    let bytes = match contexts::verdict(measured, capped) {
        Verdict::Charge(bytes) => bytes,
        Verdict::Refuse(rc) => {
            undo();
            if let Err(why) = measured {
                log!(
                    Error,
                    "refused {api} on GPU {d}: the memory the context takes could not be measured ({why}), and a context gpucap cannot charge would escape the cap"
                );
            }
            return Err(rc);
        }
        Verdict::Uncounted => {
            if let Err(why) = measured {
                log!(
                    Error,
                    "{api} on GPU {d}: the memory the context takes could not be measured ({why}): not counted (GPU {d} has no cap)"
                );
            }
            return Ok(0);
        }
    };
    match reserve(api, Some(d as c_int), bytes) {
        Ok(Target::Charged(r)) => {
            r.keep();
            log!(
                Debug,
                "{api}: the context takes {} on GPU {d}",
                gpucap_core::size::format_bytes(bytes)
            );
            Ok(bytes)
        }
        Ok(Target::Unknown) => Ok(0),
        Err(rc) => {
            undo();
            Err(rc)
        }
    }
}

/// After a context went away on `device`: credits the allocations the driver freed
/// with it (those it no longer knows), and re-reads the pools.
fn after_teardown(device: usize) {
    let ledger = &SHIM.ledger;
    for (ptr, _) in ledger.live_on(Kind::Pointer, device) {
        if !real::pointer_alive(ptr)
            && let Some(c) = ledger.take(Kind::Pointer, ptr)
        {
            ledger.settle(c);
        }
    }
    for (mipmapped, alive) in [
        (false, real::array_alive as fn(u64) -> bool),
        (true, real::mipmapped_alive),
    ] {
        let map = array_map(mipmapped);
        for (h, _) in map.matching(|c| c.device == device) {
            if !alive(h)
                && let Some(c) = map.remove(h)
            {
                ledger.settle(c);
            }
        }
    }
    POOLS.drop_dead_ptrs(ledger, device, real::pointer_alive);
    POOLS.refresh(ledger, &real::Pools, device);
}

/// Settles what a call that may have ended a context found.
fn context_ended(api: &str, device: usize, ending: Ending) {
    match ending {
        Ending::Gone(charge) => {
            if let Some(c) = charge {
                SHIM.ledger.settle(c);
            }
            after_teardown(device);
        }
        Ending::Alive => {}
        Ending::Unknown => {
            // What the driver freed is still found allocation by allocation.
            log!(
                Warn,
                "{api}: the driver cannot say whether the context on GPU {device} still exists: its own memory stays charged"
            );
            after_teardown(device);
        }
    }
}

pub fn primary_ctx_retain(
    real: unsafe extern "C" fn(*mut Handle, c_int) -> CuResult,
    pctx: *mut Handle,
    dev: c_int,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(pctx, dev) };
    let mut lock = match context_lock(shim, "cuDevicePrimaryCtxRetain", dev) {
        Ok(Some(lock)) => lock,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    if pctx.is_null() || lock.primary_active(&real::Contexts) {
        return call(); // nothing is created
    }
    let (rc, measured) = lock.measure(&real::Contexts, call);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    match charge_context("cuDevicePrimaryCtxRetain", lock.device(), measured, || {
        real::release_primary(dev)
    }) {
        Ok(bytes) => {
            // SAFETY: the driver succeeded and filled the out-pointer (checked non-null).
            lock.set_primary(unsafe { *pctx } as u64, bytes);
            rc
        }
        Err(rc) => rc,
    }
}

pub fn primary_ctx_release(real: unsafe extern "C" fn(c_int) -> CuResult, dev: c_int) -> CuResult {
    primary_gone(dev, false, || {
        // SAFETY: forwarding the caller's argument.
        unsafe { real(dev) }
    })
}

pub fn primary_ctx_reset(real: unsafe extern "C" fn(c_int) -> CuResult, dev: c_int) -> CuResult {
    primary_gone(dev, true, || {
        // SAFETY: forwarding the caller's argument.
        unsafe { real(dev) }
    })
}

/// A release (the context goes when its last reference does, as the driver says
/// afterwards) or a reset (it goes now).
fn primary_gone(dev: c_int, reset: bool, call: impl FnOnce() -> CuResult) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let Some(mut lock) = checked_device(shim, dev).and_then(|d| CONTEXTS.lock(d)) else {
        return call();
    };
    let rc = call();
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let d = lock.device();
    let ending = if reset {
        Ending::Gone(lock.take_primary())
    } else {
        match real::Contexts.primary_active(d) {
            Some(false) => Ending::Gone(lock.take_primary()),
            Some(true) => Ending::Alive,
            None => Ending::Unknown,
        }
    };
    let api = if reset {
        "cuDevicePrimaryCtxReset"
    } else {
        "cuDevicePrimaryCtxRelease"
    };
    context_ended(api, d, ending);
    rc
}

/// A created context: measured, charged, undone if the cap cannot take it.
fn ctx_created(api: &str, pctx: *mut Handle, dev: c_int, call: impl Fn() -> CuResult) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let lock = match context_lock(shim, api, dev) {
        Ok(Some(lock)) => lock,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    if pctx.is_null() {
        return call();
    }
    let (rc, measured) = lock.measure(&real::Contexts, call);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    // SAFETY: the driver succeeded and filled the out-pointer (checked non-null).
    let ctx = unsafe { *pctx };
    match charge_context(api, lock.device(), measured, || real::destroy_context(ctx)) {
        Ok(bytes) => {
            lock.add_created(ctx as u64, bytes);
            rc
        }
        Err(rc) => rc,
    }
}

pub fn ctx_create(
    real: unsafe extern "C" fn(*mut Handle, u32, c_int) -> CuResult,
    pctx: *mut Handle,
    flags: u32,
    dev: c_int,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    ctx_created("cuCtxCreate", pctx, dev, || unsafe {
        real(pctx, flags, dev)
    })
}

pub fn ctx_create_v3(
    real: unsafe extern "C" fn(*mut Handle, *mut c_void, c_int, u32, c_int) -> CuResult,
    pctx: *mut Handle,
    params: *mut c_void,
    count: c_int,
    flags: u32,
    dev: c_int,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    ctx_created("cuCtxCreate_v3", pctx, dev, || unsafe {
        real(pctx, params, count, flags, dev)
    })
}

pub fn ctx_create_v4(
    real: unsafe extern "C" fn(*mut Handle, *mut c_void, u32, c_int) -> CuResult,
    pctx: *mut Handle,
    params: *mut c_void,
    flags: u32,
    dev: c_int,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    ctx_created("cuCtxCreate_v4", pctx, dev, || unsafe {
        real(pctx, params, flags, dev)
    })
}

/// The device of a context the program names, and its context operations serialised.
fn lock_of_context(ctx: Handle) -> Option<gpucap_core::contexts::DeviceLock<'static>> {
    CONTEXTS
        .created_device(ctx as u64)
        .or_else(|| real::context_device(ctx))
        .and_then(|d| CONTEXTS.lock(d))
}

pub fn ctx_destroy(real: unsafe extern "C" fn(Handle) -> CuResult, ctx: Handle) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's argument.
    let call = || unsafe { real(ctx) };
    let Some(lock) = lock_of_context(ctx) else {
        return call();
    };
    // cuCtxDestroy ends the context whatever its usage count.
    let taken = lock.take_created(ctx as u64);
    let rc = call();
    match (rc, taken) {
        (CUDA_SUCCESS, c) => context_ended("cuCtxDestroy", lock.device(), Ending::Gone(c)),
        (_, Some(c)) => lock.restore_created(ctx as u64, c),
        _ => {}
    }
    rc
}

/// `cuCtxDetach`: drops one usage count (`cuCtxAttach` added one); the context ends,
/// and the driver frees its memory, only with the last. Whether it did is asked of the
/// driver afterwards.
pub fn ctx_detach(real: unsafe extern "C" fn(Handle) -> CuResult, ctx: Handle) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's argument.
    let call = || unsafe { real(ctx) };
    let Some(mut lock) = lock_of_context(ctx) else {
        return call();
    };
    let id = real::context_id(ctx);
    let rc = call();
    if rc == CUDA_SUCCESS {
        let ending = lock.after_release(&real::Contexts, ctx as u64, id);
        context_ended("cuCtxDetach", lock.device(), ending);
    }
    rc
}

// ---------------------------------------------------------------------------
// The CUDA 2.x variants (32-bit pointers and sizes), counted like their _v2.

pub fn mem_alloc_v1(
    real: unsafe extern "C" fn(*mut u32, u32) -> CuResult,
    dptr: *mut u32,
    size: u32,
) -> CuResult {
    // SAFETY (closures): forwarding the caller's arguments; `dptr` is read only after
    // the driver succeeded.
    charged(
        "cuMemAlloc",
        current_device(),
        size.into(),
        Kind::Pointer,
        || unsafe { real(dptr, size) },
        || unsafe { u64::from(*dptr) },
    )
}

/// The capped `(free, total)` of the current device, from the driver's figures.
fn capped_info(shim: &Shim, free: u64, total: u64) -> (u64, u64) {
    match current_device().and_then(|d| checked_device(shim, d)) {
        Some(d) => {
            refresh_pools(d);
            let retained = if growth() {
                growth::retained_bytes(d)
            } else {
                0
            };
            shim.mem_info(d, free, total, retained)
        }
        None => (free, total),
    }
}

// ---------------------------------------------------------------------------
// NVML (see `nvml`): the device is matched to a CUDA ordinal by UUID. NVML is never
// a reason to initialise (or load) CUDA.

pub use gpucap_core::nvml::{NvmlMemory, NvmlMemoryV2};

/// `NVML_ERROR_NO_PERMISSION`: what every intercepted NVML call returns while the
/// configuration is invalid (as the CUDA calls return `CUDA_ERROR_NOT_PERMITTED`).
pub const NVML_ERROR_NO_PERMISSION: CuResult = 4;

/// The CUDA ordinal of an NVML device handle, with its cap resolved; None for a
/// device CUDA does not see here, or one without a cap (shown as the driver says).
/// Only for a process that initialised CUDA itself.
fn nvml_device(shim: &Shim, device: Handle) -> Option<usize> {
    let uuid = real::nvml_uuid(device)?;
    let visible = identity::visible(crate::real::visible_uuids)?;
    let d = checked_device(shim, identity::ordinal_of(visible, &uuid)? as c_int)?;
    shim.ledger
        .usage(d)
        .filter(|u| u.cap != gpucap_core::ledger::NO_CAP)?;
    refresh_pools(d);
    Some(d)
}

/// What CUDA would see in this process, worked out from NVML (read once).
static NVML_VIEW: std::sync::OnceLock<Vec<[u8; 16]>> = std::sync::OnceLock::new();

fn nvml_view() -> Option<&'static [[u8; 16]]> {
    if let Some(v) = NVML_VIEW.get() {
        return Some(v);
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let view = nvml::cuda_view(&real::nvml_gpus()?, visible.as_deref());
    Some(NVML_VIEW.get_or_init(|| view))
}

/// Whether the limit's keys match what CUDA would see, checked once; the message is
/// printed once, and while they do not, every NVML call fails closed.
static NVML_KEYS: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();

fn nvml_keys_match(spec: &gpucap_core::config::LimitSpec) -> bool {
    let Some(view) = nvml_view() else {
        return true; // NVML cannot list its GPUs: nothing is capped here (below)
    };
    NVML_KEYS
        .get_or_init(|| {
            identity::check_keys(spec, Some(view.len()), || Some(view))
                .inspect_err(|m| eprintln!("{m}"))
        })
        .is_ok()
}

/// The cap of an NVML device in a process that has not initialised CUDA (`total`: its
/// physical memory, for a fraction); None when it is no CUDA device of the process or
/// has no cap.
fn nvml_cap_without_cuda(
    spec: &gpucap_core::config::LimitSpec,
    device: Handle,
    total: u64,
) -> Option<u64> {
    let view = nvml_view()?;
    let uuid = real::nvml_uuid(device)?;
    let ordinal = identity::ordinal_of(view, &uuid)?;
    spec.for_device(ordinal as u32, Some(&uuid))
        .map(|limit| limit.resolve(total))
}

/// `nvmlDeviceGetMemoryInfo` and `_v2`: the driver's answer, capped for a GPU that
/// CUDA sees in this process; `NVML_ERROR_NO_PERMISSION` under an invalid configuration.
pub fn nvml_memory_info<M: nvml::MemoryInfo>(
    real: unsafe extern "C" fn(Handle, *mut M) -> CuResult,
    device: Handle,
    memory: *mut M,
) -> CuResult {
    // Not a CUDA call: the process does not become a CUDA user by it.
    let Ok(config) = SHIM.config_quiet() else {
        return NVML_ERROR_NO_PERMISSION;
    };
    if identity::failed().is_some() {
        return NVML_ERROR_NO_PERMISSION;
    }
    let cuda = real::cuda_initialised();
    if !cuda
        && let Some(spec) = &config.limit
        && !nvml_keys_match(spec)
    {
        return NVML_ERROR_NO_PERMISSION;
    }
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(device, memory) };
    if rc != 0 || memory.is_null() {
        return rc;
    }
    let Some(spec) = config.limit.as_ref() else {
        return rc; // no cap: the driver's figures
    };
    // SAFETY: NVML succeeded and filled the caller's struct.
    let m = unsafe { &mut *memory };
    let (free, total) = m.free_total();
    let shown = if cuda {
        nvml_device(&SHIM, device).map(|d| {
            let retained = if growth() {
                growth::retained_bytes(d)
            } else {
                0
            };
            SHIM.mem_info(d, free, total, retained)
        })
    } else {
        nvml_cap_without_cuda(spec, device, total).map(|cap| nvml::within_cap((free, total), cap))
    };
    if let Some(free_total) = shown {
        *m = m.capped(free_total);
    }
    rc
}
