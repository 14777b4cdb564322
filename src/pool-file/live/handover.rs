//! A claim's socket and what crosses it: its address, a question and its answer (the memfd
//! and the listening socket, by `SCM_RIGHTS`; and the pool file's descriptor to a joiner
//! that asks for it, [`FILE_REQUEST`]), and the checks of what came.

use std::os::fd::RawFd;
use std::path::Path;

use crate::sys::cstr;

/// How long one question waits for its answer: a member's thread may wait long for the
/// CPU while thousands of processes start at once on a few cores.
pub(super) const ANSWER_WITHIN: libc::timeval = libc::timeval {
    tv_sec: 2,
    tv_usec: 0,
};
pub(super) const SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
/// The header words a memfd must share with its file (magic, version, geometry, length,
/// creation time, creator's uid): the same pool's words.
const HEADER_BYTES: usize = 48;
/// How a joiner asks for the pool file's descriptor too: the abstract name its socket is
/// bound to before it connects begins so (the member reads it from `accept`). A joiner
/// that found no file at the claim's path, removed while the members run, and sees none
/// of them announced (another network namespace: a pod of its own) joins through it.
/// Every gpucap of this pool layout hands the file over where asked (one whose program
/// closed gpucap's descriptor of it cannot), and one that asks nothing gets none.
pub(super) const FILE_REQUEST: &[u8] = b"gpucap-claim-file/";

/// A socket's address for `path` (through `/proc/self/fd/N/` of its directory where the
/// whole path is longer than an address holds), with that directory's descriptor.
pub(super) struct Address {
    pub(super) addr: libc::sockaddr_un,
    dir: RawFd,
}

impl Address {
    pub(super) fn of(sock: &Path) -> Result<Address, String> {
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
                    0,
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

    pub(super) fn len(&self) -> libc::socklen_t {
        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t
    }

    /// The descriptor of the socket's directory the address names it under (-1: the
    /// address holds the whole path).
    pub(super) fn dir(&self) -> RawFd {
        self.dir
    }

    /// The address's path, NUL-terminated (under `/proc/self/fd/` where [`Address::dir`]
    /// is one).
    pub(super) fn path(&self) -> *const libc::c_char {
        self.addr.sun_path.as_ptr()
    }
}

impl Drop for Address {
    fn drop(&mut self) {
        close(self.dir);
    }
}

/// The file at NUL-terminated `path` (the socket's), not followed; no allocation.
pub(super) use crate::kept::lstat_of as lstat;

/// A socket file's identity: its inode and change time.
pub(super) fn identity(st: &crate::sys::stat) -> (u64, i64, i64) {
    (st.st_ino, st.st_ctime, st.st_ctime_nsec)
}

pub(super) fn close(fd: RawFd) {
    if fd >= 0 {
        // SAFETY: a descriptor of this module's, closed once.
        unsafe { libc::close(fd) };
    }
}

pub(super) fn socket() -> RawFd {
    crate::sys::unix_socket(libc::SOCK_STREAM)
}

/// What asking the socket gave.
pub(super) enum Answer {
    /// The memfd and the listening socket.
    Words(RawFd, RawFd),
    /// No socket, nobody listening, or no answer within [`ANSWER_WITHIN`]: the error of
    /// the connect that failed (None: it connected, and nobody answered in time).
    Nobody(Option<i32>),
    /// An answer that is not this pool's words: why.
    NotOurs(String),
    /// This process could not ask or take the answer (no descriptor left: its
    /// open-file limit): why.
    Untaken(String),
}

/// A socket connected to `at`, its answer's and its connect's patience
/// [`ANSWER_WITHIN`]; Err(the connect's error, None where no socket could be made).
pub(super) fn connect(at: &Address) -> Result<RawFd, Option<i32>> {
    connect_from(at, None)
}

/// [`connect`], the socket bound first to the abstract name `from` where one is given:
/// what the member sees of the joiner.
fn connect_from(at: &Address, from: Option<&[u8]>) -> Result<RawFd, Option<i32>> {
    let s = socket();
    if s < 0 {
        return Err(None);
    }
    if let Some(name) = from
        && !crate::sys::bind_abstract(s, name)
    {
        let e = std::io::Error::last_os_error().raw_os_error();
        close(s);
        return Err(e);
    }
    // The answer's patience, and a connect's where the queue is full.
    for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: our socket and a timeval for the option.
        unsafe {
            libc::syscall(
                libc::SYS_setsockopt,
                s,
                libc::SOL_SOCKET,
                option,
                &ANSWER_WITHIN as *const libc::timeval,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
    // SAFETY: our socket and a valid address of `len` bytes.
    let asked = unsafe {
        libc::syscall(
            libc::SYS_connect,
            s,
            &at.addr as *const libc::sockaddr_un,
            at.len(),
        )
    };
    if asked != 0 {
        let e = std::io::Error::last_os_error().raw_os_error();
        close(s);
        return Err(e);
    }
    Ok(s)
}

/// Asks the socket at `at` for the memfd of the pool file `file` (`bytes` long).
pub(super) fn ask(at: &Address, file: RawFd, bytes: usize) -> Answer {
    let fds = match connect(at) {
        Ok(s) => {
            let fds = receive(s);
            close(s);
            fds
        }
        Err(None) => return untaken("it cannot make a socket to ask", true),
        Err(Some(e @ (libc::EACCES | libc::EPERM))) => {
            return Answer::NotOurs(format!(
                "this process may not connect to it ({})",
                std::io::Error::from_raw_os_error(e)
            ));
        }
        Err(Some(e)) => return Answer::Nobody(Some(e)),
    };
    let [memfd, listening] = match fds {
        Ok([m, l, file]) => {
            close(file); // not asked for: a member sends it only where asked
            [m, l]
        }
        // The kernel could not put the descriptors in this process's table.
        Err(true) => return untaken("the kernel dropped the descriptors handed over", false),
        Err(false) => return Answer::Nobody(None),
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

/// `what` kept this process from taking the words: the error of the call that just
/// failed (where `failed`), and how many descriptors it may have open.
fn untaken(what: &str, failed: bool) -> Answer {
    let e = match failed {
        true => format!("{}, ", std::io::Error::last_os_error()),
        false => String::new(),
    };
    // SAFETY: plain data filled by prlimit (through `syscall`: no new import).
    let mut lim: libc::rlimit64 = unsafe { std::mem::zeroed() };
    // SAFETY: this process, a resource, no new limit and a struct to fill.
    let asked = unsafe {
        libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            std::ptr::null::<libc::rlimit64>(),
            &mut lim as *mut libc::rlimit64,
        )
    };
    let limit = match asked {
        0 => format!("its open-file limit is {}", lim.rlim_cur),
        _ => "its open-file limit reached?".into(),
    };
    Answer::Untaken(format!("{what} ({e}{limit})"))
}

/// The descriptors of one message on `s`: the memfd, the listening socket and, where it
/// came (asked for: [`FILE_REQUEST`]), the pool file (else -1); Err(true) where the
/// message carried descriptors this process could not take (`MSG_CTRUNC`: its open-file
/// limit). No allocation: a member's serving thread asks too (`rebinding`).
pub(super) fn receive(s: RawFd) -> Result<[RawFd; 3], bool> {
    let mut byte = 0u8;
    let mut io = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8]; // CMSG_SPACE(3 * sizeof(int)) is 32 bytes
    // SAFETY: plain data, zeroed is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut io;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: a message whose buffers live across the call.
    let n = unsafe { libc::syscall(libc::SYS_recvmsg, s, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return Err(false);
    }
    // The first three descriptors; any more closed (not what a member sends).
    let (mut got, mut count) = ([-1; 3], 0);
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..n {
                    let fd = crate::sys::above_stdio(data.add(i).read_unaligned());
                    match got.get_mut(count) {
                        Some(slot) => *slot = fd,
                        None => close(fd),
                    }
                    count += 1;
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    match got {
        [m, l, f] if (count == 2 || count == 3) && msg.msg_flags & libc::MSG_CTRUNC == 0 => {
            Ok([m, l, f])
        }
        _ => {
            got.into_iter().for_each(close);
            Err(msg.msg_flags & libc::MSG_CTRUNC != 0)
        }
    }
}

/// Sends `memfd` and `listening` (and `file`, where given) on the accepted connection `c`.
pub(super) fn send(c: RawFd, memfd: RawFd, listening: RawFd, file: Option<RawFd>) {
    let fds = if file.is_some() { 3 } else { 2 };
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
    // SAFETY: CMSG_SPACE of three descriptors fits `control` (32 of its 64 bytes).
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(4 * fds) } as _;
    // SAFETY: filling the one control message `msg` has room for, then sending it.
    unsafe {
        let c0 = libc::CMSG_FIRSTHDR(&msg);
        (*c0).cmsg_level = libc::SOL_SOCKET;
        (*c0).cmsg_type = libc::SCM_RIGHTS;
        (*c0).cmsg_len = libc::CMSG_LEN(4 * fds) as _;
        let data = libc::CMSG_DATA(c0) as *mut RawFd;
        data.write_unaligned(memfd);
        data.add(1).write_unaligned(listening);
        if let Some(f) = file {
            data.add(2).write_unaligned(f);
        }
        libc::syscall(libc::SYS_sendmsg, c, &msg, libc::MSG_NOSIGNAL);
    }
}

/// Whether the joiner whose address `accept` gave (`len` bytes of `from`) asks for the
/// pool file too: bound to a name beginning with [`FILE_REQUEST`]. No allocation.
pub(super) fn asks_for_file(from: &libc::sockaddr_un, len: libc::socklen_t) -> bool {
    // An abstract name: a NUL byte, then the name.
    let name = (len as usize).saturating_sub(std::mem::size_of::<libc::sa_family_t>() + 1);
    name >= FILE_REQUEST.len()
        && from.sun_path[0] == 0
        && from.sun_path[1..]
            .iter()
            .zip(FILE_REQUEST)
            .all(|(a, b)| *a as u8 == *b)
}

/// Asks the socket at `at` for the pool file's descriptor (a claim's file removed while
/// its members run): the file, checked to be the one whose words the memfd handed over
/// with it holds (a regular file of the length its header states, with the memfd's
/// header), opened again with `access` (what it is beyond that is checked as any pool
/// file's, `mapping`). Err: why not.
pub(super) fn ask_for_file(at: &Address, access: i32) -> Result<RawFd, NotHandedOver> {
    // A name of this process's own: another joiner's bound at the same moment would
    // refuse it (`EADDRINUSE`), then the next is tried.
    let mut name = FILE_REQUEST.to_vec();
    name.extend_from_slice(format!("{}/", std::process::id()).as_bytes());
    let stem = name.len();
    let mut fds = Err(false);
    for n in 0..8u32 {
        name.truncate(stem);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let nanos = now.map_or(0, |d| d.as_nanos());
        name.extend_from_slice(format!("{nanos:x}/{n}").as_bytes());
        match connect_from(at, Some(&name)) {
            Ok(s) => {
                fds = receive(s);
                close(s);
                break;
            }
            Err(Some(libc::EADDRINUSE)) => continue,
            Err(e) => {
                return Err(match e {
                    Some(e) => NotHandedOver {
                        why: format!(
                            "asking its socket failed: {}",
                            std::io::Error::from_raw_os_error(e)
                        ),
                        socket_gone: matches!(e, libc::ENOENT | libc::ECONNREFUSED),
                    },
                    None => "this process could not make a socket to ask".into(),
                });
            }
        }
    }
    let [memfd, listening, file] = match fds {
        Ok(three) => three,
        Err(_) => return Err("no member answered".into()),
    };
    close(listening); // this process serves nothing from this answer
    let bytes = crate::kept::stat_of(memfd).map_or(0, |st| st.st_size as usize);
    let checked = match file {
        -1 => Err(
            "the member that answered handed over no file (its program closed gpucap's \
                   descriptor of it)"
                .into(),
        ),
        f => check(memfd, f, bytes),
    };
    close(memfd);
    let opened = checked.and_then(|()| reopen(file, access));
    close(file);
    opened.map_err(NotHandedOver::from)
}

/// Why no member handed a claim's removed pool file over ([`ask_for_file`]).
#[derive(Debug)]
pub(crate) struct NotHandedOver {
    pub(crate) why: String,
    /// Nothing listened at the socket's path when asked (removed since it was seen
    /// answering, or replaced by a socket nobody holds): its members bind it there again
    /// within about a second (`rebinding`), and a question after that may reach them.
    pub(crate) socket_gone: bool,
}

impl<S: Into<String>> From<S> for NotHandedOver {
    fn from(why: S) -> Self {
        NotHandedOver {
            why: why.into(),
            socket_gone: false,
        }
    }
}

/// The file `fd` opened again (`/proc/self/fd/N`) with `access`: a descriptor handed over
/// shares the member's open file description, and the pool's locks (`F_OFD_*`) belong to
/// an open file description: through it this process would take the member's slot locks
/// for its own (every member's it holds would look dead, and its bytes be freed).
fn reopen(fd: RawFd, access: i32) -> Result<RawFd, String> {
    let link = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).map_err(|e| e.to_string())?;
    let id = crate::kept::identity(fd).ok_or("the file handed over cannot be read")?;
    crate::kept::open_link(&link, id, access)
        .map_err(|e| format!("the file handed over, opened again: {e}"))
}

/// [`check`]'s answer where the words handed over are a pool's, but their header is not
/// the file's: the members' words were made from another file than the one at the path.
pub(super) const OTHER_WORDS: &str = "what it handed over is another pool's words";

/// Whether `memfd` is the live words of the pool file `file`: a regular file of its
/// length, sealed, with its header.
pub(super) fn check(memfd: RawFd, file: RawFd, bytes: usize) -> Result<(), String> {
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
        return Err(OTHER_WORDS.into());
    }
    Ok(())
}

/// Whether `listening` is a listening socket (this process's serving thread accepts on
/// it: anything else would make it fail at once, again and again).
pub(super) fn check_listening(listening: RawFd) -> Result<(), String> {
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

    /// A regular file of 64 bytes whose header states its length, beginning with `head`.
    fn pool_like_file(dir: &Path, name: &str, head: &[u8]) -> std::fs::File {
        let mut bytes = vec![0u8; 64];
        bytes[..head.len()].copy_from_slice(head);
        bytes[24..32].copy_from_slice(&64u64.to_le_bytes());
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap()
    }

    /// One member's answer on a socket at `dir/s.sock`: accepts one joiner, says whether
    /// it asked for the file, and sends `memfd`, a listening socket and, where it asked,
    /// `file` (None: a member that sends no file, as one whose program closed it).
    fn answer_once(
        dir: &Path,
        memfd: RawFd,
        file: Option<RawFd>,
    ) -> (Address, std::thread::JoinHandle<bool>) {
        let at = Address::of(&dir.join("s.sock")).unwrap();
        let l = socket();
        // SAFETY: our socket and a valid address of `len` bytes.
        unsafe {
            let _ = std::fs::remove_file(dir.join("s.sock"));
            assert_eq!(
                libc::syscall(
                    libc::SYS_bind,
                    l,
                    &at.addr as *const libc::sockaddr_un,
                    at.len()
                ),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_listen, l, 4), 0);
        }
        let server = std::thread::spawn(move || {
            // SAFETY: plain data, zeroed is valid.
            let mut from: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            // SAFETY: our listening socket, an address and its length to fill.
            let c =
                unsafe { libc::accept(l, &mut from as *mut libc::sockaddr_un as *mut _, &mut len) };
            assert!(c >= 0);
            let asked = asks_for_file(&from, len);
            send(c, memfd, l, file.filter(|_| asked));
            close(c);
            close(l);
            asked
        });
        (at, server)
    }

    #[test]
    fn a_removed_claim_file_is_handed_over_to_who_asks_and_opened_as_its_own() {
        let dir = std::env::temp_dir().join(format!("gpucap-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let head: Vec<u8> = (0..HEADER_BYTES as u8).map(|b| b | 0x80).collect();
        let mut stated = head.clone();
        stated[24..32].copy_from_slice(&64u64.to_le_bytes());
        let words = memfd(64, &stated, SEALS);
        let file = pool_like_file(&dir, "f", &stated);
        use std::os::fd::AsRawFd;
        // The member's own slot lock, on its open file description.
        let mut lock = crate::locks::flock_range(libc::F_WRLCK, 7, 1);
        crate::locks::lock_call(file.as_raw_fd(), libc::F_OFD_SETLK, &mut lock).unwrap();

        let (at, server) = answer_once(&dir, words, Some(file.as_raw_fd()));
        let got = ask_for_file(&at, libc::O_RDWR).unwrap();
        assert!(
            server.join().unwrap(),
            "the joiner's address asks for the file"
        );
        assert_eq!(
            crate::kept::stat_of(got).map(|st| st.st_ino),
            crate::kept::stat_of(file.as_raw_fd()).map(|st| st.st_ino),
            "the file handed over"
        );
        // Its own open file: the member's lock is another's to it, as a joiner must see it.
        let mut mine = crate::locks::flock_range(libc::F_WRLCK, 7, 1);
        assert!(
            crate::locks::lock_call(got, libc::F_OFD_SETLK, &mut mine).is_err(),
            "the member's slot lock looks like this process's own"
        );
        close(got);

        // A member that sends no file (its program closed it): refused, saying so.
        let (at, server) = answer_once(&dir, words, None);
        let e = ask_for_file(&at, libc::O_RDWR).unwrap_err().why;
        server.join().unwrap();
        assert!(e.contains("handed over no file (its program closed"), "{e}");

        // A file that is not the one whose words came with it.
        let mut other = stated.clone();
        other[40] ^= 1;
        let theirs = pool_like_file(&dir, "g", &other);
        let (at, server) = answer_once(&dir, words, Some(theirs.as_raw_fd()));
        let e = ask_for_file(&at, libc::O_RDWR).unwrap_err().why;
        server.join().unwrap();
        assert!(e.contains("another pool's words"), "{e}");

        // A plain question (no name bound) is never handed the file.
        let (at, server) = answer_once(&dir, words, Some(file.as_raw_fd()));
        match ask(&at, file.as_raw_fd(), 64) {
            Answer::Words(m, l) => [m, l].into_iter().for_each(close),
            _ => panic!("the plain question's answer"),
        }
        assert!(!server.join().unwrap(), "a plain question asks for no file");
        close(words);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A socket gone from its path since it was seen answering (removed, or a socket
    /// nobody holds in its place) is worth asking again once the members bind it there
    /// again (`mapping::open_member`); a member's answer without the file is not.
    #[test]
    fn a_question_that_found_no_socket_says_so() {
        let dir = std::env::temp_dir().join(format!("gpucap-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = Address::of(&dir.join("s.sock")).unwrap();
        let e = ask_for_file(&at, libc::O_RDWR).unwrap_err();
        assert!(e.socket_gone, "no socket: {}", e.why);
        // A socket bound there whose holder is gone.
        drop(std::os::unix::net::UnixListener::bind(dir.join("s.sock")).unwrap());
        let e = ask_for_file(&at, libc::O_RDWR).unwrap_err();
        assert!(e.socket_gone, "a dead socket: {}", e.why);
        let head: Vec<u8> = (0..HEADER_BYTES as u8).map(|b| b | 0x80).collect();
        let words = memfd(64, &head, SEALS);
        let (at, server) = answer_once(&dir, words, None);
        let e = ask_for_file(&at, libc::O_RDWR).unwrap_err();
        server.join().unwrap();
        assert!(!e.socket_gone, "a member answered: {}", e.why);
        close(words);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_socket_whose_path_is_too_long_for_an_address_is_reached_through_its_directory() {
        let a = Address::of(Path::new("/dev/shm/claim/gpucap.pool.sock")).unwrap();
        assert_eq!(a.dir, -1);
        // Of this process's own: another run of the suite at once removes its own.
        let long = std::env::temp_dir().join(format!("{}{}", "d".repeat(120), std::process::id()));
        std::fs::create_dir_all(&long).unwrap();
        let a = Address::of(&long.join("gpucap.pool.sock")).unwrap();
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
