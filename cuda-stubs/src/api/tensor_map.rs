//! Tensor maps (`cuTensorMapEncodeTiled`, `cuTensorMapEncodeIm2col`), which XLA-compiled code
//! asks for on compute capability 9: the arguments checked as CUDA's documentation of each
//! call states (CUDA_ERROR_INVALID_VALUE otherwise), and the 128-byte `CUtensorMap` filled
//! with a deterministic encoding of them. The fake runs no kernel: nothing reads the map.

use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUresult, CuResult, inp, out};
use crate::model::device::cfg;
use libc::{c_int, c_void};

/// CUtensorMap: 16 opaque 64-bit words, aligned to 64 bytes for the driver's calls.
const WORDS: usize = 16;
/// The last word of a map the fake encoded.
const MAGIC: u64 = u64::from_le_bytes(*b"fakeTMA\0");

// CUtensorMapDataType: the packed types at the end of the range.
const U4_ALIGN8B: c_int = 13;
const U4_ALIGN16B: c_int = 14;
const U6_ALIGN16B: c_int = 15;
// CUtensorMapInterleave, CUtensorMapSwizzle.
const INTERLEAVE_NONE: c_int = 0;
const INTERLEAVE_32B: c_int = 2;
const SWIZZLE_NONE: c_int = 0;
const SWIZZLE_32B: c_int = 1;
const SWIZZLE_128B: c_int = 3;
const SWIZZLE_128B_ATOM_32B: c_int = 4;
const SWIZZLE_128B_ATOM_64B: c_int = 6;

/// The bits of one element of a CUtensorMapDataType (UINT8 .. 16U6_ALIGN16B); None: no such
/// type.
fn element_bits(t: c_int) -> Option<u64> {
    Some(match t {
        0 => 8,
        1 | 6 | 9 => 16,
        2 | 3 | 7 | 10..=12 => 32,
        4 | 5 | 8 => 64,
        U4_ALIGN8B | U4_ALIGN16B => 4,
        U6_ALIGN16B => 6,
        _ => return None,
    })
}

/// FLOAT16 .. TFLOAT32_FTZ: the types an OOB fill of NaN is allowed for.
fn is_float(t: c_int) -> bool {
    (6..=12).contains(&t)
}

/// The packed types stored 16 to 16 bytes (address and strides aligned to 32 bytes, 128
/// elements at a time).
fn packed16(t: c_int) -> bool {
    t == U4_ALIGN16B || t == U6_ALIGN16B
}

/// The bytes a swizzle mode swizzles within (NONE: none).
fn swizzle_span(s: c_int) -> u64 {
    match s {
        SWIZZLE_32B => 32,
        2 => 64,
        SWIZZLE_NONE => u64::MAX,
        _ => 128,
    }
}

fn check(ok: bool) -> CuResult {
    if ok {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// `n` values the caller passes at `p` (NULL only for none).
fn array<T: Copy>(p: *const T, n: usize) -> Result<Vec<T>, CUresult> {
    check(n == 0 || !p.is_null())?;
    // SAFETY: the caller passes an array of `n` values (checked not NULL above when n > 0).
    (0..n).map(|i| inp(unsafe { p.add(i) })).collect()
}

/// What both encodings share: the map, type, rank, address, dimensions, strides, element
/// strides and the four modes.
struct Map {
    data_type: c_int,
    rank: usize,
    address: u64,
    dims: Vec<u64>,
    strides: Vec<u64>,
    element_strides: Vec<u32>,
    interleave: c_int,
    swizzle: c_int,
    l2_promotion: c_int,
    oob_fill: c_int,
}

impl Map {
    /// The checks both calls' documentation states alike (`ranks`: the ranks the call
    /// allows); the bits of an element.
    fn check(&self, ranks: std::ops::RangeInclusive<usize>) -> Result<u64, CUresult> {
        let t = self.data_type;
        let bits = element_bits(t).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        check(ranks.contains(&self.rank))?;
        check((INTERLEAVE_NONE..=INTERLEAVE_32B).contains(&self.interleave))?;
        check((SWIZZLE_NONE..=SWIZZLE_128B_ATOM_64B).contains(&self.swizzle))?;
        check((0..=3).contains(&self.l2_promotion))?;
        check((0..=1).contains(&self.oob_fill))?;
        check(self.interleave == INTERLEAVE_NONE || self.rank >= 3)?;
        let align32 = self.interleave == INTERLEAVE_32B || packed16(t);
        check(self.address.is_multiple_of(if align32 { 32 } else { 16 }))?;
        check(self.dims.iter().all(|&d| (1..=1 << 32).contains(&d)))?;
        let d0 = self.dims[0];
        check(!packed16(t) || d0.is_multiple_of(128))?;
        check(t != U4_ALIGN8B || d0.is_multiple_of(2))?;
        let stride_align = if align32 { 32 } else { 16 };
        let stride_ok = |&s: &u64| s.is_multiple_of(stride_align) && s < 1 << 40;
        check(self.strides.iter().all(stride_ok))?;
        check(self.element_strides.iter().all(|&e| (1..=8).contains(&e)))?;
        check(self.interleave != INTERLEAVE_32B || self.swizzle == SWIZZLE_32B)?;
        let packed_swizzles: &[c_int] = match t {
            U6_ALIGN16B => &[
                SWIZZLE_NONE,
                SWIZZLE_128B,
                SWIZZLE_128B_ATOM_32B,
                SWIZZLE_128B_ATOM_64B,
            ],
            U4_ALIGN16B => &[SWIZZLE_NONE, SWIZZLE_128B, SWIZZLE_128B_ATOM_32B],
            _ => &[self.swizzle],
        };
        check(packed_swizzles.contains(&self.swizzle))?;
        check(t != U6_ALIGN16B || self.interleave == INTERLEAVE_NONE)?;
        check(self.oob_fill == 0 || is_float(t))?;
        Ok(bits)
    }

    /// The inner dimension of the box, `elements` of this type, in bytes: within the
    /// swizzle's span when there is no interleave and a swizzle.
    fn check_inner(&self, elements: u64, bits: u64) -> CuResult {
        let bytes = (elements * bits).div_ceil(8);
        check(self.interleave != INTERLEAVE_NONE || bytes <= swizzle_span(self.swizzle))
    }

    /// The encoding: address; kind, type, rank and modes; dimensions; strides; `box_words`
    /// (what the kind adds); the magic word.
    fn encode(&self, kind: u64, box_words: [u64; 4]) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        w[0] = self.address;
        let modes = [
            self.interleave,
            self.swizzle,
            self.l2_promotion,
            self.oob_fill,
        ];
        w[1] = kind | (self.data_type as u64) << 8 | (self.rank as u64) << 16;
        for (i, m) in modes.iter().enumerate() {
            w[1] |= (*m as u64) << (24 + 8 * i);
        }
        w[2..2 + self.rank].copy_from_slice(&self.dims);
        w[7..7 + self.strides.len()].copy_from_slice(&self.strides);
        w[11..15].copy_from_slice(&box_words);
        w[15] = MAGIC;
        w
    }
}

/// Bytes of `values`, one a byte (each fits), as one word.
fn bytes_word(values: impl Iterator<Item = u64>) -> u64 {
    values
        .enumerate()
        .fold(0, |w, (i, v)| w | (v & 0xff) << (8 * i))
}

/// The caller's map (NULL or not aligned to 64 bytes: CUDA_ERROR_INVALID_VALUE) and the
/// arguments both calls share, read.
#[allow(clippy::too_many_arguments)]
fn read_map(
    map: *mut [u64; WORDS],
    data_type: c_int,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    element_strides: *const u32,
    modes: [c_int; 4],
) -> Result<Map, CUresult> {
    cfg()?;
    check(!map.is_null() && (map as usize).is_multiple_of(64))?;
    let rank = rank as usize;
    check((1..=5).contains(&rank))?;
    Ok(Map {
        data_type,
        rank,
        address: address as u64,
        dims: array(dims, rank)?,
        strides: array(strides, rank - 1)?,
        element_strides: array(element_strides, rank)?,
        interleave: modes[0],
        swizzle: modes[1],
        l2_promotion: modes[2],
        oob_fill: modes[3],
    })
}

crate::abi::exports! {
    // A tiled region: the box (`boxDim`, 1 to 256 elements each; its inner dimension a
    // multiple of 16 bytes without interleave, 128 elements of a packed 16-byte type).
    fn cuTensorMapEncodeTiled(map: *mut [u64; WORDS], data_type: c_int, rank: u32, address: *mut c_void, dims: *const u64, strides: *const u64, box_dim: *const u32, element_strides: *const u32, interleave: c_int, swizzle: c_int, l2_promotion: c_int, oob_fill: c_int) {
        let modes = [interleave, swizzle, l2_promotion, oob_fill];
        let m = read_map(map, data_type, rank, address, dims, strides, element_strides, modes)?;
        let bits = m.check(1..=5)?;
        let boxes = array(box_dim, m.rank)?;
        check(boxes.iter().all(|&b| (1..=256).contains(&b)))?;
        let inner = u64::from(boxes[0]);
        check(interleave != INTERLEAVE_NONE || (inner * bits).is_multiple_of(128))?;
        check(!packed16(data_type) || inner == 128)?;
        m.check_inner(inner, bits)?;
        let box_word = bytes_word(boxes.iter().map(|&b| u64::from(b) - 1));
        let strides_word = bytes_word(m.element_strides.iter().map(|&e| u64::from(e)));
        out(map, m.encode(1, [box_word, strides_word, 0, 0]))
    }

    // An im2col region of a tensor of rank 3 to 5: the corners of the box (one offset per
    // spatial dimension, in [-32768, 32767], [-128, 127] or [-16, 15] by rank), at most 256
    // channels per pixel (128 for a packed 16-byte type) and 1024 pixels per column. That
    // the box has a non-zero area is not checked.
    fn cuTensorMapEncodeIm2col(map: *mut [u64; WORDS], data_type: c_int, rank: u32, address: *mut c_void, dims: *const u64, strides: *const u64, lower: *const c_int, upper: *const c_int, channels: u32, pixels: u32, element_strides: *const u32, interleave: c_int, swizzle: c_int, l2_promotion: c_int, oob_fill: c_int) {
        let modes = [interleave, swizzle, l2_promotion, oob_fill];
        let m = read_map(map, data_type, rank, address, dims, strides, element_strides, modes)?;
        let bits = m.check(3..=5)?;
        let limit = [32768, 128, 16][m.rank - 3];
        let (lower, upper) = (array(lower, m.rank - 2)?, array(upper, m.rank - 2)?);
        check(lower.iter().chain(&upper).all(|c| (-limit..limit).contains(c)))?;
        check(channels <= 256 && (!packed16(data_type) || channels == 128) && pixels <= 1024)?;
        m.check_inner(u64::from(channels), bits)?;
        let corners = |c: &[c_int]| bytes_word(c.iter().map(|&v| v as u16 as u64).flat_map(|v| [v, v >> 8]));
        let sizes = u64::from(channels) | u64::from(pixels) << 16;
        let strides_word = bytes_word(m.element_strides.iter().map(|&e| u64::from(e)));
        out(map, m.encode(2, [sizes, strides_word, corners(&lower), corners(&upper)]))
    }
}
