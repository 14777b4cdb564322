//! The devices the fake NVML shows: physical GPUs (CUDA_VISIBLE_DEVICES is ignored) and
//! their MIG instances, their handles, the configuration while initialised, and the memory
//! each has in use (the FAKECUDA_SHARED file, else the fake libcuda of this process).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use libc::c_uint;

use crate::abi::{
    NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN, Res, log, nvmlReturn_t,
};
use fake_gpu::config::{self, Config};
use fake_gpu::identity;
use fake_gpu::shared::Shared;

/// H100 SXM5 80GB PCI ids: device 0x2330, vendor 0x10de, subsystem 0x16c1.
pub const PCI_DEVICE_ID: c_uint = 0x2330_10de;
pub const PCI_SUBSYSTEM_ID: c_uint = 0x16c1_10de;
/// The MIG profile count an H100 supports (nvmlDeviceGetMaxMigDeviceCount with MIG on).
pub const MAX_MIG_DEVICES: c_uint = 7;

// ---- device handles: addresses of static entries, one per GPU and one per MIG instance ----

/// What an nvmlDevice_t points at.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Device {
    magic: u32,
    phys: u32,
    mig: u32,
}

pub type nvmlDevice_t = *const Device;

const MAX: usize = identity::MAX_DEVICES;
const MAGIC: u32 = 0x4e56_4d4c;

const fn table(mig: u32) -> [Device; MAX] {
    let mut t = [Device {
        magic: MAGIC,
        phys: 0,
        mig,
    }; MAX];
    let mut i = 0;
    while i < MAX {
        t[i].phys = i as u32;
        i += 1;
    }
    t
}

static GPUS: [Device; MAX] = table(0);
static MIGS: [Device; MAX] = table(1);

/// The handle of GPU `phys`.
pub fn gpu_handle(phys: usize) -> nvmlDevice_t {
    &GPUS[phys]
}

/// The handle of the MIG instance of GPU `phys`.
pub fn mig_handle(phys: usize) -> nvmlDevice_t {
    &MIGS[phys]
}

/// A device handle: (physical index, is a MIG instance). INVALID_ARGUMENT for anything else.
pub fn dev(h: nvmlDevice_t) -> Result<(usize, bool), nvmlReturn_t> {
    let cfg = cfg()?;
    let size = std::mem::size_of::<Device>();
    for (t, mig) in [(&GPUS, false), (&MIGS, true)] {
        let base = t.as_ptr() as usize;
        let at = (h as usize).wrapping_sub(base);
        if at < MAX * size && at.is_multiple_of(size) {
            let phys = at / size;
            if phys < cfg.devices && (!mig || cfg.mig) {
                return Ok((phys, mig));
            }
        }
    }
    Err(NVML_ERROR_INVALID_ARGUMENT)
}

// ---- state ----

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// The configuration while initialised.
pub fn cfg() -> Result<&'static Config, nvmlReturn_t> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    config::get().map_err(|_| NVML_ERROR_UNKNOWN)
}

static OBSERVED: Mutex<Option<&'static Shared>> = Mutex::new(None);

/// The FAKECUDA_SHARED file, once some process has created it.
fn observed(cfg: &Config) -> Option<&'static Shared> {
    let path = cfg.shared.as_ref()?;
    let mut g = OBSERVED.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none()
        && let Ok(Some(s)) = Shared::observe(path)
    {
        *g = Some(Box::leak(Box::new(s)));
    }
    *g
}

/// What the fake libcuda of this process holds on `phys` (0 if it is not loaded).
fn libcuda_used(phys: usize) -> u64 {
    // SAFETY: looks up (without loading) the fake libcuda and its documented helper
    // `u64 fakecuda_device_used(u32)`; the handle is closed again.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return 0;
        }
        let f = libc::dlsym(h, c"fakecuda_device_used".as_ptr());
        let used = if f.is_null() {
            0
        } else {
            std::mem::transmute::<*mut libc::c_void, extern "C" fn(u32) -> u64>(f)(phys as u32)
        };
        libc::dlclose(h);
        used
    }
}

/// Bytes of `phys` in use.
pub fn used_of(cfg: &Config, phys: usize) -> u64 {
    if cfg.shared.is_some() {
        observed(cfg).map_or(0, |s| s.used(phys))
    } else {
        libcuda_used(phys)
    }
    .min(cfg.total_mem)
}

/// (pid, bytes) of the processes holding memory of `phys`.
pub fn processes_of(cfg: &Config, phys: usize) -> Vec<(u32, u64)> {
    if cfg.shared.is_some() {
        observed(cfg).map_or_else(Vec::new, |s| s.processes(phys))
    } else {
        match libcuda_used(phys) {
            0 => Vec::new(),
            n => vec![(std::process::id(), n)],
        }
    }
}

/// The display driver version of the branch that shipped the configured CUDA version.
pub fn driver_version(cuda: i32) -> &'static str {
    match cuda {
        13000.. => "580.65.06",
        12090.. => "575.57.08",
        12080.. => "570.86.10",
        12060.. => "560.35.03",
        12040.. => "550.54.14",
        12020.. => "535.104.05",
        12000.. => "525.60.13",
        _ => "470.57.02",
    }
}

/// nvmlInit: checks the configuration and counts one initialisation more
/// (NVML_ERROR_DRIVER_NOT_LOADED with FAKECUDA_NVML_FAIL=1).
pub fn init(flags: c_uint) -> Res {
    let _ = flags;
    match config::get() {
        Err(msg) => {
            log(msg);
            return Err(NVML_ERROR_UNKNOWN);
        }
        Ok(c) if c.nvml_fail => return Err(NVML_ERROR_DRIVER_NOT_LOADED),
        Ok(_) => {}
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// nvmlShutdown: one initialisation less; NVML_ERROR_UNINITIALIZED if there is none.
pub fn shutdown() -> Res {
    INIT_COUNT
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| NVML_ERROR_UNINITIALIZED)
}
