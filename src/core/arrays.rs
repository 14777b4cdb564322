//! CUDA arrays (`cuArrayCreate_v2`, `cuArray3DCreate_v2`, `cuMipmappedArrayCreate`): the
//! layout is the driver's (block-linear, padded), so the size an array really takes is
//! known only once it exists. The hook reserves an estimate first (the atomic cap
//! check), lets the driver create the array, then asks the driver for the real size
//! (`cuArrayGetMemoryRequirements` / `cuMipmappedArrayGetMemoryRequirements`) and
//! resizes the charge to it; if the real size breaks the cap the array is destroyed
//! and the call refused. Where the driver does not answer (NVIDIA's documents the
//! query for arrays made with `CUDA_ARRAY3D_DEFERRED_MAPPING` only), the estimate is
//! the charge.
//!
//! The estimate is the texels times the bytes per texel, summed over the mip levels:
//!
//! - texels of a level: `max(1, W >> l) * max(1, H >> l) * D_l`, a height of 0 (1D)
//!   counting as 1; `D_l` is `max(1, D >> l)` for a 3D array, and `D` unchanged for a
//!   layered or cubemap array (the layers are not reduced), 1 for 1D/2D;
//! - bytes per texel: channel size x `NumChannels` for the 8/16/32-bit integer, half
//!   and float formats (1, 2, 4 bytes per channel); the normalized-vector formats
//!   (`UNORM_INT8X4` ...) their vector size; block-compressed formats 0.5 byte (BC1,
//!   BC4) or 1 byte (the others) per texel; any other format (packed and planar
//!   video formats, or one this table does not know) 16 bytes per texel, the most
//!   any format takes, so that an unknown format is overestimated, never under.
//!
//! Arrays made with `CUDA_ARRAY3D_SPARSE` or `CUDA_ARRAY3D_DEFERRED_MAPPING` take no
//! memory themselves: their memory is mapped in later from `cuMemCreate` handles,
//! which are charged there. They are not charged here.

/// `CUDA_ARRAY3D_LAYERED`.
pub const LAYERED: u32 = 0x01;
/// `CUDA_ARRAY3D_CUBEMAP`.
pub const CUBEMAP: u32 = 0x04;
/// `CUDA_ARRAY3D_SPARSE`.
pub const SPARSE: u32 = 0x40;
/// `CUDA_ARRAY3D_DEFERRED_MAPPING`.
pub const DEFERRED_MAPPING: u32 = 0x80;

/// The shape of an array as its descriptor gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

impl Shape {
    /// Whether the array's memory comes from elsewhere (`cuMemCreate` handles).
    pub fn takes_no_memory(&self) -> bool {
        self.flags & (SPARSE | DEFERRED_MAPPING) != 0
    }
}

/// Bytes per texel, in eighths of a byte (block-compressed formats take half a byte).
fn texel_eighths(format: u32, channels: u32) -> u64 {
    let ch = u64::from(channels.max(1));
    match format {
        0x01 | 0x08 => 8 * ch,           // (UN)SIGNED_INT8
        0x02 | 0x09 | 0x10 => 16 * ch,   // (UN)SIGNED_INT16, HALF
        0x03 | 0x0a | 0x20 => 32 * ch,   // (UN)SIGNED_INT32, FLOAT
        0xc0 | 0xc6 => 8,                // UNORM/SNORM_INT8X1
        0xc1 | 0xc7 | 0xc3 | 0xc9 => 16, // INT8X2, INT16X1
        0xc2 | 0xc8 | 0xc4 | 0xca => 32, // INT8X4, INT16X2
        0xc5 | 0xcb => 64,               // INT16X4
        0x91 | 0x92 | 0x97 | 0x98 => 4,  // BC1, BC4: 8 bytes per 4x4 block
        0x93..=0x96 | 0x99..=0x9e => 8,  // BC2, BC3, BC5, BC6H, BC7: 16 per block
        _ => 128,                        // anything else: the most any format takes
    }
}

/// The estimate described in the module documentation (saturating).
pub fn estimate(shape: &Shape, levels: u32) -> u64 {
    let per_layer_depth = shape.flags & (LAYERED | CUBEMAP) != 0;
    let mut texels: u64 = 0;
    for l in 0..levels.clamp(1, 64) {
        let dim = |x: u64| (x >> l).max(1);
        let depth = match shape.depth {
            0 => 1,
            d if per_layer_depth => d,
            d => dim(d),
        };
        let t = dim(shape.width)
            .saturating_mul(dim(shape.height))
            .saturating_mul(depth);
        texels = texels.saturating_add(t);
    }
    match texels.checked_mul(texel_eighths(shape.format, shape.channels)) {
        Some(eighths) if texels != u64::MAX => eighths.div_ceil(8),
        _ => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(width: u64, height: u64, depth: u64, format: u32, channels: u32, flags: u32) -> Shape {
        Shape {
            width,
            height,
            depth,
            format,
            channels,
            flags,
        }
    }

    #[test]
    fn plain_arrays() {
        assert_eq!(
            estimate(&shape(1024, 0, 0, 0x20, 1, 0), 1),
            4096,
            "1D float"
        );
        assert_eq!(
            estimate(&shape(1024, 768, 0, 0x01, 4, 0), 1),
            1024 * 768 * 4,
            "2D uchar4"
        );
        assert_eq!(
            estimate(&shape(64, 64, 64, 0x10, 2, 0), 1),
            64 * 64 * 64 * 4,
            "3D half2"
        );
        assert_eq!(
            estimate(&shape(256, 256, 0, 0xc2, 4, 0), 1),
            256 * 256 * 4,
            "UNORM_INT8X4"
        );
        assert_eq!(
            estimate(&shape(256, 256, 0, 0x91, 4, 0), 1),
            256 * 256 / 2,
            "BC1"
        );
        assert_eq!(
            estimate(&shape(256, 256, 0, 0x9d, 4, 0), 1),
            256 * 256,
            "BC7"
        );
        assert_eq!(
            estimate(&shape(10, 10, 0, 0xb0, 1, 0), 1),
            1600,
            "NV12: the upper bound"
        );
        assert_eq!(
            estimate(&shape(10, 10, 0, 0x1234, 1, 0), 1),
            1600,
            "unknown: the upper bound"
        );
    }

    #[test]
    fn mip_levels_layers_and_cubemaps() {
        // 8x8 float: 64 + 16 + 4 + 1 texels.
        assert_eq!(estimate(&shape(8, 8, 0, 0x20, 1, 0), 4), 85 * 4);
        // More levels than the size allows: the 1x1 level repeats (the driver refuses
        // such a call; the estimate just stays finite).
        assert_eq!(estimate(&shape(8, 8, 0, 0x20, 1, 0), 6), 87 * 4);
        // 3D: depth halves too. 4x4x4 + 2x2x2 + 1.
        assert_eq!(estimate(&shape(4, 4, 4, 0x01, 1, 0), 3), 64 + 8 + 1);
        // Layered: 6 layers stay 6 at every level. (16 + 4 + 1) * 6.
        assert_eq!(estimate(&shape(4, 4, 6, 0x01, 1, LAYERED), 3), 21 * 6);
        assert_eq!(estimate(&shape(4, 4, 6, 0x01, 1, CUBEMAP), 3), 21 * 6);
        assert_eq!(
            estimate(&shape(4, 4, 0, 0x01, 1, 0), 0),
            16,
            "0 levels counts as 1"
        );
    }

    #[test]
    fn huge_shapes_saturate() {
        assert_eq!(
            estimate(&shape(u64::MAX, u64::MAX, u64::MAX, 0x20, 4, 0), 64),
            u64::MAX
        );
        assert_eq!(estimate(&shape(1 << 62, 1, 0, 0x20, 4, 0), 1), u64::MAX);
        assert!(estimate(&shape(1 << 40, 1 << 40, 0, 0x20, 4, 0), 1) >= 1 << 62);
    }

    #[test]
    fn sparse_and_deferred_take_no_memory() {
        assert!(shape(1, 1, 0, 1, 1, SPARSE).takes_no_memory());
        assert!(shape(1, 1, 0, 1, 1, DEFERRED_MAPPING | LAYERED).takes_no_memory());
        assert!(!shape(1, 1, 0, 1, 1, LAYERED).takes_no_memory());
    }
}
