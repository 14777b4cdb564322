//! Virtual memory management (cuMemCreate / cuMemAddressReserve / cuMemMap ...) and
//! shareable handles (cuMemExportToShareableHandle / cuMemImportFromShareableHandle).
//!
//! A physical allocation is a range of a per-device "arena" memfd (sparse, so no RAM until
//! touched): the arena grows by bumping its end and a released range is punched out, so
//! thousands of handles cost one fd. A handle created with
//! `requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` gets a memfd of its own
//! instead, so that it can be exported as an fd. cuMemMap maps the range MAP_SHARED|MAP_FIXED
//! into a PROT_NONE reservation, so several mappings alias the same bytes. Mappings stay
//! PROT_NONE until cuMemSetAccess, as on a real GPU.

use std::collections::BTreeMap;

use super::HashMap;
use std::sync::Mutex;

use std::sync::LazyLock;

use super::ctx::current;
use super::device::ledger;
use super::os::{page_size, unmap};
use crate::abi::types::*;
use crate::abi::*;
use libc::{c_int, c_void};

pub const GRANULARITY: usize = 2 << 20;

/// Where a physical allocation's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// `[off, off+size)` of the device's arena.
    Arena { off: u64 },
    /// A memfd of its own (exportable), from offset 0.
    Own { fd: c_int },
}

pub(super) struct Phys {
    backing: Backing,
    pub(super) size: usize,
    pub(super) dev: usize,
    prop: CUmemAllocationProp,
    /// cuMemCreate / cuMemRetainAllocationHandle / import references not yet released,
    /// and one per multicast binding of the memory (see `model::multicast`).
    pub(super) handle_refs: u32,
    mappings: u32,
    /// Imported from another handle's fd: the exporter pays for it, not this handle.
    imported: bool,
    /// Host memory (a `CU_MEM_LOCATION_TYPE_HOST*` location): no device's memory, so
    /// never charged to `dev` (which is then only the device its mappings name).
    host: bool,
    /// A multicast object (`model::multicast`): no memory of its own.
    multicast: bool,
}

impl Phys {
    /// Whether the handle's bytes are charged to its device by this process.
    fn charged(&self) -> bool {
        !self.imported && !self.host && !self.multicast
    }

    /// Whether the handle is device memory a multicast object can bind.
    pub(super) fn bindable(&self) -> bool {
        !self.host && !self.multicast
    }
}

/// One sparse memfd per device from which handles take ranges: the end only grows (a
/// 64-bit offset space never runs out), released ranges are punched out.
struct Arena {
    fd: c_int,
    end: u64,
    /// The file's size (grown in steps, sparse).
    cap: u64,
}

const ARENA_STEP: u64 = 1 << 40;

impl Arena {
    fn new(phys: usize) -> Option<Arena> {
        let name = std::ffi::CString::new(format!("fakecuda-arena-d{phys}")).unwrap();
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        (fd >= 0).then_some(Arena { fd, end: 0, cap: 0 })
    }

    fn take(&mut self, size: u64) -> Option<u64> {
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

    fn punch(&self, off: u64, size: u64) {
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
fn own_memfd_named(name: &str, size: usize) -> Option<c_int> {
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

/// A mapping of (part of) a handle into a reservation.
#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    pub size: usize,
    pub handle: u64,
    pub dev: usize,
    /// CUmemAccess_flags: 0 none, 1 read, 3 read-write.
    pub access: c_int,
}

/// Memory bound to a multicast object: `size` bytes of `handle`.
pub(super) struct Bind {
    pub(super) handle: u64,
    pub(super) size: usize,
}

/// A multicast object's team: how many devices it was made for, and those added.
pub(super) struct Team {
    pub(super) devices: u32,
    pub(super) added: Vec<usize>,
}

#[derive(Default)]
pub(super) struct Vmm {
    pub(super) phys: HashMap<u64, Phys>,
    /// Arena of each device ordinal.
    arenas: HashMap<usize, Arena>,
    next_handle: u64,
    /// Reserved ranges: start -> size.
    reserved: BTreeMap<usize, usize>,
    mappings: BTreeMap<usize, Mapping>,
    /// Multicast bindings: (object, device, offset in the object) -> what is bound.
    pub(super) binds: BTreeMap<(u64, usize, usize), Bind>,
    /// Multicast objects' teams.
    pub(super) teams: HashMap<u64, Team>,
}

static VMM: LazyLock<Mutex<Vmm>> = LazyLock::new(Default::default);

pub(super) fn vmm() -> std::sync::MutexGuard<'static, Vmm> {
    VMM.lock().unwrap_or_else(|e| e.into_inner())
}

impl Vmm {
    /// Drops one reference (a multicast binding's) to `handle`; frees it if none are left.
    pub(super) fn unhold(&mut self, handle: u64) {
        if let Some(p) = self.phys.get_mut(&handle) {
            p.handle_refs = p.handle_refs.saturating_sub(1);
        }
        self.maybe_destroy(handle);
    }

    /// Drops one reference (handle or mapping); frees the memory when none are left (a
    /// multicast object's bindings with it).
    fn maybe_destroy(&mut self, handle: u64) {
        let done = self
            .phys
            .get(&handle)
            .is_some_and(|p| p.handle_refs == 0 && p.mappings == 0);
        if done {
            let p = self.phys.remove(&handle).unwrap();
            if p.multicast {
                self.teams.remove(&handle);
                let bound: Vec<_> = self
                    .binds
                    .range((handle, 0, 0)..=(handle, usize::MAX, usize::MAX))
                    .map(|(&k, _)| k)
                    .collect();
                for k in bound {
                    let b = self.binds.remove(&k).unwrap();
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
    fn fd_of(&self, p: &Phys) -> Option<(c_int, u64)> {
        match p.backing {
            Backing::Arena { off } => self.arenas.get(&p.dev).map(|a| (a.fd, off)),
            Backing::Own { fd } => Some((fd, 0)),
        }
    }

    fn mapping_at(&self, ptr: usize) -> Option<(usize, Mapping)> {
        let (&base, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr < base + m.size).then_some((base, *m))
    }

    /// The reservation containing [ptr, ptr+size).
    fn reservation_of(&self, ptr: usize, size: usize) -> Option<(usize, usize)> {
        let (&b, &len) = self.reserved.range(..=ptr).next_back()?;
        (ptr.checked_add(size)? <= b + len).then_some((b, len))
    }

    /// Mappings fully inside [ptr, ptr+size), and whether they cover it without gaps.
    fn mappings_in(&self, ptr: usize, size: usize) -> (Vec<usize>, bool) {
        let end = ptr + size;
        let mut starts = Vec::new();
        let mut at = ptr;
        let mut contiguous = true;
        for (&b, m) in self.mappings.range(ptr..end) {
            if b != at {
                contiguous = false;
            }
            if b + m.size > end {
                contiguous = false;
                break;
            }
            starts.push(b);
            at = b + m.size;
        }
        (starts, contiguous && at == end)
    }
}

/// Replaces [ptr, ptr+len) with fresh inaccessible reserved address space.
fn remap_reserved(ptr: usize, len: usize) {
    // SAFETY: the range lies inside a reservation owned by this library.
    unsafe {
        libc::mmap(
            ptr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

fn prot_of(access: c_int) -> c_int {
    match access {
        3 => libc::PROT_READ | libc::PROT_WRITE,
        1 => libc::PROT_READ,
        _ => libc::PROT_NONE,
    }
}

/// Is [ptr, ptr+n) mapped VMM memory with enough access?
pub fn check_range(ptr: usize, n: usize, write: bool) -> bool {
    let v = vmm();
    let Some(end) = ptr.checked_add(n) else {
        return false;
    };
    let mut at = ptr;
    while at < end.max(ptr + 1) {
        let Some((base, m)) = v.mapping_at(at) else {
            return false;
        };
        let ok = if write {
            m.access == 3
        } else {
            m.access & 1 != 0
        };
        if !ok {
            return false;
        }
        at = base + m.size;
    }
    true
}

/// The mapping containing `ptr`: (its start, the mapping).
pub fn mapping_at(ptr: usize) -> Option<(usize, Mapping)> {
    vmm().mapping_at(ptr)
}

/// The reservation containing `ptr`: (its start, its size).
pub fn reservation_at(ptr: usize) -> Option<(usize, usize)> {
    vmm().reservation_of(ptr, 1)
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
    v.next_handle += 1;
    let h = 0xfac0_0000_0000 + v.next_handle;
    v.phys.insert(
        h,
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

/// A new multicast object of `size` bytes per device for a team of `devices`
/// (`model::multicast`): a sparse memfd of its own, so that it can be mapped, charged to
/// no device.
pub(super) fn create_multicast(size: usize, devices: u32) -> Result<u64, CUresult> {
    let fd = own_memfd_named("fakecuda-multicast", size).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    let mut v = vmm();
    v.next_handle += 1;
    let h = 0xfac0_0000_0000 + v.next_handle;
    // SAFETY: CUmemAllocationProp is plain data; all zeros is a valid value.
    let prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    v.phys.insert(
        h,
        Phys {
            backing: Backing::Own { fd },
            size,
            dev: 0,
            prop,
            handle_refs: 1,
            mappings: 0,
            imported: false,
            host: false,
            multicast: true,
        },
    );
    v.teams.insert(
        h,
        Team {
            devices,
            added: Vec::new(),
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

/// A new fd of the handle's memfd for the caller to own (cuMemExportToShareableHandle):
/// only handles created with the fd handle type requested, or imported, have one.
pub fn export_fd(handle: u64) -> Result<c_int, CUresult> {
    let fd = match vmm()
        .phys
        .get(&handle)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?
        .backing
    {
        Backing::Own { fd } => fd,
        Backing::Arena { .. } => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: duplicating our own memfd for the caller to own.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(dup)
}

/// A handle over the memory behind the caller's `fd` (cuMemImportFromShareableHandle), not
/// charged (the exporter pays): (handle, size). It lives on the exporter's device if this
/// process sees it (read from the memfd's name), else on the current device.
pub fn import(fd: c_int) -> Result<(u64, usize), CUresult> {
    let ledger = ledger()?;
    // SAFETY: fstat of the caller's fd into a zeroed buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let size = st.st_size as usize;
    if size == 0 || !size.is_multiple_of(page_size()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The exporter named the memfd after its physical device: use that device if this
    // process sees it, else the current one.
    let phys = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .and_then(|t| {
            let t = t.to_string_lossy().into_owned();
            let rest = &t[t.find("fakecuda-vmm-d")? + "fakecuda-vmm-d".len()..];
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        });
    let dev = phys
        .and_then(|p| (0..ledger.devices()).find(|&d| ledger.phys(d) == p))
        .or_else(|| current().ok().map(|c| c.1))
        .unwrap_or(0);
    // SAFETY: duplicating the caller's fd; the caller keeps (and closes) theirs.
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if own < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: CUmemAllocationProp is plain data; all zeros is a valid value.
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = CUmemLocation {
        type_: CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev as c_int,
    };
    let mut v = vmm();
    v.next_handle += 1;
    let h = 0xfac0_0000_0000 + v.next_handle;
    v.phys.insert(
        h,
        Phys {
            backing: Backing::Own { fd: own },
            size,
            dev,
            prop,
            handle_refs: 1,
            mappings: 0,
            imported: true,
            host: false,
            multicast: false,
        },
    );
    Ok((h, size))
}

/// Reserves `size` bytes of inaccessible address space aligned to `align` (a power of two,
/// at least the granularity), near `addr` if possible (cuMemAddressReserve).
pub fn reserve(size: usize, align: usize, addr: usize) -> Result<usize, CUresult> {
    let len = size.checked_add(align).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: a fresh inaccessible anonymous mapping; `addr` is only a hint.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let raw = p as usize;
    let start = raw.next_multiple_of(align);
    unmap(raw, start - raw);
    if raw + len > start + size {
        unmap(start + size, raw + len - (start + size));
    }
    vmm().reserved.insert(start, size);
    Ok(start)
}

/// Frees a whole reservation (cuMemAddressFree); its mappings go with it.
pub fn address_free(ptr: usize, size: usize) -> CuResult {
    let mut v = vmm();
    if v.reserved.get(&ptr) != Some(&size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (inside, _) = v.mappings_in(ptr, size);
    for b in inside {
        let m = v.mappings.remove(&b).unwrap();
        if let Some(p) = v.phys.get_mut(&m.handle) {
            p.mappings -= 1;
        }
        v.maybe_destroy(m.handle);
    }
    v.reserved.remove(&ptr);
    unmap(ptr, size);
    Ok(())
}

/// Maps `size` bytes of a handle from `offset` at `ptr`, inside a reservation and over no
/// other mapping (cuMemMap); inaccessible until `set_access`.
pub fn map(ptr: usize, size: usize, offset: usize, handle: u64, flags: u64) -> CuResult {
    let mut v = vmm();
    let p = v.phys.get(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let (psize, dev) = (p.size, p.dev);
    let (fd, base_off) = v.fd_of(p).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // Addresses, offsets and sizes in whole granules, as the real driver insists (a
    // mapping one page off the granularity is CUDA_ERROR_INVALID_VALUE there).
    let g = GRANULARITY;
    if flags != 0
        || size == 0
        || !ptr.is_multiple_of(g)
        || !offset.is_multiple_of(g)
        || !size.is_multiple_of(g)
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // A range past the end of the handle: CUDA_ERROR_NOT_SUPPORTED on the real driver.
    if offset.checked_add(size).is_none_or(|e| e > psize) {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    v.reservation_of(ptr, size)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let overlaps =
        v.mapping_at(ptr).is_some() || v.mappings.range(ptr..ptr + size).next().is_some();
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: replaces part of our own reservation with the physical allocation's memfd.
    let p = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            size,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            (base_off + offset as u64) as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    v.mappings.insert(
        ptr,
        Mapping {
            size,
            handle,
            dev,
            access: 0,
        },
    );
    v.phys.get_mut(&handle).unwrap().mappings += 1;
    Ok(())
}

/// Unmaps the mappings that exactly cover [ptr, ptr+size) (cuMemUnmap); the address space
/// stays reserved.
pub fn unmap_range(ptr: usize, size: usize) -> CuResult {
    let mut v = vmm();
    let (inside, covered) = v.mappings_in(ptr, size);
    if inside.is_empty() || !covered {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in inside {
        let m = v.mappings.remove(&b).unwrap();
        remap_reserved(b, m.size);
        if let Some(p) = v.phys.get_mut(&m.handle) {
            p.mappings -= 1;
        }
        v.maybe_destroy(m.handle);
    }
    Ok(())
}

/// Gives the mappings that exactly cover [ptr, ptr+size) the CUmemAccess_flags `access`
/// (cuMemSetAccess).
pub fn set_access(ptr: usize, size: usize, access: c_int) -> CuResult {
    let mut v = vmm();
    let (inside, covered) = v.mappings_in(ptr, size);
    if inside.is_empty() || !covered {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: changes protection of our own mappings only (the range is fully mapped).
    if unsafe { libc::mprotect(ptr as *mut c_void, size, prot_of(access)) } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for b in inside {
        v.mappings.get_mut(&b).unwrap().access = access;
    }
    Ok(())
}
