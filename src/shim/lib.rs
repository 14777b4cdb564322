//! libgpucap: an `LD_PRELOAD` shim that caps the device memory an unmodified CUDA
//! program may take. See README.md. The policy is the safe core, `gpucap-core`; this
//! crate is the FFI edge around it. Data flows one way, top to bottom:
//!
//! - `dlsym`: the exported `dlsym` and `dlvsym` and their decisions (our hook, our
//!   export of a loader name, or glibc's answer).
//! - `dlopen`: the exported `dlopen` (glibc's, but a library opened with `RTLD_DEEPBIND`
//!   is bound to the hooks as any other is: `rebind`); `entry`: the naked entry both
//!   exports share, which keeps the caller's return address for glibc.
//! - `table`: the one list of hooked symbols: exported shells with their panic guard,
//!   the rows `dlsym` and the `cuGetProcAddress` answers use.
//! - `hooks`: what each intercepted call does, one file per family.
//! - `state`: every process-wide static; `log`: the log level, `log!` and `say` (a line
//!   on stderr); `cancel`: `pthread_cancel` held off where the shim meets a cancellation
//!   point.
//! - `membership`: this process's place in its pool (`GPUCAP_POOL`); `lone`: the file
//!   a process in no pool shows itself through (`gpucap status`, `top`, `metrics`).
//! - `driver`: the driver's C types, typed calls and queries.
//! - `resolve`: the real `dlsym`, library handles, driver symbols by name; `elf`: the
//!   loaded objects and their dynamic sections, a function by name in one (how glibc's
//!   `dlvsym` is found), read without the loader.
//! - `environ`: the environment variables the configuration reads, copied from `environ`.
//! - `exit`: the `.fini_array` exit hook (final report and summary); `exec`: the
//!   exported `exec` family and `posix_spawn`, which write the report before a program is
//!   replaced and start a child with the cap handed down (`hand_down`: the library and
//!   this process's configuration, copied at its load by an `.init_array` entry);
//!   `exec_buffer`: a thread's pages for a child's environment too large for the stack;
//!   `link_maps`: the loader's list read without its locks, where the hooks find the C
//!   library's functions they call (a child's copy of the loader's lock may be held).

// The unit-test build leaves out the FFI edge (it exports `dlsym` and the driver's
// symbols, which must not interpose on the test binary itself), so the process-wide
// state that only the FFI edge uses looks dead there.
#![cfg_attr(test, allow(dead_code, unused_imports))]

mod cancel;
mod log;
mod lone;
mod membership;
mod state;

#[cfg(not(test))]
mod dlopen;
#[cfg(not(test))]
mod dlsym;
#[cfg(not(test))]
mod driver;
#[cfg(not(test))]
mod elf;
#[cfg(not(test))]
mod entry;
#[cfg(not(test))]
mod environ;
#[cfg(not(test))]
mod exec;
#[cfg(not(test))]
mod exec_buffer;
#[cfg(not(test))]
mod exec_list;
#[cfg(not(test))]
mod exit;
#[cfg(not(test))]
mod hand_down;
#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
mod link_maps;
#[cfg(not(test))]
mod ordinals;
#[cfg(not(test))]
mod rebind;
#[cfg(not(test))]
mod resolve;
#[cfg(not(test))]
mod shell;
#[cfg(not(test))]
mod table;

/// This library's version; the export by which a copy of it is told from any other
/// object (`elf::MARKER`), a second copy loaded beside it passed over.
#[cfg(not(test))]
#[unsafe(no_mangle)]
pub extern "C" fn gpucap_shim_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
