//! `cuLaunchCooperativeKernelMultiDevice` (deprecated since CUDA 11.3, still in driver 580
//! and cudart 13 as `cudaLaunchCooperativeKernelMultiDevice`): one call launches a
//! function on each of several devices, each on a stream of its own device's context.
//! What a first launch takes in a context (a partially loaded function's or a kernel
//! handle's code, the stack its threads' local memory grows, a raised heap) is taken in
//! each of those contexts. One call cannot be measured device by device, so each function
//! is first made ready in its stream's context as a first launch is before its launch
//! (`launches::ready_for_launch`: loaded, measured; the stack grown, or the call refused
//! before the driver is called); where a raised heap may still be taken, the call is
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
    // (device, context, key) of each launch whose heap may still be taken.
    let mut unsettled: Vec<(usize, Handle, u64)> = Vec::new();
    for launch in list.items(n) {
        let Some(ctx) = queries::stream_context(launch.stream) else {
            continue; // not a stream the driver knows: its own error follows
        };
        match in_context(ctx, || ready(launch.function)) {
            Ok(Some((d, key))) => unsettled.push((d, ctx, key)),
            Ok(None) => {}
            Err(rc) => return rc,
        }
    }
    if unsettled.is_empty() {
        return call();
    }
    measured(&mut unsettled, &mut call)
}

/// `f` made ready for its launch in the current context: Some((device, key)) where its
/// launch may still take a raised heap.
fn ready(f: Handle) -> Result<Option<(usize, u64)>, CuResult> {
    let Some(d) = current_device().and_then(|d| usize::try_from(d).ok()) else {
        return Ok(None);
    };
    Ok(super::launches::ready_for_launch(API, f, d)?.map(|key| (d, key)))
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

/// The call, measured on the device of each of `unsettled` (one launch a device, as the
/// driver requires; locks taken in ascending device order): what each device's free
/// memory dropped by (other members' traffic taken out) is charged there, past the cap if
/// need be, and kept with that launch's context; each launch then seen.
fn measured(
    unsettled: &mut [(usize, Handle, u64)],
    call: &mut dyn FnMut() -> CuResult,
) -> CuResult {
    unsettled.sort_by_key(|&(d, _, _)| d);
    let locks: Vec<DeviceLock<'static>> = unsettled
        .iter()
        .filter_map(|&(d, _, _)| CONTEXTS.lock(d))
        .collect();
    if locks.len() != unsettled.len() {
        return call(); // no book for a device: nothing gpucap charges there
    }
    let mut taken = Vec::with_capacity(locks.len());
    let rc = measure_each(&locks, call, &mut taken);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    for ((lock, &(d, ctx, key)), taken) in locks.iter().zip(unsettled.iter()).zip(taken) {
        super::first_use::seen(key);
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
            (ctx as u64, key, 0),
            resident_in(ctx, lock, charge),
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
