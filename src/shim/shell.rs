//! The exported `system` and `popen`. The C library starts their shell (`sh -c CMD`;
//! from glibc 2.38 `sh -c -- CMD`) through its own internal spawn, with `environ`, out
//! of reach of the `exec` hooks (`exec.rs`): a program that cleared its environment
//! (`clearenv`, Python's `os.environ.clear()`) or dropped `LD_PRELOAD` from it started an
//! uncapped shell. Where the environment lacks what a child of this process is handed
//! (`hand_down.rs`), the C library's function runs the command that hands it to the shell
//! first (`exec /usr/bin/env 'NAME=value' ... /bin/sh -c [--] 'CMD' sh`, `--` where the C
//! library gives one: the same shell, the same parse of the command, the same exit
//! status, and `pclose` and the signals as the C library keeps them); elsewhere it runs
//! `CMD` as given. A command the quoting makes longer than the kernel takes for an
//! argument (128 KiB) runs as given, with one line saying its shell is not capped.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::link_maps::Next;

/// The longest argument the kernel passes to a program (`MAX_ARG_STRLEN`, the NUL
/// included): a longer command than this fails the shell's start (`E2BIG`).
const LONGEST: usize = 32 * 4096;

static SYSTEM: Next = Next::new(b"system");
static POPEN: Next = Next::new(b"popen");

/// Calls `real` with the command to run in place of `cmd` (`cmd` itself where nothing is
/// handed down, where it is null, or where building it panicked).
fn with_command<R>(cmd: *const c_char, real: impl FnOnce(*const c_char) -> R) -> R {
    if cmd.is_null() {
        return real(cmd);
    }
    // SAFETY: the caller's NUL-terminated command.
    let given = unsafe { CStr::from_ptr(cmd) }.to_bytes();
    let wrapped = std::panic::catch_unwind(|| crate::hand_down::shell_command(given))
        .ok()
        .flatten();
    match wrapped {
        Some(c) if c.len() <= LONGEST => real(c.as_ptr().cast()),
        Some(c) => {
            // Its quoting made a command the kernel would refuse that it takes as given:
            // run as given, and say that its shell is not capped.
            crate::log::say(&format!(
                "gpucap: a command of {} bytes given to system or popen with the cap gone \
                 from the environment runs without it: handing the cap to its shell makes \
                 it {} bytes, past the {LONGEST} the kernel takes",
                given.len(),
                c.len() - 1
            ));
            real(cmd)
        }
        None => real(cmd),
    }
}

/// See the module's doc.
///
/// # Safety
/// The C library's contract for this function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    let Some(f) = SYSTEM.get() else {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    // SAFETY: the C library's `system`.
    let f =
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*const c_char) -> c_int>(f) };
    // SAFETY: the caller's command, or one built from it.
    with_command(cmd, |c| unsafe { f(c) })
}

/// See the module's doc.
///
/// # Safety
/// The C library's contract for this function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut c_void {
    let Some(f) = POPEN.get() else {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return std::ptr::null_mut();
    };
    // SAFETY: the C library's `popen`.
    let f = unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(*const c_char, *const c_char) -> *mut c_void,
        >(f)
    };
    // SAFETY: the caller's command (or one built from it) and mode.
    with_command(cmd, |c| unsafe { f(c, mode) })
}
