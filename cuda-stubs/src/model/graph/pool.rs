//! Each device's graph memory pool: what it reserves, what is bound to executable graphs
//! and what graph allocations use (see `model::graph`).

/// The granularity of graph memory (the VMM granularity).
pub const GRANULE: u64 = 2 << 20;

/// `n` in whole granules (saturating).
pub fn granules(n: u64) -> u64 {
    n.checked_next_multiple_of(GRANULE).unwrap_or(u64::MAX)
}

/// One device's graph memory pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphPool {
    /// Bytes of device memory the pool holds (charged to the device).
    pub reserved: u64,
    pub reserved_high: u64,
    /// Bytes of graph allocations live now.
    pub used: u64,
    pub used_high: u64,
    /// Bytes of `reserved` bound to executable graphs (or to their live allocations).
    pub bound: u64,
}

impl GraphPool {
    /// What binding `need` more bytes grows the reservation by: what the unbound part
    /// cannot serve.
    pub fn growth(&self, need: u64) -> u64 {
        need.saturating_sub(self.reserved - self.bound)
    }

    /// Binds `need` bytes, the reservation having grown by `grown` ([`growth`](Self::growth)).
    pub fn bind(&mut self, need: u64, grown: u64) {
        self.reserved += grown;
        self.bound += need;
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// Gives back every byte not bound; returns how many.
    pub fn trim(&mut self) -> u64 {
        let freed = self.reserved - self.bound;
        self.reserved = self.bound;
        freed
    }

    pub fn allocated(&mut self, bytes: u64) {
        self.used += bytes;
        self.used_high = self.used_high.max(self.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn binding_takes_unbound_memory_first_and_trim_gives_back_the_unbound() {
        let mut p = GraphPool::default();
        assert_eq!(p.growth(600 * MIB), 600 * MIB);
        p.bind(600 * MIB, 600 * MIB);
        assert_eq!(p.growth(100 * MIB), 100 * MIB, "all of it is bound");
        p.bound -= 600 * MIB; // the exec is destroyed: cached
        assert_eq!(p.growth(100 * MIB), 0, "served from the cache");
        p.bind(100 * MIB, 0);
        assert_eq!(p.growth(600 * MIB), 100 * MIB);
        assert_eq!(p.trim(), 500 * MIB);
        assert_eq!(
            (p.reserved, p.bound, p.reserved_high),
            (100 * MIB, 100 * MIB, 600 * MIB)
        );
    }

    #[test]
    fn graph_memory_is_granular() {
        assert_eq!(granules(1), GRANULE);
        assert_eq!(granules(3 * MIB), 4 * MIB);
        assert_eq!(granules(u64::MAX), u64::MAX);
    }
}
