//! Physical memory (cuMemCreate, cuMemRelease, cuMemRetainAllocationHandle,
//! cuMemGetAllocationPropertiesFromHandle): a handle's bytes, a range of its device's
//! arena memfd or a memfd of its own, charged to the device until its last reference
//! (handle, mapping or multicast binding) goes.

use libc::c_int;

use super::{Vmm, vmm};
use crate::abi::types::{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CUmemAllocationProp};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult};
use crate::model::device::ledger;

/// Where a physical allocation's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Backing {
    /// `[off, off+size)` of the device's arena.
    Arena { off: u64 },
    /// A memfd of its own (exportable), from offset 0.
    Own { fd: c_int },
}

pub(in crate::model) struct Phys {
    pub(super) backing: Backing,
    pub(in crate::model) size: usize,
    pub(in crate::model) dev: usize,
    pub(super) prop: CUmemAllocationProp,
    /// cuMemCreate / cuMemRetainAllocationHandle / import references not yet released,
    /// and one per multicast binding of the memory (see `model::multicast`).
    pub(in crate::model) handle_refs: u32,
    pub(super) mappings: u32,
    /// Imported from another handle's fd: the exporter pays for it, not this handle.
    pub(super) imported: bool,
    /// Host memory (a `CU_MEM_LOCATION_TYPE_HOST*` location): no device's memory, so
    /// never charged to `dev` (which is then only the device its mappings name).
    pub(super) host: bool,
    /// A multicast object (`model::multicast`): no memory of its own.
    pub(super) multicast: bool,
}

impl Phys {
    /// Whether the handle's bytes are charged to its device by this process.
    pub(super) fn charged(&self) -> bool {
        !self.imported && !self.host && !self.multicast
    }

    /// Whether the handle is device memory a multicast object can bind.
    pub(in crate::model) fn bindable(&self) -> bool {
        !self.host && !self.multicast
    }
}

/// One sparse memfd per device from which handles take ranges: the end only grows (a
/// 64-bit offset space never runs out), released ranges are punched out.
pub(super) struct Arena {
    fd: c_int,
    end: u64,
    /// The file's size (grown in steps, sparse).
    cap: u64,
}

const ARENA_STEP: u64 = 1 << 40;

impl Arena {
    pub(super) fn new(phys: usize) -> Option<Arena> {
        let name = std::ffi::CString::new(format!("fakecuda-arena-d{phys}")).unwrap();
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        (fd >= 0).then_some(Arena { fd, end: 0, cap: 0 })
    }

    pub(super) fn take(&mut self, size: u64) -> Option<u64> {
        let off = self.end;
        let end = off.checked_add(size).filter(|&e| e <= i64::MAX as u64)?;
        if end > self.cap {
            let cap = end.div_ceil(ARENA_STEP) * ARENA_STEP;
            // SAFETY: growing our own sparse memfd (no memory is committed).
            if unsafe { libc::ftruncate(self.fd, cap as libc::off_t) } != 0 {
                return None;
            }
            self.cap = cap;
        }
        self.end = end;
        Some(off)
    }

    pub(super) fn punch(&self, off: u64, size: u64) {
        // SAFETY: frees the pages of a range of our own memfd that nothing maps any more.
        unsafe {
            libc::fallocate(
                self.fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                size as libc::off_t,
            )
        };
    }
}

/// A fresh memfd of `size` bytes named after the physical device (so an importer can tell).
fn own_memfd(phys: usize, size: usize) -> Option<c_int> {
    own_memfd_named(&format!("fakecuda-vmm-d{phys}"), size)
}

/// A memfd named `name`, of `size` bytes (sparse).
pub(super) fn own_memfd_named(name: &str, size: usize) -> Option<c_int> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: sizing the memfd just created.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// Registers `p` under a new handle number.
pub(super) fn new_handle(v: &mut Vmm, p: Phys) -> u64 {
    v.next_handle += 1;
    let h = 0xfac0_0000_0000 + v.next_handle;
    v.phys.insert(h, p);
    h
}

impl Vmm {
    /// Drops one reference (a multicast binding's) to `handle`; frees it if none are left.
    pub(in crate::model) fn unhold(&mut self, handle: u64) {
        if let Some(p) = self.phys.get_mut(&handle) {
            p.handle_refs = p.handle_refs.saturating_sub(1);
        }
        self.maybe_destroy(handle);
    }

    /// Drops one reference (handle or mapping); frees the memory when none are left (a
    /// multicast object's bindings with it).
    pub(super) fn maybe_destroy(&mut self, handle: u64) {
        let done = self
            .phys
            .get(&handle)
            .is_some_and(|p| p.handle_refs == 0 && p.mappings == 0);
        if done {
            let p = self.phys.remove(&handle).unwrap();
            if p.multicast {
                self.multicast_devices.remove(&handle);
                let bound: Vec<_> = self
                    .bindings
                    .range((handle, 0, 0)..=(handle, usize::MAX, usize::MAX))
                    .map(|(&k, _)| k)
                    .collect();
                for k in bound {
                    let b = self.bindings.remove(&k).unwrap();
                    self.unhold(b.handle);
                }
            }
            match p.backing {
                Backing::Arena { off } => {
                    if let Some(a) = self.arenas.get(&p.dev) {
                        a.punch(off, p.size as u64);
                    }
                }
                // SAFETY: closing the memfd this library owns; mappings keep their own reference.
                Backing::Own { fd } => unsafe {
                    libc::close(fd);
                },
            }
            if p.charged()
                && let Ok(l) = ledger()
            {
                l.release(p.dev, p.size as u64, false);
            }
        }
    }

    /// The fd and file offset where handle's byte 0 lives.
    pub(super) fn fd_of(&self, p: &Phys) -> Option<(c_int, u64)> {
        match p.backing {
            Backing::Arena { off } => self.arenas.get(&p.dev).map(|a| (a.fd, off)),
            Backing::Own { fd } => Some((fd, 0)),
        }
    }
}

/// A new physical allocation of `size` bytes of `dev` (cuMemCreate), charged to the device:
/// a range of the device's arena, or a memfd of its own if `prop` asks for an exportable
/// handle. `dev` None: host memory (a host or host-NUMA location), a memfd of its own
/// charged to no device.
pub fn create(dev: Option<usize>, size: usize, prop: CUmemAllocationProp) -> Result<u64, CUresult> {
    let ledger = ledger()?;
    let mut v = vmm();
    let backing = match dev {
        None => own_memfd_named("fakecuda-host", size).map(|fd| Backing::Own { fd }),
        Some(dev) => {
            ledger.reserve(dev, size as u64)?;
            let b = if prop.requested_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0 {
                own_memfd(ledger.phys(dev), size).map(|fd| Backing::Own { fd })
            } else {
                if !v.arenas.contains_key(&dev)
                    && let Some(a) = Arena::new(ledger.phys(dev))
                {
                    v.arenas.insert(dev, a);
                }
                v.arenas
                    .get_mut(&dev)
                    .and_then(|a| a.take(size as u64))
                    .map(|off| Backing::Arena { off })
            };
            if b.is_none() {
                ledger.unreserve(dev, size as u64);
            }
            b
        }
    };
    let Some(backing) = backing else {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    let h = new_handle(
        &mut v,
        Phys {
            backing,
            size,
            dev: dev.unwrap_or(0),
            prop,
            handle_refs: 1,
            mappings: 0,
            imported: false,
            host: dev.is_none(),
            multicast: false,
        },
    );
    Ok(h)
}

/// Drops a handle reference (cuMemRelease); the memory goes with the last reference.
pub fn release(handle: u64) -> CuResult {
    let mut v = vmm();
    let p = v
        .phys
        .get_mut(&handle)
        .filter(|p| p.handle_refs > 0)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    p.handle_refs -= 1;
    if p.charged()
        && let Ok(l) = ledger()
    {
        l.count_free_call(p.dev);
    }
    v.maybe_destroy(handle);
    Ok(())
}

/// One more reference to the handle mapped at `addr` (cuMemRetainAllocationHandle).
pub fn retain(addr: usize) -> Result<u64, CUresult> {
    let mut v = vmm();
    let (_, m) = v.mapping_at(addr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    v.phys
        .get_mut(&m.handle)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .handle_refs += 1;
    Ok(m.handle)
}

/// The CUmemAllocationProp a handle was created with.
pub fn properties(handle: u64) -> Result<CUmemAllocationProp, CUresult> {
    vmm()
        .phys
        .get(&handle)
        .map(|p| p.prop)
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}
