//! The exported `exec` family and `posix_spawn`: before a program of this process is
//! replaced by another (which keeps the pid, not the figures), its report is written
//! (`Shim::before_exec`); then the C library's function runs with the caller's
//! arguments and the environment handed down to a child (`hand_down.rs`: the library
//! and this process's configuration where the caller's environment drops them). The
//! variadic ones (`execl`, `execlp`, `execle`) are trampolines of their own
//! (`exec_list.rs`): the report only.

use std::ffi::{c_char, c_int, c_void};

use crate::link_maps::Next;

use crate::hand_down::Vector;

/// The report, before the `exec`: no panic crosses into the caller.
pub(crate) fn before_exec() {
    let _ = std::panic::catch_unwind(|| crate::state::SHIM.before_exec());
}

/// -1 with `errno` set to `e`: how an `exec` fails.
fn failed(e: c_int) -> c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
    -1
}

/// `reals! { STATIC name: Type, ... }`: for each, the cache `STATIC` and `name()`, the C
/// library's function of that name and type, found once (None where the C library has
/// none), without the loader's locks (`link_maps.rs`).
macro_rules! reals {
    ($($cache:ident $name:ident: $ty:ty),+ $(,)?) => {
        mod real {
            use super::*;
            $(
                static $cache: Next = Next::new(stringify!($name).as_bytes());
                /// The C library's function of this name.
                pub(super) fn $name() -> Option<$ty> {
                    // SAFETY: the C library's function of this name, of this signature.
                    $cache.get().map(|f| unsafe { std::mem::transmute::<usize, $ty>(f) })
                }
            )+
        }
    };
}

reals! {
    EXECVE execve: Execve,
    EXECVPE execvpe: Execve,
    FEXECVE fexecve: Fexecve,
    EXECVEAT execveat: Execveat,
    POSIX_SPAWN posix_spawn: Spawn,
    POSIX_SPAWNP posix_spawnp: Spawn,
}

/// Calls `exec` with the environment a child is started with (`hand_down.rs`), made
/// from `envp`; `failed` where it cannot be made. No panic crosses into the caller.
fn handed_down<R>(envp: Vector, failed: R, exec: impl FnOnce(Vector) -> R) -> R
where
    R: Copy,
{
    let run = std::panic::AssertUnwindSafe(move || {
        crate::hand_down::with_environment(envp, failed, exec)
    });
    std::panic::catch_unwind(run).unwrap_or_else(|_| {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        failed
    })
}

/// The process's environment, as `execv` and `execvp` pass it on.
fn environ() -> Vector {
    // SAFETY: `environ` is the C library's vector of the environment.
    unsafe { libc::environ as Vector }
}

type Execve = unsafe extern "C" fn(*const c_char, Vector, Vector) -> c_int;
type Fexecve = unsafe extern "C" fn(c_int, Vector, Vector) -> c_int;
type Execveat = unsafe extern "C" fn(c_int, *const c_char, Vector, Vector, c_int) -> c_int;
type Spawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const c_void,
    *const c_void,
    Vector,
    Vector,
) -> c_int;

/// `exec_hook!(name(arg: Type, ...) = real(call, ...) with ENV from SOURCE)` exports
/// `name`: the report, then the C library's `real` (found without the loader's locks)
/// called with `call`s, where `ENV` is the environment handed down, made from `SOURCE`
/// (the caller's, or `environ()`); -1 with `ENOSYS` where the C library has no `real`.
macro_rules! exec_hook {
    ($name:ident($($arg:ident: $ty:ty),+) = $real:ident($($call:ident),+) with $env:ident from $source:expr) => {
        /// See the module's doc.
        ///
        /// # Safety
        /// The C library's contract for this function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),+) -> c_int {
            before_exec();
            let Some(f) = real::$real() else {
                return failed(libc::ENOSYS);
            };
            // SAFETY: the caller's arguments, the environment handed down.
            handed_down($source, -1, |$env| unsafe { f($($call),+) })
        }
    };
}

// Each of the family (see the module's doc): `execv` and `execvp` are `execve` and
// `execvpe` with `environ`, as the C library defines them.
exec_hook!(execve(path: *const c_char, argv: Vector, envp: Vector) = execve(path, argv, env) with env from envp);
exec_hook!(execv(path: *const c_char, argv: Vector) = execve(path, argv, env) with env from environ());
exec_hook!(execvp(file: *const c_char, argv: Vector) = execvpe(file, argv, env) with env from environ());
exec_hook!(execvpe(file: *const c_char, argv: Vector, envp: Vector) = execvpe(file, argv, env) with env from envp);
exec_hook!(fexecve(fd: c_int, argv: Vector, envp: Vector) = fexecve(fd, argv, env) with env from envp);
exec_hook!(execveat(dirfd: c_int, path: *const c_char, argv: Vector, envp: Vector, flags: c_int) = execveat(dirfd, path, argv, env, flags) with env from envp);

// `posix_spawn` and `posix_spawnp` start a child through the C library's own `execve`,
// out of reach of the export above: the C library's function with the environment
// handed down (this process goes on: no report).

/// See the module's doc.
///
/// # Safety
/// The C library's contract for this function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: Vector,
    envp: Vector,
) -> c_int {
    let Some(f) = real::posix_spawn() else {
        return libc::ENOSYS;
    };
    // SAFETY: the caller's arguments, the environment handed down.
    handed_down(envp, libc::ENOMEM, |env| unsafe {
        f(pid, path, actions, attr, argv, env)
    })
}

/// See the module's doc.
///
/// # Safety
/// The C library's contract for this function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: Vector,
    envp: Vector,
) -> c_int {
    let Some(f) = real::posix_spawnp() else {
        return libc::ENOSYS;
    };
    // SAFETY: the caller's arguments, the environment handed down.
    handed_down(envp, libc::ENOMEM, |env| unsafe {
        f(pid, file, actions, attr, argv, env)
    })
}
