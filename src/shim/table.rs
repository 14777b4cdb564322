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

        /// The rows by the hash of their variant names (`cuMemAlloc_v2`) and of the
        /// names `cuGetProcAddress` is asked for (`cuMemAlloc`), made at compile time (no
        /// pointers: nothing more for the loader to relocate at every start).
        static BY_NAME: Index = Index::of(&[$(stringify!($sym)),*]);
        static BY_BASE: Index = Index::of(&[$($base),*]);

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

/// The rows ordered by the hash of a key of theirs, made at compile time: a name is
/// found by its hash's binary search, not by reading every row (a `cuGetProcAddress`
/// request, of which the CUDA runtime makes some 500 at its start, read every row twice).
struct Index {
    /// Row numbers, by hash.
    rows: [u16; ROWS],
    /// Their keys' hashes, ascending.
    hashes: [u32; ROWS],
}

impl Index {
    const fn of(keys: &[&str; ROWS]) -> Index {
        let mut ix = Index {
            rows: [0; ROWS],
            hashes: [0; ROWS],
        };
        let mut i = 0;
        while i < ROWS {
            ix.rows[i] = i as u16;
            ix.hashes[i] = hash(keys[i].as_bytes());
            i += 1;
        }
        // Insertion sort by hash: some 140 rows, once, by the compiler.
        let mut i = 1;
        while i < ROWS {
            let mut j = i;
            while j > 0 && ix.hashes[j] < ix.hashes[j - 1] {
                let (r, h) = (ix.rows[j], ix.hashes[j]);
                ix.rows[j] = ix.rows[j - 1];
                ix.hashes[j] = ix.hashes[j - 1];
                ix.rows[j - 1] = r;
                ix.hashes[j - 1] = h;
                j -= 1;
            }
            i += 1;
        }
        ix
    }

    /// The rows whose key (`key_of`) is `key`, whose [`hash`] is `h`.
    fn rows<'k>(
        &'static self,
        key_of: fn(&Hook) -> &[u8],
        key: &'k [u8],
        h: u32,
    ) -> impl Iterator<Item = &'static Hook> + Clone + 'k {
        let lo = self.hashes.partition_point(|&x| x < h);
        self.rows[lo..]
            .iter()
            .zip(&self.hashes[lo..])
            .take_while(move |&(_, &x)| x == h)
            .map(|(&i, _)| &HOOKS[i as usize])
            .filter(move |row| key_of(row) == key)
    }
}

/// FNV-1a of `bytes`.
const fn hash(bytes: &[u8]) -> u32 {
    let mut h = 0x811c_9dc5u32;
    let mut i = 0;
    while i < bytes.len() {
        h = (h ^ bytes[i] as u32).wrapping_mul(0x0100_0193);
        i += 1;
    }
    h
}

/// A row's variant name, and the name `cuGetProcAddress` is asked for.
fn name_of(h: &Hook) -> &[u8] {
    h.name_bytes()
}
fn base_of(h: &Hook) -> &[u8] {
    h.slot.base.as_bytes()
}

/// Whether `p`, an answer of the loader or the driver, can never be the driver's own
/// function: one of our hooks, or an address in the main program (a non-PIE program's
/// canonical PLT entry of a hooked name, which leads back to the hook; see
/// `resolve::in_main_program`).
pub fn never_the_driver(p: *const c_void) -> bool {
    crate::resolve::in_this_library(p).unwrap_or_else(|| is_hook(p))
        || crate::resolve::in_main_program(p)
}

/// The row for an exported variant name, without allocating (a name that is no driver
/// or NVML name, `cu…` or `nvml…`, is told apart by its first bytes).
#[inline(always)] // every lookup asks: every other name is told in two comparisons
pub fn row_named(name: &[u8]) -> Option<&'static Hook> {
    if !name.starts_with(b"cu") && !crate::resolve::is_nvml(name) {
        return None;
    }
    row_of_driver_name(name)
}

fn row_of_driver_name(name: &[u8]) -> Option<&'static Hook> {
    BY_NAME.rows(name_of, name, hash(name)).next()
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
    // The rows asked for by this name or named so (each found once).
    let h = hash(name);
    let (by_base, by_name) = (
        BY_BASE.rows(base_of, name, h),
        BY_NAME.rows(name_of, name, h),
    );
    let candidates = || by_base.clone().chain(by_name.clone());
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
