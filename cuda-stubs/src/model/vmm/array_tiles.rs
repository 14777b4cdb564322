//! Memory mapped into sparse and deferred-mapping arrays (`cuMemMapArrayAsync`): each
//! mapping holds its handle as a `cuMemMap` mapping does, so a handle released while an
//! array maps it keeps its memory until the mapping goes: an unmapping of a region that
//! covers it, a mapping over it, or the array's end.

use super::{Vmm, vmm};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CuResult};

/// Where memory is mapped into an array or mipmapped array: a region of a sparse level
/// (level, layer, offset and extent in elements) or a range of a layer's mip tail (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Level {
        level: u32,
        layer: u32,
        offset: [u32; 3],
        extent: [u32; 3],
    },
    MipTail {
        layer: u32,
        offset: u64,
        size: u64,
    },
}

/// Whether `[a, a + n)` and `[b, b + m)` share an element.
fn spans_meet(a: u64, n: u64, b: u64, m: u64) -> bool {
    n > 0 && m > 0 && a < b.saturating_add(m) && b < a.saturating_add(n)
}

impl Place {
    /// Whether the two places share memory of their array.
    fn overlaps(&self, other: &Place) -> bool {
        match (*self, *other) {
            (
                Place::Level {
                    level,
                    layer,
                    offset,
                    extent,
                },
                Place::Level {
                    level: l2,
                    layer: y2,
                    offset: o2,
                    extent: e2,
                },
            ) => {
                level == l2
                    && layer == y2
                    && (0..3).all(|i| {
                        spans_meet(
                            offset[i].into(),
                            extent[i].into(),
                            o2[i].into(),
                            e2[i].into(),
                        )
                    })
            }
            (
                Place::MipTail {
                    layer,
                    offset,
                    size,
                },
                Place::MipTail {
                    layer: y2,
                    offset: o2,
                    size: s2,
                },
            ) => layer == y2 && spans_meet(offset, size, o2, s2),
            _ => false,
        }
    }
}

/// One step of `cuMemMapArrayAsync`: map `handle` at `place` of `array`, or unmap there.
#[derive(Debug, Clone, Copy)]
pub struct TileOp {
    pub array: usize,
    pub place: Place,
    /// Some(handle): a mapping; None: an unmapping.
    pub map: Option<u64>,
}

/// A handle mapped into an array.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tile {
    array: usize,
    place: Place,
    handle: u64,
}

/// Applies the steps of one `cuMemMapArrayAsync`, in order, after checking that every
/// handle to map is device memory (`CUDA_ERROR_INVALID_VALUE` otherwise, nothing done).
/// What a region held before goes at a step on it (mapped over or unmapped).
pub fn map_array(ops: &[TileOp]) -> CuResult {
    let mut v = vmm();
    let mappable = |h: &u64| v.phys.get(h).is_some_and(|p| p.bindable());
    if !ops.iter().filter_map(|o| o.map.as_ref()).all(mappable) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for op in ops {
        v.unmap_tiles(|t| t.array == op.array && t.place.overlaps(&op.place));
        if let Some(handle) = op.map
            && let Some(p) = v.phys.get_mut(&handle)
        {
            p.mappings += 1;
            v.array_tiles.push(Tile {
                array: op.array,
                place: op.place,
                handle,
            });
        }
    }
    Ok(())
}

/// The array (or mipmapped array) `array` ended: what is mapped into it is unmapped.
pub fn drop_array_tiles(array: usize) {
    vmm().unmap_tiles(|t| t.array == array);
}

impl Vmm {
    /// Unmaps the tiles `gone` picks; a released handle that nothing maps any more is freed.
    fn unmap_tiles(&mut self, gone: impl Fn(&Tile) -> bool) {
        let (out, keep): (Vec<Tile>, Vec<Tile>) = self.array_tiles.iter().partition(|t| gone(t));
        if out.is_empty() {
            return;
        }
        self.array_tiles = keep;
        for t in out {
            if let Some(p) = self.phys.get_mut(&t.handle) {
                p.mappings = p.mappings.saturating_sub(1);
            }
            self.maybe_destroy(t.handle);
        }
    }
}
