//! The process's environment, read for the configuration at the FFI edge: only the
//! variables the configuration looks at are copied (`std::env::vars_os` copies every
//! variable of the process, two allocations each, on every process's first CUDA call).

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// The `(name, value)` pairs of the environment whose names
/// `gpucap_core::config::looked_at` names, in the environment's order.
pub fn config_vars() -> Vec<(OsString, OsString)> {
    let mut vars = Vec::new();
    // SAFETY: `environ` is the C library's NULL-terminated array of NUL-terminated
    // `NAME=value` strings; read as glibc's own `getenv` reads it (a thread that
    // calls `setenv` meanwhile races `getenv` alike).
    let mut p = unsafe { libc::environ };
    while !p.is_null() {
        // SAFETY: `p` points into the array, at most at its NULL terminator.
        let entry = unsafe { *p };
        if entry.is_null() {
            break;
        }
        // SAFETY: a non-null entry of `environ` is a NUL-terminated string.
        let bytes = unsafe { CStr::from_ptr(entry) }.to_bytes();
        if let Some(eq) = bytes.iter().position(|&b| b == b'=')
            && gpucap_core::config::looked_at(&bytes[..eq])
        {
            let (name, value) = (&bytes[..eq], &bytes[eq + 1..]);
            vars.push((
                std::ffi::OsStr::from_bytes(name).to_os_string(),
                std::ffi::OsStr::from_bytes(value).to_os_string(),
            ));
        }
        // SAFETY: not past the terminator (checked above).
        p = unsafe { p.add(1) };
    }
    vars
}

/// Whether the process runs in secure execution (`AT_SECURE`: set-user-ID,
/// set-group-ID or file capabilities, started by another user).
pub fn secure_execution() -> bool {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}
