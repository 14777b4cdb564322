//! What `gpucap status`, `top` and `metrics` open (docs/src/threat-model.md): nothing but
//! regular files. A FIFO stands in for a device (opening `/dev/watchdog` arms it): an
//! inotify watch on it sees every open of it (`IN_OPEN`), and none of a descriptor opened
//! with `O_PATH`, which looks at a file without opening it (Linux 5.x and later).

use super::common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::readers::path_hash;
use common::pool_scratch::*;
use common::*;

/// A file watched for opens.
struct Watched {
    inotify: OwnedFd,
}

impl Watched {
    fn on(path: &Path) -> Watched {
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: no pointers.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor of ours, owned from here.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: our inotify descriptor and a NUL-terminated path.
        let w = unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_OPEN) };
        assert!(w >= 0, "inotify watch: {}", std::io::Error::last_os_error());
        Watched { inotify }
    }

    /// Whether the file was opened since it was watched: inotify merges an event into
    /// the same one before it, so one open or several count 1.
    fn opens(&self) -> usize {
        let mut buf = [0u8; 4096];
        let mut opens = 0;
        loop {
            // SAFETY: our descriptor and a buffer of its length.
            let n =
                unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return opens;
            }
            // Each event: wd, mask, cookie, len (4 bytes each), then `len` bytes of name.
            let mut at = 0;
            while at + 16 <= n as usize {
                let word =
                    |i: usize| u32::from_ne_bytes(buf[at + i..at + i + 4].try_into().unwrap());
                if word(4) & libc::IN_OPEN != 0 {
                    opens += 1;
                }
                at += 16 + word(12) as usize;
            }
        }
    }
}

/// An announcement (anyone may bind any abstract name) of a member of `who`'s pool
/// (a uid, or `claim`) whose file is `path`, held as descriptor `fd` of process `pid`.
fn announce(who: &str, path: &Path, pid: u32, fd: i32) -> std::os::unix::net::UnixDatagram {
    use std::os::linux::net::SocketAddrExt;
    let meta = std::fs::symlink_metadata(path).unwrap();
    let name = format!(
        "gpucap-pool/{who}/{:016x}/{:x}/{:x}/{pid}/{fd}",
        path_hash(path),
        meta.dev(),
        meta.ino(),
    );
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes());
    std::os::unix::net::UnixDatagram::bind_addr(&addr.unwrap()).unwrap()
}

/// A user (this test's uid) holds an `O_PATH` descriptor of a FIFO (which any user may
/// hold of any device, with no permission to it) and announces it as a member of its
/// own pool and of a claim's (anyone may bind any abstract name): neither `status` in
/// the scratch's view nor in the machine's opens it, or shows it (before: each opened it
/// through `/proc/PID/fd/N`, and looked at what it was only then).
#[test]
fn an_announced_fifo_is_never_opened_by_status() {
    let s = Scratch::new("readers-announced-fifo");
    let fifo = s.dir.join("device");
    let c = CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let watched = Watched::on(&fifo);
    // SAFETY: a NUL-terminated path; O_PATH opens nothing.
    let held = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    assert!(held >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: the descriptor just opened, owned from here.
    let held = unsafe { OwnedFd::from_raw_fd(held) };
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let beacons = [uid.to_string(), "claim".to_string()]
        .map(|who| announce(&who, &fifo, std::process::id(), held.as_raw_fd()));
    let scratch_view = run(&mut s.gpucap(&["status", "--json", "--all"]));
    let mut machine = s.gpucap(&["status", "--json", "--all"]);
    machine.env_remove("GPUCAP_POOL_DIR");
    let machine_view = run(&mut machine);
    drop(beacons);
    for o in [&scratch_view, &machine_view] {
        assert_ok(o);
        assert!(!stdout(o).contains(fifo.to_str().unwrap()), "{}", dump(o));
    }
    assert_eq!(watched.opens(), 0, "status opened the FIFO announced");
}

/// A FIFO at a pool's path, named (`--pool`): `status` and `check` refuse it without
/// opening it (before: opened without waiting, then refused).
#[test]
fn a_fifo_at_a_pools_path_is_never_opened() {
    let s = Scratch::new("readers-fifo-path");
    let watched = Watched::on(&s.fifo_pool("fifo"));
    for args in [
        &["status", "--pool", "fifo"][..],
        &["check", "--pool", "fifo"],
    ] {
        let o = run(&mut s.gpucap(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains("it is not a regular file"),
            "{args:?}\n{}",
            dump(&o)
        );
    }
    assert_eq!(
        watched.opens(),
        0,
        "a reader opened the FIFO at the pool's path"
    );
}

/// uid 65534 holds an `O_PATH` descriptor of a file of root's it may not read (mode 600)
/// and announces it as a member of its own pool and of a claim's: root's `status` opens
/// it for neither (before: opened and read as root, a confused deputy; a user's pool
/// file is its user's, a claim's one its member may read).
#[test]
fn a_file_the_announcing_user_may_not_read_is_never_opened_by_root() {
    use std::os::unix::fs::PermissionsExt;
    if !as_root("another user's announcement") {
        return;
    }
    let s = Scratch::new("readers-announced-unreadable");
    let secret = s.dir.join("secret");
    std::fs::write(&secret, b"root's only").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let watched = Watched::on(&secret);
    let c = CString::new(secret.to_str().unwrap()).unwrap();
    let mut p = [0; 2];
    // SAFETY: a pipe, a fork whose child makes system calls only, then waits.
    let child = unsafe {
        assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
        let child = libc::fork();
        if child == 0 {
            // Opened before it becomes uid 65534 (the scratch's directories may be
            // closed to it): what it holds is what counts.
            let fd = libc::open(c.as_ptr(), libc::O_PATH);
            let fd = if libc::setuid(65534) == 0 { fd } else { -1 };
            libc::write(p[1], (&fd as *const i32).cast(), 4);
            libc::pause();
            libc::_exit(0);
        }
        libc::close(p[1]);
        child
    };
    let mut fd = -1i32;
    // SAFETY: our pipe's read end and a 4-byte buffer.
    let n = unsafe { libc::read(p[0], (&mut fd as *mut i32).cast(), 4) };
    let beacons = (n == 4 && fd >= 0)
        .then(|| ["65534", "claim"].map(|who| announce(who, &secret, child as u32, fd)));
    let o = run(&mut s.gpucap(&["status", "--json", "--all"]));
    drop(beacons);
    // SAFETY: the child forked above, this test's descriptor.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
        libc::close(p[0]);
    }
    assert!(
        n == 4 && fd >= 0,
        "the child could not hold the file as uid 65534"
    );
    assert_ok(&o);
    assert_eq!(
        watched.opens(),
        0,
        "root opened a file for a user who may not read it"
    );
}

/// A FIFO named as a lone process's file (`PID-NS.lone`) in this user's directory:
/// `status` names it as no regular file without opening it (before: opened without
/// waiting, then refused).
#[test]
fn a_fifo_named_as_a_lone_processs_file_is_never_opened() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("readers-fifo-lone");
    let dir = s.pool_file("x").parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let lone = dir.join("4242-4026531836.lone");
    let c = CString::new(lone.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let watched = Watched::on(&lone);
    let o = run(&mut s.gpucap(&["status", "--json", "--all"]));
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let errors = doc["errors"].to_string();
    assert!(errors.contains("4242-4026531836.lone"), "{doc}");
    assert!(errors.contains("not a regular file"), "{doc}");
    assert_eq!(watched.opens(), 0, "status opened the FIFO named .lone");
}
