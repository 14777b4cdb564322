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
//! - `at_rest`: the claim's file as the words at rest: its members' slot marks, and the
//!   memfd's stamp of the file it was made from.
//! - `handover`: the socket and what crosses it (asking, answering, checking what came).
//! - `serving`: each member's thread that answers, and a forked child's letting go.
//! - `rebinding`: the socket bound again by the members where it was removed or replaced
//!   while they run (the same memfd served: one budget, as before).
//!
//! System calls go through `syscall` (already imported): no new symbol for the dynamic
//! loader to look up in every process the shim is loaded into.

mod at_rest;
mod handover;
mod patience;
mod presence;
mod rebinding;
mod serving;

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::locks::{LOCK_BASE, flock_range, lock_call};
use crate::sys::cstr;
use at_rest::{clear_gone_marks, made_from, stamp_file, taken_in_file};
pub(crate) use handover::NotHandedOver;
use handover::{Address, Answer, SEALS, ask, close, socket};
pub(crate) use patience::Waiter;
pub use patience::new_reading_round;
use rebinding::Watch;
pub(crate) use serving::keep_file_served;
use serving::{own_copy, pause, served};

pub use serving::forget_in_child;
#[cfg(test)]
pub(crate) use serving::let_go_in_child_of;

/// Read-locked for life by every process holding the claim's memfd.
pub(crate) const HOLD_BYTE: i64 = LOCK_BASE - 2;
/// Write-locked by the one joiner deciding whether to make the memfd.
pub(crate) const MAKE_BYTE: i64 = LOCK_BASE - 1;
/// How long a joiner asks while members hold the memfd and none hands it over.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);
/// The socket beside a claim's pool file at `path`.
pub(crate) fn socket_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".sock");
    path.with_file_name(name)
}

/// The claim's memfd for a member of the pool file `file` at `path` (`bytes` long),
/// asked of the members or made from the file's words where no process holds one; from
/// now on this process holds it (`HOLD_BYTE`) and serves it to the next.
pub(crate) fn hold(path: &Path, file: RawFd, bytes: usize) -> Result<RawFd, String> {
    let sock = socket_path(path);
    let at = Address::of(&sock)?;
    let give_up = Instant::now() + PATIENCE;
    let mut why = None;
    let mut first = true;
    let mut waited = 0;
    loop {
        if Instant::now() >= give_up {
            let secs = PATIENCE.as_secs();
            return Err(match why {
                None => format!(
                    "its members hold its words, and none handed it over within {secs} s \
                     (are they stopped?)"
                ),
                Some(w) => format!("its members hold its words, and for {secs} s {w}"),
            });
        }
        // Never waits on a lock (a process stopped holding one would hold every joiner):
        // a lock held by another is tried again shortly, until the patience runs out.
        // After a question nobody answered, a decision under way: wait for it. (Each lock
        // call walks the file's locks, two a member: the first question makes none but
        // the hold's.)
        if !std::mem::take(&mut first) {
            if !try_lock(file, libc::F_RDLCK, MAKE_BYTE)? {
                pause(&mut waited);
                continue;
            }
            try_lock(file, libc::F_UNLCK, MAKE_BYTE)?;
        }
        match held(&sock, &at, file, bytes)? {
            Asked::Held(m, l) => {
                return served(m, l, file, presence::hold(path), Watch::new(&sock, m, file));
            }
            Asked::Again => {
                pause(&mut waited);
                continue;
            }
            // Asked again until the patience runs out, never decided on: the members
            // bind their socket again over a co-tenant's within about a second.
            Asked::Foreign(w) => {
                why = Some(w);
                pause(&mut waited);
                continue;
            }
            Asked::Nobody(w) => why = w.or(why),
        }
        // Nobody answered: one joiner at a time asks again and decides.
        if try_lock(file, libc::F_WRLCK, MAKE_BYTE)? {
            let decided = decide(&sock, &at, file, bytes);
            try_lock(file, libc::F_UNLCK, MAKE_BYTE)?;
            if let Some((m, l)) = decided? {
                return served(m, l, file, presence::hold(path), Watch::new(&sock, m, file));
            }
        }
        pause(&mut waited);
    }
}

/// What [`held`] got.
enum Asked {
    /// The claim's memfd and listening socket, HOLD_BYTE read-locked.
    Held(RawFd, RawFd),
    /// Nobody answered (why, where this process could not take what was handed over).
    Nobody(Option<String>),
    /// A process listening on the claim's socket handed over something that is not this
    /// file's words (why): another budget is alive at this path (the file replaced under
    /// its members, or a co-tenant's socket). Never a reason to make the words: that
    /// would be a budget beside theirs.
    Foreign(String),
    /// An answer that may be a set's that died meanwhile: ask again.
    Again,
}

/// Asks for the memfd, then read-locks HOLD_BYTE, keeping what it got only where the
/// socket at `sock` is still the one it asked (a new memfd is always served from a new
/// socket bound there, and made only under HOLD_BYTE's write lock): what it holds then
/// is the claim's, and stays so while it holds the lock. Asking without the lock leaves
/// a joiner that makes the memfd free to write-lock HOLD_BYTE while thousands ask.
fn held(sock: &Path, at: &Address, file: RawFd, bytes: usize) -> Result<Asked, String> {
    let before = socket_identity(sock);
    let (m, l) = match ask(at, file, bytes) {
        Answer::Words(m, l) if !made_from(m, file) => {
            close(m);
            close(l);
            return Ok(Asked::Foreign(format!(
                "the file at {} is not the one their words were made from: it was replaced \
                 while they run (a process that may write the claim's directory renamed \
                 another file over it); join them once it is put back, or once they exit",
                sock.with_extension("").display()
            )));
        }
        Answer::Words(m, l) => (m, l),
        Answer::NotOurs(w) => {
            return Ok(Asked::Foreign(format!(
                "none handed them over: the socket {}: {w} (the file replaced while its \
                 members run, or a co-tenant's socket)",
                sock.display()
            )));
        }
        Answer::Untaken(w) => {
            return Ok(Asked::Nobody(Some(format!(
                "this process could not take them: {w}"
            ))));
        }
        Answer::Nobody(failed) => return Ok(Asked::Nobody(unreachable(sock, failed))),
    };
    if try_lock(file, libc::F_RDLCK, HOLD_BYTE)? {
        if before.is_some() && socket_identity(sock) == before {
            return Ok(Asked::Held(m, l));
        }
        try_lock(file, libc::F_UNLCK, HOLD_BYTE)?;
    }
    close(m);
    close(l);
    Ok(Asked::Again)
}

/// Why nobody could be asked at `sock`, where its path says: no socket there, a file that
/// is not one, or one nobody listens on (`failed`: the error of the connect). None where
/// the question went out and nobody answered in time (stopped members), or it is not
/// known. Said only where members hold the words: each of them binds a socket there again
/// within a second of no joiner (`rebinding`), so a joiner meets this only where none of
/// them can (every one stopped, or a directory in the socket's place).
fn unreachable(sock: &Path, failed: Option<i32>) -> Option<String> {
    let s = sock.display();
    let until = "its members bind one there again within a second unless every one of \
                 them is stopped or cannot";
    let why = match failed? {
        libc::ENOENT => format!("its socket {s} was not there (removed while they run?); {until}"),
        libc::ECONNREFUSED => match socket_kind(sock) {
            Some(libc::S_IFSOCK) | None => {
                format!(
                    "nobody listened on its socket {s} (replaced while they run, or closed by \
                 their programs?); {until}"
                )
            }
            Some(_) => format!("{s} was not a socket (replaced while they run?); {until}"),
        },
        _ => return None,
    };
    Some(why)
}

/// The file at `sock`, not followed (None: none there).
fn socket_stat(sock: &Path) -> Option<crate::sys::stat> {
    handover::lstat(cstr(sock).ok()?.as_ptr())
}

/// The kind of file at `sock` (`S_IFSOCK`, `S_IFREG`, …; None: none there).
fn socket_kind(sock: &Path) -> Option<u32> {
    socket_stat(sock).map(|st| st.st_mode & libc::S_IFMT)
}

/// The socket file at `sock`: its inode and change time (None: none there).
fn socket_identity(sock: &Path) -> Option<(u64, i64, i64)> {
    socket_stat(sock).map(|st| handover::identity(&st))
}

/// Under `MAKE_BYTE`'s write lock: the memfd a member hands over now, or a new one where
/// no other process holds one (HOLD_BYTE write-locked), HOLD_BYTE read-locked either way;
/// None where others hold it and none answered.
fn decide(
    sock: &Path,
    at: &Address,
    file: RawFd,
    bytes: usize,
) -> Result<Option<(RawFd, RawFd)>, String> {
    match held(sock, at, file, bytes)? {
        Asked::Held(m, l) => return Ok(Some((m, l))),
        Asked::Foreign(_) => return Ok(None),
        Asked::Nobody(_) | Asked::Again => {}
    }
    // Members live (the claim's directory says so) while nobody holds this file's words:
    // the file is not theirs (removed and made again, or replaced by a copy, with the
    // socket gone too). Never words of its own beside theirs: they bind the socket again
    // within about a second and are asked.
    if presence::members_live(sock) {
        return Ok(None);
    }
    if !try_lock(file, libc::F_WRLCK, HOLD_BYTE)? {
        return Ok(None);
    }
    // No process holds the words, and processes forked by a member that never left (the
    // file still marks its slot taken: killed, or dead without leaving) hold its slot's
    // children lock: the words died with their last holder while the driver keeps that
    // member's memory for its children. The file's words are older than what it held:
    // never made from them (its bytes would be forgotten, served again). Refused until
    // the children exit. A member that left at its exit gave its share back, as in any
    // pool: its children keep nobody out.
    // Where the file holds no child's lock while the claim's directory does, the
    // children are of a member of another file, removed or replaced under them: whether
    // their member left cannot be read; never words beside what it may hold.
    let with_children = crate::locks::slots_with_children(file);
    if with_children.iter().any(|&s| taken_in_file(file, s))
        || (with_children.is_empty() && presence::children_live(sock))
    {
        try_lock(file, libc::F_UNLCK, HOLD_BYTE)?;
        return Err(
            "its words were lost with the last process that held them, while processes it \
             forked still hold its GPU memory (the driver keeps it for them); no process can \
             join until they exit (the file's words would forget what it held)"
                .into(),
        );
    }
    clear_gone_marks(file);
    match make(sock, at, file, bytes) {
        Ok(pair) => {
            try_lock(file, libc::F_RDLCK, HOLD_BYTE)?;
            Ok(Some(pair))
        }
        Err(e) => {
            try_lock(file, libc::F_UNLCK, HOLD_BYTE)?;
            Err(e)
        }
    }
}

/// Whether another open file holds [`HOLD_BYTE`]: processes hold the claim's memfd (or
/// one is making it).
fn held_by_others(file: RawFd) -> Result<bool, String> {
    let mut f = flock_range(libc::F_WRLCK, HOLD_BYTE, 1);
    lock_call(file, libc::F_OFD_GETLK, &mut f)
        .map_err(|e| format!("cannot read its locks: {e}"))?;
    Ok(i32::from(f.l_type) != libc::F_UNLCK)
}

/// Takes (or, with `F_UNLCK`, lets go of) `byte` of `file` without waiting: false where
/// another process holds it.
fn try_lock(file: RawFd, kind: i32, byte: i64) -> Result<bool, String> {
    match lock_call(file, libc::F_OFD_SETLK, &mut flock_range(kind, byte, 1)) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(format!("cannot lock it: {e}")),
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
    // A sealable, close-on-exec memfd.
    let m = crate::sys::memfd(c"gpucap-pool", libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
    if m < 0 {
        return Err(fail("cannot make the memory"));
    }
    // The file's words copied by the kernel (`sendfile`: no buffer of this process's, whose
    // fresh pages would each fault), from offset 0.
    let mut from: libc::off_t = 0;
    // SAFETY: our descriptor.
    let mut copied = unsafe { libc::ftruncate(m, bytes as libc::off_t) } == 0;
    while copied && (from as usize) < bytes {
        // SAFETY: our descriptors and the offset the call moves on.
        let n = unsafe {
            libc::syscall(
                libc::SYS_sendfile,
                m,
                file,
                &mut from as *mut libc::off_t,
                bytes - from as usize,
            )
        };
        copied = n > 0;
    }
    // The file the words were made from, for joiners to check theirs against (its
    // device and inode, `H_FILE_DEV`).
    copied = copied && stamp_file(m, file);
    // SAFETY: our descriptor; sealed once written.
    copied = copied && unsafe { libc::fcntl(m, libc::F_ADD_SEALS, SEALS) } == 0;
    if !copied {
        let e = fail("cannot copy the pool file's words into memory");
        close(m);
        return Err(e);
    }
    let c = cstr(sock)?;
    let l = socket();
    // SAFETY: a NUL-terminated path; removing a dead set's socket, if one is there.
    let unlinked = unsafe { libc::unlink(c.as_ptr()) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
    // SAFETY: our socket and a valid address of `len` bytes.
    let listening = l >= 0
        && unsafe {
            libc::syscall(
                libc::SYS_bind,
                l,
                &at.addr as *const libc::sockaddr_un,
                at.len(),
            ) == 0
                && libc::syscall(libc::SYS_listen, l, 4096) == 0
        };
    if l >= 0 && !listening && !unlinked {
        close(m);
        close(l);
        return Err(stuck_socket(sock));
    }
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

/// Why a dead set's socket at `sock` could not be removed: in a sticky directory (mode
/// 1777) only its owner, the directory's or root may, so a user whose members all
/// exited left it to every other user as a socket nobody listens on.
fn stuck_socket(sock: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::symlink_metadata(sock).map(|m| m.uid());
    let dir = sock.parent().and_then(|d| std::fs::metadata(d).ok());
    let sticky = dir.as_ref().is_some_and(|d| d.mode() & 0o1000 != 0);
    let whose = owner.map_or(String::new(), |u| format!(" (uid {u}'s)"));
    let fix = if sticky {
        "the directory is sticky (mode 1777), where only the socket's owner may remove \
         it: make the directory 0777 (HAMi and vgpu-manager make theirs so), or remove the \
         socket while no process uses the pool"
    } else {
        "remove it while no process uses the pool"
    };
    format!(
        "the socket {}{whose}, left by processes of the pool that have exited, cannot be \
         replaced by this process (uid {}): {fix}",
        sock.display(),
        crate::identity::own_uid()
    )
}

/// Whether processes listen on the socket beside the claim's pool file at `path` (a
/// connection taken, or one the kernel queues for them: a socket nobody holds refuses
/// it): the claim's members live, whether or not their file is there. A joiner that
/// finds no file and sees no member's announcement (another network namespace: a pod
/// of its own) must not make a file, a second budget.
pub(crate) fn answering(path: &Path) -> bool {
    let Ok(at) = Address::of(&socket_path(path)) else {
        return false;
    };
    match handover::connect(&at) {
        Ok(s) => {
            close(s); // the member's answer, sent to nobody, is dropped
            true
        }
        Err(e) => matches!(e, Some(libc::EAGAIN | libc::ETIMEDOUT)),
    }
}

/// Whether the claim's members answer on its socket, once the socket is there again:
/// at once where someone listens; where nobody does (the socket removed with the file)
/// but the claim's directory says members live (`presence`), after they bind it again
/// (within about a second) or the file is back at `path`, waited for up to [`PATIENCE`];
/// false at once where no member lives, or after the patience (the members stopped).
pub(crate) fn answering_soon(path: &Path, waiter: Waiter) -> bool {
    if answering(path) {
        return true;
    }
    if !presence::members_live(path) {
        return false;
    }
    let give_up = waiter.gives_up();
    let mut waited = 0;
    while Instant::now() < give_up {
        pause(&mut waited);
        if answering(path) || std::fs::symlink_metadata(path).is_ok() {
            return true;
        }
    }
    false
}

/// Whether the claim's directory of `path` (a claim's or the container's pool file)
/// says its members live ([`presence`]): processes hold its words, whether or not its
/// file is there.
pub fn members_live(path: &Path) -> bool {
    presence::members_live(path)
}

/// The claim's pool file at `path`, removed while its members run, as a member hands
/// over its descriptor on the claim's socket (asked with [`handover::FILE_REQUEST`]): for
/// a process that sees no member's announcement (another network namespace: a pod of its
/// own) to join their one budget, or read it; opened with `access`, an open file of this
/// process's own. Err: why not.
pub(crate) fn removed_file(path: &Path, access: i32) -> Result<RawFd, NotHandedOver> {
    #[cfg(test)]
    if let Some(hook) = *BEFORE_QUESTION.lock().unwrap_or_else(|e| e.into_inner()) {
        hook(path);
    }
    handover::ask_for_file(&Address::of(&socket_path(path))?, access)
}

/// A test's hook, run as [`removed_file`] is about to ask the socket of `path`: what a
/// co-tenant does between a joiner's look and its question.
#[cfg(test)]
pub(crate) static BEFORE_QUESTION: std::sync::Mutex<Option<fn(&Path)>> =
    std::sync::Mutex::new(None);

/// A claim's live words for a reader or a resize: a memfd (the caller closes it; a
/// member's own, else asked of the socket), or None where no process holds them (the
/// file's words are the pool's then). Where processes hold them and none hands them
/// over, an error: the file's words are stale then, and a change written there would
/// not reach the members.
pub(crate) fn borrow(
    path: &Path,
    file: RawFd,
    bytes: usize,
    waiter: Waiter,
) -> Result<Option<RawFd>, String> {
    if let Some(m) = own_copy(file, bytes) {
        return Ok(Some(m)); // a member reads its own
    }
    let sock = socket_path(path);
    let at = Address::of(&sock)?;
    // Where the members hold the words and nobody answers, their socket may have been
    // removed (with the file, say): they bind it again within about a second, so the
    // question is asked again until the patience runs out, as a joiner asks.
    let give_up = waiter.gives_up();
    let mut waited = 0;
    let mut answer = ask(&at, file, bytes);
    while matches!(
        answer,
        Answer::Nobody(Some(libc::ENOENT | libc::ECONNREFUSED))
    ) && Instant::now() < give_up
        && (held_by_others(file)? || presence::members_live(path))
    {
        pause(&mut waited);
        answer = ask(&at, file, bytes);
    }
    match answer {
        Answer::Words(m, l) => {
            close(l); // a reader serves nobody
            // The members' words, made from another file than the one at the path (a
            // copy renamed over it while they run): their liveness locks are on theirs,
            // so through this one every member would look dead.
            if !made_from(m, file) {
                close(m);
                return Err(replaced());
            }
            Ok(Some(m))
        }
        // The same, found by their header (a copy made a second later than theirs).
        Answer::NotOurs(why) if why == handover::OTHER_WORDS => Err(replaced()),
        // Nobody holds this file's words while the claim's directory says members live:
        // the file is not theirs, and they are not answering now.
        Answer::Nobody(_) if !held_by_others(file)? && presence::members_live(path) => {
            Err(format!(
                "the claim's directory says its members live, and none of them answered on \
                 {} (removed with the file, or replaced?); their words cannot be read or \
                 changed through this file",
                sock.display()
            ))
        }
        Answer::Nobody(failed) if held_by_others(file)? => Err(format!(
            "its members hold its words, and none handed them over: {}",
            unreachable(&sock, failed).unwrap_or_else(|| format!(
                "none answered within {} s (are they stopped?)",
                handover::ANSWER_WITHIN.tv_sec
            ))
        )),
        Answer::Nobody(_) => Ok(None),
        Answer::NotOurs(why) => Err(format!("the socket {}: {why}", sock.display())),
        Answer::Untaken(why) => Err(format!("this process could not take its words: {why}")),
    }
}

/// Why a claim's words cannot be read through its path: the file there is not the one
/// its members' words were made from.
fn replaced() -> String {
    "it is not the file the claim's members' words were made from (replaced while they \
     run: a copy, or another claim's), so they cannot be read or changed through it; put \
     their file back, or wait until they exit"
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_socket_lies_beside_its_pool_file() {
        assert_eq!(
            socket_path(Path::new("/dev/shm/claim/gpucap.pool")),
            Path::new("/dev/shm/claim/gpucap.pool.sock")
        );
    }
}
