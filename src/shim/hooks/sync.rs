//! Synchronisation calls: pools release cached memory then, so they are re-read.

use super::*;

/// After a synchronisation succeeded: pools release what they cache above their
/// release threshold then, so every pool is re-read (one load when there are none).
pub(super) fn synchronized(rc: CuResult) -> CuResult {
    if rc == CUDA_SUCCESS {
        POOLS.refresh_all(&SHIM.ledger, &queries::Pools);
    }
    rc
}

pub fn stream_synchronize(
    real: unsafe extern "C" fn(Stream) -> CuResult,
    stream: Stream,
) -> CuResult {
    // SAFETY: forwarding the caller's argument.
    synchronized(unsafe { real(stream) })
}

pub fn ctx_synchronize(real: unsafe extern "C" fn() -> CuResult) -> CuResult {
    // SAFETY: forwarding the call.
    synchronized(unsafe { real() })
}

/// `cuEventSynchronize(event)` and CUDA 13's `cuCtxSynchronize_v2(ctx)`.
pub fn handle_synchronize(
    real: unsafe extern "C" fn(Handle) -> CuResult,
    handle: Handle,
) -> CuResult {
    // SAFETY: forwarding the caller's argument.
    synchronized(unsafe { real(handle) })
}
