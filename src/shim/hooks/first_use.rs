//! A first use of a kernel in a context (see `gpucap_core::kernels`): what CUDA's lazy
//! loading loads there at a function's first launch, at `cuKernelGetFunction` and
//! `cuModuleGetFunction`, at `cuFuncLoad`, and for a graph's kernel nodes, reserved from
//! what the same library or module took before, measured, charged to the context (past the
//! cap if need be: a load made cannot be taken back), and the use then seen, so that later
//! ones pay one lookup (`launches`, `graphs` call it). Under eager loading nothing is loaded
//! at a first use: none is measured.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::contexts::{context_lock, pool_marks_holding};
use super::{reserve_on, shim};
use crate::driver::types::{CUDA_SUCCESS, CuResult, Handle};
use crate::driver::{calls, graph_queries, kernel_queries, queries};
use crate::log::log;
use crate::state::{ESTIMATES, KERNELS, LAUNCHED, SHIM};
use gpucap_core::kernels::launch_key;
use gpucap_core::ledger::Charge;

/// Function `f` loaded on device `d` (the current context's) where the driver says it is
/// "partially loaded" (a handle of `cuModuleEnumerateFunctions`, CUDA 12.4: "CUDA APIs may
/// load the function automatically"): by gpucap's own `cuFuncLoad`, measured as a first
/// use, before gpucap asks its attributes or the program launches it (see
/// [`partial_load`]). A loaded function, or a driver that does not say: nothing.
pub(super) fn load_if_partial(api: &str, f: Handle, d: usize) -> CuResult {
    // The shim's own call: out of a capture's way, as its measurements are.
    let load =
        || graph_queries::relaxed(|| kernel_queries::load_function(f).unwrap_or(CUDA_SUCCESS));
    partial_load(api, f, d, load).unwrap_or(CUDA_SUCCESS)
}

/// Where function `f` is partially loaded: `load` (a `cuFuncLoad` of it) measured as a
/// first use on device `d`, so that its code is charged (refused before it loads where the
/// cap cannot take what its module took before); None where it is loaded, or the driver
/// does not say.
pub(super) fn partial_load(
    api: &str,
    f: Handle,
    d: usize,
    load: impl FnMut() -> CuResult,
) -> Option<CuResult> {
    if kernel_queries::is_loaded(f) != Some(false) {
        return None;
    }
    let used = Use {
        key: launch_key(f as u64, d),
        seen: Seen::No,
    };
    Some(first_use(
        api,
        used,
        d,
        load,
        || Some(f),
        || kernel_queries::function_owner(f),
    ))
}

/// The use a first use measures: `key` names it (a function, or a kernel handle in a
/// context); `seen`: when it is seen once measured.
#[derive(Clone, Copy)]
pub(super) struct Use {
    pub(super) key: u64,
    pub(super) seen: Seen,
}

impl Use {
    pub(super) fn of(key: u64) -> Use {
        Use {
            key,
            seen: Seen::Yes,
        }
    }
}

/// When a first use's key is seen (later uses not measured) once it is measured.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Always: a lookup, a launch whose stack was grown first.
    Yes,
    /// Not here: a partially loaded function's load (its launch is measured on its own), a
    /// launch on a capturing stream that needs a stack not grown yet (its first launch
    /// outside a capture grows it), a kernel handle's question and launch in one use (its
    /// caller sees it once it knows the launch was made).
    No,
    /// Where the function the use gave takes nothing at its launch (its threads' local
    /// memory within the stack, no raised heap): a kernel handle asked for
    /// (`cuKernelGetFunction`) or loaded ahead of a graph or a multi-device launch. Asked of
    /// the loaded function, after the use: a question about a kernel not loaded yet may
    /// itself load it, unmeasured.
    IfItsLaunchTakesNothing,
}

/// Whether a launch of function `f` (loaded) in the current context can take nothing on
/// its own: its threads' local memory fits in the stack, and no raised malloc heap (printf
/// FIFO, pending-launch buffer) may wait to be taken. Only then is its first launch left
/// unchecked once it was asked for (`cuModuleGetFunction`, `cuKernelGetFunction`).
pub(super) fn takes_nothing_at_launch(f: Handle) -> bool {
    !super::limits::late_limit_raised()
        && super::limits::fits_the_stack(kernel_queries::local_size(f, None))
}

/// The first use on device `d` of what `used` names (a function or kernel launched or
/// asked for, in the current context), which CUDA's lazy loading makes load code and
/// data there; seen afterwards where `used` says so. Under the device's context lock
/// (where a second thread's first use waits, then finds it seen):
/// 1. what a first use of its owner's functions took before (`owner()`: its library or
///    module, see `kernels::LoadEstimates`) is reserved: if the cap, the pool or another
///    member's guarantee cannot take it, the call is refused with
///    `CUDA_ERROR_OUT_OF_MEMORY` before the driver loads anything, as the driver itself
///    answers when lazy loading finds no memory;
/// 2. the call is made and measured: by the driver's figure for this process (NVML),
///    where the pid NVML lists it under is provably its own (not in a container: see
///    `gpucap_core::pid_namespace`), else by the context's free memory with the pool's
///    traffic taken out;
/// 3. the reservation becomes the measured figure; what the cap cannot take beyond it
///    is charged by force (the driver holds it: past the cap, first out of this member's
///    own guarantee; see `Ledger::charge_past_cap`), said at error level. A use that cannot be
///    measured keeps what was reserved, and is said at error level under a cap.
///
/// Once the program raised the malloc heap (or the printf FIFO, the pending-launch buffer),
/// which the driver takes at some later launch and the context keeps, a use's figure may
/// hold it: it is kept with the context (credited when the context ends, not at its
/// owner's unload) and taught to no estimate.
#[cold]
#[inline(never)]
pub(super) fn first_use(
    api: &str,
    used: Use,
    d: usize,
    mut call: impl FnMut() -> CuResult,
    function: impl Fn() -> Option<Handle>,
    owner: impl Fn() -> u64,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    let key = used.key;
    // Eager loading loads nothing at a first use; a raised heap (FIFO, buffer) may be
    // taken at one.
    if kernel_queries::eager_loading() && !super::limits::late_limit_raised() {
        return loaded_eagerly(used, d, call, function);
    }
    let Some(ctx) = queries::current_context() else {
        return call();
    };
    let lock = match context_lock(shim, api, d as c_int) {
        Ok(Some(lock)) => lock,
        Ok(None) => return call(),
        Err(rc) => return rc,
    };
    if LAUNCHED.contains(key) {
        return call(); // another thread's first use came first
    }
    let owner = owner();
    // Once the heap (FIFO, buffer) is raised, a first use's figure may hold it, which the
    // context keeps: taught to no estimate, and recorded under no owner (below).
    let late = super::limits::late_limit_raised();
    let loaded_there = owner != 0 && KERNELS.any(|&(c, _, o)| c == ctx as u64 && o == owner);
    let expected = ESTIMATES.expected(owner, loaded_there);
    let held = match expected {
        0 => None,
        bytes => match reserve_on(shim, api, d, bytes) {
            Ok(r) => Some(r),
            Err(rc) => {
                log!(
                    Warn,
                    "{api}: refused before the driver loaded anything: a first use of this {} in this context is expected to load {} on GPU {d} (what one took before)",
                    if loaded_there {
                        "library's or module's further kernel"
                    } else {
                        "library or module"
                    },
                    gpucap_core::size::format_bytes(bytes)
                );
                return rc;
            }
        },
    };
    // The driver's figure for this process where its pid is provably its own (not inside
    // a container, whose pid NVML's host pids may repeat for another process), else the
    // free memory in the context, the pool's traffic taken out (`residents::measure_loaded`).
    let charged = || SHIM.ledger.usage(d).map_or(0, |u| u.used);
    let (rc, measured, how) = gpucap_core::residents::measure_loaded(
        &lock,
        &queries::Contexts,
        ctx as u64,
        pool_marks_holding(d, held.as_ref()),
        charged,
        call,
    );
    if rc != CUDA_SUCCESS {
        drop(held);
        return rc; // not seen: the next use measures again
    }
    mark_seen(used, d, &function);
    let reserved = held.as_ref().map_or(0, |r| r.charge().bytes);
    let bytes = match measured {
        Ok(bytes) => {
            // Never more than the device holds: a figure past it is no measurement.
            let bytes = bytes.min(calls::physical_total(d).unwrap_or(u64::MAX));
            if !late {
                ESTIMATES.learn(owner, loaded_there, bytes);
            }
            bytes
        }
        Err(why) => {
            let capped = SHIM
                .ledger
                .usage(d)
                .is_some_and(|u| u.cap != gpucap_core::ledger::NO_CAP);
            let kept = gpucap_core::size::format_bytes(reserved);
            if capped {
                log!(
                    Error,
                    "{api}: what its first use on GPU {d} loaded could not be measured ({why}): charged what it was expected to take ({kept})"
                );
            } else {
                log!(
                    Warn,
                    "{api}: what its first use on GPU {d} loaded could not be measured ({why}): charged {kept} (GPU {d} has no cap)"
                );
            }
            reserved
        }
    };
    let forced = super::residents::charge_done(d, held, bytes);
    if bytes > 0 {
        record_kernel_charge(
            ctx,
            charge_key(&function, key),
            if late { 0 } else { owner },
            &lock,
            Charge { device: d, bytes },
        );
    }
    let taken = gpucap_core::size::format_bytes(bytes);
    match SHIM.ledger.usage(d) {
        Some(u) if forced > 0 && u.used > u.cap => log!(
            Error,
            "{api}: the kernels its first use loaded took {taken} on GPU {d}, past the cap ({} of {} in use): charged; every allocation is refused until memory is given back",
            gpucap_core::size::format_bytes(u.used),
            gpucap_core::size::format_bytes(u.cap)
        ),
        _ if bytes > 0 => log!(
            Debug,
            "{api}: its first use loaded {taken} of kernels on GPU {d} (measured {})",
            how.says()
        ),
        _ => {}
    }
    rc
}

/// A first use under eager loading: the driver loaded the code with its module (measured
/// at `cuModuleLoad*`), its library (at `cuLibraryLoad*`, `libraries`) or the context
/// (with the context), so the use loads nothing: made unmeasured, and seen where `used` says. Under
/// TensorFlow cudart asks for 49,086 functions then, each a first use; measured, each
/// cost the context lock and two reads of NVML's process list.
fn loaded_eagerly(
    used: Use,
    d: usize,
    mut call: impl FnMut() -> CuResult,
    function: impl Fn() -> Option<Handle>,
) -> CuResult {
    let rc = call();
    if rc == CUDA_SUCCESS {
        mark_seen(used, d, &function);
    }
    rc
}

/// A first use done: its key seen as `used` says, and the function asked for (`function`)
/// too where its first launch takes nothing more (no stack to grow, no raised heap to take).
fn mark_seen(used: Use, d: usize, function: &impl Fn() -> Option<Handle>) {
    if used.seen == Seen::No {
        return;
    }
    let fits = function().filter(|&f| takes_nothing_at_launch(f));
    if used.seen == Seen::Yes || fits.is_some() {
        seen(used.key);
    }
    if let Some(f) = fits {
        seen(launch_key(f as u64, d));
    }
}

/// Records `key` as seen; where the table has no room for it, says once (at warn) that
/// the uses of such functions are measured each time.
pub(super) fn seen(key: u64) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !LAUNCHED.insert(key) && !SAID.swap(true, Relaxed) {
        log!(
            Warn,
            "the table of functions seen is full: the uses of functions beyond it are measured each time (slower; nothing more is charged)"
        );
    }
}

/// The key a first use's charge is recorded under (with its context and owner, see
/// [`record_kernel_charge`]): the function asked for, else the use's own key (a kernel
/// handle's use in one context).
fn charge_key(function: &impl Fn() -> Option<Handle>, key: u64) -> u64 {
    function().map_or(key, |f| f as u64)
}

/// Records `charge`, what a first use loaded, in the kernels' charges (`KERNELS`) under
/// (context, function, owner), credited when the context goes
/// or the owner is unloaded. A function measured again (after a teardown) keeps what it
/// held; an entry of a context gone (its handle another context's now) is credited.
fn record_kernel_charge(
    ctx: Handle,
    function: u64,
    owner: u64,
    lock: &gpucap_core::contexts::DeviceLock<'_>,
    charge: Charge,
) {
    let held = super::residents::resident_in(ctx, lock, charge);
    super::residents::record_more(&KERNELS, (ctx as u64, function, owner), held);
}
