//! NVML's memory figures, capped for the GPUs CUDA sees in this process.

use super::*;
use gpucap_core::nvml;

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
pub(super) fn nvml_device(shim: &Shim, device: Handle) -> Option<usize> {
    let uuid = queries::nvml_uuid(device)?;
    let visible = identity::visible(queries::visible_uuids)?;
    let d = checked_device(shim, identity::ordinal_of(visible, &uuid)? as c_int)?;
    shim.ledger
        .usage(d)
        .filter(|u| u.cap != gpucap_core::ledger::NO_CAP)?;
    refresh_pools(d);
    Some(d)
}

pub(super) fn nvml_view() -> Option<&'static [[u8; 16]]> {
    if let Some(v) = NVML_VIEW.get() {
        return Some(v);
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let view = nvml::cuda_view(&queries::nvml_gpus()?, visible.as_deref());
    Some(NVML_VIEW.get_or_init(|| view))
}

pub(super) fn nvml_keys_match(spec: &gpucap_core::config::LimitSpec) -> bool {
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
pub(super) fn nvml_cap_without_cuda(
    spec: &gpucap_core::config::LimitSpec,
    device: Handle,
    total: u64,
) -> Option<u64> {
    let view = nvml_view()?;
    let uuid = queries::nvml_uuid(device)?;
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
    let cuda = queries::cuda_initialised();
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
