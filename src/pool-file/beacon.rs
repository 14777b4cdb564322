//! A pool's members announce themselves where no file cleanup reaches, so that a pool
//! whose file was removed while they run is joined, not made a second time.
//!
//! The files of a user's pools can be removed under live members: logind removes every
//! file a user owns in `/dev/shm` when the user's last session ends (`RemoveIPC=yes`, its
//! default) and `/run/user/UID` with it, `/tmp` is aged by `systemd-tmpfiles`, and a
//! user may `rm -rf` the directory. The members go on (they map the file); a process
//! that then found no file made a new one: a second budget beside theirs (700 MiB served
//! beside a live member's 700 MiB under a 1 GiB cap).
//!
//! A claim's directory is shared by every container of the claim, and any of them (or a
//! driver's cleanup) may remove its file: the next joiner made a file and a memfd of its
//! own, another budget the same way.
//!
//! So each member of a pool binds an abstract Unix socket: a name, not a file (nothing removes it but the kernel, when the
//! process exits or execs), saying which pool file (its path's hash, device and inode)
//! and how to reach it (the member's pid and descriptor). A process that finds no file at
//! the pool's path reads the names (`/proc/net/unix`) first: where a member of a removed
//! file of that path lives, it opens the file through the member's descriptor
//! (`/proc/PID/fd/N`, checked to be that file; the usual checks of a pool file follow)
//! and joins it (a claim's through its socket, as ever: the file's locks are there);
//! where members live but none can be reached (another PID namespace, another user, a
//! descriptor the program closed), it is refused, never given a budget of its own. A
//! user's pools are announced under the user's uid, a claim's under the claim (its
//! containers may run as several users). Abstract names are per network namespace:
//! processes of one pool in different ones (pods sharing a claim, containers sharing a
//! volume) do not see each other's, as before.

use std::os::fd::RawFd;
use std::path::Path;

use crate::Sharing;
use crate::identity::own_uid;
use crate::kept::Kept;

const PREFIX: &str = "gpucap-pool/";

/// This process's announcement (a socket), for a forked child to close.
static BEACON: Kept = Kept::none();

/// The pool file at `path` (its bytes hashed, FNV-1a): what a joiner of the same path
/// looks for.
fn path_hash(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Whose announcements of the pool file at `path` (shared as `sharing`) count: this
/// user's (its uid) or any of a claim's (`claim`); and the path's hash as written.
fn key(path: &Path, sharing: Sharing) -> (String, String) {
    let who = match sharing {
        Sharing::Claim => "claim".to_string(),
        _ => own_uid().to_string(),
    };
    (who, crate::hex::hex16(path_hash(path)))
}

/// One announcement, as its name says it (`gpucap-pool/WHO/HASH/DEV/INO/PID/FD`).
struct Announced<'a> {
    who: &'a str,
    hash: &'a str,
    id: (u64, u64),
    pid: u32,
    fd: i32,
}

/// The announcements among the names the sockets of `table` are bound to.
fn announced(table: &str) -> impl Iterator<Item = Announced<'_>> {
    bound_names(table).filter_map(|name| {
        let rest = name.strip_prefix('@')?.strip_prefix(PREFIX)?;
        let mut parts = rest.split('/');
        let mut next = || parts.next();
        let (who, hash) = (next()?, next()?);
        let hex = |p: &str| u64::from_str_radix(p, 16).ok();
        let id = (hex(next()?)?, hex(next()?)?);
        let (pid, fd) = (next()?.parse().ok()?, next()?.parse().ok()?);
        Some(Announced {
            who,
            hash,
            id,
            pid,
            fd,
        })
    })
}

/// Announces this process as a member of the pool file at `path` (shared as `sharing`),
/// open as `fd`. Where it cannot (no socket left: a descriptor limit), the pool works as
/// before, unannounced.
pub(crate) fn announce(path: &Path, sharing: Sharing, fd: RawFd) {
    let Some((dev, ino)) = crate::kept::identity(fd) else {
        return;
    };
    let (who, hash) = key(path, sharing);
    let name = format!(
        "{PREFIX}{who}/{hash}/{dev:x}/{ino:x}/{}/{fd}",
        std::process::id()
    );
    // Raw system calls, as the claim's sockets: the C library's `socket` and `bind`
    // would be two more imports the loader looks up at every process's start.
    let s = crate::sys::unix_socket(libc::SOCK_DGRAM);
    if s < 0 {
        return;
    }
    if !crate::sys::bind_abstract(s, name.as_bytes()) {
        // SAFETY: our socket, given up on.
        unsafe { libc::close(s) };
        return;
    }
    BEACON.close();
    BEACON.keep(s);
}

/// In a forked child: the parent's announcement is the parent's (the child's copy would
/// announce a member after the member's death). A number the program reused is its own.
pub fn forget_in_child() {
    BEACON.close();
}

/// What a process that found no file at a pool's path learns from the announcements.
#[derive(Debug)]
pub(crate) enum Orphan {
    /// No process of this user announces a file of that path: make one.
    None,
    /// The removed file, opened through member `pid`'s descriptor.
    Found { fd: RawFd, pid: u32 },
    /// Members of a file of that path live (their pids), and none could be reached.
    Unreachable(Vec<u32>),
}

/// Whether members of a pool file that was at `path` (shared as `sharing`) still live
/// (see the module's doc); the file found is opened with `access` (`O_RDWR` for a member
/// or a writer, `O_RDONLY` for a reader).
pub(crate) fn orphan(path: &Path, sharing: Sharing, access: i32) -> Orphan {
    orphan_but(path, sharing, access, std::process::id())
}

/// [`orphan`], not counting the announcements of process `me`.
fn orphan_but(path: &Path, sharing: Sharing, access: i32, me: u32) -> Orphan {
    let Some(table) = socket_table() else {
        return Orphan::None;
    };
    let (who, hash) = key(path, sharing);
    let mut unreachable = Vec::new();
    for a in announced(&table).filter(|a| a.who == who && a.hash == hash) {
        let (pid, n, (dev, ino)) = (a.pid, a.fd, a.id);
        if pid == me {
            continue;
        }
        // Anyone may bind any abstract name: a user's pool counts only its own user's
        // processes (another user's announcement under this user's key would otherwise
        // keep the user's pool from ever being made: refused as unreachable).
        if sharing == Sharing::Private && process_owner(pid) != Some(own_uid()) {
            continue;
        }
        match reach(pid, n, (dev, ino), access) {
            // Made at the path meanwhile (a mass start's first member): not removed, the
            // caller opens it there.
            Some(fd) if at_path(path, (dev, ino)) => {
                // SAFETY: the descriptor reach opened, not kept.
                unsafe { libc::close(fd) };
                return Orphan::None;
            }
            Some(fd) => return Orphan::Found { fd, pid },
            None => unreachable.push(pid),
        }
    }
    if unreachable.is_empty() {
        Orphan::None
    } else {
        unreachable.sort_unstable();
        unreachable.dedup();
        Orphan::Unreachable(unreachable)
    }
}

/// The network namespace's Unix sockets as the kernel lists them (`/proc/net/unix`).
fn socket_table() -> Option<String> {
    std::fs::read_to_string("/proc/net/unix").ok()
}

/// The names the sockets of `table` are bound to (the last field of a line that has
/// eight): found with the library's byte searches (a newline, then the last space
/// before it), a few instructions a line; splitting each line into its fields cost some
/// 670 (a machine's thousand sockets: 670,000 instructions for the member that makes a
/// pool file).
fn bound_names(table: &str) -> impl Iterator<Item = &str> {
    table
        .split('\n')
        .filter_map(|line| line.rfind(' ').map(|i| &line[i + 1..]))
        .filter(|name| name.starts_with('@'))
}

/// Whether `path` names the file `id` (device, inode).
fn at_path(path: &Path, id: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id)
}

/// The owner of process `pid` (as this process's /proc shows it).
fn process_owner(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// The pool files removed while members announced in this network namespace run, each
/// once: the path each had, how it is shared and its owner (the open file's). This
/// user's pools and the claims' (`every_user`: every user's, what root's readers show);
/// a user's announcement counts only from a process of that user (anyone may bind any
/// abstract name). A file still linked (at its path or another) is not one: a reader
/// finds it where it is. Which of them a reader shows is its to say: the path and owner
/// are what the announcing process's descriptor gives, whoever that process is.
pub fn removed(every_user: bool) -> Vec<(std::path::PathBuf, Sharing, u32)> {
    announced_files(every_user)
        .into_iter()
        .filter(|(_, _, _, removed)| *removed)
        .map(|(path, sharing, owner, _)| (path, sharing, owner))
        .collect()
}

/// The pool files still at their path (whatever it is: a pool named by a path outside
/// the pool directory, a file renamed) of the members announced in this network
/// namespace, each once, as [`removed`] gives removed ones: its path, how it is shared,
/// its owner.
pub fn linked(every_user: bool) -> Vec<(std::path::PathBuf, Sharing, u32)> {
    announced_files(every_user)
        .into_iter()
        .filter(|(_, _, _, removed)| !*removed)
        .map(|(path, sharing, owner, _)| (path, sharing, owner))
        .collect()
}

/// Every pool file announced (see [`removed`]): path, sharing, owner, and whether it
/// was removed from its path. A file is opened only where it is a regular file the
/// announcing process may read itself: a user's pool file is its user's, a claim's
/// (any user's, mode 0666 or the group's by design) one its permissions let that
/// process read. Anyone may bind any name and hold an `O_PATH` descriptor of any file (a
/// device, `/etc/shadow`): root's readers must open no file for them they could not.
fn announced_files(every_user: bool) -> Vec<(std::path::PathBuf, Sharing, u32, bool)> {
    let Some(table) = socket_table() else {
        return Vec::new();
    };
    let own = own_uid().to_string();
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let mut found = Vec::new();
    for a in announced(&table) {
        let Some(who) = Credentials::of(a.pid) else {
            continue;
        };
        let sharing = match a.who {
            "claim" => Sharing::Claim,
            uid if (every_user || uid == own) && who.uid.to_string() == uid => Sharing::Private,
            _ => continue,
        };
        if seen.contains(&a.id) {
            continue;
        }
        let Ok(link) = std::fs::read_link(format!("/proc/{}/fd/{}", a.pid, a.fd)) else {
            continue;
        };
        let Some(link) = link.to_str() else {
            continue;
        };
        let (path, removed) = match link.strip_suffix(" (deleted)") {
            Some(path) => (path, true),
            None => (link, false),
        };
        let fits = |st: &crate::sys::stat| {
            (st.st_dev, st.st_ino) == a.id
                && match sharing {
                    Sharing::Private => st.st_uid == who.uid,
                    Sharing::Claim => who.may_read(st),
                }
        };
        let Some(fd) = reach_if(a.pid, a.fd, libc::O_RDONLY, fits) else {
            continue;
        };
        let owner = crate::kept::stat_of(fd).map(|st| st.st_uid);
        // SAFETY: the descriptor reach opened: the file was there.
        unsafe { libc::close(fd) };
        let Some(owner) = owner else {
            continue;
        };
        seen.push(a.id);
        found.push((std::path::PathBuf::from(path), sharing, owner, removed));
    }
    found
}

/// Whom a process's file accesses are checked as (`/proc/PID/status`: its file-system
/// uid and gid, and its supplementary groups). Not the owner of `/proc/PID`: that is
/// root for any process that made itself non-dumpable.
struct Credentials {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Credentials {
    fn of(pid: u32) -> Option<Credentials> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|rest| {
                    rest.split_whitespace()
                        .filter_map(|n| n.parse::<u32>().ok())
                })
        };
        // Real, effective, saved, file-system: the last is what the kernel checks.
        Some(Credentials {
            uid: field("Uid:")?.nth(3)?,
            gid: field("Gid:")?.nth(3)?,
            groups: field("Groups:")?.collect(),
        })
    }

    /// Whether the file `st` describes may be read as these credentials by its mode
    /// (root's may be read whatever it is).
    fn may_read(&self, st: &crate::sys::stat) -> bool {
        if self.uid == 0 {
            return true;
        }
        let bit = if st.st_uid == self.uid {
            0o400
        } else if st.st_gid == self.gid || self.groups.contains(&st.st_gid) {
            0o040
        } else {
            0o004
        };
        st.st_mode & bit != 0
    }
}

/// Member `pid`'s descriptor `n`, opened again for this process where it is still the
/// file announced (`id`), a regular file (whose owner and mode the caller checks).
fn reach(pid: u32, n: i32, id: (u64, u64), access: i32) -> Option<RawFd> {
    reach_if(pid, n, access, |st| (st.st_dev, st.st_ino) == id)
}

/// Member `pid`'s descriptor `n`, opened again for this process where it is a regular
/// file that `want` accepts, looked at before it is opened ([`crate::kept::open_regular`]).
fn reach_if(
    pid: u32,
    n: i32,
    access: i32,
    want: impl Fn(&crate::sys::stat) -> bool,
) -> Option<RawFd> {
    let link = std::ffi::CString::new(format!("/proc/{pid}/fd/{n}")).ok()?;
    crate::kept::open_link_if(&link, access, want).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_file_removed_under_a_member_is_found_through_its_announcement() {
        let dir = std::env::temp_dir().join(format!("gpucap-beacon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.pool");
        std::fs::write(&path, b"words").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let me = std::process::id();
        assert!(matches!(
            orphan_but(&path, Sharing::Private, libc::O_RDWR, 0),
            Orphan::None
        ));
        announce(&path, Sharing::Private, fd);
        // Its own announcement is no other member's.
        assert!(matches!(
            orphan_but(&path, Sharing::Private, libc::O_RDWR, me),
            Orphan::None
        ));
        // A claim's of the same path is another pool's announcement.
        assert!(matches!(
            orphan_but(&path, Sharing::Claim, libc::O_RDWR, 0),
            Orphan::None
        ));
        assert!(matches!(
            orphan_but(&dir.join("other.pool"), Sharing::Private, libc::O_RDWR, 0),
            Orphan::None
        ));
        // Announced while the file is at its path (made there by another joiner between
        // this one's open and its read of the announcements): not a removed file.
        assert!(matches!(
            orphan_but(&path, Sharing::Private, libc::O_RDWR, 0),
            Orphan::None
        ));
        std::fs::remove_file(&path).unwrap();
        match orphan_but(&path, Sharing::Private, libc::O_RDWR, 0) {
            Orphan::Found { fd: again, pid } => {
                assert_eq!(pid, me);
                assert_eq!(crate::kept::identity(again), crate::kept::identity(fd));
                // SAFETY: the descriptor orphan opened.
                unsafe { libc::close(again) };
            }
            other => panic!("not found: {other:?}"),
        }
        // Announced, but its descriptor now another file: unreachable, never joined.
        let other = dir.join("other");
        std::fs::write(&other, b"").unwrap();
        let o = std::fs::File::open(&other).unwrap();
        // SAFETY: two descriptors of this test.
        assert_eq!(
            unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&o), fd) },
            fd
        );
        assert!(
            matches!(orphan_but(&path, Sharing::Private, libc::O_RDWR, 0), Orphan::Unreachable(p) if p == [me])
        );
        // Gone with its socket (as at the member's exit). A child another test thread
        // forks holds a copy of the socket until it execs (close-on-exec): looked at
        // again for a while, not once.
        forget_in_child();
        let start = std::time::Instant::now();
        while !matches!(
            orphan_but(&path, Sharing::Private, libc::O_RDWR, 0),
            Orphan::None
        ) {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "still announced after its socket was closed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Another user's process named in an announcement under this user's key (anyone may
    /// bind any abstract name) is not counted: the user's pool is made, not refused
    /// forever as unreachable.
    #[test]
    fn another_users_announcement_is_not_a_member() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("CI").is_none_or(|v| v != "true"),
                "this test takes another user's identity: run it as root"
            );
            eprintln!("SKIP another_users_announcement_is_not_a_member: not root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("gpucap-beacon-u-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.pool");
        let mut p = [0; 2];
        // SAFETY: a pipe, a fork whose child makes system calls only, then waits.
        let child = unsafe {
            assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
            let child = libc::fork();
            if child == 0 {
                let ok = libc::setuid(65534) == 0;
                libc::write(p[1], if ok { b"y" } else { b"n" }.as_ptr().cast(), 1);
                libc::pause();
                libc::_exit(0);
            }
            libc::close(p[1]);
            child
        };
        let mut b = [0u8; 1];
        // SAFETY: our pipe's read end.
        assert_eq!(unsafe { libc::read(p[0], b.as_mut_ptr().cast(), 1) }, 1);
        assert_eq!(b[0], b'y', "the child could not become another user");
        // An announcement naming that process, as it could bind.
        let (who, hash) = key(&path, Sharing::Private);
        let name = format!("{PREFIX}{who}/{hash}/1/2/{child}/3");
        // SAFETY: plain data, zeroed is valid.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, b) in addr.sun_path[1..].iter_mut().zip(name.bytes()) {
            *d = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
        // SAFETY: a socket of this test and an address of `len` bytes.
        let s = unsafe {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            assert_eq!(
                libc::bind(s, &addr as *const _ as *const libc::sockaddr, len),
                0
            );
            s
        };
        let seen = orphan_but(&path, Sharing::Private, libc::O_RDWR, 0);
        // SAFETY: the child forked above, this test's descriptors.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
            libc::close(p[0]);
            libc::close(s);
        }
        assert!(matches!(seen, Orphan::None), "{seen:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
