//! The exported `fork`: before the C library's `fork`, the C library's functions the
//! `exec` hooks call (`exec.rs`, `exec_list.rs`, `exec_buffer.rs`) and this library's path
//! (`hand_down.rs`) are found, once, in the parent. A child that looked them up itself
//! would walk the loader's list of objects under a lock the `fork` may have copied held by
//! another thread of its parent (glibc resets some of the loader's locks in the child, not
//! that one), and hang in its `exec` (`process_tree::a_child_forked_beside_a_busy_thread_execs`).
//! Found here, before the `fork` and outside its handlers: a fork handler would look them
//! up under the C library's lock of the handlers, and hang a program whose own handler
//! takes a lock that one of its threads holds while it walks the same list. Children made
//! without `fork` (`_Fork`, a raw `clone`) look them up themselves; a `vfork` child waits
//! for the walking thread of its parent, which runs on.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::elf::Next;

/// Whether the functions were found in this process image.
static WARM: AtomicBool = AtomicBool::new(false);

/// The C library's `fork`.
static FORK: Next = Next::new(b"fork");

/// See the module's doc.
///
/// # Safety
/// The C library's contract for `fork`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    if !WARM.swap(true, Relaxed) {
        let _ = std::panic::catch_unwind(|| {
            // One walk of the loader's list for all of them.
            let mut all: [&Next; 16] = [&FORK; 16];
            let mut n = 1;
            let lists = [
                crate::exec::ALL,
                crate::exec_list::ALL,
                &[&crate::exec_buffer::THREAD_ATEXIT],
            ];
            for f in lists.into_iter().flatten() {
                if n < all.len() {
                    all[n] = f;
                    n += 1;
                }
            }
            crate::elf::find_all(&all[..n]);
            crate::hand_down::warm();
        });
    }
    let Some(f) = FORK.get() else {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    // SAFETY: the C library's `fork`, which takes no argument.
    let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> libc::pid_t>(f) };
    // SAFETY: as the caller asked.
    unsafe { f() }
}
