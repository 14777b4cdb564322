//! Synchronisation calls: pools release cached memory then, so they are re-read.

use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Handle, Stream};
use crate::state::{POOLS, SHIM};

/// After a synchronisation succeeded: pools release what they cache above their
/// release threshold then, so every pool is re-read (one load when there are none).
pub(super) fn synchronized(rc: CuResult) -> CuResult {
    if rc == CUDA_SUCCESS {
        POOLS.refresh_all(&SHIM.ledger, &queries::Pools);
    }
    rc
}

pub fn stream_synchronize(real: Real<(Stream,)>, stream: Stream) -> CuResult {
    synchronized(real.call(stream))
}

pub fn ctx_synchronize(real: Real<()>) -> CuResult {
    synchronized(real.call())
}

/// `cuEventSynchronize(event)` and CUDA 13's `cuCtxSynchronize_v2(ctx)`.
pub fn handle_synchronize(real: Real<(Handle,)>, handle: Handle) -> CuResult {
    synchronized(real.call(handle))
}
