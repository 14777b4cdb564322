//! Kernel launches (see `gpucap_core::kernels`): the first launch of each function on
//! each device is measured, as a module load is, and what the kernels it loaded took is
//! charged to the launching context (past the cap if need be: a launch made cannot be
//! taken back); later launches of it there pay one lookup in the map of functions seen.
//! `cuKernelGetFunction` loads a library's kernel into the current context too, and
//! `cuModuleGetFunction` a module's (lazy loading loads a module's kernels there): both
//! measured the same way.

use std::ffi::c_char;

use super::contexts::{context_lock, pool_marks};
use super::*;
use crate::state::{KERNELS, LAUNCHED};
use gpucap_core::kernels::{self, launch_key};
use gpucap_core::residents::Resident;

type Params = *mut *mut c_void;

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn launch_kernel(
    real: unsafe extern "C" fn(
        Handle,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        Stream,
        Params,
        Params,
    ) -> CuResult,
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: Stream,
    params: Params,
    extra: Params,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
    launched("cuLaunchKernel", f, call)
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn launch_cooperative_kernel(
    real: unsafe extern "C" fn(
        Handle,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        Stream,
        Params,
    ) -> CuResult,
    f: Handle,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared: u32,
    stream: Stream,
    params: Params,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(f, gx, gy, gz, bx, by, bz, shared, stream, params) };
    launched("cuLaunchCooperativeKernel", f, call)
}

#[inline(always)]
pub fn launch_kernel_ex(
    real: unsafe extern "C" fn(*const c_void, Handle, Params, Params) -> CuResult,
    config: *const c_void,
    f: Handle,
    params: Params,
    extra: Params,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(config, f, params, extra) };
    launched("cuLaunchKernelEx", f, call)
}

/// `cuKernelGetFunction`: the kernel is loaded into the current context here, if not
/// yet; measured once per kernel and device, as a first launch.
pub fn kernel_get_function(
    real: unsafe extern "C" fn(*mut Handle, Handle) -> CuResult,
    out: *mut Handle,
    kernel: Handle,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(out, kernel) };
    launched("cuKernelGetFunction", kernel, call)
}

/// A launch (or a lookup that loads) of function or kernel `f`, made by `call`: measured
/// as its first use on the current context's device if it is one (`first_on`), else
/// forwarded.
#[inline(always)]
fn launched(api: &str, f: Handle, mut call: impl FnMut() -> CuResult) -> CuResult {
    match first_on(f) {
        None => call(),
        Some(d) => first_use(api, launch_key(f as u64, d), d, call, || Some(f)),
    }
}

/// The device of the current context if `f` was not used there yet (None: it was, or
/// there is no context: the driver answers).
#[inline(always)]
fn first_on(f: Handle) -> Option<usize> {
    let d = match known_device() {
        Some(d) => d,
        None => usize::try_from(current_device()?).ok()?,
    };
    (!LAUNCHED.contains(launch_key(f as u64, d))).then_some(d)
}

/// The first use on device `d` of what `key` names (a function or kernel launched or
/// asked for): measured around the call, in the current context, under the device's
/// context lock (where a second thread's first use waits, then finds it seen), and
/// charged to the function `function` says once the call is made. A use that cannot be
/// measured is made all the same (it cannot be refused after the fact) and said.
#[cold]
#[inline(never)]
fn first_use(
    api: &str,
    key: u64,
    d: usize,
    mut call: impl FnMut() -> CuResult,
    function: impl Fn() -> Option<Handle>,
) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
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
    // The driver's figure for this process (NVML), which other processes' traffic does
    // not move; where NVML cannot say it, the device's free memory in the context (as a
    // module load), the pool's traffic taken out.
    let own = || SHIM.ledger.usage(d).map_or(0, |u| u.used);
    let (rc, measured) = match queries::own_used(d) {
        Ok(before) => {
            let own_before = own();
            let rc = call();
            let after = queries::own_used(d);
            (
                rc,
                after.map(|a| kernels::loaded(before, a, own_before, own())),
            )
        }
        Err(_) => {
            let (rc, m, _) =
                lock.measure_in(&queries::Contexts, ctx as u64, pool_marks(d), &mut call);
            (rc, m.map_err(|why| why.to_string()))
        }
    };
    if rc != CUDA_SUCCESS {
        return rc; // not seen: the next use measures again
    }
    LAUNCHED.insert(key);
    // The function asked for is loaded now: its first launch has nothing to load.
    let f = function().unwrap_or(std::ptr::null_mut());
    LAUNCHED.insert(launch_key(f as u64, d));
    match measured {
        Ok(0) => {}
        Ok(bytes) => {
            SHIM.ledger.force(d, bytes);
            let held = Resident {
                ctx: ctx as u64,
                ctx_id: queries::context_id(ctx),
                primary: lock.primary() == Some(ctx as u64),
                charge: Charge { device: d, bytes },
            };
            // A function measured again (after a teardown) keeps what it held.
            let key = (ctx as u64, f as u64, queries::function_owner(f));
            let held = match KERNELS.take(key) {
                Some(prev) if prev.ctx_id == held.ctx_id => Resident {
                    charge: Charge {
                        device: d,
                        bytes: prev.charge.bytes + bytes,
                    },
                    ..held
                },
                Some(prev) => {
                    // Its context is gone: that handle is another context's now.
                    SHIM.ledger.settle(prev.charge);
                    held
                }
                None => held,
            };
            KERNELS.add(key, held);
            let taken = gpucap_core::size::format_bytes(bytes);
            match SHIM.ledger.usage(d) {
                Some(u) if u.used > u.cap => log!(
                    Error,
                    "{api}: the kernels its first use loaded took {taken} on GPU {d}, past the cap ({} of {} in use): charged; every allocation is refused until memory is given back",
                    gpucap_core::size::format_bytes(u.used),
                    gpucap_core::size::format_bytes(u.cap)
                ),
                _ => log!(
                    Debug,
                    "{api}: its first use loaded {taken} of kernels on GPU {d}"
                ),
            }
        }
        Err(why) => log!(
            Warn,
            "{api}: what its first use on GPU {d} loaded could not be measured ({why}): not counted"
        ),
    }
    rc
}

/// `cuModuleGetFunction`: CUDA's lazy loading loads a module's kernel here, not at
/// the module's load (NVIDIA's Lazy Loading guide); measured once per (module, name)
/// and device, as a first launch.
pub fn module_get_function(
    real: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CuResult,
    out: *mut Handle,
    module: Handle,
    name: *const c_char,
) -> CuResult {
    // SAFETY (closure): forwarding the caller's arguments.
    let call = || unsafe { real(out, module, name) };
    let Some(d) = known_device().or_else(|| current_device().and_then(|d| usize::try_from(d).ok()))
    else {
        return call();
    };
    if name.is_null() {
        return call(); // the driver's own error
    }
    // SAFETY: a non-null, NUL-terminated name (the call's contract).
    let text = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
    let key = kernels::name_key(module as u64, text, d);
    if LAUNCHED.contains(key) {
        return call();
    }
    // SAFETY (closure): the driver wrote the function handle where the caller asked.
    let function = || (!out.is_null()).then(|| unsafe { *out });
    first_use("cuModuleGetFunction", key, d, call, function)
}

/// `cuLibraryUnload`: the kernels of the library its functions' first launches loaded go
/// with it, in every context (see [`unloading`]).
pub fn library_unload(real: unsafe extern "C" fn(Handle) -> CuResult, lib: Handle) -> CuResult {
    let owners = [Some(lib as u64), queries::library_module(lib)];
    // SAFETY (closure): forwarding the caller's argument.
    unloading(&owners, || unsafe { real(lib) })
}

/// Runs `call`, the unload of the library or module `owners` name: what their functions'
/// first launches loaded is announced to the pool first (a free) and credited once the
/// driver unloaded them; kept if it refused. The functions seen are forgotten (the
/// driver may hand their handles to new functions), to be measured again.
pub(super) fn unloading(owners: &[Option<u64>], call: impl FnOnce() -> CuResult) -> CuResult {
    let taken = KERNELS.take_keys(|&(_, _, owner)| owner != 0 && owners.contains(&Some(owner)));
    let freeing: Vec<Freeing> = taken
        .iter()
        .map(|(_, r)| SHIM.ledger.announce(r.charge))
        .collect();
    let rc = call();
    if rc == CUDA_SUCCESS {
        freeing
            .into_iter()
            .for_each(|f| SHIM.ledger.settle_announced(f));
        LAUNCHED.clear();
    } else {
        freeing.into_iter().for_each(|f| SHIM.ledger.withdraw(f));
        for (key, r) in taken {
            KERNELS.restore(key, r);
        }
    }
    rc
}
