//! Lone processes' files read (`gpucap status`, `top`, `metrics`): every such file of a
//! directory, read with `pread`, never mapped; the live figures from the process's memfd
//! (`/proc/PID/fd/N`); the files nobody holds (their process died) removed. What the
//! shim makes and keeps is [`crate::lone`].

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use gpucap_core::lone::{DEVICES_BYTES, LONE_FILE_BYTES, LONE_SUFFIX, LoneView, figures_fd};

use crate::held_dir::HeldDir;
use crate::kept::{Refused, open_link_if, open_regular};
use crate::lone::held;
use crate::sys::cstr;

/// One lone process's file, read.
pub struct LoneReading {
    pub path: PathBuf,
    /// The file's owner.
    pub owner: u32,
    pub view: LoneView,
}

/// Reads every live lone process's file in `dir` (`*.lone`), read-only: the processes,
/// and a line for each live process's file that cannot be shown (naming it and what is
/// wrong: a length not the layout's, no header, a header whose uid is not the file's
/// owner's or whose pid and PID namespace are not its name's). A file whose lock nobody
/// holds is a dead process's (or, named `.*.lone.*.new`, one that died before it showed
/// itself): removed when this process may, never read. Every name is reached in the
/// directory held, never where its name leads by then ([`HeldDir`]).
pub fn read_lone_dir(dir: &HeldDir) -> (Vec<LoneReading>, Vec<String>) {
    let entries = match dir.list() {
        Ok(entries) => entries,
        Err(line) => return (Vec::new(), vec![line]),
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for e in entries {
        let file_name = e.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let shown = !name.starts_with('.') && name.ends_with(LONE_SUFFIX);
        let unshown = name.starts_with('.') && name.contains(".lone.") && name.ends_with(".new");
        if !shown && !unshown {
            continue;
        }
        let (at, path) = (dir.inside(&file_name), dir.shown_inside(&file_name));
        match read_one(&at, &path, name, shown) {
            Some(Ok(r)) => out.push(r),
            Some(Err(why)) => errors.push(format!("{}: {why}", path.display())),
            None => {}
        }
    }
    out.sort_by_key(|r| r.view.pid);
    errors.sort();
    (out, errors)
}

/// The file at `at` (shown as `path`, named `name`): None where it is no live process's
/// shown file (gone meanwhile, a dead process's: removed, one not shown yet), Err why a
/// live process's cannot be shown.
fn read_one(
    at: &Path,
    path: &Path,
    name: &str,
    shown: bool,
) -> Option<Result<LoneReading, String>> {
    let c = cstr(at).ok()?;
    // Never follows a link, and opens nothing but a regular file (looked at first).
    let fd = match open_regular(&c, libc::O_NOFOLLOW, libc::O_RDONLY, |_| true) {
        Ok(fd) => fd,
        Err(Refused::Other) => return shown.then(|| Err("it is not a regular file".into())),
        Err(Refused::Open(e)) => {
            return (shown && e.kind() != std::io::ErrorKind::NotFound)
                .then(|| Err(format!("cannot open it: {e}")));
        }
    };
    let result = (|| {
        let meta = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
        // A file nobody holds is a dead process's, whatever its size (one that died
        // before it showed itself left an empty one).
        if !held(fd) {
            // Dead: removed, unless the name now holds another file (a new process
            // with this pid replaced it since).
            if std::fs::symlink_metadata(at)
                .is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()))
            {
                let _ = std::fs::remove_file(at);
            }
            return None;
        }
        if !shown {
            return None;
        }
        Some(read_held(fd, &meta, name).map(|view| LoneReading {
            path: path.to_path_buf(),
            owner: meta.uid(),
            view,
        }))
    })();
    // SAFETY: our descriptor, done with.
    unsafe { libc::close(fd) };
    result
}

/// The process a live process's file `fd` (`meta`, named `name`) shows, or why it
/// cannot be shown. Its uid is the file's owner's: a header that says another, or a
/// pid and PID namespace its name does not give, is refused (anyone may write a header,
/// and hold a lock, in a directory of their own).
fn read_held(fd: RawFd, meta: &std::fs::Metadata, name: &str) -> Result<LoneView, String> {
    if meta.len() != LONE_FILE_BYTES as u64 {
        return Err(format!(
            "{} bytes, not the {LONE_FILE_BYTES} of a lone process's file",
            meta.len()
        ));
    }
    // Read, never mapped: a file its owner truncates meanwhile is a short read.
    let words = read_words(fd).ok_or("its length changed while it was read")?;
    let view = gpucap_core::lone::read(&words).map_err(|e| e.to_string())?;
    if view.uid != meta.uid() {
        return Err(format!(
            "its header says uid {}, the file is uid {}'s: not shown",
            view.uid,
            meta.uid()
        ));
    }
    if gpucap_core::lone::file_name(view.pid, view.pid_namespace) != name {
        return Err(format!(
            "its header says pid {} of PID namespace {}, not its name's: not shown",
            view.pid, view.pid_namespace
        ));
    }
    live_figures_into(&words, meta.uid());
    // The live figures are of the same process (`same_process`): read again.
    gpucap_core::lone::read(&words).map_err(|e| e.to_string())
}

/// The whole layout read from `fd` (None: not exactly [`LONE_FILE_BYTES`] now).
fn read_words(fd: RawFd) -> Option<Vec<AtomicU64>> {
    let mut bytes = vec![0u8; LONE_FILE_BYTES + 1];
    // SAFETY: our descriptor and a buffer of bytes.len() bytes.
    let n = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    (n == LONE_FILE_BYTES as isize).then(|| {
        bytes[..LONE_FILE_BYTES]
            .chunks_exact(8)
            .map(|b| AtomicU64::new(u64::from_le_bytes(b.try_into().unwrap_or_default())))
            .collect()
    })
}

/// Replaces the figures of `words` (a visible file, read) by the process's live ones,
/// read from its memfd (`/proc/PID/fd/N`) when it can be reached and its header names
/// the same process; else they stay the copy the file was shown with. Only a process of
/// `owner` (the visible file's) is read, and only a regular file of the layout's size:
/// what a file's header says never makes a reader (root) open anything else.
fn live_figures_into(words: &[AtomicU64], owner: u32) {
    let Some(((pid, pidns), n)) = gpucap_core::lone::who(words).zip(figures_fd(words)) else {
        return;
    };
    let Some(here) = pid_here(pid, pidns) else {
        return;
    };
    if !std::fs::metadata(format!("/proc/{here}")).is_ok_and(|p| p.uid() == owner) {
        return;
    }
    let Ok(link) = CString::new(format!("/proc/{here}/fd/{n}")) else {
        return;
    };
    // The descriptor looked at before it is opened (the process may put a device under
    // its number at any time: it is never opened).
    let layout = |st: &crate::sys::stat| st.st_size == LONE_FILE_BYTES as i64;
    let Ok(fd) = open_link_if(&link, libc::O_RDONLY, layout) else {
        return;
    };
    let live = read_words(fd);
    // SAFETY: our descriptor, done with.
    unsafe { libc::close(fd) };
    if let Some(live) = live.filter(|l| gpucap_core::lone::same_process(words, l)) {
        for (to, from) in words.iter().zip(&live).take(DEVICES_BYTES / 8) {
            to.store(from.load(Relaxed), Relaxed);
        }
    }
}

/// The pid in this process's PID namespace of process `pid` of namespace `pidns` (its
/// inode; 0: unknown, taken as this one's).
fn pid_here(pid: u32, pidns: u64) -> Option<u32> {
    let own = crate::identity::own_pid_namespace();
    if pidns == 0 || own == 0 || pidns == own {
        return Some(pid);
    }
    let wanted = format!("pid:[{pidns}]");
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            let here: u32 = e.file_name().to_str()?.parse().ok()?;
            let ns = std::fs::read_link(e.path().join("ns/pid")).ok()?;
            if ns.to_str() != Some(wanted.as_str()) {
                return None;
            }
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let inner = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))?
                .split_whitespace()
                .last()?
                .parse::<u32>()
                .ok()?;
            (inner == pid).then_some(here)
        })
}
