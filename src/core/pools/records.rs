//! `MemPoolCharges`'s records (each pool's device, charge, allocations in flight; the live
//! pool allocations; the host pools) and how a pool's charge is settled to the bytes it
//! reserves.

use std::collections::{HashMap, HashSet};

use crate::ledger::{Charge, Ledger, Refusal, Reservation};

/// One pool the book tracks: its device, its charge and what is in flight.
#[derive(Debug, Default)]
pub(super) struct Pool {
    pub(super) device: usize,
    /// Bytes of the ledger charged to this pool.
    pub(super) charged: u64,
    /// Bytes reserved for allocations from this pool that the driver is making now: the
    /// pool may already have grown by them, so they count as covering its growth.
    pub(super) inflight: u64,
    /// `cuMemPoolDestroy` succeeded while allocations were outstanding: the charge is
    /// those allocations', credited as they are freed.
    pub(super) destroyed: bool,
    /// Bytes its live allocations asked for (what `PoolRecords::ptrs` holds of it).
    pub(super) live: u64,
}

/// What `MemPoolCharges` holds behind its lock: the pools it tracks, the live allocations
/// from them, and the pools of host memory.
#[derive(Default)]
pub(super) struct PoolRecords {
    /// Tracked pools by handle.
    pub(super) pools: HashMap<u64, Pool>,
    /// Live pool allocations: pointer -> (pool, bytes asked for).
    pub(super) ptrs: HashMap<u64, (u64, u64)>,
    /// Pools of host memory the program made or allocated from: never charged.
    pub(super) hosts: HashSet<u64>,
}

impl PoolRecords {
    /// Records a live allocation of `bytes` from `pool` at `ptr`.
    pub(super) fn track(&mut self, ptr: u64, pool: u64, bytes: u64) {
        if let Some((old_pool, old)) = self.ptrs.insert(ptr, (pool, bytes))
            && let Some(p) = self.pools.get_mut(&old_pool)
        {
            p.live = p.live.saturating_sub(old);
        }
        if let Some(p) = self.pools.get_mut(&pool) {
            p.live = p.live.saturating_add(bytes);
        }
    }

    /// Takes the live allocation at `ptr` out: its pool and bytes, if it was one.
    pub(super) fn untrack(&mut self, ptr: u64) -> Option<(u64, u64)> {
        let (pool, bytes) = self.ptrs.remove(&ptr)?;
        if let Some(p) = self.pools.get_mut(&pool) {
            p.live = p.live.saturating_sub(bytes);
        }
        Some((pool, bytes))
    }
}

pub(super) fn pools_on(b: &PoolRecords, device: usize) -> Vec<u64> {
    b.pools
        .iter()
        .filter(|(_, p)| p.device == device && !p.destroyed)
        .map(|(&h, _)| h)
        .collect()
}

/// The growth would break the cap: the refusal, and the allocation's reservation, still
/// held.
pub(super) type Unsettled<'a> = (Refusal, Reservation<'a>);

/// Sets the pool's charge towards its reserved size `reserved`.
///
/// Invariant: the pool's charge plus the reservations of its allocations in flight
/// cover what it reserves (so the device never holds more than the ledger). Growth is
/// charged first to `r` (the reservation of the allocation just made, up to its size),
/// then left to the other allocations in flight (up to their reservations: they settle
/// it), and only the rest needs new room under the cap; without room the allocation is
/// refused. A pool that shrank is credited.
pub(super) fn settle<'a>(
    b: &mut PoolRecords,
    ledger: &Ledger,
    pool: u64,
    reserved: u64,
    r: Option<Reservation<'a>>,
) -> Result<(), Unsettled<'a>> {
    let Some(p) = b.pools.get_mut(&pool) else {
        return Ok(());
    };
    if p.destroyed {
        return Ok(());
    }
    let device = p.device;
    if reserved <= p.charged {
        ledger.settle(Charge {
            device,
            bytes: p.charged - reserved,
        });
        p.charged = reserved;
        return Ok(()); // `r`, if any, rolls back on drop
    }
    let growth = reserved - p.charged;
    let mine = r.as_ref().map_or(0, |r| r.charge().bytes);
    let take = growth.min(mine);
    let others = p.inflight.saturating_sub(mine);
    let extra = (growth - take).saturating_sub(others);
    match r {
        Some(mut r) => {
            if let Err(refusal) = ledger.resize(&mut r, take + extra) {
                return Err((refusal, r));
            }
            // Whether the pool's growth is backed at the call is the driver's business:
            // never taken off a context measured meanwhile (see `Reservation::keep_unbacked`).
            r.keep_unbacked();
        }
        // Growth no allocation through the shim reserved (one the driver served where the
        // shim did not count it): the driver took it, so it is charged, within the cap
        // where there is room, else past it, and every request is then refused until
        // memory is given back. Before, past the cap it was charged nothing (the device
        // then held more than the cap with the ledger under it), and the failed
        // reservation was counted as a refusal no program request got.
        None if extra > 0 => match ledger.try_reserve(device, extra) {
            Some(more) => more.keep_unbacked(),
            None => ledger.charge_past_cap(device, extra),
        },
        None => {}
    }
    p.charged += take + extra;
    Ok(())
}
