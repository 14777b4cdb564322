//! The variadic `exec` calls, `execl`, `execlp` and `execle`, exported as the rest of the
//! family is (`exec.rs`). The C library builds their argument vector and calls its
//! internal `execve`, out of reach of an exported `execve`, so they are caught
//! themselves: each calls the family's `execv`, `execvp` or `execve` above with the
//! same vector (the report, then the environment handed down: a program that emptied
//! its environment before an `execl`, or passes `execle` one of its own, keeps the cap).
//! A variadic function cannot be written in stable Rust: each is a trampoline (a naked
//! function) that lays the caller's argument registers out in front of its stack
//! arguments, where the return address was (kept meanwhile, and put back): the pointer
//! arguments after the path are then one array, ended by the caller's null (and
//! followed by `execle`'s environment), which is the vector itself. Nothing is copied or
//! allocated (a `vfork` child's pages would stay in its parent). x86-64 only: elsewhere
//! they are not exported, and the C library's run without the report or the hand-down
//! (reports.md, threat-model.md).

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use std::ffi::{c_char, c_int};

    use crate::hand_down::Vector;

    /// `execl` (0), `execlp` (1) or `execle` (2) of `path` with `argv`, the caller's
    /// arguments after the path as the trampoline laid them out (null-terminated;
    /// `execle`'s environment the pointer after the null): the family's `execv`,
    /// `execvp` or `execve`. Called from the trampolines only; returns only where the
    /// `exec` failed (-1, `errno` set).
    extern "C" fn list(path: *const c_char, argv: Vector, which: u32) -> c_int {
        // SAFETY: the caller's null-terminated arguments (and `execle`'s environment
        // after them), as the C library's functions read them; the family's contract.
        unsafe {
            match which {
                0 => crate::exec::execv(path, argv),
                1 => crate::exec::execvp(path, argv),
                _ => {
                    let count = (0..).take_while(|&i| !(*argv.add(i)).is_null()).count();
                    crate::exec::execve(path, argv, *argv.add(count + 1) as Vector)
                }
            }
        }
    }

    /// `trampoline!(name, which)` exports `name`: the return address popped into `r11`,
    /// `r9`, `r8`, `rcx`, `rdx` and `rsi` pushed (`r9` where the return address was, the
    /// rest below it: the second to sixth arguments, then the caller's stack arguments,
    /// in order from `rsp`), `rbx` saved and given the return address (five pushes and
    /// one more leave the stack 16-byte aligned for the call), `list(rdi, rsp, which)`;
    /// then the return address put back where it was, and `list`'s answer returned.
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
                    "pop r11",
                    "push r9",
                    "push r8",
                    "push rcx",
                    "push rdx",
                    "push rsi",
                    "mov rsi, rsp",
                    "push rbx",
                    "mov rbx, r11",
                    concat!("mov edx, ", $which),
                    "call {list}",
                    "mov r11, rbx",
                    "pop rbx",
                    "add rsp, 32",
                    "mov [rsp], r11",
                    "ret",
                    list = sym list,
                )
            }
        };
    }

    trampoline!(execl, 0);
    trampoline!(execlp, 1);
    trampoline!(execle, 2);
}
