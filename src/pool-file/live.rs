//! A claim's live words: a memfd sealed against shrinking and growing, never the file.
//!
//! A claim's pool file may be written by every container of the claim (by design, its
//! directory's mode says who), so any of them can truncate it; a member reaching its words
//! through a mapping of that file would die of SIGBUS at its next access. So a claim's
//! members map a copy of the file's words in a memfd instead, sealed (`F_SEAL_SHRINK`,
//! `F_SEAL_GROW`, `F_SEAL_SEAL`): nobody can change its size, and only its holders can
//! write it. The file stays the rendezvous (the slots' locks) and the words at rest: the
//! memfd is made from them when no process holds one.
//!
//! Every member hands the memfd to the next over a Unix socket beside the file
//! (`<file>.sock`; `SCM_RIGHTS` crosses PID and IPC namespaces, which a claim's
//! containers do not share): all of them accept on one listening socket, handed over with
//! the memfd, from a thread each. A joiner asks; who answers first gives it both.
//!
//! Two lock bytes of the pool file keep a claim to one memfd (two would be two budgets):
//! every process holding the memfd read-locks [`HOLD_BYTE`] for life, taken right after it
//! was handed the memfd, and keeps it only where the socket at the path is still the one it
//! asked; a memfd is made only under `HOLD_BYTE`'s write lock (no process holds one) and
//! always served from a new socket bound there, by one joiner at a time ([`MAKE_BYTE`],
//! write-locked, never waited on); the others wait for its decision on `MAKE_BYTE`
//! (read-locked) and ask again. What a joiner keeps is the claim's memfd and stays so while
//! it lives. Where members hold it and none answers (every one stopped), a joiner is
//! refused after [`PATIENCE`], never given a memfd of its own. The design's prototype,
//! `tests/c/memfd_join.c`, measures each part and churns it (docs/src/threat-model.md).
//!
//! System calls go through `syscall` (already imported): no new symbol for the dynamic
//! loader to look up in every process the shim is loaded into.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::locks::{LOCK_BASE, flock_range};
use crate::sys::cstr;

/// Read-locked for life by every process holding the claim's memfd.
pub(crate) const HOLD_BYTE: i64 = LOCK_BASE - 2;
/// Write-locked by the one joiner deciding whether to make the memfd.
pub(crate) const MAKE_BYTE: i64 = LOCK_BASE - 1;
/// How long a joiner asks while members hold the memfd and none hands it over.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);
/// How long one question waits for its answer: a member's thread may wait long for the
/// CPU while thousands of processes start at once on a few cores.
const ANSWER_WITHIN: libc::timeval = libc::timeval {
    tv_sec: 2,
    tv_usec: 0,
};
const SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// The header words a memfd must share with its file (magic, version, geometry, length,
/// creation time, creator's uid): the same pool's words.
const HEADER_BYTES: usize = 48;

/// The socket beside a claim's pool file at `path`.
pub(crate) fn socket_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".sock");
    path.with_file_name(name)
}

/// A socket's address for `path` (through `/proc/self/fd/N/` of its directory where the
/// whole path is longer than an address holds), with that directory's descriptor.
struct Address {
    addr: libc::sockaddr_un,
    dir: RawFd,
}

impl Address {
    fn of(sock: &Path) -> Result<Address, String> {
        // SAFETY: plain data, zeroed is valid.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let mut dir = -1;
        let whole = cstr(sock)?;
        let bytes = if whole.as_bytes().len() < addr.sun_path.len() {
            whole.as_bytes().to_vec()
        } else {
            let d = cstr(sock.parent().unwrap_or(Path::new("/")))?;
            // SAFETY: a NUL-terminated path; O_PATH opens nothing but the name.
            dir = unsafe {
                crate::sys::open(
                    d.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            if dir < 0 {
                return Err(crate::sys::os_err("cannot open the directory of", sock));
            }
            let name = sock.file_name().unwrap_or_default().to_string_lossy();
            format!("/proc/self/fd/{dir}/{name}").into_bytes()
        };
        if bytes.len() >= addr.sun_path.len() {
            close(dir);
            return Err(format!(
                "the socket {}: its name is too long for a socket's address",
                sock.display()
            ));
        }
        for (d, b) in addr.sun_path.iter_mut().zip(&bytes) {
            *d = *b as libc::c_char;
        }
        Ok(Address { addr, dir })
    }

    fn len(&self) -> libc::socklen_t {
        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t
    }
}

impl Drop for Address {
    fn drop(&mut self) {
        close(self.dir);
    }
}

fn close(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: a descriptor of this module's, closed once.
        unsafe { libc::close(fd) };
    }
}

fn socket() -> RawFd {
    // SAFETY: no pointers.
    unsafe {
        libc::syscall(
            libc::SYS_socket,
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ) as RawFd
    }
}

/// What asking the socket gave.
enum Answer {
    /// The memfd and the listening socket.
    Words(RawFd, RawFd),
    /// No socket, nobody listening, or no answer within [`ANSWER_WITHIN`].
    Nobody,
    /// An answer that is not this pool's words: why.
    NotOurs(String),
}

/// Asks the socket at `at` for the memfd of the pool file `file` (`bytes` long).
fn ask(at: &Address, file: RawFd, bytes: usize) -> Answer {
    let s = socket();
    if s < 0 {
        return Answer::Nobody;
    }
    // SAFETY: our socket, a valid address of `len` bytes, a timeval for the option.
    let asked = unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            s,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &ANSWER_WITHIN as *const libc::timeval,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        libc::syscall(
            libc::SYS_setsockopt,
            s,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO, // a connect's patience, where the queue is full
            &ANSWER_WITHIN as *const libc::timeval,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
        libc::syscall(
            libc::SYS_connect,
            s,
            &at.addr as *const libc::sockaddr_un,
            at.len(),
        )
    };
    let refused = std::io::Error::last_os_error();
    let fds = if asked == 0 { receive(s) } else { None };
    close(s);
    if asked != 0 && matches!(refused.raw_os_error(), Some(libc::EACCES | libc::EPERM)) {
        return Answer::NotOurs(format!("this process may not connect to it ({refused})"));
    }
    let Some([memfd, listening]) = fds else {
        return Answer::Nobody;
    };
    match check(memfd, file, bytes).and_then(|()| check_listening(listening)) {
        Ok(()) => Answer::Words(memfd, listening),
        Err(why) => {
            close(memfd);
            close(listening);
            Answer::NotOurs(why)
        }
    }
}

/// The two descriptors of one message on `s`.
fn receive(s: RawFd) -> Option<[RawFd; 2]> {
    let mut byte = 0u8;
    let mut io = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8]; // CMSG_SPACE(2 * sizeof(int)) is 24 bytes
    // SAFETY: plain data, zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut io;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: a message whose buffers live across the call.
    let n = unsafe { libc::syscall(libc::SYS_recvmsg, s, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return None;
    }
    let mut got = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                got.extend((0..count).map(|i| data.add(i).read_unaligned()));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    match got[..] {
        [m, l] if msg.msg_flags & libc::MSG_CTRUNC == 0 => Some([m, l]),
        _ => {
            got.into_iter().for_each(close);
            None
        }
    }
}

/// Sends `memfd` and `listening` on the accepted connection `c`.
fn send(c: RawFd, memfd: RawFd, listening: RawFd) {
    let mut byte = b'w';
    let mut io = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8];
    // SAFETY: plain data, zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut io;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE of two descriptors fits `control` (24 of its 64 bytes).
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(8) } as _;
    // SAFETY: filling the one control message `msg` has room for, then sending it.
    unsafe {
        let c0 = libc::CMSG_FIRSTHDR(&msg);
        (*c0).cmsg_level = libc::SOL_SOCKET;
        (*c0).cmsg_type = libc::SCM_RIGHTS;
        (*c0).cmsg_len = libc::CMSG_LEN(8) as _;
        let data = libc::CMSG_DATA(c0) as *mut RawFd;
        data.write_unaligned(memfd);
        data.add(1).write_unaligned(listening);
        libc::syscall(libc::SYS_sendmsg, c, &msg, libc::MSG_NOSIGNAL);
    }
}

/// Whether `memfd` is the live words of the pool file `file`: a regular file of its
/// length, sealed, with its header.
fn check(memfd: RawFd, file: RawFd, bytes: usize) -> Result<(), String> {
    // SAFETY: plain data filled by fstat.
    let mut st: crate::sys::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor and a stat to fill.
    if unsafe { crate::sys::fstat(memfd, &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_size as usize != bytes
    {
        return Err(format!(
            "what it handed over is not a pool's words of {bytes} bytes"
        ));
    }
    // SAFETY: a descriptor; F_GET_SEALS takes no argument.
    let seals = unsafe { libc::fcntl(memfd, libc::F_GET_SEALS) };
    if seals < 0 || seals & SEALS != SEALS {
        return Err("what it handed over is not sealed against shrinking and growing".into());
    }
    let [mut a, mut b] = [[0u8; HEADER_BYTES]; 2];
    // SAFETY: two descriptors and two buffers of HEADER_BYTES.
    let (na, nb) = unsafe {
        (
            libc::pread(memfd, a.as_mut_ptr().cast(), HEADER_BYTES, 0),
            libc::pread(file, b.as_mut_ptr().cast(), HEADER_BYTES, 0),
        )
    };
    if na != HEADER_BYTES as isize || nb != HEADER_BYTES as isize || a != b {
        return Err("what it handed over is another pool's words".into());
    }
    Ok(())
}

/// Whether `listening` is a listening socket (this process's serving thread accepts on
/// it: anything else would make it fail at once, again and again).
fn check_listening(listening: RawFd) -> Result<(), String> {
    let mut on: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: a descriptor, an int and its length for the option.
    let asked = unsafe {
        libc::syscall(
            libc::SYS_getsockopt,
            listening,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            &mut on as *mut i32,
            &mut len as *mut libc::socklen_t,
        )
    };
    if asked != 0 || on != 1 {
        return Err("what it handed over with the words is not a listening socket".into());
    }
    Ok(())
}

/// The claim's memfd for a member of the pool file `file` at `path` (`bytes` long),
/// asked of the members or made from the file's words where no process holds one; from
/// now on this process holds it (`HOLD_BYTE`) and serves it to the next.
pub(crate) fn hold(path: &Path, file: RawFd, bytes: usize) -> Result<RawFd, String> {
    let sock = socket_path(path);
    let at = Address::of(&sock)?;
    let give_up = Instant::now() + PATIENCE;
    let mut why = String::from("none handed it over");
    let mut first = true;
    let mut waited = 0;
    loop {
        if Instant::now() >= give_up {
            return Err(format!(
                "cannot join the claim's pool {}: its members hold its words, and {why} \
                 within {} s (are they stopped?)",
                path.display(),
                PATIENCE.as_secs()
            ));
        }
        // Never waits on a lock (a process stopped holding one would hold every joiner):
        // a lock held by another is tried again shortly, until the patience runs out.
        // After a question nobody answered, a decision under way: wait for it. (Each lock
        // call walks the file's locks, two a member: the first question makes none but
        // the hold's.)
        if !std::mem::take(&mut first) {
            if !try_lock(file, libc::F_RDLCK, MAKE_BYTE, path)? {
                pause(&mut waited);
                continue;
            }
            try_lock(file, libc::F_UNLCK, MAKE_BYTE, path)?;
        }
        match held(&sock, &at, file, bytes, path)? {
            Asked::Held(m, l) => return served(m, l),
            Asked::Again => {
                pause(&mut waited);
                continue;
            }
            Asked::Nobody(w) => why = w.unwrap_or(why),
        }
        // Nobody answered: one joiner at a time asks again and decides.
        if try_lock(file, libc::F_WRLCK, MAKE_BYTE, path)? {
            let decided = decide(&sock, &at, file, bytes, path);
            try_lock(file, libc::F_UNLCK, MAKE_BYTE, path)?;
            if let Some((m, l)) = decided? {
                return served(m, l);
            }
        }
        pause(&mut waited);
    }
}

/// What [`held`] got.
enum Asked {
    /// The claim's memfd and listening socket, HOLD_BYTE read-locked.
    Held(RawFd, RawFd),
    /// Nobody answered (why, where something not the pool's words did).
    Nobody(Option<String>),
    /// An answer that may be a set's that died meanwhile: ask again.
    Again,
}

/// Asks for the memfd, then read-locks HOLD_BYTE, keeping what it got only where the
/// socket at `sock` is still the one it asked (a new memfd is always served from a new
/// socket bound there, and made only under HOLD_BYTE's write lock): what it holds then
/// is the claim's, and stays so while it holds the lock. Asking without the lock leaves
/// a joiner that makes the memfd free to write-lock HOLD_BYTE while thousands ask.
fn held(
    sock: &Path,
    at: &Address,
    file: RawFd,
    bytes: usize,
    path: &Path,
) -> Result<Asked, String> {
    let before = socket_identity(sock);
    let (m, l) = match ask(at, file, bytes) {
        Answer::Words(m, l) => (m, l),
        Answer::NotOurs(w) => {
            return Ok(Asked::Nobody(Some(format!(
                "the socket {}: {w}",
                sock.display()
            ))));
        }
        Answer::Nobody => return Ok(Asked::Nobody(None)),
    };
    if try_lock(file, libc::F_RDLCK, HOLD_BYTE, path)? {
        if before.is_some() && socket_identity(sock) == before {
            return Ok(Asked::Held(m, l));
        }
        try_lock(file, libc::F_UNLCK, HOLD_BYTE, path)?;
    }
    close(m);
    close(l);
    Ok(Asked::Again)
}

/// The socket file at `sock`: its inode and change time (None: none there).
fn socket_identity(sock: &Path) -> Option<(u64, i64, i64)> {
    let c = cstr(sock).ok()?;
    // SAFETY: plain data filled by lstat; a NUL-terminated path.
    let mut st: crate::sys::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { crate::sys::lstat(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.st_ino, st.st_ctime, st.st_ctime_nsec))
}

/// Under `MAKE_BYTE`'s write lock: the memfd a member hands over now, or a new one where
/// no other process holds one (HOLD_BYTE write-locked), HOLD_BYTE read-locked either way;
/// None where others hold it and none answered.
fn decide(
    sock: &Path,
    at: &Address,
    file: RawFd,
    bytes: usize,
    path: &Path,
) -> Result<Option<(RawFd, RawFd)>, String> {
    if let Asked::Held(m, l) = held(sock, at, file, bytes, path)? {
        return Ok(Some((m, l)));
    }
    if !try_lock(file, libc::F_WRLCK, HOLD_BYTE, path)? {
        return Ok(None);
    }
    match make(sock, at, file, bytes) {
        Ok(pair) => {
            try_lock(file, libc::F_RDLCK, HOLD_BYTE, path)?;
            Ok(Some(pair))
        }
        Err(e) => {
            try_lock(file, libc::F_UNLCK, HOLD_BYTE, path)?;
            Err(e)
        }
    }
}

/// Sleeps before trying again: 200 µs, doubled each time up to 6.4 ms (thousands of
/// joiners waiting for one decision leave the CPU to the process making it).
fn pause(waited: &mut u32) {
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

/// Takes (or, with `F_UNLCK`, lets go of) `byte` of `file` without waiting: false where
/// another process holds it.
fn try_lock(file: RawFd, kind: i32, byte: i64, path: &Path) -> Result<bool, String> {
    let mut f = flock_range(kind, byte, 1);
    // SAFETY: our descriptor and a valid flock for the call.
    if unsafe { libc::fcntl(file, libc::F_OFD_SETLK, &mut f as *mut libc::flock) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(format!("cannot lock the pool file {}: {e}", path.display())),
    }
}

/// A new memfd with the words of `file`, sealed, and the socket it is served on, bound
/// at `sock` (a dead set's socket removed first: nobody holds it any more).
fn make(sock: &Path, at: &Address, file: RawFd, bytes: usize) -> Result<(RawFd, RawFd), String> {
    let fail = |what: &str| {
        format!(
            "{what} for the pool {}: {}",
            sock.display(),
            std::io::Error::last_os_error()
        )
    };
    // SAFETY: a NUL-terminated name; the flags ask for a sealable, close-on-exec memfd.
    let m = unsafe {
        libc::memfd_create(
            c"gpucap-pool".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if m < 0 {
        return Err(fail("cannot make the memory"));
    }
    let mut words = vec![0u8; bytes];
    // SAFETY: our descriptors and a buffer of `bytes`.
    let copied = unsafe {
        libc::ftruncate(m, bytes as libc::off_t) == 0
            && libc::pread(file, words.as_mut_ptr().cast(), bytes, 0) == bytes as isize
            && libc::pwrite(m, words.as_ptr().cast(), bytes, 0) == bytes as isize
            && libc::fcntl(m, libc::F_ADD_SEALS, SEALS) == 0
    };
    if !copied {
        let e = fail("cannot copy the pool file's words into memory");
        close(m);
        return Err(e);
    }
    let c = cstr(sock)?;
    let l = socket();
    // SAFETY: a NUL-terminated path; our socket and a valid address of `len` bytes.
    let listening = l >= 0
        && unsafe {
            libc::unlink(c.as_ptr());
            libc::syscall(
                libc::SYS_bind,
                l,
                &at.addr as *const libc::sockaddr_un,
                at.len(),
            ) == 0
                && libc::syscall(libc::SYS_listen, l, 4096) == 0
        };
    // Whoever may write the pool file may ask (connecting takes a write permission on
    // the socket): the file's mode, not this process's umask. A setgid directory (a
    // claim's fsGroup) gave it the directory's group, as it gave the file.
    // SAFETY: plain data filled by fstat; then a NUL-terminated path.
    let shared = listening
        && unsafe {
            let mut st: crate::sys::stat = std::mem::zeroed();
            crate::sys::fstat(file, &mut st) == 0
                && libc::syscall(
                    libc::SYS_fchmodat,
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    st.st_mode & 0o666,
                ) == 0
        };
    if !shared {
        let e = fail("cannot listen on the socket");
        close(m);
        close(l);
        return Err(e);
    }
    Ok((m, l))
}

/// The memfd and listening socket of each claim this process holds, for a forked child
/// to close ([`forget_in_child`]).
static HELD: [[AtomicI32; 2]; 8] = [const { [const { AtomicI32::new(-1) }; 2] }; 8];

/// Serves `memfd` and `listening` to every joiner from a thread of their own: the memfd.
fn served(memfd: RawFd, listening: RawFd) -> Result<RawFd, String> {
    let slot = HELD.iter().find(|h| h[0].load(Relaxed) < 0);
    let Some(h) = slot else {
        return Err("this process holds 8 claims' pools already".into());
    };
    h[0].store(memfd, Relaxed);
    h[1].store(listening, Relaxed);
    match spawn(h as *const [AtomicI32; 2] as *mut libc::c_void) {
        0 => Ok(memfd),
        e => Err(format!(
            "cannot start the thread that hands the claim's words to the next member: {}",
            std::io::Error::from_raw_os_error(e)
        )),
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

/// A claim's live words for a reader or a resize: a memfd (the caller closes it), or
/// None where no process holds them (the file's words are the pool's then).
pub(crate) fn borrow(path: &Path, file: RawFd, bytes: usize) -> Result<Option<RawFd>, String> {
    let sock = socket_path(path);
    match ask(&Address::of(&sock)?, file, bytes) {
        Answer::Words(m, l) => {
            close(l); // a reader serves nobody
            Ok(Some(m))
        }
        Answer::Nobody => Ok(None),
        Answer::NotOurs(why) => Err(format!("the socket {}: {why}", sock.display())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A memfd of `bytes` holding `head` at its start, sealed with `seals`.
    fn memfd(bytes: usize, head: &[u8], seals: i32) -> RawFd {
        // SAFETY: a constant name; our descriptor and a buffer of head.len() bytes.
        unsafe {
            let m = libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert!(m >= 0);
            assert_eq!(libc::ftruncate(m, bytes as libc::off_t), 0);
            libc::pwrite(m, head.as_ptr().cast(), head.len(), 0);
            if seals != 0 {
                assert_eq!(libc::fcntl(m, libc::F_ADD_SEALS, seals), 0);
            }
            m
        }
    }

    #[test]
    fn only_a_sealed_copy_of_the_files_length_and_header_is_the_pools_words() {
        let head: Vec<u8> = (0..HEADER_BYTES as u8).collect();
        let file = memfd(4096, &head, 0); // stands for the pool file
        let ours = memfd(4096, &head, SEALS);
        assert_eq!(check(ours, file, 4096), Ok(()));
        let unsealed = memfd(4096, &head, libc::F_SEAL_SEAL);
        assert!(
            check(unsealed, file, 4096)
                .unwrap_err()
                .contains("not sealed")
        );
        let short = memfd(2048, &head, SEALS);
        assert!(
            check(short, file, 4096)
                .unwrap_err()
                .contains("of 4096 bytes")
        );
        let mut other = head.clone();
        other[40] ^= 1; // another creation time
        let theirs = memfd(4096, &other, SEALS);
        assert!(
            check(theirs, file, 4096)
                .unwrap_err()
                .contains("another pool's words")
        );
        [file, ours, unsealed, short, theirs]
            .into_iter()
            .for_each(close);
    }

    #[test]
    fn only_a_listening_socket_passes_for_the_one_to_serve_on() {
        let sock = socket();
        assert!(check_listening(sock).is_err(), "a socket not listening");
        let file = memfd(4096, &[], 0);
        assert!(check_listening(file).is_err(), "a memfd");
        let dir = std::env::temp_dir().join(format!("gpucap-live-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = Address::of(&dir.join("s.sock")).unwrap();
        // SAFETY: our socket and a valid address of `len` bytes.
        let listening = unsafe {
            libc::syscall(
                libc::SYS_bind,
                sock,
                &at.addr as *const libc::sockaddr_un,
                at.len(),
            ) == 0
                && libc::syscall(libc::SYS_listen, sock, 4) == 0
        };
        assert!(listening);
        assert_eq!(check_listening(sock), Ok(()));
        [sock, file].into_iter().for_each(close);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_socket_whose_path_is_too_long_for_an_address_is_reached_through_its_directory() {
        let short = Path::new("/dev/shm/claim/gpucap.pool");
        assert_eq!(
            socket_path(short),
            Path::new("/dev/shm/claim/gpucap.pool.sock")
        );
        let a = Address::of(&socket_path(short)).unwrap();
        assert_eq!(a.dir, -1);
        let long = std::env::temp_dir().join("d".repeat(120));
        std::fs::create_dir_all(&long).unwrap();
        let a = Address::of(&socket_path(&long.join("gpucap.pool"))).unwrap();
        let name: Vec<u8> = a
            .addr
            .sun_path
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        assert_eq!(
            String::from_utf8(name).unwrap(),
            format!("/proc/self/fd/{}/gpucap.pool.sock", a.dir)
        );
        drop(a);
        std::fs::remove_dir_all(&long).unwrap();
    }
}
