//! The exported functions of the hooked symbols, made from the one list of them
//! (`driver::hooked`). That list drives all three ways a program can reach them: the
//! symbols this library exports (programs linked with `-lcuda`), the answer of the
//! `dlsym` override (programs that `dlopen` libcuda), and the answer of the
//! `cuGetProcAddress` wrappers (cudart, cuda-python).
//!
//! Nothing here may allocate, lock or read the environment on the `dlsym` path:
//! it can run before any constructor and re-entrantly. State is lazily set atomics.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

use crate::driver::forward::Real;
use crate::driver::hooked::{ROWS, Row, SLOTS, Slot, hooked};
use crate::driver::types::{
    Array3DDescriptor, Array3DDescriptorV1, ArrayDescriptor, ArrayDescriptorV1, ArrayMapInfo,
    CText, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CuResult, Dptr,
    GraphNodeParamsHead, Handle, In, InArray, InstantiateParams, KernelNodeParams,
    KernelNodeParamsV1, LaunchConfigHead, LocationPrefix, MultiDeviceLaunch, NvmlProcessDetailList,
    Out, OutArray, PER_THREAD_DEFAULT_STREAM, Stream,
};
use crate::hooks;
use gpucap_core::nvml::{NvmlMemory, NvmlMemoryV2, NvmlProcessV1, NvmlProcessV2};

/// One hooked driver symbol: its row of the list (names, the driver's function) and
/// our exported function.
pub struct Hook {
    pub slot: &'static Slot,
    /// Our exported function.
    pub hook: *const c_void,
}

// SAFETY: `hook` is the address of a function, immutable; the slot is `Sync`.
unsafe impl Sync for Hook {}

impl Hook {
    pub fn name_bytes(&self) -> &'static [u8] {
        self.slot.name_bytes()
    }

    /// The driver's function, resolved on first use.
    #[inline(always)]
    pub fn real(&self) -> *mut c_void {
        self.slot.real()
    }

    /// Records a driver address for this symbol found elsewhere (by a client's
    /// `dlsym` or `cuGetProcAddress`). Our own hooks are never taken for the driver.
    pub fn learn(&self, p: *mut c_void) {
        if !p.is_null() && !never_the_driver(p) {
            self.slot.record(p);
        }
    }
}

/// Makes the exported functions from the rows of [`hooked!`]: each row exports
/// `extern "C" fn $sym`, which looks up the driver's function and hands it, as a
/// [`Real`], with the arguments to the hook, inside a panic guard. The same rows fill
/// [`HOOKS`].
macro_rules! hook_table {
    ($( $sym:ident = $base:literal @ $since:literal $($ptsz:ident)? : ($($arg:ident : $ty:ty),*) => $hook:path; )*) => {
        pub static HOOKS: [Hook; ROWS] = [$(
            Hook {
                slot: &SLOTS[Row::$sym as usize],
                hook: $sym as *const c_void,
            }
        ),*];

        $(
            #[unsafe(no_mangle)]
            #[allow(non_snake_case)]
            pub unsafe extern "C" fn $sym($($arg: $ty),*) -> CuResult {
                let p = SLOTS[Row::$sym as usize].real();
                // SAFETY: `p` is the driver's export of this very name, whose C
                // signature is the one this row declares.
                let real = (!p.is_null()).then(|| unsafe { Real::<($($ty,)*)>::from_raw(p) });
                guard(|| match real {
                    Some(real) => $hook(real, $($arg),*),
                    None => CUDA_ERROR_NOT_FOUND,
                })
            }
        )*
    };
}

/// Runs a hook body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of crossing the
/// C boundary.
fn guard(f: impl FnOnce() -> CuResult) -> CuResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

hooked!(hook_table);

pub fn is_hook(p: *const c_void) -> bool {
    HOOKS.iter().any(|h| h.hook == p)
}

/// Whether `p`, an answer of the loader or the driver, can never be the driver's own
/// function: one of our hooks, or an address in the main program (a non-PIE program's
/// canonical PLT entry of a hooked name, which leads back to the hook; see
/// `resolve::in_main_program`).
pub fn never_the_driver(p: *const c_void) -> bool {
    is_hook(p) || crate::resolve::in_main_program(p)
}

/// The row for an exported variant name, without allocating (a name that is no driver
/// or NVML name, `cu…` or `nvml…`, is told apart by its first bytes).
pub fn row_named(name: &[u8]) -> Option<&'static Hook> {
    if !name.starts_with(b"cu") && !crate::resolve::is_nvml(name) {
        return None;
    }
    HOOKS.iter().find(|h| h.name_bytes() == name)
}

// ---------------------------------------------------------------------------
// cuGetProcAddress

fn get_proc_address_v1(
    real: Real<(*const c_char, *mut *mut c_void, c_int, u64)>,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    let rc = real.call(symbol, pfn, version, flags);
    log_procaddr(rc, symbol, version, flags);
    substitute(rc, symbol, pfn, version, flags)
}

fn get_proc_address_v2(
    real: Real<(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int)>,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    let rc = real.call(symbol, pfn, version, flags, status);
    log_procaddr(rc, symbol, version, flags);
    substitute(rc, symbol, pfn, version, flags)
}

/// Whether `GPUCAP_LOG=debug`: reads the configuration (the environment) on the first
/// request, which may come before any other hooked call. Only on the `cuGetProcAddress`
/// and `cuGetExportTable` paths, called by the client, never from `dlsym`.
fn debug_enabled() -> bool {
    let _ = crate::state::SHIM.config_quiet();
    crate::log::LEVEL.load(Relaxed) >= gpucap_core::config::LogLevel::Debug as u8
}

/// `gpucap: driver request: procaddr NAME VERSION FLAGS -> RC` at debug level: what the
/// client asked for (scripts/gpu/probe-driver.sh asks the real driver the same).
fn log_procaddr(rc: CuResult, symbol: *const c_char, version: c_int, flags: u64) {
    if symbol.is_null() || !debug_enabled() {
        return;
    }
    // SAFETY: the caller's NUL-terminated symbol name (checked non-null).
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    // cudart asks for the empty name first: written "" so the line keeps its fields.
    let name = if name.is_empty() { "\"\"".into() } else { name };
    crate::log::log!(
        Debug,
        "driver request: procaddr {name} {version} {flags} -> {rc}"
    );
}

fn get_export_table(
    real: Real<(*mut *const c_void, *const [u8; 16])>,
    table: *mut *const c_void,
    id: *const [u8; 16],
) -> CuResult {
    let rc = real.call(table, id);
    if !id.is_null() && debug_enabled() {
        // SAFETY: the caller's 16-byte UUID (checked non-null).
        let u = unsafe { *id };
        crate::log::log!(
            Debug,
            "driver request: export {} -> {rc}",
            gpucap_core::nvml::uuid_text("", &u)
        );
    }
    rc
}

/// After the driver answered `cuGetProcAddress`, replaces its pointer by the hook
/// of exactly the variant it returned.
fn substitute(
    rc: CuResult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CuResult {
    if rc != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return rc;
    }
    // SAFETY: the driver succeeded, so `pfn` is a valid out-pointer it filled.
    let p = unsafe { *pfn };
    // SAFETY: the caller's NUL-terminated symbol name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if let Some(row) = identify(name, p, version, flags) {
        // SAFETY: as above.
        unsafe { *pfn = row.hook as *mut c_void };
    }
    rc
}

/// Which hooked variant the driver returned for a request, if any.
fn identify(name: &[u8], p: *mut c_void, version: c_int, flags: u64) -> Option<&'static Hook> {
    if p.is_null() || never_the_driver(p) {
        return None;
    }
    let candidates = || {
        HOOKS
            .iter()
            .filter(|h| h.slot.base.as_bytes() == name || h.name_bytes() == name)
    };
    // The driver hands out its exports: find the one it returned.
    if let Some(row) = candidates().find(|h| h.real() == p) {
        return Some(row);
    }
    // Not one of the exports we know by address: pick by the version rules. Taken
    // only if that variant's export is unknown, so no two addresses compete.
    let pick = |per_thread: bool| {
        candidates()
            .filter(|h| h.slot.since <= version && h.slot.per_thread == per_thread)
            .max_by_key(|h| h.slot.since)
    };
    let row = if flags & PER_THREAD_DEFAULT_STREAM != 0 {
        pick(true).or_else(|| pick(false))
    } else {
        pick(false)
    }?;
    if row.real().is_null() {
        row.learn(p);
        return Some(row);
    }
    crate::log::log!(
        Warn,
        "cuGetProcAddress({}, {version}, {flags}) returned an entry point gpucap does not recognise: it is not intercepted",
        String::from_utf8_lossy(name)
    );
    None
}
