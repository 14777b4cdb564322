//! `VmmHandles`'s records: each charged handle with its references and mappings, the
//! mappings by start address, and the multicast bindings, with the changes that free a
//! handle (its last reference or mapping gone) and take bindings out or put them back.

use std::collections::{BTreeMap, HashMap};

use super::array_place::Place;
use crate::ledger::Charge;

/// One charged handle (or a multicast object, charged 0 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Phys {
    pub(super) charge: Charge,
    /// References not yet released (`cuMemCreate`, `cuMemRetainAllocationHandle`).
    pub(super) refs: u32,
    /// Live mappings of (part of) it, and multicast bindings of it.
    pub(super) maps: u32,
}

/// Where memory is bound to a multicast object: (object, device, offset in the object).
pub(super) type BindKey = (u64, usize, u64);

/// What a multicast binding holds: `size` bytes of a charged handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bound {
    pub(super) size: u64,
    pub(super) handle: u64,
}

/// Bindings taken out ahead of a driver call, and the handles that freed.
#[derive(Debug, Default)]
pub(super) struct Unbound {
    pub(super) binds: Vec<(BindKey, Bound)>,
    pub(super) freed: Vec<(u64, Phys)>,
}

impl Unbound {
    pub(super) fn charges(&self) -> impl Iterator<Item = Charge> + '_ {
        self.freed.iter().map(|(_, p)| p.charge)
    }
}

/// One mapping of a charged handle: `[start, start + size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mapping {
    pub(super) size: u64,
    pub(super) handle: u64,
}

/// What `VmmHandles` holds behind its lock: the handles the shim charged, their mappings
/// and their multicast bindings.
#[derive(Default)]
pub(super) struct HandleRecords {
    /// Charged handles by value.
    pub(super) handles: HashMap<u64, Phys>,
    /// Mappings of charged handles by start address.
    pub(super) maps: BTreeMap<u64, Mapping>,
    /// Multicast bindings of charged handles.
    pub(super) binds: BTreeMap<BindKey, Bound>,
    /// Charged handles mapped into arrays (`array_tiles`): by array, each mapping's place
    /// and handle.
    pub(super) tiles: HashMap<u64, Vec<(Place, u64)>>,
}

impl HandleRecords {
    /// Drops one mapping of `handle`; the charges that freed.
    pub(super) fn unpin(&mut self, handle: u64) -> Vec<Charge> {
        let Some(p) = self.handles.get_mut(&handle) else {
            return Vec::new();
        };
        p.maps = p.maps.saturating_sub(1);
        self.free_if_done(handle)
    }

    /// Drops one mapping of each of `handles` (taken out of the book ahead of a driver
    /// call): the handles that freed, and their multicast bindings taken out with them.
    pub(super) fn unpin_all(
        &mut self,
        handles: impl IntoIterator<Item = u64>,
    ) -> (Vec<(u64, Phys)>, Unbound) {
        let mut freed: Vec<(u64, Phys)> = Vec::new();
        for handle in handles {
            if let Some(p) = self.handles.get_mut(&handle) {
                p.maps = p.maps.saturating_sub(1);
                if p.refs == 0 && p.maps == 0 {
                    let p = *p;
                    self.handles.remove(&handle);
                    freed.push((handle, p));
                }
            }
        }
        let mut unbound = Unbound::default();
        for &(handle, _) in &freed {
            let u = self.unbind_object(handle);
            unbound.binds.extend(u.binds);
            unbound.freed.extend(u.freed);
        }
        (freed, unbound)
    }

    /// Drops one reference to `handle`; the charges that freed.
    pub(super) fn unref(&mut self, handle: u64) -> Vec<Charge> {
        let Some(p) = self.handles.get_mut(&handle) else {
            return Vec::new();
        };
        p.refs = p.refs.saturating_sub(1);
        self.free_if_done(handle)
    }

    pub(super) fn free_if_done(&mut self, handle: u64) -> Vec<Charge> {
        match self.handles.get(&handle) {
            Some(p) if p.refs == 0 && p.maps == 0 => {
                let p = self.handles.remove(&handle).unwrap();
                let unbound = self.unbind_object(handle);
                std::iter::once(p.charge).chain(unbound.charges()).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Takes out the bindings at `keys`: each drops its hold on what it bound.
    pub(super) fn unbind(&mut self, keys: Vec<BindKey>) -> Unbound {
        let mut out = Unbound::default();
        for key in keys {
            let Some(bound) = self.binds.remove(&key) else {
                continue;
            };
            out.binds.push((key, bound));
            if let Some(p) = self.handles.get_mut(&bound.handle) {
                p.maps = p.maps.saturating_sub(1);
                if p.refs == 0 && p.maps == 0 {
                    let p = *p;
                    self.handles.remove(&bound.handle);
                    out.freed.push((bound.handle, p));
                }
            }
        }
        out
    }

    /// The multicast object `object` is freed: its bindings go with it.
    pub(super) fn unbind_object(&mut self, object: u64) -> Unbound {
        let keys = self
            .binds
            .range((object, 0, 0)..=(object, usize::MAX, u64::MAX))
            .map(|(&k, _)| k)
            .collect();
        self.unbind(keys)
    }

    /// Puts back bindings taken out for a driver call that failed.
    pub(super) fn rebind(&mut self, unbound: Unbound) {
        for (handle, p) in unbound.freed {
            self.handles.entry(handle).or_insert(p);
        }
        for (key, bound) in unbound.binds {
            if let Some(p) = self.handles.get_mut(&bound.handle) {
                p.maps += 1;
                self.binds.insert(key, bound);
            }
        }
    }

    /// The mappings lying wholly inside `[ptr, ptr + size)`.
    pub(super) fn inside(&self, ptr: u64, size: u64) -> Vec<u64> {
        let end = ptr.saturating_add(size);
        self.maps
            .range(ptr..end)
            .filter(|(start, m)| start.checked_add(m.size).is_some_and(|e| e <= end))
            .map(|(&start, _)| start)
            .collect()
    }

    /// The mappings overlapping `[ptr, ptr + size)` at all.
    pub(super) fn overlapping(&self, ptr: u64, size: u64) -> Vec<u64> {
        let end = ptr.saturating_add(size);
        let before = self
            .maps
            .range(..ptr)
            .next_back()
            .filter(|(start, m)| start.saturating_add(m.size) > ptr)
            .map(|(&start, _)| start);
        before
            .into_iter()
            .chain(self.maps.range(ptr..end).map(|(&start, _)| start))
            .collect()
    }

    /// The mapping holding address `addr`.
    pub(super) fn mapping_at(&self, addr: u64) -> Option<Mapping> {
        let (start, m) = self.maps.range(..=addr).next_back()?;
        (addr < start.saturating_add(m.size)).then_some(*m)
    }
}
