//! fakenvml: a fake `libnvidia-ml.so.1` showing the fake CUDA driver's devices.
//!
//! It reads the same variables as the fake libcuda (FAKECUDA_DEVICES, FAKECUDA_TOTAL_MEM,
//! FAKECUDA_DRIVER_VERSION, FAKECUDA_MIG, FAKECUDA_SHARED) and, like the real NVML, ignores
//! CUDA_VISIBLE_DEVICES: devices are physical indices. Memory in use is what the
//! FAKECUDA_SHARED file says (all processes), else what the fake libcuda loaded in this
//! process holds (0 if none is). Entry points listed in `names.txt` that are not
//! implemented here return NVML_ERROR_NOT_SUPPORTED. See cuda-stubs/README.md.

#![allow(non_snake_case, non_camel_case_types)]

use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use libc::{c_char, c_int, c_uint};

use fake_gpu::config::{self, Config};
use fake_gpu::identity;
use fake_gpu::shared::Shared;

pub type nvmlReturn_t = c_uint;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

type Res = Result<(), nvmlReturn_t>;

/// nvmlMemory_t.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// nvmlMemory_v2_t (`version` = sizeof | 2 << 24 = 0x02000028).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<nvmlMemory_v2_t>() as c_uint | (2 << 24);

/// nvmlPciInfo_t (the layout of nvmlDeviceGetPciInfo_v3, 68 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvmlPciInfo_t {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// nvmlProcessInfo_v1_t.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// nvmlProcessInfo_v2_t (what the _v2 and _v3 process queries fill, as nvidia-ml-py reads).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessInfo_v2_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = assert!(std::mem::size_of::<nvmlMemory_t>() == 24);
const _: () = assert!(NVML_MEMORY_V2 == 0x0200_0028);
const _: () = assert!(std::mem::size_of::<nvmlPciInfo_t>() == 68);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_v1_t>() == 16);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_v2_t>() == 24);

/// H100 SXM5 80GB PCI ids: device 0x2330, vendor 0x10de, subsystem 0x16c1.
const PCI_DEVICE_ID: c_uint = 0x2330_10de;
const PCI_SUBSYSTEM_ID: c_uint = 0x16c1_10de;
/// The MIG profile count an H100 supports (nvmlDeviceGetMaxMigDeviceCount with MIG on).
const MAX_MIG_DEVICES: c_uint = 7;

// ---- device handles: addresses of static entries, one per GPU and one per MIG instance ----

/// What an nvmlDevice_t points at.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Device {
    magic: u32,
    phys: u32,
    mig: u32,
}

pub type nvmlDevice_t = *const Device;

const MAX: usize = identity::MAX_DEVICES;
const MAGIC: u32 = 0x4e56_4d4c;

const fn table(mig: u32) -> [Device; MAX] {
    let mut t = [Device {
        magic: MAGIC,
        phys: 0,
        mig,
    }; MAX];
    let mut i = 0;
    while i < MAX {
        t[i].phys = i as u32;
        i += 1;
    }
    t
}

static GPUS: [Device; MAX] = table(0);
static MIGS: [Device; MAX] = table(1);

fn gpu_handle(phys: usize) -> nvmlDevice_t {
    &GPUS[phys]
}

fn mig_handle(phys: usize) -> nvmlDevice_t {
    &MIGS[phys]
}

/// A device handle: (physical index, is a MIG instance). INVALID_ARGUMENT for anything else.
fn dev(h: nvmlDevice_t) -> Result<(usize, bool), nvmlReturn_t> {
    let cfg = cfg()?;
    let size = std::mem::size_of::<Device>();
    for (t, mig) in [(&GPUS, false), (&MIGS, true)] {
        let base = t.as_ptr() as usize;
        let at = (h as usize).wrapping_sub(base);
        if at < MAX * size && at.is_multiple_of(size) {
            let phys = at / size;
            if phys < cfg.devices && (!mig || cfg.mig) {
                return Ok((phys, mig));
            }
        }
    }
    Err(NVML_ERROR_INVALID_ARGUMENT)
}

// ---- state ----

static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// The configuration while initialised.
fn cfg() -> Result<&'static Config, nvmlReturn_t> {
    if INIT_COUNT.load(Ordering::Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    config::get().map_err(|_| NVML_ERROR_UNKNOWN)
}

static OBSERVED: Mutex<Option<&'static Shared>> = Mutex::new(None);

/// The FAKECUDA_SHARED file, once some process has created it.
fn observed(cfg: &Config) -> Option<&'static Shared> {
    let path = cfg.shared.as_ref()?;
    let mut g = OBSERVED.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none()
        && let Ok(Some(s)) = Shared::observe(path)
    {
        *g = Some(Box::leak(Box::new(s)));
    }
    *g
}

/// What the fake libcuda of this process holds on `phys` (0 if it is not loaded).
fn libcuda_used(phys: usize) -> u64 {
    // SAFETY: looks up (without loading) the fake libcuda and its documented helper
    // `u64 fakecuda_device_used(u32)`; the handle is closed again.
    unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return 0;
        }
        let f = libc::dlsym(h, c"fakecuda_device_used".as_ptr());
        let used = if f.is_null() {
            0
        } else {
            std::mem::transmute::<*mut libc::c_void, extern "C" fn(u32) -> u64>(f)(phys as u32)
        };
        libc::dlclose(h);
        used
    }
}

/// Bytes of `phys` in use.
fn used_of(cfg: &Config, phys: usize) -> u64 {
    if cfg.shared.is_some() {
        observed(cfg).map_or(0, |s| s.used(phys))
    } else {
        libcuda_used(phys)
    }
    .min(cfg.total_mem)
}

/// (pid, bytes) of the processes holding memory of `phys`.
fn processes_of(cfg: &Config, phys: usize) -> Vec<(u32, u64)> {
    if cfg.shared.is_some() {
        observed(cfg).map_or_else(Vec::new, |s| s.processes(phys))
    } else {
        match libcuda_used(phys) {
            0 => Vec::new(),
            n => vec![(std::process::id(), n)],
        }
    }
}

/// The display driver version of the branch that shipped the configured CUDA version.
fn driver_version(cuda: i32) -> &'static str {
    match cuda {
        13000.. => "580.65.06",
        12090.. => "575.57.08",
        12080.. => "570.86.10",
        12060.. => "560.35.03",
        12040.. => "550.54.14",
        12020.. => "535.104.05",
        12000.. => "525.60.13",
        _ => "470.57.02",
    }
}

// ---- the FFI edge ----

/// Writes one `fakenvml:` line to stderr.
fn log(msg: &str) {
    fake_gpu::trace::log("fakenvml", msg);
}

fn call(name: &str, body: impl FnOnce() -> Res) -> nvmlReturn_t {
    let rc = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    };
    if fake_gpu::trace::enabled() {
        log(&format!("{name} -> {}", error_string(rc)));
    }
    rc
}

/// Exported entry points returning nvmlReturn_t; build.rs reads the `fn nvml...(` lines.
macro_rules! exports {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {$(
        #[unsafe(no_mangle)]
        #[allow(clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvmlReturn_t {
            call(stringify!($name), move || -> Res { $body })
        }
    )*};
}

/// NVML_ERROR_NOT_SUPPORTED for each name (ignoring arguments is ABI-safe on x86_64 SysV).
/// Also defines `STUBS`, their names (checked against cuda-stubs/STUBS.md by a test).
macro_rules! stubs {
    ($($name:ident),* $(,)?) => {
        #[cfg(test)]
        pub(crate) const STUBS: &[&str] = &[$(stringify!($name)),*];
        $(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> nvmlReturn_t {
            call(stringify!($name), || Err(NVML_ERROR_NOT_SUPPORTED))
        }
    )*};
}

mod generated {
    use super::*;
    include!(concat!(env!("OUT_DIR"), "/stubs.rs"));
}

fn out<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null output pointer from the C caller for a value of this type.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `s` and a NUL into the caller's buffer of `len` bytes.
fn out_str(buf: *mut c_char, len: c_uint, s: &str) -> Res {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `len` >= s.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

fn in_str<'a>(p: *const c_char) -> Result<&'a str, nvmlReturn_t> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: a NUL-terminated string from the C caller.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

fn fill<const N: usize>(s: &str) -> [c_char; N] {
    let mut b = [0 as c_char; N];
    for (d, c) in b.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = c as c_char;
    }
    b
}

fn init(flags: c_uint) -> Res {
    let _ = flags;
    if let Err(msg) = config::get() {
        log(msg);
        return Err(NVML_ERROR_UNKNOWN);
    }
    INIT_COUNT.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

fn handle_by_index(index: c_uint, device: *mut nvmlDevice_t) -> Res {
    let cfg = cfg()?;
    if index as usize >= cfg.devices {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out(device, gpu_handle(index as usize))
}

fn memory(h: nvmlDevice_t) -> Result<(u64, u64), nvmlReturn_t> {
    let (phys, _) = dev(h)?;
    let cfg = cfg()?;
    Ok((cfg.total_mem, used_of(cfg, phys)))
}

fn pci_info(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> Res {
    let (phys, _) = dev(device)?;
    let bus = identity::pci_bus(phys);
    out(
        pci,
        nvmlPciInfo_t {
            bus_id_legacy: fill(&format!("0000:{bus:02X}:00.0")),
            domain: 0,
            bus,
            device: 0,
            pci_device_id: PCI_DEVICE_ID,
            pci_sub_system_id: PCI_SUBSYSTEM_ID,
            bus_id: fill(&identity::pci_bus_id(phys)),
        },
    )
}

/// The nvmlDeviceGet*RunningProcesses protocol: INSUFFICIENT_SIZE with the count when the
/// caller's array is too small.
fn processes<T>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64, bool) -> T,
) -> Res {
    let (phys, _) = dev(device)?;
    let cfg = cfg()?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let procs = processes_of(cfg, phys);
    // SAFETY: non-null count from the caller.
    let room = unsafe { *count } as usize;
    out(count, procs.len() as c_uint)?;
    if procs.is_empty() {
        return Ok(());
    }
    if room < procs.len() || infos.is_null() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, &(pid, used)) in procs.iter().enumerate() {
        // SAFETY: the caller's array holds `room` >= procs.len() entries.
        unsafe { infos.add(i).write_unaligned(make(pid, used, cfg.mig)) };
    }
    Ok(())
}

fn process_v2(pid: u32, used: u64, mig: bool) -> nvmlProcessInfo_v2_t {
    let id = if mig { 0 } else { u32::MAX };
    nvmlProcessInfo_v2_t {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: id,
        compute_instance_id: id,
    }
}

exports! {
    fn nvmlInit() {
        init(0)
    }

    fn nvmlInit_v2() {
        init(0)
    }

    fn nvmlInitWithFlags(flags: c_uint) {
        init(flags)
    }

    fn nvmlShutdown() {
        INIT_COUNT
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| NVML_ERROR_UNINITIALIZED)
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        out_str(version, length, driver_version(cfg()?.driver_version))
    }

    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let cfg = cfg()?;
        let v = format!("{}.{}", cfg.driver_version / 1000, driver_version(cfg.driver_version));
        out_str(version, length, &v)
    }

    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        out(version, cfg()?.driver_version)
    }

    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        out(version, cfg()?.driver_version)
    }

    fn nvmlDeviceGetCount(count: *mut c_uint) {
        out(count, cfg()?.devices as c_uint)
    }

    fn nvmlDeviceGetCount_v2(count: *mut c_uint) {
        out(count, cfg()?.devices as c_uint)
    }

    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) {
        handle_by_index(index, device)
    }

    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        handle_by_index(index, device)
    }

    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        let cfg = cfg()?;
        let want = in_str(uuid)?;
        if device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for phys in 0..cfg.devices {
            if identity::gpu_uuid_string(phys).eq_ignore_ascii_case(want) {
                return out(device, gpu_handle(phys));
            }
            if cfg.mig && identity::mig_uuid_string(phys).eq_ignore_ascii_case(want) {
                return out(device, mig_handle(phys));
            }
        }
        Err(NVML_ERROR_NOT_FOUND)
    }

    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let phys = identity::parse_pci_bus_id(in_str(bus_id)?, cfg()?.devices).ok_or(NVML_ERROR_NOT_FOUND)?;
        out(device, gpu_handle(phys))
    }

    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let phys = identity::parse_pci_bus_id(in_str(bus_id)?, cfg()?.devices).ok_or(NVML_ERROR_NOT_FOUND)?;
        out(device, gpu_handle(phys))
    }

    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        match dev(device)? {
            (phys, false) => out(index, phys as c_uint),
            (_, true) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) {
        let (phys, _) = dev(device)?;
        out(minor, phys as c_uint)
    }

    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let (phys, mig) = dev(device)?;
        out_str(name, length, &identity::device_name(phys, mig, cfg()?.total_mem))
    }

    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let s = match dev(device)? {
            (phys, false) => identity::gpu_uuid_string(phys),
            (phys, true) => identity::mig_uuid_string(phys),
        };
        out_str(uuid, length, &s)
    }

    fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        pci_info(device, pci)
    }

    fn nvmlDeviceGetPciInfo_v2(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        pci_info(device, pci)
    }

    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        pci_info(device, pci)
    }

    fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        dev(device)?;
        out(major, 9)?;
        out(minor, 0)
    }

    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) {
        let (total, used) = self::memory(device)?;
        out(memory, nvmlMemory_t { total, free: total - used, used })
    }

    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) {
        let (total, used) = self::memory(device)?;
        if memory.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null caller struct; `version` is its first field.
        let version = unsafe { (*memory).version };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        out(memory, nvmlMemory_v2_t { version, total, reserved: 0, free: total - used, used })
    }

    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        processes(device, count, infos, |pid, used, _| nvmlProcessInfo_v1_t { pid, used_gpu_memory: used })
    }

    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        processes(device, count, infos, process_v2)
    }

    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        processes(device, count, infos, process_v2)
    }

    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        match dev(device)? {
            (_, false) => {
                let m = cfg()?.mig as c_uint;
                out(current, m)?;
                out(pending, m)
            }
            (_, true) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        match dev(device)? {
            (_, false) => out(count, if cfg()?.mig { MAX_MIG_DEVICES } else { 0 }),
            (_, true) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceGetMigDeviceHandleByIndex(device: nvmlDevice_t, index: c_uint, mig_device: *mut nvmlDevice_t) {
        let (phys, mig) = dev(device)?;
        let max = if cfg()?.mig { MAX_MIG_DEVICES } else { 0 };
        if mig || index >= max || mig_device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if index != 0 {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        out(mig_device, mig_handle(phys))
    }

    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_device: nvmlDevice_t, device: *mut nvmlDevice_t) {
        match dev(mig_device)? {
            (phys, true) => out(device, gpu_handle(phys)),
            (_, false) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) {
        let (_, mig) = dev(device)?;
        out(is_mig, mig as c_uint)
    }

    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        match dev(device)? {
            (_, true) => out(id, 0),
            (_, false) => Err(NVML_ERROR_NOT_SUPPORTED),
        }
    }

    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        match dev(device)? {
            (_, true) => out(id, 0),
            (_, false) => Err(NVML_ERROR_NOT_SUPPORTED),
        }
    }
}

fn error_string(rc: nvmlReturn_t) -> &'static str {
    match rc {
        0 => "Success",
        1 => "Uninitialized",
        2 => "Invalid Argument",
        3 => "Not Supported",
        4 => "Insufficient Permissions",
        5 => "Already Initialized",
        6 => "Not Found",
        7 => "Insufficient Size",
        8 => "Insufficient External Power",
        9 => "Driver Not Loaded",
        10 => "Timeout",
        11 => "Interrupt Request Issue",
        12 => "NVML Shared Library Not Found",
        13 => "Function Not Found",
        14 => "Corrupted infoROM",
        15 => "GPU is lost",
        16 => "GPU requires restart",
        17 => "The operating system has blocked the request.",
        18 => "RM has detected an NVML/RM version mismatch.",
        19 => "In use by another client",
        20 => "Insufficient Memory",
        21 => "No data",
        22 => {
            "The requested vgpu operation is not available on target device, becasue ECC is enabled"
        }
        23 => "Insufficient resources",
        24 => "Frequency not supported",
        25 => "Argument version mismatch",
        26 => "Deprecated",
        _ => "Unknown Error",
    }
}

/// nvmlErrorString: a static NUL-terminated description (never NULL).
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    static TABLE: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        (0..=27)
            .map(|i| std::ffi::CString::new(error_string(i)).unwrap())
            .collect()
    });
    t[(result as usize).min(27)].as_ptr()
}

#[cfg(test)]
mod tests;
