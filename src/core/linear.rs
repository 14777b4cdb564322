//! What a linear allocation (`cuMemAlloc`, `cuMemAllocPitch`) takes from the device,
//! which is what gpucap charges for it: not always the bytes asked for.
//!
//! The driver backs device memory in 2 MiB pages. An NVIDIA H200 with driver 580
//! (tests/driver-answers/h200-580.159.04.json) lowered `cuMemGetInfo`'s free memory by
//! 4 MiB for 3 MiB + 1 byte and by 2 MiB for 2 MiB, and by nothing for 1 byte and 4 KiB
//! (carved from a page it already held for a 1 MiB allocation), each at a 512-byte
//! boundary. Charged the bytes asked for, a program making allocations just over a
//! 2 MiB multiple got the driver to hold up to twice its cap (blocks of 2 MiB + 4 KiB:
//! 4 MiB each), and one making 1-byte allocations up to 512 times. So an allocation
//! above [`SMALL`] is charged in whole [`PAGE`]s, and a smaller one, which the driver
//! packs into pages it shares between such allocations, in [`BLOCK`]s: as growth mode
//! lays out its own blocks (`growth::slab`).

/// The largest allocation the driver packs into pages shared with others.
pub const SMALL: u64 = 1 << 20;

/// The page the driver backs a larger allocation with.
pub const PAGE: u64 = 2 << 20;

/// The granularity of a small allocation: the driver's pointers are 512-byte aligned.
pub const BLOCK: u64 = 512;

/// The bytes a linear allocation of `bytes` is charged: above [`SMALL`], rounded up to
/// whole [`PAGE`]s (the last whole page below 2^64, which no GPU holds, where that
/// overflows); else to whole [`BLOCK`]s.
#[inline(always)]
pub fn charge(bytes: u64) -> u64 {
    // Powers of two: masks, not a division, on every allocation's path. A branch, not one
    // mask chosen for both: the branch is the shorter path per allocation.
    if bytes <= SMALL {
        (bytes + (BLOCK - 1)) & !(BLOCK - 1)
    } else {
        bytes.saturating_add(PAGE - 1) & !(PAGE - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    #[test]
    fn small_allocations_take_whole_512_byte_blocks() {
        for b in [0, 512, 4 * KIB, 512 * KIB, MIB] {
            assert_eq!(charge(b), b, "{b} bytes");
        }
        assert_eq!(charge(1), 512);
        assert_eq!(charge(513), 1024);
        assert_eq!(charge(MIB - 1), MIB);
    }

    #[test]
    fn larger_ones_take_whole_pages_as_the_h200_did() {
        // The recorded answers: 2 MiB took 2 MiB, 3 MiB + 1 took 4 MiB.
        assert_eq!(charge(2 * MIB), 2 * MIB);
        assert_eq!(charge(3 * MIB + 1), 4 * MIB);
        assert_eq!(charge(MIB + 1), 2 * MIB);
        assert_eq!(charge(2 * MIB + 4 * KIB), 4 * MIB);
        assert_eq!(charge(1 << 40), 1 << 40);
    }

    #[test]
    fn no_wrap_near_the_top() {
        let top_page = u64::MAX / PAGE * PAGE;
        assert_eq!(charge(u64::MAX), top_page);
        assert_eq!(charge(top_page + 1), top_page);
        assert_eq!(charge(top_page), top_page);
        assert_eq!(charge(top_page - PAGE + 1), top_page);
        assert!(charge(u64::MAX) > 1 << 62, "more than any GPU holds");
    }
}
