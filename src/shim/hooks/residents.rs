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
use gpucap_core::residents::{self, Resident, ResidentCharges, Undo, again};

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
/// call (what it gave back is credited by the settling, the rest never was; withdrawn,
/// all of it is marked unsure, so that such a member knows its figure may be that high).
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
    try_charge_undoable(d, held, bytes, backed, undo).map_err(|r| r.say(api))
}

/// A measured figure the cap could not take, the call undone and its reservation given
/// back: said to the program ([`say`](Self::say)) unless the call is made again
/// (`residents::again`).
pub(super) struct NotTaken {
    d: usize,
    bytes: u64,
    refusal: gpucap_core::ledger::Refusal,
}

impl NotTaken {
    /// gpucap's refusal line, and the driver's answer for it.
    pub(super) fn say(self, api: &str) -> CuResult {
        SHIM.refused(api, self.d, self.bytes, self.refusal);
        CUDA_ERROR_OUT_OF_MEMORY
    }
}

/// [`charge_undoable_floored`], a refusal returned unsaid.
pub(super) fn try_charge_undoable(
    d: usize,
    held: Option<Reservation<'static>>,
    bytes: u64,
    backed: u64,
    undo: impl FnOnce(),
) -> Result<u64, NotTaken> {
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
            Err(NotTaken {
                d,
                bytes: refused.bytes,
                refusal: refused.refusal,
            })
        }
    }
}

/// Why an attempt of a call that can be undone was undone, to be made again
/// (`residents::again`).
pub(super) enum Again {
    /// Its figure may be the pool's traffic, not the call's: measured above what it was
    /// expected to take by no more than the window's doubt, or more than the cap takes
    /// while what it surely took fits (checked with no effect: no refusal counted). Never
    /// the last attempt.
    Unsure,
    /// The cap refused its measured figure (counted; said if it is the last).
    Refused(NotTaken),
}

/// Makes `attempt` (a call that can be undone, measured and charged: `api`; given
/// whether it is the last) until one is done or the last is refused
/// (`residents::again`): the driver's answer, or gpucap's refusal said and
/// `CUDA_ERROR_OUT_OF_MEMORY`. Each attempt undone is said at debug level only.
pub(super) fn made_again(
    api: &str,
    mut attempt: impl FnMut(bool) -> Result<CuResult, Again>,
) -> CuResult {
    // Differs between processes and calls: two members whose windows met pause apart.
    let seed = u64::from(std::process::id()).rotate_left(32)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_nanos() as u64);
    let attempt = |k: u32| match attempt(k + 1 >= again::ATTEMPTS) {
        Ok(rc) => again::Attempt::Done(rc),
        Err(why) => {
            let said = match &why {
                Again::Unsure => {
                    "measured above what it surely took, beside the pool's traffic".to_string()
                }
                Again::Refused(n) => format!(
                    "measured {} on GPU {}, more than the cap takes",
                    gpucap_core::size::format_bytes(n.bytes),
                    n.d
                ),
            };
            log!(
                Debug,
                "{api}: {said}: undone to be made again (attempt {} of {})",
                k + 1,
                again::ATTEMPTS
            );
            again::Attempt::Undone(why)
        }
    };
    match again::until_measured(seed, attempt, std::thread::sleep) {
        Ok(rc) => rc,
        Err(Again::Refused(not_taken)) => not_taken.say(api),
        Err(Again::Unsure) => {
            // An attempt told it is the last is never undone for noise alone.
            log!(Error, "{api}: undone at its last attempt without a refusal");
            CUDA_ERROR_OUT_OF_MEMORY
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
