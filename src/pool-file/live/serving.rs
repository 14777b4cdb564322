//! Each member's thread that hands the claim's words to the next, started without an
//! import of the thread calls, and a forked child's letting go of what it inherited.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

use super::handover::{close, send};

/// The memfd and listening socket of each claim this process holds, for a forked child
/// to close ([`forget_in_child`]).
static HELD: [[AtomicI32; 2]; 8] = [const { [const { AtomicI32::new(-1) }; 2] }; 8];

/// Serves `memfd` and `listening` to every joiner from a thread of their own: the memfd.
pub(super) fn served(memfd: RawFd, listening: RawFd) -> Result<RawFd, String> {
    // Taken by a swap: two threads joining two claims at once never take one entry.
    let slot = HELD
        .iter()
        .find(|h| h[0].compare_exchange(-1, memfd, Relaxed, Relaxed).is_ok());
    let Some(h) = slot else {
        return Err("this process holds 8 claims' pools already".into());
    };
    h[1].store(listening, Relaxed);
    match spawn(h as *const [AtomicI32; 2] as *mut libc::c_void) {
        0 => Ok(memfd),
        e => {
            // Refused (a container's pids limit reached): the entry, the memfd and the
            // socket let go, so no joiner waits on a socket this process keeps open
            // with nobody to answer on it.
            h[1].store(-1, Relaxed);
            h[0].store(-1, Relaxed);
            close(memfd);
            close(listening);
            Err(format!(
                "cannot start the thread that hands the claim's words to the next \
                 member: {}",
                std::io::Error::from_raw_os_error(e)
            ))
        }
    }
}

/// The serving thread of one of [`HELD`]'s entries: accepts every joiner, gives it the
/// memfd and the listening socket. System calls only (no allocation, no lock).
extern "C" fn serve(held: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: an entry of the static HELD, passed by `served`.
    let h = unsafe { &*(held as *const [AtomicI32; 2]) };
    let (memfd, listening) = (h[0].load(Relaxed), h[1].load(Relaxed));
    loop {
        // SAFETY: the listening socket, never closed in this process but by a forked
        // child, which has no copy of this thread.
        let c = unsafe {
            libc::syscall(
                libc::SYS_accept4,
                listening,
                std::ptr::null_mut::<libc::sockaddr>(),
                std::ptr::null_mut::<libc::socklen_t>(),
                libc::SOCK_CLOEXEC,
            )
        } as RawFd;
        if c >= 0 {
            send(c, memfd, listening);
            close(c);
            continue;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            // A joiner gone before it was accepted, a signal: the next one.
            Some(libc::EINTR | libc::ECONNABORTED) => {}
            // Out of descriptors or memory for a moment: the others serve meanwhile.
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                let mut waited = 5;
                pause(&mut waited);
            }
            // The socket is no longer one to accept on: this thread is done.
            _ => return std::ptr::null_mut(),
        }
    }
}

type Create = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut libc::c_void) -> *mut libc::c_void,
    *mut libc::c_void,
) -> i32;
type AttrFn = unsafe extern "C" fn(*mut libc::pthread_attr_t) -> i32;
type AttrSet = unsafe extern "C" fn(*mut libc::pthread_attr_t, usize) -> i32;

/// The C library's function `name`, looked up now: not imported by the shim, whose every
/// import the dynamic loader looks up at every process's start (`std::thread`'s 13
/// imports, for a thread only a claim's members start, cost every process's start 12,384
/// instructions: `bench-start.sh --instructions`).
fn libc_fn(name: &std::ffi::CStr) -> *mut libc::c_void {
    [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"]
        .iter()
        // SAFETY: constant NUL-terminated strings; dlvsym is not hooked.
        .map(|v| unsafe { libc::dlvsym(libc::RTLD_DEFAULT, name.as_ptr(), v.as_ptr()) })
        .find(|p| !p.is_null())
        .unwrap_or(std::ptr::null_mut())
}

/// Starts [`serve`] on `arg` in a detached thread with a 64 KiB stack: 0, or the error.
fn spawn(arg: *mut libc::c_void) -> i32 {
    let [create, init, stack, detach, destroy] = [
        c"pthread_create",
        c"pthread_attr_init",
        c"pthread_attr_setstacksize",
        c"pthread_attr_setdetachstate",
        c"pthread_attr_destroy",
    ]
    .map(libc_fn);
    if [create, init, stack, detach, destroy]
        .iter()
        .any(|p| p.is_null())
    {
        return libc::ENOSYS;
    }
    // SAFETY: the C library's functions of these exact signatures, found above; the
    // attributes live across the calls; `arg` is a static entry.
    unsafe {
        let (create, init, stack, detach, destroy) = (
            std::mem::transmute::<*mut libc::c_void, Create>(create),
            std::mem::transmute::<*mut libc::c_void, AttrFn>(init),
            std::mem::transmute::<*mut libc::c_void, AttrSet>(stack),
            std::mem::transmute::<*mut libc::c_void, AttrSet>(detach),
            std::mem::transmute::<*mut libc::c_void, AttrFn>(destroy),
        );
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        init(&mut attr);
        stack(&mut attr, 64 << 10);
        detach(&mut attr, libc::PTHREAD_CREATE_DETACHED as usize);
        let mut t: libc::pthread_t = 0;
        let rc = create(&mut t, &attr, serve, arg);
        destroy(&mut attr);
        rc
    }
}

/// Sleeps before trying again: 200 µs, doubled each time up to 6.4 ms (thousands of
/// joiners waiting for one decision leave the CPU to the process making it).
pub(super) fn pause(waited: &mut u32) {
    let ns = 200_000i64 << (*waited).min(5);
    *waited += 1;
    // SAFETY: a timespec on the stack; an interrupted sleep is only shorter.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            0,
            &libc::timespec {
                tv_sec: 0,
                tv_nsec: ns,
            },
            std::ptr::null_mut(),
        )
    };
}

/// In a forked child: the claims' memfds and listening sockets are the parent's (the
/// child has no thread serving them, and a listening socket held without one would leave
/// joiners waiting).
pub fn forget_in_child() {
    for h in &HELD {
        for fd in h {
            close(fd.swap(-1, Relaxed));
        }
    }
}
