//! Holding off `pthread_cancel` where the shim meets a cancellation point. glibc acts on
//! a cancellation at a cancellation point (`write`, `open`, `read`, `nanosleep`, ...) by
//! unwinding the thread; that unwind cannot cross the shim's Rust frames (it reaches a
//! `catch_unwind`, and the process aborts: SIGABRT where the program without the shim
//! would have had its thread cancelled). The shim meets them on paths taken once or
//! rarely: its configuration read, `cuInit` (a pool joined, the lone file shown), NVML's
//! load, a line written (`log::say`), a library opened with `RTLD_DEEPBIND` (`dlopen.rs`
//! opens it itself). There the thread's cancellation is disabled, and its
//! state restored after: a cancellation requested meanwhile is acted on at the program's
//! next cancellation point, after the call. The pool's own waits sleep by raw system
//! calls, which are not cancellation points (`gpucap_pool_file::sys::nap`).
//! `pthread_setcancelstate` is looked up at its first use, not imported: an import is one
//! more lookup at every process's start.
//!
//! Not around the driver's own calls: a synchronisation that blocked in the driver at a
//! cancellation point would still be unwound through the hook (the fake has none; a real
//! driver's waits are not measured here), and holding it off there cost every
//! synchronisation some 70 instructions.

use std::ffi::c_int;

/// glibc's `PTHREAD_CANCEL_DISABLE` (`PTHREAD_CANCEL_ENABLE` is 0).
const PTHREAD_CANCEL_DISABLE: c_int = 1;

type SetCancelState = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;

/// glibc's `pthread_setcancelstate`, found once (None: not found, nothing held off).
#[cfg(not(test))]
fn set_cancel_state() -> Option<SetCancelState> {
    use std::ffi::c_void;
    use std::sync::atomic::{
        AtomicPtr,
        Ordering::{Acquire, Release},
    };
    static FOUND: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut p = FOUND.load(Acquire);
    if p.is_null() {
        let dlsym = crate::resolve::real_dlsym()?;
        // SAFETY: glibc's dlsym with RTLD_DEFAULT and a NUL-terminated name.
        p = unsafe { dlsym(libc::RTLD_DEFAULT, c"pthread_setcancelstate".as_ptr()) };
        if p.is_null() {
            return None;
        }
        FOUND.store(p, Release);
    }
    // SAFETY: glibc's pthread_setcancelstate, of this C signature.
    Some(unsafe { std::mem::transmute::<*mut c_void, SetCancelState>(p) })
}

/// The unit tests run no program's threads: nothing to hold off.
#[cfg(test)]
fn set_cancel_state() -> Option<SetCancelState> {
    None
}

/// The thread's cancellation disabled while this lives; the state it had, restored.
pub struct NoCancel(Option<(SetCancelState, c_int)>);

impl NoCancel {
    pub fn hold() -> NoCancel {
        NoCancel(set_cancel_state().map(|set| {
            let mut old = 0;
            // SAFETY: sets the calling thread's own cancellation state; `old` is valid.
            unsafe { set(PTHREAD_CANCEL_DISABLE, &mut old) };
            (set, old)
        }))
    }
}

impl Drop for NoCancel {
    fn drop(&mut self) {
        if let Some((set, old)) = self.0 {
            let mut was = 0;
            // SAFETY: restores the state `hold` saw, on the same thread (not Send).
            unsafe { set(old, &mut was) };
        }
    }
}
