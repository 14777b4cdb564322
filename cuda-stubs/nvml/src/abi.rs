//! The C ABI edge of the fake NVML, at its bottom (it imports nothing of the crate): return
//! codes and their strings, the C structs it fills, the `exports!` and `stubs!` macros (no
//! unwinding across the boundary, tracing) and raw-pointer helpers.

use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use libc::{c_char, c_uint};

pub type nvmlReturn_t = c_uint;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

pub type Res = Result<(), nvmlReturn_t>;

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

/// nvmlProcessDetail_v1_t: an entry of nvmlDeviceGetRunningProcessDetailList's list.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nvmlProcessDetail_v1_t {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
    pub used_gpu_cc_protected_memory: u64,
}

/// nvmlProcessDetailList_v1_t: what nvmlDeviceGetRunningProcessDetailList fills.
#[repr(C)]
pub struct nvmlProcessDetailList_v1_t {
    pub version: c_uint,
    pub mode: c_uint,
    pub num_proc_array_entries: c_uint,
    pub proc_array: *mut nvmlProcessDetail_v1_t,
}

/// NVML_STRUCT_VERSION(ProcessDetailList, 1).
pub const NVML_PROCESS_DETAIL_LIST_V1: c_uint =
    std::mem::size_of::<nvmlProcessDetailList_v1_t>() as c_uint | (1 << 24);
/// nvmlProcessMode_t: compute, graphics, MPS, all.
pub const NVML_PROCESS_MODE_COMPUTE: c_uint = 0;
pub const NVML_PROCESS_MODE_ALL: c_uint = 3;

const _: () = assert!(std::mem::size_of::<nvmlMemory_t>() == 24);
const _: () = assert!(NVML_PROCESS_DETAIL_LIST_V1 == 0x0100_0018);
const _: () = assert!(std::mem::size_of::<nvmlProcessDetail_v1_t>() == 32);
const _: () = assert!(NVML_MEMORY_V2 == 0x0200_0028);
const _: () = assert!(std::mem::size_of::<nvmlPciInfo_t>() == 68);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_v1_t>() == 16);
const _: () = assert!(std::mem::size_of::<nvmlProcessInfo_v2_t>() == 24);

/// Writes one `fakenvml:` line to stderr.
pub fn log(msg: &str) {
    fake_gpu::trace::log("fakenvml", msg);
}

/// Runs an entry point body: catches panics (NVML_ERROR_UNKNOWN), traces name and result.
pub fn call(name: &str, body: impl FnOnce() -> Res) -> nvmlReturn_t {
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
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::abi::nvmlReturn_t {
            $crate::abi::call(stringify!($name), move || -> $crate::abi::Res { $body })
        }
    )*};
}
pub(crate) use exports;

/// NVML_ERROR_NOT_SUPPORTED for each name (ignoring arguments is ABI-safe on x86_64 SysV).
/// Also defines `STUBS`, their names (checked against cuda-stubs/STUBS.md by a test).
macro_rules! stubs {
    ($($name:ident),* $(,)?) => {
        #[cfg(test)]
        pub(crate) const STUBS: &[&str] = &[$(stringify!($name)),*];
        $(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> $crate::abi::nvmlReturn_t {
            $crate::abi::call(stringify!($name), || Err($crate::abi::NVML_ERROR_NOT_SUPPORTED))
        }
    )*};
}
pub(crate) use stubs;

/// Writes `v` through the caller's output pointer; NVML_ERROR_INVALID_ARGUMENT when NULL.
pub fn out<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null output pointer from the C caller for a value of this type.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `s` and a NUL into the caller's buffer of `len` bytes.
pub fn out_str(buf: *mut c_char, len: c_uint, s: &str) -> Res {
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

/// Reads the caller's NUL-terminated UTF-8 string.
pub fn in_str<'a>(p: *const c_char) -> Result<&'a str, nvmlReturn_t> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: a NUL-terminated string from the C caller.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

/// `s` as a fixed-size NUL-terminated C string (cut to fit).
pub fn fill<const N: usize>(s: &str) -> [c_char; N] {
    let mut b = [0 as c_char; N];
    for (d, c) in b.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = c as c_char;
    }
    b
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
