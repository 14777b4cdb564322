//! `cuInit`: the configuration is read and the GPU keys checked once the driver is up.

use super::current::note_visible_gpus;
use super::{note_short_path, shim, visible_count};
use crate::driver::forward::Real;
use crate::driver::types::{CUDA_ERROR_NOT_PERMITTED, CUDA_SUCCESS, CuResult};
use crate::driver::{calls, queries};
use crate::log::log;
use crate::state::{SHIM, Shim};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::identity;
use gpucap_core::ledger::{NO_CAP, POOL_GENERATIONS};

/// The ledger's fork handler, registered once the process joined a pool.
static LEDGER_AT_FORK: std::sync::Once = std::sync::Once::new();

/// In a forked child of a pool member: its ledger charges no pool until the child
/// joined as its own member (`Ledger::orphan_pool`; the membership's own handler drops
/// the parent's, see `membership`). Two stores at most: no allocation, no lock.
extern "C" fn orphan_ledger_in_child() {
    SHIM.ledger.orphan_pool();
}

pub fn init(real: Real<(u32,)>, flags: u32) -> CuResult {
    // The configuration, a pool joined, the lone file shown: files and sockets, so no
    // cancellation inside (`cancel.rs`).
    let _held = crate::cancel::NoCancel::hold();
    let shim = match shim() {
        Ok(s) => s,
        Err(rc) => return rc,
    };
    // A process alone (no pool) shows itself through a file mapped over its ledger's
    // figures: made now, before the driver answers, when no allocation can be made yet.
    if let Ok(config) = shim.config() {
        shim.say_notes();
        crate::lone::prepare(config, shim.ledger.devices());
    }
    let rc = real.call(flags);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    // Every key (ordinal or UUID) of every per-GPU variable (GPUCAP_LIMIT and HAMi-core's,
    // GPUCAP_GUARANTEE, GPUCAP_CEILING) must name a visible device: checked now, before
    // any pool is joined, by the check `gpucap check`/`run` make; fail closed. UUIDs are
    // asked of the driver only when a key is one or an error lists them.
    let Ok(config) = shim.config() else {
        return CUDA_ERROR_NOT_PERMITTED;
    };
    note_visible_gpus(visible_count());
    if gpucap_core::config::names_gpus(config)
        && let Err(msg) = gpucap_core::config::check_gpu_keys(config, visible_count(), || {
            identity::visible(queries::visible_uuids)
        })
    {
        // Always shown, whatever GPUCAP_LOG says: the program is being stopped.
        crate::log::say(identity::latch(msg));
        return CUDA_ERROR_NOT_PERMITTED;
    }
    if config.pool.is_some() && join_pool(shim, config).is_err() {
        return CUDA_ERROR_NOT_PERMITTED;
    }
    if crate::lone::pending() {
        crate::lone::show(config, &queries::visible_uuids().unwrap_or_default());
    }
    note_short_path(shim);
    rc
}

/// In a forked child of a pool member, at its first driver call (`cuInit` or any
/// other: a driver may let the child go on in the context it inherited): joins the pool
/// as its own member. If it cannot (a driver that refuses CUDA in a forked child cannot
/// say which GPUs there are), every call of the child fails closed with the line:
/// nothing it does is counted outside the pool.
pub(super) fn join_in_child() {
    if let Ok(config) = SHIM.config() {
        let _ = join_pool(&SHIM, config);
    }
}

/// Joins the pool of `GPUCAP_POOL` with every visible GPU's UUID and cap (resolved
/// now: members must agree on them). The message is printed once, whatever GPUCAP_LOG
/// says; every later call fails closed.
fn join_pool(shim: &Shim, config: &gpucap_core::config::Config) -> Result<(), ()> {
    if crate::membership::current().is_some() {
        return Ok(());
    }
    let already = crate::membership::failed().is_some();
    let refuse = |msg: String| {
        let msg = crate::membership::fail(msg);
        if !already {
            crate::log::say(msg);
        }
        Err(())
    };
    let Some(count) = visible_count() else {
        return refuse(
            "gpucap: cannot join the pool: the driver would not say how many GPUs it shows".into(),
        );
    };
    let count = count.min(MAX_DEVICES);
    let uuids = queries::visible_uuids().unwrap_or_default();
    let mut gpus = Vec::with_capacity(count);
    for d in 0..count {
        shim.resolve_cap(d, || calls::physical_total(d));
        let cap = shim.ledger.usage(d).map(|u| u.cap).filter(|&c| c != NO_CAP);
        let Some(&uuid) = uuids.get(d) else {
            return refuse(format!(
                "gpucap: cannot join the pool: the driver did not give GPU {d}'s UUID"
            ));
        };
        gpus.push(crate::membership::Gpu { uuid, cap });
    }
    match crate::membership::join(config, &gpus) {
        Ok(()) => {
            let joined = crate::membership::current();
            if !joined.is_some_and(|m| shim.ledger.set_pool(m)) {
                crate::membership::leave();
                return refuse(format!(
                    "gpucap: cannot join the pool: more than {POOL_GENERATIONS} nested forks joined pools"
                ));
            }
            // Allowed: `pthread_atfork` has no safe wrapper, and a fork handler is
            // registered here, where the pool is joined.
            // SAFETY: registers a plain extern "C" function taking nothing, run in fork
            // children.
            #[allow(unsafe_code)]
            LEDGER_AT_FORK.call_once(|| unsafe {
                libc::pthread_atfork(None, None, Some(orphan_ledger_in_child));
            });
            log!(
                Debug,
                "joined the pool {}",
                crate::membership::path().map_or(String::new(), |p| p.display().to_string())
            );
            Ok(())
        }
        Err(msg) => {
            if !already {
                crate::log::say(msg);
            }
            Err(())
        }
    }
}
