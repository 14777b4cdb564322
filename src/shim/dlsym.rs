//! The exported `dlsym` and `dlvsym`: a program that looks up a hooked driver or NVML
//! symbol on a library handle gets our hook (and the driver's function is learnt from
//! the lookup), and with `RTLD_DEFAULT` the global scope's answer; the loader's `dlsym`,
//! `dlvsym`, `dlopen` and `dlmopen` the global scope's where glibc would answer its own,
//! and this library's where they are asked for by version or as the next definition
//! after this library; everything else goes to glibc's function by a tail jump. Runs
//! before any constructor and re-entrantly: no allocation, no locks, no environment.

use std::ffi::{CStr, c_char, c_void};
use std::ptr::null_mut;

use crate::entry::{Decision, tail_jump_entry};
use crate::resolve::{
    DlvsymFn, glibc_loader_function, in_driver, is_nvml, real_dlsym, real_dlvsym, remember_library,
};
use crate::table::{Hook, never_the_driver, row_named};

/// Decides a `dlsym` call: our hook for a hooked driver symbol looked up on a
/// library handle, else "forward to glibc" so glibc sees the original caller.
extern "C" fn dlsym_decide(
    handle: *mut c_void,
    symbol: *const c_char,
    _none: usize,
    caller: *mut c_void,
) -> Decision {
    let Some(real) = real_dlsym() else {
        // No glibc dlsym: nothing can be looked up at all.
        return Decision::answer(null_mut());
    };
    let forward = Decision::forward(real as *mut c_void);
    // Another copy of this library (loaded first, it caps) asking for its own real
    // functions: glibc's answers, never this copy's decisions (each would ask the other).
    if symbol.is_null() || crate::elf::in_other_copy(caller as usize) {
        return forward;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if handle == libc::RTLD_NEXT {
        return next_definition(name, caller, forward);
    }
    let Some(row) = row_named(name) else {
        return match glibc_loader_function(name) {
            Some(glibc) => Decision::answer(loader_function(real, handle, symbol, glibc)),
            None => forward,
        };
    };
    if handle == libc::RTLD_DEFAULT {
        // The process's global scope's answer (our export, unless the program defines the
        // name itself), asked from here: glibc would answer a caller opened with
        // RTLD_DEEPBIND from its own dependencies first, the driver's function.
        // SAFETY: real dlsym with RTLD_DEFAULT and a NUL-terminated name.
        return Decision::answer(unsafe { real(handle, symbol) });
    }
    // SAFETY: real dlsym on the caller's handle; the caller identity does not matter
    // for a handle lookup.
    driver_answer(row, handle, unsafe { real(handle, symbol) })
}

/// glibc's answer `p` to a lookup of a hooked name on `handle`: the hook where it is a
/// function of the driver's (learnt from a library handle), else `p` itself: another
/// library's own definition of the name (a wrapper of it, which forwards to the next
/// definition, the hook) is what the program asked that library for, and never the
/// driver's function the hook calls.
fn driver_answer(row: &Hook, handle: *mut c_void, p: *mut c_void) -> Decision {
    if p.is_null() || never_the_driver(p) {
        return Decision::answer(p);
    }
    if handle != libc::RTLD_DEFAULT {
        let nvml = is_nvml(row.name_bytes());
        if !in_driver(nvml, p) {
            return Decision::answer(p);
        }
        remember_library(nvml, handle);
        row.learn(p);
    }
    Decision::answer(row.hook as *mut c_void)
}

/// `dlsym(RTLD_NEXT, name)` from `caller`: relative to the caller, which only glibc,
/// reached by the tail jump (`forward`), can know; except a hooked name asked from an
/// object after this library in the loader's list, for which the next definition is the
/// driver's own (or an interposer's preloaded after gpucap, which would forward to it):
/// the hook, what that object's own references to the name bind to. Interposers
/// preloaded before gpucap reach its hook through glibc, as before; so does an object
/// whose own function the hook forwards to (taken for the driver's from a `dlsym` on
/// its handle): answered the hook, the two would call each other without end. The same
/// for the loader's names from after this library: the next is the C library's own
/// (whose `dlsym` answers the driver's functions), answered with this library's.
fn next_definition(name: &[u8], caller: *mut c_void, forward: Decision) -> Decision {
    let after = |not_in: usize| crate::rebind::loaded_after_this_library(caller as usize, not_in);
    match row_named(name) {
        Some(row) if after(row.slot.known() as usize) => Decision::answer(row.hook as *mut c_void),
        None if glibc_loader_function(name).is_some() && after(0) => own_or(name, forward),
        _ => forward,
    }
}

/// This library's export of the loader's `name`, else `otherwise`.
fn own_or(name: &[u8], otherwise: Decision) -> Decision {
    crate::elf::own_function(name).map_or(otherwise, |f| Decision::answer(f as *mut c_void))
}

/// Decides a `dlvsym` call. glibc's `dlvsym` never answers this library's exports (they
/// carry no version, and a lookup by version passes over them): a hooked name it finds
/// on a library handle or from the global scope is the driver's, answered with the hook
/// as `dlsym` does; the loader's `dlsym`, `dlvsym`, `dlopen` and `dlmopen` it answers
/// with the C library's own (whose `dlsym` answers the driver's functions, whose
/// `dlopen` leaves a library opened with `RTLD_DEEPBIND` unbound), answered with this
/// library's: the way interposers that wrap `dlsym` take the one they wrap. A hooked
/// name asked for by `RTLD_NEXT` goes to glibc (relative to the caller; a driver that
/// versions none of its functions answers none).
extern "C" fn dlvsym_decide(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
    caller: *mut c_void,
) -> Decision {
    let Some(real) = real_dlvsym() else {
        return Decision::answer(null_mut());
    };
    let forward = Decision::forward(real as *mut c_void);
    // As in `dlsym_decide`: another copy's lookups are glibc's.
    if symbol.is_null() || version.is_null() || crate::elf::in_other_copy(caller as usize) {
        return forward;
    }
    // SAFETY: dlvsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if let Some(glibc) = glibc_loader_function(name) {
        // The global scope's answer for RTLD_NEXT: glibc's own where the version names
        // it, as it would be for a caller before the C library.
        let at = if handle == libc::RTLD_NEXT {
            libc::RTLD_DEFAULT
        } else {
            handle
        };
        let p = versioned(real, at, symbol, version);
        return match p == glibc {
            true => own_or(name, Decision::answer(p)),
            false if handle == libc::RTLD_NEXT => forward,
            false => Decision::answer(p),
        };
    }
    match row_named(name) {
        Some(row) if handle != libc::RTLD_NEXT => {
            driver_answer(row, handle, versioned(real, handle, symbol, version))
        }
        _ => forward,
    }
}

/// glibc's `dlvsym(handle, symbol, version)`, asked from here (not `RTLD_NEXT`).
fn versioned(
    real: DlvsymFn,
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // SAFETY: glibc's dlvsym with the caller's handle and NUL-terminated strings.
    unsafe { real(handle, symbol, version) }
}

/// `dlsym`, `dlopen` or `dlmopen` looked up on `handle` (`glibc` being glibc's own): the
/// global scope's definition (this library's export, unless the program defines its
/// own), asked from here, where glibc's answer is glibc's own function or the lookup is
/// `RTLD_DEFAULT`: what a library opened without `RTLD_DEEPBIND` binds the name to. A
/// library opened with the flag would get glibc's own from `RTLD_DEFAULT`, and any
/// caller from the C library's handle, and the libraries it then opened with the flag
/// would never be bound to the hooks.
fn loader_function(
    real: crate::resolve::DlsymFn,
    handle: *mut c_void,
    symbol: *const c_char,
    glibc: *mut c_void,
) -> *mut c_void {
    if handle != libc::RTLD_DEFAULT {
        // SAFETY: real dlsym on the caller's handle with its NUL-terminated name.
        let p = unsafe { real(handle, symbol) };
        if p != glibc {
            return p;
        }
    }
    // SAFETY: real dlsym with RTLD_DEFAULT and a NUL-terminated name.
    unsafe { real(libc::RTLD_DEFAULT, symbol) }
}

// The exported `dlsym` and `dlvsym`: glibc then sees the original return address and
// resolves `RTLD_NEXT` for the caller.
tail_jump_entry!(dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void => dlsym_decide);
tail_jump_entry!(dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void => dlvsym_decide);
