//! Pages for a child's environment that does not fit the `exec` hooks' buffer on the
//! stack (`hand_down.rs`): one set per thread, kept for its next `exec`, unmapped when the
//! thread ends. A `vfork` child builds the environment in its parent's memory, and pages
//! it mapped afresh for each child and never unmapped (its `exec` succeeded) added up in
//! the parent (24 KiB a child for 3,000 variables); a set per thread that was left when
//! the thread ended added up the same way with a thread per child, so a thread's pages
//! are unmapped at its end (a `pthread_key_create` destructor).

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering::*};

use crate::link_maps::Next;

/// Pages of at least the words asked for, this `exec`'s while it holds them.
pub struct Spare {
    at: *mut c_void,
    len: usize,
}

thread_local! {
    /// This thread's pages (address, length), the process an `exec` builds in them now (0:
    /// none), and whether their unmapping at the thread's end is registered. A `vfork`
    /// child that `exec`ed leaves its own pid there in its parent's memory: pages another
    /// process held are free again. One made from a signal handler of this process
    /// meanwhile maps pages of its own.
    static SPARE: Cell<(usize, usize, u32, bool)> = const { Cell::new((0, 0, 0, false)) };
}

/// This process's pid, from the kernel (a `vfork` child's own: the C library's cached
/// figure is its parent's there).
fn pid() -> u32 {
    // SAFETY: getpid has no preconditions; as a system call, no import.
    unsafe { libc::syscall(libc::SYS_getpid) as u32 }
}

impl Spare {
    /// Pages of at least `words` words: this thread's, grown where they are too few.
    pub fn take(words: usize) -> Option<Spare> {
        let need = (words * 8).next_multiple_of(64 << 10);
        let (at, len, user, registered) = SPARE.get();
        let me = pid();
        if user == me {
            return map(need).map(|at| Spare { at, len: need });
        }
        let (at, len) = if len >= need {
            (at as *mut c_void, len)
        } else {
            if at != 0 {
                unmap(at as *mut c_void, len);
            }
            let Some(fresh) = map(need) else {
                SPARE.set((0, 0, 0, registered));
                return None;
            };
            (fresh, need)
        };
        let registered = registered || at_thread_end();
        SPARE.set((at as usize, len, me, registered));
        Some(Spare { at, len })
    }

    /// The first `words` words of the pages.
    pub fn words(&mut self, words: usize) -> &mut [usize] {
        debug_assert!(words * 8 <= self.len);
        // SAFETY: the pages hold at least `words` words, and only this `Spare` uses them
        // while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.at.cast(), words) }
    }
}

impl Drop for Spare {
    /// The `exec` failed: the pages go back to the thread (or, made beside its own, away).
    fn drop(&mut self) {
        let (at, len, _, registered) = SPARE.get();
        if at == self.at as usize {
            SPARE.set((at, len, 0, registered));
        } else {
            unmap(self.at, self.len);
        }
    }
}

/// The C library's `pthread_key_create` and `pthread_setspecific`, found without the
/// loader's locks (`link_maps.rs`): the key's destructor unmaps a thread's pages at its
/// end. Neither takes a lock or allocates (a key below 32 lives in the thread's own
/// descriptor), so they may run between `vfork` and `exec`, where a registration with
/// the C library's `__cxa_thread_atexit_impl` would take the loader's lock and allocate.
static KEY_CREATE: Next = Next::new(b"pthread_key_create");
static SET_SPECIFIC: Next = Next::new(b"pthread_setspecific");

/// The key + 1 (0: not made yet).
static KEY: AtomicUsize = AtomicUsize::new(0);

/// Registers [`unmap_at_thread_end`] for this thread (a `vfork` child registers it for
/// its parent's thread, whose descriptor it shares); whether it is.
fn at_thread_end() -> bool {
    type Create =
        unsafe extern "C" fn(*mut libc::pthread_key_t, unsafe extern "C" fn(*mut c_void)) -> c_int;
    type Set = unsafe extern "C" fn(libc::pthread_key_t, *const c_void) -> c_int;
    let (Some(create), Some(set)) = (KEY_CREATE.get(), SET_SPECIFIC.get()) else {
        return false;
    };
    let mut key = KEY.load(Acquire);
    if key == 0 {
        let mut k: libc::pthread_key_t = 0;
        // SAFETY: the C library's `pthread_key_create`, of this signature.
        let create = unsafe { std::mem::transmute::<usize, Create>(create) };
        // SAFETY: `k` is written by the call; the destructor is a function of this library.
        if unsafe { create(&mut k, unmap_at_thread_end) } != 0 {
            return false;
        }
        // Another thread may have made one meanwhile: the first stored is used (the other
        // key stays unused).
        key = match KEY.compare_exchange(0, k as usize + 1, AcqRel, Acquire) {
            Ok(_) => k as usize + 1,
            Err(other) => other,
        };
    }
    // A key past the 32 a thread's descriptor holds would make `pthread_setspecific`
    // allocate (where a child's copy of the heap's lock may be held): not registered, and
    // the thread's pages outlive it (a program that made 32 keys before).
    if key > 32 {
        return false;
    }
    // SAFETY: the C library's `pthread_setspecific`, of this signature.
    let set = unsafe { std::mem::transmute::<usize, Set>(set) };
    // SAFETY: a key made above; a non-null value so that the destructor runs.
    unsafe {
        set(
            (key - 1) as libc::pthread_key_t,
            std::ptr::dangling::<c_void>(),
        ) == 0
    }
}

/// At a thread's end (the key's destructor): its pages unmapped.
unsafe extern "C" fn unmap_at_thread_end(_: *mut c_void) {
    let _ = SPARE.try_with(|s| {
        let (at, len, _, _) = s.get();
        if at != 0 {
            unmap(at as *mut c_void, len);
        }
        s.set((0, 0, 0, false));
    });
}

/// `len` bytes of fresh anonymous pages. A system call, not an import of the C library's
/// `mmap` (a lookup at each start).
fn map(len: usize) -> Option<*mut c_void> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let at = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            null_mut::<c_void>(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    // A failed system call answers -errno: a pointer in the last page.
    (!(-4095..0).contains(&(at as isize))).then_some(at as *mut c_void)
}

/// Unmaps pages [`map`] made and nothing uses.
fn unmap(at: *mut c_void, len: usize) {
    // SAFETY: pages this module mapped, which no environment under construction holds.
    unsafe { libc::munmap(at, len) };
}
