//! What NVML reports under a cap (`nvmlDeviceGetMemoryInfo`, `_v2`), so that
//! `nvidia-smi`, `nvidia-ml-py`/`pynvml` and the frameworks that read NVML agree with
//! `cuMemGetInfo`: the total is the cap, the free memory the same capped figure
//! `cuMemGetInfo` shows for the device, and used (plus, in `_v2`, reserved) the rest.
//!
//! The NVML device is matched to a CUDA ordinal by UUID (see `identity`); a GPU that
//! CUDA does not see in this process, or one without a cap, is shown as the driver
//! reports it. NVML users such as `nvidia-smi` never initialise CUDA: the hook calls
//! `cuInit(0)`, `cuDeviceGetCount` and `cuDeviceGetUuid_v2` itself, once, to learn
//! the visible devices.

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

/// An NVML memory struct: the driver's figures, and the same struct under a cap.
pub trait MemoryInfo: Copy {
    /// `(free, total)` as the driver reported them.
    fn free_total(&self) -> (u64, u64);
    /// The struct with `(free, total)` as the program should see them.
    fn capped(self, free_total: (u64, u64)) -> Self;
}

impl MemoryInfo for NvmlMemory {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn capped(self, free_total: (u64, u64)) -> Self {
        capped(self, free_total)
    }
}

impl MemoryInfo for NvmlMemoryV2 {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
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

/// The v2 figures: the driver's reserved memory stays reserved, as far as the capped
/// total leaves room for it.
pub fn capped_v2(driver: NvmlMemoryV2, (free, total): (u64, u64)) -> NvmlMemoryV2 {
    let free = free.min(total);
    let reserved = driver.reserved.min(total - free);
    NvmlMemoryV2 {
        version: driver.version,
        total,
        reserved,
        free,
        used: total - free - reserved,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    #[test]
    fn v1_shows_the_cap() {
        let driver = NvmlMemory {
            total: 80 * GI,
            free: 70 * GI,
            used: 10 * GI,
        };
        assert_eq!(
            capped(driver, (3 * GI, 4 * GI)),
            NvmlMemory {
                total: 4 * GI,
                free: 3 * GI,
                used: GI
            }
        );
        assert_eq!(capped(driver, (5 * GI, 4 * GI)).used, 0, "never negative");
    }

    #[test]
    fn v2_keeps_reserved_within_the_cap() {
        let driver = NvmlMemoryV2 {
            version: 0x0200_0028,
            total: 80 * GI,
            reserved: GI / 2,
            free: 70 * GI,
            used: 9 * GI,
        };
        let v = capped_v2(driver, (3 * GI, 4 * GI));
        assert_eq!(
            v,
            NvmlMemoryV2 {
                version: 0x0200_0028,
                total: 4 * GI,
                reserved: GI / 2,
                free: 3 * GI,
                used: GI / 2
            }
        );
        assert_eq!(v.reserved + v.used + v.free, v.total);
        let v = capped_v2(driver, (4 * GI, 4 * GI));
        assert_eq!(
            (v.reserved, v.used),
            (0, 0),
            "reserved never pushes used below zero"
        );
    }
}
