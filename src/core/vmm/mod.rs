//! VMM physical memory (`cuMemCreate` handles): charged from its creation until the
//! driver really frees it. The driver frees a handle's memory when both its last
//! reference is released (the one `cuMemCreate` gave, and one more per
//! `cuMemRetainAllocationHandle`) and its last mapping is unmapped (`cuMemUnmap`, or
//! `cuMemAddressFree` of the range holding it). NVIDIA's documented idiom releases the
//! handle right after mapping it, so a release alone credits nothing while a mapping
//! lives, and the last unmap of a released handle credits it.
//!
//! The book knows only the handles the shim charged: an imported handle (the exporter
//! pays) or host memory is never in it, and calls on those change nothing. Mappings are
//! kept by address range, since one `cuMemUnmap` may cover several of them.
//!
//! Every change is made before the driver call, as a [`Pending`] step: [`VmmHandles::done`]
//! once the driver succeeded, [`VmmHandles::undo`] if it failed. Both return the charges
//! the driver has now freed, for the caller to credit. References and mappings are
//! added before the call, so a concurrent release can never see a handle as free while
//! the driver is still mapping it; they are taken away before the call too, so the
//! driver cannot hand the same handle value to a new allocation while the old one is
//! still in the book. Plain safe Rust.
//!
//! Multicast objects (`cuMulticastCreate`) are handles too, charged nothing: NVIDIA
//! documents an object's size as what can be bound to it per device, and a new object as
//! having no physical memory. Memory bound to one (`cuMulticastBindMem`, or
//! `cuMulticastBindAddr` by the address a handle is mapped at) is held by the binding as
//! by a mapping: a bound handle released and unmapped stays charged until it is unbound
//! (`cuMulticastUnbind`) or the object is freed (its last release and unmap), whose
//! bindings go with it.
//!
//! Memory mapped into sparse and deferred-mapping arrays (`cuMemMapArrayAsync`) is held by
//! the array as by a mapping (`array_tiles`).

mod array_place;
mod array_tiles;
mod records;

use std::sync::Mutex;

use crate::ledger::Charge;
pub use array_place::Place;
use array_tiles::Tile;
use records::{BindKey, Bound, HandleRecords, Mapping, Phys, Unbound};

/// The charges that are bytes (a multicast object's own is none).
fn bytes_only(charges: impl IntoIterator<Item = Charge>) -> Vec<Charge> {
    charges.into_iter().filter(|c| c.bytes > 0).collect()
}

/// A change made ahead of a driver call.
#[must_use = "finish a pending step with VmmHandles::done or VmmHandles::undo"]
#[derive(Debug)]
pub struct Pending(Step);

impl Pending {
    /// The charges the driver frees if its call succeeds: a release's or an unmap's
    /// handles that nothing else holds (what [`VmmHandles::done`] then gives back), known
    /// before the call so that a pool can be told first.
    pub fn frees(&self) -> Vec<Charge> {
        bytes_only(match &self.0 {
            Step::Release { freed, unbound, .. } => freed
                .iter()
                .map(|p| p.charge)
                .chain(unbound.charges())
                .collect(),
            Step::Unmap { freed, unbound, .. } => freed
                .iter()
                .map(|(_, p)| p.charge)
                .chain(unbound.charges())
                .collect(),
            Step::Unbind(unbound) => unbound.charges().collect(),
            Step::Map { .. } | Step::Retain { .. } | Step::Bind { .. } | Step::MapTile(_) => {
                Vec::new()
            }
        })
    }
}

#[derive(Debug)]
enum Step {
    /// `cuMemRelease`: one reference dropped; the handle itself if that freed it, and
    /// its multicast bindings then.
    Release {
        handle: u64,
        freed: Option<Phys>,
        unbound: Unbound,
    },
    /// `cuMemMap`: the handle pinned by one more mapping, recorded at `ptr` once made.
    Map { ptr: u64, size: u64, handle: u64 },
    /// `cuMemUnmap`/`cuMemAddressFree` (the mappings taken out), a `cuMemMapArrayAsync`
    /// unmapping or an array's end (the arrays' mappings taken out), and the handles that
    /// freed.
    Unmap {
        maps: Vec<(u64, Mapping)>,
        tiles: Vec<Tile>,
        freed: Vec<(u64, Phys)>,
        unbound: Unbound,
    },
    /// `cuMemRetainAllocationHandle`: one more reference to the handle mapped there.
    Retain { handle: u64 },
    /// `cuMulticastBindMem`/`BindAddr`: the handle pinned, recorded at `key` once bound.
    Bind { key: BindKey, bound: Bound },
    /// `cuMulticastUnbind`: the bindings taken out, and the handles that freed.
    Unbind(Unbound),
    /// A `cuMemMapArrayAsync` mapping: the handle pinned, recorded once mapped.
    MapTile(Tile),
}

/// Every charged VMM handle, with its references and mappings.
pub struct VmmHandles {
    records: Mutex<Option<HandleRecords>>,
}

impl Default for VmmHandles {
    fn default() -> Self {
        Self::new()
    }
}

impl VmmHandles {
    pub const fn new() -> Self {
        VmmHandles {
            records: Mutex::new(None),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HandleRecords) -> T) -> T {
        // A poisoned lock only means a panic elsewhere while it was held; every
        // operation leaves the book consistent before it can panic.
        let mut g = self.records.lock().unwrap_or_else(|p| p.into_inner());
        f(g.get_or_insert_with(HandleRecords::default))
    }

    /// `cuMemCreate` made `handle`, charged `charge`: one reference, no mapping. Returns
    /// the charge of a handle of the same value still in the book, which the driver
    /// can only have reused because it freed that one: to be credited.
    pub fn created(&self, handle: u64, charge: Charge) -> Option<Charge> {
        self.with(|b| {
            let stale = b.handles.insert(
                handle,
                Phys {
                    charge,
                    refs: 1,
                    maps: 0,
                },
            );
            if stale.is_some() {
                b.maps.retain(|_, m| m.handle != handle);
                for list in b.tiles.values_mut() {
                    list.retain(|&(_, h)| h != handle);
                }
            }
            stale.map(|p| p.charge)
        })
    }

    /// Before `cuMemRelease(handle)`; None for a handle the shim did not charge (or
    /// with no reference left: the driver's error).
    pub fn release(&self, handle: u64) -> Option<Pending> {
        self.with(|b| {
            let p = b.handles.get_mut(&handle).filter(|p| p.refs > 0)?;
            p.refs -= 1;
            let freed = if p.refs == 0 && p.maps == 0 {
                b.handles.remove(&handle)
            } else {
                None
            };
            let unbound = if freed.is_some() {
                b.unbind_object(handle)
            } else {
                Unbound::default()
            };
            Some(Pending(Step::Release {
                handle,
                freed,
                unbound,
            }))
        })
    }

    /// Before `cuMemMap(ptr, size, offset, handle)`; None for a handle not charged.
    pub fn map(&self, ptr: u64, size: u64, handle: u64) -> Option<Pending> {
        self.with(|b| {
            b.handles.get_mut(&handle)?.maps += 1;
            Some(Pending(Step::Map { ptr, size, handle }))
        })
    }

    /// Before `cuMemUnmap(ptr, size)` or `cuMemAddressFree(ptr, size)`: takes out the
    /// charged mappings inside the range; None if there are none.
    pub fn unmap(&self, ptr: u64, size: u64) -> Option<Pending> {
        self.with(|b| {
            let starts = b.inside(ptr, size);
            if starts.is_empty() {
                return None;
            }
            let maps: Vec<(u64, Mapping)> = starts
                .into_iter()
                .filter_map(|start| Some((start, b.maps.remove(&start)?)))
                .collect();
            let (freed, unbound) = b.unpin_all(maps.iter().map(|(_, m)| m.handle));
            Some(Pending(Step::Unmap {
                maps,
                tiles: Vec::new(),
                freed,
                unbound,
            }))
        })
    }

    /// Before `cuMemRetainAllocationHandle(&h, addr)`: one more reference to the charged
    /// handle mapped at `addr`; None if no charged handle is mapped there.
    pub fn retain(&self, addr: u64) -> Option<Pending> {
        self.with(|b| {
            let handle = b.mapping_at(addr)?.handle;
            b.handles.get_mut(&handle)?.refs += 1;
            Some(Pending(Step::Retain { handle }))
        })
    }

    /// After `cuMemRetainAllocationHandle` succeeded and returned `handle`, with what
    /// [`retain`](Self::retain) set up: normally the same handle; otherwise the guess is
    /// undone and the handle returned gets the reference, if it is charged.
    pub fn retained(&self, pending: Option<Pending>, handle: u64) -> Vec<Charge> {
        if let Some(Pending(Step::Retain { handle: guessed })) = &pending
            && *guessed == handle
        {
            return Vec::new();
        }
        let credit = pending.map(|p| self.undo(p)).unwrap_or_default();
        self.with(|b| {
            if let Some(p) = b.handles.get_mut(&handle) {
                p.refs += 1;
            }
        });
        credit
    }

    /// `cuMulticastCreate` made `object` (or `cuMulticastAddDevice` was given one this
    /// process imported): a handle charged nothing, whose last release and unmap free its
    /// bindings.
    pub fn multicast(&self, object: u64) {
        self.with(|b| {
            b.handles.entry(object).or_insert(Phys {
                charge: Charge {
                    device: 0,
                    bytes: 0,
                },
                refs: 1,
                maps: 0,
            });
        })
    }

    /// Before `cuMulticastBindMem(object, offset, handle, ..., size)` (`device`: the
    /// `_v2`'s; None: the memory's own): the charged handle held by the binding; None for
    /// memory the shim did not charge.
    pub fn bind(
        &self,
        object: u64,
        device: Option<usize>,
        offset: u64,
        handle: u64,
        size: u64,
    ) -> Option<Pending> {
        self.with(|b| {
            let p = b.handles.get_mut(&handle).filter(|p| p.charge.bytes > 0)?;
            p.maps += 1;
            let key = (object, device.unwrap_or(p.charge.device), offset);
            Some(Pending(Step::Bind {
                key,
                bound: Bound { size, handle },
            }))
        })
    }

    /// Before `cuMulticastBindAddr(object, offset, ptr, size)`: as [`bind`](Self::bind)
    /// for the charged handle mapped at `ptr`.
    pub fn bind_addr(
        &self,
        object: u64,
        device: Option<usize>,
        offset: u64,
        ptr: u64,
        size: u64,
    ) -> Option<Pending> {
        let handle = self.with(|b| b.mapping_at(ptr).map(|m| m.handle))?;
        self.bind(object, device, offset, handle, size)
    }

    /// Before `cuMulticastUnbind(object, device, offset, size)`: takes out the bindings
    /// of charged handles inside the range; None if there are none.
    pub fn unbind(&self, object: u64, device: usize, offset: u64, size: u64) -> Option<Pending> {
        self.with(|b| {
            let end = offset.saturating_add(size);
            let keys: Vec<_> = b
                .binds
                .range((object, device, offset)..(object, device, end))
                .filter(|((_, _, at), bound)| at.saturating_add(bound.size) <= end)
                .map(|(&k, _)| k)
                .collect();
            (!keys.is_empty()).then(|| Pending(Step::Unbind(b.unbind(keys))))
        })
    }

    /// The driver call succeeded: the charges it freed, to credit.
    pub fn done(&self, pending: Pending) -> Vec<Charge> {
        let credit = self.with(|b| match pending.0 {
            Step::Release { freed, unbound, .. } => freed
                .map(|p| p.charge)
                .into_iter()
                .chain(unbound.charges())
                .collect(),
            Step::Map { ptr, size, handle } => {
                // The driver mapped the range, so nothing the book still has there is
                // mapped any more (it went some way the shim did not see).
                let mut credit = Vec::new();
                for start in b.overlapping(ptr, size) {
                    if let Some(stale) = b.maps.remove(&start) {
                        credit.extend(b.unpin(stale.handle));
                    }
                }
                if b.handles.contains_key(&handle) {
                    b.maps.insert(ptr, Mapping { size, handle });
                }
                credit
            }
            Step::Unmap { freed, unbound, .. } => freed
                .into_iter()
                .map(|(_, p)| p.charge)
                .chain(unbound.charges())
                .collect(),
            Step::Retain { .. } => Vec::new(),
            Step::Bind { key, bound } => {
                // The driver bound it there, so nothing the book still has there is
                // bound any more.
                let mut credit = Vec::new();
                if let Some(stale) = b.binds.remove(&key) {
                    credit.extend(b.unpin(stale.handle));
                }
                if b.handles.contains_key(&bound.handle) {
                    b.binds.insert(key, bound);
                }
                credit
            }
            Step::Unbind(unbound) => unbound.charges().collect(),
            Step::MapTile((array, place, handle)) => {
                // The driver mapped it there, so nothing the book still has there is
                // mapped any more.
                let mut credit = Vec::new();
                let list = b.tiles.entry(array).or_default();
                let (stale, keep): (Vec<_>, Vec<_>) =
                    list.drain(..).partition(|(p, _)| p.overlaps(&place));
                *list = keep;
                if b.handles.contains_key(&handle) {
                    list.push((place, handle));
                }
                if list.is_empty() {
                    b.tiles.remove(&array);
                }
                for (_, h) in stale {
                    credit.extend(b.unpin(h));
                }
                credit
            }
        });
        bytes_only(credit)
    }

    /// The driver call failed: the step is taken back; the charges freed meanwhile
    /// (a reference or mapping added for the call was the last thing holding them).
    pub fn undo(&self, pending: Pending) -> Vec<Charge> {
        let credit = self.with(|b| match pending.0 {
            Step::Release {
                handle,
                freed,
                unbound,
            } => {
                b.rebind(unbound);
                match freed {
                    Some(p) => {
                        b.handles.insert(handle, Phys { refs: 1, ..p });
                    }
                    None => {
                        if let Some(p) = b.handles.get_mut(&handle) {
                            p.refs += 1;
                        }
                    }
                }
                Vec::new()
            }
            Step::Map { handle, .. } => b.unpin(handle),
            Step::Unmap {
                maps,
                tiles,
                freed,
                unbound,
            } => {
                for (handle, p) in freed {
                    b.handles.entry(handle).or_insert(p);
                }
                for (start, m) in maps {
                    if let Some(p) = b.handles.get_mut(&m.handle) {
                        p.maps += 1;
                        b.maps.insert(start, m);
                    }
                }
                for (array, place, handle) in tiles {
                    if let Some(p) = b.handles.get_mut(&handle) {
                        p.maps += 1;
                        b.tiles.entry(array).or_default().push((place, handle));
                    }
                }
                b.rebind(unbound);
                Vec::new()
            }
            Step::Retain { handle } => b.unref(handle),
            Step::Bind { bound, .. } => b.unpin(bound.handle),
            Step::Unbind(unbound) => {
                b.rebind(unbound);
                Vec::new()
            }
            Step::MapTile((_, _, handle)) => b.unpin(handle),
        });
        bytes_only(credit)
    }

    /// Bytes charged to live handles on `device`.
    #[cfg(test)]
    fn charged_on(&self, device: usize) -> u64 {
        self.with(|b| {
            b.handles
                .values()
                .filter(|p| p.charge.device == device)
                .map(|p| p.charge.bytes)
                .sum()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn charge(bytes: u64) -> Charge {
        Charge { device: 0, bytes }
    }

    /// The driver succeeded. What the step frees is known before the call (announced to a
    /// pool then): `done` gives back exactly that, but for a map's stale mappings.
    fn ok(book: &VmmHandles, p: Option<Pending>) -> Vec<Charge> {
        let p = p.expect("a pending step");
        let (said, is_map) = (p.frees(), matches!(p.0, Step::Map { .. }));
        let freed = book.done(p);
        if !is_map {
            assert_eq!(freed, said, "what the step said it frees");
        }
        freed
    }

    fn bytes(credit: &[Charge]) -> u64 {
        credit.iter().map(|c| c.bytes).sum()
    }

    #[test]
    fn the_documented_idiom_keeps_the_charge_until_the_unmap() {
        let book = VmmHandles::new();
        assert_eq!(book.created(1, charge(512 * MIB)), None);
        assert!(ok(&book, book.map(0x1000_0000, 512 * MIB, 1)).is_empty());
        // Released at once: the mapping keeps the memory.
        assert!(ok(&book, book.release(1)).is_empty());
        assert_eq!(book.charged_on(0), 512 * MIB);
        // The last unmap frees it.
        let credit = ok(&book, book.unmap(0x1000_0000, 512 * MIB));
        assert_eq!(credit, vec![charge(512 * MIB)]);
        assert_eq!(book.charged_on(0), 0);
        // Nothing is left to release or unmap.
        assert!(book.release(1).is_none());
        assert!(book.unmap(0x1000_0000, 512 * MIB).is_none());
    }

    #[test]
    fn release_without_a_mapping_credits_at_once() {
        let book = VmmHandles::new();
        book.created(7, charge(64 * MIB));
        assert_eq!(ok(&book, book.release(7)), vec![charge(64 * MIB)]);
        assert!(
            book.release(7).is_none(),
            "a double release is the driver's error"
        );
    }

    #[test]
    fn a_handle_mapped_twice_is_freed_by_its_last_unmap() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        assert!(ok(&book, book.map(0x9000, 100, 1)).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        assert!(ok(&book, book.unmap(0x1000, 100)).is_empty());
        assert_eq!(book.charged_on(0), 100);
        assert_eq!(ok(&book, book.unmap(0x9000, 100)), vec![charge(100)]);
    }

    #[test]
    fn a_retained_reference_holds_the_memory() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        // Retained from an address inside the mapping: the same handle comes back.
        let p = book.retain(0x1000 + 50);
        assert!(book.retained(p, 1).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        assert!(ok(&book, book.unmap(0x1000, 100)).is_empty());
        assert_eq!(book.charged_on(0), 100, "the retained reference is left");
        assert_eq!(ok(&book, book.release(1)), vec![charge(100)]);
        assert!(
            book.retain(0x1000).is_none(),
            "nothing mapped there any more"
        );
    }

    #[test]
    fn a_retain_that_returns_another_handle_moves_the_reference() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        book.created(2, charge(10));
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        let p = book.retain(0x1000);
        assert!(book.retained(p, 2).is_empty());
        // Handle 1 has its own reference and mapping; handle 2 two references.
        assert_eq!(ok(&book, book.release(1)), vec![]);
        assert_eq!(ok(&book, book.unmap(0x1000, 100)), vec![charge(100)]);
        assert!(ok(&book, book.release(2)).is_empty());
        assert_eq!(ok(&book, book.release(2)), vec![charge(10)]);
        // A retain on an address the book does not know, of a handle it knows.
        book.created(3, charge(5));
        assert!(book.retain(0x5000).is_none());
        assert!(book.retained(None, 3).is_empty());
        assert!(ok(&book, book.release(3)).is_empty());
        assert_eq!(ok(&book, book.release(3)), vec![charge(5)]);
    }

    #[test]
    fn one_unmap_over_several_mappings_credits_each_freed_handle() {
        let book = VmmHandles::new();
        for h in 1..=3 {
            book.created(h, charge(100));
            assert!(ok(&book, book.map(0x1000 + (h - 1) * 100, 100, h)).is_empty());
        }
        // Handle 3 keeps its reference.
        assert!(ok(&book, book.release(1)).is_empty());
        assert!(ok(&book, book.release(2)).is_empty());
        let credit = ok(&book, book.unmap(0x1000, 300));
        assert_eq!(bytes(&credit), 200);
        assert_eq!(book.charged_on(0), 100);
        // A range with no mapping wholly inside it takes nothing.
        book.created(4, charge(100));
        assert!(ok(&book, book.map(0x8000, 100, 4)).is_empty());
        assert!(book.unmap(0x8000, 50).is_none());
        assert!(book.unmap(0x7000, 0x1000).is_none());
    }

    #[test]
    fn an_unmap_the_driver_refuses_changes_nothing() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        book.created(2, charge(100));
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        assert!(ok(&book, book.map(0x1064, 100, 2)).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        assert!(ok(&book, book.release(2)).is_empty());
        let p = book.unmap(0x1000, 200).unwrap();
        assert_eq!(book.charged_on(0), 0, "taken out while the driver is asked");
        assert!(book.undo(p).is_empty());
        assert_eq!(book.charged_on(0), 200, "both are back");
        assert_eq!(bytes(&ok(&book, book.unmap(0x1000, 200))), 200);
    }

    #[test]
    fn failed_calls_are_taken_back() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        // A failed release: the reference is back.
        let p = book.release(1).unwrap();
        assert_eq!(book.charged_on(0), 0);
        assert!(book.undo(p).is_empty());
        assert_eq!(book.charged_on(0), 100);
        // A failed map pins nothing and records nothing.
        let p = book.map(0x1000, 100, 1).unwrap();
        assert!(book.undo(p).is_empty());
        assert!(book.unmap(0x1000, 100).is_none());
        // A failed retain adds no reference.
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        let p = book.retain(0x1000).unwrap();
        assert!(book.undo(p).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        assert_eq!(ok(&book, book.unmap(0x1000, 100)), vec![charge(100)]);
    }

    #[test]
    fn a_step_that_was_the_last_hold_credits_when_undone() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        // A map in flight pins the handle: a concurrent release does not free it...
        let m = book.map(0x1000, 100, 1).unwrap();
        assert!(ok(&book, book.release(1)).is_empty());
        assert_eq!(book.charged_on(0), 100);
        // ...and when the map fails, the memory is gone.
        assert_eq!(book.undo(m), vec![charge(100)]);
        // Same for a retain in flight and a concurrent unmap.
        book.created(2, charge(50));
        assert!(ok(&book, book.map(0x2000, 50, 2)).is_empty());
        assert!(ok(&book, book.release(2)).is_empty());
        let r = book.retain(0x2000).unwrap();
        assert!(ok(&book, book.unmap(0x2000, 50)).is_empty());
        assert_eq!(book.undo(r), vec![charge(50)]);
        assert_eq!(book.charged_on(0), 0);
    }

    #[test]
    fn handles_the_shim_did_not_charge_are_left_alone() {
        let book = VmmHandles::new();
        // An imported handle: mapping, retaining, releasing it changes nothing.
        assert!(book.map(0x1000, 100, 99).is_none());
        assert!(book.release(99).is_none());
        assert!(book.retain(0x1000).is_none());
        assert!(book.retained(None, 99).is_empty());
        assert!(book.unmap(0x1000, 100).is_none());
        assert_eq!(book.charged_on(0), 0);
    }

    #[test]
    fn a_mapping_the_driver_dropped_unseen_is_replaced() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        book.created(2, charge(100));
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        // The driver maps handle 2 over the range: handle 1's mapping is gone.
        assert_eq!(ok(&book, book.map(0x1000 + 50, 100, 2)), vec![charge(100)]);
        assert!(ok(&book, book.release(2)).is_empty());
        assert_eq!(ok(&book, book.unmap(0x1000 + 50, 100)), vec![charge(100)]);
    }

    #[test]
    fn a_reused_handle_value_credits_the_old_one() {
        let book = VmmHandles::new();
        book.created(1, charge(100));
        assert!(ok(&book, book.map(0x1000, 100, 1)).is_empty());
        assert_eq!(book.created(1, charge(30)), Some(charge(100)));
        assert_eq!(book.charged_on(0), 30);
        assert!(
            book.unmap(0x1000, 100).is_none(),
            "the old mapping went too"
        );
        assert_eq!(ok(&book, book.release(1)), vec![charge(30)]);
    }

    #[test]
    fn devices_are_kept_apart() {
        let book = VmmHandles::new();
        book.created(
            1,
            Charge {
                device: 1,
                bytes: 100,
            },
        );
        book.created(2, charge(10));
        assert_eq!((book.charged_on(0), book.charged_on(1)), (10, 100));
        assert_eq!(
            ok(&book, book.release(1)),
            vec![Charge {
                device: 1,
                bytes: 100
            }]
        );
    }

    const MC: u64 = 0x77;

    #[test]
    fn a_multicast_object_is_charged_nothing_and_a_bind_nothing_more() {
        let book = VmmHandles::new();
        book.multicast(MC);
        assert_eq!(book.charged_on(0), 0);
        book.created(1, charge(64 * MIB));
        assert!(ok(&book, book.bind(MC, None, 0, 1, 64 * MIB)).is_empty());
        assert_eq!(book.charged_on(0), 64 * MIB, "charged once, at cuMemCreate");
        assert!(ok(&book, book.map(0x4000_0000, 64 * MIB, MC)).is_empty());
        assert!(ok(&book, book.unmap(0x4000_0000, 64 * MIB)).is_empty());
        assert!(ok(&book, book.unbind(MC, 0, 0, 64 * MIB)).is_empty());
        assert_eq!(ok(&book, book.release(1)), vec![charge(64 * MIB)]);
        assert!(
            ok(&book, book.release(MC)).is_empty(),
            "the object frees no bytes"
        );
        assert_eq!(book.charged_on(0), 0);
    }

    #[test]
    fn a_bound_handle_released_and_unmapped_stays_charged_until_unbound() {
        let book = VmmHandles::new();
        book.multicast(MC);
        book.created(1, charge(64 * MIB));
        assert!(ok(&book, book.map(0x1000_0000, 64 * MIB, 1)).is_empty());
        // Bound by the address it is mapped at, on device 0.
        assert!(ok(&book, book.bind_addr(MC, Some(0), 0, 0x1000_0000, 64 * MIB)).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        assert!(ok(&book, book.unmap(0x1000_0000, 64 * MIB)).is_empty());
        assert_eq!(book.charged_on(0), 64 * MIB, "the binding holds it");
        assert!(
            book.unbind(MC, 1, 0, 64 * MIB).is_none(),
            "another device's"
        );
        assert!(
            book.unbind(MC, 0, 64 * MIB, 64 * MIB).is_none(),
            "another range"
        );
        assert_eq!(
            ok(&book, book.unbind(MC, 0, 0, 64 * MIB)),
            vec![charge(64 * MIB)]
        );
        assert!(
            book.unbind(MC, 0, 0, 64 * MIB).is_none(),
            "nothing left bound"
        );
    }

    #[test]
    fn an_objects_last_release_and_unmap_free_what_it_still_binds() {
        let book = VmmHandles::new();
        book.multicast(MC);
        book.created(1, charge(10));
        book.created(2, charge(20));
        assert!(ok(&book, book.bind(MC, None, 0, 1, 10)).is_empty());
        assert!(ok(&book, book.bind(MC, None, 10, 2, 20)).is_empty());
        assert!(ok(&book, book.release(1)).is_empty());
        // The object mapped, then released: its mapping keeps it and its bindings.
        assert!(ok(&book, book.map(0x8000, 30, MC)).is_empty());
        assert!(ok(&book, book.release(MC)).is_empty());
        assert_eq!(book.charged_on(0), 30);
        // Its last unmap frees it, and handle 1, held by its binding only.
        assert_eq!(ok(&book, book.unmap(0x8000, 30)), vec![charge(10)]);
        assert_eq!(book.charged_on(0), 20);
        assert!(book.unbind(MC, 0, 10, 20).is_none(), "the bindings went");
        assert_eq!(ok(&book, book.release(2)), vec![charge(20)]);
    }

    #[test]
    fn a_failed_bind_or_unbind_changes_nothing() {
        let book = VmmHandles::new();
        book.multicast(MC);
        book.created(1, charge(10));
        let p = book.bind(MC, None, 0, 1, 10).unwrap();
        assert!(book.undo(p).is_empty());
        assert_eq!(ok(&book, book.release(1)), vec![charge(10)], "not held");
        book.created(2, charge(20));
        assert!(ok(&book, book.bind(MC, None, 0, 2, 20)).is_empty());
        assert!(ok(&book, book.release(2)).is_empty());
        let p = book.unbind(MC, 0, 0, 20).unwrap();
        assert_eq!(p.frees(), vec![charge(20)]);
        assert!(book.undo(p).is_empty());
        assert_eq!(book.charged_on(0), 20, "still bound");
        // A release of the object that the driver refused keeps its bindings too.
        let p = book.release(MC).unwrap();
        assert_eq!(p.frees(), vec![charge(20)]);
        assert!(book.undo(p).is_empty());
        assert_eq!(ok(&book, book.release(MC)), vec![charge(20)]);
    }

    #[test]
    fn memory_the_shim_did_not_charge_is_not_bound() {
        let book = VmmHandles::new();
        book.multicast(MC);
        assert!(
            book.bind(MC, None, 0, 5, 10).is_none(),
            "an imported handle"
        );
        assert!(
            book.bind(MC, None, 0, MC, 10).is_none(),
            "the object itself"
        );
        assert!(
            book.bind_addr(MC, None, 0, 0x1000, 10).is_none(),
            "nothing mapped"
        );
    }
}
