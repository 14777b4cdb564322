//! Before each `fork`: the C library's functions the `exec` hooks call (`exec.rs`,
//! `exec_list.rs`) are found in the parent, from a fork handler registered at the
//! library's load. A child that looked them up itself would walk the loader's list of
//! objects under a lock the `fork` may have copied held by another thread of its parent
//! (glibc resets some of the loader's locks in the child, not that one), and hang in its
//! `exec` (`process_tree::a_child_forked_beside_a_busy_thread_execs`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Whether the functions were found in this process image.
static WARM: AtomicBool = AtomicBool::new(false);

/// Before each `fork` (the fork handler): the functions found, once.
extern "C" fn before_fork() {
    if !WARM.swap(true, Relaxed) {
        let _ = std::panic::catch_unwind(|| {
            crate::exec::warm();
            crate::exec_list::warm();
        });
    }
}

/// At the library's load: the fork handler.
extern "C" fn at_load() {
    // SAFETY: a handler that takes no lock another fork handler may hold (the loader's
    // list lock only, which no code under the fork handlers' lock waits for).
    unsafe { libc::pthread_atfork(Some(before_fork), None, None) };
}

#[used]
// SAFETY: an .init_array entry the loader calls once (its arguments unused).
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = at_load;
