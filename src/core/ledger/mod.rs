//! The ledger: per-device caps, bytes in use, peaks, and the size of every live
//! allocation (in a [`LiveMap`], `live_map/`). Plain safe Rust, shared by every hook;
//! nothing here knows about CUDA.
//!
//! Reservation is one atomic step: [`Ledger::reserve`] checks the cap and adds the
//! bytes in a single compare-and-swap, and the returned [`Reservation`] rolls the
//! bytes back when dropped unless the caller [`commit`](Reservation::commit)s it
//! after the driver call succeeded.

use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use crate::budget::Member;
pub use crate::live_map::{Charge, LiveMap};

mod device;
mod reservation;
#[cfg(test)]
mod tests;

pub use device::{
    DEVICE_FIGURES_BYTES, DEVICE_WORDS, DEVICES_BYTES, Device, Devices, NO_CAP, Usage, usage_in,
};
use device::{add_past_cap, add_within_cap, note_peak};
pub use reservation::{Freeing, Refusal, Reservation};

/// How many memberships one process may have had, one per generation of forks that
/// joined a pool (a forked child cannot reuse its parent's slot: the parent holds it).
pub const POOL_GENERATIONS: usize = 8;

/// [`Ledger`]'s `pool_at` while the process is a pool member whose membership is not
/// there (a forked child of a member, until it joined as its own member).
const POOL_ORPHANED: usize = usize::MAX;

/// Per-device accounting plus the map of live allocations, and, when the process is
/// a member of a pool, the pool's budget: every reservation is checked against both.
pub struct Ledger {
    devices: Devices,
    pointers: LiveMap,
    /// The memberships this process had, one per generation of forks (see
    /// [`set_pool`](Self::set_pool)): kept here, so that a reservation or a credit finds
    /// the member in a few loads, without a call.
    members: [OnceLock<&'static Member<'static>>; POOL_GENERATIONS],
    /// 0: not in a pool (a reservation does not even look further: one load on the
    /// path of every allocation and free); k: the member in `members[k - 1]`;
    /// [`POOL_ORPHANED`]: in a pool, with no membership of this process's own yet.
    pool_at: AtomicUsize,
    /// Per device, the most this process may ever hold there ([`NO_CAP`]: no ceiling):
    /// the ceiling handed down to it. Kept here, in the process's own memory, not in a
    /// pool's words: a pool resized above it, or a member ceiling another process wrote
    /// there, never takes the process past it.
    ceilings: [AtomicU64; crate::config::MAX_DEVICES],
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    pub const fn new() -> Self {
        Ledger {
            devices: Devices::new(),
            pointers: LiveMap::new(),
            members: [const { OnceLock::new() }; POOL_GENERATIONS],
            pool_at: AtomicUsize::new(0),
            ceilings: [const { AtomicU64::new(NO_CAP) }; crate::config::MAX_DEVICES],
        }
    }

    /// The process joined a pool as `member`: charge it from now on, along with this
    /// process's own figures. False, with nothing changed, if this process had
    /// [`POOL_GENERATIONS`] memberships already.
    pub fn set_pool(&self, member: &'static Member<'static>) -> bool {
        for (k, slot) in self.members.iter().enumerate() {
            if slot.get().is_some_and(|m| std::ptr::eq(*m, member)) || slot.set(member).is_ok() {
                self.pool_at.store(k + 1, Release);
                return true;
            }
        }
        false
    }

    /// In a forked child of a pool member: the parent's membership is not this process's
    /// (nor is its memory mapped here). Until [`set_pool`](Self::set_pool) gives the
    /// child's own, no reservation takes the short path ([`try_reserve`](Self::try_reserve)
    /// says None) and nothing is charged to or credited from a pool. Outside a pool
    /// nothing changes. No allocation, no lock: callable in a fork handler.
    pub fn orphan_pool(&self) {
        if self.pool_at.load(Acquire) != 0 {
            self.pool_at.store(POOL_ORPHANED, Release);
        }
    }

    /// The pool to charge along with this process's figures.
    #[inline(always)]
    fn pool(&self) -> Option<&'static Member<'static>> {
        match self.pool_at.load(Acquire) {
            0 => None,
            k => self.pool_of(k),
        }
    }

    /// The member `pool_at` names (`k`, not 0).
    #[inline(always)]
    fn pool_of(&self, k: usize) -> Option<&'static Member<'static>> {
        self.members.get(k.wrapping_sub(1))?.get().copied()
    }

    fn device(&self, device: usize) -> Result<&Device, Refusal> {
        self.devices
            .get(device)
            .ok_or(Refusal::NoSuchDevice { device })
    }

    /// Sets a device's cap (`None`: count only). Out-of-range devices are ignored.
    pub fn set_cap(&self, device: usize, cap: Option<u64>) {
        if let Ok(d) = self.device(device) {
            d.cap
                .store(device::cap_word(cap.unwrap_or(NO_CAP)), Relaxed);
        }
    }

    /// Sets the most this process may ever hold on `device` (`None`: no ceiling), beside
    /// its cap: in a pool, whose rule may let a member past its own cap, the ceiling still
    /// holds. Out-of-range devices are ignored.
    pub fn set_ceiling(&self, device: usize, ceiling: Option<u64>) {
        if let Some(c) = self.ceilings.get(device) {
            c.store(ceiling.unwrap_or(NO_CAP), Relaxed);
        }
    }

    /// The ceiling of `device` ([`set_ceiling`](Self::set_ceiling)), None where none.
    pub fn ceiling(&self, device: usize) -> Option<u64> {
        let c = self.ceilings.get(device)?.load(Relaxed);
        (c != NO_CAP).then_some(c)
    }

    /// Checks the cap and adds `bytes` to the device's use in one atomic step.
    pub fn reserve(&self, device: usize, bytes: u64) -> Result<Reservation<'_>, Refusal> {
        self.reserve_asked(device, bytes, bytes)
    }

    /// [`reserve`](Self::reserve) of `bytes` to serve a request of `asked` bytes: a
    /// refusal records the larger of the two as the refused request's size (a request
    /// partly served from memory kept for reuse is refused for all it asked, not for
    /// the part that needed new memory; one rounded up to pages for its charge).
    pub fn reserve_asked(
        &self,
        device: usize,
        bytes: u64,
        asked: u64,
    ) -> Result<Reservation<'_>, Refusal> {
        let d = self.device(device)?;
        let size = asked.max(bytes);
        // In a pool the pool's rule decides: its cap as resized since this process set its
        // own (a raise would be refused here at the old one), the member's ceiling, and a
        // wait for memory (`GPUCAP_WAIT`) that other threads of this process may free too;
        // never past the ceiling handed down to this process, whatever the pool's words
        // say. Whatever the pool refuses is taken back below.
        let added = add_within_cap(d, bytes).or_else(|over| match self.pool() {
            None => Err(over),
            Some(_) => {
                let ceiling = self
                    .ceilings
                    .get(device)
                    .map_or(NO_CAP, |c| c.load(Relaxed));
                add_past_cap(d, bytes, ceiling)
                    .map_err(|(used, c)| if c == NO_CAP { over } else { (used, c) })
            }
        });
        let new = match added {
            Ok(new) => new,
            Err((used, cap)) => {
                d.refusals.fetch_add(1, Relaxed);
                d.largest_refused.fetch_max(size, Relaxed);
                // The program sees this refusal as any other: its pool counts it too.
                if let Some(pool) = self.pool() {
                    pool.note_refused(device, size);
                }
                return Err(Refusal::OverCap {
                    requested: bytes,
                    used,
                    cap,
                });
            }
        };
        let mut marked = None;
        if let Some(pool) = self.pool() {
            if let Err(refusal) = pool.reserve(device, bytes) {
                self.credit_own(Charge { device, bytes });
                d.refusals.fetch_add(1, Relaxed);
                d.largest_refused.fetch_max(size, Relaxed);
                return Err(Refusal::Pool(refusal));
            }
            marked = pool.alloc_started(device, bytes).then_some(pool);
        }
        note_peak(d, new);
        Ok(Reservation {
            ledger: self,
            charge: Charge { device, bytes },
            pool: marked,
        })
    }

    /// Charges `bytes` the driver already took where no call could be refused (the
    /// kernels a launch loaded): added without a check, so the device may stand past its
    /// cap (and the pool past its own) until memory is given back; every request then
    /// is refused. [`settle`](Self::settle) credits it.
    /// `bytes` is what the driver's own figure moved by, so the caller bounds it by the
    /// device's memory; here the sum saturates (a figure near `u64::MAX` would otherwise
    /// wrap the device's use round to a small number and uncap it).
    pub fn charge_past_cap(&self, device: usize, bytes: u64) {
        let Ok(d) = self.device(device) else {
            return;
        };
        let old = d
            .used
            .fetch_update(AcqRel, Acquire, |u| Some(u.saturating_add(bytes)))
            .unwrap_or_else(|u| u);
        let new = old.saturating_add(bytes);
        note_peak(d, new);
        if let Some(pool) = self.pool() {
            pool.charge_past_cap(device, bytes);
        }
    }

    /// The short path of an allocation: checks the cap (and the pool's, in a pool) and
    /// adds `bytes` in one step, as [`reserve`](Self::reserve), but a request either cap
    /// cannot take now gets None with nothing counted: the caller then takes the full
    /// path, which decides (waits, recounts, takes back the dead), counts and explains.
    /// So does a process in a pool whose membership is not there (a forked child that
    /// has not joined as its own member yet).
    #[inline(always)]
    pub fn try_reserve(&self, device: usize, bytes: u64) -> Option<Reservation<'_>> {
        let d = self.devices.get(device)?;
        let new = add_within_cap(d, bytes).ok()?;
        let k = self.pool_at.load(Acquire);
        let mut pool = None;
        if k != 0 {
            let Some(member) = self.try_reserve_pool(k, device, bytes) else {
                self.roll_back_own(Charge { device, bytes });
                return None;
            };
            pool = member;
        }
        note_peak(d, new);
        Some(Reservation {
            ledger: self,
            charge: Charge { device, bytes },
            pool,
        })
    }

    /// [`try_reserve`](Self::try_reserve)'s pool part (`k`: `pool_at`, not 0): None if the
    /// pool did not take `bytes` at once; else the member that marked the allocation
    /// started (see `budget::traffic`), to mark its end, if the device is the pool's. The
    /// member is looked up once for both. Inlined into the hooks (a process outside any
    /// pool pays one load and a branch for it: its hooks save six registers already; out
    /// of line the pool paid a second frame, +14 per pair).
    #[inline(always)]
    fn try_reserve_pool(
        &self,
        k: usize,
        device: usize,
        bytes: u64,
    ) -> Option<Option<&'static Member<'static>>> {
        let p = self.pool_of(k)?;
        p.try_reserve(device, bytes)
            .map(|started| started.then_some(p))
    }

    /// [`credit_own`](Self::credit_own) of a short path the pool refused, out of line.
    #[cold]
    #[inline(never)]
    fn roll_back_own(&self, charge: Charge) {
        self.credit_own(charge);
    }

    /// Counts an allocation served without a reservation (from retained memory).
    pub fn count_alloc(&self, device: usize) {
        if let Ok(d) = self.device(device) {
            d.allocs.add(1);
        }
    }

    fn credit(&self, charge: Charge) {
        self.credit_own(charge);
        if let Some(pool) = self.pool() {
            pool.credit(charge.device, charge.bytes);
        }
    }

    /// Credits this process's figures only (a reservation the pool refused).
    fn credit_own(&self, charge: Charge) {
        if let Ok(d) = self.device(charge.device) {
            // One read-modify-write (a credit is never refused). Never below zero, even if
            // a caller credited twice: what was taken beyond zero is put back.
            let before = d.used.fetch_sub(charge.bytes, AcqRel);
            if before < charge.bytes {
                d.used.fetch_add(charge.bytes - before, AcqRel);
            }
        }
    }

    /// Takes a live allocation out of the map before the driver frees it. If the
    /// driver then fails, [`restore`](Self::restore) puts it back; if it succeeds,
    /// [`settle`](Self::settle) credits the cap. Taking it first means a concurrent
    /// allocation that the driver gives the same address cannot be confused with it.
    #[inline(always)]
    pub fn take(&self, key: u64) -> Option<Charge> {
        self.pointers.remove(key)
    }

    /// [`take`](Self::take)'s common case alone (see [`LiveMap::remove_quick`]): None
    /// means only that `take` must look further.
    #[inline(always)]
    pub fn take_quick(&self, key: u64) -> Option<Charge> {
        self.pointers.remove_quick(key)
    }

    /// The rest of a [`take`](Self::take) after [`take_quick`](Self::take_quick) found
    /// nothing (see [`LiveMap::remove_rest`]).
    pub fn take_rest(&self, key: u64) -> Option<Charge> {
        self.pointers.remove_rest(key)
    }

    pub fn restore(&self, key: u64, charge: Charge) {
        self.pointers.insert(key, charge);
    }

    pub fn settle(&self, charge: Charge) {
        self.credit(charge);
    }

    /// Whether the process joined a pool (see [`announce`](Self::announce)).
    #[inline(always)]
    pub fn pooled(&self) -> bool {
        self.pool_at.load(Relaxed) != 0
    }

    /// [`settle`](Self::settle) for a process outside any pool ([`pooled`](Self::pooled)
    /// said so before the driver call): its own figures only.
    #[inline(always)]
    pub fn settle_alone(&self, charge: Charge) {
        self.credit_own(charge);
    }

    /// Before the driver frees memory charged as `charge`: in a pool, the free is
    /// announced to it (see `budget::traffic`: a member measuring a context then does not
    /// take these bytes off it). The driver freed it: [`settle_announced`](Self::settle_announced);
    /// it refused: [`withdraw`](Self::withdraw). Outside a pool one load.
    #[inline(always)]
    pub fn announce(&self, charge: Charge) -> Freeing {
        let k = self.pool_at.load(Acquire);
        let pool = if k != 0 {
            self.announce_pool(k, charge)
        } else {
            None
        };
        Freeing { charge, pool }
    }

    /// [`announce`](Self::announce)'s pool part.
    #[inline(always)]
    fn announce_pool(&self, k: usize, c: Charge) -> Option<&'static Member<'static>> {
        self.pool_of(k)
            .filter(|p| p.announce_free(c.device, c.bytes))
    }

    /// The driver freed what `f` announced: credited, as [`settle`](Self::settle).
    #[inline(always)]
    pub fn settle_announced(&self, f: Freeing) {
        self.credit_own(f.charge);
        if let Some(pool) = f.pool {
            pool.complete_free(f.charge.device, f.charge.bytes);
        }
    }

    /// The announcement of `f` ends with nothing credited here: the driver refused, or
    /// `f` announced an upper bound (a trim, a lowered limit, a raise set back) whose
    /// caller settles what was given back. Marked unsure in the pool: a measurement that
    /// added it back knows it may not have been given back.
    #[inline(always)]
    pub fn withdraw(&self, f: Freeing) {
        if let Some(pool) = f.pool {
            pool.withdraw_free(f.charge.device, f.charge.bytes);
        }
    }

    /// The live allocations on `device`, for a context teardown to check
    /// which of them the driver freed with the context.
    pub fn live_on(&self, device: usize) -> Vec<(u64, Charge)> {
        self.pointers.matching(|c| c.device == device)
    }

    /// Changes the bytes an existing reservation holds (a pitched allocation whose
    /// real size is known only after the call). Growing is checked against the cap.
    pub fn resize(&self, r: &mut Reservation<'_>, bytes: u64) -> Result<(), Refusal> {
        let old = r.charge.bytes;
        let device = r.charge.device;
        if bytes > old {
            let extra = self.reserve(device, bytes - old)?;
            // Its start is marked with `r`'s pool, if any: ended with `r`.
            if let (Some(p), None) = (extra.pool, r.pool) {
                p.alloc_ended(device, bytes - old, false);
            }
            std::mem::forget(extra);
        } else {
            if let Some(p) = r.pool {
                p.alloc_ended(device, old - bytes, false);
            }
            self.credit(Charge {
                device,
                bytes: old - bytes,
            });
        }
        r.charge.bytes = bytes;
        Ok(())
    }

    /// Bytes the cap of `device` still allows (two loads: for a check on the path of
    /// every allocation; `usage` reads every figure).
    #[inline]
    pub fn headroom(&self, device: usize) -> u64 {
        self.device(device).map_or(0, |d| {
            device::cap_of(d.cap.load(Relaxed)).saturating_sub(d.used.load(Relaxed))
        })
    }

    /// Whether [`reserve`](Self::reserve) of `bytes` on `device` would be refused now by
    /// this process's cap or its pool's: a check with no effect (nothing reserved, no
    /// refusal counted), for a caller that must first learn whether the call is one the
    /// driver answers itself. The pool's room here leaves out other members'
    /// guarantees: the reservation itself decides.
    pub fn would_refuse(&self, device: usize, bytes: u64) -> bool {
        let own = self.headroom(device) < bytes;
        let pooled = self
            .pool()
            .and_then(|m| m.usage(device))
            .is_some_and(|(used, cap, _)| cap.is_some_and(|c| c.saturating_sub(used) < bytes));
        own || pooled
    }

    /// [`would_refuse`](Self::would_refuse) with the pool's room as this member sees it
    /// (`Member::room`: other members' unused guarantees kept for them, its own ceiling),
    /// as the reservation decides: for a call about to be made again or refused by its
    /// measurement (a raised limit, a load), which must count no refusal it will not
    /// say. Reads more of the pool's words than `would_refuse`: off the allocation path.
    /// In a pool, the process's own figure refuses only past the ceiling handed down to
    /// it, as the reservation goes past its own cap up to that (a resize may have raised
    /// the pool's cap since it set its own).
    pub fn would_refuse_here(&self, device: usize, bytes: u64) -> bool {
        let Some(member) = self.pool() else {
            return self.headroom(device) < bytes;
        };
        let ceiling = self
            .ceilings
            .get(device)
            .map_or(NO_CAP, |c| c.load(Relaxed));
        let own = self.headroom(device) < bytes
            && self.device(device).is_ok_and(|d| {
                d.used
                    .load(Relaxed)
                    .checked_add(bytes)
                    .is_none_or(|n| n > ceiling)
            });
        let pooled = member.room(device).is_some_and(|(free, _)| free < bytes);
        own || pooled
    }

    /// Every device's figures, in whole pages of their own (see [`Devices`]).
    pub fn devices(&self) -> &Devices {
        &self.devices
    }

    pub fn usage(&self, device: usize) -> Option<Usage> {
        let d = self.device(device).ok()?;
        Some(Usage {
            cap: device::cap_of(d.cap.load(Relaxed)),
            used: d.used.load(Relaxed),
            peak: d.peak.load(Relaxed),
            allocs: d.allocs.get(),
            refusals: d.refusals.load(Relaxed),
            largest_refused: d.largest_refused.load(Relaxed),
        })
    }
}
