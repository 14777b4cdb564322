//! What the driver takes on its own (see `gpucap_core::residents`): the shim's side of
//! the one policy. The hooks measure (the core's device-wide measurement over the real
//! driver, NVML's figure for this process, the driver's graph attribute) and make the
//! driver call; what is charged, refused or forced is the core's `residents::charge`,
//! and what each resident holds is recorded in its kind's book with the context it lives
//! in, credited when its key goes or its context does.

use super::reclaim_for;
use crate::driver::queries;
use crate::driver::types::{CUDA_ERROR_OUT_OF_MEMORY, CuResult, Handle};
use crate::log::log;
use crate::state::SHIM;
use gpucap_core::contexts::{Unmeasured, Verdict};
use gpucap_core::ledger::{Charge, Reservation};
use gpucap_core::residents::{self, Resident, ResidentCharges, Undo};

/// `charge` held in context `ctx` on `lock`'s device: with the context's driver id (a
/// handle handed out again is another context) and whether it is the primary.
pub(super) fn resident_in(
    ctx: Handle,
    lock: &gpucap_core::contexts::DeviceLock<'_>,
    charge: Charge,
) -> Resident {
    Resident {
        ctx: ctx as u64,
        ctx_id: queries::context_id(ctx),
        primary: lock.primary() == Some(ctx as u64),
        charge,
    }
}

/// Records `held` under `key` in `book` (`residents::record`: an entry it replaces is
/// credited).
pub(super) fn record<K: Copy + PartialEq>(book: &ResidentCharges<K>, key: K, held: Resident) {
    residents::record(&SHIM.ledger, book, key, held);
}

/// [`record`], adding to what `key` holds in the same context (`residents::record_more`).
pub(super) fn record_more<K: Copy + PartialEq>(book: &ResidentCharges<K>, key: K, held: Resident) {
    residents::record_more(&SHIM.ledger, book, key, held);
}

/// Runs `call`, the unload that frees the entries `taken` out of `book`
/// (`residents::given_back`: credited once the driver freed them, put back if not).
pub(super) fn given_back<K: Copy + PartialEq>(
    book: &ResidentCharges<K>,
    taken: Vec<(K, Resident)>,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    residents::given_back(&SHIM.ledger, book, taken, call)
}

/// Runs `call`, which may make the driver give back memory on its own (a trim, a
/// destroy) and settles its charges to the driver's figures: in a pool of processes, the
/// most it may give back on each device (`most`, asked only there) is announced first, as
/// any free is (`Ledger::announce`), so that a member measuring what the driver took for
/// it meanwhile does not take these bytes off its charge; the announcements end after the
/// call (what it gave back is credited by the settling, the rest never was).
pub(super) fn announced_release(
    most: impl FnOnce() -> Vec<Charge>,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    if !SHIM.ledger.pooled() {
        return call();
    }
    let announced: Vec<_> = most()
        .into_iter()
        .map(|c| SHIM.ledger.announce(c))
        .collect();
    let rc = call();
    announced.into_iter().for_each(|f| SHIM.ledger.withdraw(f));
    rc
}

/// Charges `bytes`, what a call `api` made on device `d` took (measured), `held` being
/// what was reserved for it before the call, where the call can be undone: Ok(bytes)
/// charged; if the cap (or the pool) cannot take them, `undo` undoes the call, the
/// reservation goes back after it, gpucap's refusal line is said and Err carries
/// `CUDA_ERROR_OUT_OF_MEMORY`. Memory the process's own pools only cache is trimmed
/// first, as for an allocation.
pub(super) fn charge_undoable(
    api: &str,
    d: usize,
    held: Option<Reservation<'static>>,
    bytes: u64,
    undo: impl FnOnce(),
) -> Result<u64, CuResult> {
    charge_undoable_floored(api, d, held, bytes, bytes, undo)
}

/// [`charge_undoable`] of a figure held above what the call was seen taking, `backed`
/// (`residents::charge_floored`: only that is marked made in the pool's marks).
pub(super) fn charge_undoable_floored(
    api: &str,
    d: usize,
    held: Option<Reservation<'static>>,
    bytes: u64,
    backed: u64,
    undo: impl FnOnce(),
) -> Result<u64, CuResult> {
    let reserved = held.as_ref().map_or(0, |r| r.charge().bytes);
    if bytes > reserved {
        reclaim_for(&SHIM, d, bytes - reserved);
    }
    match residents::charge_floored(&SHIM.ledger, d, held, bytes, backed, Undo::Possible) {
        Ok(c) => Ok(c.bytes),
        Err(refused) => {
            // The driver frees the memory before its room is given back.
            undo();
            drop(refused.held);
            SHIM.refused(api, d, refused.bytes, refused.refusal);
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        }
    }
}

/// Charges `bytes` a call that cannot be undone took on device `d` (kernels loaded,
/// graph memory reserved), `held` being what was reserved for it before the call:
/// whatever the cap says. Returns the bytes charged without a check (0 where there was
/// room).
pub(super) fn charge_done(d: usize, held: Option<Reservation<'static>>, bytes: u64) -> u64 {
    let forced = residents::charge_done(&SHIM.ledger, d, held, bytes).forced;
    if forced > 0 {
        // Past the cap: growth mode's retained pages that no allocation needs go back
        // until the cap has room again (one byte of it), as before a request.
        reclaim_for(&SHIM, d, 1);
    }
    forced
}

/// What to charge for a `what` (a context, a module) the driver just made on device
/// `d`, from its measurement: Ok(Some(bytes)) to charge; Ok(None) when it could not be
/// measured and `d` has no cap (allowed, not counted, said at error level); Err when it
/// could not be measured under a cap (said; the caller undoes it and refuses).
pub(super) fn judge_measured(
    api: &str,
    what: &str,
    d: usize,
    measured: Result<u64, Unmeasured>,
) -> Result<Option<u64>, CuResult> {
    let capped = SHIM
        .ledger
        .usage(d)
        .is_some_and(|u| u.cap != gpucap_core::ledger::NO_CAP);
    match (gpucap_core::contexts::verdict(measured, capped), measured) {
        (Verdict::Charge(bytes), _) => Ok(Some(bytes)),
        (Verdict::Refuse(rc), m) => {
            if let Err(why) = m {
                log!(
                    Error,
                    "refused {api} on GPU {d}: the memory the {what} takes could not be measured ({why}), and a {what} gpucap cannot charge would escape the cap"
                );
            }
            Err(rc)
        }
        (Verdict::Uncounted, m) => {
            if let Err(why) = m {
                log!(
                    Error,
                    "{api} on GPU {d}: the memory the {what} takes could not be measured ({why}): not counted (GPU {d} has no cap)"
                );
            }
            Ok(None)
        }
    }
}
