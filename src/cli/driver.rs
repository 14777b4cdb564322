//! Asking the CUDA driver, if one can be loaded, how much memory each visible GPU has.
//! `gpucap check` lists the GPUs; `gpucap run` checks that libcuda.so.1 can be loaded
//! and, when `GPUCAP_LIMIT` names GPUs, that they are visible. The driver is opened with
//! dlopen, never linked.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

/// One visible GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    /// CUDA ordinal, as this process sees it (after CUDA_VISIBLE_DEVICES).
    pub ordinal: u32,
    /// Physical memory in bytes, as cuDeviceTotalMem_v2 reports it.
    pub total: u64,
    /// cuDeviceGetName, if it worked.
    pub name: Option<String>,
    /// cuDeviceGetUuid_v2 (cuDeviceGetUuid on older drivers), if it worked.
    pub uuid: Option<[u8; 16]>,
}

impl Device {
    /// This GPU's cap under `config` (`config::device_cap`: a fraction resolved against
    /// its memory, a ceiling handed down applied).
    pub fn cap(&self, config: &gpucap_core::config::Config) -> gpucap_core::config::DeviceCap {
        gpucap_core::config::device_cap(
            config,
            self.ordinal as usize,
            |s| s.for_device(self.ordinal, self.uuid.as_ref()),
            || Some(self.total),
        )
    }
}

/// What the driver said.
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    /// No libcuda.so.1 could be loaded (the dlerror text).
    NoDriver(String),
    /// The driver was loaded but could not be used (which call failed, and how).
    Failed(String),
    /// The visible devices (maybe none).
    Devices(Vec<Device>),
}

type CuResult = c_uint;
type CuInit = unsafe extern "C" fn(c_uint) -> CuResult;
type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> CuResult;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> CuResult;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult;
type CuGetErrorName = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// Looks up `name` (NUL-terminated) in `handle`.
fn sym(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: handle is a live dlopen handle and name is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// Where to read how to use gpucap without an NVIDIA driver (a README section).
pub const WITHOUT_A_GPU: &str = "to try gpucap without a GPU, use its fake GPU: see \"Without a GPU\" under \"Using it\" \
     in README.md (scripts/fake-gpu.sh)";

/// The one line that says no driver could be loaded (`why`: the loader's words) and
/// where to read how to go on without one.
pub fn no_driver_line(why: &str) -> String {
    let why = why.replace(['\n', '\r'], " ");
    format!("no NVIDIA driver: libcuda.so.1 cannot be loaded ({why}); {WITHOUT_A_GPU}")
}

/// dlopen(libcuda.so.1) with `mode`, or the loader's error. The handle is never
/// closed, so function pointers taken from it stay valid for the life of the process.
fn open(mode: c_int) -> Result<*mut c_void, String> {
    // SAFETY: dlopen with a NUL-terminated name.
    let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), mode | libc::RTLD_LOCAL) };
    if handle.is_null() {
        Err(dlerror_text())
    } else {
        Ok(handle)
    }
}

/// Whether libcuda.so.1 can be loaded (nothing is called in it, so its symbols are
/// bound lazily: `gpucap run` asks this before every program): the loader's error if not.
pub fn loadable() -> Result<(), String> {
    open(libc::RTLD_LAZY).map(|_| ())
}

/// Loads libcuda.so.1 and lists the visible devices with their memory.
pub fn probe() -> Probe {
    let handle = match open(libc::RTLD_NOW) {
        Ok(h) => h,
        Err(why) => return Probe::NoDriver(why),
    };
    macro_rules! required {
        ($name:literal, $ty:ty) => {
            match sym(handle, $name) {
                // SAFETY: the driver API's documented signature for this symbol.
                Some(p) => unsafe { std::mem::transmute::<*mut c_void, $ty>(p) },
                None => {
                    return Probe::Failed(format!("the driver has no {}", $name.to_string_lossy()))
                }
            }
        };
    }
    let cu_init = required!(c"cuInit", CuInit);
    let get_count = required!(c"cuDeviceGetCount", CuDeviceGetCount);
    let device_get = required!(c"cuDeviceGet", CuDeviceGet);
    let total_mem = required!(c"cuDeviceTotalMem_v2", CuDeviceTotalMem);
    // SAFETY (both): documented driver API signatures.
    let get_name = sym(handle, c"cuDeviceGetName")
        .map(|p| unsafe { std::mem::transmute::<*mut c_void, CuDeviceGetName>(p) });
    // SAFETY: documented driver API signature (CUuuid is 16 bytes).
    let get_uuid = sym(handle, c"cuDeviceGetUuid_v2")
        .or_else(|| sym(handle, c"cuDeviceGetUuid"))
        .map(|p| unsafe { std::mem::transmute::<*mut c_void, CuDeviceGetUuid>(p) });
    let error_name = sym(handle, c"cuGetErrorName")
        .map(|p| unsafe { std::mem::transmute::<*mut c_void, CuGetErrorName>(p) });

    let describe = |call: &str, rc: CuResult| -> String {
        let mut name: *const c_char = std::ptr::null();
        let known = error_name.is_some_and(|f| {
            // SAFETY: f writes a pointer to a static string, or fails.
            unsafe { f(rc, &mut name) == 0 && !name.is_null() }
        });
        if known {
            // SAFETY: checked non-null above; the driver's static string.
            let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            format!("{call} failed: {n} ({rc})")
        } else {
            format!("{call} failed: error {rc}")
        }
    };

    // SAFETY: plain driver API calls with valid out-pointers.
    unsafe {
        let rc = cu_init(0);
        if rc != 0 {
            return Probe::Failed(describe("cuInit", rc));
        }
        let mut count: c_int = 0;
        let rc = get_count(&mut count);
        if rc != 0 {
            return Probe::Failed(describe("cuDeviceGetCount", rc));
        }
        let mut devices = Vec::new();
        for ordinal in 0..count.max(0) {
            let mut dev: c_int = 0;
            let rc = device_get(&mut dev, ordinal);
            if rc != 0 {
                return Probe::Failed(describe(&format!("cuDeviceGet({ordinal})"), rc));
            }
            let mut total: usize = 0;
            let rc = total_mem(&mut total, dev);
            if rc != 0 {
                return Probe::Failed(describe(&format!("cuDeviceTotalMem_v2({ordinal})"), rc));
            }
            let name = get_name.and_then(|f| {
                let mut buf = [0 as c_char; 256];
                (f(buf.as_mut_ptr(), buf.len() as c_int - 1, dev) == 0)
                    .then(|| CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned())
                    .filter(|n| !n.is_empty())
            });
            let uuid = get_uuid.and_then(|f| {
                let mut u = [0u8; 16];
                (f(&mut u, dev) == 0).then_some(u)
            });
            devices.push(Device {
                ordinal: ordinal as u32,
                total: total as u64,
                name,
                uuid,
            });
        }
        Probe::Devices(devices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_no_driver_line_is_one_line_pointing_to_the_readme() {
        let line = no_driver_line("libcuda.so.1: cannot open shared object file\nsecond");
        assert!(!line.contains('\n'), "{line}");
        assert!(
            line.starts_with("no NVIDIA driver: libcuda.so.1 cannot be loaded (libcuda.so.1: "),
            "{line}"
        );
        assert!(
            line.contains("\"Without a GPU\" under \"Using it\" in README.md"),
            "{line}"
        );
    }
}
