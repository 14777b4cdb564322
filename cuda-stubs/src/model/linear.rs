//! Linear allocations (cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged, and pool allocations
//! of cuMemAllocAsync): lazily committed host memory whose address is the CUdeviceptr,
//! charged to the device's ledger, or to a pool for pool allocations. An allocation
//! exported with cuIpcGetMemHandle moves onto a memfd at the same address.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::LazyLock;

use super::ctx::Ctx;
use super::device::{cfg, ledger};
use super::ledger::Ledger;
use super::os::{map_anonymous, page_size, unmap};
use super::pool;
use crate::abi::types::CUdeviceptr;
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult, note};
use libc::{c_int, c_void};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Device,
    Managed,
    /// From a memory pool (cuMemAllocAsync / cuMemAllocFromPoolAsync): the CUmemoryPool.
    Pool(usize),
    /// A buffer mapped onto memory imported from another API
    /// (cuExternalMemoryGetMappedBuffer): that API's memory, so it takes nothing here.
    External,
}

#[derive(Debug, Clone, Copy)]
pub struct Alloc {
    pub dev: usize,
    pub ctx: Ctx,
    /// Bytes asked for: the allocation's address range.
    pub size: u64,
    /// Bytes the device gave it ([`taken`]; a pool allocation's come from its pool).
    pub taken: u64,
    /// Bytes mapped (size rounded up to pages).
    pub len: usize,
    pub kind: Kind,
    pub id: u64,
    /// The memfd behind the allocation once exported with cuIpcGetMemHandle, else -1.
    pub ipc_fd: c_int,
}

static ALLOCS: LazyLock<Mutex<BTreeMap<usize, Alloc>>> = LazyLock::new(Default::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn allocs() -> std::sync::MutexGuard<'static, BTreeMap<usize, Alloc>> {
    ALLOCS.lock().unwrap_or_else(|e| e.into_inner())
}

/// FAKECUDA_ARENA: freed blocks by mapped length, kept mapped for the next request of
/// that length (no `mmap`/`munmap` in an alloc/free loop's steady state). Not zeroed
/// when handed out again, as real device memory is not.
static SPARE: LazyLock<Mutex<std::collections::HashMap<usize, Vec<usize>>>> =
    LazyLock::new(Default::default);

fn arena() -> bool {
    cfg().is_ok_and(|c| c.arena)
}

/// Pages for a block of `len` bytes: a spare one in arena mode, else fresh ones.
fn map_block(len: usize) -> Option<usize> {
    if arena()
        && let Some(p) = SPARE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&len)
            .and_then(Vec::pop)
    {
        return Some(p);
    }
    map_anonymous(len)
}

/// Gives a block's pages back: kept as a spare in arena mode (unless it was re-backed
/// for IPC), else unmapped.
fn unmap_block(ptr: usize, len: usize, ipc: bool) {
    if arena() && !ipc {
        SPARE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(len)
            .or_default()
            .push(ptr);
        return;
    }
    unmap(ptr, len);
}

/// The driver's page for device memory, and the largest allocation it packs into pages
/// shared with others.
const PAGE: u64 = 2 << 20;
const SMALL: u64 = 1 << 20;

/// What the device gives a plain allocation of `size` bytes, as the real driver does:
/// above 1 MiB whole 2 MiB pages (an H200 with driver 580 lowered free memory by 4 MiB
/// for 3 MiB + 1 byte, by 2 MiB for 2 MiB: tests/driver-answers/h200-580.159.04.json).
/// Smaller allocations are packed into pages the driver shares between them (there, 1
/// byte and 4 KiB lowered it by nothing); the fake gives them their bytes. Managed
/// memory is charged as asked.
fn taken(size: u64, kind: Kind) -> u64 {
    match kind {
        Kind::Device if size > SMALL => size
            .checked_add(PAGE - 1)
            .map_or(u64::MAX, |s| s & !(PAGE - 1)),
        _ => size,
    }
}

/// Allocates `size` bytes of device `dev` for context `ctx`. Pool allocations take their
/// bytes from the pool (which grows its reservation if it has too little cached).
pub fn alloc(dev: usize, ctx: Ctx, size: u64, kind: Kind) -> Result<CUdeviceptr, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ledger = ledger()?;
    let taken = taken(size, kind);
    match kind {
        Kind::Pool(pool) => {
            let res = pool::take(pool, size);
            ledger.count_alloc(dev, res.is_ok());
            res?;
        }
        _ => ledger.reserve(dev, taken)?,
    }
    let page = page_size() as u64;
    let len = size
        .checked_add(page - 1)
        .map(|s| s / page * page)
        .filter(|&l| l <= isize::MAX as u64);
    let Some(ptr) = len.and_then(|len| map_block(len as usize)) else {
        match kind {
            Kind::Pool(pool) => {
                pool::give(pool, size);
                ledger.count_alloc(dev, false);
            }
            _ => ledger.unreserve(dev, taken),
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let a = Alloc {
        dev,
        ctx,
        size,
        taken,
        len: len.unwrap() as usize,
        kind,
        id,
        ipc_fd: -1,
    };
    allocs().insert(ptr, a);
    note(|| format!("ptr={ptr:#x}"));
    Ok(ptr as CUdeviceptr)
}

/// Frees the allocation starting at `ptr`: INVALID_VALUE for NULL, unknown or freed pointers.
/// A pool allocation goes back to its pool (still reserved until the pool releases it).
pub fn free(ptr: CUdeviceptr) -> CuResult {
    let ledger = ledger()?;
    let Some(a) = allocs().remove(&(ptr as usize)) else {
        // A graph allocation a launch left live goes back to the graph's pool.
        return if super::graph::free_live(ptr) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    };
    release(ptr as usize, a, ledger, true);
    Ok(())
}

fn release(ptr: usize, a: Alloc, ledger: &Ledger, call: bool) {
    if a.kind == Kind::External {
        unmap(ptr, a.len);
        return;
    }
    unmap_block(ptr, a.len, a.ipc_fd >= 0);
    if a.ipc_fd >= 0 {
        // SAFETY: the memfd this allocation was re-backed with for IPC; ours to close.
        unsafe { libc::close(a.ipc_fd) };
    }
    match a.kind {
        Kind::Pool(pool) => {
            pool::give(pool, a.size);
            if call {
                ledger.count_free_call(a.dev);
            }
        }
        _ => ledger.release(a.dev, a.taken, call),
    }
}

/// Maps `size` bytes of `fd` from `offset` as a buffer of context `ctx` on `dev`
/// (cuExternalMemoryGetMappedBuffer): freed by cuMemFree like an allocation, but it
/// takes no device memory and is no allocation call (the other API allocated it).
pub fn map_external(
    dev: usize,
    ctx: Ctx,
    fd: c_int,
    offset: u64,
    size: u64,
) -> Result<CUdeviceptr, CUresult> {
    let page = page_size() as u64;
    let len = size
        .checked_add(page - 1)
        .map(|s| s / page * page)
        .filter(|&l| l <= isize::MAX as u64)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: a fresh shared mapping of the imported fd; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let a = Alloc {
        dev,
        ctx,
        size,
        taken: 0,
        len: len as usize,
        kind: Kind::External,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        ipc_fd: -1,
    };
    allocs().insert(p as usize, a);
    Ok(p as usize as CUdeviceptr)
}

/// Frees the linear allocations of `ctx` (the context ended), not counted as free calls.
/// Pool allocations are not the context's (cuCtxDestroy's doc in cuda.h: memory from
/// cuMemAllocAsync and cuMemAllocFromPoolAsync is "not associated with any CUDA context"):
/// they stay valid and in use in their pools until freed.
pub fn free_all_of_context(ctx: Ctx) {
    let Ok(ledger) = ledger() else { return };
    let victims: Vec<(usize, Alloc)> = {
        let mut m = allocs();
        let keys: Vec<usize> = m
            .iter()
            .filter(|(_, a)| a.ctx == ctx && !matches!(a.kind, Kind::Pool(_)))
            .map(|(&p, _)| p)
            .collect();
        keys.into_iter()
            .filter_map(|p| m.remove(&p).map(|a| (p, a)))
            .collect()
    };
    for (p, a) in victims {
        release(p, a, ledger, false);
    }
}

/// Makes the plain device allocation containing `ptr` shareable with other processes
/// (cuIpcGetMemHandle): the first time, its pages move to a memfd named
/// `fakecuda-ipc-PID-ID` (resident content is copied) mapped at the same address.
/// Returns (base, allocation) with `ipc_fd` set.
pub fn export_ipc(ptr: usize) -> Result<(usize, Alloc), CUresult> {
    let mut m = allocs();
    let (&base, a) = m
        .range(..=ptr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ptr >= base + a.size as usize || a.kind != Kind::Device {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if a.ipc_fd >= 0 {
        return Ok((base, *a));
    }
    let name = CString::new(format!("fakecuda-ipc-{}-{}", std::process::id(), a.id)).unwrap();
    // SAFETY: memfd_create with a NUL-terminated name; sizing our own fd.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 || unsafe { libc::ftruncate(fd, a.len as libc::off_t) } != 0 {
        if fd >= 0 {
            // SAFETY: closing our own fd.
            unsafe { libc::close(fd) };
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if copy_content(base, a.len, fd).is_err() {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // SAFETY: replaces our own mapping of `len` bytes with the memfd holding its content.
    let p = unsafe {
        libc::mmap(
            base as *mut c_void,
            a.len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        // SAFETY: closing our own fd (the old mapping is untouched).
        unsafe { libc::close(fd) };
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let a = m.get_mut(&base).unwrap();
    a.ipc_fd = fd;
    Ok((base, *a))
}

/// Writes the content of [base, base+len) to `fd`: the pages mincore reports resident
/// (untouched pages read as zeros anyway); with swap on, every page that is not all zero.
fn copy_content(base: usize, len: usize, fd: c_int) -> std::io::Result<()> {
    let page = page_size();
    let pages = len / page;
    let swap = std::fs::read_to_string("/proc/swaps").map_or(true, |s| s.lines().count() > 1);
    let mut resident = vec![0u8; pages];
    // SAFETY: mincore over our own mapping into a vector of one byte per page.
    let ok = unsafe { libc::mincore(base as *mut c_void, len, resident.as_mut_ptr()) } == 0;
    for (i, r) in resident.iter().enumerate() {
        let p = base + i * page;
        // SAFETY: reading our own readable mapping.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, page) };
        let copy = if ok && !swap {
            r & 1 != 0
        } else {
            bytes.iter().any(|&b| b != 0)
        };
        if copy {
            // SAFETY: writing one page of our mapping to our memfd at the same offset.
            let n =
                unsafe { libc::pwrite(fd, p as *const c_void, page, (i * page) as libc::off_t) };
            if n != page as isize {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The linear allocation containing `ptr`: (base, allocation).
pub fn lookup(ptr: usize) -> Option<(usize, Alloc)> {
    let m = allocs();
    let (&base, a) = m.range(..=ptr).next_back()?;
    (ptr < base + a.size as usize).then_some((base, *a))
}
