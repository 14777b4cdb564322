//! Stream-ordered memory pools (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`): what a
//! pool costs the device is what it keeps *reserved* (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`),
//! not only its live allocations: a pool caches freed memory up to its release
//! threshold. Each pool the process allocates from is charged exactly its reserved
//! bytes, re-read from the driver:
//!
//! - on each allocation from it: the request is reserved first (the one atomic cap
//!   check), the driver called, then the charge is settled to the pool's new reserved
//!   size (more if the pool grew by more than the request, less if it served the
//!   request from its cache or released memory meanwhile);
//! - on `cuMemPoolTrimTo`, and lazily (`refresh`) wherever the figures are shown;
//! - when an allocation of any kind would go over the cap: the process's own pools
//!   are trimmed to what they use (`reclaim`), and the request retried once, so a
//!   program is not refused memory it is itself caching.
//!
//! Between two reads a pool may have released memory (at a synchronisation, when its
//! release threshold is low): the charge is then too high until the next read, never
//! too low.
//!
//! A pool is charged to the device its memory is on, never to the current context's:
//! a pool created through the shim has its location from `cuMemPoolCreate`; any other
//! (a device's default pool, which a program may take from another device's context)
//! is located by asking the driver ([`MemPoolCharges::locate`]). Pool memory freed with
//! `cuMemFree` goes back to its pool exactly as with `cuMemFreeAsync`.
//!
//! Plain safe Rust over a [`PoolDriver`] (the attribute reads and the trim) and a
//! [`PoolLocator`]; the hooks pass the real driver, the tests a fake.

mod driver;
mod records;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::config::MAX_DEVICES;
use crate::ledger::{Charge, Ledger, Refusal, Reservation};
pub use driver::{LocationAnswer, PoolDriver, PoolLocation, PoolLocator, growth_bound};
use records::{Pool, PoolRecords, pools_on, settle};

/// A pool allocation taken out of the book while the driver frees it: settled
/// ([`MemPoolCharges::settle_freed`]) once it did, restored ([`MemPoolCharges::restore_freed`]) if not.
#[must_use = "settle or restore a pool allocation taken out for a free"]
#[derive(Debug)]
pub struct TakenPtr {
    ptr: u64,
    pool: u64,
    bytes: u64,
}

/// Every pool the process allocated from or created, with its charge.
pub struct MemPoolCharges {
    records: Mutex<Option<PoolRecords>>,
    /// Pools per device, so that devices without pools cost nothing.
    count: [AtomicU32; MAX_DEVICES],
    /// Pools in all, so that a process without pools pays one load per sync.
    total: AtomicU32,
}

impl Default for MemPoolCharges {
    fn default() -> Self {
        Self::new()
    }
}

impl MemPoolCharges {
    pub const fn new() -> Self {
        MemPoolCharges {
            records: Mutex::new(None),
            count: [const { AtomicU32::new(0) }; MAX_DEVICES],
            total: AtomicU32::new(0),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut PoolRecords) -> T) -> T {
        // A poisoned lock only means a panic elsewhere while it was held; every
        // operation leaves the book consistent before it can panic.
        let mut g = self.records.lock().unwrap_or_else(|p| p.into_inner());
        f(g.get_or_insert_with(PoolRecords::default))
    }

    fn add(&self, records: &mut PoolRecords, pool: u64, device: usize) {
        if device < MAX_DEVICES && !records.pools.contains_key(&pool) {
            records.pools.insert(
                pool,
                Pool {
                    device,
                    ..Pool::default()
                },
            );
            self.count[device].fetch_add(1, Relaxed);
            self.total.fetch_add(1, Relaxed);
        }
    }

    fn remove(&self, records: &mut PoolRecords, ledger: &Ledger, pool: u64) {
        if let Some(p) = records.pools.remove(&pool) {
            self.count[p.device].fetch_sub(1, Relaxed);
            self.total.fetch_sub(1, Relaxed);
            ledger.settle(Charge {
                device: p.device,
                bytes: p.charged,
            });
        }
    }

    /// Starts tracking `pool` of `device` (created, or the device's current pool).
    pub fn register(&self, pool: u64, device: usize) {
        self.with(|b| self.add(b, pool, device));
    }

    /// Records a pool of host memory (allocations from it are not device memory).
    pub fn register_host(&self, pool: u64) {
        self.with(|b| b.hosts.insert(pool));
    }

    /// The device of a pool the book knows.
    #[cfg(test)]
    pub fn device_of(&self, pool: u64) -> Option<usize> {
        self.with(|b| b.pools.get(&pool).map(|p| p.device))
    }

    /// Where `pool` is: from the book, else from the driver — the pool's location
    /// attribute where the driver has one, else by finding it among the devices' default
    /// and current pools. A pool found is remembered. None: the pool cannot be located
    /// (and must not be allocated from uncounted).
    pub fn locate(&self, drv: &impl PoolLocator, pool: u64) -> Option<PoolLocation> {
        let known = self.with(|b| match b.pools.get(&pool) {
            Some(p) => Some(PoolLocation::Device(p.device)),
            None => b.hosts.contains(&pool).then_some(PoolLocation::Host),
        });
        if known.is_some() {
            return known;
        }
        // Asked with the book unlocked: these are driver calls.
        let found = match drv.location(pool) {
            LocationAnswer::At(at) => Some(at),
            LocationAnswer::Invisible => None,
            LocationAnswer::Silent => (0..drv.device_count().min(MAX_DEVICES))
                .find(|&d| drv.is_device_pool(d, pool))
                .map(PoolLocation::Device),
        };
        match found {
            Some(PoolLocation::Device(d)) => self.register(pool, d),
            Some(PoolLocation::Host) => self.register_host(pool),
            None => {}
        }
        found
    }

    /// Whether the process has pools at all (one load).
    #[inline]
    pub fn any(&self) -> bool {
        self.total.load(Relaxed) != 0
    }

    /// Whether `device` has pools at all (cheap).
    pub fn any_on(&self, device: usize) -> bool {
        self.count.get(device).is_some_and(|c| c.load(Relaxed) > 0)
    }

    /// An allocation of `bytes` (reserved) from `pool` is about to be made: until
    /// [`allocated`](Self::allocated) or [`abandoned`](Self::abandoned), its reservation
    /// covers the pool's growth.
    pub fn begin(&self, pool: u64, device: usize, bytes: u64) {
        self.with(|b| {
            self.add(b, pool, device);
            if let Some(p) = b.pools.get_mut(&pool) {
                p.inflight = p.inflight.saturating_add(bytes);
            }
        });
    }

    /// The allocation [`begin`](Self::begin) announced was not made (or was given back).
    pub fn abandoned(&self, pool: u64, bytes: u64) {
        self.with(|b| {
            if let Some(p) = b.pools.get_mut(&pool) {
                p.inflight = p.inflight.saturating_sub(bytes);
            }
        });
    }

    /// After the driver allocated `bytes` at `ptr` from `pool` with `r` reserved for it
    /// (announced with [`begin`](Self::begin)): settles the pool's charge to its
    /// reserved size. Err when the pool grew past what the reservations in flight and
    /// the cap allow: nothing is recorded, the reservation comes back to be held until
    /// the caller has freed the allocation and [`reclaim`](Self::reclaim)ed, then
    /// dropped after [`abandoned`](Self::abandoned).
    #[allow(clippy::too_many_arguments)]
    pub fn allocated<'a>(
        &self,
        ledger: &Ledger,
        drv: &impl PoolDriver,
        pool: u64,
        device: usize,
        ptr: u64,
        bytes: u64,
        mut r: Reservation<'a>,
    ) -> Result<(), (Refusal, Reservation<'a>)> {
        // What `begin` announced: the reservation as made (see `growth_bound`).
        let announced = r.charge().bytes;
        self.with(|b| {
            self.add(b, pool, device);
            let Some(reserved) = drv.reserved(pool) else {
                // The driver does not say what the pool reserves: the request is
                // charged as a plain allocation, credited by its free.
                self.remove(b, ledger, pool);
                // Shrinking a reservation cannot be refused.
                let _ = ledger.resize(&mut r, bytes);
                r.commit_unbacked(ptr);
                return Ok(());
            };
            settle(b, ledger, pool, reserved, Some(r))?;
            if let Some(p) = b.pools.get_mut(&pool) {
                p.inflight = p.inflight.saturating_sub(announced);
            }
            b.track(ptr, pool, bytes);
            ledger.count_alloc(device);
            Ok(())
        })
    }

    /// Before the driver frees `ptr` (`cuMemFreeAsync`, or `cuMemFree`, which frees pool
    /// memory too): takes it out if it is a live pool allocation. One load when the
    /// process has no pools.
    pub fn take_freed(&self, ptr: u64) -> Option<TakenPtr> {
        if self.total.load(Relaxed) == 0 {
            return None;
        }
        self.with(|b| {
            b.untrack(ptr)
                .map(|(pool, bytes)| TakenPtr { ptr, pool, bytes })
        })
    }

    /// The driver freed a pool allocation: the memory goes back to its pool, which
    /// keeps it charged, unless the pool was destroyed: then the driver released it,
    /// and the pool goes with its last allocation.
    pub fn settle_freed(&self, ledger: &Ledger, t: TakenPtr) {
        self.with(|b| {
            let orphan_done = match b.pools.get_mut(&t.pool) {
                Some(p) if p.destroyed => {
                    let give = t.bytes.min(p.charged);
                    p.charged -= give;
                    ledger.settle(Charge {
                        device: p.device,
                        bytes: give,
                    });
                    !b.ptrs.values().any(|&(q, _)| q == t.pool)
                }
                _ => false,
            };
            if orphan_done {
                self.remove(b, ledger, t.pool);
            }
        });
    }

    /// The driver refused to free it: the allocation is live again.
    pub fn restore_freed(&self, t: TakenPtr) {
        self.with(|b| b.track(t.ptr, t.pool, t.bytes));
    }

    /// A pool allocation was freed (the driver succeeded): [`take_freed`](Self::take_freed)
    /// and [`settle_freed`](Self::settle_freed) at once. Returns whether `ptr` was a
    /// pool allocation.
    pub fn freed(&self, ledger: &Ledger, ptr: u64) -> bool {
        match self.take_freed(ptr) {
            Some(t) => {
                self.settle_freed(ledger, t);
                true
            }
            None => false,
        }
    }

    /// Whether `ptr` is a live pool allocation.
    #[cfg(test)]
    pub fn is_pool_ptr(&self, ptr: u64) -> bool {
        self.with(|b| b.ptrs.contains_key(&ptr))
    }

    /// Re-reads one pool's reserved size (after a trim).
    #[cfg_attr(test, allow(dead_code))]
    pub fn refresh_pool(&self, ledger: &Ledger, drv: &impl PoolDriver, pool: u64) {
        self.with(|b| {
            self.settle_one(b, ledger, pool, drv.reserved(pool));
        });
    }

    /// Re-reads the reserved size of every pool on `device`.
    pub fn refresh(&self, ledger: &Ledger, drv: &impl PoolDriver, device: usize) {
        if !self.any_on(device) {
            return;
        }
        self.with(|b| {
            for pool in pools_on(b, device) {
                self.settle_one(b, ledger, pool, drv.reserved(pool));
            }
        });
    }

    /// Trims every pool on `device` to the bytes it uses and re-reads them, so that
    /// memory the process only caches is given back before a request is refused.
    /// Returns the bytes credited.
    pub fn reclaim(&self, ledger: &Ledger, drv: &impl PoolDriver, device: usize) -> u64 {
        if !self.any_on(device) {
            return 0;
        }
        let before = ledger.usage(device).map_or(0, |u| u.used);
        self.with(|b| {
            for pool in pools_on(b, device) {
                if let (Some(reserved), Some(used)) = (drv.reserved(pool), drv.used(pool))
                    && reserved > used
                {
                    // What the trim releases is announced to the pool of processes first,
                    // as any free (see `release_bound`).
                    let freeing = ledger.announce(Charge {
                        device,
                        bytes: reserved - used,
                    });
                    drv.trim_to(pool, used);
                    self.settle_one(b, ledger, pool, drv.reserved(pool));
                    ledger.withdraw(freeing);
                    continue;
                }
                self.settle_one(b, ledger, pool, drv.reserved(pool));
            }
        });
        before.saturating_sub(ledger.usage(device).map_or(0, |u| u.used))
    }

    /// The most a call may make the driver release of what device pool `pool` reserves
    /// (`cuMemPoolTrimTo`, `cuMemPoolDestroy`): its charge, or `reserved` (the driver's
    /// figure read now) if more; to announce to a pool of processes before the call, as
    /// any free is. None: a pool not tracked, or a host pool.
    pub fn release_bound(&self, pool: u64, reserved: Option<u64>) -> Option<Charge> {
        let (device, charged) = self.with(|b| b.pools.get(&pool).map(|p| (p.device, p.charged)))?;
        Some(Charge {
            device,
            bytes: charged.max(reserved.unwrap_or(0)),
        })
    }

    /// The most a synchronisation may make the driver release of what this process's
    /// device pools reserve, per device, to announce to a pool of processes before the
    /// call, as any free is: each pool's charge above its live allocations, or nothing
    /// where its release threshold (as `drv` reads it) is at least its charge (a pool
    /// set to keep everything, as allocators that cache on purpose set it; a threshold
    /// below the charge is not taken as a floor: the driver "will try to release" above
    /// it, in whole chunks). What a chunk keeps beside a live allocation is announced at
    /// every synchronisation (more, never less: a pool's release at one device's
    /// synchronisation does not tell what another device's pools still hold). No
    /// destroyed pool (released as its allocations are freed). Empty when the process has
    /// no pools (one load).
    pub fn cached_bounds(&self, drv: &impl PoolDriver) -> Vec<Charge> {
        if self.total.load(Relaxed) == 0 {
            return Vec::new();
        }
        self.with(|b| {
            let mut cached = [0u64; MAX_DEVICES];
            let caching = b
                .pools
                .iter()
                .filter(|(_, p)| !p.destroyed && p.charged > p.live);
            for (&h, p) in caching {
                if drv.release_threshold(h).is_some_and(|t| t >= p.charged) {
                    continue;
                }
                if let Some(c) = cached.get_mut(p.device) {
                    *c += p.charged - p.live;
                }
            }
            cached
                .iter()
                .enumerate()
                .filter(|&(_, &bytes)| bytes > 0)
                .map(|(device, &bytes)| Charge { device, bytes })
                .collect()
        })
    }

    /// `cuMemPoolDestroy(pool)` succeeded. The driver releases the pool's cached memory
    /// now and its outstanding allocations when they are freed: the charge drops to
    /// those allocations and follows their frees.
    pub fn destroyed(&self, ledger: &Ledger, pool: u64) {
        self.with(|b| {
            let outstanding: u64 = b
                .ptrs
                .values()
                .filter(|&&(q, _)| q == pool)
                .map(|&(_, n)| n)
                .sum();
            b.hosts.remove(&pool);
            let Some(p) = b.pools.get_mut(&pool) else {
                return;
            };
            if outstanding == 0 {
                self.remove(b, ledger, pool);
                return;
            }
            let keep = outstanding.min(p.charged);
            ledger.settle(Charge {
                device: p.device,
                bytes: p.charged - keep,
            });
            p.charged = keep;
            p.destroyed = true;
        });
    }

    /// The bytes charged to pools on `device`.
    #[cfg(test)]
    pub fn charged_on(&self, device: usize) -> u64 {
        self.with(|b| {
            b.pools
                .values()
                .filter(|p| p.device == device)
                .map(|p| p.charged)
                .sum()
        })
    }

    /// Forgets the pool allocations the driver no longer knows (their context was torn
    /// down), per `alive`.
    pub fn drop_dead_ptrs(&self, ledger: &Ledger, device: usize, alive: impl Fn(u64) -> bool) {
        let dead: Vec<u64> = self.with(|b| {
            b.ptrs
                .iter()
                .filter(|(_, (pool, _))| b.pools.get(pool).is_some_and(|p| p.device == device))
                .map(|(&ptr, _)| ptr)
                .collect()
        });
        for ptr in dead.into_iter().filter(|&p| !alive(p)) {
            self.freed(ledger, ptr);
        }
    }
}

impl MemPoolCharges {
    /// Re-reads a pool: [`settle`] without an allocation, dropping a pool the driver
    /// no longer knows (None).
    fn settle_one(&self, b: &mut PoolRecords, ledger: &Ledger, pool: u64, reserved: Option<u64>) {
        let Some(reserved) = reserved else {
            self.remove(b, ledger, pool);
            return;
        };
        let _ = settle(b, ledger, pool, reserved, None);
    }

    /// Re-reads every pool (after a synchronisation, when pools release memory).
    pub fn refresh_all(&self, ledger: &Ledger, drv: &impl PoolDriver) {
        if self.total.load(Relaxed) == 0 {
            return;
        }
        self.with(|b| {
            let all: Vec<u64> = b
                .pools
                .iter()
                .filter(|(_, p)| !p.destroyed)
                .map(|(&h, _)| h)
                .collect();
            for pool in all {
                self.settle_one(b, ledger, pool, drv.reserved(pool));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[test]
    fn a_pool_grows_by_at_least_a_chunk_in_granules() {
        const MIB: u64 = 1 << 20;
        assert_eq!(growth_bound(1), 32 * MIB);
        assert_eq!(growth_bound(32 * MIB), 32 * MIB);
        assert_eq!(growth_bound(32 * MIB + 1), 34 * MIB);
        assert_eq!(growth_bound(u64::MAX), u64::MAX);
    }

    /// A pool driver over a map: pool -> (reserved, used), and the pools' release
    /// thresholds (0 unless set).
    #[derive(Default)]
    struct Fake(
        RefCell<HashMap<u64, (u64, u64)>>,
        RefCell<HashMap<u64, u64>>,
    );

    impl Fake {
        fn set(&self, pool: u64, reserved: u64, used: u64) {
            self.0.borrow_mut().insert(pool, (reserved, used));
        }
        fn gone(&self, pool: u64) {
            self.0.borrow_mut().remove(&pool);
        }
    }

    impl PoolDriver for Fake {
        fn reserved(&self, pool: u64) -> Option<u64> {
            self.0.borrow().get(&pool).map(|x| x.0)
        }
        fn used(&self, pool: u64) -> Option<u64> {
            self.0.borrow().get(&pool).map(|x| x.1)
        }
        fn release_threshold(&self, pool: u64) -> Option<u64> {
            Some(self.1.borrow().get(&pool).copied().unwrap_or(0))
        }
        fn trim_to(&self, pool: u64, keep: u64) {
            if let Some(x) = self.0.borrow_mut().get_mut(&pool) {
                x.0 = x.0.min(keep.max(x.1));
            }
        }
    }

    fn setup(cap: u64) -> (Ledger, MemPoolCharges, Fake) {
        let l = Ledger::new();
        l.set_cap(0, Some(cap));
        (l, MemPoolCharges::new(), Fake::default())
    }

    fn used(l: &Ledger) -> u64 {
        l.usage(0).unwrap().used
    }

    /// Allocates `n` from pool 7 as the hook does: reserve, announce, "driver", settle
    /// (refused: the hook frees, then gives the reservation up).
    fn alloc(
        l: &Ledger,
        book: &MemPoolCharges,
        drv: &Fake,
        ptr: u64,
        n: u64,
        reserved_after: u64,
        used_after: u64,
    ) -> Result<(), Refusal> {
        let r = l.reserve(0, n)?;
        book.begin(7, 0, n);
        drv.set(7, reserved_after, used_after);
        book.allocated(l, drv, 7, 0, ptr, n, r)
            .map_err(|(refusal, r)| {
                book.abandoned(7, n);
                drop(r);
                refusal
            })
    }

    #[test]
    fn what_a_synchronisation_may_release_is_what_the_pools_cache() {
        let (l, book, drv) = setup(1000);
        assert!(
            book.cached_bounds(&drv).is_empty(),
            "no pools, nothing to announce"
        );
        // 300 asked, the pool reserves 320: 20 cached.
        alloc(&l, &book, &drv, 0x10, 300, 320, 300).unwrap();
        let on_0 = |bytes| vec![Charge { device: 0, bytes }];
        assert_eq!(book.cached_bounds(&drv), on_0(20));
        // Re-read after a synchronisation that released nothing: the 20 its chunk keeps
        // beside the allocation are still announced (more, never less).
        book.refresh_all(&l, &drv);
        assert_eq!(book.cached_bounds(&drv), on_0(20));
        // Freed: all of the pool's 320 is cached, and a sync may release it.
        assert!(book.freed(&l, 0x10));
        assert_eq!(book.cached_bounds(&drv), on_0(320));
        // A threshold below the charge is no floor; one at or above it keeps all of it.
        drv.1.borrow_mut().insert(7, 200);
        assert_eq!(book.cached_bounds(&drv), on_0(320));
        drv.1.borrow_mut().insert(7, 320);
        assert!(book.cached_bounds(&drv).is_empty());
        drv.1.borrow_mut().insert(7, 0);
        // Released: nothing more.
        drv.set(7, 0, 0);
        book.refresh_all(&l, &drv);
        assert!(book.cached_bounds(&drv).is_empty());
    }

    #[test]
    fn growth_of_allocations_in_flight_is_theirs_to_settle() {
        let (l, book, drv) = setup(1000);
        // Two threads reserve 400 each (800 of 1000 in use), both grow the pool before
        // either settles: the first must not be refused for the second's growth.
        let (ra, rb) = (l.reserve(0, 400).unwrap(), l.reserve(0, 400).unwrap());
        book.begin(7, 0, 400);
        book.begin(7, 0, 400);
        drv.set(7, 800, 800);
        // A sync re-reads the pool meanwhile: the growth is covered by the reservations
        // in flight, nothing more is charged (that would go past the cap).
        book.refresh_all(&l, &drv);
        assert_eq!(used(&l), 800);
        book.allocated(&l, &drv, 7, 0, 1, 400, ra)
            .map_err(|e| e.0)
            .unwrap();
        assert_eq!(
            used(&l),
            800,
            "charged its own 400, left the other 400 to the other"
        );
        book.allocated(&l, &drv, 7, 0, 2, 400, rb)
            .map_err(|e| e.0)
            .unwrap();
        assert_eq!((used(&l), book.charged_on(0)), (800, 800));
        // Growth nobody reserved for is charged if the cap allows, refused if not.
        let r = l.reserve(0, 100).unwrap();
        book.begin(7, 0, 100);
        drv.set(7, 1100, 900);
        let (refusal, r) = book.allocated(&l, &drv, 7, 0, 3, 100, r).unwrap_err();
        assert!(matches!(refusal, Refusal::OverCap { .. }));
        assert_eq!(
            used(&l),
            900,
            "the reservation is still held while the hook frees"
        );
        drv.set(7, 1100, 800); // the hook freed it; reclaim trims the pool
        book.reclaim(&l, &drv, 0);
        book.abandoned(7, 100);
        drop(r);
        assert_eq!((used(&l), book.charged_on(0)), (800, 800));
    }

    #[test]
    fn charges_what_the_pool_reserves() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 100, 100, 100).unwrap();
        assert_eq!(used(&l), 100);
        // The pool grew by more than asked (granularity): charged the growth.
        alloc(&l, &book, &drv, 2, 100, 300, 200).unwrap();
        assert_eq!(used(&l), 300);
        // Freed: the pool keeps the memory, so does the charge.
        assert!(book.freed(&l, 1));
        assert!(!book.freed(&l, 1), "a second free finds nothing");
        drv.set(7, 300, 100);
        assert_eq!(used(&l), 300);
        // Served from the cache: no growth, the reservation rolls back.
        alloc(&l, &book, &drv, 3, 100, 300, 200).unwrap();
        assert_eq!(used(&l), 300);
        assert_eq!(l.usage(0).unwrap().allocs, 3);
        // The pool released memory (a sync): the next read credits it.
        drv.set(7, 200, 200);
        book.refresh(&l, &drv, 0);
        assert_eq!(used(&l), 200);
        assert_eq!(book.charged_on(0), 200);
    }

    #[test]
    fn growth_past_the_cap_is_refused_and_rolled_back() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 500, 500, 500).unwrap();
        let e = alloc(&l, &book, &drv, 2, 100, 1200, 600).unwrap_err();
        assert!(matches!(e, Refusal::OverCap { .. }));
        assert_eq!(
            used(&l),
            500,
            "the reservation rolled back, the charge is unchanged"
        );
        assert!(!book.is_pool_ptr(2));
        // The hook then frees the pointer and reclaims: the pool is trimmed to its use.
        drv.set(7, 1200, 500);
        book.reclaim(&l, &drv, 0);
        assert_eq!(drv.reserved(7), Some(500));
        assert_eq!(used(&l), 500);
    }

    #[test]
    fn reclaim_trims_cached_memory() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 800, 800, 800).unwrap();
        book.freed(&l, 1);
        drv.set(7, 800, 0); // cached, not released
        assert!(l.reserve(0, 500).is_err());
        assert_eq!(book.reclaim(&l, &drv, 0), 800);
        assert_eq!(used(&l), 0);
        assert!(l.reserve(0, 500).is_ok());
        assert_eq!(book.reclaim(&l, &drv, 5), 0, "no pools on device 5");
    }

    #[test]
    fn destroy_keeps_outstanding_allocations_until_freed() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 100, 100, 100).unwrap();
        alloc(&l, &book, &drv, 2, 200, 400, 300).unwrap();
        assert_eq!(used(&l), 400);
        book.destroyed(&l, 7);
        drv.gone(7);
        assert_eq!(used(&l), 300, "the cache went with the pool");
        book.refresh(&l, &drv, 0);
        assert_eq!(used(&l), 300, "a destroyed pool is not re-read");
        book.freed(&l, 2);
        assert_eq!(used(&l), 100);
        book.freed(&l, 1);
        assert_eq!(used(&l), 0);
        assert!(!book.any_on(0));
    }

    #[test]
    fn destroying_an_empty_pool_credits_all() {
        let (l, book, drv) = setup(1000);
        book.register(9, 0);
        let r = l.reserve(0, 50).unwrap();
        drv.set(9, 64, 50);
        assert!(book.allocated(&l, &drv, 9, 0, 1, 50, r).is_ok());
        book.freed(&l, 1);
        assert_eq!(used(&l), 64);
        book.destroyed(&l, 9);
        assert_eq!(used(&l), 0);
        assert_eq!(book.device_of(9), None);
    }

    #[test]
    fn a_pool_the_driver_forgot_is_credited() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 100, 128, 100).unwrap();
        drv.gone(7);
        book.refresh(&l, &drv, 0);
        assert_eq!(used(&l), 0);
        assert_eq!(book.device_of(7), None);
        // Allocating from it again starts afresh.
        alloc(&l, &book, &drv, 2, 100, 100, 100).unwrap();
        assert_eq!(used(&l), 100);
    }

    #[test]
    fn an_unreadable_pool_charges_the_request_like_a_plain_allocation() {
        let (l, book, drv) = setup(1000);
        let r = l.reserve(0, 100).unwrap();
        assert!(book.allocated(&l, &drv, 42, 0, 0xabc, 100, r).is_ok());
        assert_eq!(used(&l), 100);
        assert!(!book.is_pool_ptr(0xabc));
        let c = l.take(0xabc).unwrap();
        l.settle(c);
        assert_eq!(used(&l), 0);
        assert!(!book.any_on(0));
    }

    /// A pool found grown past the cap with no allocation in flight (memory the driver
    /// served that no call through the shim reserved) is charged what it grew, past
    /// the cap, counted as no refusal: the next request is refused, and a release
    /// credits it.
    #[test]
    fn growth_no_allocation_reserved_is_charged_past_the_cap() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 500, 500, 500).unwrap();
        drv.set(7, 1500, 1500);
        book.refresh_all(&l, &drv);
        assert_eq!(used(&l), 1500, "charged what the pool reserves");
        assert_eq!(book.charged_on(0), 1500);
        assert!(l.would_refuse(0, 1));
        assert_eq!(
            l.usage(0).unwrap().refusals,
            0,
            "no program request was refused"
        );
        drv.set(7, 500, 500);
        book.refresh_all(&l, &drv);
        assert_eq!(used(&l), 500);
    }

    #[test]
    fn a_synchronisation_re_reads_every_pool() {
        let (l, book, drv) = setup(1000);
        book.refresh_all(&l, &drv); // no pools: nothing asked
        alloc(&l, &book, &drv, 1, 300, 300, 300).unwrap();
        book.freed(&l, 1);
        drv.set(7, 0, 0);
        book.refresh_all(&l, &drv);
        assert_eq!(used(&l), 0);
    }

    #[test]
    fn dead_pointers_of_a_torn_down_context_are_dropped() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 100, 100, 100).unwrap();
        alloc(&l, &book, &drv, 2, 100, 200, 200).unwrap();
        book.drop_dead_ptrs(&l, 0, |p| p == 2);
        assert!(!book.is_pool_ptr(1) && book.is_pool_ptr(2));
        assert_eq!(used(&l), 200, "the pool still holds it until re-read");
    }

    /// A locator: each device's default pool is `100 + device`; `answers` is what the
    /// location attribute says, by pool.
    struct Locator {
        devices: usize,
        answers: HashMap<u64, LocationAnswer>,
        asked: RefCell<u32>,
    }

    impl PoolLocator for Locator {
        fn location(&self, pool: u64) -> LocationAnswer {
            *self.asked.borrow_mut() += 1;
            self.answers
                .get(&pool)
                .copied()
                .unwrap_or(LocationAnswer::Silent)
        }
        fn device_count(&self) -> usize {
            self.devices
        }
        fn is_device_pool(&self, device: usize, pool: u64) -> bool {
            pool == 100 + device as u64
        }
    }

    fn locator(answers: &[(u64, LocationAnswer)]) -> Locator {
        Locator {
            devices: 2,
            answers: answers.iter().copied().collect(),
            asked: RefCell::new(0),
        }
    }

    #[test]
    fn pools_are_located_by_the_driver_not_the_current_context() {
        let (_, book, _) = setup(1000);
        let drv = locator(&[
            (7, LocationAnswer::At(PoolLocation::Device(1))),
            (8, LocationAnswer::At(PoolLocation::Host)),
            (9, LocationAnswer::Invisible),
        ]);
        // Another device's default pool, found among the devices' pools.
        assert_eq!(book.locate(&drv, 101), Some(PoolLocation::Device(1)));
        assert_eq!(book.locate(&drv, 100), Some(PoolLocation::Device(0)));
        // The location attribute, where the driver has it.
        assert_eq!(book.locate(&drv, 7), Some(PoolLocation::Device(1)));
        assert_eq!(book.locate(&drv, 8), Some(PoolLocation::Host));
        // Neither: not located.
        assert_eq!(book.locate(&drv, 9), None);
        assert_eq!(book.locate(&drv, 55), None);
        // Found once, then known: the driver is not asked again.
        let asked = *drv.asked.borrow();
        for pool in [100, 101, 7, 8] {
            assert!(book.locate(&drv, pool).is_some());
        }
        assert_eq!(*drv.asked.borrow(), asked);
        assert_eq!(book.device_of(101), Some(1));
        // A pool created through the shim is known without asking.
        book.register(42, 1);
        book.register_host(43);
        assert_eq!(book.locate(&drv, 42), Some(PoolLocation::Device(1)));
        assert_eq!(book.locate(&drv, 43), Some(PoolLocation::Host));
        assert_eq!(*drv.asked.borrow(), asked);
        // Destroyed: forgotten.
        let l = Ledger::new();
        book.destroyed(&l, 43);
        assert_eq!(book.locate(&drv, 43), None);
    }

    #[test]
    fn a_free_the_driver_refuses_keeps_the_allocation() {
        let (l, book, drv) = setup(1000);
        alloc(&l, &book, &drv, 1, 100, 100, 100).unwrap();
        let t = book.take_freed(1).unwrap();
        assert!(
            !book.is_pool_ptr(1),
            "out of the book while the driver frees"
        );
        book.restore_freed(t);
        assert!(book.is_pool_ptr(1));
        assert!(book.take_freed(2).is_none(), "not a pool allocation");
        assert!(
            MemPoolCharges::new().take_freed(1).is_none(),
            "no pools at all"
        );
    }

    #[test]
    fn freed_then_destroyed_or_destroyed_then_freed_credits_all() {
        for destroy_first in [false, true] {
            let (l, book, drv) = setup(1000);
            alloc(&l, &book, &drv, 1, 500, 500, 500).unwrap();
            if destroy_first {
                book.destroyed(&l, 7);
                assert_eq!(used(&l), 500, "the allocation is still out");
                let t = book.take_freed(1).unwrap();
                book.settle_freed(&l, t);
            } else {
                let t = book.take_freed(1).unwrap();
                book.settle_freed(&l, t);
                assert_eq!(used(&l), 500, "the pool keeps what it reserves");
                drv.set(7, 500, 0);
                book.destroyed(&l, 7);
            }
            assert_eq!(used(&l), 0, "destroy first: {destroy_first}");
            assert!(!book.any_on(0));
            assert!(l.reserve(0, 768).is_ok());
        }
    }
}
