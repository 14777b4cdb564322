//! NVML's memory figures, capped for the GPUs CUDA sees in this process; in a pool,
//! the pool's figures and processes (`nvml_pool`: the pool read without joining it).

use std::ffi::c_int;

use super::nvml_pool::{nvml_pool_gpu, nvml_pool_reader};
use super::pools::refresh_pools;
use super::{arena, checked_device, memory};
use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{CuResult, Handle, NvmlProcessDetailList, Out, OutArray};
use crate::state::{NVML_KEYS, NVML_VIEW, SHIM, Shim};
use gpucap_core::nvml::{self, Listing, ProcessInfo};
use gpucap_core::{growth, identity};

// ---------------------------------------------------------------------------
// NVML (see `nvml`): the device is matched to a CUDA ordinal by UUID. NVML is never
// a reason to initialise (or load) CUDA.

/// `NVML_ERROR_NO_PERMISSION`: what every intercepted NVML call returns while the
/// configuration is invalid (as the CUDA calls return `CUDA_ERROR_NOT_PERMITTED`).
pub const NVML_ERROR_NO_PERMISSION: CuResult = 4;
/// `NVML_SUCCESS`, `NVML_ERROR_INVALID_ARGUMENT`, `NVML_ERROR_INSUFFICIENT_SIZE`.
const NVML_SUCCESS: CuResult = 0;
const NVML_ERROR_INVALID_ARGUMENT: CuResult = 2;
const NVML_ERROR_INSUFFICIENT_SIZE: CuResult = 7;

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

pub(super) fn nvml_keys_match(config: &gpucap_core::config::Config) -> bool {
    let Some(view) = nvml_view() else {
        return true; // NVML cannot list its GPUs: nothing is capped here (below)
    };
    NVML_KEYS
        .get_or_init(|| {
            gpucap_core::config::check_gpu_keys(config, Some(view.len()), || Some(view))
                .inspect_err(|m| crate::log::say(m))
        })
        .is_ok()
}

/// The cap of an NVML device in a process that has not initialised CUDA, as CUDA's
/// would be (`total`: the memory CUDA shows, for a fraction): the environment's under a
/// ceiling handed down (`device_cap`, silent here: a monitor says nothing); None when it
/// is no CUDA device of the process or has no cap.
pub(super) fn nvml_cap_without_cuda(
    config: &gpucap_core::config::Config,
    device: Handle,
    total: u64,
) -> Option<u64> {
    let view = nvml_view()?;
    let uuid = queries::nvml_uuid(device)?;
    let ordinal = identity::ordinal_of(view, &uuid)?;
    gpucap_core::config::device_cap(
        config,
        ordinal,
        |spec| spec.for_device(ordinal as u32, Some(&uuid)),
        || Some(total),
    )
    .cap
}

/// Whether the intercepted NVML calls must fail closed (`NVML_ERROR_NO_PERMISSION`): an
/// invalid configuration, a limit key naming no GPU, a pool this process could not join.
/// Else the configuration and whether the process initialised CUDA.
fn nvml_config() -> Result<(&'static gpucap_core::config::Config, bool), CuResult> {
    // Not a CUDA call: the process does not become a CUDA user by it.
    let Ok(config) = SHIM.config_quiet() else {
        return Err(NVML_ERROR_NO_PERMISSION);
    };
    if identity::failed().is_some() || crate::membership::failed().is_some() {
        return Err(NVML_ERROR_NO_PERMISSION);
    }
    let cuda = queries::cuda_initialised();
    if !cuda && gpucap_core::config::names_gpus(config) && !nvml_keys_match(config) {
        return Err(NVML_ERROR_NO_PERMISSION);
    }
    Ok((config, cuda))
}

/// `nvmlDeviceGetMemoryInfo` and `_v2`: the driver's answer, capped for a GPU that
/// CUDA sees in this process; in a pool, a GPU of the pool shows the pool's used
/// memory (every member's) within its cap. `NVML_ERROR_NO_PERMISSION`, writing
/// nothing, under an invalid configuration or a pool file that cannot be read.
pub fn nvml_memory_info<M: nvml::MemoryInfo>(
    real: Real<(Handle, Out<M>)>,
    device: Handle,
    memory: Out<M>,
) -> CuResult {
    let (config, cuda) = match nvml_config() {
        Ok(c) => c,
        Err(rc) => return rc,
    };
    // Read before the driver fills the caller's struct: a refusal writes nothing.
    let Ok(pool) = nvml_pool_reader(config) else {
        return NVML_ERROR_NO_PERMISSION;
    };
    let rc = real.call(device, memory);
    if rc != 0 || (config.limit.is_none() && config.bound.is_none() && pool.is_none()) {
        return rc; // no cap, no ceiling and no pool: the driver's figures
    }
    // NVML succeeded and filled the caller's struct.
    let Some(m) = memory.get() else {
        return rc;
    };
    // Capped as `cuMemGetInfo` is: of CUDA's total, NVML's less what the driver keeps
    // back (a cap above CUDA's total leaves CUDA's, not NVML's larger one with the
    // reserved bytes shown as used; a fraction is of CUDA's total).
    let (free, nvml_total) = m.free_total();
    let reserved = m
        .reserved()
        .or_else(|| queries::nvml_reserved(device))
        .unwrap_or(0);
    let total = nvml_total.saturating_sub(reserved);
    let pooled = pool.and_then(|p| nvml_pool_gpu(p, device));
    let shown = if cuda {
        // A member: its own books say the pool's figures (`Shim::mem_info`).
        nvml_device(&SHIM, device)
            .map(|d| {
                if memory::growth() {
                    arena::mem_info(&SHIM, d, (free, total), growth::retained_bytes(d), false)
                } else {
                    SHIM.mem_info(d, free, total, 0)
                }
            })
            .or_else(|| {
                let g = pooled?;
                Some(nvml::within_pool((free, total), g.cap?, g.used))
            })
    } else {
        // Not a member (a monitor): the pool as its file says, else the configured cap.
        let configured = nvml_cap_without_cuda(config, device, total);
        match pooled {
            Some(g) => g
                .cap
                .or(configured)
                .map(|cap| nvml::within_pool((free, total), cap, g.used)),
            None => configured.map(|cap| nvml::within_cap((free, total), cap)),
        }
    };
    if let Some(free_total) = shown {
        memory.set(m.capped(free_total));
    }
    rc
}

/// `nvmlDeviceGetComputeRunningProcesses` (`nvmlProcessInfo_v1_t`), `_v2` and `_v3`
/// (`nvmlProcessInfo_v2_t`): for a GPU of this process's pool, the pool's live members
/// that hold memory of it, with their bytes, by NVML's count protocol ([`Listing`]);
/// without a pool, or for another GPU, the driver's answer untouched.
/// `NVML_ERROR_NO_PERMISSION` under an invalid configuration, as the memory figures.
pub fn nvml_compute_processes<P: ProcessInfo>(
    real: Real<(Handle, Out<u32>, OutArray<P>)>,
    device: Handle,
    count: Out<u32>,
    infos: OutArray<P>,
) -> CuResult {
    let gpu = match nvml_listed_pool_gpu(device) {
        Ok(Some(gpu)) => gpu,
        Ok(None) => return real.call(device, count, infos),
        Err(rc) => return rc,
    };
    // The caller's count: the room `infos` has, and where the count goes back.
    let Some(room) = count.get() else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    write_listing(device, &gpu, room, infos, |n| {
        count.set(n);
    })
}

/// `nvmlDeviceGetRunningProcessDetailList` (r550 and later; what `nvidia-smi
/// --query-compute-apps` reads on driver 580): in the compute and all modes, for a GPU of
/// this process's pool, the pool's members as [`nvml_compute_processes`] lists them,
/// `numProcArrayEntries` the count; another version, mode or GPU, or no pool: the
/// driver's answer untouched.
pub fn nvml_process_detail_list<'a>(
    real: Real<(Handle, Out<NvmlProcessDetailList<'a>>)>,
    device: Handle,
    list: Out<NvmlProcessDetailList<'a>>,
) -> CuResult {
    let gpu = match nvml_listed_pool_gpu(device) {
        Ok(Some(gpu)) => gpu,
        Ok(None) => return real.call(device, list),
        Err(rc) => return rc,
    };
    // The caller's struct: the version, mode, room and array it set.
    let Some(l) = list.get() else {
        return NVML_ERROR_INVALID_ARGUMENT;
    };
    if l.version != nvml::PROCESS_DETAIL_LIST_V1
        || !(l.mode == nvml::PROCESS_MODE_COMPUTE || l.mode == nvml::PROCESS_MODE_ALL)
    {
        // Forwarding the caller's arguments (the driver judges them).
        return real.call(device, list);
    }
    write_listing(device, &gpu, l.num_proc_array_entries, l.proc_array, |n| {
        list.set(NvmlProcessDetailList {
            num_proc_array_entries: n,
            ..l
        });
    })
}

/// The pool GPU whose members a process listing shows (None: no pool, or another GPU);
/// `Err` with NVML's code under an invalid configuration.
fn nvml_listed_pool_gpu(device: Handle) -> Result<Option<nvml::PoolGpu>, CuResult> {
    let (config, _) = nvml_config()?;
    let pool = nvml_pool_reader(config).map_err(|_| NVML_ERROR_NO_PERMISSION)?;
    Ok(pool.and_then(|p| nvml_pool_gpu(p, device)))
}

/// Writes `gpu`'s members into `infos` (which has `room` entries) by NVML's count
/// protocol ([`Listing`]), telling the count to `set_count`.
fn write_listing<P: ProcessInfo>(
    device: Handle,
    gpu: &nvml::PoolGpu,
    room: u32,
    infos: OutArray<P>,
    set_count: impl FnOnce(u32),
) -> CuResult {
    match nvml::listing(gpu.processes.len(), room, !infos.is_null()) {
        Listing::TooSmall(n) => {
            set_count(n);
            NVML_ERROR_INSUFFICIENT_SIZE
        }
        Listing::Write(n) => {
            let instance = queries::nvml_instance_ids(device);
            // `listing` answers Write only with n <= room, so every member fits.
            let members = gpu.processes.iter();
            infos.fill(
                room,
                members.map(|&(pid, used)| P::new(pid, used, instance)),
            );
            set_count(n);
            NVML_SUCCESS
        }
    }
}
