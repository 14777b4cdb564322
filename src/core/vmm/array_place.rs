//! Where `cuMemCreate` memory is mapped into a sparse or deferred-mapping array
//! (`cuMemMapArrayAsync`'s `CUarrayMapInfo`): a region of a sparse level or a range of a
//! layer's mip tail, and whether two such places share memory.

/// Where memory is mapped into an array or mipmapped array: a region of a sparse level
/// (level, layer, offset and extent in elements, x y z) or a range of a layer's mip tail
/// (bytes).
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
    /// Whether the two places share memory of their array (a step on one replaces or
    /// unmaps what is mapped at the other).
    pub fn overlaps(&self, other: &Place) -> bool {
        match (*self, *other) {
            (
                Place::Level {
                    level,
                    layer,
                    offset,
                    extent,
                },
                Place::Level {
                    level: level2,
                    layer: layer2,
                    offset: offset2,
                    extent: extent2,
                },
            ) => {
                level == level2
                    && layer == layer2
                    && (0..3).all(|i| {
                        spans_meet(
                            offset[i].into(),
                            extent[i].into(),
                            offset2[i].into(),
                            extent2[i].into(),
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
                    layer: layer2,
                    offset: offset2,
                    size: size2,
                },
            ) => layer == layer2 && spans_meet(offset, size, offset2, size2),
            _ => false,
        }
    }
}

/// A region of level `level`, layer 0 (for tests here and in `array_tiles`).
#[cfg(test)]
pub(super) fn level(level: u32, offset: [u32; 3], extent: [u32; 3]) -> Place {
    Place::Level {
        level,
        layer: 0,
        offset,
        extent,
    }
}

/// A range of layer `layer`'s mip tail (for tests).
#[cfg(test)]
pub(super) fn tail(layer: u32, offset: u64, size: u64) -> Place {
    Place::MipTail {
        layer,
        offset,
        size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn places_overlap_where_they_share_elements_of_one_level_and_layer() {
        let a = level(0, [0, 0, 0], [64, 64, 1]);
        assert!(a.overlaps(&level(0, [32, 32, 0], [64, 64, 1])));
        assert!(
            !a.overlaps(&level(0, [64, 0, 0], [64, 64, 1])),
            "side by side"
        );
        assert!(
            !a.overlaps(&level(1, [0, 0, 0], [64, 64, 1])),
            "another level"
        );
        assert!(
            !a.overlaps(&level(0, [0, 0, 0], [0, 64, 1])),
            "an empty region"
        );
        let other_layer = Place::Level {
            level: 0,
            layer: 1,
            offset: [0, 0, 0],
            extent: [64, 64, 1],
        };
        assert!(!a.overlaps(&other_layer));
        assert!(tail(0, 0, 2 * MIB).overlaps(&tail(0, MIB, 2 * MIB)));
        assert!(!tail(0, 0, MIB).overlaps(&tail(0, MIB, MIB)));
        assert!(!tail(0, 0, MIB).overlaps(&tail(1, 0, MIB)));
        assert!(
            !tail(0, 0, MIB).overlaps(&a),
            "a mip tail is no level's region"
        );
    }
}
