//! NVML's memory figures, capped for the GPUs CUDA sees in this process; in a pool,
//! the pool's figures (`nvml_procs`: the pool read without joining it, and its processes).

use super::nvml_procs::{nvml_pool_gpu, nvml_pool_reader};
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

/// Whether the intercepted NVML calls must fail closed (`NVML_ERROR_NO_PERMISSION`): an
/// invalid configuration, a limit key naming no GPU, a pool this process could not join.
/// Else the configuration and whether the process initialised CUDA.
pub(super) fn nvml_config() -> Result<(&'static gpucap_core::config::Config, bool), CuResult> {
    // Not a CUDA call: the process does not become a CUDA user by it.
    let Ok(config) = SHIM.config_quiet() else {
        return Err(NVML_ERROR_NO_PERMISSION);
    };
    if identity::failed().is_some() || crate::membership::failed().is_some() {
        return Err(NVML_ERROR_NO_PERMISSION);
    }
    let cuda = queries::cuda_initialised();
    if !cuda
        && let Some(spec) = &config.limit
        && !nvml_keys_match(spec)
    {
        return Err(NVML_ERROR_NO_PERMISSION);
    }
    Ok((config, cuda))
}

/// `nvmlDeviceGetMemoryInfo` and `_v2`: the driver's answer, capped for a GPU that
/// CUDA sees in this process; in a pool, a GPU of the pool shows the pool's used
/// memory (every member's) within its cap. `NVML_ERROR_NO_PERMISSION`, writing
/// nothing, under an invalid configuration or a pool file that cannot be read.
pub fn nvml_memory_info<M: nvml::MemoryInfo>(
    real: unsafe extern "C" fn(Handle, *mut M) -> CuResult,
    device: Handle,
    memory: *mut M,
) -> CuResult {
    let (config, cuda) = match nvml_config() {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    // Read before the driver fills the caller's struct: a refusal writes nothing.
    let Ok(pool) = nvml_pool_reader(config) else {
        return NVML_ERROR_NO_PERMISSION;
    };
    // SAFETY: forwarding the caller's arguments.
    let rc = unsafe { real(device, memory) };
    if rc != 0 || memory.is_null() || (config.limit.is_none() && pool.is_none()) {
        return rc; // no cap and no pool: the driver's figures
    }
    // SAFETY: NVML succeeded and filled the caller's struct.
    let m = unsafe { &mut *memory };
    let (free, total) = m.free_total();
    let pooled = pool.and_then(|p| nvml_pool_gpu(p, device));
    let shown = if cuda {
        // A member: its own books say the pool's figures (`Shim::mem_info`).
        nvml_device(&SHIM, device)
            .map(|d| {
                let retained = if growth() {
                    growth::retained_bytes(d)
                } else {
                    0
                };
                SHIM.mem_info(d, free, total, retained)
            })
            .or_else(|| {
                let g = pooled?;
                Some(nvml::within_pool((free, total), g.cap?, g.used))
            })
    } else {
        // Not a member (a monitor): the pool as its file says, else the configured cap.
        let configured = config
            .limit
            .as_ref()
            .and_then(|spec| nvml_cap_without_cuda(spec, device, total));
        match pooled {
            Some(g) => g
                .cap
                .or(configured)
                .map(|cap| nvml::within_pool((free, total), cap, g.used)),
            None => configured.map(|cap| nvml::within_cap((free, total), cap)),
        }
    };
    if let Some(free_total) = shown {
        *m = m.capped(free_total);
    }
    rc
}
