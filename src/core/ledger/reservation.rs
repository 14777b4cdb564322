//! Bytes held between the cap check and the driver's answer ([`Reservation`]: committed,
//! kept or rolled back), why one was refused ([`Refusal`]), and a free announced before
//! the driver's call ([`Freeing`]).

use crate::budget::{Member, PoolRefusal};
use crate::live_map::Charge;

use super::Ledger;

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The request would take the device over its cap.
    OverCap { requested: u64, used: u64, cap: u64 },
    /// The device index is beyond what the ledger tracks.
    NoSuchDevice { device: usize },
    /// The pool the process shares its budget with (`GPUCAP_POOL`) has no room.
    Pool(PoolRefusal),
}

/// Bytes held for one device between the cap check and the driver's answer.
#[must_use = "a reservation rolls back when dropped: commit it once the driver call succeeded"]
pub struct Reservation<'a> {
    pub(super) ledger: &'a Ledger,
    pub(super) charge: Charge,
    /// In a pool, the member that marked the allocation started (see `budget::traffic`):
    /// its end is marked with the driver's answer.
    pub(super) pool: Option<&'static Member<'static>>,
}

impl Reservation<'_> {
    /// The driver allocated: record the allocation under `key` so its free credits it.
    /// The device memory was taken in the call (see [`commit_unbacked`](Self::commit_unbacked)).
    #[inline(always)]
    pub fn commit(self, key: u64) {
        self.commit_as(key, true);
    }

    /// [`commit`](Self::commit) of memory the driver may back only later (managed
    /// memory, a stream-ordered pool's): a member measuring a context then never takes
    /// it off the context's charge.
    pub fn commit_unbacked(self, key: u64) {
        self.commit_as(key, false);
    }

    #[inline(always)]
    fn commit_as(self, key: u64, backed: bool) {
        // Not dropped (no roll-back); its fields read in place, not copied out first.
        let this = std::mem::ManuallyDrop::new(self);
        let (ledger, charge) = (this.ledger, this.charge);
        if let Some(pool) = this.pool {
            pool.alloc_ended(charge.device, charge.bytes, backed);
        }
        ledger.devices[charge.device].allocs.add(1);
        ledger.pointers.insert(key, charge);
    }

    /// The driver allocated memory that the caller keeps for itself (growth mode's
    /// retained pages, a context, a VMM handle, an array): the bytes stay charged and no
    /// live entry is recorded. The device memory was taken in the call.
    pub fn keep(self) {
        self.keep_as(true);
    }

    /// [`keep`](Self::keep) of memory the driver may back only later (a stream-ordered
    /// pool's growth).
    pub fn keep_unbacked(self) {
        self.keep_as(false);
    }

    /// The driver refused: the reservation rolled back (what dropping it does), out of
    /// line and by its fields, so that the caller's success path keeps them in registers
    /// rather than in a struct on the stack for a drop.
    #[inline(always)]
    pub fn roll_back(self) {
        let this = std::mem::ManuallyDrop::new(self);
        roll_back_parts(
            this.ledger,
            this.charge.device,
            this.charge.bytes,
            this.pool,
        );
    }

    /// [`keep`](Self::keep) of memory of which the driver was seen taking only `backed`
    /// bytes in the call (a charge held at what a call of its kind takes, above what was
    /// measured): the rest is marked as memory the driver did not make, so that another
    /// member's measurement never takes it off its own (see `budget::marks`).
    pub fn keep_backed(self, backed: u64) {
        if let Some(pool) = self.pool {
            let made = backed.min(self.charge.bytes);
            pool.alloc_ended(self.charge.device, made, true);
            if made < self.charge.bytes {
                pool.alloc_ended(self.charge.device, self.charge.bytes - made, false);
            }
        }
        std::mem::forget(self);
    }

    fn keep_as(self, backed: bool) {
        if let Some(pool) = self.pool {
            pool.alloc_ended(self.charge.device, self.charge.bytes, backed);
        }
        std::mem::forget(self);
    }

    pub fn charge(&self) -> Charge {
        self.charge
    }
}

/// A reservation the driver did not use, given back: its end marked in the pool (not
/// made), its bytes credited.
#[cold]
#[inline(never)]
pub(super) fn roll_back_parts(
    ledger: &Ledger,
    device: usize,
    bytes: u64,
    pool: Option<&'static Member<'static>>,
) {
    if let Some(pool) = pool {
        pool.alloc_ended(device, bytes, false);
    }
    ledger.credit(Charge { device, bytes });
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        roll_back_parts(
            self.ledger,
            self.charge.device,
            self.charge.bytes,
            self.pool,
        );
    }
}

/// A free announced before the driver call ([`Ledger::announce`]).
#[must_use = "settle_announced once the driver freed it, withdraw if it refused"]
pub struct Freeing {
    pub(super) charge: Charge,
    /// The pool it was announced to (None: not in a pool, nothing announced).
    pub(super) pool: Option<&'static Member<'static>>,
}
