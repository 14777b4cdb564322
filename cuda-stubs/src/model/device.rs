//! The devices this process sees: the configuration once cuInit succeeded, ordinals and
//! their physical devices and identities, and the process's ledger.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::ledger::Ledger;
use crate::abi::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_NOT_INITIALIZED, CUresult};
use fake_gpu::config::{self, Config};
use fake_gpu::identity;
use fake_gpu::shared::Shared;
use libc::c_int;

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static LEDGER: OnceLock<Result<Ledger, String>> = OnceLock::new();

/// cuInit: reads the configuration and builds the process's ledger (joining the
/// FAKECUDA_SHARED file, if any). Ok(true) the first time it succeeds; the error is the
/// message naming the problem.
pub fn init() -> Result<bool, &'static str> {
    let cfg = config::get()?;
    init_ledger(cfg)?;
    Ok(!INITIALIZED.swap(true, Ordering::AcqRel))
}

/// The configuration once cuInit succeeded; CUDA_ERROR_NOT_INITIALIZED before.
pub fn cfg() -> Result<&'static Config, CUresult> {
    if INITIALIZED.load(Ordering::Acquire) {
        config::get().map_err(|_| CUDA_ERROR_NOT_INITIALIZED)
    } else {
        Err(CUDA_ERROR_NOT_INITIALIZED)
    }
}

/// Validates a CUdevice (its ordinal among the visible devices).
pub fn check_dev(dev: c_int) -> Result<usize, CUresult> {
    let cfg = cfg()?;
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < cfg.visible.len())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// The physical device behind a (valid) ordinal.
pub fn phys_of(dev: usize) -> usize {
    cfg().map(|c| c.visible[dev]).unwrap_or(dev)
}

/// The UUID cuDeviceGetUuid_v2 reports: the MIG instance's with FAKECUDA_MIG=1, else the
/// GPU's (see identity.rs for the values).
pub fn uuid_v2(dev: usize) -> [u8; 16] {
    let phys = phys_of(dev);
    match cfg() {
        Ok(c) if c.mig => identity::mig_uuid(phys),
        _ => identity::gpu_uuid(phys),
    }
}

/// The UUID cuDeviceGetUuid reports: always the GPU's (the real driver added _v2 to report
/// MIG instances; the old entry point keeps naming the parent GPU).
pub fn uuid_v1(dev: usize) -> [u8; 16] {
    identity::gpu_uuid(phys_of(dev))
}

pub fn device_name(dev: usize) -> String {
    match cfg() {
        Ok(c) => identity::device_name(phys_of(dev), c.mig, c.total_mem),
        Err(_) => identity::device_name(dev, false, 0),
    }
}

/// Builds the process's ledger from the configuration: joins the FAKECUDA_SHARED file if
/// there is one. The error names the problem.
fn init_ledger(cfg: &Config) -> Result<&'static Ledger, &'static str> {
    LEDGER
        .get_or_init(|| {
            let shared = match &cfg.shared {
                Some(path) => Some(Shared::join(path, cfg.devices, cfg.total_mem)?),
                None => None,
            };
            Ok(Ledger::with(cfg.visible.clone(), cfg.total_mem, shared))
        })
        .as_ref()
        .map_err(|e| e.as_str())
}

/// The process's ledger (exists once cuInit succeeded).
pub fn ledger() -> Result<&'static Ledger, CUresult> {
    cfg()?;
    match LEDGER.get() {
        Some(Ok(l)) => Ok(l),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}
