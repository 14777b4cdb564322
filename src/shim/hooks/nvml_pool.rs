//! NVML in a pool (`GPUCAP_POOL`): the pool's file read without joining it, so that a
//! monitor (`nvidia-smi`, `nvitop`, `pynvml`), which never initialises CUDA, shows the
//! pool's used memory and lists the pool's processes (`nvml` answers the calls). The
//! file is opened read-only and read with `pread`, never mapped: reading NVML cannot
//! change the pool (a dead member's share is taken back by members only).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

use crate::driver::queries;
use crate::driver::types::Handle;
use gpucap_core::config::Config;
use gpucap_core::nvml::{self, PoolGpu};
use gpucap_pool_file::{PoolFile, Sharing};

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
    let opened =
        gpucap_pool_file::locate_existing(spec, config.pool_dir.as_deref()).and_then(|path| {
            path.map(|p| gpucap_pool_file::open_reader(&p, Sharing::of(spec)))
                .transpose()
        });
    match opened {
        Ok(None) => Ok(None),
        Ok(Some(f)) => Ok(Some(READER.get_or_init(|| f))),
        Err(e) => {
            if !SAID.swap(true, Relaxed) {
                crate::log::say(&format!("gpucap: cannot read the pool {spec}: {e}"));
            }
            Err(())
        }
    }
}

/// The NVML device `device` as a GPU of the pool (matched by UUID), if it is one.
pub(super) fn nvml_pool_gpu(file: &PoolFile, device: Handle) -> Option<PoolGpu> {
    let uuid = queries::nvml_uuid(device)?;
    match file.view() {
        Ok(view) => nvml::pool_gpu(&view, &uuid),
        Err(e) => {
            if !SAID.swap(true, Relaxed) {
                crate::log::say(&format!("gpucap: cannot read the pool: {e}"));
            }
            None
        }
    }
}
