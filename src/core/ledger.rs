//! The ledger: per-device caps, bytes in use, peaks, and the size of every live
//! allocation (in a [`LiveMap`], `live_map/`). Plain safe Rust, shared by every hook;
//! nothing here knows about CUDA.
//!
//! Reservation is one atomic step: [`Ledger::reserve`] checks the cap and adds the
//! bytes in a single compare-and-swap, and the returned [`Reservation`] rolls the
//! bytes back when dropped unless the caller [`commit`](Reservation::commit)s it
//! after the driver call succeeded.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

use crate::budget::{Member, PoolRefusal};
use crate::config::MAX_DEVICES;
use crate::counter::Counter;
pub use crate::live_map::{Charge, LiveMap};

/// The cap of a device that has none.
pub const NO_CAP: u64 = u64::MAX;

/// What the ledger knows of one device. The figures every allocation changes (`used`,
/// and `peak` when it moves) share one cache line with the cap; the allocation count is
/// spread over lines of its own ([`Counter`]), so that threads allocating at once share
/// no written line but the cap's. `repr(C)`: a lone process's file holds these words as
/// they are (see the lone file of the core), read by [`usage_in`].
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Device {
    cap: AtomicU64,
    used: AtomicU64,
    peak: AtomicU64,
    refusals: AtomicU64,
    largest_refused: AtomicU64,
    /// The rest of the first line, explicit: the file holds no padding (every byte of
    /// [`Devices`] is a word).
    _line: [AtomicU64; 3],
    allocs: Counter,
}

impl Device {
    const fn new() -> Self {
        Device {
            cap: AtomicU64::new(NO_CAP),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            largest_refused: AtomicU64::new(0),
            _line: [const { AtomicU64::new(0) }; 3],
            allocs: Counter::new(),
        }
    }
}

/// Every device's figures, alone in whole pages (64 KiB: any page size up to that): a
/// process capped alone (no pool) maps its file over them, so that `gpucap status`,
/// `top` and `metrics` read the words every allocation writes anyway (see the lone file of the core).
#[derive(Debug)]
#[repr(C, align(65536))]
pub struct Devices {
    devices: [Device; MAX_DEVICES],
    /// The rest of the 64 KiB, explicit (no padding: every byte is a word).
    _rest: [AtomicU64; DEVICES_REST],
}

/// The bytes of [`Devices`]: a whole number of pages.
pub const DEVICES_BYTES: usize = 65536;
const DEVICES_REST: usize = (DEVICES_BYTES - MAX_DEVICES * std::mem::size_of::<Device>()) / 8;
const _: () = assert!(std::mem::size_of::<Devices>() == DEVICES_BYTES);
const _: () = assert!(std::mem::size_of::<Device>() == 64 + 64 * crate::counter::COUNTER_LINES);

impl std::ops::Deref for Devices {
    type Target = [Device; MAX_DEVICES];
    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        &self.devices
    }
}

/// Words of one [`Device`].
pub const DEVICE_WORDS: usize = std::mem::size_of::<Device>() / 8;

/// One device's figures read from `words`, a copy of [`Devices`]' bytes as words (a lone
/// process's file): None when `device` is beyond them.
pub fn usage_in(words: &[AtomicU64], device: usize) -> Option<Usage> {
    use std::mem::offset_of;
    let base = device.checked_mul(DEVICE_WORDS)?;
    let d = words.get(base..base + DEVICE_WORDS)?;
    let at = |offset: usize| d[offset / 8].load(Relaxed);
    let allocs = (0..crate::counter::COUNTER_LINES)
        .map(|l| at(offset_of!(Device, allocs) + l * crate::counter::LINE_BYTES))
        .fold(0u64, u64::wrapping_add);
    Some(Usage {
        cap: at(offset_of!(Device, cap)),
        used: at(offset_of!(Device, used)),
        peak: at(offset_of!(Device, peak)),
        allocs,
        refusals: at(offset_of!(Device, refusals)),
        largest_refused: at(offset_of!(Device, largest_refused)),
    })
}

/// Adds `bytes` to `d`'s use if its cap allows: one compare-and-swap (retried while
/// other threads change the use). Ok: the new use; Err: the use and cap that refused.
#[inline]
fn add_within_cap(d: &Device, bytes: u64) -> Result<u64, (u64, u64)> {
    let cap = d.cap.load(Relaxed);
    let mut used = d.used.load(Relaxed);
    loop {
        let new = match used.checked_add(bytes) {
            Some(n) if n <= cap => n,
            _ => return Err((used, cap)),
        };
        match d.used.compare_exchange_weak(used, new, AcqRel, Relaxed) {
            Ok(_) => return Ok(new),
            Err(now) => used = now,
        }
    }
}

/// Raises `d`'s peak to `used` if it is higher. A plain load first: the peak rarely
/// moves, and an atomic read-modify-write on every allocation would cost more.
#[inline]
fn note_peak(d: &Device, used: u64) {
    if used > d.peak.load(Relaxed) {
        d.peak.fetch_max(used, Relaxed);
    }
}

/// A snapshot of one device's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The cap in bytes, or [`NO_CAP`].
    pub cap: u64,
    pub used: u64,
    pub peak: u64,
    pub allocs: u64,
    pub refusals: u64,
    pub largest_refused: u64,
}

impl Usage {
    /// Bytes the cap still allows (unbounded without a cap).
    pub fn headroom(&self) -> u64 {
        self.cap.saturating_sub(self.used)
    }
}

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
    ledger: &'a Ledger,
    charge: Charge,
    /// In a pool, the member that marked the allocation started (see `budget::traffic`):
    /// its end is marked with the driver's answer.
    pool: Option<&'static Member<'static>>,
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
fn roll_back_parts(
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
    charge: Charge,
    /// The pool it was announced to (None: not in a pool, nothing announced).
    pool: Option<&'static Member<'static>>,
}

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
}

impl Default for Ledger {
    fn default() -> Self {
        Self::new()
    }
}

impl Ledger {
    pub const fn new() -> Self {
        Ledger {
            devices: Devices {
                devices: [const { Device::new() }; MAX_DEVICES],
                _rest: [const { AtomicU64::new(0) }; DEVICES_REST],
            },
            pointers: LiveMap::new(),
            members: [const { OnceLock::new() }; POOL_GENERATIONS],
            pool_at: AtomicUsize::new(0),
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
            d.cap.store(cap.unwrap_or(NO_CAP), Relaxed);
        }
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
        let new = match add_within_cap(d, bytes) {
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
    pub fn force(&self, device: usize, bytes: u64) {
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
            pool.force(device, bytes);
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

    /// The driver refused to free what `f` announced: nothing credited.
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
            d.cap.load(Relaxed).saturating_sub(d.used.load(Relaxed))
        })
    }

    /// Every device's figures, in whole pages of their own (see [`Devices`]).
    pub fn devices(&self) -> &Devices {
        &self.devices
    }

    pub fn usage(&self, device: usize) -> Option<Usage> {
        let d = self.device(device).ok()?;
        Some(Usage {
            cap: d.cap.load(Relaxed),
            used: d.used.load(Relaxed),
            peak: d.peak.load(Relaxed),
            allocs: d.allocs.get(),
            refusals: d.refusals.load(Relaxed),
            largest_refused: d.largest_refused.load(Relaxed),
        })
    }
}

#[cfg(test)]
mod pool_tests {
    //! The ledger with a pool: both charged, both rolled back. (The pool's own protocol
    //! is tested in `budget`.)

    use std::sync::atomic::AtomicU64;
    use std::sync::{Mutex, OnceLock};

    use super::*;
    use crate::budget::{MemberInfo, MemberLocks, POOL_WORDS, Pool};

    /// The kernel's slot locks, shared by the test's "processes" (owner ids).
    static OWNERS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

    struct Proc(u32);

    impl MemberLocks for Proc {
        fn try_take(&self, s: usize) -> bool {
            let mut o = OWNERS.lock().unwrap();
            if o.len() <= s {
                o.resize(s + 1, 0);
            }
            if o[s] == 0 {
                o[s] = self.0;
                true
            } else {
                false
            }
        }
        fn give_back(&self, s: usize) {
            let mut o = OWNERS.lock().unwrap();
            if o.get(s) == Some(&self.0) {
                o[s] = 0;
            }
        }
        fn held(&self, s: usize) -> bool {
            OWNERS.lock().unwrap().get(s).is_some_and(|&o| o != 0)
        }
    }

    static MEMBER: OnceLock<Member<'static>> = OnceLock::new();

    #[test]
    fn a_ledger_in_a_pool_charges_both_and_rolls_both_back() {
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        let pool = Pool::create(words, 1, 0).unwrap();
        let join = |id: u32| {
            let locks: &'static Proc = Box::leak(Box::new(Proc(id)));
            let m = Member::join(pool, locks, &MemberInfo::default()).unwrap();
            m.register_gpu(0, &[7; 16], Some(1000)).unwrap();
            m
        };
        let other = join(1);
        let _ = MEMBER.set(join(2));
        let ledger = Ledger::new();
        ledger.set_cap(0, Some(1000));
        other.reserve(0, 300).unwrap();
        // Before the process says it joined, the pool is not asked.
        ledger.reserve(0, 900).unwrap().commit(1);
        assert_eq!(other.usage(0).unwrap().0, 300);
        let c = ledger.take(1).unwrap();
        ledger.settle(c);
        assert!(ledger.set_pool(MEMBER.get().unwrap()));
        let r = ledger.reserve(0, 800).err().unwrap();
        assert!(
            matches!(r, Refusal::Pool(p) if p.used == 300 && p.cap == 1000),
            "{r:?}"
        );
        assert_eq!(
            ledger.usage(0).unwrap().used,
            0,
            "the process's own figures rolled back"
        );
        let held = ledger.reserve(0, 600).unwrap();
        assert_eq!(other.usage(0).unwrap().0, 900);
        drop(held); // the driver failed: both roll back
        assert_eq!(other.usage(0).unwrap().0, 300);
        ledger.reserve(0, 700).unwrap().commit(2);
        let c = ledger.take(2).unwrap();
        ledger.settle(c);
        assert_eq!(
            (other.usage(0).unwrap().0, ledger.usage(0).unwrap().used),
            (300, 0)
        );
        // A refusal by the process's own cap is one the pool counts too.
        let before = pool.view(&Proc(3)).gpus[0].refusals;
        assert_eq!(before, 1, "the pool's own refusal above");
        let r = ledger.reserve(0, 1500).err().unwrap();
        assert!(matches!(r, Refusal::OverCap { .. }), "{r:?}");
        let g = &pool.view(&Proc(3)).gpus[0];
        assert_eq!((g.refusals, g.largest_refused), (2, 1500));
        assert_eq!(ledger.usage(0).unwrap().refusals, 2);

        // A free is announced to the pool before the driver call (a member measuring a
        // context sees it in flight), withdrawn if the driver refused, credited to both
        // once it freed.
        ledger.reserve(0, 400).unwrap().commit(3);
        let start = other.marks(0).unwrap();
        let c = ledger.take(3).unwrap();
        let f = ledger.announce(c);
        let now = other.marks(0).unwrap();
        assert_eq!(now.given_back_until(&now), 400, "in flight");
        ledger.withdraw(f);
        ledger.restore(3, c);
        let figures = || (other.usage(0).unwrap().0, ledger.usage(0).unwrap().used);
        assert_eq!(figures(), (700, 400));
        let c = ledger.take(3).unwrap();
        let f = ledger.announce(c);
        ledger.settle_announced(f);
        assert_eq!(figures(), (300, 0));

        // Memory the driver already took (a launch's kernels) is charged to both without
        // a check: the pool stands past its cap, every request is refused until it is
        // given back.
        ledger.force(0, 900);
        assert_eq!(figures(), (1200, 900));
        assert!(other.reserve(0, 1).is_err(), "the pool is past its cap");
        assert!(ledger.reserve(0, 50).is_err());
        assert!(ledger.try_reserve(0, 50).is_none());
        ledger.settle(Charge {
            device: 0,
            bytes: 900,
        });
        assert_eq!(figures(), (300, 0));
        let end = other.marks(0).unwrap();
        assert_eq!(end.given_back_until(&end), 0, "nothing in flight");
        assert_eq!(start.given_back_until(&end), 800, "both announcements");

        // An allocation is marked started when reserved and made when committed (kept
        // too); one rolled back, or shrunk, is not made for what it gave back.
        let taken = |f: &dyn Fn()| {
            let first = other.marks(0).unwrap();
            f();
            first.taken_until(&other.marks(0).unwrap())
        };
        assert_eq!(taken(&|| ledger.reserve(0, 100).unwrap().commit(5)), 100);
        assert_eq!(taken(&|| ledger.try_reserve(0, 50).unwrap().keep()), 50);
        assert_eq!(taken(&|| drop(ledger.reserve(0, 70).unwrap())), 0);
        assert_eq!(
            taken(&|| ledger.reserve(0, 70).unwrap().commit_unbacked(6)),
            0
        );
        assert_eq!(
            taken(&|| {
                let mut r = ledger.reserve(0, 300).unwrap();
                ledger.resize(&mut r, 200).unwrap();
                r.commit(7);
            }),
            200
        );
        let first = other.marks(0).unwrap();
        let r = ledger.reserve(0, 10).unwrap();
        let inside = other.marks(0).unwrap();
        r.commit(8);
        assert_eq!(inside.taken_until(&other.marks(0).unwrap()), 0, "in flight");
        assert_eq!(first.taken_until(&other.marks(0).unwrap()), 10);
    }

    /// A member's words, in a pool of its own.
    fn lone_member(id: u32) -> &'static Member<'static> {
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        let pool = Pool::create(words, 1, 0).unwrap();
        let locks: &'static Proc = Box::leak(Box::new(Proc(id)));
        let m = Member::join(pool, locks, &MemberInfo::default()).unwrap();
        m.register_gpu(0, &[7; 16], Some(1000)).unwrap();
        Box::leak(Box::new(m))
    }

    #[test]
    fn a_forked_child_s_ledger_charges_no_pool_until_it_joined_its_own() {
        let parent = lone_member(11);
        let l = Ledger::new();
        l.set_cap(0, Some(1000));
        l.orphan_pool();
        drop(
            l.try_reserve(0, 1)
                .expect("outside a pool: nothing to orphan"),
        );
        assert!(l.set_pool(parent));
        l.try_reserve(0, 100).unwrap().commit(1);
        assert_eq!(parent.usage(0).unwrap().0, 100);
        // Forked: the parent's membership is not the child's.
        l.orphan_pool();
        assert!(
            l.try_reserve(0, 1).is_none(),
            "a pool member without its membership takes the full path"
        );
        assert_eq!(l.usage(0).unwrap().used, 100, "its own figure rolled back");
        l.reserve(0, 50).unwrap().commit(2);
        let c = l.take(1).unwrap();
        l.settle(c);
        assert_eq!(
            parent.usage(0).unwrap().0,
            100,
            "the parent's pool untouched"
        );
        // Joined as its own member: charged there.
        let child = lone_member(12);
        assert!(l.set_pool(child));
        l.try_reserve(0, 200).unwrap().commit(3);
        assert_eq!(child.usage(0).unwrap().0, 200);
        assert_eq!(parent.usage(0).unwrap().0, 100);
        // As many generations as the ledger keeps, then no more.
        for g in 2..POOL_GENERATIONS {
            assert!(l.set_pool(lone_member(11 + g as u32)), "generation {g}");
        }
        assert!(!l.set_pool(lone_member(40)), "one generation too many");
        assert!(l.set_pool(child), "a membership it keeps already");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger_with_cap(cap: u64) -> Ledger {
        let l = Ledger::new();
        l.set_cap(0, Some(cap));
        l
    }

    #[test]
    fn a_forced_charge_may_pass_the_cap_and_refuses_everything_until_credited() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 600).unwrap().commit(1);
        l.force(0, 500);
        let u = l.usage(0).unwrap();
        assert_eq!((u.used, u.peak), (1100, 1100));
        assert!(l.reserve(0, 1).is_err() && l.try_reserve(0, 1).is_none());
        l.settle(Charge {
            device: 0,
            bytes: 500,
        });
        l.reserve(0, 400).unwrap().commit(2);
        assert_eq!(l.usage(0).unwrap().used, 1000);
        l.force(9, 1); // no such device: nothing
    }

    #[test]
    fn a_forced_figure_near_the_top_of_u64_saturates_never_wraps_round() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 600).unwrap().commit(1);
        l.force(0, u64::MAX);
        let u = l.usage(0).unwrap();
        assert_eq!(
            (u.used, u.peak),
            (u64::MAX, u64::MAX),
            "wrapped to {}",
            u.used
        );
        assert!(
            l.reserve(0, 1).is_err(),
            "a wrapped figure would have uncapped it"
        );
    }

    #[test]
    fn reserve_within_cap_and_refuse_over_it() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 600).unwrap().commit(1);
        let r = l.reserve(0, 500);
        assert_eq!(
            r.err(),
            Some(Refusal::OverCap {
                requested: 500,
                used: 600,
                cap: 1000
            })
        );
        l.reserve(0, 400).unwrap().commit(2);
        let u = l.usage(0).unwrap();
        assert_eq!(
            (u.used, u.peak, u.allocs, u.refusals, u.largest_refused),
            (1000, 1000, 2, 1, 500)
        );
        assert_eq!(u.headroom(), 0);
        assert_eq!(l.headroom(0), 0);
        assert_eq!(Ledger::new().headroom(0), u64::MAX, "no cap: unbounded");
        assert_eq!(l.headroom(MAX_DEVICES), 0, "no such device: nothing");
    }

    #[test]
    fn the_short_path_reserves_like_the_full_one_but_counts_no_refusal() {
        let l = ledger_with_cap(1000);
        l.try_reserve(0, 600).unwrap().commit(1);
        assert!(l.try_reserve(0, 500).is_none(), "over the cap");
        let u = l.usage(0).unwrap();
        assert_eq!((u.used, u.peak, u.allocs, u.refusals), (600, 600, 1, 0));
        drop(l.try_reserve(0, 400).unwrap()); // the driver failed: rolled back
        assert_eq!(l.usage(0).unwrap().used, 600);
        assert!(l.try_reserve(MAX_DEVICES, 1).is_none());
        assert!(
            Ledger::new().try_reserve(0, u64::MAX).is_some(),
            "no cap: anything that does not wrap"
        );
        assert!(ledger_with_cap(10).try_reserve(0, 11).is_none());
    }

    #[test]
    fn allocations_counted_from_many_threads_add_up() {
        let l = Ledger::new();
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        l.count_alloc(3);
                    }
                });
            }
        });
        assert_eq!(l.usage(3).unwrap().allocs, 60_000);
        assert_eq!(l.usage(2).unwrap().allocs, 0);
    }

    #[test]
    fn a_credit_twice_never_goes_below_zero() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 300).unwrap().commit(1);
        let c = l.take(1).unwrap();
        l.settle(c);
        l.settle(c);
        assert_eq!(l.usage(0).unwrap().used, 0);
        l.reserve(0, 1000).unwrap().commit(2);
    }

    #[test]
    fn dropped_reservation_rolls_back() {
        let l = ledger_with_cap(1000);
        {
            let _r = l.reserve(0, 700).unwrap();
            assert_eq!(l.usage(0).unwrap().used, 700);
        }
        assert_eq!(l.usage(0).unwrap().used, 0);
        assert_eq!(l.usage(0).unwrap().allocs, 0);
        // The peak remembers the transient reservation: it did hold the bytes.
        assert_eq!(l.usage(0).unwrap().peak, 700);
    }

    #[test]
    fn outside_a_pool_an_announced_free_is_a_plain_credit() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 300).unwrap().commit(1);
        let c = l.take(1).unwrap();
        l.withdraw(l.announce(c));
        assert_eq!(l.usage(0).unwrap().used, 300, "refused: still charged");
        l.settle_announced(l.announce(c));
        assert_eq!(l.usage(0).unwrap().used, 0);
    }

    #[test]
    fn free_takes_then_settles_or_restores() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 300).unwrap().commit(0xdead);
        let c = l.take(0xdead).unwrap();
        assert_eq!(l.take(0xdead), None, "a second take finds nothing");
        l.restore(0xdead, c);
        assert_eq!(l.usage(0).unwrap().used, 300, "restore keeps the charge");
        let c = l.take(0xdead).unwrap();
        l.settle(c);
        assert_eq!(l.usage(0).unwrap().used, 0);
    }

    #[test]
    fn kept_bytes_stay_charged_without_an_entry() {
        let l = ledger_with_cap(100);
        l.reserve(0, 60).unwrap().keep();
        l.count_alloc(0);
        let u = l.usage(0).unwrap();
        assert_eq!((u.used, u.allocs), (60, 1));
        assert!(l.reserve(0, 50).is_err());
    }

    #[test]
    fn live_on_lists_one_device() {
        let l = Ledger::new();
        l.reserve(0, 10).unwrap().commit(1);
        l.reserve(1, 20).unwrap().commit(2);
        assert_eq!(
            l.live_on(1),
            vec![(
                2,
                Charge {
                    device: 1,
                    bytes: 20
                }
            )]
        );
        assert!(l.live_on(2).is_empty());
    }

    #[test]
    fn no_wrap_near_u64_max() {
        let l = Ledger::new(); // no cap at all
        l.reserve(0, 100).unwrap().commit(1);
        assert!(matches!(
            l.reserve(0, u64::MAX - 50),
            Err(Refusal::OverCap { .. })
        ));
        assert!(matches!(
            l.reserve(0, u64::MAX),
            Err(Refusal::OverCap { .. })
        ));
        assert_eq!(l.usage(0).unwrap().used, 100);
        let capped = ledger_with_cap(1 << 30);
        assert!(capped.reserve(0, u64::MAX - 4095).is_err());
        assert_eq!(capped.usage(0).unwrap().used, 0);
    }

    #[test]
    fn zero_bytes_is_a_valid_reservation() {
        let l = ledger_with_cap(10);
        l.reserve(0, 10).unwrap().commit(1);
        assert!(l.reserve(0, 0).is_ok());
    }

    #[test]
    fn out_of_range_device_is_refused() {
        let l = Ledger::new();
        assert_eq!(
            l.reserve(MAX_DEVICES, 1).err(),
            Some(Refusal::NoSuchDevice {
                device: MAX_DEVICES
            })
        );
        assert!(l.usage(MAX_DEVICES).is_none());
    }

    #[test]
    fn devices_are_independent() {
        let l = Ledger::new();
        l.set_cap(0, Some(100));
        l.set_cap(1, Some(1000));
        assert!(l.reserve(0, 500).is_err());
        l.reserve(1, 500).unwrap().commit(1);
        assert_eq!(l.usage(0).unwrap().used, 0);
        assert_eq!(l.usage(1).unwrap().used, 500);
    }

    #[test]
    fn resize_grows_within_cap_and_shrinks() {
        let l = ledger_with_cap(1000);
        let mut r = l.reserve(0, 400).unwrap();
        l.resize(&mut r, 900).unwrap();
        assert_eq!(l.usage(0).unwrap().used, 900);
        assert!(l.resize(&mut r, 1100).is_err());
        assert_eq!(l.usage(0).unwrap().used, 900);
        l.resize(&mut r, 300).unwrap();
        assert_eq!(l.usage(0).unwrap().used, 300);
        drop(r);
        assert_eq!(l.usage(0).unwrap().used, 0);
    }

    #[test]
    fn concurrent_reservations_never_exceed_cap() {
        let l = ledger_with_cap(10_000);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let l = &l;
                s.spawn(move || {
                    // Each thread holds up to 8 allocations (about 12 000 bytes on
                    // average) before freeing them: over the cap even without
                    // another thread, so refusals happen however the threads run.
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7919 + t * 104_729) % 3000;
                        if let Ok(r) = l.reserve(0, size) {
                            let key = (t << 32) | i;
                            r.commit(key);
                            held.push(key);
                            assert!(l.usage(0).unwrap().used <= 10_000);
                        }
                        if held.len() == 8 || i % 8 == 7 {
                            for key in held.drain(..) {
                                let c = l.take(key).unwrap();
                                l.settle(c);
                            }
                        }
                    }
                    for key in held {
                        let c = l.take(key).unwrap();
                        l.settle(c);
                    }
                });
            }
        });
        let u = l.usage(0).unwrap();
        assert_eq!(u.used, 0);
        assert!(u.peak <= 10_000);
        assert!(u.refusals > 0, "the test must contend for the cap");
    }
}
