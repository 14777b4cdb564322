//! Whole pages of one device: the pages no allocation uses (loose, unmapped) and
//! freed page allocations kept mapped for a request of the same page count.

use std::sync::Mutex;

use super::lock;

/// One allocation served with whole pages (or a slab's pages, when it is unmapped).
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

/// Pages of `page` bytes needed for `size` bytes (`None` for 0 or on overflow).
pub fn pages_for(size: u64, page: u64) -> Option<u64> {
    if size == 0 || page == 0 {
        return None;
    }
    Some(size.div_ceil(page))
}

/// A device's retained pages outside slabs.
pub struct Pages {
    /// Pages the process owns that no allocation uses, unmapped.
    loose: Mutex<Vec<u64>>,
    /// Freed allocations kept mapped, by base address: a later request for the same
    /// number of pages takes one whole, with no driver call. Their pages count as
    /// retained, and are unmapped into `loose` when a request of another size needs
    /// them.
    cached: Mutex<Vec<(u64, Mapping)>>,
}

impl Default for Pages {
    fn default() -> Self {
        Self::new()
    }
}

impl Pages {
    pub const fn new() -> Self {
        Pages {
            loose: Mutex::new(Vec::new()),
            cached: Mutex::new(Vec::new()),
        }
    }

    /// Takes up to `n` loose pages.
    pub fn take(&self, n: u64) -> Vec<u64> {
        let mut loose = lock(&self.loose);
        let keep = loose
            .len()
            .saturating_sub(n.try_into().unwrap_or(usize::MAX));
        loose.split_off(keep)
    }

    pub fn give_back(&self, pages: impl IntoIterator<Item = u64>) {
        lock(&self.loose).extend(pages);
    }

    pub fn loose(&self) -> u64 {
        lock(&self.loose).len() as u64
    }

    /// Pages in cached mappings.
    pub fn cached(&self) -> u64 {
        lock(&self.cached)
            .iter()
            .map(|(_, m)| m.pages.len() as u64)
            .sum()
    }

    pub fn cache(&self, base: u64, mapping: Mapping) {
        lock(&self.cached).push((base, mapping));
    }

    /// A cached mapping of exactly `pages` pages, most recently freed first.
    pub fn take_cached(&self, pages: usize) -> Option<(u64, Mapping)> {
        let mut cached = lock(&self.cached);
        let i = cached.iter().rposition(|(_, m)| m.pages.len() == pages)?;
        Some(cached.swap_remove(i))
    }

    pub fn evict_cached(&self) -> Option<(u64, Mapping)> {
        lock(&self.cached).pop()
    }
}
