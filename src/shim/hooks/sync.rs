//! Synchronisation calls: pools release cached memory then, so they are re-read.

use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{CUDA_SUCCESS, CuResult, Handle, Stream};
use crate::state::{POOLS, SHIM};

/// A synchronisation made by `call`: pools release what they cache above their release
/// threshold then, so every pool is re-read after it succeeded (one load when there are
/// none). In a pool of processes, what they cache above what they keep is announced
/// first as a free (`residents::announced_release`, `MemPoolCharges::cached_bounds`): unannounced, a release at a synchronisation inside
/// another member's measurement made that member's charge short by the bytes released.
pub(super) fn synchronized(call: impl FnOnce() -> CuResult) -> CuResult {
    if !POOLS.any() {
        return call(); // no pools: nothing released, nothing to re-read (one load)
    }
    super::residents::announced_release(
        || POOLS.cached_bounds(&queries::Pools),
        || {
            let rc = call();
            if rc == CUDA_SUCCESS {
                POOLS.refresh_all(&SHIM.ledger, &queries::Pools);
            }
            rc
        },
    )
}

pub fn stream_synchronize(real: Real<(Stream,)>, stream: Stream) -> CuResult {
    synchronized(|| real.call(stream))
}

pub fn ctx_synchronize(real: Real<()>) -> CuResult {
    synchronized(|| real.call())
}

/// `cuEventSynchronize(event)` and CUDA 13's `cuCtxSynchronize_v2(ctx)`.
pub fn handle_synchronize(real: Real<(Handle,)>, handle: Handle) -> CuResult {
    synchronized(|| real.call(handle))
}
