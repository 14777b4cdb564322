//! What the model takes from the operating system: pages of anonymous memory, and handles
//! that are unique for the life of the process.

use libc::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The size of a page (at least 4096 bytes).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize
}

/// Lazily committed, zero-filled host memory: read-write, no swap reservation.
pub fn map_anonymous(len: usize) -> Option<usize> {
    map_anonymous_near(0, len)
}

/// [`map_anonymous`] at address `hint` if that range is free (no `MAP_FIXED`: where it
/// is not, or the address space ends below it, the kernel places it elsewhere).
fn map_anonymous_near(hint: usize, len: usize) -> Option<usize> {
    // SAFETY: a fresh anonymous private mapping, never MAP_FIXED: no existing memory is
    // affected, whatever the hint.
    let p = unsafe {
        libc::mmap(
            hint as *mut c_void,
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

/// Handles lie [`HANDLE_STRIDE`] bytes apart, as the heap's smallest blocks do (a 64-bit
/// glibc's 32-byte chunk), in chunks of [`HANDLE_CHUNK`] bytes mapped when first needed.
const HANDLE_STRIDE: usize = 32;
const HANDLE_CHUNK: usize = 64 << 20;
const HANDLES_PER_CHUNK: usize = HANDLE_CHUNK / HANDLE_STRIDE;
/// Where the handles' chunks are asked for (32 TiB, far from what the loader, the heap
/// and other mappings take; valgrind grants it too).
const HANDLE_BASE: usize = 0x2000_0000_0000;
/// Up to 64 chunks: 134 million handles.
static HANDLE_CHUNKS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0);

/// A new opaque handle (CUcontext, CUstream, CUevent, CUmemoryPool, CUarray,
/// CUmipmappedArray, CUfunction, CUkernel, ...): an address in memory only handles use
/// (mapped, never touched), so never NULL, never reused. Not from the heap, which the
/// program and a preloaded library share: there a handle's value would depend on what
/// they allocated before (the length of a library's path, an environment's), and so
/// would the probes of every table keyed by it, the fake's and the shim's; at fixed
/// addresses, the same calls give the same handles wherever and however the program is
/// started, with or without the shim (`scripts/bench/bench-step.sh` counts what the shim adds
/// to a step to within a few instructions: a checkout's path once moved it by 2,400).
/// No lock: a fork never finds one held.
pub fn new_handle() -> usize {
    let i = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
    let n = i / HANDLES_PER_CHUNK;
    let chunk = &HANDLE_CHUNKS[n];
    let mut base = chunk.load(Ordering::Acquire);
    if base == 0 {
        let mapped = map_anonymous_near(HANDLE_BASE + n * HANDLE_CHUNK, HANDLE_CHUNK)
            .expect("the fake GPU: no memory for handles");
        base = match chunk.compare_exchange(0, mapped, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => mapped,
            // Another thread mapped it first: its chunk is the one.
            Err(theirs) => {
                unmap(mapped, HANDLE_CHUNK);
                theirs
            }
        };
    }
    base + (i % HANDLES_PER_CHUNK) * HANDLE_STRIDE
}
