//! A claim's socket bound again by its members where it was removed or replaced while
//! they run (a cleanup of the claim's directory, a co-tenant's `rm`): without it no
//! process could join the claim until every member had exited, as a new socket was
//! bound only with a new memfd.
//!
//! Each member's serving thread looks at the socket's path whenever no joiner came for
//! [`CHECK_EVERY`] (the listening socket's `SO_RCVTIMEO`). The file there is still the
//! socket last seen: nothing to do. Another socket: asked, and where it hands over this
//! claim's memfd (a member bound it again), its listening socket is served from then on.
//! Anything else (no socket, a file that is not one, a socket nobody listens on, one that
//! answers nothing in time or something not the claim's memfd: a co-tenant's): a new
//! listening socket is bound under a name of its own beside it, given the pool file's
//! mode, and renamed over the path. Two members doing so at once leave one, which the
//! other finds and serves at its next look. The memfd is the same: one budget, as before.
//! System calls only, no allocation: it runs on the serving thread.

use std::os::fd::RawFd;
use std::path::Path;

use super::handover::{Address, check_listening, close, connect, identity, lstat, receive, socket};
use crate::kept::{self, Kept};

/// How long a serving thread waits for a joiner before it looks at the socket's path.
pub(super) const CHECK_EVERY: libc::timeval = libc::timeval {
    tv_sec: 1,
    tv_usec: 0,
};

/// What a member knows to look after its claim's socket.
pub(super) struct Watch {
    /// The socket's address: its path, or its name under its directory's descriptor
    /// (`/proc/self/fd/N/`) where the whole path is too long for an address. Dropped
    /// (the descriptor closed) only while that descriptor is still the directory.
    at: std::mem::ManuallyDrop<Address>,
    /// That directory's descriptor, kept: where the program closed it or reused its
    /// number, the socket is no longer looked after (a path through it would name
    /// another directory).
    dir: Kept,
    /// The file at the path when it was last seen to be the claim's socket: its inode and
    /// change time.
    known: Option<(u64, i64, i64)>,
    /// The claim's memfd: its device and inode.
    words: (u64, u64),
    /// The mode a socket bound again is given: the pool file's (who may write it may
    /// connect).
    mode: u32,
}

/// Sets `SO_RCVTIMEO` on a listening socket: its `accept` returns `EAGAIN` after
/// [`CHECK_EVERY`] without a joiner, for the serving thread to look at the path. Every
/// holder of that socket shares the setting.
pub(super) fn look_between_joiners(listening: RawFd) {
    // SAFETY: a descriptor and a timeval for the option.
    unsafe {
        libc::syscall(
            libc::SYS_setsockopt,
            listening,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &CHECK_EVERY as *const libc::timeval,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
}

impl Watch {
    /// For a member holding `memfd` of the pool file `file`, whose socket is at `sock`.
    pub(super) fn new(sock: &Path, memfd: RawFd, file: RawFd) -> Option<Watch> {
        let at = Address::of(sock).ok()?;
        let dir = Kept::none();
        if at.dir() >= 0 {
            dir.keep(at.dir());
        }
        let mode = kept::stat_of(file)?.st_mode & 0o666;
        let known = lstat(at.path()).map(|st| identity(&st));
        Some(Watch {
            at: std::mem::ManuallyDrop::new(at),
            dir,
            known,
            words: kept::identity(memfd)?,
            mode,
        })
    }

    /// Looks at the socket's path (see the module's text): Some(the listening socket to
    /// serve from now on) where it changed, one this member bound or one a member bound.
    pub(super) fn look(&mut self) -> Option<RawFd> {
        if self.at.dir() >= 0 && self.dir.get().is_none() {
            return None;
        }
        let now = lstat(self.at.path());
        let seen = now.as_ref().map(identity);
        if seen.is_some() && seen == self.known {
            return None;
        }
        if now.is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK)
            && let Some(l) = self.probe()
        {
            self.known = seen;
            return Some(l);
        }
        self.bind_again()
    }

    /// Asks the socket at the path for the claim's words: Some(the listening socket it
    /// handed over with them), None where nobody listens, nothing came in time or what
    /// came is not this claim's memfd.
    fn probe(&self) -> Option<RawFd> {
        let s = connect(&self.at).ok()?;
        let got = receive(s);
        close(s);
        let [m, l, file] = got.ok()?;
        close(file); // not asked for
        let ours = kept::identity(m) == Some(self.words) && check_listening(l).is_ok();
        close(m);
        if !ours {
            close(l);
        }
        ours.then_some(l)
    }

    /// A new listening socket at the path: bound under a name of its own beside it
    /// ([`beside`]), given the pool file's mode and renamed over the path.
    fn bind_again(&mut self) -> Option<RawFd> {
        let tmp = beside(&self.at.addr)?;
        let tmp_path = tmp.sun_path.as_ptr();
        let l = socket();
        if l < 0 {
            return None;
        }
        // SAFETY: our socket and an address of its size, whose path is NUL-terminated.
        let ready = unsafe {
            libc::syscall(
                libc::SYS_bind,
                l,
                &tmp as *const libc::sockaddr_un,
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) == 0
                && libc::syscall(libc::SYS_listen, l, 4096) == 0
                && libc::syscall(libc::SYS_fchmodat, libc::AT_FDCWD, tmp_path, self.mode) == 0
        };
        let mine = lstat(tmp_path).map(|st| identity(&st));
        // SAFETY: NUL-terminated paths; the rename replaces what is at the path, at once.
        let renamed = ready
            && mine.is_some()
            && unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    libc::AT_FDCWD,
                    tmp_path,
                    libc::AT_FDCWD,
                    self.at.path(),
                    0,
                )
            } == 0;
        if !renamed {
            // SAFETY: a NUL-terminated path: the name this thread bound, if it did.
            unsafe { libc::unlink(tmp_path) };
            close(l);
            return None;
        }
        look_between_joiners(l);
        // The path's identity now (a rename changes the file's change time), where it is
        // still the socket bound here: else the next look asks whoever is there.
        let ino = mine.map(|m| m.0);
        self.known = lstat(self.at.path())
            .map(|st| identity(&st))
            .filter(|now| Some(now.0) == ino);
        Some(l)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // The program may have closed the directory's descriptor and taken its number
        // for a file of its own: that one is never closed here.
        if self.at.dir() < 0 || self.dir.get().is_some() {
            // SAFETY: dropped once, here; never used after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.at) };
        }
    }
}

/// The address of a name beside `at`'s socket, in its directory: `.gpucap-` and this
/// thread's id in hex (two members binding again at once never bind one name), no longer
/// than the socket's own name (`gpucap.pool.sock`), so it fits where that fits.
fn beside(at: &libc::sockaddr_un) -> Option<libc::sockaddr_un> {
    let mut out = *at;
    let len = out.sun_path.iter().position(|&c| c == 0)?;
    let name = out.sun_path[..len]
        .iter()
        .rposition(|&c| c == b'/' as libc::c_char)?
        + 1;
    // SAFETY: no arguments.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u64;
    let digits = crate::hex::hex16_bytes(tid);
    let new = b".gpucap-".iter().chain(&digits[8..]);
    let end = out.sun_path.len() - 1; // the last byte stays NUL
    let room = out.sun_path.get_mut(name..end)?;
    room.fill(0);
    let mut n = 0;
    for (d, &b) in room.iter_mut().zip(new.clone()) {
        *d = b as libc::c_char;
        n += 1;
    }
    (n == new.count()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;

    /// A directory with a pool file of mode 0660, a sealed memfd and a listening socket
    /// beside the file, as a claim's member holds them.
    struct Claim {
        dir: PathBuf,
        sock: PathBuf,
        file: RawFd,
        memfd: RawFd,
        /// The socket the member serves, held open while the test runs.
        _listening: UnixListener,
    }

    impl Claim {
        fn new(tag: &str) -> Claim {
            let dir =
                std::env::temp_dir().join(format!("gpucap-rebind-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("gpucap.pool");
            std::fs::write(&path, b"words").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o660)).unwrap();
            let f = crate::sys::cstr(&path).unwrap();
            // SAFETY: NUL-terminated names; our descriptors.
            let (file, memfd) = unsafe {
                (
                    crate::sys::open(f.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC, 0),
                    libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC),
                )
            };
            assert!(file >= 0 && memfd >= 0);
            let sock = dir.join("gpucap.pool.sock");
            let _listening = UnixListener::bind(&sock).unwrap();
            Claim {
                dir,
                sock,
                file,
                memfd,
                _listening,
            }
        }

        fn watch(&self) -> Watch {
            Watch::new(&self.sock, self.memfd, self.file).unwrap()
        }

        fn is_socket(&self) -> bool {
            std::fs::symlink_metadata(&self.sock).is_ok_and(|m| m.file_type().is_socket())
        }
    }

    impl Drop for Claim {
        fn drop(&mut self) {
            close(self.file);
            close(self.memfd);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn the_socket_still_there_is_left_as_it_is() {
        let c = Claim::new("same");
        let mut w = c.watch();
        assert!(w.look().is_none());
        assert!(w.look().is_none());
    }

    #[test]
    fn a_socket_removed_replaced_by_a_file_or_by_a_dead_socket_is_bound_again() {
        type Replace = fn(&Path);
        let cases: [(&str, Replace); 3] = [
            ("removed", |_| {}),
            ("file", |p| std::fs::write(p, b"").unwrap()),
            ("dead", |p| drop(UnixListener::bind(p).unwrap())),
        ];
        for (tag, replace) in cases {
            let c = Claim::new(tag);
            let mut w = c.watch();
            std::fs::remove_file(&c.sock).unwrap();
            replace(&c.sock);
            let l = w.look().unwrap_or_else(|| panic!("{tag}: not bound again"));
            assert!(c.is_socket(), "{tag}");
            assert_eq!(check_listening(l), Ok(()), "{tag}");
            let mode = std::fs::symlink_metadata(&c.sock)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o660, "{tag}: the pool file's mode");
            // A joiner reaches it, and the next look finds it the same.
            let joiner = std::os::unix::net::UnixStream::connect(&c.sock);
            assert!(joiner.is_ok(), "{tag}: {joiner:?}");
            // At once: its own socket is not asked (its thread, asking, could not answer).
            let t = std::time::Instant::now();
            assert!(w.look().is_none(), "{tag}: looked again");
            assert!(
                t.elapsed() < std::time::Duration::from_secs(1),
                "{tag}: asked itself"
            );
            // Nothing left beside it but the pool file and the socket.
            let names = std::fs::read_dir(&c.dir).unwrap().count();
            assert_eq!(names, 2, "{tag}");
            close(l);
        }
    }

    #[test]
    fn a_socket_a_member_bound_again_is_served_not_replaced() {
        let c = Claim::new("member");
        let mut w = c.watch();
        // Another member bound a socket there again: it answers with the claim's memfd.
        std::fs::remove_file(&c.sock).unwrap();
        let other = UnixListener::bind(&c.sock).unwrap();
        let before = std::fs::symlink_metadata(&c.sock).unwrap();
        let memfd = c.memfd;
        let server = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let (conn, _) = other.accept().unwrap();
            super::super::handover::send(conn.as_raw_fd(), memfd, other.as_raw_fd(), None);
            other
        });
        let l = w.look().expect("the member's socket served");
        let other = server.join().unwrap();
        let after = std::fs::symlink_metadata(&c.sock).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(before.ino(), after.ino(), "not replaced");
        assert_eq!(check_listening(l), Ok(()));
        assert!(w.look().is_none());
        close(l);
        drop(other);
    }

    #[test]
    fn a_directory_descriptor_the_program_reused_is_never_closed() {
        // A socket path too long for an address: reached through its directory's
        // descriptor, which the Watch keeps.
        let c = Claim::new("long");
        let deep = c.dir.join("d".repeat(120));
        std::fs::create_dir_all(&deep).unwrap();
        let sock = deep.join("gpucap.pool.sock");
        let _l = UnixListener::bind(&sock);
        let w = Watch::new(&sock, c.memfd, c.file).unwrap();
        let dir = w.at.dir();
        assert!(dir >= 0);
        // The program closes it and opens a file of its own under the number.
        let null = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: descriptors of this test.
        assert_eq!(
            unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), dir) },
            dir
        );
        drop(w);
        // SAFETY: a descriptor number; F_GETFD only reads its flags.
        assert!(
            unsafe { libc::fcntl(dir, libc::F_GETFD) } >= 0,
            "the program's file closed"
        );
        close(dir);
    }

    #[test]
    fn a_socket_that_answers_with_other_words_is_replaced() {
        let c = Claim::new("other");
        let mut w = c.watch();
        std::fs::remove_file(&c.sock).unwrap();
        let other = UnixListener::bind(&c.sock).unwrap();
        let before = std::fs::symlink_metadata(&c.sock).unwrap();
        let server = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: a constant name; our descriptor.
            let foreign = unsafe { libc::memfd_create(c"f".as_ptr(), libc::MFD_CLOEXEC) };
            let (conn, _) = other.accept().unwrap();
            super::super::handover::send(conn.as_raw_fd(), foreign, other.as_raw_fd(), None);
            close(foreign);
            other
        });
        let l = w.look().expect("a socket of the claim's in its place");
        drop(server.join().unwrap());
        use std::os::unix::fs::MetadataExt;
        let after = std::fs::symlink_metadata(&c.sock).unwrap();
        assert_ne!(before.ino(), after.ino(), "replaced");
        assert_eq!(check_listening(l), Ok(()));
        assert!(w.look().is_none());
        close(l);
    }
}
