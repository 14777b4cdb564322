//! The words of a live map's slot: a key (or the marks a slot holds otherwise), a charge
//! packed into 64 bits, and the hash that picks a key's home bucket.

/// What a live allocation is charged with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub device: usize,
    pub bytes: u64,
}

/// A slot never used or emptied by a remove.
pub(super) const EMPTY: u64 = 0;
/// A slot of a table whose entries moved to the next level: nothing goes there again.
pub(super) const MOVED: u64 = 1;
/// Set on a key while its entry is being copied to the next level.
pub(super) const MOVING: u64 = 1 << 63;
/// A slot claimed by one thread: an insert writing it, or a remove reading it. (Key 0
/// being moved, were 0 a key.)
pub(super) const BUSY: u64 = MOVING;
// Keys the table holds are 2..2^63 (`fits_table`): with or without MOVING they never
// equal EMPTY, MOVED or BUSY.

pub(super) const BYTES_BITS: u32 = 56;

#[inline(always)]
pub(super) fn pack(c: Charge) -> Option<u64> {
    (c.device < 256 && c.bytes < 1 << BYTES_BITS)
        .then_some((c.device as u64) << BYTES_BITS | c.bytes)
}

#[inline(always)]
pub(super) fn unpack(v: u64) -> Charge {
    Charge {
        device: (v >> BYTES_BITS) as usize,
        bytes: v & ((1 << BYTES_BITS) - 1),
    }
}

#[inline(always)]
pub(super) fn fits_table(key: u64) -> bool {
    // 2..2^63 in one comparison.
    key as i64 > 1
}

/// Spreads all the key's bits over the top ones, which pick the bucket. Pointers are
/// aligned and often evenly spaced: one multiply would leave keys 4 KiB apart in a
/// tenth of the buckets, so the product's high half is folded back and mixed again
/// (keys 8 B to 2 MiB apart then fill buckets like random ones).
#[inline(always)]
pub(super) fn hash(key: u64) -> u64 {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h ^ (h >> 32)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}
