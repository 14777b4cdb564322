//! NVML read directly, below the shim's own NVML hooks: a GPU's device-wide free memory
//! without a CUDA context, to measure the first context on a device with
//! (`gpucap_core::contexts`) instead of creating a temporary context; the driver's
//! figure for this process on a GPU, to measure a kernel's first launch with (which
//! other processes' traffic does not move), where its pid in NVML's list is provably
//! its own; and a GPU's process list and used figure, which show whether a dead pool
//! member's memory was released (`gpucap_core::budget::reclaim`). Process lists are read
//! whole, however many processes the GPU runs.
//!
//! `libnvidia-ml.so.1` is loaded (`RTLD_LOCAL`) and initialised (`nvmlInit_v2`) once per
//! process, lazily, when the first context on a device is measured; never on the
//! `dlsym` path. Its functions are looked up on that handle with glibc's `dlsym`, so
//! they are NVML's own, never gpucap's hooks (which would show the cap). NVML stays
//! initialised until the process ends (its initialisations are counted: a program's own
//! `nvmlInit`/`nvmlShutdown` pairs are not disturbed).

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::calls;
use super::types::{CUDA_SUCCESS, Handle};
use gpucap_core::config::MAX_DEVICES;
use gpucap_core::nvml::NvmlMemory;

/// `NVML_SUCCESS`, `NVML_DEVICE_MIG_ENABLE`.
const NVML_SUCCESS: u32 = 0;
const NVML_MIG_ENABLE: u32 = 1;

type ByUuid = unsafe extern "C" fn(*const c_char, *mut Handle) -> u32;
type MemoryInfo = unsafe extern "C" fn(Handle, *mut NvmlMemory) -> u32;
type MigMode = unsafe extern "C" fn(Handle, *mut u32, *mut u32) -> u32;
type IsMig = unsafe extern "C" fn(Handle, *mut u32) -> u32;
type Processes = unsafe extern "C" fn(Handle, *mut u32, *mut NvmlProcessV2) -> u32;

/// The NVML functions the measurements use.
struct Nvml {
    by_uuid: ByUuid,
    memory: MemoryInfo,
    mig_mode: Option<MigMode>,
    is_mig: Option<IsMig>,
    processes: Option<Processes>,
}

static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

/// The last `dlerror()` text.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "no reason given".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
}

fn load() -> Result<Nvml, String> {
    // Its dlopen and initialisation open files: no cancellation meanwhile (`cancel.rs`).
    let _held = crate::cancel::NoCancel::hold();
    let dlsym = crate::resolve::real_dlsym().ok_or("glibc's dlsym was not found")?;
    // glibc's dlopen (not our export); the handle is kept for the process.
    let h = crate::resolve::open_library(c"libnvidia-ml.so.1", libc::RTLD_LAZY | libc::RTLD_LOCAL);
    if h.is_null() {
        return Err(format!(
            "libnvidia-ml.so.1 cannot be loaded ({})",
            dl_error()
        ));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: glibc's dlsym on NVML's own handle: NVML's export, never one of ours.
        let p = unsafe { dlsym(h, name.as_ptr()) };
        if p.is_null() {
            Err(format!("NVML has no {}", name.to_string_lossy()))
        } else {
            Ok(p)
        }
    };
    let init = sym(c"nvmlInit_v2")?;
    // SAFETY: each symbol is NVML's export of that name, with this C signature.
    let (init, by_uuid, memory, mig_mode, is_mig, processes) = unsafe {
        (
            std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u32>(init),
            std::mem::transmute::<*mut c_void, ByUuid>(sym(c"nvmlDeviceGetHandleByUUID")?),
            std::mem::transmute::<*mut c_void, MemoryInfo>(sym(c"nvmlDeviceGetMemoryInfo")?),
            sym(c"nvmlDeviceGetMigMode")
                .ok()
                .map(|p| std::mem::transmute::<*mut c_void, MigMode>(p)),
            sym(c"nvmlDeviceIsMigDeviceHandle")
                .ok()
                .map(|p| std::mem::transmute::<*mut c_void, IsMig>(p)),
            sym(c"nvmlDeviceGetComputeRunningProcesses_v3")
                .ok()
                .map(|p| std::mem::transmute::<*mut c_void, Processes>(p)),
        )
    };
    // SAFETY: NVML's initialisation, no arguments.
    let rc = unsafe { init() };
    if rc != NVML_SUCCESS {
        return Err(format!("nvmlInit_v2 failed (error {rc})"));
    }
    Ok(Nvml {
        by_uuid,
        memory,
        mig_mode,
        is_mig,
        processes,
    })
}

/// The UUID of CUDA device `device` as NVML names a whole GPU (`GPU-…`).
fn gpu_uuid(device: usize) -> Result<String, String> {
    let get = calls::cuDeviceGetUuid_v2()
        .or_else(calls::cuDeviceGetUuid)
        .ok_or("the driver has no cuDeviceGetUuid")?;
    let mut u = [0u8; 16];
    // SAFETY: valid out-pointer; an ordinal the shim checked.
    let rc = unsafe { get(&mut u, device as i32) };
    if rc != CUDA_SUCCESS {
        return Err(format!("cuDeviceGetUuid failed (error {rc})"));
    }
    Ok(gpucap_core::nvml::uuid_text("GPU", &u))
}

/// Each device's [`find_whole_gpu`] answer, found once (a kernel's first launches ask
/// it twice each).
static WHOLE: [OnceLock<Result<(usize, String), String>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];

/// NVML, and its handle of CUDA device `device` as a whole GPU (not a MIG instance, not
/// a GPU in MIG mode: there the device-wide figures are not the instance's), with its
/// UUID; or why NVML cannot say.
fn whole_gpu(device: usize) -> Result<(&'static Nvml, Handle, String), String> {
    let nvml = NVML.get_or_init(load).as_ref().map_err(Clone::clone)?;
    let found = WHOLE
        .get(device)
        .ok_or_else(|| format!("device {device} is beyond those gpucap tracks"))?
        .get_or_init(|| find_whole_gpu(device).map(|(_, h, uuid)| (h as usize, uuid)));
    let (h, uuid) = found.as_ref().map_err(Clone::clone)?;
    Ok((nvml, *h as Handle, uuid.clone()))
}

/// [`whole_gpu`], asked of NVML.
fn find_whole_gpu(device: usize) -> Result<(&'static Nvml, Handle, String), String> {
    let nvml = NVML.get_or_init(load).as_ref().map_err(Clone::clone)?;
    let uuid = gpu_uuid(device)?;
    let text = CString::new(uuid.as_str()).map_err(|_| "a UUID with a NUL byte".to_string())?;
    let mut h: Handle = null_mut();
    // SAFETY: a NUL-terminated UUID and a valid out-pointer.
    let rc = unsafe { (nvml.by_uuid)(text.as_ptr(), &mut h) };
    if rc != NVML_SUCCESS {
        return Err(format!(
            "NVML has no GPU {uuid} (error {rc}; a MIG instance is not measured by NVML)"
        ));
    }
    if let Some(is_mig) = nvml.is_mig {
        let mut mig = 0u32;
        // SAFETY: a handle NVML gave, a valid out-pointer.
        if unsafe { is_mig(h, &mut mig) } == NVML_SUCCESS && mig != 0 {
            return Err(format!("{uuid} is a MIG instance"));
        }
    }
    if let Some(mode) = nvml.mig_mode {
        let (mut current, mut pending) = (0u32, 0u32);
        // SAFETY: a handle NVML gave, valid out-pointers.
        if unsafe { mode(h, &mut current, &mut pending) } == NVML_SUCCESS
            && current == NVML_MIG_ENABLE
        {
            return Err(format!(
                "{uuid} is in MIG mode: its device-wide figure is not this instance's"
            ));
        }
    }
    Ok((nvml, h, uuid))
}

/// The free memory of CUDA device `device` by NVML (device-wide, every process's use
/// counted), or why NVML cannot say.
pub fn device_free(device: usize) -> Result<u64, String> {
    let (nvml, h, uuid) = whole_gpu(device)?;
    let mut m = NvmlMemory::default();
    // SAFETY: a handle NVML gave, a valid out-pointer of nvmlMemory_t's layout.
    let rc = unsafe { (nvml.memory)(h, &mut m) };
    if rc != NVML_SUCCESS {
        return Err(format!(
            "nvmlDeviceGetMemoryInfo failed for {uuid} (error {rc})"
        ));
    }
    Ok(m.free)
}

/// `nvmlProcessInfo_v2_t`, what `nvmlDeviceGetComputeRunningProcesses_v3` fills.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessV2 {
    pid: u32,
    used: u64,
    gpu_instance: u32,
    compute_instance: u32,
}

/// NVML's "value not available" (a driver that does not say, some containers).
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// `NVML_ERROR_INSUFFICIENT_SIZE`: the caller's array is too small (the count says how
/// many there are).
const NVML_ERROR_INSUFFICIENT_SIZE: u32 = 7;
/// Processes asked for beyond the count NVML gave, for those that start meanwhile.
const LIST_SLACK: usize = 16;
/// Room in the first call: the whole list of most GPUs in one call.
const LIST_FIRST_ROOM: usize = 64;
/// Tries to read the whole list while processes keep starting.
const LIST_TRIES: usize = 8;

/// Every compute process NVML lists on `h`, however many: asked with room for
/// [`LIST_FIRST_ROOM`] (one call on most GPUs; a first use's measurement reads the list
/// twice, and a framework's runtime makes tens of thousands of them), the array grown
/// to the count NVML says and the call made again while it answers "insufficient size".
fn all_processes(nvml: &Nvml, h: Handle, uuid: &str) -> Result<Vec<NvmlProcessV2>, String> {
    let list = nvml
        .processes
        .ok_or("NVML has no nvmlDeviceGetComputeRunningProcesses_v3")?;
    // Room NVML fills, not zeroed first (plain integers, each entry written by NVML).
    let mut infos: Vec<NvmlProcessV2> = Vec::with_capacity(LIST_FIRST_ROOM);
    let mut rc = NVML_SUCCESS;
    for _ in 0..LIST_TRIES {
        let mut room = u32::try_from(infos.capacity()).unwrap_or(u32::MAX);
        // SAFETY: a handle NVML gave, room for `room` entries of the v3 call's layout.
        rc = unsafe { list(h, &mut room, infos.as_mut_ptr()) };
        match rc {
            NVML_SUCCESS => {
                // SAFETY: NVML wrote the first `room` entries (never more than it had room
                // for; bounded again here), each of integers only.
                unsafe { infos.set_len((room as usize).min(infos.capacity())) };
                return Ok(infos);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => {
                infos = Vec::with_capacity(room as usize + LIST_SLACK);
            }
            _ => break,
        }
    }
    Err(format!(
        "nvmlDeviceGetComputeRunningProcesses_v3 failed for {uuid} (error {rc})"
    ))
}

/// The pid NVML lists this process under, where it is provably this process's
/// (`gpucap_core::pid_namespace`): None inside a PID namespace whose host pid is not
/// known. Read once per process (a forked child, its own pid, reads its own): a
/// framework's runtime makes tens of thousands of first uses, each measured with it.
fn pid_in_nvml() -> Option<u32> {
    // This process's pid in the high half (never 0: nothing read yet is 0), the answer
    // plus 1 in the low (0: None).
    static READ: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    let read = READ.load(Relaxed);
    if read >> 32 == u64::from(pid) {
        return u32::try_from((read & 0xffff_ffff).checked_sub(1)?).ok();
    }
    let found = read_pid_in_nvml();
    let low = found.map_or(0, |p| u64::from(p) + 1);
    READ.store((u64::from(pid) << 32) | low, Relaxed);
    found
}

fn read_pid_in_nvml() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let ns = |path: &str| std::fs::metadata(path).ok().map(|m| m.ino());
    let own = Some(gpucap_pool_file::own_pid_namespace()).filter(|&n| n != 0);
    if own == Some(gpucap_core::pid_namespace::INITIAL_PID_NAMESPACE) {
        return Some(std::process::id());
    }
    let status = std::fs::read_to_string("/proc/self/status").ok();
    gpucap_core::pid_namespace::pid_in_nvml(
        own,
        std::process::id(),
        status.as_deref(),
        ns("/proc/1/ns/pid"),
    )
}

/// The device memory the driver counts for this process on CUDA device `device`: None
/// when NVML does not list this process there, or why NVML cannot say. Only where the
/// pid NVML lists it under is provably its own ([`pid_in_nvml`]): in a container NVML
/// lists the host's pids, and the same number there is another process (whose figure,
/// unmoved by this process's load, would measure nothing and leave it uncharged for
/// good); there this says why, and the caller measures device-wide. Not listed is
/// never 0 either: a process that holds nothing yet is not listed (the caller tells
/// the two apart).
pub fn own_used(device: usize) -> Result<Option<u64>, String> {
    let me = pid_in_nvml().ok_or(
        "this process's pid as NVML lists it is not known (another PID namespace than the host's)",
    )?;
    let (nvml, h, uuid) = whole_gpu(device)?;
    match all_processes(nvml, h, &uuid)?.iter().find(|p| p.pid == me) {
        None => Ok(None),
        Some(p) if p.used == NVML_VALUE_NOT_AVAILABLE => Err(format!(
            "NVML does not say what this process uses on {uuid}"
        )),
        Some(p) => Ok(Some(p.used)),
    }
}

/// What the driver shows of the GPU whose UUID is `uuid` (`gpucap_core::budget::show_driver`:
/// a dead pool member's bytes in another PID namespace): the pids NVML lists on it, read
/// whole, and its device-wide used memory. Each None where NVML cannot say (no NVML, a
/// GPU it does not know by that UUID, a MIG instance: its device-wide figure is not the
/// instance's).
pub fn driver_shows(uuid: &[u8; 16]) -> gpucap_core::budget::DriverShows {
    let Some((nvml, h, text)) = gpu_by_uuid(uuid) else {
        return gpucap_core::budget::DriverShows::default();
    };
    let mut m = NvmlMemory::default();
    // SAFETY: a handle NVML gave, a valid out-pointer of nvmlMemory_t's layout.
    let used = (unsafe { (nvml.memory)(h, &mut m) } == NVML_SUCCESS).then_some(m.used);
    let pids = all_processes(nvml, h, &text)
        .ok()
        .map(|l| l.iter().map(|p| p.pid).collect());
    gpucap_core::budget::DriverShows { pids, used }
}

/// NVML and its handle of the whole GPU `uuid` names (not one in MIG mode), with the
/// UUID's text.
fn gpu_by_uuid(uuid: &[u8; 16]) -> Option<(&'static Nvml, Handle, String)> {
    let nvml = NVML.get_or_init(load).as_ref().ok()?;
    let text = gpucap_core::nvml::uuid_text("GPU", uuid);
    let c = CString::new(text.as_str()).ok()?;
    let mut h: Handle = null_mut();
    // SAFETY: a NUL-terminated UUID and a valid out-pointer.
    if unsafe { (nvml.by_uuid)(c.as_ptr(), &mut h) } != NVML_SUCCESS {
        return None;
    }
    if let Some(mode) = nvml.mig_mode {
        let (mut current, mut pending) = (0u32, 0u32);
        // SAFETY: a handle NVML gave, valid out-pointers.
        if unsafe { mode(h, &mut current, &mut pending) } == NVML_SUCCESS
            && current == NVML_MIG_ENABLE
        {
            return None;
        }
    }
    Some((nvml, h, text))
}
