//! Device memory: the per-device ledger, linear allocations (lazily committed host memory),
//! copies, memsets and pointer queries.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::Lazy;

use crate::abi::types::CUdeviceptr;
use crate::abi::*;
use crate::context::{Ctx, current};
use crate::device::cfg;
use fake_gpu::shared::Shared;
use libc::{c_int, c_uint, c_void};

/// Counters of one device (this process's view).
#[derive(Debug, Default)]
pub struct DevLedger {
    used: AtomicU64,
    peak: AtomicU64,
    alloc_calls: AtomicU64,
    free_calls: AtomicU64,
    failed_alloc_calls: AtomicU64,
    context_mem: AtomicU64,
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

    /// Takes the memory of a new context (not an allocation call).
    pub fn charge_context(&self, dev: usize, size: u64) -> CuResult {
        if size == 0 {
            return Ok(());
        }
        self.charge(dev, size)?;
        self.devs[dev].context_mem.fetch_add(size, Ordering::AcqRel);
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

static LEDGER: std::sync::OnceLock<Result<Ledger, String>> = std::sync::OnceLock::new();

/// Builds the process's ledger from the configuration (at cuInit): joins the FAKECUDA_SHARED
/// file if there is one. The error names the problem.
pub fn init_ledger(cfg: &fake_gpu::config::Config) -> Result<&'static Ledger, &'static str> {
    LEDGER
        .get_or_init(|| {
            let shared = match &cfg.shared {
                Some(path) => Some(Shared::join(path, cfg.devices, cfg.total_mem)?),
                None => None,
            };
            Ok(Ledger::with(cfg.visible.clone(), cfg.total_mem, shared))
        })
        .as_ref()
        .map_err(|e| e.as_str())
}

/// The process's ledger (exists once cuInit succeeded).
pub fn ledger() -> Result<&'static Ledger, CUresult> {
    cfg()?;
    match LEDGER.get() {
        Some(Ok(l)) => Ok(l),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Device,
    Managed,
    /// From a memory pool (cuMemAllocAsync / cuMemAllocFromPoolAsync): the CUmemoryPool.
    Pool(usize),
}

#[derive(Debug, Clone, Copy)]
pub struct Alloc {
    pub dev: usize,
    pub ctx: Ctx,
    /// Bytes charged to the device.
    pub size: u64,
    /// Bytes mapped (size rounded up to pages).
    pub len: usize,
    pub kind: Kind,
    pub id: u64,
    /// The memfd behind the allocation once exported with cuIpcGetMemHandle, else -1.
    pub ipc_fd: c_int,
}

static ALLOCS: Lazy<Mutex<BTreeMap<usize, Alloc>>> = Lazy::new(Default::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn allocs() -> std::sync::MutexGuard<'static, BTreeMap<usize, Alloc>> {
    ALLOCS.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Lazily committed, zero-filled host memory: read-write, no swap reservation.
pub fn map_anonymous(len: usize) -> Option<usize> {
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

pub fn unmap(addr: usize, len: usize) {
    // SAFETY: only called on mappings this library created and no longer hands out.
    unsafe { libc::munmap(addr as *mut c_void, len) };
}

/// Allocates `size` bytes of device `dev` for context `ctx`. Pool allocations take their
/// bytes from the pool (which grows its reservation if it has too little cached).
pub fn alloc(dev: usize, ctx: Ctx, size: u64, kind: Kind) -> Result<CUdeviceptr, CUresult> {
    if size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ledger = ledger()?;
    match kind {
        Kind::Pool(pool) => {
            let res = crate::pool::take(pool, size);
            ledger.count_alloc(dev, res.is_ok());
            res?;
        }
        _ => ledger.reserve(dev, size)?,
    }
    let page = page_size() as u64;
    let len = size
        .checked_add(page - 1)
        .map(|s| s / page * page)
        .filter(|&l| l <= isize::MAX as u64);
    let Some(ptr) = len.and_then(|len| map_anonymous(len as usize)) else {
        match kind {
            Kind::Pool(pool) => {
                crate::pool::give(pool, size);
                ledger.count_alloc(dev, false);
            }
            _ => ledger.unreserve(dev, size),
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let a = Alloc {
        dev,
        ctx,
        size,
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
    let a = allocs()
        .remove(&(ptr as usize))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    release(ptr as usize, a, ledger, true);
    Ok(())
}

fn release(ptr: usize, a: Alloc, ledger: &Ledger, call: bool) {
    unmap(ptr, a.len);
    if a.ipc_fd >= 0 {
        // SAFETY: the memfd this allocation was re-backed with for IPC; ours to close.
        unsafe { libc::close(a.ipc_fd) };
    }
    match a.kind {
        Kind::Pool(pool) => {
            crate::pool::give(pool, a.size);
            if call {
                ledger.count_free_call(a.dev);
            }
        }
        _ => ledger.release(a.dev, a.size, call),
    }
}

/// Frees everything allocated in `ctx` (the context was destroyed or reset). Pool
/// allocations go back to their pools, and the pools of the device release what they cache.
pub fn free_all_of_context(ctx: Ctx) {
    let Ok(ledger) = ledger() else { return };
    let victims: Vec<(usize, Alloc)> = {
        let mut m = allocs();
        let keys: Vec<usize> = m
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(&p, _)| p)
            .collect();
        keys.into_iter()
            .filter_map(|p| m.remove(&p).map(|a| (p, a)))
            .collect()
    };
    let mut pool_devs = Vec::new();
    for (p, a) in victims {
        if matches!(a.kind, Kind::Pool(_)) && !pool_devs.contains(&a.dev) {
            pool_devs.push(a.dev);
        }
        release(p, a, ledger, false);
    }
    for dev in pool_devs {
        crate::pool::trim_device(dev);
    }
    crate::array::free_all_of_context(ctx);
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

/// Checks that [ptr, ptr+n) is device memory the caller may access.
pub fn check_range(ptr: CUdeviceptr, n: usize, write: bool) -> CuResult {
    let ptr = ptr as usize;
    let end = ptr.checked_add(n).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some((base, a)) = lookup(ptr) {
        return if end <= base + a.len {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    if crate::vmm::check_range(ptr, n, write) {
        return Ok(());
    }
    if let Some(info) = crate::ipc::lookup(ptr) {
        return if end <= info.base + info.size {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    if host_lookup(ptr).is_some_and(|(b, len)| end <= b + len) {
        return Ok(());
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

fn copy(dst: usize, src: usize, n: usize) -> CuResult {
    if n == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: both ranges were validated as accessible memory of n bytes (device ranges by
    // check_range, host ranges are the caller's responsibility as with the real driver).
    unsafe { libc::memmove(dst as *mut c_void, src as *const c_void, n) };
    Ok(())
}

fn htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> CuResult {
    cfg()?;
    check_range(dst, n, true)?;
    copy(dst as usize, src as usize, n)
}

fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CuResult {
    cfg()?;
    check_range(src, n, false)?;
    copy(dst as usize, src as usize, n)
}

fn dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CuResult {
    cfg()?;
    check_range(src, n, false)?;
    check_range(dst, n, true)?;
    copy(dst as usize, src as usize, n)
}

/// Fills `count` elements of `E` at `dst`, rows of `width` elements `pitch` bytes apart.
fn fill<E: Copy>(
    dst: CUdeviceptr,
    pitch: usize,
    value: E,
    width: usize,
    height: usize,
) -> CuResult {
    cfg()?;
    let esz = std::mem::size_of::<E>();
    if !(dst as usize).is_multiple_of(esz) || !pitch.is_multiple_of(esz) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let row = width.checked_mul(esz).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if height == 0 || width == 0 {
        return Ok(());
    }
    let span = pitch
        .checked_mul(height - 1)
        .and_then(|s| s.checked_add(row))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    check_range(dst, span, true)?;
    for r in 0..height {
        let p = (dst as usize + r * pitch) as *mut E;
        // SAFETY: the whole span was validated as writable device memory, p is aligned.
        let s = unsafe { std::slice::from_raw_parts_mut(p, width) };
        s.fill(value);
    }
    Ok(())
}

// ---- host (pinned) memory: plain mappings, not device memory ----

#[derive(Debug, Clone, Copy)]
struct HostRange {
    len: usize,
    /// cuMemHostRegister'ed caller memory (not ours to unmap).
    registered: bool,
}

static HOST: Lazy<Mutex<BTreeMap<usize, HostRange>>> = Lazy::new(Default::default);

fn host() -> std::sync::MutexGuard<'static, BTreeMap<usize, HostRange>> {
    HOST.lock().unwrap_or_else(|e| e.into_inner())
}

fn host_lookup(ptr: usize) -> Option<(usize, usize)> {
    let m = host();
    let (&b, r) = m.range(..=ptr).next_back()?;
    (ptr < b + r.len).then_some((b, r.len))
}

fn host_alloc(pp: *mut *mut c_void, size: usize) -> CuResult {
    cfg()?;
    if size == 0 || pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let page = page_size();
    let len = size.checked_add(page - 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? / page * page;
    let p = map_anonymous(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    host().insert(
        p,
        HostRange {
            len,
            registered: false,
        },
    );
    note(|| format!("ptr={p:#x}"));
    out(pp, p as *mut c_void)
}

// ---- pointer attributes ----

/// What cuPointerGetAttribute knows about a device pointer.
#[derive(Debug, Clone, Copy)]
pub struct PtrInfo {
    pub base: usize,
    pub size: usize,
    pub dev: usize,
    pub ctx: Ctx,
    pub managed: bool,
    pub pool: usize,
    pub id: u64,
    pub host: bool,
}

fn pointer_info(ptr: usize) -> Option<PtrInfo> {
    if let Some((base, a)) = lookup(ptr) {
        let pool = if let Kind::Pool(p) = a.kind { p } else { 0 };
        return Some(PtrInfo {
            base,
            size: a.size as usize,
            dev: a.dev,
            ctx: a.ctx,
            managed: a.kind == Kind::Managed,
            pool,
            id: a.id,
            host: false,
        });
    }
    if let Some(info) = crate::vmm::pointer_info(ptr) {
        return Some(info);
    }
    if let Some(info) = crate::ipc::lookup(ptr) {
        return Some(info);
    }
    host_lookup(ptr).map(|(base, size)| PtrInfo {
        base,
        size,
        dev: 0,
        ctx: current().map(|c| c.0).unwrap_or(0),
        managed: false,
        pool: 0,
        id: base as u64,
        host: true,
    })
}

/// Writes one attribute of `info` into `data` (booleans as one byte, so a zeroed
/// `unsigned int` and a `bool` destination both read correctly).
fn write_attribute(data: *mut c_void, attr: c_int, ptr: usize, info: &PtrInfo) -> CuResult {
    match attr {
        1 => out(data.cast::<usize>(), info.ctx), // CONTEXT
        2 => out(data.cast::<c_uint>(), if info.host { 1 } else { 2 }), // MEMORY_TYPE
        3 => out(data.cast::<u64>(), ptr as u64), // DEVICE_POINTER
        4 if info.host || info.managed => out(data.cast::<usize>(), ptr), // HOST_POINTER
        6 | 8 | 10 | 13 | 15 | 21 => out(
            data.cast::<u8>(),
            match attr {
                8 => info.managed as u8,
                13 => 1,
                _ => 0,
            },
        ),
        7 | 20 => out(data.cast::<u64>(), info.id), // BUFFER_ID, MEMORY_BLOCK_ID
        9 => out(data.cast::<c_int>(), info.dev as c_int), // DEVICE_ORDINAL
        11 | 19 => out(data.cast::<u64>(), info.base as u64), // RANGE_START_ADDR, MAPPING_BASE_ADDR
        12 | 18 => out(data.cast::<usize>(), info.size), // RANGE_SIZE, MAPPING_SIZE
        14 => out(data.cast::<u64>(), 0),           // ALLOWED_HANDLE_TYPES
        16 => out(data.cast::<c_uint>(), 3),        // ACCESS_FLAGS: read-write
        17 => out(data.cast::<usize>(), info.pool), // MEMPOOL_HANDLE
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

crate::abi::exports! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        let (ctx, dev) = current()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(dptr, alloc(dev, ctx, bytesize as u64, Kind::Device)?)
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        let (ctx, dev) = current()?;
        if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = width.checked_add(511).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? / 512 * 512;
        let size = (p as u64).checked_mul(height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = alloc(dev, ctx, size, Kind::Device)?;
        out(pitch, p)?;
        out(dptr, ptr)
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) {
        let (ctx, dev) = current()?;
        if dptr.is_null() || !matches!(flags, 1 | 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(dptr, alloc(dev, ctx, bytesize as u64, Kind::Managed)?)
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        free(dptr)
    }

    fn cuMemGetInfo_v2(free_out: *mut usize, total_out: *mut usize) {
        let (_, dev) = current()?;
        let l = ledger()?;
        out(free_out, l.total().saturating_sub(l.device_used(dev)) as usize)?;
        out(total_out, l.total() as usize)
    }

    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        cfg()?;
        let info = pointer_info(dptr as usize).filter(|i| !i.host).ok_or(CUDA_ERROR_NOT_FOUND)?;
        if !pbase.is_null() {
            out(pbase, info.base as CUdeviceptr)?;
        }
        if !psize.is_null() {
            out(psize, info.size)?;
        }
        Ok(())
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) {
        host_alloc(pp, bytesize)
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) {
        let _ = flags;
        host_alloc(pp, bytesize)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        cfg()?;
        let mut h = host();
        match h.get(&(p as usize)) {
            Some(r) if !r.registered => {
                let len = r.len;
                h.remove(&(p as usize));
                drop(h);
                unmap(p as usize, len);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) {
        cfg()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pdptr, p as CUdeviceptr)
    }

    fn cuMemHostGetFlags(pflags: *mut c_uint, p: *mut c_void) {
        cfg()?;
        host_lookup(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(pflags, 0)
    }

    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) {
        cfg()?;
        let _ = flags;
        let start = p as usize;
        let end = start.checked_add(bytesize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if p.is_null() || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut h = host();
        let overlaps = h.range(..end).next_back().is_some_and(|(&b, r)| b + r.len > start);
        if overlaps {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        h.insert(start, HostRange { len: bytesize, registered: true });
        Ok(())
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        cfg()?;
        if p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut h = host();
        match h.get(&(p as usize)) {
            Some(r) if r.registered => {
                h.remove(&(p as usize));
                Ok(())
            }
            _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    fn cuMemcpy | cuMemcpy_ptds (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        cfg()?;
        copy(dst as usize, src as usize, n)
    }

    fn cuMemcpyAsync | cuMemcpyAsync_ptsz (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        copy(dst as usize, src as usize, n)
    }

    fn cuMemcpyPeer | cuMemcpyPeer_ptds (dst: CUdeviceptr, dst_ctx: Ctx, src: CUdeviceptr, src_ctx: Ctx, n: usize) {
        let _ = (dst_ctx, src_ctx);
        dtod(dst, src, n)
    }

    fn cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz (dst: CUdeviceptr, dst_ctx: Ctx, src: CUdeviceptr, src_ctx: Ctx, n: usize, stream: usize) {
        let _ = (dst_ctx, src_ctx);
        crate::stream::check(stream)?;
        dtod(dst, src, n)
    }

    fn cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds (dst: CUdeviceptr, src: *const c_void, n: usize) {
        htod(dst, src, n)
    }

    fn cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds (dst: *mut c_void, src: CUdeviceptr, n: usize) {
        dtoh(dst, src, n)
    }

    fn cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds (dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        dtod(dst, src, n)
    }

    fn cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz (dst: CUdeviceptr, src: *const c_void, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        htod(dst, src, n)
    }

    fn cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz (dst: *mut c_void, src: CUdeviceptr, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        dtoh(dst, src, n)
    }

    fn cuMemcpyDtoDAsync_v2 | cuMemcpyDtoDAsync_v2_ptsz (dst: CUdeviceptr, src: CUdeviceptr, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        dtod(dst, src, n)
    }

    fn cuMemsetD8_v2 | cuMemsetD8_v2_ptds (dst: CUdeviceptr, value: u8, n: usize) {
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD16_v2 | cuMemsetD16_v2_ptds (dst: CUdeviceptr, value: u16, n: usize) {
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD32_v2 | cuMemsetD32_v2_ptds (dst: CUdeviceptr, value: u32, n: usize) {
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD8Async | cuMemsetD8Async_ptsz (dst: CUdeviceptr, value: u8, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD16Async | cuMemsetD16Async_ptsz (dst: CUdeviceptr, value: u16, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD32Async | cuMemsetD32Async_ptsz (dst: CUdeviceptr, value: u32, n: usize, stream: usize) {
        crate::stream::check(stream)?;
        fill(dst, 0, value, n, 1)
    }

    fn cuMemsetD2D8_v2 | cuMemsetD2D8_v2_ptds (dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize) {
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D16_v2 | cuMemsetD2D16_v2_ptds (dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize) {
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D32_v2 | cuMemsetD2D32_v2_ptds (dst: CUdeviceptr, pitch: usize, value: u32, width: usize, height: usize) {
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D8Async | cuMemsetD2D8Async_ptsz (dst: CUdeviceptr, pitch: usize, value: u8, width: usize, height: usize, stream: usize) {
        crate::stream::check(stream)?;
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D16Async | cuMemsetD2D16Async_ptsz (dst: CUdeviceptr, pitch: usize, value: u16, width: usize, height: usize, stream: usize) {
        crate::stream::check(stream)?;
        fill(dst, pitch, value, width, height)
    }

    fn cuMemsetD2D32Async | cuMemsetD2D32Async_ptsz (dst: CUdeviceptr, pitch: usize, value: u32, width: usize, height: usize, stream: usize) {
        crate::stream::check(stream)?;
        fill(dst, pitch, value, width, height)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) {
        cfg()?;
        let info = pointer_info(ptr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        write_attribute(data, attribute, ptr as usize, &info)
    }

    fn cuPointerGetAttributes(num: c_uint, attributes: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) {
        cfg()?;
        if num > 0 && (attributes.is_null() || data.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let info = pointer_info(ptr as usize);
        for i in 0..num as usize {
            // SAFETY: the caller passes arrays of `num` attributes and destinations.
            let (attr, dst) = unsafe { (*attributes.add(i), *data.add(i)) };
            if dst.is_null() {
                continue;
            }
            match &info {
                Some(info) => {
                    if write_attribute(dst, attr, ptr as usize, info).is_err() && attr == 4 {
                        out(dst.cast::<usize>(), 0)?;
                    }
                }
                // Unknown pointers read as "not CUDA memory": zeros (MEMORY_TYPE 0, NULL context).
                None => match attr {
                    1 | 4 | 12 | 17 | 18 => out(dst.cast::<usize>(), 0)?,
                    3 | 7 | 11 | 14 | 19 | 20 => out(dst.cast::<u64>(), 0)?,
                    9 => out(dst.cast::<c_int>(), -2)?,
                    6 | 8 | 10 | 13 | 15 | 21 => out(dst.cast::<u8>(), 0)?,
                    _ => out(dst.cast::<c_uint>(), 0)?,
                },
            }
        }
        Ok(())
    }
}

/// For the fake NVML (found with dlsym in the same process): the bytes this process holds
/// on physical device `phys`; 0 before cuInit or for a device it does not see.
#[unsafe(no_mangle)]
pub extern "C" fn fakecuda_device_used(phys: u32) -> u64 {
    std::panic::catch_unwind(|| {
        ledger()
            .ok()
            .and_then(|l| l.used_of_phys(phys as usize))
            .unwrap_or(0)
    })
    .unwrap_or(0)
}

/// Per-device stats for the stats file.
pub fn all_stats() -> Vec<DevStats> {
    match ledger() {
        Ok(l) => (0..l.devices())
            .map(|d| DevStats {
                pool_reserved: crate::pool::reserved_of(d),
                ..l.stats(d)
            })
            .collect(),
        Err(_) => Vec::new(),
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
