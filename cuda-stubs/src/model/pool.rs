//! Stream-ordered memory pools (cuMemAllocAsync, cuMemPool*), modelled on the real driver's
//! accounting:
//!
//! - A pool holds `reserved` bytes of device memory (charged to the device), of which `used`
//!   are handed out. An allocation takes cached bytes (`reserved - used`) first and grows the
//!   reservation only by what is missing (OUT_OF_MEMORY if the device, or the pool's
//!   `maxSize`, has no room).
//! - cuMemFreeAsync gives the bytes back to the pool, not to the device: they stay
//!   reserved, and so stay in use on the device (cuMemGetInfo), until the pool releases them.
//! - A pool releases what it caches above its `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (default
//!   0) at the next synchronisation of its device (cuStreamSynchronize, cuCtxSynchronize,
//!   cuEventSynchronize), and down to `minBytesToKeep` at cuMemPoolTrimTo. It never
//!   releases bytes in use.
//! - A pool grows in chunks, as the real driver's do: by at least [`CHUNK`] (32 MiB), and by
//!   what is missing rounded up to the 2 MiB granularity beyond that (an H200 with driver
//!   580 reserved 32 MiB for a 1 MiB allocation). A chunk that does not fit the device or
//!   `maxSize` shrinks to what is missing, rounded up to 2 MiB where that fits. Released
//!   down to what the chunks of the bytes in use hold ([`Pool::held`]): no fragmentation
//!   beyond that, `used` stays byte-exact.

use super::HashMap;
use std::sync::Mutex;

use std::sync::LazyLock;

use super::device::{cfg, ledger};
use super::os::new_handle;
use crate::abi::types::{
    CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS, CU_MEMPOOL_ATTR_ALLOCATION_TYPE,
    CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES, CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED,
    CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID, CU_MEMPOOL_ATTR_LOCATION_ID, CU_MEMPOOL_ATTR_LOCATION_TYPE,
    CU_MEMPOOL_ATTR_MAX_POOL_SIZE,
};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult};
use fake_gpu::identity::MAX_DEVICES;
use libc::c_int;

/// The least a pool grows by (what an H200 with driver 580 reserved for 1 MiB).
pub const CHUNK: u64 = 32 << 20;
/// The granularity of pool memory (the VMM granularity).
const GRANULE: u64 = 2 << 20;

/// `n` rounded up to whole granules (saturating).
fn granules(n: u64) -> u64 {
    n.checked_next_multiple_of(GRANULE).unwrap_or(u64::MAX)
}

/// The first driver versions that know attributes 9..=14 and 15.
const LOCATION_ATTRS_SINCE: i32 = 13020;
const LOCALITY_ATTR_SINCE: i32 = 13040;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub dev: usize,
    pub is_default: bool,
    pub release_threshold: u64,
    /// Bytes charged to the device (handed out + cached).
    pub reserved: u64,
    /// Bytes handed out.
    pub used: u64,
    pub used_high: u64,
    pub reserved_high: u64,
    /// The three CU_MEMPOOL_ATTR_REUSE_* flags (stored, no effect).
    pub reuse: [c_int; 3],
    /// CUmemPoolProps.maxSize (0: no limit but the device).
    pub max_size: u64,
    /// CUmemPoolProps.handleTypes (0 for a default pool).
    pub handle_types: c_int,
    /// CUmemPoolProps.usage.
    pub usage: u16,
    /// CUmemAccess_flags of each device (ordinal) on the pool's memory: READWRITE for the
    /// pool's own device, NONE for the others until cuMemPoolSetAccess.
    pub access: [c_int; MAX_DEVICES],
    /// cuMemPoolDestroy'ed while allocations were outstanding: released as they are freed.
    destroyed: bool,
}

impl Pool {
    pub fn new(dev: usize, is_default: bool, max_size: u64) -> Pool {
        Pool {
            dev,
            is_default,
            release_threshold: 0,
            reserved: 0,
            used: 0,
            used_high: 0,
            reserved_high: 0,
            reuse: [1, 1, 1],
            max_size,
            handle_types: 0,
            usage: 0,
            access: std::array::from_fn(|d| {
                if d == dev {
                    CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                } else {
                    CU_MEM_ACCESS_FLAGS_PROT_NONE
                }
            }),
            destroyed: false,
        }
    }

    /// A read-only attribute of the pool's kind and place (CUDA 13.2+), as the driver of
    /// `driver_version` answers it: None if that driver does not know `attr`.
    pub fn kind_attribute(&self, attr: c_int, driver_version: i32) -> Option<u64> {
        let since = if attr == CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID {
            LOCALITY_ATTR_SINCE
        } else {
            LOCATION_ATTRS_SINCE
        };
        if driver_version < since {
            return None;
        }
        Some(match attr {
            CU_MEMPOOL_ATTR_ALLOCATION_TYPE => CU_MEM_ALLOCATION_TYPE_PINNED as u64,
            CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES => self.handle_types as u64,
            CU_MEMPOOL_ATTR_LOCATION_ID => self.dev as u64,
            CU_MEMPOOL_ATTR_LOCATION_TYPE => CU_MEM_LOCATION_TYPE_DEVICE as u64,
            CU_MEMPOOL_ATTR_MAX_POOL_SIZE => self.max_size,
            CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED => {
                (self.usage & CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS != 0) as u64
            }
            CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID => -1i64 as u64,
            _ => return None,
        })
    }

    /// Hands out `size` bytes: cached bytes first; `grow(n)` charges the device for the
    /// n bytes the pool has to add to its reservation.
    pub fn take(&mut self, size: u64, mut grow: impl FnMut(u64) -> CuResult) -> CuResult {
        let cached = self.reserved - self.used;
        if size > cached {
            let need = size - cached;
            // The room `maxSize` leaves (none: the device's).
            let room = match self.max_size {
                0 => u64::MAX - self.reserved,
                m => m.saturating_sub(self.reserved),
            };
            if need > room {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            // A whole chunk, else what is missing in granules, else exactly what is missing.
            let mut tries = [granules(need).max(CHUNK), granules(need), need];
            for t in &mut tries {
                *t = (*t).min(room);
            }
            let mut grown = Err(CUDA_ERROR_OUT_OF_MEMORY);
            for (i, &n) in tries.iter().enumerate() {
                if i > 0 && n == tries[i - 1] {
                    continue;
                }
                grown = grow(n).map(|()| n);
                if grown.is_ok() {
                    break;
                }
            }
            self.reserved += grown?;
        }
        self.used += size;
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved);
        Ok(())
    }

    /// What a release keeps: the chunks the bytes in use lie in (a chunk, or the bytes
    /// in use in whole granules), never more than is reserved.
    pub fn held(&self) -> u64 {
        match self.used {
            0 => 0,
            u => granules(u).max(CHUNK).min(self.reserved),
        }
    }

    /// Takes back `size` handed-out bytes (they stay reserved).
    pub fn give(&mut self, size: u64) {
        self.used = self.used.saturating_sub(size);
    }

    /// Releases cached bytes until at most `keep` are reserved (never bytes in use);
    /// returns how many bytes to give back to the device.
    pub fn trim(&mut self, keep: u64) -> u64 {
        let target = self.held().max(self.reserved.min(keep));
        let freed = self.reserved - target;
        self.reserved = target;
        freed
    }
}

#[derive(Default)]
struct Pools {
    pools: HashMap<usize, Pool>,
    default: Vec<usize>,
    current: Vec<usize>,
}

static POOLS: LazyLock<Mutex<Pools>> = LazyLock::new(Default::default);

fn pools() -> std::sync::MutexGuard<'static, Pools> {
    POOLS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pools {
    fn ensure(&mut self, dev: usize) {
        while self.default.len() <= dev {
            let d = self.default.len();
            let h = new_handle();
            self.pools.insert(h, Pool::new(d, true, 0));
            self.default.push(h);
            self.current.push(h);
        }
    }

    /// Trims `pool` to `keep` bytes and gives what it released back to the device.
    fn trim(&mut self, pool: usize, keep: u64) {
        let Some(p) = self.pools.get_mut(&pool) else {
            return;
        };
        let freed = p.trim(keep);
        let (dev, gone) = (p.dev, p.destroyed && p.used == 0);
        if gone {
            self.pools.remove(&pool);
        }
        if freed > 0
            && let Ok(l) = ledger()
        {
            l.uncharge(dev, freed);
        }
    }
}

/// Takes `size` bytes from `pool` for an allocation (linear::alloc).
pub fn take(pool: usize, size: u64) -> CuResult {
    let l = ledger()?;
    let mut ps = pools();
    let p = ps
        .pools
        .get_mut(&pool)
        .filter(|p| !p.destroyed)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let dev = p.dev;
    p.take(size, |n| l.charge(dev, n))
}

/// Gives the bytes of a freed allocation back to `pool` (linear::free).
pub fn give(pool: usize, size: u64) {
    let mut ps = pools();
    if let Some(p) = ps.pools.get_mut(&pool) {
        p.give(size);
        if p.destroyed {
            ps.trim(pool, 0);
        }
    }
}

/// A synchronisation point of `dev` (None: every device): each pool of the device releases
/// what it holds above its release threshold.
pub fn sync(dev: Option<usize>) {
    let mut ps = pools();
    let victims: Vec<(usize, u64)> = ps
        .pools
        .iter()
        .filter(|(_, p)| dev.is_none_or(|d| p.dev == d) && p.reserved > p.release_threshold)
        .map(|(&h, p)| (h, p.release_threshold))
        .collect();
    for (h, keep) in victims {
        ps.trim(h, keep);
    }
}

/// Bytes the pools of `dev` hold reserved.
pub fn reserved_of(dev: usize) -> u64 {
    pools()
        .pools
        .values()
        .filter(|p| p.dev == dev)
        .map(|p| p.reserved)
        .sum()
}

/// A live pool (not destroyed); CUDA_ERROR_INVALID_VALUE if there is none.
pub fn get(pool: usize) -> Result<Pool, CUresult> {
    cfg()?;
    pools()
        .pools
        .get(&pool)
        .filter(|p| !p.destroyed)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Changes a pool (destroyed or not) with `f`, under the lock; CUDA_ERROR_INVALID_VALUE if
/// there is no such pool.
pub fn update(pool: usize, f: impl FnOnce(&mut Pool) -> CuResult) -> CuResult {
    let mut ps = pools();
    let p = ps.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    f(p)
}

/// The default pool of `dev`.
pub fn default_of(dev: usize) -> usize {
    let mut ps = pools();
    ps.ensure(dev);
    ps.default[dev]
}

/// The pool cuMemAllocAsync uses on `dev`.
pub fn current_of(dev: usize) -> usize {
    let mut ps = pools();
    ps.ensure(dev);
    ps.current[dev]
}

/// Makes `pool` the current pool of `dev` (cuDeviceSetMemPool, cuMemSetMemPool).
pub fn set_current(dev: usize, pool: usize) -> CuResult {
    let mut ps = pools();
    ps.ensure(dev);
    match ps.pools.get(&pool) {
        Some(p) if p.dev == dev && !p.destroyed => {
            ps.current[dev] = pool;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// A new pool of `dev` with the given CUmemPoolProps values (cuMemPoolCreate).
pub fn create(dev: usize, max_size: u64, handle_types: c_int, usage: u16) -> usize {
    let h = new_handle();
    let mut ps = pools();
    ps.ensure(dev);
    let mut p = Pool::new(dev, false, max_size);
    (p.handle_types, p.usage) = (handle_types, usage);
    ps.pools.insert(h, p);
    h
}

/// cuMemPoolDestroy: a default pool cannot be destroyed; outstanding allocations stay
/// valid and the pool goes once they are freed; what it caches is released at once.
pub fn destroy(pool: usize) -> CuResult {
    let mut ps = pools();
    let p = ps
        .pools
        .get(&pool)
        .copied()
        .filter(|p| !p.destroyed)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if p.is_default {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if ps.current[p.dev] == pool {
        ps.current[p.dev] = ps.default[p.dev];
    }
    ps.pools.get_mut(&pool).unwrap().destroyed = true;
    ps.trim(pool, 0);
    Ok(())
}

/// cuMemPoolTrimTo: releases cached bytes down to `keep` (never bytes in use).
pub fn trim_to(pool: usize, keep: u64) {
    pools().trim(pool, keep);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn reuse_release_and_trim() {
        let mut device = 0u64;
        let mut p = Pool::new(0, true, 0);
        let mut grow = |n: u64| {
            device += n;
            Ok(())
        };
        p.take(MIB, &mut grow).unwrap();
        assert_eq!(
            (p.reserved, p.used),
            (32 * MIB, MIB),
            "a 32 MiB chunk for 1 MiB"
        );
        p.give(MIB);
        assert_eq!(
            (p.reserved, p.used),
            (32 * MIB, 0),
            "freed bytes stay reserved"
        );
        p.take(20 * MIB, &mut grow).unwrap();
        assert_eq!(
            (p.reserved, p.used),
            (32 * MIB, 20 * MIB),
            "cached bytes are reused"
        );
        p.take(20 * MIB, &mut grow).unwrap();
        assert_eq!(
            (p.reserved, p.used, p.reserved_high),
            (64 * MIB, 40 * MIB, 64 * MIB),
            "grows by a chunk when 8 MiB are missing"
        );
        p.take(60 * MIB + 1, &mut grow).unwrap();
        assert_eq!(
            p.reserved,
            64 * MIB + 38 * MIB,
            "36 MiB + 1 missing: 38 MiB of granules"
        );
        assert_eq!(device, p.reserved);
        p.give(60 * MIB + 1);
        assert_eq!(p.trim(50 * MIB), 52 * MIB, "keeps 50 MiB (40 in use)");
        assert_eq!(p.reserved, 50 * MIB);
        assert_eq!(p.trim(0), 10 * MIB, "never below the chunks in use");
        assert_eq!(
            (p.reserved, p.used, p.used_high),
            (40 * MIB, 40 * MIB, 100 * MIB + 1)
        );
        p.give(39 * MIB);
        assert_eq!(p.trim(0), 8 * MIB, "1 MiB in use keeps its chunk");
        p.give(MIB);
        assert_eq!(p.trim(0), 32 * MIB, "nothing in use: everything goes");
        assert_eq!(p.reserved, 0);
    }

    #[test]
    fn max_size_and_device_refusals() {
        let mut p = Pool::new(0, false, 40 * MIB);
        assert_eq!(p.take(41 * MIB, |_| Ok(())), Err(CUDA_ERROR_OUT_OF_MEMORY));
        p.take(MIB, |_| Ok(())).unwrap();
        assert_eq!(p.reserved, 32 * MIB);
        p.take(35 * MIB, |_| Ok(())).unwrap();
        assert_eq!(
            (p.reserved, p.used),
            (40 * MIB, 36 * MIB),
            "a chunk cut to maxSize"
        );
        assert_eq!(p.take(5 * MIB, |_| Ok(())), Err(CUDA_ERROR_OUT_OF_MEMORY));
        // A device without room for a chunk: what is missing, in granules, then exactly.
        let mut p = Pool::new(0, false, 0);
        p.take(MIB + 1, |n| {
            if n <= 3 * MIB {
                Ok(())
            } else {
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        })
        .unwrap();
        assert_eq!(p.reserved, 2 * MIB);
        let mut p = Pool::new(0, false, 0);
        p.take(MIB + 1, |n| {
            if n <= MIB + 1 {
                Ok(())
            } else {
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        })
        .unwrap();
        assert_eq!(p.reserved, MIB + 1);
        assert_eq!(
            p.take(50, |_| Err(CUDA_ERROR_OUT_OF_MEMORY)),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
        assert_eq!((p.reserved, p.used), (MIB + 1, MIB + 1));
        assert_eq!(p.take(u64::MAX, |_| Ok(())), Err(CUDA_ERROR_OUT_OF_MEMORY));
    }
}
