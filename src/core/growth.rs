//! Growth-only mode (`GPUCAP_GROWTH=1`): the bookkeeping. Safe Rust.
//!
//! The footprint of a process on a device is a set of physical pages (driver VMM
//! handles of the device's allocation granularity). An allocation is a fresh
//! virtual range with pages mapped into it; freeing unmaps them and returns the
//! pages to the device's retained list, never to the driver. Any later allocation
//! of up to (retained pages × page size) bytes is served from that list, however
//! the earlier blocks were split, because pages need not be contiguous in physical
//! memory to be contiguous in the program's address space. `arena.rs` does the
//! driver calls; this module only counts pages and remembers mappings.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::config::MAX_DEVICES;

/// One allocation served in growth mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub device: usize,
    /// The size the program asked for.
    pub size: u64,
    /// The page size the pages were created with.
    pub page: u64,
    /// Physical pages, mapped in order from the base address.
    pub pages: Vec<u64>,
}

impl Mapping {
    /// Bytes of address space mapped (whole pages).
    pub fn mapped(&self) -> u64 {
        self.page * self.pages.len() as u64
    }
}

struct Retained {
    /// Page size for this device; 0 until first asked of the driver.
    page: AtomicU64,
    /// Pages the process owns that no allocation uses, unmapped.
    free: Mutex<Vec<u64>>,
    /// Freed allocations kept mapped, by base address: a later request for the same
    /// number of pages takes one whole, with no driver call. Their pages count as
    /// retained, and are unmapped into `free` when a request of another size needs
    /// them.
    cached: Mutex<Vec<(u64, Mapping)>>,
}

pub struct Growth {
    devices: [Retained; MAX_DEVICES],
    /// Live growth allocations by base address.
    mappings: Mutex<BTreeMap<u64, Mapping>>,
}

pub static GROWTH: Growth = Growth::new();

/// Bytes this process retains on `device` without a live allocation in them.
pub fn retained_bytes(device: usize) -> u64 {
    GROWTH.retained_bytes(device)
}

/// Pages of `page` bytes needed for `size` bytes (`None` for 0 or on overflow).
pub fn pages_for(size: u64, page: u64) -> Option<u64> {
    if size == 0 || page == 0 {
        return None;
    }
    Some(size.div_ceil(page))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a single push/pop/insert/remove: a panic elsewhere
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
                Retained {
                    page: AtomicU64::new(0),
                    free: Mutex::new(Vec::new()),
                    cached: Mutex::new(Vec::new()),
                }
            }; MAX_DEVICES],
            mappings: Mutex::new(BTreeMap::new()),
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

    /// Takes up to `n` retained pages of `device`.
    pub fn take_pages(&self, device: usize, n: u64) -> Vec<u64> {
        let Some(d) = self.devices.get(device) else {
            return Vec::new();
        };
        let mut free = lock(&d.free);
        let keep = free
            .len()
            .saturating_sub(n.try_into().unwrap_or(usize::MAX));
        free.split_off(keep)
    }

    /// Returns pages to `device`'s retained list.
    pub fn give_back(&self, device: usize, pages: impl IntoIterator<Item = u64>) {
        if let Some(d) = self.devices.get(device) {
            lock(&d.free).extend(pages);
        }
    }

    pub fn retained_bytes(&self, device: usize) -> u64 {
        self.devices.get(device).map_or(0, |d| {
            let cached: u64 = lock(&d.cached)
                .iter()
                .map(|(_, m)| m.pages.len() as u64)
                .sum();
            (lock(&d.free).len() as u64 + cached) * d.page.load(Acquire)
        })
    }

    /// Keeps a freed allocation mapped for reuse.
    pub fn cache(&self, base: u64, mapping: Mapping) {
        if let Some(d) = self.devices.get(mapping.device) {
            lock(&d.cached).push((base, mapping));
        }
    }

    /// A cached mapping of exactly `pages` pages, most recently freed first.
    pub fn take_cached(&self, device: usize, pages: usize) -> Option<(u64, Mapping)> {
        let d = self.devices.get(device)?;
        let mut cached = lock(&d.cached);
        let i = cached.iter().rposition(|(_, m)| m.pages.len() == pages)?;
        Some(cached.swap_remove(i))
    }

    /// Any cached mapping, to be unmapped so its pages can serve another size.
    pub fn evict_cached(&self, device: usize) -> Option<(u64, Mapping)> {
        lock(&self.devices.get(device)?.cached).pop()
    }

    /// Retained pages on `device` that are not mapped.
    pub fn loose_pages(&self, device: usize) -> u64 {
        self.devices
            .get(device)
            .map_or(0, |d| lock(&d.free).len() as u64)
    }

    pub fn record(&self, base: u64, mapping: Mapping) {
        lock(&self.mappings).insert(base, mapping);
    }

    /// Takes the mapping whose base is exactly `base`.
    pub fn remove(&self, base: u64) -> Option<Mapping> {
        lock(&self.mappings).remove(&base)
    }

    /// The base and requested size of the growth allocation containing `ptr`.
    pub fn range_of(&self, ptr: u64) -> Option<(u64, u64)> {
        let maps = lock(&self.mappings);
        let (&base, m) = maps.range(..=ptr).next_back()?;
        (ptr - base < m.size).then_some((base, m.size))
    }

    /// Whether any growth allocation is live (a cheap test for the free path).
    pub fn has_mappings(&self) -> bool {
        !lock(&self.mappings).is_empty()
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
        assert_eq!(g.remove(0x1000_0000), Some(m));
        assert!(!g.has_mappings());
    }
}
