//! What a context holds beside its allocations (modules, a limit's memory, kernels a
//! first launch loaded): recorded in a book of `gpucap_core::residents` with the context
//! it lives in, credited when its key goes or its context does.

use super::*;
use gpucap_core::residents::{Resident, ResidentBook};

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

/// Records `held` under `key` in `book`; an entry it replaces (a handle the driver
/// handed out again, or another thread's record made meanwhile) is credited: the driver
/// freed what it held, and a charge is never dropped.
pub(super) fn record<K: Copy + PartialEq>(book: &ResidentBook<K>, key: K, held: Resident) {
    if let Some(replaced) = book.add(key, held) {
        SHIM.ledger.settle(replaced.charge);
    }
}
