//! The ledger: how much memory each device has and what this process holds of it, counted
//! the way the stats file reports it. With FAKECUDA_SHARED, taking memory goes through the
//! shared state file so that all processes together stay within each device.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::{CUDA_ERROR_OUT_OF_MEMORY, CuResult};
use fake_gpu::shared::Shared;

/// Counters of one device (this process's view).
#[derive(Debug, Default)]
pub struct DevLedger {
    used: AtomicU64,
    peak: AtomicU64,
    alloc_calls: AtomicU64,
    free_calls: AtomicU64,
    failed_alloc_calls: AtomicU64,
    context_mem: AtomicU64,
    contexts_created: AtomicU64,
}

/// A snapshot of one device's counters (for cuMemGetInfo and the stats file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DevStats {
    pub total: u64,
    /// Bytes this process holds (allocations, pool reservations, contexts).
    pub used: u64,
    /// Highest `used`.
    pub peak: u64,
    pub alloc_calls: u64,
    pub free_calls: u64,
    pub failed_alloc_calls: u64,
    /// Bytes held by this process's live contexts (FAKECUDA_CONTEXT_MEM each).
    pub context_mem: u64,
    /// Contexts the driver made on the device: created ones and primary-context
    /// activations (a retain of an inactive primary context).
    pub contexts_created: u64,
    /// Bytes the memory pools of the device hold reserved (in use or cached).
    pub pool_reserved: u64,
    /// Highest total use of all processes (FAKECUDA_SHARED), else `peak`.
    pub shared_peak: u64,
    /// The physical device behind the ordinal (CUDA_VISIBLE_DEVICES).
    pub phys: usize,
}

/// How much memory each device has and uses. Lock-free without FAKECUDA_SHARED; with it,
/// taking memory goes through the shared file so that all processes together stay within
/// the device. `used` never exceeds `total`.
pub struct Ledger {
    total: u64,
    devs: Vec<DevLedger>,
    /// Physical device of each ordinal.
    phys: Vec<usize>,
    shared: Option<Shared>,
}

impl Ledger {
    /// A process-local ledger of `devices` devices.
    #[cfg(test)]
    pub fn new(devices: usize, total: u64) -> Self {
        Self::with((0..devices).collect(), total, None)
    }

    pub fn with(phys: Vec<usize>, total: u64, shared: Option<Shared>) -> Self {
        Ledger {
            total,
            devs: phys.iter().map(|_| DevLedger::default()).collect(),
            phys,
            shared,
        }
    }

    /// Takes `size` bytes of `dev` without counting a call: OUT_OF_MEMORY when the device
    /// (all processes sharing it) would go over total (checked, so huge sizes never wrap).
    pub fn charge(&self, dev: usize, size: u64) -> CuResult {
        let d = &self.devs[dev];
        let prev = match &self.shared {
            Some(sh) => {
                if !sh.reserve(self.phys[dev], size) {
                    return Err(CUDA_ERROR_OUT_OF_MEMORY);
                }
                d.used.fetch_add(size, Ordering::AcqRel)
            }
            None => d
                .used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                    used.checked_add(size).filter(|&n| n <= self.total)
                })
                .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?,
        };
        d.peak.fetch_max(prev + size, Ordering::AcqRel);
        Ok(())
    }

    /// Gives back `size` bytes of `dev` without counting a call.
    pub fn uncharge(&self, dev: usize, size: u64) {
        self.devs[dev].used.fetch_sub(size, Ordering::AcqRel);
        if let Some(sh) = &self.shared {
            sh.release(self.phys[dev], size);
        }
    }

    /// Takes `size` bytes of `dev`, counting one allocation call (or a failed one).
    pub fn reserve(&self, dev: usize, size: u64) -> CuResult {
        let res = self.charge(dev, size);
        self.count_alloc(dev, res.is_ok());
        res
    }

    /// Counts an allocation call that succeeded or was refused for lack of memory.
    pub fn count_alloc(&self, dev: usize, ok: bool) {
        let d = &self.devs[dev];
        if ok {
            d.alloc_calls.fetch_add(1, Ordering::Relaxed);
        } else {
            d.failed_alloc_calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives back `size` bytes of `dev`; `call` counts it as a free call.
    pub fn release(&self, dev: usize, size: u64, call: bool) {
        self.uncharge(dev, size);
        if call {
            self.count_free_call(dev);
        }
    }

    /// Counts a free call whose bytes are given back later (or not at all: pools).
    pub fn count_free_call(&self, dev: usize) {
        self.devs[dev].free_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Undoes a `reserve` that did not end in an allocation (e.g. mmap failed).
    pub fn unreserve(&self, dev: usize, size: u64) {
        self.uncharge(dev, size);
        let d = &self.devs[dev];
        d.alloc_calls.fetch_sub(1, Ordering::Relaxed);
        d.failed_alloc_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes the memory of a new context (not an allocation call) and counts it.
    pub fn charge_context(&self, dev: usize, size: u64) -> CuResult {
        if size > 0 {
            self.charge(dev, size)?;
            self.devs[dev].context_mem.fetch_add(size, Ordering::AcqRel);
        }
        self.devs[dev]
            .contexts_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back the memory of a destroyed context.
    pub fn release_context(&self, dev: usize, size: u64) {
        if size == 0 {
            return;
        }
        self.devs[dev].context_mem.fetch_sub(size, Ordering::AcqRel);
        self.uncharge(dev, size);
    }

    /// Bytes of `dev` in use: by all live processes sharing it, else by this one.
    pub fn device_used(&self, dev: usize) -> u64 {
        match &self.shared {
            Some(sh) => sh.used(self.phys[dev]),
            None => self.devs[dev].used.load(Ordering::Acquire),
        }
    }

    pub fn stats(&self, dev: usize) -> DevStats {
        let d = &self.devs[dev];
        let peak = d.peak.load(Ordering::Acquire);
        DevStats {
            total: self.total,
            used: d.used.load(Ordering::Acquire),
            peak,
            alloc_calls: d.alloc_calls.load(Ordering::Relaxed),
            free_calls: d.free_calls.load(Ordering::Relaxed),
            failed_alloc_calls: d.failed_alloc_calls.load(Ordering::Relaxed),
            context_mem: d.context_mem.load(Ordering::Acquire),
            contexts_created: d.contexts_created.load(Ordering::Relaxed),
            pool_reserved: 0,
            shared_peak: match &self.shared {
                Some(sh) => sh.peak(self.phys[dev]),
                None => peak,
            },
            phys: self.phys[dev],
        }
    }

    pub fn devices(&self) -> usize {
        self.devs.len()
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// The physical device of ordinal `dev`.
    pub fn phys(&self, dev: usize) -> usize {
        self.phys[dev]
    }

    /// This process's bytes on physical device `phys` (None if it is not visible).
    pub fn used_of_phys(&self, phys: usize) -> Option<u64> {
        let dev = self.phys.iter().position(|&p| p == phys)?;
        Some(self.devs[dev].used.load(Ordering::Acquire))
    }

    /// At exit: leave the shared file (memory given back to the other processes).
    pub fn leave_shared(&self) {
        if let Some(sh) = &self.shared {
            sh.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reserve_and_release_track_used_and_peak() {
        let l = Ledger::new(2, 1000);
        l.reserve(0, 600).unwrap();
        l.reserve(0, 400).unwrap();
        assert_eq!(l.reserve(0, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
        l.release(0, 600, true);
        l.reserve(0, 100).unwrap();
        let s = l.stats(0);
        assert_eq!(
            (
                s.used,
                s.peak,
                s.alloc_calls,
                s.free_calls,
                s.failed_alloc_calls
            ),
            (500, 1000, 3, 1, 1)
        );
        assert_eq!(l.stats(1).used, 0);
    }

    #[test]
    fn huge_sizes_do_not_wrap() {
        let l = Ledger::new(1, u64::MAX - 10);
        l.reserve(0, 100).unwrap();
        assert_eq!(l.reserve(0, u64::MAX), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(l.reserve(0, u64::MAX - 50), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(l.stats(0).used, 100);
    }

    #[test]
    fn concurrent_reservations_never_exceed_total() {
        let l = Arc::new(Ledger::new(1, 1 << 20));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        if l.reserve(0, 4096).is_ok() {
                            assert!(l.stats(0).used <= 1 << 20);
                            l.release(0, 4096, true);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = l.stats(0);
        assert_eq!(s.used, 0);
        assert!(s.peak <= 1 << 20 && s.peak >= 4096);
        assert_eq!(s.alloc_calls, s.free_calls);
    }
}
