//! `cuCtxSetLimit` (and so `cudaDeviceSetLimit`): the device memory a limit takes or
//! gives back at the call (see `gpucap_core::limits`), measured around the call in the
//! current context, charged to that context's device, credited when the limit is
//! lowered (what the driver gave back, at most the limit's charge) or the context is gone.

use std::ffi::c_int;

use super::contexts::{context_lock, pool_marks_holding};
use super::current::context_device;
use super::residents::{Again, charge_done, judge_measured, made_again, try_charge_undoable};
use super::shim;
use crate::driver::forward::Real;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Handle};
use crate::driver::{kernel_queries, queries};
use crate::log::log;
use crate::state::{LIMITS, SHIM};
use gpucap_core::ledger::Charge;
use gpucap_core::limits;

pub fn ctx_set_limit(real: Real<(c_int, usize)>, limit: c_int, value: usize) -> CuResult {
    set_limit("cuCtxSetLimit", |v| real.call(limit, v), limit, value)
}

/// `CU_LIMIT_STACK_SIZE`.
const STACK_SIZE: c_int = 0;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`, `CU_LIMIT_MALLOC_HEAP_SIZE`,
/// `CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT`: the limits whose memory the driver may take
/// after the call.
const PRINTF_FIFO_SIZE: c_int = 1;
const MALLOC_HEAP_SIZE: c_int = 2;
const DEV_RUNTIME_PENDING_LAUNCH_COUNT: c_int = 4;

/// Whether the program raised a limit whose memory the driver may take after the call: the
/// malloc heap took nothing at the call (driver 580) and is taken at a later launch (which
/// one is not recorded: `scripts/gpu/diag/heap-when.py` asks it); the printf FIFO and the
/// device runtime's pending-launch buffer are measured at the call as any limit, and
/// whether a driver takes them later is not recorded (the driver probe's
/// `limit.printf_fifo_64MiB`, `limit.pending_launches_65536`): so once one is raised, the
/// next launch of every function and every executable graph is measured as a first use
/// is, in either loading mode, and whatever a launch takes for them is charged.
static LATE_LIMIT_RAISED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a limit the driver may take later was raised in this process (see
/// [`LATE_LIMIT_RAISED`]).
pub(super) fn late_limit_raised() -> bool {
    LATE_LIMIT_RAISED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether `local` bytes a thread fit in the current context's stack (0 always does).
pub(super) fn fits_the_stack(local: u64) -> bool {
    local == 0 || queries::context_limit(STACK_SIZE).is_some_and(|stack| local <= stack as u64)
}

/// A launch (`api`) in the current context of a kernel whose threads take `local` bytes
/// of local memory each: where that is more than the context's stack, the driver grows
/// the stack to it at the launch and keeps it (CUDA's `cuCtxSetLimit` documentation:
/// "the driver will set the limit to the maximum of value and what the kernel function
/// requires"; an H100 takes 3.87 GiB for 16 KiB a thread). The shim raises it first, as
/// `cuCtxSetLimit` would (measured, charged with the context's stack, credited when it
/// is lowered or the context goes): where the cap cannot take it the launch is refused
/// with `CUDA_ERROR_OUT_OF_MEMORY` before the driver takes anything. Ok(true): nothing
/// to grow, or grown; Ok(false): it would grow, but `capturing` (nothing runs now), so
/// not raised. `d`: the device of the current context.
pub(super) fn stack_for_launch(
    api: &str,
    d: usize,
    local: u64,
    capturing: impl FnOnce() -> bool,
) -> Result<bool, CuResult> {
    let Some((local, stack)) = stack_to_grow(local) else {
        return Ok(true); // within the stack, or no context: the driver answers
    };
    if capturing() {
        return Ok(false); // nothing runs now: not raised
    }
    growth_fits(api, d, local, stack)?;
    grow_stack(api, local).map(|()| true)
}

/// Whether a kernel whose threads take `local` bytes makes the driver grow the current
/// context's stack (device `d`) and the cap can take that now: Ok(None) where nothing
/// grows; Ok(Some(local)) where it grows and fits (for [`grow_stack`]); Err
/// (`CUDA_ERROR_OUT_OF_MEMORY`, said) where it does not fit. For a launch on several
/// devices in one call, checked on every device before any stack grows.
pub(super) fn stack_growth(api: &str, d: usize, local: u64) -> Result<Option<usize>, CuResult> {
    let Some((local, stack)) = stack_to_grow(local) else {
        return Ok(None);
    };
    growth_fits(api, d, local, stack).map(|()| Some(local))
}

/// `local` bytes a thread, and the current context's stack, where `local` is more.
fn stack_to_grow(local: u64) -> Option<(usize, usize)> {
    let local = usize::try_from(local).ok()?;
    match queries::context_limit(STACK_SIZE) {
        Some(stack) if local > stack => Some((local, stack)),
        _ => None,
    }
}

/// What the driver will take to grow the stack from `stack` to `local` bytes a thread on
/// device `d` ([`reserve_stack`]'s figure), checked against the cap: refused where it
/// cannot take it, before the driver grows anything.
fn growth_fits(api: &str, d: usize, local: usize, stack: usize) -> Result<(), CuResult> {
    if let Ok(shim) = shim() {
        reserve_stack(shim, api, d, local, stack).map(drop)?;
    }
    Ok(())
}

/// What the driver will take to raise the current context's stack on device `d` from
/// `old` to `value` bytes a thread (each byte more for every resident thread, in whole
/// 2 MiB pages, as an H100 took it), reserved against the cap (the process's and its
/// pool's): Err (`CUDA_ERROR_OUT_OF_MEMORY`, gpucap's line said) where it cannot take
/// it; None where the device's resident threads cannot be asked (measured only).
fn reserve_stack(
    shim: &'static crate::state::Shim,
    api: &str,
    d: usize,
    value: usize,
    old: usize,
) -> Result<Option<gpucap_core::ledger::Reservation<'static>>, CuResult> {
    const PAGE: u64 = 2 << 20;
    let Some(threads) = c_int::try_from(d)
        .ok()
        .and_then(kernel_queries::resident_threads)
    else {
        return Ok(None);
    };
    let expected = ((value - old) as u64)
        .saturating_mul(threads)
        .div_ceil(PAGE)
        .saturating_mul(PAGE);
    super::reserve_on(shim, api, d, expected).map(Some)
}

/// The current context's stack raised to `local` bytes a thread, as `cuCtxSetLimit` raises
/// it: measured, charged with the context's stack (refused, and set back, where the cap
/// cannot take what it took).
pub(super) fn grow_stack(api: &str, local: usize) -> Result<(), CuResult> {
    let set = |v: usize| {
        crate::driver::hooked::real::cuCtxSetLimit(STACK_SIZE, v)
            .unwrap_or(crate::driver::types::CUDA_ERROR_NOT_FOUND)
    };
    match set_limit(api, set, STACK_SIZE, local) {
        CUDA_SUCCESS => {
            log!(
                Debug,
                "{api}: its kernel takes {local} bytes of local memory a thread: the stack grown to it first"
            );
            Ok(())
        }
        rc => Err(rc),
    }
}

/// Sets `limit` to `value` with `set` (the driver's `cuCtxSetLimit`) for `api`, measured
/// around the call in the current context, and charges or credits what it took or gave
/// back (see the module's doc). A raise whose measured figure the cap cannot take is set
/// back and made again (`residents::made_again`): beside a churning pool the figure
/// holds what the others had in flight.
fn set_limit(api: &str, set: impl Fn(usize) -> CuResult, limit: c_int, value: usize) -> CuResult {
    let least = std::cell::Cell::new(None);
    made_again(api, |last| {
        set_limit_once(api, &set, (limit, value), last, &least)
    })
}

/// One attempt of [`set_limit`] (`last`: no other follows): Err where it was set back
/// to be made again, its measured figure more than the cap could take, or more than the
/// raise was expected to take where the excess may be the pool's traffic. `least`: the
/// least figure an attempt measured, with the value it raised from and the charge it
/// found (each figure is an upper bound on what the same raise takes; one from another
/// starting point, set meanwhile by another thread, is not compared), as far as the
/// pool's traffic goes: what the raise kept is charged no more.
fn set_limit_once(
    api: &str,
    set: &impl Fn(usize) -> CuResult,
    (limit, value): (c_int, usize),
    last: bool,
    least: &std::cell::Cell<Option<(usize, u64, i128)>>,
) -> Result<CuResult, Again> {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return Ok(rc),
    };
    // No context, or a limit the driver does not know: the driver answers itself.
    let (Some(ctx), Some(device), Some(old)) = (
        queries::current_context(),
        context_device(),
        queries::context_limit(limit),
    ) else {
        return Ok(set(value));
    };
    let lock = match context_lock(shim, api, device) {
        Ok(Some(lock)) => lock,
        Ok(None) => return Ok(set(value)),
        Err(rc) => return Ok(rc),
    };
    let d = lock.device();
    // A raised stack is reserved first at what the driver will take for it (as a context
    // is): one the cap cannot take is refused before the driver takes anything. Measured
    // and refused after the call, the driver held it past the cap until it was set back
    // (the pool's fake GPU held 1,420 MiB under a 1 GiB cap beside members at the cap).
    let held = match limit == STACK_SIZE && value > old {
        true => match reserve_stack(shim, api, d, value, old) {
            Ok(r) => r,
            Err(rc) => return Ok(rc),
        },
        false => None,
    };
    let key = (ctx as u64, limit as u32);
    let before = LIMITS.take(key);
    let charged = before.map_or(0, |r| r.charge.bytes);
    let lowered = value < old;
    // A lowered limit may give memory back: announced to the pool first (as a free), and
    // measured with the pool's marks like any change (the other members' frees inside the
    // window are not credited to it), this announcement's own bytes, which the marks count
    // as given back by a member, taken out again.
    let freeing = (lowered && charged > 0).then(|| {
        SHIM.ledger.announce(Charge {
            device: d,
            bytes: charged,
        })
    });
    let marks = pool_marks_holding(d, held.as_ref());
    let (rc, measured, _, doubt) =
        lock.measure_with_doubt(&queries::Contexts, Some(ctx as u64), marks, || set(value));
    let own_announced = match (&freeing, crate::membership::current()) {
        (Some(_), Some(_)) => i128::from(charged),
        _ => 0,
    };
    let measured = measured.map(|change| change - own_announced);
    let restore = || {
        if let Some(r) = before {
            super::residents::record(&LIMITS, key, r);
        }
    };
    if rc != CUDA_SUCCESS {
        if let Some(f) = freeing {
            SHIM.ledger.withdraw(f);
        }
        restore();
        return Ok(rc);
    }
    if limit == STACK_SIZE && lowered {
        // A kernel seen within the old stack may grow the new one at its next launch.
        crate::state::LAUNCHED.clear();
    }
    let later = [
        PRINTF_FIFO_SIZE,
        MALLOC_HEAP_SIZE,
        DEV_RUNTIME_PENDING_LAUNCH_COUNT,
    ];
    if later.contains(&limit) && value > old {
        // What it takes may be taken at a later launch: each function's next one is measured.
        LATE_LIMIT_RAISED.store(true, std::sync::atomic::Ordering::Relaxed);
        crate::state::LAUNCHED.clear();
    }
    let verdict = judge_measured(api, "limit", d, measured.map(gpucap_core::residents::taken));
    let change = match (verdict, measured) {
        (Ok(Some(_)), Ok(change)) => change,
        (Ok(_), _) => {
            // Not measured and no cap: allowed, counted as before (said by the judge).
            if let Some(f) = freeing {
                SHIM.ledger.withdraw(f);
            }
            restore();
            return Ok(rc);
        }
        (Err(refused), _) => {
            // Not measured: all of what was reserved may have been taken, or none.
            let took = held.as_ref().map_or(0, |r| r.charge().bytes);
            set_back(set, (limit, old, value), d, took);
            if let Some(f) = freeing {
                SHIM.ledger.withdraw(f);
            }
            restore();
            return Ok(refused);
        }
    };
    let reserved = held.as_ref().map_or(0, |r| r.charge().bytes);
    // What this attempt's raise may have taken, given back if it is set back: at most
    // its figure (or what was reserved, if more).
    let took = match value > old {
        true => reserved.max(gpucap_core::residents::taken(change)),
        false => 0,
    };
    if value > old {
        log!(
            Debug,
            "{api}: limit {limit} raised to {value}: measured {} on GPU {d}, of which up to {} may be the pool's traffic (expected {})",
            gpucap_core::size::format_bytes(gpucap_core::residents::taken(change)),
            gpucap_core::size::format_bytes(doubt),
            gpucap_core::size::format_bytes(reserved)
        );
    }
    // The least figure of the attempts from the same start, but no lower than this one's
    // figure less its doubt: a free the marks do not see (a process outside the pool)
    // could make one window's figure short, and the least of several would pick it.
    let sure = change - i128::from(doubt);
    let least_so_far = match least.get() {
        Some((o, c, l)) if (o, c) == (old, charged) => l.min(change),
        _ => change,
    };
    least.set(Some((old, charged, least_so_far)));
    let change = change.min(least_so_far.max(sure));
    // A stack raised from nothing charged is charged at least what the driver takes for
    // it. Not a raise of a stack charged already: a driver that kept a stack after it was
    // lowered (one a launched kernel needed) takes nothing when it is raised to it again,
    // and that stack's charge stayed.
    let expected = match charged {
        0 => held.as_ref().map_or(0, |r| r.charge().bytes),
        _ => 0,
    };
    let now = limits::after_change(charged, change, lowered, expected);
    // Whether the cap cannot take its figure (checked with no effect: an attempt made
    // again counts no refusal and waits for no memory), and whether that refusal is
    // certain: with no reservation (no model of what the raise takes) even what it surely
    // took does not fit. With one that fit, a figure above it is traffic the window held
    // (the pool's, or a process's outside it, which no mark shows) or a driver taking
    // more than the model: made again, the last attempt refused.
    let beyond = |bytes: u64| {
        let extra = bytes.saturating_sub(charged).saturating_sub(reserved);
        extra > 0 && SHIM.ledger.would_refuse_here(d, extra)
    };
    let certain = reserved == 0 && beyond(limits::after_change(charged, sure, lowered, expected));
    // Measured above what the raise was expected to take by no more than the pool's
    // traffic counted in the window, or more than the cap takes while what it surely
    // took fits: set back and made again, unless it is the last attempt (or the driver
    // will not set it back: then charged as it stands).
    let noisy = i128::from(reserved) < change && sure <= i128::from(reserved);
    let unsure = noisy || (beyond(now) && !certain);
    if !last && value > old && unsure && set_back(set, (limit, old, value), d, took) {
        drop(held);
        restore();
        return Err(Again::Unsure);
    }
    if let Some(f) = freeing {
        SHIM.ledger.withdraw(f);
    }
    if now > charged {
        // The old value gives the memory back; if the driver will not set it back, the
        // memory stays taken: charged by force.
        let set_back_ok = std::cell::Cell::new(true);
        let undo = || set_back_ok.set(set_back(set, (limit, old, value), d, took));
        // Charged at least its reservation (`after_change`), but marked made in the pool
        // only as far as the driver was seen taking: a stack the driver took nothing for
        // (a launched kernel's stack it kept) is not taken off another member's window.
        let seen = gpucap_core::residents::taken(change).min(now - charged);
        if let Err(not_taken) = try_charge_undoable(d, held, now - charged, seen, undo) {
            if !set_back_ok.get() {
                // The old entry's bytes are part of `now`: not restored; nothing to make again.
                charge_done(d, None, now - charged);
                record(key, ctx, &lock, now);
                return Ok(not_taken.say(api));
            }
            restore();
            return match certain {
                true => Ok(not_taken.say(api)),
                false => Err(Again::Refused(not_taken)),
            };
        }
    } else if now < charged {
        drop(held);
        SHIM.ledger.settle(Charge {
            device: d,
            bytes: charged - now,
        });
    }
    if now > 0 {
        record(key, ctx, &lock, now);
        log!(
            Debug,
            "{api}: limit {limit} = {value} holds {} on GPU {d}",
            gpucap_core::size::format_bytes(now)
        );
    }
    Ok(rc)
}

/// Records that limit `key` of context `ctx` holds `bytes` on `lock`'s device (charged
/// already), credited when the limit is lowered or the context goes.
fn record(key: (u64, u32), ctx: Handle, lock: &gpucap_core::contexts::DeviceLock<'_>, bytes: u64) {
    let charge = Charge {
        device: lock.device(),
        bytes,
    };
    // Another thread's, set meanwhile, is credited.
    super::residents::record(
        &LIMITS,
        key,
        super::residents::resident_in(ctx, lock, charge),
    );
}

/// Sets limit `limit` back to `old` with `set` after gpucap undid `value` (refused, or to
/// be made again), on device `d`: `took`, the most the undone raise may have taken (0
/// for a lowering), announced to the pool first as a free, so that another member's
/// window that holds the set back does not take it off its own figure; withdrawn after,
/// all of it unsure (a window that held the raise too, whose reservation ended unmade,
/// is that much high).
/// Whether the driver set it back; if not, says so at error level: the memory the new
/// value took stays with the context.
fn set_back(
    set: &impl Fn(usize) -> CuResult,
    (limit, old, value): (c_int, usize, usize),
    d: usize,
    took: u64,
) -> bool {
    // Nothing of it was charged: the announcement ends after the call, nothing credited.
    let most = || match took {
        0 => Vec::new(),
        bytes => vec![Charge { device: d, bytes }],
    };
    let rc = super::residents::announced_release(most, || set(old));
    if rc == CUDA_SUCCESS {
        return true;
    }
    log!(
        Error,
        "cuCtxSetLimit: undid limit {limit} = {value} on GPU {d} (refused, or to be made again), but the driver would not set it back to {old} (error {rc}): the memory it took stays, charged"
    );
    false
}
