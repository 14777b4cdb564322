//! What the pool book asks of the driver: a pool's reserved and used bytes and its trim
//! (`PoolDriver`), where a pool's memory is (`PoolLocator`), and how much a pool may
//! grow by for one allocation (`growth_bound`).

/// The most a pool may grow by to serve an allocation of `bytes`: a driver's pool grows
/// by whole chunks, at least 32 MiB, in 2 MiB granules (an H200 with driver 580 reserved
/// 32 MiB for a 1 MiB allocation: tests/driver-answers/h200-580.159.04.json). The hooks
/// reserve this much before the driver is called (and settle to what the pool really
/// reserved after), so the device never holds more than the cap, even for an instant.
pub fn growth_bound(bytes: u64) -> u64 {
    const CHUNK: u64 = 32 << 20;
    const GRANULE: u64 = 2 << 20;
    bytes
        .checked_next_multiple_of(GRANULE)
        .unwrap_or(u64::MAX)
        .max(CHUNK)
}

/// What the book needs from the driver about one pool.
pub trait PoolDriver {
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`; None if the driver does not answer (the
    /// pool is gone).
    fn reserved(&self, pool: u64) -> Option<u64>;
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
    fn used(&self, pool: u64) -> Option<u64>;
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`: what the pool keeps reserved at a
    /// synchronisation; None if the driver does not answer.
    fn release_threshold(&self, pool: u64) -> Option<u64>;
    /// `cuMemPoolTrimTo(pool, keep)`.
    fn trim_to(&self, pool: u64, keep: u64);
}

/// Where a pool's memory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLocation {
    /// Device memory of this CUDA ordinal.
    Device(usize),
    /// Host memory (pinned, or of a NUMA node): not device memory, not counted.
    Host,
}

/// What the driver says of a pool's own location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationAnswer {
    At(PoolLocation),
    /// A pool this process cannot see the memory of (imported from elsewhere).
    Invisible,
    /// The driver does not answer (no such attribute before CUDA 13).
    Silent,
}

/// What the book asks the driver to locate a pool the shim did not see created.
pub trait PoolLocator {
    /// `CU_MEMPOOL_ATTR_LOCATION_TYPE` and `_ID` (CUDA 13).
    fn location(&self, pool: u64) -> LocationAnswer;
    /// The number of CUDA devices.
    fn device_count(&self) -> usize;
    /// Whether `pool` is `device`'s default pool or its current pool.
    fn is_device_pool(&self, device: usize, pool: u64) -> bool;
}
