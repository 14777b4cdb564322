//! Small growth allocations carved out of mapped pages ("slabs"). Pure bookkeeping:
//! addresses and lengths, no driver.
//!
//! A slab is one mapped range (one page today). Blocks are carved first-fit from its
//! free runs (kept by offset, so neighbours are found in O(log n)), each rounded up
//! to [`ALIGN`] bytes and aligned to it; a freed block is merged with the free runs
//! on either side, so a slab whose blocks are all freed is one free run again. The
//! set of a device's slabs ([`Slabs`]) is searched in address order: the first slab
//! with a free run long enough serves the request, which packs blocks into the
//! lowest slabs and leaves the highest ones to empty out first.

use std::collections::BTreeMap;

/// Alignment and size granularity of a small block. `cudaMalloc` documents 256
/// bytes; its pointers are 512-aligned in practice, and so are ours.
pub const ALIGN: u64 = 512;

/// Whether a request of `size` bytes is served from a slab on a device whose page
/// is `page` bytes: at most half a page. Larger requests gain little from sharing
/// a page and get whole pages of their own.
pub fn is_small(size: u64, page: u64) -> bool {
    size > 0 && size <= page / 2
}

/// The bytes a small block of `size` takes in its slab (`None` on overflow).
pub fn block_len(size: u64) -> Option<u64> {
    size.max(1).checked_next_multiple_of(ALIGN)
}

/// One mapped range that small blocks are carved from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slab {
    /// Address of the mapping.
    pub base: u64,
    /// Bytes mapped.
    pub len: u64,
    /// Physical pages mapped at `base`, in order.
    pub pages: Vec<u64>,
    /// Free runs: offset -> length, never adjacent (merged on free).
    free: BTreeMap<u64, u64>,
    /// Bytes in live blocks.
    used: u64,
}

impl Slab {
    pub fn new(base: u64, len: u64, pages: Vec<u64>) -> Self {
        let mut free = BTreeMap::new();
        if len > 0 {
            free.insert(0, len);
        }
        Slab {
            base,
            len,
            pages,
            free,
            used: 0,
        }
    }

    /// Whether no block is live in the slab.
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Bytes in live blocks.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Number of free runs (1 when empty: frees coalesce).
    pub fn runs(&self) -> usize {
        self.free.len()
    }

    /// Carves `len` bytes (a multiple of [`ALIGN`]) from the first free run long
    /// enough; returns the block's address.
    pub fn carve(&mut self, len: u64) -> Option<u64> {
        if len == 0 || !len.is_multiple_of(ALIGN) {
            return None;
        }
        let (&off, &run) = self.free.iter().find(|&(_, &run)| run >= len)?;
        self.free.remove(&off);
        if run > len {
            self.free.insert(off + len, run - len);
        }
        self.used += len;
        Some(self.base + off)
    }

    /// Returns the block of `len` bytes at `addr`, merging it with its free
    /// neighbours. False (and nothing changed) if it is not a carved block's range.
    pub fn release(&mut self, addr: u64, len: u64) -> bool {
        let Some(off) = addr.checked_sub(self.base) else {
            return false;
        };
        let end = match off.checked_add(len) {
            Some(e) if e <= self.len && len > 0 && len <= self.used => e,
            _ => return false,
        };
        let before = self.free.range(..=off).next_back().map(|(&o, &l)| (o, l));
        let after = self.free.range(off..).next().map(|(&o, &l)| (o, l));
        // The block must not overlap a free run.
        if before.is_some_and(|(o, l)| o + l > off) || after.is_some_and(|(o, _)| o < end) {
            return false;
        }
        let (mut start, mut stop) = (off, end);
        if let Some((o, _)) = before.filter(|&(o, l)| o + l == off) {
            self.free.remove(&o);
            start = o;
        }
        if let Some((o, l)) = after.filter(|&(o, _)| o == end) {
            self.free.remove(&o);
            stop = o + l;
        }
        self.free.insert(start, stop - start);
        self.used -= len;
        true
    }
}

/// A device's slabs, by base address.
#[derive(Debug, Default)]
pub struct Slabs {
    by_base: BTreeMap<u64, Slab>,
}

impl Slabs {
    pub const fn new() -> Self {
        Slabs {
            by_base: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, slab: Slab) {
        self.by_base.insert(slab.base, slab);
    }

    /// A block of `len` bytes from the first slab (by address) with room: its
    /// address and its slab's base.
    pub fn carve(&mut self, len: u64) -> Option<(u64, u64)> {
        self.by_base
            .values_mut()
            .find_map(|s| s.carve(len).map(|a| (a, s.base)))
    }

    /// Returns a block to the slab at `slab`; false if no such slab or block.
    pub fn release(&mut self, slab: u64, addr: u64, len: u64) -> bool {
        self.by_base
            .get_mut(&slab)
            .is_some_and(|s| s.release(addr, len))
    }

    /// Takes an empty slab out (the highest first), to unmap it for its pages.
    pub fn take_empty(&mut self) -> Option<Slab> {
        let base = self
            .by_base
            .values()
            .rev()
            .find(|s| s.is_empty())
            .map(|s| s.base)?;
        self.by_base.remove(&base)
    }

    /// Pages held by empty slabs (mapped, no live block).
    pub fn empty_pages(&self) -> u64 {
        self.by_base
            .values()
            .filter(|s| s.is_empty())
            .map(|s| s.pages.len() as u64)
            .sum()
    }

    pub fn len(&self) -> usize {
        self.by_base.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_base.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;
    const BASE: u64 = 0x7000_0000_0000;

    #[test]
    fn small_means_at_most_half_a_page_and_blocks_round_to_512() {
        assert!(is_small(1, P));
        assert!(is_small(P / 2, P));
        assert!(!is_small(P / 2 + 1, P));
        assert!(!is_small(0, P));
        assert_eq!(block_len(1), Some(512));
        assert_eq!(block_len(512), Some(512));
        assert_eq!(block_len(513), Some(1024));
        assert_eq!(block_len(64 << 10), Some(64 << 10));
        assert_eq!(block_len(u64::MAX), None);
    }

    #[test]
    fn blocks_are_aligned_and_do_not_overlap() {
        let mut s = Slab::new(BASE, P, vec![7]);
        let mut got = Vec::new();
        for size in [1u64, 700, 512, 4096, 1000, 3] {
            let len = block_len(size).unwrap();
            let a = s.carve(len).unwrap();
            assert_eq!(a % ALIGN, 0, "{a:#x}");
            got.push((a, len));
        }
        got.sort();
        for w in got.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?}");
        }
        assert_eq!(s.used(), got.iter().map(|g| g.1).sum::<u64>());
        assert_eq!(s.carve(100), None, "lengths must be multiples of ALIGN");
    }

    #[test]
    fn exhaustion_then_reuse_of_a_freed_block() {
        let len = 64 << 10;
        let mut s = Slab::new(BASE, P, vec![7]);
        let blocks: Vec<u64> = (0..P / len).map(|_| s.carve(len).unwrap()).collect();
        assert_eq!(blocks.len(), 32);
        assert_eq!(s.carve(ALIGN), None, "full");
        assert!(s.release(blocks[5], len));
        assert_eq!(s.carve(2 * len), None, "one hole of 64 KiB only");
        assert_eq!(s.carve(len), Some(blocks[5]), "first fit takes the hole");
    }

    #[test]
    fn frees_coalesce_in_any_order_back_to_one_run() {
        let len = 4096;
        let mut s = Slab::new(BASE, P, vec![7]);
        let blocks: Vec<u64> = (0..10).map(|_| s.carve(len).unwrap()).collect();
        for &i in &[1usize, 3, 2, 9, 0, 5, 7, 6, 8, 4] {
            assert!(s.release(blocks[i], len));
        }
        assert!(s.is_empty());
        assert_eq!(s.runs(), 1, "all merged");
        assert_eq!(s.carve(P), Some(BASE), "the whole slab in one block again");
    }

    #[test]
    fn coalesced_neighbours_serve_a_larger_block() {
        let mut s = Slab::new(BASE, 8 * ALIGN, vec![7]);
        let a: Vec<u64> = (0..8).map(|_| s.carve(ALIGN).unwrap()).collect();
        assert!(s.release(a[2], ALIGN));
        assert!(s.release(a[4], ALIGN));
        assert_eq!(s.carve(2 * ALIGN), None);
        assert!(s.release(a[3], ALIGN)); // merges 2, 3, 4
        assert_eq!(s.carve(3 * ALIGN), Some(a[2]));
    }

    #[test]
    fn a_bad_release_changes_nothing() {
        let mut s = Slab::new(BASE, P, vec![7]);
        let a = s.carve(1024).unwrap();
        assert!(!s.release(a + 1024, 512), "a free run");
        assert!(!s.release(BASE - 512, 512), "below the slab");
        assert!(!s.release(a, 4096), "overlaps the free run after it");
        assert!(!s.release(BASE + P, 512), "past the end");
        assert!(s.release(a, 1024));
        assert!(!s.release(a, 1024), "twice");
        assert_eq!((s.used(), s.runs()), (0, 1));
    }

    #[test]
    fn slabs_fill_first_fit_and_give_up_the_highest_empty_one() {
        let mut ss = Slabs::new();
        ss.add(Slab::new(BASE + P, P, vec![2]));
        ss.add(Slab::new(BASE, P, vec![1]));
        let len = P / 2;
        let (a, sa) = ss.carve(len).unwrap();
        let (b, sb) = ss.carve(len).unwrap();
        let (c, sc) = ss.carve(len).unwrap();
        assert_eq!((sa, sb, sc), (BASE, BASE, BASE + P), "lowest slab first");
        assert_eq!((a, b, c), (BASE, BASE + len, BASE + P));
        assert_eq!(ss.empty_pages(), 0);
        assert_eq!(ss.take_empty(), None);
        assert!(ss.release(sc, c, len));
        assert!(!ss.release(sc, c, len), "double free");
        assert!(!ss.release(BASE + 9 * P, c, len), "no such slab");
        assert_eq!(ss.empty_pages(), 1);
        let e = ss.take_empty().unwrap();
        assert_eq!((e.base, e.pages), (BASE + P, vec![2]));
        assert_eq!(ss.len(), 1);
        assert_eq!(ss.carve(len), None, "the remaining slab is full");
    }
}
