//! NVML in a pool (`GPUCAP_POOL`): the pool's file read without joining it, so that a
//! monitor (`nvidia-smi`, `nvitop`, `pynvml`), which never initialises CUDA, shows the
//! pool's used memory and lists the pool's processes. The file is opened read-only
//! and mapped `PROT_READ`: reading NVML cannot change the pool (a dead member's share
//! is taken back by members only).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use super::nvml::{NVML_ERROR_NO_PERMISSION, nvml_config};
use super::*;
use gpucap_core::config::Config;
use gpucap_core::nvml::{self, Listing, PoolGpu, ProcessInfo};
use gpucap_pool_file::PoolFile;

pub use gpucap_core::nvml::{NvmlProcessV1, NvmlProcessV2};

/// `NVML_SUCCESS`, `NVML_ERROR_INVALID_ARGUMENT`, `NVML_ERROR_INSUFFICIENT_SIZE`.
const NVML_SUCCESS: CuResult = 0;
const NVML_ERROR_INVALID_ARGUMENT: CuResult = 2;
const NVML_ERROR_INSUFFICIENT_SIZE: CuResult = 7;

/// The pool's file, opened read-only once it exists (kept for the life of the process).
static READER: OnceLock<PoolFile> = OnceLock::new();
static OPENING: Mutex<()> = Mutex::new(());
static SAID: AtomicBool = AtomicBool::new(false);

/// The configured pool's file, for reading: `Ok(None)` without a pool or while its file
/// does not exist yet (no member joined: the pool is empty, and opened on a later call
/// once it exists). An error (the file is not a pool file of this version, or may not
/// be trusted) is said once on stderr; the NVML calls then fail closed.
pub(super) fn nvml_pool_reader(config: &Config) -> Result<Option<&'static PoolFile>, ()> {
    let Some(spec) = &config.pool else {
        return Ok(None);
    };
    if let Some(f) = READER.get() {
        return Ok(Some(f));
    }
    let _guard = OPENING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(f) = READER.get() {
        return Ok(Some(f));
    }
    let opened = gpucap_pool_file::locate_existing(spec, config.pool_dir.as_deref())
        .and_then(|path| path.map(|p| gpucap_pool_file::open_reader(&p)).transpose());
    match opened {
        Ok(None) => Ok(None),
        Ok(Some(f)) => Ok(Some(READER.get_or_init(|| f))),
        Err(e) => {
            if !SAID.swap(true, Relaxed) {
                eprintln!("gpucap: cannot read the pool {spec}: {e}");
            }
            Err(())
        }
    }
}

/// The NVML device `device` as a GPU of the pool (matched by UUID), if it is one.
pub(super) fn nvml_pool_gpu(file: &PoolFile, device: Handle) -> Option<PoolGpu> {
    let uuid = queries::nvml_uuid(device)?;
    nvml::pool_gpu(&file.pool.view(&file.locks), &uuid)
}

/// `nvmlDeviceGetComputeRunningProcesses` (`nvmlProcessInfo_v1_t`), `_v2` and `_v3`
/// (`nvmlProcessInfo_v2_t`): for a GPU of this process's pool, the pool's live members
/// that hold memory of it, with their bytes, by NVML's count protocol ([`Listing`]);
/// without a pool, or for another GPU, the driver's answer untouched.
/// `NVML_ERROR_NO_PERMISSION` under an invalid configuration, as the memory figures.
pub fn nvml_compute_processes<P: ProcessInfo>(
    real: unsafe extern "C" fn(Handle, *mut u32, *mut P) -> CuResult,
    device: Handle,
    count: *mut u32,
    infos: *mut P,
) -> CuResult {
    let config = match nvml_config() {
        Ok((config, _)) => config,
        Err(rc) => return rc,
    };
    let Ok(pool) = nvml_pool_reader(config) else {
        return NVML_ERROR_NO_PERMISSION;
    };
    let Some(gpu) = pool.and_then(|p| nvml_pool_gpu(p, device)) else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real(device, count, infos) };
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's non-null count.
    let room = unsafe { *count };
    match nvml::listing(gpu.processes.len(), room, !infos.is_null()) {
        Listing::TooSmall(n) => {
            // SAFETY: as above.
            unsafe { *count = n };
            NVML_ERROR_INSUFFICIENT_SIZE
        }
        Listing::Write(n) => {
            let instance = queries::nvml_instance_ids(device);
            for (i, &(pid, used)) in gpu.processes.iter().enumerate() {
                // SAFETY: the caller's array holds `room` >= n entries (`listing`).
                unsafe { infos.add(i).write_unaligned(P::new(pid, used, instance)) };
            }
            // SAFETY: as above.
            unsafe { *count = n };
            NVML_SUCCESS
        }
    }
}
