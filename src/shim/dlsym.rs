//! The exported `dlsym`: a program that looks up a hooked driver or NVML symbol on
//! a library handle gets our hook (and the driver's function is learnt from the
//! lookup), and with `RTLD_DEFAULT` the global scope's answer; everything else goes to
//! glibc's `dlsym` by a tail jump. Runs before any constructor and re-entrantly: no
//! allocation, no locks, no environment.

use std::ffi::{CStr, c_char, c_void};
use std::ptr::null_mut;

use crate::resolve::{is_nvml, real_dlsym, remember_library};
use crate::table::{never_the_driver, row_named};

#[repr(C)]
struct Decision {
    /// What `dlsym` returns when `forward` is null.
    value: *mut c_void,
    /// glibc's `dlsym`, to tail-jump to with the caller's own arguments.
    forward: *mut c_void,
}

/// Decides a `dlsym` call: our hook for a hooked driver symbol looked up on a
/// library handle, else "forward to glibc" so glibc sees the original caller.
extern "C" fn dlsym_decide(handle: *mut c_void, symbol: *const c_char) -> Decision {
    let Some(real) = real_dlsym() else {
        // No glibc dlsym: nothing can be looked up at all.
        return Decision {
            value: null_mut(),
            forward: null_mut(),
        };
    };
    let forward = Decision {
        value: null_mut(),
        forward: real as *mut c_void,
    };
    // RTLD_NEXT must stay relative to the caller, which only glibc, reached by the tail
    // jump, can know.
    if symbol.is_null() || handle == libc::RTLD_NEXT {
        return forward;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !name.starts_with(b"cu") && !is_nvml(name) {
        return forward;
    }
    let Some(row) = row_named(name) else {
        return forward;
    };
    if handle == libc::RTLD_DEFAULT {
        // The process's global scope's answer (our export, unless the program defines the
        // name itself), asked from here: glibc would answer a caller opened with
        // RTLD_DEEPBIND from its own dependencies first, the driver's function.
        return Decision {
            // SAFETY: real dlsym with RTLD_DEFAULT and a NUL-terminated name.
            value: unsafe { real(handle, symbol) },
            forward: null_mut(),
        };
    }
    // SAFETY: real dlsym on the caller's handle; the caller identity does not matter
    // for a handle lookup.
    let p = unsafe { real(handle, symbol) };
    if p.is_null() || never_the_driver(p) {
        return Decision {
            value: p,
            forward: null_mut(),
        };
    }
    remember_library(is_nvml(name), handle);
    row.learn(p);
    Decision {
        value: row.hook as *mut c_void,
        forward: null_mut(),
    }
}

/// The exported `dlsym`. A naked entry so that forwarding is a tail jump: glibc
/// then sees the original return address and resolves `RTLD_NEXT` for the caller.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",             // 16-byte alignment for the call
        "call {decide}",          // rax = value, rdx = forward
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rdx, rdx",
        "jnz 2f",
        "ret",
        "2:",
        "jmp rdx",                // tail jump: glibc's dlsym returns to our caller
        decide = sym dlsym_decide,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",            // x0 = value, x1 = forward
        "mov x16, x1",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbnz x16, 2f",
        "ret",
        "2:",
        "br x16",                 // tail jump with the caller's x30 restored
        decide = sym dlsym_decide,
    )
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("gpucap's dlsym entry is written for x86_64 and aarch64");
