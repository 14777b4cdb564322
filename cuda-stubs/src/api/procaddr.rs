//! cuGetProcAddress(_v2): the address of the exported variant the table resolves to.
//!
//! As a CUDA 13.0 driver answers (recorded on an H200, driver 580.159.04): a version
//! above the driver's own is CUDA_ERROR_INVALID_VALUE with no pointer; a name the table
//! lacks, or a version before its first variant, is CUDA_SUCCESS with a NULL pointer and
//! the status saying why from `cuGetProcAddress_v2` (the status is the answer there), and
//! CUDA_ERROR_NOT_FOUND from `cuGetProcAddress`, which has no status.

use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CuResult, cstr, note, out};
use crate::procaddr::{Resolution, TABLE, VALID_FLAGS};
use fake_gpu::config;
use libc::{c_char, c_int, c_void};

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: Option<*mut c_int>,
) -> CuResult {
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(pfn, std::ptr::null_mut())?;
    let name = cstr(symbol).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags & !VALID_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let driver = config::get()
        .map(|c| c.driver_version)
        .unwrap_or(config::DEFAULT_DRIVER_VERSION);
    if version > driver {
        note(|| format!("{name} {version}: newer than the driver ({driver})"));
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Not found: the status says why (`_v2`), or the result does (`cuGetProcAddress`).
    let not_found = |s: c_int| match status {
        Some(p) if !p.is_null() => out(p, s),
        Some(_) => Ok(()),
        None => Err(CUDA_ERROR_NOT_FOUND),
    };
    match TABLE.resolve(name, version, flags) {
        Resolution::Found(export) => match crate::generated::export_address(export) {
            Some(addr) => {
                note(|| format!("{name} -> {export}"));
                if let Some(p) = status.filter(|p| !p.is_null()) {
                    out(p, 0)?;
                }
                out(pfn, addr as *mut c_void)
            }
            None => not_found(1),
        },
        Resolution::NotFound => {
            note(|| format!("{name:?} -> SYMBOL_NOT_FOUND"));
            not_found(1)
        }
        Resolution::VersionNotSufficient => {
            note(|| format!("{name} -> VERSION_NOT_SUFFICIENT"));
            not_found(2)
        }
    }
}

crate::abi::exports! {
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) {
        get_proc_address(symbol, pfn, cuda_version, flags, None)
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, symbol_status: *mut c_int) {
        get_proc_address(symbol, pfn, cuda_version, flags, Some(symbol_status))
    }
}
