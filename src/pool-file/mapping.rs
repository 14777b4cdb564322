//! Opening a pool file: made when missing (`creation.rs`), or opened and checked (its
//! owner, mode and header); then mapped for a member or a writer, or read into a
//! reader's own copy.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use gpucap_core::budget::{
    H_BYTES, H_SLOTS_SEEN, HEADER_WORDS, LayoutError, MAX_SLOTS, POOL_FILE_BYTES, Pool, PoolView,
    STATE_EMPTY, STATE_LIVE, STATES_AT, pool_file_bytes,
};

use crate::beacon::Orphan;
use crate::creation::{dir_of, map};
use crate::identity::own_uid;
use crate::kept::Refused;
use crate::locks::SlotLocks;
use crate::removed_file::{Through, removed_answering, removed_silent, removed_unreachable};
use crate::sharing::{Owned, Sharing, check_claim_file};
use crate::sys::{cstr, write_word};

/// The most copies a reader takes for one view while the members' figures disagree
/// ([`PoolFile::view`]), each one `pread` of the file.
const READS_FOR_A_STILL_COPY: u32 = 8;

/// An open, checked pool file. A member's is mapped, never unmapped: members keep it for
/// the life of the process. A reader's is read into a copy in its own memory by each
/// [`view`](PoolFile::view) and freed after it: a file another process truncates or
/// rewrites meanwhile is an error to report, never a fault (a reader maps nothing), and
/// a reader of hundreds of pools (`gpucap metrics --all`) holds none of their words
/// between readings.
pub struct PoolFile {
    pub path: PathBuf,
    /// A member's or writer's pool, mapped for the life of the process (None: a reader's,
    /// read from its copy by each [`view`](PoolFile::view)).
    mapped: Option<Pool<'static>>,
    pub locks: SlotLocks,
    /// The length of a reader's copy of the file's words, in words (0: a mapping).
    copy_words: usize,
    /// A claim's: its live words are a memfd its members hand over ([`crate::live`]),
    /// read from there while any process holds them.
    pub(crate) claim: bool,
    /// Where the file at the path had been removed while members ran: how it was
    /// opened ([`Through`]).
    pub joined_through: Option<Through>,
}

impl PoolFile {
    /// In a claim's file (whose live words are the members' memfd, never the file):
    /// marks member slot `s` as taken by a member that has not left (`live`), or as left
    /// at its exit. A slot still marked taken in the file, whose member is gone while a
    /// child it forked holds the slot's children lock, was left by a member killed or
    /// dead without leaving: its memory may still be the driver's for the child
    /// (`live::decide`). Nothing for another pool (its file is its words).
    pub fn mark_in_file(&self, s: usize, live: bool) {
        if !self.claim || s >= MAX_SLOTS {
            return;
        }
        let fd = self.locks.fd();
        // The file's count of slots ever taken covers every slot first (the same word
        // from every member, whatever the order): a slot marked taken past it would read
        // as a corrupted file (`check_slots`). Set back when words are made from it.
        if live && let Some(pool) = self.mapped {
            write_word(fd, H_SLOTS_SEEN, pool.slots() as u64);
        }
        write_word(
            fd,
            STATES_AT + s,
            if live { STATE_LIVE } else { STATE_EMPTY },
        );
    }

    /// The open file's device, inode and owner (None: it cannot be read).
    pub fn identity(&self) -> Option<(u64, u64, u32)> {
        crate::kept::stat_of(self.locks.fd()).map(|st| (st.st_dev, st.st_ino, st.st_uid))
    }

    /// A snapshot of the pool for `gpucap status`, `top`, `metrics`, `check` and NVML's
    /// process list: a reader reads the file again first (one `pread`); a file that
    /// shrank, grew or no longer holds a pool's words is an error naming what was found.
    /// A copy taken while members change their words can hold a pool's `used` from
    /// before a change and a member's from after it: a copy whose GPUs' figures
    /// disagree (a drift) is read again, up to [`READS_FOR_A_STILL_COPY`] times, so
    /// that a drift shown is one that stays.
    pub fn view(&self) -> Result<PoolView, String> {
        if let Some(pool) = self.mapped {
            return Ok(pool.view(&self.locks));
        }
        let fail = |msg: String| format!("the pool file {}: {msg}", self.path.display());
        let copy: Box<[AtomicU64]> = (0..self.copy_words).map(|_| AtomicU64::new(0)).collect();
        let mut reads = 0;
        loop {
            read_words(&self.path, self.locks.fd(), &copy, self.claim).map_err(fail)?;
            let pool = Pool::open(&copy).map_err(|e| fail(e.to_string()))?;
            let view = pool.view(&self.locks);
            reads += 1;
            if reads >= READS_FOR_A_STILL_COPY || view.gpus.iter().all(|g| g.drift == 0) {
                return Ok(view);
            }
        }
    }

    /// The pool of a file opened to join it or change it ([`open_member`],
    /// [`open_writer`]): its words, mapped. A reader's has none (Err).
    pub fn mapped(&self) -> Result<Pool<'static>, String> {
        self.mapped.ok_or_else(|| {
            format!(
                "the pool file {}: opened to read it, not mapped",
                self.path.display()
            )
        })
    }
}

/// Opens (creating it if missing) the pool file at `path` for a member. Never waits
/// (`O_NONBLOCK`: a FIFO put at the path is refused, not waited on) and never follows a
/// symbolic link; anything but a regular file is refused before it is read.
/// A file made here has `members` slots (`GPUCAP_POOL_MEMBERS`); one that exists keeps
/// the count it was made with. `sharing` says who may use it ([`Sharing`]).
pub fn open_member(path: &Path, sharing: Sharing, members: usize) -> Result<PoolFile, String> {
    let c = cstr(path)?;
    let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    // Why the last question to a claim's socket found nobody there (removed again since
    // it was seen answering): said where every try met that.
    let mut socket_gone = None;
    for _ in 0..3 {
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { crate::sys::open(c.as_ptr(), flags, 0) };
        if fd >= 0 {
            return finish(path, fd, sharing, Role::Member);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // No file: unless live members hold one that was there (removed under them),
            // it is made.
            Some(libc::ENOENT) => match crate::beacon::orphan(path, sharing, libc::O_RDWR) {
                Orphan::Found { fd, pid } => {
                    let through = Through::Process(pid);
                    return finish_removed(path, fd, sharing, Role::Member, through);
                }
                Orphan::None | Orphan::Unreachable(_)
                    if sharing == Sharing::Claim
                        && crate::live::answering_soon(path, crate::live::Waiter::Patient) =>
                {
                    // Its maker binds the socket only after linking the file: where the
                    // file is there now (made since this open), it is opened again.
                    if crate::kept::lstat_of(c.as_ptr()).is_some() {
                        continue;
                    }
                    // Members listen (or bound their socket again, removed with the file:
                    // the claim's directory said they live), none announced whose
                    // descriptor this process may open (another network namespace;
                    // another user's processes, as a container's pool has): the file
                    // handed over by one of them, joined as any member joins it.
                    let Some(fd) = handed_over(path, libc::O_RDWR, &mut socket_gone)? else {
                        continue;
                    };
                    return finish_removed(path, fd, sharing, Role::Member, Through::Socket);
                }
                // The claim's directory says members live, and none answered within the
                // patience (stopped?): never a file of its own beside their budget.
                _ if sharing == Sharing::Claim && crate::live::members_live(path) => {
                    return Err(removed_silent(path));
                }
                Orphan::None => {}
                Orphan::Unreachable(pids) => return Err(removed_unreachable(path, &pids)),
            },
            Some(libc::EACCES) if sharing == Sharing::Claim => return Err(not_ours(path)),
            _ => return Err(open_err(path, &e)),
        }
        if crate::creation::create(path, sharing, members)? {
            continue; // made (or made by another process at the same time): open it
        }
    }
    if let Some(why) = socket_gone {
        return Err(removed_answering(path, &why));
    }
    Err(format!(
        "cannot open the pool file {}: it keeps disappearing",
        path.display()
    ))
}

/// Opens the pool file at `path` to read it (`gpucap status`, `top`, `metrics`,
/// `check`, NVML's process list); like [`open_member`], never waits on what is there.
pub fn open_reader(path: &Path, sharing: Sharing) -> Result<PoolFile, String> {
    open_existing(path, sharing, libc::O_RDONLY, Role::Reader)
}

/// Opens the existing pool file at `path` with `access` for `role`; where no file is
/// there, the one that was, removed while its members run, through a member's descriptor
/// ([`crate::beacon`]).
fn open_existing(
    path: &Path,
    sharing: Sharing,
    access: i32,
    role: Role,
) -> Result<PoolFile, String> {
    let c = cstr(path)?;
    // As a joiner does (`open_member`): a claim's socket gone again between the look and
    // the question is looked at again (three tries).
    let mut socket_gone = None;
    for _ in 0..3 {
        // Looked at before it is opened: a FIFO or a device at the path (or reached
        // through a directory of the path replaced by a link: root's readers open paths
        // that processes announce) is never opened.
        let err = match crate::kept::open_regular(&c, libc::O_NOFOLLOW, access, |_| true) {
            Ok(fd) => return finish(path, fd, sharing, role),
            Err(Refused::Other) => {
                return Err(format!(
                    "the pool file {}: it is not a regular file",
                    path.display()
                ));
            }
            Err(Refused::Open(e)) if e.raw_os_error() == Some(libc::ENOENT) => open_err(path, &e),
            Err(Refused::Open(e)) => return Err(open_err(path, &e)),
        };
        match crate::beacon::orphan(path, sharing, access) {
            Orphan::Found { fd, pid } => {
                return finish_removed(path, fd, sharing, role, Through::Process(pid));
            }
            // A claim's members in another network namespace, or another user's whose
            // descriptors this process may not open, hand it over on its socket (once they
            // bound it again, where it was removed with the file).
            Orphan::None | Orphan::Unreachable(_)
                if sharing == Sharing::Claim
                    && crate::live::answering_soon(path, role.waiter()) =>
            {
                let Some(fd) = handed_over(path, access, &mut socket_gone)? else {
                    continue;
                };
                return finish_removed(path, fd, sharing, role, Through::Socket);
            }
            _ if sharing == Sharing::Claim && crate::live::members_live(path) => {
                return Err(removed_silent(path));
            }
            _ => return Err(err),
        }
    }
    Err(removed_answering(path, &socket_gone.unwrap_or_default()))
}

/// The claim's pool file at `path`, removed while its members run, as one of them hands
/// it over on the claim's socket (opened with `access`). None where the socket was gone
/// at the question (removed or replaced again since it was seen answering: the members
/// bind it again within about a second, and the caller looks again), why kept in `gone`
/// for the line said where every try met that. Err: the line.
fn handed_over(
    path: &Path,
    access: i32,
    gone: &mut Option<String>,
) -> Result<Option<RawFd>, String> {
    match crate::live::removed_file(path, access) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.socket_gone => {
            *gone = Some(e.why);
            Ok(None)
        }
        Err(e) => Err(removed_answering(path, &e.why)),
    }
}

/// Why the pool file at `path` could not be opened (`errno` says): a symbolic link there
/// is named as one, never followed.
fn open_err(path: &Path, e: &std::io::Error) -> String {
    let err = format!("cannot open the pool file {}: {e}", path.display());
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => format!(
            "the pool file {} is a symbolic link, and gpucap never follows one at a pool's \
             path (it could lead members to another pool's budget, or to a file of another \
             user's): remove it, or name the file itself",
            path.display()
        ),
        _ => err,
    }
}

/// Opens the existing pool file at `path` to change its caps (`gpucap pool resize`):
/// read and write, never made, with a member's checks (its owner, a claim's file).
pub fn open_writer(path: &Path, sharing: Sharing) -> Result<PoolFile, String> {
    open_existing(path, sharing, libc::O_RDWR, Role::Writer)
}

/// The error of a claim's pool file this process may not open for writing.
fn not_ours(path: &Path) -> String {
    let file = std::fs::symlink_metadata(path).map(|m| Owned::of(&m));
    let described = file.map_or(String::new(), |f| {
        format!(" (mode {:o}, uid {}, gid {})", f.mode, f.uid, f.gid)
    });
    format!(
        "the claim's pool file {}{described} may not be written by this process (uid {}), so \
         it cannot share the claim's budget; remove it once no process of the claim uses it: \
         the next one is made for every user who may write the directory",
        path.display(),
        own_uid()
    )
}

/// Keeps the open file `fd` (a claim member's pool file: its locks say that the process
/// holds the claim's words, and its slot; a lone process's file) for the process's life,
/// as a named pool's mapping of its file does: a page of it mapped with no access, never
/// touched (no SIGBUS, whatever the file's size). With the descriptor alone, a program
/// that closes every descriptor it did not open (`close_range`, as daemons do) let the
/// locks go while it ran, and the next joiner made a memfd of its own: a second budget.
/// Not inherited by a forked child (its copy would keep the locks after this process
/// died); gone at exec.
pub(crate) fn pin(fd: RawFd) -> Result<(), String> {
    let page = 4096;
    // SAFETY: a fresh mapping of our file with no access, never unmapped.
    let p = unsafe {
        crate::sys::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_NONE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "cannot keep it open: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: advice on the mapping just made.
    unsafe { libc::madvise(p, page, libc::MADV_DONTFORK) };
    Ok(())
}

/// `error`, a pool file's own error (`the pool file PATH: why`), without its file's name
/// where `pool` (how the line names the pool) is that name already: a claim's pool and
/// `GPUCAP_POOL=/path` are named by their file's path, and once in a line is enough.
pub fn without_file_name<'a>(error: &'a str, pool: &str) -> &'a str {
    error
        .strip_prefix("the pool file ")
        .and_then(|rest| rest.strip_prefix(pool))
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(error)
}

/// What a process opens a pool file for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// To join it: its words mapped (a claim's: the memfd, held and served).
    Member,
    /// To change its caps: its live words mapped (a claim's: the memfd where any
    /// process holds it, else the file).
    Writer,
    /// To read it: a copy of its live words, read again by each view.
    Reader,
}

impl Role {
    /// How long it waits for a claim's members who do not answer: a reader what is left
    /// of its round's patience, the others their own.
    fn waiter(self) -> crate::live::Waiter {
        match self {
            Role::Reader => crate::live::Waiter::Reader,
            Role::Member | Role::Writer => crate::live::Waiter::Patient,
        }
    }
}

/// [`finish`] of a file removed while its members run, opened `through` one of them.
fn finish_removed(
    path: &Path,
    fd: RawFd,
    sharing: Sharing,
    role: Role,
    through: Through,
) -> Result<PoolFile, String> {
    let mut file = finish(path, fd, sharing, role)?;
    file.joined_through = Some(through);
    Ok(file)
}

/// Checks what `fd` is, maps it and checks its words.
fn finish(path: &Path, fd: RawFd, sharing: Sharing, role: Role) -> Result<PoolFile, String> {
    let member = role != Role::Reader;
    let claim = sharing == Sharing::Claim;
    let fail = |msg: String| {
        // SAFETY: our descriptor, given up on.
        unsafe { libc::close(fd) };
        Err(format!("the pool file {}: {msg}", path.display()))
    };
    // SAFETY: stat is plain data filled by fstat.
    let mut st: crate::sys::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor and a stat to fill.
    if unsafe { crate::sys::fstat(fd, &mut st) } != 0 {
        return fail(std::io::Error::last_os_error().to_string());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return fail("it is not a regular file".into());
    }
    if sharing == Sharing::Claim {
        let dir = match dir_of(path) {
            Ok(d) => d,
            Err(e) => return fail(e),
        };
        let file = Owned {
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode & 0o7777,
        };
        if let Err(e) = check_claim_file(file, dir, own_uid()) {
            return fail(e);
        }
    } else if member && st.st_uid != own_uid() {
        return fail(format!(
            "it belongs to uid {}, not to this process's uid {}: the members of a pool must \
             run as the same user",
            st.st_uid,
            own_uid()
        ));
    }
    if sharing == Sharing::Private && st.st_mode & 0o022 != 0 {
        return fail(format!(
            "it is writable by group or others (mode {:o}): another user could change or \
             reset the budget; chmod 600 it (or remove it once no process uses it)",
            st.st_mode & 0o7777
        ));
    }
    // What its header says (a pool file at all, its version, its geometry: its member
    // count, hence its length), checked against the file's length before anything of
    // that length is mapped or copied: a file longer than the layout its header gives
    // (or a header that gives none) is refused after reading its header alone.
    let size = match header_length(fd, st.st_size) {
        Ok(size) => size,
        Err(e) => return fail(e.to_string()),
    };
    // A claim's members map its memfd, never the file another container may truncate.
    let live = match (claim, role) {
        (true, Role::Member) => crate::live::hold(path, fd, size).map(Some),
        (true, Role::Writer) => crate::live::borrow(path, fd, size, crate::live::Waiter::Patient),
        _ => Ok(None),
    };
    let live = match live {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let locks = |fd| SlotLocks::new(fd, member.then(|| cstr(path).ok()).flatten());
    if !member {
        // A reader maps nothing: a copy is read now, to check the file, and again by
        // every view; freed after each.
        let copy: Box<[AtomicU64]> = (0..size / 8).map(|_| AtomicU64::new(0)).collect();
        if let Err(e) = read_words(path, fd, &copy, claim) {
            return fail(e);
        }
        if let Err(e) = Pool::open(&copy) {
            return fail(e.to_string());
        }
        return Ok(PoolFile {
            path: path.to_path_buf(),
            mapped: None,
            locks: locks(fd),
            copy_words: copy.len(),
            claim,
            joined_through: None,
        });
    }
    let Some(words) = map(live.unwrap_or(fd), size, true) else {
        return fail(format!(
            "cannot map it: {}",
            std::io::Error::last_os_error()
        ));
    };
    if role == Role::Writer
        && let Some(m) = live
    {
        // SAFETY: the borrowed memfd, mapped: the mapping keeps what it needs.
        unsafe { libc::close(m) };
    }
    let pool = match Pool::open(words) {
        Ok(p) => p,
        Err(e) => {
            // SAFETY: the mapping made above, not used after this.
            unsafe { libc::munmap(words.as_ptr() as *mut libc::c_void, size) };
            return fail(e.to_string());
        }
    };
    if claim
        && role == Role::Member
        && let Err(e) = pin(fd)
    {
        // SAFETY: the memfd's mapping made above, not used after this.
        unsafe { libc::munmap(words.as_ptr() as *mut libc::c_void, size) };
        return fail(e);
    }
    // Whether its file system has the slots' locks was tested where it was made
    // (`create`); a file made elsewhere that has none makes every slot look held, and a
    // joiner says why (`SlotLocks::refused`).
    Ok(PoolFile {
        path: path.to_path_buf(),
        mapped: Some(pool),
        locks: locks(fd),
        copy_words: 0,
        claim,
        joined_through: None,
    })
}

/// The length of the pool file `fd` (`file_bytes` long) as its header gives it: its
/// magic, version and geometry read (one `pread` of the header) and checked, and the
/// file's length found to be the one of the member count its geometry gives. Err: why
/// it is not a pool file this gpucap can use.
fn header_length(fd: RawFd, file_bytes: i64) -> Result<usize, LayoutError> {
    let mut head = [0u8; HEADER_WORDS * 8];
    // SAFETY: our descriptor and a buffer of head.len() bytes.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr() as *mut libc::c_void, head.len(), 0) };
    let size = usize::try_from(file_bytes).unwrap_or(usize::MAX);
    let words: Vec<AtomicU64> = head[..n.max(0) as usize]
        .chunks_exact(8)
        .map(|w| AtomicU64::new(u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))))
        .collect();
    let stated = words.get(H_BYTES).map_or(0, |w| w.load(Relaxed)) as usize;
    // The header alone: its magic, version and geometry are checked, then its length
    // (the header's words are not a whole file) says what the geometry asks.
    let expected = match Pool::open(&words) {
        Err(LayoutError::Size { expected, .. }) if words.len() == HEADER_WORDS => expected,
        // Shorter than a header: the length it states, where a layout has it.
        Err(LayoutError::Size { .. }) | Ok(_) => {
            if (pool_file_bytes(1)..=pool_file_bytes(MAX_SLOTS)).contains(&stated) {
                stated
            } else {
                POOL_FILE_BYTES
            }
        }
        Err(e) => return Err(e),
    };
    if size != expected || words.len() < HEADER_WORDS {
        return Err(LayoutError::Size {
            bytes: size,
            expected,
        });
    }
    Ok(size)
}

/// Reads a reader's copy again: from a claim's memfd while any process holds it, else
/// from the file `fd`.
fn read_words(path: &Path, fd: RawFd, copy: &[AtomicU64], claim: bool) -> Result<(), String> {
    match claim
        .then(|| crate::live::borrow(path, fd, copy.len() * 8, crate::live::Waiter::Reader))
        .transpose()?
    {
        Some(Some(m)) => {
            let read = read_into(m, copy);
            // SAFETY: the borrowed memfd, read.
            unsafe { libc::close(m) };
            read
        }
        _ => read_into(fd, copy),
    }
}

/// Reads the whole file `fd` into `copy` (one `pread`, one byte more than the copy
/// holds to see a file that grew): an error if it is not exactly the copy's length.
fn read_into(fd: RawFd, copy: &[AtomicU64]) -> Result<(), String> {
    let mut bytes = vec![0u8; copy.len() * 8 + 1];
    // SAFETY: our descriptor and a buffer of bytes.len() bytes.
    let n = unsafe { libc::pread(fd, bytes.as_mut_ptr() as *mut libc::c_void, bytes.len(), 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if n as usize != copy.len() * 8 {
        return Err(format!(
            "{n}{} bytes now, not the {} it had when opened (another process changed its \
             size)",
            if n as usize > copy.len() * 8 { "+" } else { "" },
            copy.len() * 8
        ));
    }
    for (w, b) in copy.iter().zip(bytes.chunks_exact(8)) {
        w.store(
            u64::from_le_bytes(b.try_into().unwrap_or_default()),
            Relaxed,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::without_file_name;

    #[test]
    fn a_pool_named_by_its_files_path_is_named_once() {
        let e = "the pool file /c/gpucap.pool: it is 0 bytes long";
        assert_eq!(without_file_name(e, "/c/gpucap.pool"), "it is 0 bytes long");
        // Named otherwise (a name, another path): the file's path stays in the line.
        assert_eq!(without_file_name(e, "train"), e);
        assert_eq!(without_file_name(e, "/c/gpucap"), e);
        assert_eq!(
            without_file_name("cannot lock it", "/c/gpucap.pool"),
            "cannot lock it"
        );
    }
}
