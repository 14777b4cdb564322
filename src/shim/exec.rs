//! The exported `exec` family: before a program of this process is replaced by another
//! (which keeps the pid, not the figures), its report is written (`Shim::before_exec`);
//! then the C library's function runs with the caller's arguments. The variadic ones
//! (`execl`, `execlp`, `execle`) are trampolines of their own (`exec_list.rs`).

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicPtr,
    Ordering::{Acquire, Release},
};

/// An argument or environment vector.
type Vector = *const *const c_char;

/// The C library's `name`: the first definition after this library's, found once.
pub(crate) fn next(cache: &AtomicPtr<c_void>, name: &[u8]) -> Option<*mut c_void> {
    let p = cache.load(Acquire);
    if !p.is_null() {
        return Some(p);
    }
    let p = crate::elf::next_function(name)? as *mut c_void;
    cache.store(p, Release);
    Some(p)
}

/// The report, before the `exec`: no panic crosses into the caller.
pub(crate) fn before_exec() {
    let _ = std::panic::catch_unwind(|| crate::state::SHIM.before_exec());
}

/// `exec_hook!(name(arg: Type, ...))` exports `name`, which writes the report and calls
/// the C library's `name` (of that signature, returning `int`) with the same arguments;
/// where the C library has none, -1 with `ENOSYS`.
macro_rules! exec_hook {
    ($name:ident($($arg:ident: $ty:ty),+)) => {
        /// See the module's doc.
        ///
        /// # Safety
        /// The C library's contract for this function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),+) -> c_int {
            static REAL: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
            before_exec();
            let Some(f) = next(&REAL, stringify!($name).as_bytes()) else {
                // SAFETY: errno is this thread's.
                unsafe { *libc::__errno_location() = libc::ENOSYS };
                return -1;
            };
            // SAFETY: `f` is the C library's function of this name, of this signature.
            let f = unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),+) -> c_int>(f)
            };
            // SAFETY: the caller's arguments, as it gave them.
            unsafe { f($($arg),+) }
        }
    };
}

exec_hook!(execve(path: *const c_char, argv: Vector, envp: Vector));
exec_hook!(execv(path: *const c_char, argv: Vector));
exec_hook!(execvp(file: *const c_char, argv: Vector));
exec_hook!(execvpe(file: *const c_char, argv: Vector, envp: Vector));
exec_hook!(fexecve(fd: c_int, argv: Vector, envp: Vector));
exec_hook!(execveat(dirfd: c_int, path: *const c_char, argv: Vector, envp: Vector, flags: c_int));
