//! A user's directory (`gpucap-UID`) held open while a reader reads it: its owner may
//! swap it for a link to any other directory at any moment (`renameat2`'s
//! `RENAME_EXCHANGE`, one atomic step), so a reader that looked at the directory by its
//! name and then listed, opened or removed files by that name could act in the
//! directory the link leads to (root's `status` removing a file of a directory only root
//! may read). The directory is opened once without following a link, checked on its
//! descriptor (a directory, of the user its name gives), and every name in it is then
//! reached through that descriptor (`/proc/self/fd/N/NAME`): the directory looked at,
//! whatever its name names by then.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::sys::cstr;

/// A directory opened and checked, with the path it is shown by.
pub struct HeldDir {
    /// Open while `through` names it.
    fd: OwnedFd,
    shown: PathBuf,
    through: PathBuf,
}

impl HeldDir {
    /// The directory at `dir` (its last name not followed: the directories above it are
    /// the reader's pool directory), held only where it is a directory owned by `owner`.
    /// `Ok(None)`: nothing there. Err: why it is not read (a link, a file, another
    /// user's: its owner swapped it since it was listed, or someone else made it).
    pub fn open(dir: &Path, owner: u32) -> Result<Option<HeldDir>, String> {
        let c = cstr(dir)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a NUL-terminated path; a directory is opened, or nothing.
        let fd = unsafe { crate::sys::open(c.as_ptr(), flags, 0) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => Err(format!(
                    "{}: not a directory now (a link or a file): not read",
                    dir.display()
                )),
                _ => Err(format!("{}: cannot open it: {e}", dir.display())),
            };
        }
        // SAFETY: the descriptor open just returned, owned from here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let uid = crate::kept::stat_of(fd.as_raw_fd()).map(|st| st.st_uid);
        if uid != Some(owner) {
            return Err(format!(
                "{}: not uid {owner}'s directory now: not read",
                dir.display()
            ));
        }
        let through = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok(Some(HeldDir {
            fd,
            shown: dir.to_path_buf(),
            through,
        }))
    }

    /// The path the directory is shown by (its name when it was opened).
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// The entries of the held directory; Err: a line saying it cannot be listed (out of
    /// descriptors, say: never a directory gone silent, its users' files with it).
    pub fn list(&self) -> Result<Vec<std::fs::DirEntry>, String> {
        // Removed since it was opened: its descriptor's link count is 0.
        let removed = crate::kept::stat_of(self.fd.as_raw_fd()).is_none_or(|st| st.st_nlink == 0);
        listing(&self.shown, std::fs::read_dir(&self.through), removed)
    }

    /// A path that reaches `name` in the held directory, whatever is at the directory's
    /// name now.
    pub fn inside(&self, name: &OsStr) -> PathBuf {
        self.through.join(name)
    }

    /// Whether `name` in the held directory is a regular file that starts as a gpucap
    /// pool file does (its magic word), whatever its layout or state: a pool file a
    /// reader cannot read, told apart from any other file named like one. Opened as a
    /// pool file is (`kept::open_regular`: never a device or a FIFO), its first word read.
    pub fn starts_as_pool_file(&self, name: &OsStr) -> bool {
        use std::os::unix::fs::FileExt;
        let Ok(c) = cstr(&self.inside(name)) else {
            return false;
        };
        let Ok(fd) = crate::kept::open_regular(&c, libc::O_NOFOLLOW, libc::O_RDONLY, |_| true)
        else {
            return false;
        };
        // SAFETY: the descriptor open_regular just returned, owned (and closed) here.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut head = [0u8; 8];
        file.read_exact_at(&mut head, 0).is_ok()
            && u64::from_le_bytes(head) == gpucap_core::budget::MAGIC
    }

    /// `name` in the directory as it is shown.
    pub fn shown_inside(&self, name: &OsStr) -> PathBuf {
        self.shown.join(name)
    }

    /// `line` (a file's error, written with a path through the held directory) with the
    /// path the directory is shown by.
    pub fn as_shown(&self, line: &str) -> String {
        let (through, shown) = (self.through.to_string_lossy(), self.shown.to_string_lossy());
        line.replace(through.as_ref(), shown.as_ref())
    }
}

/// The entries `read` lists of the directory shown as `shown`, or the line saying why
/// it could not list them; a directory `removed` meanwhile has none. Not found otherwise
/// is `/proc/self/fd` missing (no /proc mounted): a line, never a directory gone silent.
fn listing(
    shown: &Path,
    read: std::io::Result<std::fs::ReadDir>,
    removed: bool,
) -> Result<Vec<std::fs::DirEntry>, String> {
    match read {
        Ok(entries) => Ok(entries.filter_map(Result::ok).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && removed => Ok(Vec::new()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{}: cannot list it through /proc/self/fd (is /proc mounted?): {e}",
            shown.display()
        )),
        Err(e) => Err(format!("{}: cannot list it: {e}", shown.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(tag: &str) -> PathBuf {
        crate::test_dir("held", tag)
    }

    /// Names reached through a held directory stay in it when its name is moved and
    /// another directory, or a link to one, put in its place.
    #[test]
    fn names_are_reached_in_the_directory_opened_whatever_its_name_names_later() {
        let d = scratch("moved");
        let (dir, other) = (d.join("gpucap-x"), d.join("other"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&other).unwrap();
        std::fs::write(dir.join("a.pool"), b"mine").unwrap();
        std::fs::write(other.join("a.pool"), b"other").unwrap();
        let own = std::fs::metadata(&dir).unwrap().uid();
        let held = HeldDir::open(&dir, own).unwrap().unwrap();
        std::fs::rename(&dir, d.join("moved")).unwrap();
        std::os::unix::fs::symlink(&other, &dir).unwrap();
        let a = held.inside(OsStr::new("a.pool"));
        assert_eq!(std::fs::read(&a).unwrap(), b"mine");
        let listed: Vec<_> = held.list().unwrap().iter().map(|e| e.file_name()).collect();
        assert_eq!(listed, [OsStr::new("a.pool")]);
        std::fs::remove_file(&a).unwrap();
        assert!(other.join("a.pool").exists());
        assert!(!d.join("moved/a.pool").exists());
        assert_eq!(held.shown_inside(OsStr::new("a.pool")), dir.join("a.pool"));
        let line = format!("the pool file {}: bad", a.display());
        assert_eq!(
            held.as_shown(&line),
            format!("the pool file {}: bad", dir.join("a.pool").display())
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A held directory removed since it was opened has nothing to list; one still there
    /// lists its names.
    #[test]
    fn a_removed_directory_lists_nothing_and_a_present_one_its_names() {
        let d = scratch("removed");
        let dir = d.join("gpucap-x");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a.pool"), b"").unwrap();
        let own = std::fs::metadata(&dir).unwrap().uid();
        let held = HeldDir::open(&dir, own).unwrap().unwrap();
        assert_eq!(held.list().unwrap().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(held.list().unwrap().is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A link, a file or another user's directory is not held; nothing there is None.
    #[test]
    fn only_a_real_directory_of_its_user_is_held() {
        let d = scratch("refused");
        let (dir, link, file) = (d.join("dir"), d.join("link"), d.join("file"));
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        std::fs::write(&file, b"").unwrap();
        let own = std::fs::metadata(&dir).unwrap().uid();
        assert!(HeldDir::open(&dir, own).unwrap().is_some());
        let e = HeldDir::open(&link, own).err().unwrap();
        assert!(e.contains("not a directory now"), "{e}");
        let e = HeldDir::open(&file, own).err().unwrap();
        assert!(e.contains("not a directory now"), "{e}");
        let e = HeldDir::open(&dir, own + 1).err().unwrap();
        assert!(
            e.contains(&format!("not uid {}'s directory now", own + 1)),
            "{e}"
        );
        assert!(HeldDir::open(&d.join("absent"), own).unwrap().is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A directory that cannot be listed (out of descriptors) is a line naming it as it
    /// is shown, never a directory gone silent with its users' files.
    #[test]
    fn a_directory_that_cannot_be_listed_is_a_line() {
        let shown = Path::new("/dev/shm/gpucap-1000");
        let err = |n| Err(std::io::Error::from_raw_os_error(n));
        let e = listing(shown, err(libc::EMFILE), false).err().unwrap();
        assert!(
            e.starts_with("/dev/shm/gpucap-1000: cannot list it: "),
            "{e}"
        );
        let gone = listing(shown, err(libc::ENOENT), true);
        assert!(gone.unwrap().is_empty());
        // Not found while the directory is there: /proc/self/fd is missing.
        let e = listing(shown, err(libc::ENOENT), false).err().unwrap();
        assert!(e.contains("is /proc mounted?"), "{e}");
    }
}
