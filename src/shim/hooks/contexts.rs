//! Contexts (see `gpucap_core::contexts`).

use std::ffi::{c_int, c_void};

use super::current::moves_current;
use super::{checked_device, reserve_on, shim, written_handle};
use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CuResult, Handle, Out,
};
use crate::log::log;
use crate::state::{
    CONTEXTS, GREENS, KERNELS, LAUNCHED, LIMITS, MODULES, POOLS, SHIM, Shim, array_map,
};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::contexts::{self, CtxDriver, Ending, MeasuredBy, Unmeasured};
use gpucap_core::ledger::{Charge, Freeing, Reservation};
use gpucap_core::residents::{Gauge, Resident};

// ---------------------------------------------------------------------------
// Contexts (see `contexts`): charged what they take, credited when they go, and
// the allocations the driver frees with them credited too.

/// The device a context call names, with its cap resolved and its context operations
/// serialised. Err when the shim cannot charge a context there (a device index beyond
/// those it tracks): the call is refused, never passed uncounted. Ok(None) for an index
/// the driver itself will reject (negative).
pub(super) fn context_lock(
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

/// What this process's pool's members mark of their traffic on `device` (None outside a
/// pool): the context's measurement takes what they gave back and allocated in its
/// window out of the driver's device-wide figure (see `DeviceLock::measure`).
pub(super) fn pool_marks(
    device: usize,
) -> Option<gpucap_core::budget::PoolTraffic<'static, 'static>> {
    crate::membership::current().and_then(|m| m.traffic(device))
}

/// [`pool_marks`] for a measurement whose call this member reserved `held` bytes for
/// before it (marked started in its own slot): that reservation is not the pool's traffic.
pub(super) fn pool_marks_holding(
    device: usize,
    held: Option<&gpucap_core::ledger::Reservation<'_>>,
) -> Option<gpucap_core::budget::PoolTraffic<'static, 'static>> {
    pool_marks(device).map(|t| t.holding(held.map_or(0, |r| r.charge().bytes)))
}

/// In a pool that knows no figure for a context on `device`'s GPU: waits for the pool's
/// first-context window there, so that the first figure is measured alone (see
/// `membership::first_context_window`); said at debug level when it waited, at warn
/// level when it gave up (the context is then measured beside the others' and charged
/// whole: more, never less).
fn first_context_window(
    api: &str,
    device: usize,
) -> Option<gpucap_pool_file::ContextWindow<'static>> {
    use gpucap_pool_file::WindowOutcome;
    let window = crate::membership::first_context_window(device)?;
    let waited = window.waited().as_secs_f64();
    match window.outcome() {
        WindowOutcome::OutOfPatience => log!(
            Warn,
            "{api} on GPU {device}: another member's first context there was still being made after {waited:.1} s; this one is measured beside it (charged whole)"
        ),
        WindowOutcome::Unsupported => log!(
            Warn,
            "{api} on GPU {device}: the pool's file system refused the first-context lock; this context is measured beside any other (charged whole)"
        ),
        WindowOutcome::FileLost => log!(
            Warn,
            "{api} on GPU {device}: the program closed gpucap's descriptor of the pool file and its path names another file now; this context is measured beside any other (charged whole)"
        ),
        _ if waited > 0.001 => log!(
            Debug,
            "{api} on GPU {device}: waited {waited:.3} s for the pool's first context figure"
        ),
        _ => {}
    }
    Some(window)
}

/// Reserves, before the driver makes a context on `lock`'s device, what it is expected
/// to take: the least a context measured there took, by this process
/// (`DeviceLock::expected`) or by any member of its pool, whichever is less (a
/// measurement errs only high: one of this process's, inflated by the other members'
/// frees, must not outweigh theirs). Charged to that device, whatever context is current
/// (none, during a primary retain). Err (with gpucap's line) when the cap, or the
/// pool's, cannot take it: the context is then not made.
pub(super) fn reserve_context(
    shim: &'static Shim,
    api: &str,
    lock: &gpucap_core::contexts::DeviceLock<'_>,
) -> Result<Reservation<'static>, CuResult> {
    let d = lock.device();
    let pool = crate::membership::current().map_or(0, |m| m.context_bytes(d));
    reserve_on(shim, api, d, lock.expected_beside(pool))
}

/// Charges a context the driver just made on `lock`'s device (`measured`: the bytes it
/// took device-wide, or why they could not be measured), `held` being what
/// [`reserve_context`] reserved for it before, with `others` contexts of other members
/// of the pool made on the GPU at the same moment, and `own` what the driver's figure
/// for this process moved by, where it can be read (see `contexts::settle` and
/// `settle_own`). Err (the context already undone by `undo`, then `held` given back) if
/// the cap or the pool cannot take it, or if it could not be measured and the device
/// has a cap.
fn charge_context(
    api: &str,
    lock: &mut gpucap_core::contexts::DeviceLock<'_>,
    measured: Result<u64, Unmeasured>,
    held: Reservation<'static>,
    others: u64,
    own: Option<u64>,
    undo: impl FnOnce(),
) -> Result<u64, CuResult> {
    let d = lock.device();
    let measured_bytes = match super::residents::judge_measured(api, "context", d, measured) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(0),
        Err(rc) => {
            undo();
            drop(held);
            return Err(rc);
        }
    };
    let expected = held.charge().bytes;
    let (bytes, learned) = match own {
        Some(own) => {
            let (bytes, learned) = contexts::settle_own(measured_bytes, expected, others, own);
            (bytes, Some(learned))
        }
        None => {
            let s = contexts::settle(measured_bytes, expected, others);
            (s.bytes, s.learn.then_some(measured_bytes))
        }
    };
    if let Some(figure) = learned {
        lock.learn(figure);
        if let Some(m) = crate::membership::current() {
            m.note_context_bytes(d, lock.expected(), lock.expectation_settled());
        }
    }
    // A charge held at the expectation above what was seen taken marks only what was
    // seen as made (another member's window does not take the rest off).
    let seen = own.unwrap_or(measured_bytes);
    let bytes = super::residents::charge_undoable_floored(api, d, Some(held), bytes, seen, undo)?;
    log!(
        Debug,
        "{api}: the context takes {} on GPU {d} (measured {} on the device{}{})",
        gpucap_core::size::format_bytes(bytes),
        gpucap_core::size::format_bytes(measured_bytes),
        own.map_or(String::new(), |o| format!(
            ", {} in NVML's figure for this process",
            gpucap_core::size::format_bytes(o)
        )),
        if others == 0 {
            String::new()
        } else {
            format!(", while {others} other members made contexts there")
        }
    );
    Ok(bytes)
}

/// Makes a context on `lock`'s device with `call` (the driver's creation or primary
/// retain), measured and charged: reserved first at what a context there is expected
/// to take (refused before it is made if the cap cannot take that), measured while the
/// pool counts it in flight, then settled (`contexts::settle`) and undone with `undo`
/// if the cap cannot take what it took. Members of a pool make their contexts in
/// parallel. Where NVML gives this process's own figure (its pid provably its own), that
/// figure settles the context whatever else was in flight; elsewhere, while the pool
/// knows no figure for a context on the GPU, one member measures alone first
/// (`first_context_window`). Ok(bytes charged) once the driver succeeded, else the
/// driver's error or gpucap's refusal.
pub(super) fn make_context(
    shim: &'static Shim,
    api: &str,
    lock: &mut gpucap_core::contexts::DeviceLock<'_>,
    mut call: impl FnMut() -> CuResult,
    undo: impl FnOnce(),
) -> Result<u64, CuResult> {
    let d = lock.device();
    let member = crate::membership::current();
    // This process's own figure before the call (None inside it: not listed, nothing
    // held yet), where NVML gives it for a pid provably this process's. Read even before
    // the process's first context: an image exec'd in its place keeps its pid, and NVML
    // lists the old image's memory under it until the driver freed it (taken for 0, the
    // new context would be charged the old image's bytes too: a refusal below the cap,
    // `pool::forks::an_exec_chain_starts_a_new_member_and_the_old_images_share_comes_back`).
    let own_before = queries::Contexts.own_used(d).ok();
    let knows = |m: &gpucap_core::budget::Member<'_>| {
        lock.expectation_known() || m.context_figure(d).is_some()
    };
    let first = own_before.is_none() && member.is_some_and(|m| !knows(m));
    let mut held = reserve_context(shim, api, lock)?;
    // Held until the context is charged: its figure is then the pool's.
    let _window = if first {
        first_context_window(api, d)
    } else {
        None
    };
    if first && let Some(m) = member {
        // Another member's figure arrived while this one waited: reserved now.
        let expected = lock.expected_beside(m.context_bytes(d));
        if expected > held.charge().bytes
            && let Err(refusal) = SHIM.ledger.resize(&mut held, expected)
        {
            SHIM.refused(api, d, expected, refusal);
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    let charged = || SHIM.ledger.usage(d).map_or(0, |u| u.used);
    let charged_before = charged();
    let flight = member.and_then(|m| m.context_started(d));
    let mut own_after = None;
    let marks = pool_marks_holding(d, Some(&held));
    let (rc, measured, how) = lock.measure(&queries::Contexts, None, marks, || {
        let rc = call();
        if own_before.is_some() && rc == CUDA_SUCCESS {
            own_after = Some(queries::Contexts.own_used(d));
        }
        rc
    });
    let others = match (member, flight) {
        (Some(m), Some(f)) => m.context_ended(f).others,
        _ => 0,
    };
    log_how_measured(api, d, &how);
    if rc != CUDA_SUCCESS {
        return Err(rc);
    }
    let own = match (own_before, own_after) {
        (Some(before), Some(Ok(Some(after)))) => Some(gpucap_core::residents::loaded(
            before.unwrap_or(0),
            after,
            charged_before,
            charged(),
        )),
        _ => None,
    };
    let measured = measured.map(gpucap_core::residents::taken);
    charge_context(api, lock, measured, held, others, own, undo)
}

/// Says at debug level how the first context on a device was measured: by NVML, or
/// with a temporary context and why NVML could not be used.
fn log_how_measured(api: &str, d: usize, how: &MeasuredBy) {
    match how {
        MeasuredBy::Context => {}
        MeasuredBy::Nvml => log!(
            Debug,
            "{api}: the first context on GPU {d} is measured by NVML's free memory before and after (no other context made)"
        ),
        MeasuredBy::Temporary(why) => log!(
            Debug,
            "{api}: the first context on GPU {d} is measured with a temporary context, as NVML cannot be used: {why}"
        ),
    }
}

/// After a context went away on `device`: credits the allocations the driver freed
/// with it (those it no longer knows), and re-reads the pools.
pub(super) fn after_teardown(device: usize) {
    let ledger = &SHIM.ledger;
    for (ptr, _) in ledger.live_on(device) {
        if !queries::pointer_alive(ptr)
            && let Some(c) = ledger.take(ptr)
        {
            ledger.settle(c);
        }
    }
    for (mipmapped, alive) in [
        (false, queries::array_alive as fn(u64) -> bool),
        (true, queries::mipmapped_alive),
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
    residents_gone(device);
    POOLS.drop_dead_ptrs(ledger, device, queries::pointer_alive);
    POOLS.refresh(ledger, &queries::Pools, device);
}

/// What a call that may end a context announced to the pool before it (see
/// `Ledger::announce`): the context's own charge, and the allocations the driver would
/// free with it.
pub(super) struct Announced {
    context: Option<Freeing>,
    with_it: Option<Freeing>,
}

impl Announced {
    /// Before a call that may end `charge` (a context's, if it has one here) on `device`.
    /// The allocations and modules on the device are announced together (in a pool
    /// only): those the driver freed are credited one by one after it (`after_teardown`),
    /// and the announcement is withdrawn once they are.
    pub(super) fn before(device: usize, charge: Option<Charge>) -> Announced {
        let with_it = SHIM.ledger.pooled().then(|| {
            let bytes = SHIM
                .ledger
                .live_on(device)
                .iter()
                .map(|(_, c)| c.bytes)
                .sum::<u64>()
                + MODULES.bytes_on(device)
                + LIMITS.bytes_on(device)
                + KERNELS.bytes_on(device);
            SHIM.ledger.announce(Charge { device, bytes })
        });
        Announced {
            context: charge.map(|c| SHIM.ledger.announce(c)),
            with_it,
        }
    }
}

/// [`Announced::before`] a call that may end `ctx` on `lock`'s device.
fn announce_context(lock: &gpucap_core::contexts::DeviceLock<'_>, ctx: Handle) -> Announced {
    Announced::before(lock.device(), lock.charge_of(ctx as u64))
}

/// Settles what a call that may have ended a context found; `announced` is what was
/// announced before the call ([`Announced::before`]).
pub(super) fn context_ended(api: &str, device: usize, ending: Ending, announced: Announced) {
    let settle = |charge: Option<Charge>| match (charge, announced.context) {
        // The same charge, under the same device lock.
        (Some(_), Some(f)) => SHIM.ledger.settle_announced(f),
        (Some(c), None) => SHIM.ledger.settle(c),
        (None, Some(f)) => SHIM.ledger.withdraw(f),
        (None, None) => {}
    };
    match ending {
        Ending::Gone(charge) => {
            settle(charge);
            after_teardown(device);
        }
        Ending::Alive => settle(None),
        Ending::Unknown => {
            settle(None);
            // What the driver freed is still found allocation by allocation.
            log!(
                Warn,
                "{api}: the driver cannot say whether the context on GPU {device} still exists: its own memory stays charged"
            );
            after_teardown(device);
        }
    }
    if let Some(f) = announced.with_it {
        SHIM.ledger.withdraw(f);
    }
}

/// A created context: measured, charged, undone if the cap cannot take it.
pub(super) fn ctx_created(
    api: &str,
    pctx: Out<Handle>,
    dev: c_int,
    call: impl Fn() -> CuResult,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let mut lock = match context_lock(shim, api, dev) {
        Ok(Some(lock)) => lock,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    if pctx.is_null() {
        return call();
    }
    // Called once the driver succeeded, which filled the out-pointer (checked non-null).
    let undo = || queries::destroy_context(written_handle(pctx));
    match make_context(shim, api, &mut lock, call, undo) {
        Ok(bytes) => {
            lock.add_created(written_handle(pctx) as u64, bytes);
            CUDA_SUCCESS
        }
        Err(rc) => rc,
    }
}

pub fn ctx_create(
    real: Real<(Out<Handle>, u32, c_int)>,
    pctx: Out<Handle>,
    flags: u32,
    dev: c_int,
) -> CuResult {
    moves_current(|| ctx_created("cuCtxCreate", pctx, dev, || real.call(pctx, flags, dev)))
}

pub fn ctx_create_v3(
    real: Real<(Out<Handle>, *mut c_void, c_int, u32, c_int)>,
    pctx: Out<Handle>,
    params: *mut c_void,
    count: c_int,
    flags: u32,
    dev: c_int,
) -> CuResult {
    moves_current(|| {
        ctx_created("cuCtxCreate_v3", pctx, dev, || {
            real.call(pctx, params, count, flags, dev)
        })
    })
}

pub fn ctx_create_v4(
    real: Real<(Out<Handle>, *mut c_void, u32, c_int)>,
    pctx: Out<Handle>,
    params: *mut c_void,
    flags: u32,
    dev: c_int,
) -> CuResult {
    moves_current(|| {
        ctx_created("cuCtxCreate_v4", pctx, dev, || {
            real.call(pctx, params, flags, dev)
        })
    })
}

/// The device of a context the program names, and its context operations serialised.
pub(super) fn lock_of_context(ctx: Handle) -> Option<gpucap_core::contexts::DeviceLock<'static>> {
    CONTEXTS
        .created_device(ctx as u64)
        .or_else(|| queries::context_device(ctx))
        .and_then(|d| CONTEXTS.lock(d))
}

pub fn ctx_destroy(real: Real<(Handle,)>, ctx: Handle) -> CuResult {
    moves_current(|| destroyed(real, ctx))
}

fn destroyed(real: Real<(Handle,)>, ctx: Handle) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let call = || real.call(ctx);
    let Some(mut lock) = lock_of_context(ctx) else {
        return call();
    };
    // cuCtxDestroy ends the context whatever its usage count.
    let announced = announce_context(&lock, ctx);
    let taken = lock.take_created(ctx as u64);
    let rc = call();
    match (rc, taken) {
        (CUDA_SUCCESS, c) => {
            context_ended("cuCtxDestroy", lock.device(), Ending::Gone(c), announced)
        }
        (_, taken) => {
            if let Some(c) = taken {
                lock.restore_created(ctx as u64, c);
            }
            context_ended("cuCtxDestroy", lock.device(), Ending::Alive, announced);
        }
    }
    rc
}

/// `cuCtxDetach`: drops one usage count (`cuCtxAttach` added one); the context ends,
/// and the driver frees its memory, only with the last. Whether it did is asked of the
/// driver afterwards.
pub fn ctx_detach(real: Real<(Handle,)>, ctx: Handle) -> CuResult {
    moves_current(|| detached(real, ctx))
}

fn detached(real: Real<(Handle,)>, ctx: Handle) -> CuResult {
    if let Err(rc) = shim() {
        return rc;
    }
    let call = || real.call(ctx);
    let Some(mut lock) = lock_of_context(ctx) else {
        return call();
    };
    let id = queries::context_id(ctx);
    let announced = announce_context(&lock, ctx);
    let rc = call();
    let ending = if rc == CUDA_SUCCESS {
        lock.after_release(&queries::Contexts, ctx as u64, id)
    } else {
        Ending::Alive
    };
    context_ended("cuCtxDetach", lock.device(), ending, announced);
    rc
}

/// After a context may have gone away on `device`: credits what lived in it beside
/// allocations and the driver freed with it, its modules, the memory its limits took and
/// the kernels its first launches loaded (a created context that no longer exists, or is
/// another context now; the primary context once inactive, or made anew). The functions
/// seen on the device are forgotten: the next launch of each there is measured again
/// (what a context that stayed already holds measures nothing).
fn residents_gone(device: usize) {
    let primary_inactive = queries::Contexts.primary_active(device) == Some(false);
    let gone = |r: &Resident| {
        (r.primary && primary_inactive) || queries::context_gone(r.ctx as Handle, r.ctx_id)
    };
    let modules = MODULES.take_gone(device, gone);
    let limits = LIMITS.take_gone(device, gone);
    for charge in modules
        .into_iter()
        .chain(limits)
        .chain(KERNELS.take_gone(device, gone))
        .chain(GREENS.take_gone(device, gone))
    {
        SHIM.ledger.settle(charge);
    }
    LAUNCHED.forget(|key| gpucap_core::kernels::key_device(key) == device);
}
