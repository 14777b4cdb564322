//! `cuInit`: the configuration is read and the limit's keys checked once the driver is up.

use super::*;

pub fn init(real: unsafe extern "C" fn(u32) -> CuResult, flags: u32) -> CuResult {
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // SAFETY: forwarding the caller's argument.
    let rc = unsafe { real(flags) };
    if rc != CUDA_SUCCESS {
        return rc;
    }
    // Every key of GPUCAP_LIMIT (ordinal or UUID) must name a visible device: checked
    // now, fail closed. UUIDs are asked of the driver only when a key is one.
    let Ok(config) = shim.config() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    if let Some(spec) = config.limit.as_ref().filter(|s| !s.devices.is_empty())
        && let Err(msg) = identity::check_keys(spec, visible_count(), || {
            identity::visible(queries::visible_uuids)
        })
    {
        // Always shown, whatever GPUCAP_LOG says: the program is being stopped.
        eprintln!("{}", identity::latch(msg));
        return CUDA_ERROR_NOT_PERMITTED;
    }
    rc
}
