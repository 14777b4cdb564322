//! Removing a pool file no process uses (`gpucap pool clean`), safely against a member
//! joining at the same moment.
//!
//! The race: a joiner opens the file by its path, then takes a member slot (its lock
//! byte, [`crate::SlotLocks`]). A cleaner that saw no slot taken and unlinked the file
//! between those two steps would leave the joiner in a file no later process finds:
//! two budgets for one pool. Two rules close it:
//!
//! - The cleaner takes every slot's lock at once, in one `F_OFD_SETLK` over the whole
//!   range: it succeeds only if no member holds a slot (a live member's lock is held
//!   until its process dies), and while the cleaner holds it no joiner can take a slot.
//!   Under that lock it renames the file away (so the path is free for the next pool at
//!   once), checks that what it moved is the file it locked, and unlinks it.
//! - A joiner, once it holds its slot (or found none free), checks that the path still
//!   names the file it opened ([`PoolFile::is_linked`]); if not, it lets the slot go and
//!   opens the path again ([`join_linked`]). A joiner that opened the file before the
//!   rename thus either took its slot before the cleaner's lock (the cleaner fails: in
//!   use) or after the unlink (it sees the path moved, and retries on a new file).
//!
//! Moving someone else's file (another cleaner removed ours and a joiner made a new one
//! in between) is undone: it is linked back under the path, never over another file.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use crate::locks::{LOCK_BASE, LOCKS_LEN, flock_range};
use crate::mapping::PoolFile;
use crate::sys::{cstr, os_err};

/// What [`remove_unused`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The file is gone.
    Removed,
    /// A member holds a slot: the file is in use and was left alone.
    InUse,
    /// The path named another file by the time it was locked (it was replaced, or
    /// removed and made again): left alone.
    Changed,
}

/// (device, inode) of `fd`, or of `path` without following a link.
fn identity(fd: Option<i32>, path: &Path) -> Option<(u64, u64)> {
    // SAFETY: stat is plain data filled by fstat/lstat.
    let mut st: crate::sys::stat = unsafe { std::mem::zeroed() };
    let rc = match fd {
        // SAFETY: a descriptor of ours and a stat to fill.
        Some(fd) => unsafe { crate::sys::fstat(fd, &mut st) },
        None => {
            let c = cstr(path).ok()?;
            // SAFETY: a NUL-terminated path and a stat to fill.
            unsafe { crate::sys::lstat(c.as_ptr(), &mut st) }
        }
    };
    (rc == 0).then_some((st.st_dev, st.st_ino))
}

/// Removes the pool file at `path` if no member holds a slot in it (see the module's
/// doc for the race with a joiner). Errors: the file cannot be opened for writing (it
/// is not this user's), or the rename or unlink failed.
pub fn remove_unused(path: &Path) -> Result<Removal, String> {
    let c = cstr(path)?;
    // SAFETY: a NUL-terminated path; never follows a link nor waits on a FIFO.
    let fd = unsafe {
        crate::sys::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(os_err("cannot open the pool file", path));
    }
    let result = remove_locked(fd, path, &c);
    // SAFETY: our descriptor; closing it drops the slot locks taken through it.
    unsafe { libc::close(fd) };
    result
}

fn remove_locked(fd: i32, path: &Path, c: &CString) -> Result<Removal, String> {
    // Every slot's lock, every forked child's of a dead member (whose device files still
    // hold its memory: the file keeps its bytes counted until they are gone), and a
    // claim's two bytes below them (a process holds its live words before it takes a
    // slot; a joiner decides to make them): one call from the first of those bytes.
    let (from, len) = cleaners_range();
    let mut all = flock_range(libc::F_WRLCK, from, len);
    // SAFETY: our descriptor and a valid flock for the call.
    if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut all as *mut libc::flock) } != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(Removal::InUse),
            _ => Err(format!("cannot lock the pool file {}: {e}", path.display())),
        };
    }
    // No process holds a claim's live words: their socket (if any) is a dead set's.
    let sock = cstr(&crate::live::socket_path(path))?;
    // SAFETY: a NUL-terminated path; a socket nobody listens on any more.
    unsafe { libc::unlink(sock.as_ptr()) };
    let ours = identity(Some(fd), path).ok_or_else(|| os_err("cannot stat", path))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let moved: PathBuf = dir.join(format!(".{name}.{}.removing", std::process::id()));
    let m = cstr(&moved)?;
    // SAFETY: two NUL-terminated paths.
    if unsafe { libc::rename(c.as_ptr(), m.as_ptr()) } != 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
            return Ok(Removal::Changed);
        }
        return Err(os_err("cannot move away the pool file", path));
    }
    if identity(None, &moved) != Some(ours) {
        // Another file than the one locked: put it back, never over a newer one.
        // SAFETY: two NUL-terminated paths, then one.
        unsafe {
            libc::link(m.as_ptr(), c.as_ptr());
            libc::unlink(m.as_ptr());
        }
        return Ok(Removal::Changed);
    }
    // SAFETY: a NUL-terminated path.
    if unsafe { libc::unlink(m.as_ptr()) } != 0 {
        return Err(os_err("cannot remove the pool file", &moved));
    }
    Ok(Removal::Removed)
}

/// The whole range a cleaner locks (see [`remove_locked`]): from the first byte, its length.
fn cleaners_range() -> (i64, i64) {
    let from = crate::live::HOLD_BYTE;
    (from, LOCK_BASE - from + LOCKS_LEN)
}

impl PoolFile {
    /// Whether a `gpucap pool clean` holds every slot's lock of this file now (it is
    /// removing it: no slot can be taken until it lets go): the lock in the way of slot
    /// 0's is the cleaner's range, no member's byte.
    pub fn cleaner_at_work(&self) -> bool {
        let fd = self.locks.fd();
        let mut f = flock_range(libc::F_RDLCK, LOCK_BASE, 1);
        fd >= 0
            && crate::locks::lock_call(fd, libc::F_OFD_GETLK, &mut f).is_ok()
            && i32::from(f.l_type) != libc::F_UNLCK
            && (f.l_start, f.l_len) == cleaners_range()
    }

    /// Whether `self.path` still names this open file (a cleaner may have removed it
    /// between this process's open and its taking a slot: see the module's doc).
    pub fn is_linked(&self) -> bool {
        let fd = self.locks.fd();
        fd >= 0
            && identity(Some(fd), &self.path)
                .is_some_and(|id| identity(None, &self.path) == Some(id))
    }

    /// This process's descriptor of the file closed (a joiner leaving a file it will not
    /// use). A claim's words it took stay held and served (`live`'s mapping and presence
    /// keep them): its serving threads keep a copy of the file of their own, to hand it
    /// to a joiner that asks for it.
    fn let_go(&self) {
        if self.claim {
            crate::live::keep_file_served(self.locks.fd());
        }
        self.locks.forget_in_child();
    }
}

/// How long a joiner refused by a cleaner at work waits for it to let go (a removal takes
/// a few system calls; one stopped half-way is tried again all the same).
const CLEANER_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens the pool file at `path` as a member (a new file made for `members`) and runs
/// `join` on it (taking a slot), then checks that the path still names the file; if a
/// cleaner removed it meanwhile, `leave` gives the slot back, the file is closed (a
/// claim's words taken stay held and served: `PoolFile::let_go`) and the path opened
/// again (three tries). `join`'s error is returned as is when the file was not removed.
pub fn join_linked<T>(
    path: &Path,
    sharing: crate::Sharing,
    members: usize,
    join: impl Fn(&'static PoolFile) -> Result<T, String>,
    leave: impl Fn(T),
) -> Result<(&'static PoolFile, T), String> {
    let mut cleaner = false;
    for _ in 0..3 {
        let file: &'static PoolFile =
            Box::leak(Box::new(crate::open_member(path, sharing, members)?));
        let joined = join(file);
        // A cleaner holding every slot while it removes the file refused the join: once
        // it let go, the path names a new file (or, where it kept this one, this one
        // again). Before, the joiner failed there with "the pool has 256 live members
        // already" while the pool had none.
        if joined.is_err() && file.joined_through.is_none() && file.cleaner_at_work() {
            let start = std::time::Instant::now();
            while file.cleaner_at_work() && start.elapsed() < CLEANER_WAIT {
                crate::sys::nap(std::time::Duration::from_millis(1));
            }
            file.let_go();
            cleaner = true;
            continue;
        }
        // A file joined through a member's descriptor had been removed already: its
        // members are the pool.
        if file.joined_through.is_some() || file.is_linked() {
            if joined.is_ok() {
                crate::beacon::announce(path, sharing, file.locks.fd());
            }
            return joined.map(|t| (file, t));
        }
        if let Ok(t) = joined {
            leave(t);
        }
        // The slot (if any) was given back: closing drops the descriptor's locks. The
        // mapping stays (never unmapped: 1 per removed file, in a rare race).
        file.let_go();
    }
    if cleaner {
        return Err(format!(
            "a `gpucap pool clean` held every slot of the pool file {} while it tried to \
             remove it, for {} s (stopped half-way?): try again once it ends",
            path.display(),
            3 * CLEANER_WAIT.as_secs()
        ));
    }
    Err(format!(
        "the pool file {} was removed three times while joining (gpucap pool clean?)",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpucap_core::budget::{Member, MemberInfo};

    fn dir(tag: &str) -> PathBuf {
        crate::test_dir("removal", tag)
    }

    /// Removes a claim's test directory whose members still serve: their threads bind
    /// the claim's socket there again as they find it gone (about once a second), so a
    /// removal can meet an entry made under it (`Directory not empty`, 1 of 60 runs beside
    /// 2,000 processes starting): tried again.
    fn remove_claim_dir(d: &Path) {
        let mut tries = 0;
        while let Err(e) = std::fs::remove_dir_all(d) {
            tries += 1;
            assert!(tries < 20, "cannot remove {}: {e}", d.display());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn info() -> MemberInfo {
        MemberInfo {
            pid: std::process::id(),
            uid: 0,
            pid_namespace: 0,
            start_ms: 1,
            command: String::from("test"),
        }
    }

    /// A pool file of the default size at `path`, opened (made) as a member would.
    fn private(path: &Path) -> PoolFile {
        crate::open_member(
            path,
            crate::Sharing::Private,
            gpucap_core::budget::DEFAULT_SLOTS,
        )
        .unwrap()
    }

    #[test]
    fn a_pool_with_a_member_is_in_use_and_stays() {
        let d = dir("inuse");
        let path = d.join("p.pool");
        let file = private(&path);
        let member = Member::join(file.mapped().unwrap(), &file.locks, &info()).unwrap();
        assert_eq!(remove_unused(&path), Ok(Removal::InUse));
        assert!(path.exists());
        member.leave();
        assert_eq!(remove_unused(&path), Ok(Removal::Removed));
        assert!(!path.exists());
        // Nothing of the cleaner's is left in the directory.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A claim's process holds its live words (the hold byte, read-locked for life) before
    /// it takes a slot: the file is in use while it does.
    #[test]
    fn a_pool_whose_live_words_a_process_holds_stays() {
        let d = dir("held");
        let path = d.join("p.pool");
        let file = private(&path);
        let mut hold = flock_range(libc::F_RDLCK, crate::live::HOLD_BYTE, 1);
        // SAFETY: the file's descriptor and a valid flock for the call.
        let held = unsafe {
            libc::fcntl(
                file.locks.fd(),
                libc::F_OFD_SETLK,
                &mut hold as *mut libc::flock,
            )
        };
        assert_eq!(held, 0);
        assert_eq!(remove_unused(&path), Ok(Removal::InUse));
        let mut free = flock_range(libc::F_UNLCK, crate::live::HOLD_BYTE, 1);
        // SAFETY: as above.
        unsafe {
            libc::fcntl(
                file.locks.fd(),
                libc::F_OFD_SETLK,
                &mut free as *mut libc::flock,
            )
        };
        assert_eq!(remove_unused(&path), Ok(Removal::Removed));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A dead member's forked child still holds its memory (`SlotLocks::hold_in_child`,
    /// here taken through a second open file in its place): the file keeps those bytes
    /// counted, so it is in use until the child is gone.
    #[test]
    fn a_pool_whose_dead_members_child_holds_its_memory_stays() {
        let d = dir("children");
        let path = d.join("p.pool");
        let file = private(&path);
        let member = Member::join(file.mapped().unwrap(), &file.locks, &info()).unwrap();
        let child = private(&path);
        child.locks.hold_in_child(member.slot());
        child.locks.forget_in_child();
        member.leave();
        assert_eq!(remove_unused(&path), Ok(Removal::InUse));
        // The child's copy of the file is the one `hold_in_child` opened (lowest free
        // descriptor after the member's): closing every descriptor of the file is the
        // child's exit.
        drop(file);
        for fd in 3..1024 {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}"));
            if link.is_ok_and(|l| l == path) {
                // SAFETY: a descriptor of this test's pool file, closed once.
                unsafe { libc::close(fd) };
            }
        }
        assert_eq!(remove_unused(&path), Ok(Removal::Removed));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_joiner_that_opened_the_file_before_it_was_removed_joins_a_new_one() {
        // The cleaner runs between the joiner's open and its taking a slot: the
        // joiner's first file is gone from the path, so it leaves it and joins the file
        // the path names now, the one every later process joins.
        let d = dir("race");
        let path = d.join("p.pool");
        drop(
            crate::open_member(
                &path,
                crate::Sharing::Private,
                gpucap_core::budget::DEFAULT_SLOTS,
            )
            .unwrap(),
        );
        let tries = std::cell::Cell::new(0);
        let (file, member) = join_linked(
            &path,
            crate::Sharing::Private,
            gpucap_core::budget::DEFAULT_SLOTS,
            |f| {
                tries.set(tries.get() + 1);
                if tries.get() == 1 {
                    assert_eq!(remove_unused(&path), Ok(Removal::Removed));
                }
                Member::join(f.mapped()?, &f.locks, &info()).map_err(|e| e.to_string())
            },
            |m| m.leave(),
        )
        .unwrap();
        assert_eq!(tries.get(), 2, "the first join was undone and tried again");
        assert!(file.is_linked());
        // The pool the path names has this member: a cleaner now finds it in use.
        assert_eq!(remove_unused(&path), Ok(Removal::InUse));
        member.leave();
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Held by each test of a claim's pool in this process: they share its serving
    /// entries (eight) and the hook before a question (`live::BEFORE_QUESTION`).
    static CLAIMS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A claim's joiner that took the words of the file at the path (and serves them from
    /// then on) and finds the file removed before it took its slot leaves that file and
    /// opens the path again: its own serving thread still answers on the claim's socket,
    /// and must hand over the file to whoever asks for it (a joiner of another network
    /// namespace). Before, it answered without it (its descriptor closed by the leaving),
    /// and such a joiner, this process's second try here among them, was refused with
    /// "handed over no file (an older gpucap)".
    #[test]
    fn a_claims_joiner_that_left_a_removed_file_still_hands_it_over() {
        let _one = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
        let d = dir("claim");
        let path = d.join("gpucap.pool");
        let tries = std::cell::Cell::new(0);
        let (file, member) = join_linked(
            &path,
            crate::Sharing::Claim,
            gpucap_core::budget::DEFAULT_SLOTS,
            |f| {
                tries.set(tries.get() + 1);
                if tries.get() == 1 {
                    // A co-tenant's `rm` of the file alone (its socket stays).
                    std::fs::remove_file(&path).unwrap();
                }
                Member::join(f.mapped()?, &f.locks, &info()).map_err(|e| e.to_string())
            },
            |m| m.leave(),
        )
        .unwrap();
        assert_eq!(tries.get(), 2, "the first join was undone and tried again");
        assert!(
            file.joined_through.is_some(),
            "joined the removed file through its socket"
        );
        // Asked again, every serving thread of this process (two now) hands it over.
        for _ in 0..8 {
            let fd = crate::live::removed_file(&path, libc::O_RDONLY).unwrap();
            assert_eq!(
                crate::kept::identity(fd),
                crate::kept::identity(file.locks.fd())
            );
            // SAFETY: the descriptor just handed over, closed once.
            unsafe { libc::close(fd) };
        }
        member.leave();
        // What a forked child does (`forget_in_child`, here in this process and for this
        // claim's entries only: a fork of a test process would hold every other test's
        // files meanwhile, and every entry let go would stop other tests' serving
        // threads) lets go of every descriptor of the file, the serving entry's own copy
        // among them: one left open in a child would keep the claim's locks after this
        // process.
        let id = crate::kept::identity(file.locks.fd());
        crate::live::let_go_in_child_of(file.locks.fd());
        file.locks.forget_in_child();
        let kept = (3..4096)
            .filter(|&fd| crate::kept::identity(fd) == id)
            .count();
        assert_eq!(kept, 0, "descriptors of the file kept");
        remove_claim_dir(&d);
    }

    /// The claim's socket removed again between a joiner's look (members answer) and its
    /// question for the removed file: the joiner looks again (the members bind it again
    /// within about a second) and joins them, and a reader reads them. Before, each was
    /// refused at once ("asking its socket failed: No such file or directory").
    #[test]
    fn a_claims_joiner_whose_question_finds_the_socket_gone_looks_again() {
        let _one = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
        let d = dir("gone");
        let path = d.join("gpucap.pool");
        // A member: the claim's words held and served.
        let member = crate::open_member(
            &path,
            crate::Sharing::Claim,
            gpucap_core::budget::DEFAULT_SLOTS,
        )
        .unwrap();
        std::fs::remove_file(&path).unwrap();
        static REMOVED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        fn remove_socket(p: &Path) {
            // This test's claim only (another test may ask meanwhile), once.
            if p.parent().and_then(|d| d.file_name()) == Some(std::ffi::OsStr::new(&*tag()))
                && REMOVED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0
            {
                std::fs::remove_file(crate::live::socket_path(p)).unwrap();
            }
        }
        fn tag() -> String {
            format!("gpucap-removal-gone-{}", std::process::id())
        }
        *crate::live::BEFORE_QUESTION.lock().unwrap() = Some(remove_socket);
        let joined = crate::open_member(
            &path,
            crate::Sharing::Claim,
            gpucap_core::budget::DEFAULT_SLOTS,
        );
        *crate::live::BEFORE_QUESTION.lock().unwrap() = None;
        let joined = joined.unwrap();
        assert!(
            REMOVED.load(std::sync::atomic::Ordering::Relaxed) >= 2,
            "asked twice: once with the socket gone"
        );
        assert_eq!(
            crate::kept::identity(joined.locks.fd()),
            crate::kept::identity(member.locks.fd()),
            "the members' file"
        );
        // A reader (`gpucap status`) the same.
        REMOVED.store(0, std::sync::atomic::Ordering::Relaxed);
        *crate::live::BEFORE_QUESTION.lock().unwrap() = Some(remove_socket);
        let read = crate::open_reader(&path, crate::Sharing::Claim);
        *crate::live::BEFORE_QUESTION.lock().unwrap() = None;
        let read = read.unwrap();
        assert!(REMOVED.load(std::sync::atomic::Ordering::Relaxed) >= 2);
        assert_eq!(
            crate::kept::identity(read.locks.fd()),
            crate::kept::identity(member.locks.fd()),
        );
        remove_claim_dir(&d);
    }

    #[test]
    fn while_the_cleaner_holds_the_slots_no_member_can_take_one() {
        let d = dir("locked");
        let path = d.join("p.pool");
        let file = private(&path);
        let c = cstr(&path).unwrap();
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { crate::sys::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        assert!(fd >= 0);
        let mut all = flock_range(libc::F_WRLCK, LOCK_BASE, LOCKS_LEN);
        // SAFETY: our descriptor and a valid flock.
        assert_eq!(
            unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut all as *mut libc::flock) },
            0
        );
        assert!(Member::join(file.mapped().unwrap(), &file.locks, &info()).is_err());
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        let m = Member::join(file.mapped().unwrap(), &file.locks, &info()).unwrap();
        m.leave();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
