//! The exported entries whose glibc function reads its caller's return address: `dlsym`
//! (`RTLD_NEXT` is relative to the caller), `dlopen` and `dlmopen` (a bare name is
//! searched for in the caller's `RUNPATH`, `RPATH` and namespace). Each is a naked
//! function that hands its arguments and that return address to a decision function,
//! then returns the decision's value or tail-jumps to glibc's function with the caller's
//! own arguments and return address, so glibc sees the caller, not the shim.

use std::ffi::c_void;
use std::ptr::null_mut;

/// What an entry does with a call.
#[repr(C)]
pub struct Decision {
    /// What the entry returns when `forward` is null.
    pub value: *mut c_void,
    /// glibc's function, to tail-jump to with the caller's own arguments.
    pub forward: *mut c_void,
}

impl Decision {
    /// Return `value` to the caller.
    pub fn answer(value: *mut c_void) -> Self {
        Decision {
            value,
            forward: null_mut(),
        }
    }

    /// Tail-jump to `f` (null: return null).
    pub fn forward(f: *mut c_void) -> Self {
        Decision {
            value: null_mut(),
            forward: f,
        }
    }
}

/// `tail_jump_entry!(name(a: A, b: B[, c: C]) -> R => decide)` exports `name`, a naked
/// entry that calls `decide(a, b, c, the caller's return address) -> Decision` and acts
/// on it. The first three argument registers are kept and handed over whatever the
/// entry's arity (a two-argument entry's third is whatever its caller left there, which
/// `decide` ignores), so one body serves every entry.
macro_rules! tail_jump_entry {
    ($name:ident($($arg:ident: $ty:ty),+) -> $ret:ty => $decide:path) => {
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),+) -> $ret {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",            // three pushes: 16-byte alignment for the call
                "mov rcx, [rsp + 24]", // the caller's return address
                "call {decide}",       // rax = value, rdx = forward
                "mov r11, rdx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "test r11, r11",
                "jnz 2f",
                "ret",
                "2:",
                "jmp r11", // tail jump: glibc's function returns to our caller
                decide = sym $decide,
            )
        }

        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),+) -> $ret {
            core::arch::naked_asm!(
                "stp x29, x30, [sp, #-48]!",
                "mov x29, sp",
                "stp x0, x1, [sp, #16]",
                "str x2, [sp, #32]",
                "mov x3, x30", // the caller's return address
                "bl {decide}", // x0 = value, x1 = forward
                "mov x16, x1",
                "ldp x0, x1, [sp, #16]",
                "ldr x2, [sp, #32]",
                "ldp x29, x30, [sp], #48",
                "cbnz x16, 2f",
                "ret",
                "2:",
                "br x16", // tail jump with the caller's x30 restored
                decide = sym $decide,
            )
        }
    };
}
pub(crate) use tail_jump_entry;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("gpucap's dlsym, dlopen and dlmopen entries are written for x86_64 and aarch64");
