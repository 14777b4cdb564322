//! `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3, still in driver 580
//! and cudart 13 as `cudaLaunchCooperativeKernelMultiDevice`): one call launches a
//! function on each of several devices, each on a stream of its own device's context.
//! What a first launch takes in a context (a partially loaded function's or a kernel
//! handle's code, the stack its threads' local memory grows, a raised heap) is taken in
//! each of those contexts. One call cannot be measured device by device, so each function
//! is first made ready in its stream's context as a first launch is before its launch
//! (`launches::loaded_for_launch`: loaded, measured); the stack each needs is checked
//! against its device's cap on every device before any grows (the call refused with
//! `CUDA_ERROR_OUT_OF_MEMORY` before the driver is called where one cannot), then grown,
//! measured and charged; where a raised heap may still be taken, the call is
//! measured on every device it launches on (the device locks in ascending order, as an
//! eager library load measures) and what each took is charged there, past the cap if need
//! be (the launch is made), kept with the context.

use super::current::{current_device, moves_current};
use super::libraries::measure_each;
use super::residents::{charge_done, record_more, resident_in};
use crate::driver::forward::Real;
use crate::driver::hooked::real;
use crate::driver::queries;
use crate::driver::types::{
    CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CuResult, Handle, InArray, MultiDeviceLaunch, Out,
};
use crate::log::log;
use crate::state::{CONTEXTS, KERNELS};
use gpucap_core::contexts::DeviceLock;
use gpucap_core::ledger::Charge;

const API: &str = "cuLaunchCooperativeKernelMultiDevice";

pub fn launch_cooperative_kernel_multi_device(
    real: Real<(InArray<MultiDeviceLaunch>, u32, u32)>,
    list: InArray<MultiDeviceLaunch>,
    n: u32,
    flags: u32,
) -> CuResult {
    let mut call = || real.call(list, n, flags);
    if let Err(rc) = super::shim() {
        return rc;
    }
    // Each launch's function loaded in its stream's context, and the stack it needs
    // checked against that device's cap, before any stack grows.
    let mut ready: Vec<Ready> = Vec::new();
    for launch in list.items(n) {
        let Some(ctx) = queries::stream_context(launch.stream) else {
            continue; // not a stream the driver knows: its own error follows
        };
        match in_context(ctx, || loaded(ctx, launch.function)) {
            Ok(Some(r)) => ready.push(r),
            Ok(None) => {}
            Err(rc) => return rc,
        }
    }
    for r in &ready {
        if let Some(local) = r.grow
            && let Err(rc) = in_context(r.ctx, || super::limits::grow_stack(API, local))
        {
            return rc;
        }
    }
    if !super::limits::late_limit_raised() {
        ready.iter().for_each(|r| super::first_use::seen(r.key));
        return call();
    }
    measured(&mut ready, &mut call)
}

/// A launch made ready in context `ctx` of device `d`: its key among the functions seen, and
/// the stack to grow it to (None: it fits).
struct Ready {
    d: usize,
    ctx: Handle,
    key: u64,
    grow: Option<usize>,
}

/// `f` loaded for its launch in the current context `ctx`, and the stack it needs checked
/// (None: launched there before).
fn loaded(ctx: Handle, f: Handle) -> Result<Option<Ready>, CuResult> {
    let Some(d) = current_device().and_then(|d| usize::try_from(d).ok()) else {
        return Ok(None);
    };
    let Some((key, local)) = super::launches::loaded_for_launch(API, f, d)? else {
        return Ok(None);
    };
    let grow = super::limits::stack_growth(API, d, local)?;
    Ok(Some(Ready { d, ctx, key, grow }))
}

/// Runs `step` with `ctx` current on the calling thread, then makes current again what
/// was (the driver's own push and pop; what the thread remembers of its current context
/// forgotten around each, as the hooks of `current.rs` do).
fn in_context<T>(ctx: Handle, step: impl FnOnce() -> Result<T, CuResult>) -> Result<T, CuResult> {
    let pushed = moves_current(|| real::cuCtxPushCurrent_v2(ctx).unwrap_or(CUDA_ERROR_NOT_FOUND));
    if pushed != CUDA_SUCCESS {
        return Err(pushed);
    }
    let done = step();
    let mut popped: Handle = std::ptr::null_mut();
    let _ = moves_current(|| {
        real::cuCtxPopCurrent_v2(Out::from(&mut popped)).unwrap_or(CUDA_ERROR_NOT_FOUND)
    });
    done
}

/// The call, measured on the device of each of `ready` (one launch a device, as the driver
/// requires; locks taken in ascending device order): what each device's free memory
/// dropped by (other members' traffic taken out) is charged there, past the cap if need
/// be, and kept with that launch's context; each launch then seen.
fn measured(ready: &mut [Ready], call: &mut dyn FnMut() -> CuResult) -> CuResult {
    ready.sort_by_key(|r| r.d);
    let locks: Vec<DeviceLock<'static>> = ready.iter().filter_map(|r| CONTEXTS.lock(r.d)).collect();
    if locks.len() != ready.len() {
        return call(); // no book for a device: nothing gpucap charges there
    }
    let mut taken = Vec::with_capacity(locks.len());
    let rc = measure_each(&locks, call, &mut taken);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    for ((lock, r), (taken, _)) in locks.iter().zip(ready.iter()).zip(taken) {
        let d = r.d;
        super::first_use::seen(r.key);
        let bytes = match taken {
            Ok(change) => gpucap_core::contexts::taken(change),
            Err(why) => {
                log!(
                    Error,
                    "{API}: what its launch on GPU {d} took after a raised heap could not be measured ({why}): not charged"
                );
                continue;
            }
        };
        if bytes == 0 {
            continue;
        }
        let forced = charge_done(d, None, bytes);
        let charge = Charge { device: d, bytes };
        record_more(
            &KERNELS,
            (r.ctx as u64, r.key, 0),
            resident_in(r.ctx, lock, charge),
        );
        let taken = gpucap_core::size::format_bytes(bytes);
        match forced {
            0 => log!(
                Debug,
                "{API}: its launch took {taken} on GPU {d} (a raised heap)"
            ),
            _ => log!(
                Error,
                "{API}: its launch took {taken} on GPU {d} (a raised heap), past the cap: charged; every allocation is refused until memory is given back"
            ),
        }
    }
    rc
}
