//! What each hook does: find the device, ask the ledger, call the driver, record.
//! Each function receives the driver's real function as its first argument (the
//! table looks it up: a [`Real`](crate::driver::forward::Real), called as
//! `real.call(..)`) followed by the C arguments, pointers typed (`Out`, `In`, `OutArray`, `CText` in `driver::types`):
//! the hooks read and write the program's memory only through those, and hold no
//! `unsafe` code (but `init.rs`'s registration of a fork handler). One file per
//! family; this one holds what they share (the shim, the current device,
//! reserve/charge/free). The list of hooked functions (`driver/hooked.rs`) names each
//! hook by its family (`hooks::memory::mem_alloc`), so the families the table reaches
//! are `pub(crate)`; `arena`, `nvml_pool` and `residents` serve the others only.

#![deny(unsafe_code)]

use std::ffi::c_int;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use self::current::{context_device, current_device, known_device, one_gpu};
use self::init::join_in_child;
use crate::driver::types::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS,
    CuResult, Handle, Out,
};
use crate::driver::{calls, queries};
use crate::log::log;
use crate::state::{POOLS, SHIM, Shim};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::ledger::{Charge, Reservation};
use gpucap_core::{identity, linear};

mod arena;
pub(crate) mod arrays;
pub(crate) mod contexts;
pub(crate) mod current;
mod first_use;
pub(crate) mod functions;
pub(crate) mod globals;
pub(crate) mod graphs;
pub(crate) mod green;
pub(crate) mod info;
pub(crate) mod init;
pub(crate) mod launches;
pub(crate) mod libraries;
pub(crate) mod limits;
pub(crate) mod memory;
pub(crate) mod modules;
pub(crate) mod multi_device;
pub(crate) mod multicast;
pub(crate) mod nvml;
mod nvml_pool;
pub(crate) mod pools;
pub(crate) mod primary;
mod residents;
pub(crate) mod sync;
pub(crate) mod vmm;

/// The shim, or the error every call gets when the configuration is invalid (or
/// names a device UUID that is not visible, or the pool could not be joined). A forked
/// child of a pool member joins the pool as its own member first (`join_in_child`).
fn shim() -> Result<&'static Shim, CuResult> {
    if crate::membership::orphaned() {
        join_in_child();
    }
    if identity::failed().is_some() || crate::membership::failed().is_some() {
        return Err(CUDA_ERROR_NOT_PERMITTED);
    }
    SHIM.config()
        .map(|_| &SHIM)
        .map_err(|_| CUDA_ERROR_NOT_PERMITTED)
}

/// A device index the ledger can hold, with its cap resolved.
fn checked_device(shim: &Shim, device: c_int) -> Option<usize> {
    let d = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES)?;
    shim.resolve_cap(d, || calls::physical_total(d));
    Some(d)
}

/// Set by a successful `cuInit` when allocations of linear memory may take the short
/// path: the configuration is valid and nothing failed closed (the pool, if any, joined),
/// and growth mode is off. Everything [`reserve`] checks first was then checked once: an
/// allocation on a device known without a driver call (see `current.rs`) whose cap is
/// resolved is a compare-and-swap on that device's figures (and the pool's reservation,
/// `Member::try_reserve`) and a map insert; anything else, and anything either cap
/// cannot take now, goes the full way (a forked child of a pool member too: its ledger
/// finds no membership until it joined). One byte, read once per
/// call: [`SHORT_OFF`], [`SHORT_ON`] or [`SHORT_GPU0`].
static SHORT_PATH: AtomicU8 = AtomicU8::new(SHORT_OFF);

/// No short path: every call goes the full way.
const SHORT_OFF: u8 = 0;
/// The short path, on the device this thread remembers, once its cap is resolved.
const SHORT_ON: u8 = 1;
/// The short path with one visible GPU whose cap `cuInit` resolved: device 0, nothing
/// to ask or check per call.
const SHORT_GPU0: u8 = 2;

#[inline(always)]
fn short_path() -> bool {
    SHORT_PATH.load(Relaxed) != SHORT_OFF
}

/// Called at the end of a successful `cuInit` (see [`SHORT_PATH`]).
fn note_short_path(shim: &Shim) {
    let short = self::shim().is_ok() && !memory::growth();
    let state = if !short {
        SHORT_OFF
    } else if one_gpu() {
        // Resolved now rather than by the first allocation's full path.
        checked_device(shim, 0);
        SHORT_GPU0
    } else {
        SHORT_ON
    };
    SHORT_PATH.store(state, Relaxed);
}

/// The device an allocation on the short path is charged to, if it may take it: the
/// one GPU, or the device this thread remembers once its cap is resolved.
#[inline(always)]
fn short_device() -> Option<usize> {
    match SHORT_PATH.load(Relaxed) {
        SHORT_GPU0 => Some(0),
        SHORT_ON => known_device().filter(|&d| SHIM.cap_known(d)),
        _ => None,
    }
}

/// Where an allocation is charged, or the error to return without calling the driver.
enum Target<'a> {
    /// Reserved: call the driver, then commit.
    Charged(Reservation<'a>),
    /// No device to charge (no current context): let the driver answer the call
    /// itself, with its own error or success; nothing is reserved or recorded.
    Uncharged,
}

/// Where a call's memory is: on the calling thread's current context's device, or on a
/// device the call names itself (a VMM handle's location, a stream's or a pool's
/// device), which needs no current context. None: nothing to charge.
#[derive(Clone, Copy)]
pub(super) enum On {
    Current(Option<c_int>),
    Named(Option<c_int>),
}

impl On {
    /// The device, whoever named it.
    pub(super) fn device(self) -> Option<c_int> {
        let (On::Current(d) | On::Named(d)) = self;
        d
    }
}

/// Reserves `bytes` to serve a request of `requested` bytes (a refusal names the
/// request as the program made it) on the device the call's memory is `on`.
fn reserve(api: &str, on: On, requested: u64, bytes: u64) -> Result<Target<'static>, CuResult> {
    let (device, current) = (on.device(), matches!(on, On::Current(_)));
    let shim = shim()?;
    let Some(device) = device else {
        return Ok(Target::Uncharged);
    };
    let Some(d) = checked_device(shim, device) else {
        log!(
            Error,
            "refused {api}: device index {device} is out of the range gpucap tracks"
        );
        return Err(CUDA_ERROR_INVALID_DEVICE);
    };
    reclaim_for(shim, d, bytes);
    // The current context's device may not have been asked now (one GPU, or this
    // thread's device known): a request the cap would refuse is first checked to have a
    // current context at all, so that a call without one (or with a context destroyed
    // meanwhile) gets the driver's own error, as it would without the shortcut. A device
    // the call names needs no context: the driver serves it from any thread, so it is
    // charged, or refused, there (before, a `cuMemCreate` from a thread with no current
    // context passed uncharged: PyTorch's expandable segments from a loader's threads).
    if current && shim.ledger.would_refuse(d, bytes) && context_device().is_none() {
        return Ok(Target::Uncharged);
    }
    shim.reserve(api, d, requested, bytes, 0)
        .map(Target::Charged)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

/// Reserves `bytes` on `d`, a device the call makes something on itself (a context),
/// needing no current context: charged there whatever is current on the thread, if
/// anything. A refusal is logged with gpucap's line.
fn reserve_on(
    shim: &'static Shim,
    api: &str,
    d: usize,
    bytes: u64,
) -> Result<Reservation<'static>, CuResult> {
    reclaim_for(shim, d, bytes);
    shim.reserve(api, d, bytes, bytes, 0)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

/// Before a request the cap cannot take: memory the process's own pools only cache
/// is trimmed and re-read, and growth mode's retained pages no allocation needs are
/// given back (`arena::release_for`), so the program is not refused what it is itself
/// holding.
fn reclaim_for(shim: &Shim, d: usize, bytes: u64) {
    if POOLS.any_on(d) && shim.ledger.usage(d).is_some_and(|u| u.headroom() < bytes) {
        POOLS.reclaim(&shim.ledger, &queries::Pools, d);
    }
    // Growth mode knows its page size once it made a page: one load otherwise.
    if gpucap_core::growth::GROWTH.page(d) != 0
        && shim.ledger.would_refuse(d, bytes)
        && gpucap_core::growth::retained_bytes(d) > 0
    {
        arena::release_for(d, bytes);
    }
}

/// Calls the driver for a linear allocation of `requested` bytes with its charge
/// ([`linear::charge`]) reserved on the current context's device; commits under the key
/// `key()` reads once the driver succeeded, rolls back otherwise.
#[inline(always)]
fn charged(
    api: &str,
    requested: u64,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let bytes = linear::charge(requested);
    match charged_short(bytes, call, key) {
        Ok(rc) => rc,
        Err((call, key)) => charged_on(api, current_device(), requested, bytes, call, key),
    }
}

/// [`charged`] on the short path (see [`SHORT_PATH`]): the driver's answer, or the
/// closures back when the full path must decide (nothing was counted then).
#[inline(always)]
fn charged_short<C: FnOnce() -> CuResult, K: FnOnce() -> u64>(
    bytes: u64,
    call: C,
    key: K,
) -> Result<CuResult, (C, K)> {
    if let Some(d) = short_device()
        && let Some(r) = SHIM.ledger.try_reserve(d, bytes)
    {
        let rc = call();
        if rc == CUDA_SUCCESS {
            r.commit(key());
        } else {
            r.roll_back();
        }
        return Ok(rc);
    }
    Err((call, key))
}

/// [`charged`] the full way, on `device`: `bytes` reserved for a request of `requested`.
#[inline]
fn charged_on(
    api: &str,
    device: Option<c_int>,
    requested: u64,
    bytes: u64,
    call: impl FnOnce() -> CuResult,
    key: impl FnOnce() -> u64,
) -> CuResult {
    let target = match reserve(api, On::Current(device), requested, bytes) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let rc = call();
    if let (CUDA_SUCCESS, Target::Charged(r)) = (rc, target) {
        r.commit(key());
    }
    rc
}

/// Frees a device pointer through the driver (`cuMemFree*`, `cuMemFreeAsync*`),
/// crediting the cap only once the driver succeeded. A plain allocation is taken out
/// of the ledger first (the common case, one lock-free lookup); pool memory goes back
/// to its pool, which stays charged for what it reserves.
#[inline(always)]
fn pointer_freed(dptr: u64, call: impl FnOnce() -> CuResult) -> CuResult {
    if !short_path()
        && let Err(rc) = shim()
    {
        return rc;
    }
    if let Some(c) = SHIM.ledger.take(dptr) {
        return charge_freed(dptr, c, call);
    }
    uncharged_freed(dptr, call)
}

/// Frees a plain allocation the ledger gave up (`c`): credited once the driver
/// succeeded, put back if it failed; in a pool, announced to it first.
#[inline(always)]
fn charge_freed(dptr: u64, c: Charge, call: impl FnOnce() -> CuResult) -> CuResult {
    // Two paths, not `announce` for all: a process outside any pool has nothing to
    // announce, and carrying an announcement across the driver call would cost it
    // instructions on every free.
    if SHIM.ledger.pooled() {
        return charge_freed_in_pool(dptr, c, call);
    }
    let rc = call();
    if rc == CUDA_SUCCESS {
        SHIM.ledger.settle_alone(c);
    } else {
        SHIM.ledger.restore(dptr, c);
    }
    rc
}

/// [`charge_freed`] in a pool: the free announced before the driver call (see
/// `Ledger::announce`).
#[inline(always)]
fn charge_freed_in_pool(dptr: u64, c: Charge, call: impl FnOnce() -> CuResult) -> CuResult {
    let freeing = SHIM.ledger.announce(c);
    let rc = call();
    if rc == CUDA_SUCCESS {
        SHIM.ledger.settle_announced(freeing);
    } else {
        SHIM.ledger.withdraw(freeing);
        SHIM.ledger.restore(dptr, c);
    }
    rc
}

/// Frees a pointer the ledger does not hold: pool memory back to its pool, anything
/// else (an unknown or foreign pointer) only forwarded.
#[inline]
fn uncharged_freed(dptr: u64, call: impl FnOnce() -> CuResult) -> CuResult {
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

/// The device pointer the driver wrote to the program's out-pointer `dptr` (read only
/// after the driver succeeded); 0 where the program passed no out-pointer.
#[inline(always)]
fn written_pointer<P: Word>(dptr: Out<P>) -> u64 {
    dptr.get().map_or(0, Word::get)
}

/// Reads the handle the driver wrote (only after it succeeded); null where the
/// program passed no out-pointer.
fn written_handle(out: Out<Handle>) -> Handle {
    out.get().unwrap_or(std::ptr::null_mut())
}

/// How many GPUs the driver shows this process (after `CUDA_VISIBLE_DEVICES`), or None
/// when it cannot say. Asked after a successful `cuInit`, for the key check.
fn visible_count() -> Option<usize> {
    let mut n: c_int = 0;
    (calls::cuDeviceGetCount(Out::from(&mut n))? == CUDA_SUCCESS)
        .then(|| usize::try_from(n).ok())
        .flatten()
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
