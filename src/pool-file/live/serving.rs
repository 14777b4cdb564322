//! Each member's thread that hands the claim's words to the next (and looks after the
//! claim's socket between joiners: `rebinding`), started without an import of the thread
//! calls, and a forked child's letting go of what it inherited.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::handover::{asks_for_file, check, close, send};
use super::rebinding::{CHECK_EVERY, Watch, look_between_joiners};
use crate::kept::Kept;

/// A claim this process holds: its memfd and listening socket, each kept as the file it
/// was when it was handed over, and the pool file (the member's descriptor of it, which
/// the pool's locks own: handed to a joiner that asks, never closed here; or, once the
/// process let go of that descriptor, a copy of the entry's own: [`keep_file_served`]).
/// The program may close those descriptors and reuse their numbers (a server closing
/// every descriptor it did not open, then listening on one of its own): the serving
/// thread and a forked child act on a number only while it is still that file.
struct Held {
    taken: AtomicBool,
    /// 0 the memfd, 1 the listening socket, 2 the pool file, 3 the serving thread's
    /// epoll instance (its wait for joiners), 4 the claim's directory, read-locked
    /// (`presence`).
    fds: [Kept; 5],
    /// Whether `fds[2]` is the entry's own copy of the pool file (closed with it).
    owns_file: AtomicBool,
}

impl Held {
    /// Whether descriptor `i` (0 the memfd, 1 the socket, 2 the pool file) is still the
    /// file it was.
    fn ours(&self, i: usize) -> bool {
        self.fds[i].get().is_some()
    }

    /// The entry given up (the descriptors are closed, or no longer ours). The
    /// directory's lock stays with its open file: the process still holds the words.
    fn free(&self) {
        self.fds[4].forget();
        self.fds[3].close();
        self.let_go_of_file();
        self.fds[1].forget();
        self.fds[0].forget();
        self.taken.store(false, Relaxed);
    }

    /// The pool file given up: closed where it is the entry's own copy, else forgotten
    /// (the pool's locks' descriptor).
    fn let_go_of_file(&self) {
        match self.owns_file.swap(false, Relaxed) {
            true => self.fds[2].close(),
            false => self.fds[2].forget(),
        }
    }

    /// What a forked child lets go of in this entry: only what is still the claim's (a
    /// number the program reused is its own). The pool file's descriptor is the pool's
    /// locks' (`SlotLocks::forget_in_child`), unless it is the entry's own copy.
    fn let_go_in_child(&self) {
        self.fds[0].close();
        self.fds[1].close();
        self.let_go_of_file();
        self.fds[3].close();
        if let Some(dir) = self.fds[4].get() {
            super::presence::hold_children(dir);
        }
        self.fds[4].close();
    }
}

/// The claims this process holds, for their serving threads and a forked child to close
/// ([`forget_in_child`]).
static HELD: [Held; 8] = [const {
    Held {
        taken: AtomicBool::new(false),
        fds: [const { Kept::none() }; 5],
        owns_file: AtomicBool::new(false),
    }
}; 8];

/// What a serving thread is handed: its entry of [`HELD`], and what it needs to look
/// after the claim's socket (None: a path too long for a socket's address).
struct Serving {
    held: &'static Held,
    watch: Option<Watch>,
}

/// Serves `memfd` and `listening` to every joiner from a thread of their own (and the
/// pool file `file` to a joiner that asks for it), which looks after the claim's socket
/// with `watch` between joiners: the memfd.
pub(super) fn served(
    memfd: RawFd,
    listening: RawFd,
    file: RawFd,
    presence: RawFd,
    watch: Option<Watch>,
) -> Result<RawFd, String> {
    // Taken by a swap: two threads joining two claims at once never take one entry.
    let slot = HELD.iter().find(|h| {
        h.taken
            .compare_exchange(false, true, Relaxed, Relaxed)
            .is_ok()
    });
    let Some(h) = slot else {
        close(presence);
        return Err("this process holds 8 claims' pools already".into());
    };
    // What the numbers are now, before the program runs again: its own files may take
    // them later.
    h.fds[0].keep(memfd);
    h.fds[1].keep(listening);
    h.owns_file.store(false, Relaxed);
    h.fds[2].keep(file);
    if presence >= 0 {
        h.fds[4].keep(presence);
    }
    // Every holder's accept returns between joiners, for its thread to look at the path
    // (the socket may have been made by a member that set it already).
    look_between_joiners(listening);
    let arg = Box::into_raw(Box::new(Serving { held: h, watch }));
    match spawn(arg.cast()) {
        0 => Ok(memfd),
        e => {
            // SAFETY: the box made above, which no thread took.
            drop(unsafe { Box::from_raw(arg) });
            // Refused (a container's pids limit reached): the entry, the memfd and the
            // socket let go, so no joiner waits on a socket this process keeps open
            // with nobody to answer on it.
            h.free();
            close(memfd);
            close(listening);
            close(presence);
            Err(format!(
                "cannot start the thread that hands the claim's words to the next \
                 member: {}",
                std::io::Error::from_raw_os_error(e)
            ))
        }
    }
}

/// A copy of the memfd this process holds as a member of the claim of `file` (`bytes`
/// long: the memfd's header is the file's), close-on-exec: a member reads its own claim's
/// words without asking the socket (which may be gone while it runs). None where it holds
/// none of that claim.
pub(super) fn own_copy(file: RawFd, bytes: usize) -> Option<RawFd> {
    HELD.iter().find_map(|h| {
        let m = h.fds[0].number();
        if m < 0 {
            return None;
        }
        // SAFETY: a descriptor number; the copy (above the standard three: `sys::above_stdio`)
        // is checked to be the memfd it was.
        let d = unsafe { libc::fcntl(m, libc::F_DUPFD_CLOEXEC, 3) };
        if d >= 0 && h.fds[0].is(d) && check(d, file, bytes).is_ok() {
            return Some(d);
        }
        close(d);
        None
    })
}

/// Where this process lets go of its descriptor `file` of a claim's pool file whose words
/// it still holds and serves (a joiner that took the words, then found the file removed
/// before it took a slot, and opens the path again: `removal::join_linked`): each entry
/// serving with it keeps a copy of its own (close-on-exec, numbered from 3), so
/// that its thread still hands the file to a joiner that asks for it. Before, it answered
/// without it, and that joiner was refused. The copy is the same open file (its locks are
/// the ones the process keeps already: `mapping::pin`); a forked child closes its copy.
pub(crate) fn keep_file_served(file: RawFd) {
    for h in HELD.iter().filter(|h| h.taken.load(Relaxed)) {
        if h.fds[2].get() != Some(file) || h.owns_file.load(Relaxed) {
            continue;
        }
        // SAFETY: a descriptor checked to be the pool file kept; the copy is this entry's.
        let copy = unsafe { libc::fcntl(file, libc::F_DUPFD_CLOEXEC, 3) };
        if copy >= 0 {
            // The same file: its identity, which the serving thread checks, is unchanged.
            h.fds[2].keep(copy);
            h.owns_file.store(true, Relaxed);
        }
    }
}

/// The serving thread of one of [`HELD`]'s entries: accepts every joiner, gives it the
/// memfd and the listening socket, and between joiners looks after the socket's path
/// (`rebinding`), serving the socket there from then on where that changed. System calls
/// only (no allocation, no lock) once started. It accepts and sends only while each
/// number is still the file it was handed over as ([`Held`]), else it stops: never
/// taking the program's connections or handing them the claim's words.
extern "C" fn serve(arg: *mut libc::c_void) -> *mut libc::c_void {
    // Used where it lies, never freed here: a first `free` on a thread sets up the C
    // library's cache for it, a heap arena of its own (a 128 MiB reservation trimmed
    // and made writable, four system calls and a page fault), at every member's start.
    // A thread that stops leaves it (a few words, at most once per claim held).
    // SAFETY: the box `served` made for this thread, owned by it from here on.
    let Serving { held: h, watch } = unsafe { &mut *(arg as *mut Serving) };
    let h: &'static Held = h;
    let (memfd, mut listening) = (h.fds[0].number(), h.fds[1].number());
    // Done: a forked child must not close what the numbers are now (the program's).
    let done = || {
        h.free();
        std::ptr::null_mut()
    };
    loop {
        if !h.ours(1) {
            return done();
        }
        // The joiner's address: the name it bound, where it asks for the file too.
        // SAFETY: plain data, zeroed is valid.
        let mut from: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        let joiner = accept_joiner(h, listening, &mut from, &mut len);
        if let Ok(c) = joiner {
            // Accepted on the claim's socket: the program may have replaced a number
            // meanwhile (the call kept the socket it started on).
            let sent = h.ours(0) && h.ours(1);
            if sent {
                let file = (asks_for_file(&from, len) && h.ours(2)).then(|| h.fds[2].number());
                send(c, memfd, listening, file);
            }
            close(c);
            if sent {
                continue;
            }
            return done();
        }
        match joiner.err().flatten() {
            // A joiner gone before it was accepted, a signal: the next one.
            Some(libc::EINTR | libc::ECONNABORTED) => {}
            // No joiner for a while: the socket's path looked at.
            Some(libc::EAGAIN) => {
                if let Some(l) = watch.as_mut().and_then(|w| w.look()) {
                    // The socket at the path from now on; the one before closed here
                    // (only where it is still the claim's).
                    h.fds[1].close();
                    h.fds[1].keep(l);
                    listening = l;
                    // The epoll instance waited on the socket before: made again.
                    h.fds[3].close();
                }
            }
            // Out of descriptors or memory for a moment: the others serve meanwhile.
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                let mut waited = 5;
                pause(&mut waited);
            }
            // The socket is no longer one to accept on: this thread is done.
            _ => return done(),
        }
    }
}

/// The next joiner on `listening` (its address in `from`, `len`), or the error number:
/// `EAGAIN` where none came within [`CHECK_EVERY`]. The wait is in `epoll_wait` with
/// `EPOLLEXCLUSIVE` (one member's thread woken per joiner, as a blocking `accept` wakes
/// one), not in a blocking `accept`, which takes the lowest free descriptor number before
/// it sleeps and holds it while it waits: a number the program closed (its standard
/// input, to open `/dev/null` there) would not be its own again while it held the claim.
/// (A `poll` wakes every member's thread at each joiner: 1,000 members started together
/// took ×2.04 the raw start against ×1.49.) Where no epoll instance can be had, a
/// blocking `accept`, as before.
fn accept_joiner(
    h: &Held,
    listening: RawFd,
    from: &mut libc::sockaddr_un,
    len: &mut libc::socklen_t,
) -> Result<RawFd, Option<i32>> {
    let errno = || std::io::Error::last_os_error().raw_os_error();
    if let Some(ep) = h.fds[3].get().or_else(|| waiter_for(h, listening)) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        let every = CHECK_EVERY.tv_sec as i32 * 1000;
        // SAFETY: our epoll instance (checked just above), one event to fill; no mask.
        let ready = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait,
                ep,
                &mut ev as *mut libc::epoll_event,
                1,
                every,
                std::ptr::null::<libc::sigset_t>(),
                0usize,
            )
        };
        match ready {
            0 => return Err(Some(libc::EAGAIN)),
            r if r < 0 => return Err(errno()),
            _ => {}
        }
    }
    // SAFETY: the listening socket (checked by the caller), closed in this process only by
    // a forked child, which has no copy of this thread, or by the program; an address and
    // its length to fill.
    let c = unsafe {
        libc::syscall(
            libc::SYS_accept4,
            listening,
            from as *mut libc::sockaddr_un as *mut libc::sockaddr,
            len as *mut libc::socklen_t,
            libc::SOCK_CLOEXEC,
        )
    } as RawFd;
    if c < 0 { Err(errno()) } else { Ok(c) }
}

/// An epoll instance of this thread's waiting on `listening` with `EPOLLEXCLUSIVE`, kept
/// in `h` (above the standard three); None where it cannot be made (raw system calls:
/// no import).
fn waiter_for(h: &Held, listening: RawFd) -> Option<RawFd> {
    // SAFETY: no pointers.
    let ep = crate::sys::above_stdio(unsafe {
        libc::syscall(libc::SYS_epoll_create1, libc::EPOLL_CLOEXEC) as RawFd
    });
    if ep < 0 {
        return None;
    }
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
        u64: 0,
    };
    // SAFETY: our epoll instance, the listening socket and an event that lives across
    // the call.
    let added = unsafe {
        libc::syscall(
            libc::SYS_epoll_ctl,
            ep,
            libc::EPOLL_CTL_ADD,
            listening,
            &mut ev as *mut libc::epoll_event,
        )
    } == 0;
    if !added {
        close(ep);
        return None;
    }
    h.fds[3].keep(ep);
    Some(ep)
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
        h.let_go_in_child();
        h.taken.store(false, Relaxed);
    }
}

/// A test's stand-in for a forked child, in its own process: what [`forget_in_child`]
/// does, for the entries serving the pool file `file` only (the same file: its copy), and
/// left taken. A child has no serving thread; this process has one for each entry, which
/// finds its numbers gone at its next look and lets the entry go itself. Freeing every
/// entry here let other tests' claims be taken into entries whose threads still ran:
/// such a thread, woken, accepted on a number that was now another file and, done,
/// freed the entry under its new owner, whose joiners then got no answer (5 of 36 runs
/// of this crate's tests beside a loop of 2,000 processes starting).
#[cfg(test)]
pub(crate) fn let_go_in_child_of(file: RawFd) {
    let Some(id) = crate::kept::identity(file) else {
        return;
    };
    for h in HELD.iter().filter(|h| h.taken.load(Relaxed)) {
        if h.fds[2].get().and_then(crate::kept::identity) == Some(id) {
            h.let_go_in_child();
        }
    }
}
