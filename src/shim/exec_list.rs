//! The variadic `exec` calls, `execl`, `execlp` and `execle`, exported as the rest of the
//! family is (`exec.rs`). The C library builds their argument vector and calls its
//! internal `execve`, out of reach of an exported `execve`, so they are caught
//! themselves: each builds the same vector and calls the family's `execv`, `execvp` or
//! `execve` above (the report, then the environment handed down: a program that emptied
//! its environment before an `execl`, or passes `execle` one of its own, keeps the cap).
//! A variadic function cannot be written in stable Rust: each is a trampoline (a naked
//! function) that lays the caller's argument registers out beside its stack arguments
//! and calls [`list`] with both. x86-64 only: elsewhere they are not exported, and the C
//! library's run without the report or the hand-down (reports.md, threat-model.md).

#[cfg(target_arch = "x86_64")]
mod x86_64 {
    use std::ffi::{c_char, c_int};
    use std::ptr::null_mut;

    use crate::hand_down::Vector;

    /// Pointers that fit the vector built on the stack; more are built in pages of
    /// their own (as many as the kernel takes: an `exec` refuses more with `E2BIG`).
    const ON_STACK: usize = 64;

    /// A variadic call's pointer arguments as the trampoline left them: the six argument
    /// registers in their order (`rdi`, the first, at 0), then the caller's stack
    /// arguments (the seventh on).
    struct Arguments {
        registers: *const usize,
        stack: *const usize,
    }

    impl Arguments {
        /// The `i`th pointer argument (0: the path).
        fn get(&self, i: usize) -> usize {
            // SAFETY: the call's own arguments, read up to its null terminator (and
            // `execle`'s environment after it), as the C library's functions read them.
            unsafe {
                if i < 6 {
                    *self.registers.add(i)
                } else {
                    *self.stack.add(i - 6)
                }
            }
        }
    }

    /// `execl` (0), `execlp` (1) or `execle` (2) with `args`: the vector of the
    /// arguments after the path, to its null, passed to the family's `execv`, `execvp`
    /// or `execve` (with `execle`'s environment, the pointer after the null). Called from
    /// the trampolines only; returns only where the `exec` failed (-1, `errno` set).
    extern "C" fn list(which: u32, registers: *const usize, stack: *const usize) -> c_int {
        let args = Arguments { registers, stack };
        let count = (1..).take_while(|&i| args.get(i) != 0).count();
        let path = args.get(0) as *const c_char;
        let call = |argv: *mut usize| {
            for i in 0..count {
                // SAFETY: `argv` holds `count + 1` pointers.
                unsafe { *argv.add(i) = args.get(i + 1) };
            }
            // SAFETY: as above; its null terminator.
            unsafe { *argv.add(count) = 0 };
            let argv = argv as Vector;
            // SAFETY: the caller's path and arguments, the family's contract.
            unsafe {
                match which {
                    0 => crate::exec::execv(path, argv),
                    1 => crate::exec::execvp(path, argv),
                    _ => crate::exec::execve(path, argv, args.get(count + 2) as Vector),
                }
            }
        };
        if count < ON_STACK {
            let mut argv = [0usize; ON_STACK];
            return call(argv.as_mut_ptr());
        }
        let bytes = (count + 1) * std::mem::size_of::<usize>();
        // SAFETY: fresh private pages, unmapped below where the `exec` failed.
        let pages = unsafe {
            libc::mmap(
                null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if pages == libc::MAP_FAILED {
            return -1; // errno: the mmap's ENOMEM, as the C library's own fails
        }
        let rc = call(pages.cast());
        // SAFETY: errno kept across the unmapping of the pages mapped above.
        unsafe {
            let e = *libc::__errno_location();
            libc::munmap(pages, bytes);
            *libc::__errno_location() = e;
        }
        rc
    }

    /// `trampoline!(name, which)` exports `name`: `rax` (a variadic call's count of
    /// vector registers, kept for alignment: seven pushes leave the stack 16-byte
    /// aligned for the call) and the six argument registers pushed so that they lie in
    /// their order from `rsp`; the caller's stack arguments start past them and the
    /// return address (`rsp + 64`). `list(which, rsp, rsp + 64)`'s answer is returned
    /// to the caller.
    macro_rules! trampoline {
        ($name:ident, $which:literal) => {
            /// See the module's doc.
            ///
            /// # Safety
            /// The C library's contract for this function.
            #[unsafe(no_mangle)]
            #[unsafe(naked)]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!(
                    "push rax",
                    "push r9",
                    "push r8",
                    "push rcx",
                    "push rdx",
                    "push rsi",
                    "push rdi",
                    concat!("mov edi, ", $which),
                    "mov rsi, rsp",
                    "lea rdx, [rsp + 64]",
                    "call {list}",
                    "add rsp, 56",
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
