//! What each hook does: find the device, ask the ledger, call the driver, record.
//! Each function receives the driver's real function as its first argument (the
//! table in `ffi` looks it up) followed by the C arguments, untouched.

use std::ffi::{c_int, c_void};

use crate::ffi::{
    self, CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    CuResult,
};
use crate::arena;
use crate::growth::{self, GROWTH};
use crate::ledger::{Charge, Kind, LiveMap, Reservation};
use crate::shim::{SHIM, Shim, log};

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

const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;

/// The shim, or the error every call gets when the configuration is invalid.
fn shim() -> Result<&'static Shim, CuResult> {
    SHIM.config().map(|_| &SHIM).map_err(|_| CUDA_ERROR_NOT_PERMITTED)
}

/// A device index the ledger can hold, with its cap resolved.
fn checked_device(shim: &Shim, device: c_int) -> Option<usize> {
    let d = usize::try_from(device).ok()?;
    shim.ledger.usage(d)?;
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
        log!(Error, "refused {api}: device index {device} is out of the range gpucap tracks");
        return Err(CUDA_ERROR_INVALID_DEVICE);
    };
    shim.reserve(api, d, bytes)
        .map(Target::Charged)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
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

/// Frees through the driver, crediting the cap only once the driver succeeded.
fn released(kind: Kind, key: u64, call: impl FnOnce() -> CuResult) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let taken: Option<Charge> = SHIM.ledger.take(kind, key);
    let rc = call();
    match (rc, taken) {
        (CUDA_SUCCESS, Some(c)) => SHIM.ledger.settle(c),
        (_, Some(c)) => SHIM.ledger.restore(kind, key, c),
        _ => {}
    }
    rc
}

/// Reads the pointer the driver wrote (only after it succeeded).
fn written(dptr: *mut Dptr) -> u64 {
    // SAFETY: called only after the driver returned success for this out-pointer.
    unsafe { *dptr }
}

pub fn init(real: unsafe extern "C" fn(u32) -> CuResult, flags: u32) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real(flags) }
}

pub fn mem_alloc(real: unsafe extern "C" fn(*mut Dptr, usize) -> CuResult, dptr: *mut Dptr, size: usize) -> CuResult {
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
    charged(api, current_device(), size as u64, Kind::Pointer, || unsafe { real(dptr, size) }, || written(dptr))
}

/// Whether growth-only mode is on (false while misconfigured: callers fail then).
fn growth() -> bool {
    SHIM.config().is_ok_and(|c| c.growth)
}

/// Frees `dptr` if growth mode served it.
fn growth_free(dptr: Dptr) -> Option<CuResult> {
    if growth() && GROWTH.has_mappings() { arena::free(dptr) } else { None }
}

pub fn mem_alloc_managed(
    real: unsafe extern "C" fn(*mut Dptr, usize, u32) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
    flags: u32,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    charged("cuMemAllocManaged", current_device(), size as u64, Kind::Pointer, || unsafe { real(dptr, size, flags) }, || written(dptr))
}

/// Pitch alignment the reservation assumes before the driver says the real pitch.
const PITCH_GUESS: u64 = 512;

pub fn mem_alloc_pitch(
    real: unsafe extern "C" fn(*mut Dptr, *mut usize, usize, usize, u32) -> CuResult,
    dptr: *mut Dptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> CuResult {
    let api = "cuMemAllocPitch";
    let guess = (width as u64)
        .checked_next_multiple_of(PITCH_GUESS)
        .and_then(|w| w.checked_mul(height as u64))
        .unwrap_or(u64::MAX);
    let mut target = match reserve(api, current_device(), guess) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(dptr, pitch, width, height, elem) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    if let Target::Charged(r) = &mut target {
        // SAFETY: the driver succeeded and filled `pitch`.
        let actual = (unsafe { *pitch } as u64).saturating_mul(height as u64);
        if let Err(refusal) = SHIM.ledger.resize(r, actual) {
            // The driver padded more than the cap allows: give it back and refuse.
            let dev = r.charge().device;
            log!(Warn, "{}", crate::shim::refusal_line(api, dev, actual, refusal));
            if let Some(free) = ffi::driver::cuMemFree_v2() {
                // SAFETY: freeing the allocation the driver just made.
                unsafe { free(written(dptr)) };
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if let Target::Charged(r) = target {
        r.commit(Kind::Pointer, written(dptr));
    }
    rc
}

pub fn mem_free(real: unsafe extern "C" fn(Dptr) -> CuResult, dptr: Dptr) -> CuResult {
    if let Some(rc) = growth_free(dptr) {
        return rc;
    }
    // SAFETY (closure): forwarding the caller's argument.
    released(Kind::Pointer, dptr, || unsafe { real(dptr) })
}

pub fn mem_alloc_async(
    real: unsafe extern "C" fn(*mut Dptr, usize, Stream) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
    stream: Stream,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    charged("cuMemAllocAsync", current_device(), size as u64, Kind::Pointer, || unsafe { real(dptr, size, stream) }, || written(dptr))
}

pub fn mem_alloc_from_pool_async(
    real: unsafe extern "C" fn(*mut Dptr, usize, Handle, Stream) -> CuResult,
    dptr: *mut Dptr,
    size: usize,
    pool: Handle,
    stream: Stream,
) -> CuResult {
    let device = pool_device(pool).or_else(current_device);
    // SAFETY (closure): forwarding the caller's arguments.
    charged("cuMemAllocFromPoolAsync", device, size as u64, Kind::Pointer, || unsafe { real(dptr, size, pool, stream) }, || written(dptr))
}

pub fn mem_free_async(real: unsafe extern "C" fn(Dptr, Stream) -> CuResult, dptr: Dptr, stream: Stream) -> CuResult {
    if let Some(rc) = growth_free(dptr) {
        return rc;
    }
    // The memory returns to the pool when the stream reaches the free; the cap is
    // credited when the free is enqueued, as the program sees it.
    // SAFETY (closure): forwarding the caller's arguments.
    released(Kind::Pointer, dptr, || unsafe { real(dptr, stream) })
}

/// Devices of the pools the program created, by pool handle.
static POOLS: LiveMap = LiveMap::new();

fn pool_device(pool: Handle) -> Option<c_int> {
    POOLS.get(pool as u64).map(|c| c.device as c_int)
}

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
        if loc.location_type == CU_MEM_LOCATION_TYPE_DEVICE {
            if let Ok(device) = usize::try_from(loc.location_id) {
                POOLS.insert(handle as u64, Charge { device, bytes: 0 });
            }
        }
    }
    rc
}

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
    // SAFETY (closures): forwarding the caller's arguments; `handle` is read only
    // after the driver succeeded.
    charged("cuMemCreate", device, size as u64, Kind::Handle, || unsafe { real(handle, size, prop, flags) }, || unsafe { *handle })
}

pub fn mem_release(real: unsafe extern "C" fn(u64) -> CuResult, handle: u64) -> CuResult {
    // SAFETY (closure): forwarding the caller's argument.
    released(Kind::Handle, handle, || unsafe { real(handle) })
}

pub fn mem_get_info(real: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult, free: *mut usize, total: *mut usize) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(free, total) };
    if rc != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return rc;
    }
    if let Some(d) = current_device().and_then(|d| checked_device(shim, d)) {
        // SAFETY: the driver succeeded and filled both out-pointers.
        unsafe {
            let (f, t) = shim.mem_info(d, *free as u64, *total as u64, growth::retained_bytes(d));
            (*free, *total) = (f as usize, t as usize);
        }
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

pub fn device_total_mem(real: unsafe extern "C" fn(*mut usize, c_int) -> CuResult, bytes: *mut usize, dev: c_int) -> CuResult {
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
        unsafe { *bytes = shim.total_mem(d, *bytes as u64) as usize };
    }
    rc
}
