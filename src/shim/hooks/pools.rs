//! Stream-ordered allocation and memory pools (see `gpucap_core::pools`).

use std::ffi::c_int;

use super::current::current_device;
use super::memory::growth_free;
use super::{On, Target, checked_device, pointer_freed, reserve, shim, written_pointer};
use crate::driver::forward::Real;
use crate::driver::queries;
use crate::driver::types::{
    CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CuResult, Dptr, Handle, In, LocationPrefix, Out,
    Stream,
};
use crate::log::log;
use crate::state::{POOLS, SHIM};
use gpucap_core::pools::{PoolDriver, PoolLocation};

pub fn mem_alloc_async(
    real: Real<(Out<Dptr>, usize, Stream)>,
    dptr: Out<Dptr>,
    size: usize,
    stream: Stream,
) -> CuResult {
    // The pool is the current pool of the stream's device, which need not be the
    // current context's.
    let on = if is_context_stream(stream) {
        On::Current(current_device())
    } else {
        match queries::stream_device(stream) {
            Some(d) => On::Named(Some(d)),
            None => On::Current(current_device()),
        }
    };
    let pool = on.device().and_then(queries::current_pool);
    pool_charged("cuMemAllocAsync", on, pool, size, dptr, stream, || {
        real.call(dptr, size, stream)
    })
}

pub fn mem_alloc_from_pool_async(
    real: Real<(Out<Dptr>, usize, Handle, Stream)>,
    dptr: Out<Dptr>,
    size: usize,
    pool: Handle,
    stream: Stream,
) -> CuResult {
    let api = "cuMemAllocFromPoolAsync";
    let call = || real.call(dptr, size, pool, stream);
    if pool.is_null() {
        // No pool: the driver's own error. Charged to the current device should it
        // allocate anyway.
        let on = On::Current(current_device());
        return pool_charged(api, on, None, size, dptr, stream, call);
    }
    if let Err(rc) = shim() {
        return rc;
    }
    // The pool's own device, whichever context is current.
    let key = pool as u64;
    match POOLS.locate(&queries::Pools, key) {
        Some(PoolLocation::Device(d)) => {
            let device = Some(c_int::try_from(d).unwrap_or(c_int::MAX));
            // The pool names its device, but a default stream needs a current context:
            // without one, the driver's own error (CUDA_ERROR_INVALID_CONTEXT).
            let on = match is_context_stream(stream) {
                true => On::Current(device),
                false => On::Named(device),
            };
            pool_charged(api, on, Some(key), size, dptr, stream, call)
        }
        // Host memory: not device memory.
        Some(PoolLocation::Host) => call(),
        None => unlocated_pool(api, key, size, dptr, stream, call),
    }
}

/// An allocation from a pool gpucap cannot locate: refused, never passed uncounted.
/// A handle the driver does not know as a pool gets the driver's own error.
pub(super) fn unlocated_pool(
    api: &str,
    pool: u64,
    size: usize,
    dptr: Out<Dptr>,
    stream: Stream,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    if queries::Pools.reserved(pool).is_none() {
        let rc = call();
        if rc != CUDA_SUCCESS {
            return rc;
        }
        // The driver allocated from it after all: given back, and refused.
        queries::free_async(written_pointer(dptr), stream);
    }
    log!(
        Warn,
        "refused {api} of {}: gpucap cannot tell which GPU memory pool {pool:#x} is on",
        gpucap_core::size::format_bytes(size as u64)
    );
    CUDA_ERROR_OUT_OF_MEMORY
}

/// NULL, `CU_STREAM_LEGACY` (1), `CU_STREAM_PER_THREAD` (2): the current context's
/// default streams.
pub(super) fn is_context_stream(stream: Stream) -> bool {
    (stream as usize) <= 2
}

/// A stream-ordered allocation: the request is reserved (the cap check), the driver
/// called, then the pool's charge settled to what it now reserves (see `pools`).
pub(super) fn pool_charged(
    api: &str,
    on: On,
    pool: Option<u64>,
    size: usize,
    dptr: Out<Dptr>,
    stream: Stream,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    if size == 0 {
        // Nothing is allocated (a CUDA 13.0 driver answers success): the driver's answer,
        // the ledger and the pools untouched.
        return call();
    }
    let bytes = size as u64;
    let bound = gpucap_core::pools::growth_bound(bytes);
    if captured_beyond_the_cap(on.device(), bound, stream) {
        // Captured into a graph: nothing is allocated now; the graph's memory is charged
        // when it is instantiated (`graphs.rs`).
        return call();
    }
    // What the pool may grow by is reserved, even if it may serve the request from its
    // cache: the driver, not the shim, decides that, and a concurrent allocation may take
    // the cache first. A pool grows by whole chunks (`growth_bound`: 32 MiB for 1 MiB on
    // the real driver), so reserving only the request let the device hold more than the
    // cap until the settle. Near the cap the pools are trimmed instead (`reserve`), which
    // is safe.
    let target = match reserve(api, on, bytes, bound) {
        Ok(t) => t,
        Err(rc) => return rc,
    };
    let pool = match &target {
        Target::Charged(r) => pool.map(|p| (p, r.charge().device)),
        Target::Uncharged => None,
    };
    if let Some((p, d)) = pool {
        POOLS.begin(p, d, bound);
    }
    let rc = call();
    let (CUDA_SUCCESS, Target::Charged(mut r)) = (rc, target) else {
        if let Some((p, _)) = pool {
            POOLS.abandoned(p, bound);
        }
        return rc;
    };
    let Some((pool, d)) = pool else {
        // No pool to read (the driver gave none): charged as a plain allocation (shrinking
        // a reservation cannot be refused).
        let _ = SHIM.ledger.resize(&mut r, bytes);
        r.commit(written_pointer(dptr));
        return rc;
    };
    let ptr = written_pointer(dptr);
    if let Err((refusal, r)) =
        POOLS.allocated(&SHIM.ledger, &queries::Pools, pool, d, ptr, bytes, r)
    {
        // The pool grew past what the cap allows: give the memory back and refuse. The
        // reservation is held until the memory is back, so no one else can take it.
        SHIM.refused(api, d, bytes, refusal);
        queries::free_async(ptr, stream);
        POOLS.reclaim(&SHIM.ledger, &queries::Pools, d);
        POOLS.abandoned(pool, bound);
        drop(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc
}

/// Whether a stream-ordered allocation the cap would refuse is only being captured into a
/// graph (the driver allocates nothing then). Asked of the driver only near the cap, so
/// that other allocations pay nothing.
fn captured_beyond_the_cap(device: Option<c_int>, bytes: u64, stream: Stream) -> bool {
    let Ok(shim) = shim() else { return false };
    device
        .and_then(|dev| checked_device(shim, dev))
        .is_some_and(|d| shim.ledger.would_refuse(d, bytes))
        && crate::driver::graph_queries::capturing(stream)
}

pub fn mem_free_async(real: Real<(Dptr, Stream)>, dptr: Dptr, stream: Stream) -> CuResult {
    if let Some(rc) = growth_free(dptr) {
        return rc;
    }
    // A plain allocation freed stream-ordered is credited when the free is enqueued,
    // as the program sees it.
    pointer_freed(dptr, || real.call(dptr, stream))
}

pub fn mem_pool_create(
    real: Real<(Out<Handle>, In<LocationPrefix>)>,
    pool: Out<Handle>,
    props: In<LocationPrefix>,
) -> CuResult {
    let rc = real.call(pool, props);
    // The driver accepted `props` and filled `pool`.
    if let (CUDA_SUCCESS, Some(loc), Some(handle)) = (rc, props.get(), pool.get()) {
        match loc.location_type {
            CU_MEM_LOCATION_TYPE_DEVICE => {
                if let Ok(device) = usize::try_from(loc.location_id) {
                    POOLS.register(handle as u64, device);
                }
            }
            CU_MEM_LOCATION_TYPE_HOST..=CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => {
                POOLS.register_host(handle as u64)
            }
            // Anything else is located by asking the driver when it is allocated from.
            _ => {}
        }
    }
    rc
}

/// `cuMemPoolDestroy`: the driver releases the pool's cached memory (announced to the
/// pool of processes first, see [`releasing`]).
pub fn mem_pool_destroy(real: Real<(Handle,)>, pool: Handle) -> CuResult {
    releasing(pool, || {
        let rc = real.call(pool);
        if rc == CUDA_SUCCESS {
            POOLS.destroyed(&SHIM.ledger, pool as u64);
        }
        rc
    })
}

/// `cuMemPoolTrimTo`: the driver releases what the pool caches (announced to the pool of
/// processes first, see [`releasing`]).
pub fn mem_pool_trim_to(real: Real<(Handle, usize)>, pool: Handle, keep: usize) -> CuResult {
    releasing(pool, || {
        let rc = real.call(pool, keep);
        if rc == CUDA_SUCCESS {
            POOLS.refresh_pool(&SHIM.ledger, &queries::Pools, pool as u64);
        }
        rc
    })
}

/// Runs `call`, which may make the driver release memory `pool` reserves and then settles
/// the pool's charge: what it may release (`MemPoolCharges::release_bound`) announced
/// first (`residents::announced_release`). Unannounced, a member trimming its pool inside
/// another member's measurement made that charge short by the bytes released.
fn releasing(pool: Handle, call: impl FnOnce() -> CuResult) -> CuResult {
    let most = || {
        let reserved = queries::Pools.reserved(pool as u64);
        POOLS
            .release_bound(pool as u64, reserved)
            .into_iter()
            .collect()
    };
    super::residents::announced_release(most, call)
}

/// Re-reads what the pools of `device` reserve: for the figures `cuMemGetInfo` and
/// NVML show.
pub fn refresh_pools(device: usize) {
    POOLS.refresh(&SHIM.ledger, &queries::Pools, device);
}
