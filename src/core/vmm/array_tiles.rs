//! `cuMemCreate` memory mapped into sparse and deferred-mapping arrays
//! (`cuMemMapArrayAsync`, CUDA 11.1): a mapping holds its handle as a `cuMemMap` mapping
//! does, so a handle released while an array maps it stays charged until the mapping goes:
//! an unmapping of a region that covers it, a mapping over it, or the array's end
//! (`cuArrayDestroy`, `cuMipmappedArrayDestroy`). Mappings are kept by array, with the
//! place each covers: a region of a sparse level, or a range of a layer's mip tail.

use super::array_place::Place;
use super::{Pending, Step, VmmHandles};

/// A charged handle mapped into an array: (array, place, handle).
pub(super) type Tile = (u64, Place, u64);

impl VmmHandles {
    /// Before a `cuMemMapArrayAsync` step mapping `handle` at `place` of `array`: the
    /// handle pinned by one more mapping, recorded once made; None for a handle not
    /// charged.
    pub fn map_array(&self, array: u64, place: Place, handle: u64) -> Option<Pending> {
        self.with(|b| {
            b.handles.get_mut(&handle)?.maps += 1;
            Some(Pending(Step::MapTile((array, place, handle))))
        })
    }

    /// Before a `cuMemMapArrayAsync` step unmapping `place` of `array`: takes out the
    /// charged mappings there; None if there are none.
    pub fn unmap_array(&self, array: u64, place: Place) -> Option<Pending> {
        self.unmap_tiles(array, |p| p.overlaps(&place))
    }

    /// Before `cuArrayDestroy` or `cuMipmappedArrayDestroy` of `array`: what is mapped into
    /// it is unmapped with it; None if nothing charged is.
    pub fn array_gone(&self, array: u64) -> Option<Pending> {
        self.unmap_tiles(array, |_| true)
    }

    /// Takes out the mappings of `array` at the places `at` picks, and the handles that
    /// freed (with their multicast bindings).
    fn unmap_tiles(&self, array: u64, at: impl Fn(&Place) -> bool) -> Option<Pending> {
        self.with(|b| {
            let list = b.tiles.get_mut(&array)?;
            let (gone, keep): (Vec<_>, Vec<_>) = list.drain(..).partition(|(p, _)| at(p));
            *list = keep;
            if list.is_empty() {
                b.tiles.remove(&array);
            }
            if gone.is_empty() {
                return None;
            }
            let (freed, unbound) = b.unpin_all(gone.iter().map(|&(_, h)| h));
            let tiles = gone.into_iter().map(|(p, h)| (array, p, h)).collect();
            Some(Pending(Step::Unmap {
                maps: Vec::new(),
                tiles,
                freed,
                unbound,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::array_place::{level, tail};
    use super::*;
    use crate::ledger::Charge;

    const MIB: u64 = 1 << 20;

    fn vmm_with(handle: u64, bytes: u64) -> VmmHandles {
        let v = VmmHandles::new();
        assert_eq!(v.created(handle, Charge { device: 0, bytes }), None);
        v
    }

    #[test]
    fn a_handle_released_while_an_array_maps_it_stays_charged_until_the_unmapping() {
        let v = vmm_with(7, 64 * MIB);
        let p = v
            .map_array(100, level(0, [0, 0, 0], [64, 64, 1]), 7)
            .unwrap();
        assert!(v.done(p).is_empty());
        let r = v.release(7).unwrap();
        assert!(r.frees().is_empty(), "the array still maps it");
        assert!(v.done(r).is_empty());
        assert_eq!(v.charged_on(0), 64 * MIB);
        assert!(
            v.unmap_array(100, level(1, [0, 0, 0], [64, 64, 1]))
                .is_none(),
            "another level: nothing mapped there"
        );
        let u = v
            .unmap_array(100, level(0, [0, 0, 0], [128, 128, 1]))
            .unwrap();
        assert_eq!(
            u.frees(),
            vec![Charge {
                device: 0,
                bytes: 64 * MIB
            }]
        );
        assert_eq!(
            v.done(u),
            vec![Charge {
                device: 0,
                bytes: 64 * MIB
            }]
        );
        assert_eq!(v.charged_on(0), 0);
    }

    #[test]
    fn an_unmapping_the_driver_refuses_puts_the_mappings_back() {
        let v = vmm_with(7, 64 * MIB);
        let at = tail(0, 0, 2 * MIB);
        let p = v.map_array(100, at, 7).unwrap();
        assert!(v.done(p).is_empty());
        assert!(v.done(v.release(7).unwrap()).is_empty());
        let u = v.unmap_array(100, at).unwrap();
        assert!(v.undo(u).is_empty());
        assert_eq!(v.charged_on(0), 64 * MIB, "still mapped");
        let gone = v.array_gone(100).unwrap();
        assert_eq!(
            v.done(gone),
            vec![Charge {
                device: 0,
                bytes: 64 * MIB
            }]
        );
        assert!(v.array_gone(100).is_none(), "nothing mapped any more");
    }

    #[test]
    fn a_mapping_the_driver_refuses_unpins_and_a_mapping_over_another_replaces_it() {
        let v = vmm_with(7, 64 * MIB);
        assert_eq!(
            v.created(
                8,
                Charge {
                    device: 0,
                    bytes: 32 * MIB
                }
            ),
            None
        );
        let at = level(0, [0, 0, 0], [64, 64, 1]);
        let p = v.map_array(100, at, 7).unwrap();
        assert!(v.undo(p).is_empty(), "still referenced");
        assert!(v.done(v.map_array(100, at, 7).unwrap()).is_empty());
        assert!(v.done(v.release(7).unwrap()).is_empty());
        // Mapped over: the driver replaced the first handle's mapping there.
        let over = v.map_array(100, at, 8).unwrap();
        assert_eq!(
            v.done(over),
            vec![Charge {
                device: 0,
                bytes: 64 * MIB
            }]
        );
        assert_eq!(v.charged_on(0), 32 * MIB);
        assert!(v.map_array(100, at, 99).is_none(), "a handle not charged");
        assert!(v.done(v.release(8).unwrap()).is_empty(), "mapped");
        assert_eq!(
            v.done(v.array_gone(100).unwrap()),
            vec![Charge {
                device: 0,
                bytes: 32 * MIB
            }]
        );
    }
}
