//! A device's memory as NVML reports it under a cap (`nvmlMemory_t`, `nvmlMemory_v2_t`):
//! the driver's figures capped, alone, in a pool, or for a process that holds nothing.

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`: `total = reserved + used + free`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlMemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`'s version word: its size, and 2 in the top byte.
pub const MEMORY_V2_VERSION: u32 = std::mem::size_of::<NvmlMemoryV2>() as u32 | (2 << 24);

/// An NVML memory struct: the driver's figures, and the same struct under a cap.
pub trait MemoryInfo: Copy {
    /// `(free, total)` as the driver reported them.
    fn free_total(&self) -> (u64, u64);
    /// What the driver keeps back of the total, where the struct says it (v2).
    fn reserved(&self) -> Option<u64>;
    /// The struct with `(free, total)` as the program should see them.
    fn capped(self, free_total: (u64, u64)) -> Self;
}

impl MemoryInfo for NvmlMemory {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn reserved(&self) -> Option<u64> {
        None
    }
    fn capped(self, free_total: (u64, u64)) -> Self {
        capped(self, free_total)
    }
}

impl MemoryInfo for NvmlMemoryV2 {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn reserved(&self) -> Option<u64> {
        Some(self.reserved)
    }
    fn capped(self, free_total: (u64, u64)) -> Self {
        capped_v2(self, free_total)
    }
}

/// The v1 figures given the capped `(free, total)` `cuMemGetInfo` would show.
pub fn capped(_driver: NvmlMemory, (free, total): (u64, u64)) -> NvmlMemory {
    NvmlMemory {
        total,
        free,
        used: total - free.min(total),
    }
}

/// The v2 figures: as v1's, with nothing reserved. The driver's reserved memory lies
/// outside what gpucap charges, so inside a cap every byte that is not free is used by
/// the program (or the pool): `used` agrees with v1's, with `cuMemGetInfo` and with the
/// pool's figure. Keeping the driver's reserved (614 MiB on an H200, driver 580) made
/// `nvidia-smi`, which reads `_v2`, show a pool's used that much below what its members
/// hold (seen on an H200 by the real-GPU check `pool-pidns`).
pub fn capped_v2(driver: NvmlMemoryV2, (free, total): (u64, u64)) -> NvmlMemoryV2 {
    let free = free.min(total);
    NvmlMemoryV2 {
        version: driver.version,
        total,
        reserved: 0,
        free,
        used: total - free,
    }
}

/// `(free, total)` of a pool's GPU capped at `cap` of which the pool's members hold
/// `pool_used`: total = min(physical, cap), free = min(physical free, cap - pool used).
pub fn within_pool((free, total): (u64, u64), cap: u64, pool_used: u64) -> (u64, u64) {
    let total = total.min(cap);
    (free.min(cap.saturating_sub(pool_used)).min(total), total)
}

/// `(free, total)` under a cap of `cap` bytes for a process that holds nothing on the
/// device (it has not initialised CUDA): what `cuMemGetInfo` would show it.
pub fn within_cap((free, total): (u64, u64), cap: u64) -> (u64, u64) {
    let total = total.min(cap);
    (free.min(total), total)
}
