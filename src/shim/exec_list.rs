//! The variadic `exec` calls, `execl`, `execlp` and `execle`, exported as the rest of the
//! family is (`exec.rs`): the program's report is written before its image is replaced.
//! The C library builds their argument vector and calls its internal `execve`, out of
//! reach of an exported `execve`, so they are caught themselves. A variadic function
//! cannot be written in stable Rust, and none needs its arguments read: each is a
//! trampoline (a naked function) that keeps the caller's argument registers, writes the
//! report, and jumps to the C library's function of the same name with the registers
//! and the stack as the caller left them (the arguments, their count, and the return
//! address). x86-64 only: elsewhere they are not exported, and such an `exec` loses the
//! report (reports.md).

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use std::ffi::{c_int, c_void};
    use std::ptr::null_mut;

    use crate::link_maps::Next;

    /// The C library's `execl`, `execlp`, `execle`, found once each.
    static REAL: [Next; 3] = [
        Next::new(b"execl"),
        Next::new(b"execlp"),
        Next::new(b"execle"),
    ];

    /// Writes the report and answers the C library's function `which` (0 `execl`, 1
    /// `execlp`, 2 `execle`), null where it has none. Called from the trampolines only,
    /// with their arguments saved.
    extern "C" fn prepare(which: u32) -> *mut c_void {
        crate::exec::before_exec();
        let i = (which as usize).min(REAL.len() - 1);
        REAL[i].get().map_or(null_mut(), |f| f as *mut c_void)
    }

    /// Where the C library has no such function: -1 with `ENOSYS`, as `exec.rs`'s.
    extern "C" fn missing() -> c_int {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        -1
    }

    /// `trampoline!(name, which)` exports `name`: the six argument registers and `rax`
    /// (a variadic call's count of vector registers) saved (seven pushes leave the stack
    /// 16-byte aligned for the call), `prepare(which)`, the registers put back, then a
    /// jump to the C library's function (or `missing`), which returns to the caller.
    macro_rules! trampoline {
        ($name:ident, $which:literal) => {
            /// See the module's doc.
            ///
            /// # Safety
            /// The C library's contract for this function (its arguments are passed
            /// on untouched).
            #[unsafe(no_mangle)]
            #[unsafe(naked)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "push rdi",
                    "push rsi",
                    "push rdx",
                    "push rcx",
                    "push r8",
                    "push r9",
                    "push rax",
                    concat!("mov edi, ", $which),
                    "call {prepare}",
                    "mov r11, rax",
                    "pop rax",
                    "pop r9",
                    "pop r8",
                    "pop rcx",
                    "pop rdx",
                    "pop rsi",
                    "pop rdi",
                    "test r11, r11",
                    "jz {missing}",
                    "jmp r11",
                    prepare = sym prepare,
                    missing = sym missing,
                )
            }
        };
    }

    trampoline!(execl, 0);
    trampoline!(execlp, 1);
    trampoline!(execle, 2);
}
