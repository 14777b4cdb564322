//! cuGetProcAddress(_v2): the address of the exported variant the table resolves to.

use crate::abi::*;
use crate::procaddr::{Resolution, TABLE, VALID_FLAGS};
use libc::{c_char, c_int, c_void};

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CuResult {
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(pfn, std::ptr::null_mut())?;
    let name = cstr(symbol).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags & !VALID_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let set_status = |s: c_int| {
        if status.is_null() {
            Ok(())
        } else {
            out(status, s)
        }
    };
    match TABLE.resolve(name, version, flags) {
        Resolution::Found(export) => match crate::generated::export_address(export) {
            Some(addr) => {
                note(|| format!("{name} -> {export}"));
                set_status(0)?;
                out(pfn, addr as *mut c_void)
            }
            None => {
                set_status(1)?;
                Err(CUDA_ERROR_NOT_FOUND)
            }
        },
        Resolution::NotFound => {
            note(|| format!("{name:?} -> SYMBOL_NOT_FOUND"));
            set_status(1)?;
            Err(CUDA_ERROR_NOT_FOUND)
        }
        Resolution::VersionNotSufficient => {
            note(|| format!("{name} -> VERSION_NOT_SUFFICIENT"));
            set_status(2)?;
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}

crate::abi::exports! {
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64) {
        get_proc_address(symbol, pfn, cuda_version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: u64, symbol_status: *mut c_int) {
        get_proc_address(symbol, pfn, cuda_version, flags, symbol_status)
    }
}
