//! Growth-only mode (`GPUCAP_GROWTH=1`): the bookkeeping. Safe Rust; `arena.rs` in
//! the shim makes the driver calls, in the order this module's answers dictate.
//!
//! **Pages.** The footprint of a process on a device is a set of physical pages
//! (driver VMM handles of the device's allocation granularity, 2 MiB on the fake and
//! on current GPUs), created when first needed and charged to the cap then, for
//! good. No page is ever released to the driver before exit. A retained page is in
//! one of four places:
//! - **live mapping**: mapped under a live allocation of more than half a page;
//! - **cached mapping** ([`pages`]): a freed such allocation, still mapped, handed out
//!   whole to the next request of the same page count;
//! - **loose** ([`pages`]): unmapped, owned by the process, used by no allocation;
//! - **slab** ([`slab`]): mapped as one range that small blocks are carved from.
//!
//! **Large requests** (more than half a page) get a fresh virtual range with whole
//! pages mapped into it: a cached mapping of the same page count if there is one;
//! otherwise loose pages, after unmapping cached mappings and then *empty* slabs into
//! loose pages until there are enough, and new pages only for the remainder. Pages
//! need not be contiguous in physical memory to be contiguous in the program's
//! address space, so any split of earlier blocks serves any later size.
//!
//! **Small requests** (at most half a page, [`slab::is_small`]) are carved from slabs:
//! each block is rounded up to 512 bytes and 512-aligned, taken first-fit from the
//! lowest slab with a long enough free run. With no room in any slab, one page makes
//! a new slab: a loose page, else a page of a cached mapping (unmapped), else a new
//! page. A freed block (after `cuCtxSynchronize`, as `cuMemFree` does) goes back to
//! its slab and merges with its free neighbours; a slab whose blocks are all freed
//! stays mapped for the next small blocks until a large request needs its page.
//!
//! **What "fits" means**, the growth-only guarantee: a request is served without new
//! driver memory when (large) its page count is at most the retained pages not in
//! live mappings and not in slabs with a live block (loose + cached + empty slabs),
//! or (small) some slab has a free run of its rounded size, or any such retained
//! page exists. Free bytes inside a slab that still holds a live block serve small
//! requests only; they are not "retained" in [`Growth::retained_bytes`], so
//! `cuMemGetInfo`, which shows retained bytes as free, never promises more than one
//! request of that size can get (a block of half the free figure may not fit in the
//! holes of partly used slabs).
//!
//! **Pointers.** Every live allocation, pages or block, is in one map by base
//! address: [`Growth::range_of`] answers for interior pointers; only the base frees.
//!
//! **Locks.** Each structure has its own mutex, held only for its own update (never
//! across a driver call, never two at once), so a hook re-entered from the driver
//! cannot deadlock. Growth mode is not the lock-free hot path.

pub mod pages;
pub mod slab;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire},
};

use crate::config::MAX_DEVICES;
use pages::Pages;
pub use pages::{Mapping, pages_for};
use slab::{Slab, Slabs};

/// A small block in a slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub device: usize,
    /// The size the program asked for.
    pub size: u64,
    /// Base address of its slab.
    pub slab: u64,
}

/// A live growth allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Live {
    Pages(Mapping),
    Block(Block),
}

impl Live {
    /// The size the program asked for.
    pub fn size(&self) -> u64 {
        match self {
            Live::Pages(m) => m.size,
            Live::Block(b) => b.size,
        }
    }
}

struct Device {
    /// Page size for this device; 0 until first asked of the driver.
    page: AtomicU64,
    pages: Pages,
    slabs: Mutex<Slabs>,
}

pub struct Growth {
    devices: [Device; MAX_DEVICES],
    /// Live growth allocations by base address.
    live: Mutex<BTreeMap<u64, Live>>,
}

pub static GROWTH: Growth = Growth::new();

/// Bytes this process retains on `device` that any request may use (see the
/// module doc: loose pages, cached mappings, empty slabs).
pub fn retained_bytes(device: usize) -> u64 {
    GROWTH.retained_bytes(device)
}

/// The free figure a program in growth mode is shown (`cuMemGetInfo`, NVML): of
/// `capped_free` (the driver's free memory within the cap) only whole pages count,
/// since new memory comes in pages of `page` bytes (0: not known, not rounded),
/// plus the `retained` bytes any request may use; at most `total`. So a request of
/// at most this figure is served (see the module doc's "fits").
pub fn free_figure(capped_free: u64, page: u64, retained: u64, total: u64) -> u64 {
    let new = match page {
        0 => capped_free,
        p => capped_free - capped_free % p,
    };
    new.saturating_add(retained).min(total)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a single update of one structure: a panic elsewhere
    // cannot leave the data half-changed.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Default for Growth {
    fn default() -> Self {
        Self::new()
    }
}

impl Growth {
    pub const fn new() -> Self {
        Growth {
            devices: [const {
                Device {
                    page: AtomicU64::new(0),
                    pages: Pages::new(),
                    slabs: Mutex::new(Slabs::new()),
                }
            }; MAX_DEVICES],
            live: Mutex::new(BTreeMap::new()),
        }
    }

    /// The page size of `device`, or 0 if not yet known (or out of range).
    pub fn page(&self, device: usize) -> u64 {
        self.devices.get(device).map_or(0, |d| d.page.load(Acquire))
    }

    pub fn set_page(&self, device: usize, page: u64) {
        if let Some(d) = self.devices.get(device) {
            let _ = d.page.compare_exchange(0, page, AcqRel, Acquire);
        }
    }

    /// Takes up to `n` loose pages of `device`.
    pub fn take_pages(&self, device: usize, n: u64) -> Vec<u64> {
        self.devices
            .get(device)
            .map_or_else(Vec::new, |d| d.pages.take(n))
    }

    /// Returns pages to `device`'s loose list.
    pub fn give_back(&self, device: usize, pages: impl IntoIterator<Item = u64>) {
        if let Some(d) = self.devices.get(device) {
            d.pages.give_back(pages);
        }
    }

    /// Retained bytes any request may use: loose pages, cached mappings and empty
    /// slabs. Free bytes of slabs with a live block are not counted.
    pub fn retained_bytes(&self, device: usize) -> u64 {
        self.devices.get(device).map_or(0, |d| {
            let empty = lock(&d.slabs).empty_pages();
            (d.pages.loose() + d.pages.cached() + empty) * d.page.load(Acquire)
        })
    }

    /// Keeps a freed page allocation mapped for reuse.
    pub fn cache(&self, base: u64, mapping: Mapping) {
        if let Some(d) = self.devices.get(mapping.device) {
            d.pages.cache(base, mapping);
        }
    }

    /// A cached mapping of exactly `pages` pages, most recently freed first.
    pub fn take_cached(&self, device: usize, pages: usize) -> Option<(u64, Mapping)> {
        self.devices.get(device)?.pages.take_cached(pages)
    }

    /// Any cached mapping, to be unmapped so its pages can serve another size.
    pub fn evict_cached(&self, device: usize) -> Option<(u64, Mapping)> {
        self.devices.get(device)?.pages.evict_cached()
    }

    /// An empty slab taken out of use, as a mapping to unmap for its pages.
    pub fn evict_empty_slab(&self, device: usize) -> Option<(u64, Mapping)> {
        let d = self.devices.get(device)?;
        let s = lock(&d.slabs).take_empty()?;
        let page = d.page.load(Acquire);
        Some((
            s.base,
            Mapping {
                device,
                size: s.len,
                page,
                pages: s.pages,
            },
        ))
    }

    /// Retained pages on `device` that are not mapped.
    pub fn loose_pages(&self, device: usize) -> u64 {
        self.devices.get(device).map_or(0, |d| d.pages.loose())
    }

    /// Carves a block for a small request of `size` bytes from `device`'s slabs and
    /// records it live; `None` when no slab has room.
    pub fn carve(&self, device: usize, size: u64) -> Option<u64> {
        let len = slab::block_len(size)?;
        let (addr, slab) = lock(&self.devices.get(device)?.slabs).carve(len)?;
        self.record_live(addr, Live::Block(Block { device, size, slab }));
        Some(addr)
    }

    /// Adds a new slab of `pages` (of `device`'s page size) mapped at `base`.
    pub fn add_slab(&self, device: usize, base: u64, pages: Vec<u64>) {
        if let Some(d) = self.devices.get(device) {
            let len = d.page.load(Acquire) * pages.len() as u64;
            lock(&d.slabs).add(Slab::new(base, len, pages));
        }
    }

    /// Returns a freed block (taken out of the live map) to its slab.
    pub fn release_block(&self, addr: u64, b: Block) {
        if let (Some(d), Some(len)) = (self.devices.get(b.device), slab::block_len(b.size)) {
            lock(&d.slabs).release(b.slab, addr, len);
        }
    }

    /// Records a page allocation live at `base`.
    pub fn record(&self, base: u64, mapping: Mapping) {
        self.record_live(base, Live::Pages(mapping));
    }

    fn record_live(&self, base: u64, live: Live) {
        lock(&self.live).insert(base, live);
    }

    /// Takes the live allocation whose base is exactly `base`.
    pub fn remove(&self, base: u64) -> Option<Live> {
        lock(&self.live).remove(&base)
    }

    /// The base and requested size of the growth allocation containing `ptr`.
    pub fn range_of(&self, ptr: u64) -> Option<(u64, u64)> {
        let live = lock(&self.live);
        let (&base, l) = live.range(..=ptr).next_back()?;
        (ptr - base < l.size()).then_some((base, l.size()))
    }

    /// Whether any growth allocation is live (a cheap test for the free path).
    pub fn has_mappings(&self) -> bool {
        !lock(&self.live).is_empty()
    }

    /// Number of slabs on `device` (for tests and reports).
    pub fn slabs(&self, device: usize) -> usize {
        self.devices.get(device).map_or(0, |d| lock(&d.slabs).len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    #[test]
    fn pages_round_up() {
        assert_eq!(pages_for(1, P), Some(1));
        assert_eq!(pages_for(P, P), Some(1));
        assert_eq!(pages_for(P + 1, P), Some(2));
        assert_eq!(pages_for(0, P), None);
        assert_eq!(pages_for(u64::MAX, P), Some(u64::MAX / P + 1));
    }

    #[test]
    fn freed_pages_serve_any_later_split() {
        let g = Growth::new();
        g.set_page(0, P);
        // Three blocks of 3 pages each were freed...
        for block in 0..3u64 {
            g.give_back(0, (0..3).map(|i| block * 10 + i));
        }
        assert_eq!(g.retained_bytes(0), 9 * P);
        // ...and one request of 6 pages takes pages of two different blocks.
        let took = g.take_pages(0, 6);
        assert_eq!(took.len(), 6);
        assert_eq!(g.retained_bytes(0), 3 * P);
        // Asking for more than is left returns what is left.
        assert_eq!(g.take_pages(0, 5).len(), 3);
        assert_eq!(g.take_pages(0, 1).len(), 0);
    }

    #[test]
    fn cached_mappings_are_reused_whole_or_evicted() {
        let g = Growth::new();
        g.set_page(0, P);
        let m = |pages: Vec<u64>| Mapping {
            device: 0,
            size: pages.len() as u64 * P,
            page: P,
            pages,
        };
        g.cache(0x1000, m(vec![1, 2]));
        g.cache(0x9000, m(vec![3, 4, 5]));
        g.give_back(0, [6]);
        assert_eq!(g.loose_pages(0), 1);
        assert_eq!(g.retained_bytes(0), 6 * P);
        assert_eq!(g.take_cached(0, 4), None, "no mapping of 4 pages");
        let (base, got) = g.take_cached(0, 2).unwrap();
        assert_eq!((base, got.pages), (0x1000, vec![1, 2]));
        assert_eq!(g.evict_cached(0).map(|(b, _)| b), Some(0x9000));
        assert_eq!(g.evict_cached(0), None);
        assert_eq!(g.retained_bytes(0), P);
    }

    #[test]
    fn the_free_figure_counts_whole_new_pages_and_retained_bytes() {
        assert_eq!(
            free_figure(3 * P + 5, P, 0, 100 * P),
            3 * P,
            "a page's tail cannot be had"
        );
        assert_eq!(free_figure(P - 1, P, 2 * P, 100 * P), 2 * P);
        assert_eq!(
            free_figure(P - 1, 0, 0, 100 * P),
            P - 1,
            "page not known yet"
        );
        assert_eq!(
            free_figure(4 * P, P, 4 * P, 6 * P),
            6 * P,
            "at most the total"
        );
    }

    #[test]
    fn page_size_is_set_once() {
        let g = Growth::new();
        assert_eq!(g.page(1), 0);
        g.set_page(1, P);
        g.set_page(1, 4 * P);
        assert_eq!(g.page(1), P);
        assert_eq!(g.page(MAX_DEVICES), 0);
    }

    #[test]
    fn mappings_answer_interior_pointers() {
        let g = Growth::new();
        let m = Mapping {
            device: 0,
            size: 3 * P - 5,
            page: P,
            pages: vec![1, 2, 3],
        };
        assert_eq!(m.mapped(), 3 * P);
        g.record(0x1000_0000, m.clone());
        assert_eq!(g.range_of(0x1000_0000), Some((0x1000_0000, 3 * P - 5)));
        assert_eq!(g.range_of(0x1000_0000 + P), Some((0x1000_0000, 3 * P - 5)));
        assert_eq!(
            g.range_of(0x1000_0000 + 3 * P - 5),
            None,
            "past the requested size"
        );
        assert_eq!(g.range_of(0x0fff_ffff), None);
        assert!(g.has_mappings());
        assert_eq!(g.remove(0x1000_0000 + 1), None, "only the base frees");
        assert_eq!(g.remove(0x1000_0000), Some(Live::Pages(m)));
        assert!(!g.has_mappings());
    }

    #[test]
    fn small_blocks_share_a_slab_and_answer_interior_pointers() {
        let g = Growth::new();
        g.set_page(0, P);
        assert_eq!(g.carve(0, 1000), None, "no slab yet");
        let base = 0x4000_0000;
        g.add_slab(0, base, vec![9]);
        let a = g.carve(0, 1000).unwrap();
        let b = g.carve(0, 64 << 10).unwrap();
        assert_eq!((a, b), (base, base + 1024), "1000 B rounds up to 1024");
        assert_eq!(g.slabs(0), 1);
        assert_eq!(g.range_of(a + 999), Some((a, 1000)));
        assert_eq!(
            g.range_of(a + 1000),
            None,
            "the alignment pad is no block's"
        );
        assert_eq!(g.range_of(b + (64 << 10) - 1), Some((b, 64 << 10)));
        assert_eq!(g.remove(b + 1), None, "only the base frees");
        assert_eq!(
            g.retained_bytes(0),
            0,
            "a slab with live blocks is not retained"
        );
        let Some(Live::Block(blk)) = g.remove(a) else {
            panic!("a is a block")
        };
        assert_eq!(
            blk,
            Block {
                device: 0,
                size: 1000,
                slab: base
            }
        );
        g.release_block(a, blk);
        assert_eq!(g.remove(a), None, "twice: unknown");
        assert_eq!(g.evict_empty_slab(0), None, "b is still live");
        let Some(Live::Block(blk)) = g.remove(b) else {
            panic!("b is a block")
        };
        g.release_block(b, blk);
        assert!(!g.has_mappings());
        assert_eq!(g.retained_bytes(0), P, "an empty slab is retained");
        let (at, m) = g.evict_empty_slab(0).unwrap();
        assert_eq!((at, m.mapped(), m.pages), (base, P, vec![9]));
        assert_eq!(g.slabs(0), 0);
    }

    #[test]
    fn retained_bytes_counts_loose_cached_and_empty_slab_pages() {
        let g = Growth::new();
        g.set_page(0, P);
        g.give_back(0, [1, 2]);
        g.cache(
            0x10_0000_0000,
            Mapping {
                device: 0,
                size: P,
                page: P,
                pages: vec![3],
            },
        );
        g.add_slab(0, 0x20_0000_0000, vec![4]);
        g.add_slab(0, 0x30_0000_0000, vec![5]);
        assert_eq!(g.retained_bytes(0), 5 * P);
        let _ = g.carve(0, 512).unwrap();
        assert_eq!(g.retained_bytes(0), 4 * P, "one slab now holds a block");
    }
}
