//! The C library's file calls this crate makes, under the names Rust's std imports too:
//! glibc's 64-bit `open64`, `mmap64`, `fstat64`, `lstat64` (the same calls as `open`,
//! `mmap`, `fstat`, `lstat` on 64-bit Linux), and `access` as `faccessat`. Each other name
//! would be one more import of libgpucap.so, which the dynamic loader looks up in every
//! process the shim is preloaded into, CUDA or not, at its start.

pub use libc::{
    fstat64 as fstat, lstat64 as lstat, mmap64 as mmap, open64 as open, stat64 as stat,
};

/// `access(path, mode)`: the real ids' permission to `path`.
///
/// # Safety
/// `path` is a NUL-terminated string.
pub unsafe fn access(path: *const libc::c_char, mode: libc::c_int) -> libc::c_int {
    // SAFETY: the caller's NUL-terminated path; faccessat without flags is access.
    unsafe { libc::faccessat(libc::AT_FDCWD, path, mode, 0) }
}
