//! What the model takes from the operating system: pages of anonymous memory, and handles
//! that are unique for the life of the process.

use libc::c_void;

/// The size of a page (at least 4096 bytes).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Lazily committed, zero-filled host memory: read-write, no swap reservation.
pub fn map_anonymous(len: usize) -> Option<usize> {
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Unmaps [addr, addr+len) of a mapping this library made.
pub fn unmap(addr: usize, len: usize) {
    // SAFETY: only called on mappings this library created and no longer hands out.
    unsafe { libc::munmap(addr as *mut c_void, len) };
}

/// A new opaque handle (CUcontext, CUstream, CUevent, CUmemoryPool, CUarray,
/// CUmipmappedArray): the address of a leaked 8-byte box, so never NULL, never reused.
pub fn new_handle() -> usize {
    Box::into_raw(Box::new(0u64)) as usize
}
