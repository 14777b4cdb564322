//! The file of a process capped on its own (`gpucap_core::lone`): the shim makes it
//! under a temporary name, locks it (an open-file-description lock the kernel drops
//! when the process dies or execs), maps its first 64 KiB over the ledger's figures and
//! names it once its header is whole; the CLI reads every such file of a directory and
//! removes the ones nobody holds (their process died).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};

use gpucap_core::lone::{DEVICES_BYTES, LONE_FILE_BYTES, LONE_SUFFIX, LONE_WORDS, LoneView};

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", p.display()))
}

fn os_err(what: &str, p: &Path) -> String {
    format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    )
}

/// A whole-file lock of `kind` (`F_WRLCK`, `F_RDLCK`, `F_UNLCK`).
fn whole(kind: i32) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as _;
    f.l_whence = libc::SEEK_SET as _;
    f
}

/// Whether another open file holds `fd`'s file's lock (a live process).
fn held(fd: RawFd) -> bool {
    let mut f = whole(libc::F_RDLCK);
    // SAFETY: our descriptor and a flock for the duration of the call.
    let rc = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut f as *mut libc::flock) };
    rc == 0 && i32::from(f.l_type) != libc::F_UNLCK
}

/// Maps `len` bytes of `fd` from 0 at `at` (null: anywhere), shared.
fn map(fd: RawFd, at: *mut u8, len: usize, write: bool) -> Option<*mut u8> {
    let prot = libc::PROT_READ | if write { libc::PROT_WRITE } else { 0 };
    let fixed = if at.is_null() { 0 } else { libc::MAP_FIXED };
    // SAFETY: a shared mapping of our file; MAP_FIXED only over the pages the caller
    // owns (the ledger's figures, whole pages, see `Lone::prepare`).
    let p = unsafe { libc::mmap(at.cast(), len, prot, libc::MAP_SHARED | fixed, fd, 0) };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// This process's own file, while it lives.
pub struct Lone {
    fd: AtomicI32,
    /// The temporary name, then the file's name once shown.
    tmp: CString,
    path: CString,
    shown: std::sync::atomic::AtomicBool,
    /// The whole file, mapped a second time: the header is written through it.
    words: &'static [AtomicU64],
    figures: *mut u8,
}

// SAFETY: the raw pointer names the ledger's static figures, shared by every thread
// anyway; everything else is atomics and immutable strings.
unsafe impl Sync for Lone {}
// SAFETY: as above.
unsafe impl Send for Lone {}

impl Lone {
    /// Makes the file `name` will be in `dir` under a temporary name, locked, its
    /// figures the ledger's (`figures`: the ledger's `Devices`, [`DEVICES_BYTES`] of
    /// whole pages, which the file is then mapped over: their words from now on are the
    /// file's). Nothing is shown until [`show`](Self::show).
    ///
    /// The caller guarantees that no thread changes the figures while this runs (the
    /// shim calls it before the driver's first `cuInit` answered: no allocation can be
    /// made yet).
    pub fn prepare(dir: &Path, name: &str, figures: &'static [AtomicU64]) -> Result<Lone, String> {
        let at = figures.as_ptr() as *mut u8;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
        if figures.len() * 8 != DEVICES_BYTES
            || !(at as usize).is_multiple_of(page)
            || !DEVICES_BYTES.is_multiple_of(page)
        {
            return Err(format!(
                "the ledger's figures are not whole pages of {page} bytes here"
            ));
        }
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.{:x}.new", std::process::id()));
        let (cpath, ctmp) = (cstr(&path)?, cstr(&tmp)?);
        // SAFETY: a NUL-terminated path; a stale temporary name of this pid is replaced.
        unsafe { libc::unlink(ctmp.as_ptr()) };
        // SAFETY: as above; O_EXCL never follows or reuses an existing entry.
        let fd = unsafe {
            libc::open(
                ctmp.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(os_err("cannot create", &tmp));
        }
        let fail = |msg: String| {
            // SAFETY: our descriptor and our temporary name, given up on.
            unsafe {
                libc::close(fd);
                libc::unlink(ctmp.as_ptr());
            }
            Err(msg)
        };
        let mut lock = whole(libc::F_WRLCK);
        // SAFETY: our descriptor; fchmod undoes a stricter umask only; a flock for the call.
        let ok = unsafe {
            libc::fchmod(fd, 0o600);
            libc::ftruncate(fd, LONE_FILE_BYTES as libc::off_t) == 0
                && libc::fcntl(fd, libc::F_OFD_SETLK, &mut lock as *mut libc::flock) == 0
        };
        if !ok {
            return fail(os_err("cannot size or lock", &tmp));
        }
        let Some(whole_map) = map(fd, std::ptr::null_mut(), LONE_FILE_BYTES, true) else {
            return fail(os_err("cannot map", &tmp));
        };
        // SAFETY: a fresh mapping of LONE_FILE_BYTES, page-aligned, never unmapped, only
        // ever used atomically (readers map it too).
        let words: &'static [AtomicU64] =
            unsafe { std::slice::from_raw_parts(whole_map as *const AtomicU64, LONE_WORDS) };
        for (to, from) in words.iter().zip(figures) {
            to.store(from.load(Acquire), Relaxed);
        }
        if map(fd, at, DEVICES_BYTES, true).is_none() {
            return fail(os_err("cannot map the ledger's figures onto", &tmp));
        }
        Ok(Lone {
            fd: AtomicI32::new(fd),
            tmp: ctmp,
            path: cpath,
            shown: false.into(),
            words,
            figures: at,
        })
    }

    /// The whole file's words (to write the header with `gpucap_core::lone::write_header`).
    pub fn words(&self) -> &'static [AtomicU64] {
        self.words
    }

    /// Whether [`show`](Self::show) named it.
    pub fn is_shown(&self) -> bool {
        self.shown.load(Acquire)
    }

    /// Names the file (its header written): readers find it from now on. A stale file
    /// of the same name (a dead process with this pid) is replaced.
    pub fn show(&self) -> Result<(), String> {
        if self.shown.load(Acquire) {
            return Ok(());
        }
        // SAFETY: two NUL-terminated paths.
        if unsafe { libc::rename(self.tmp.as_ptr(), self.path.as_ptr()) } != 0 {
            return Err(format!(
                "cannot name {}: {}",
                self.path.to_string_lossy(),
                std::io::Error::last_os_error()
            ));
        }
        self.shown.store(true, Release);
        Ok(())
    }

    /// At exit: the file is removed (a process that dies otherwise leaves it to the next
    /// reader). Its figures stay mapped: the exit path may still count.
    pub fn remove(&self) {
        let name = if self.shown.load(Acquire) {
            &self.path
        } else {
            &self.tmp
        };
        // SAFETY: a NUL-terminated path.
        unsafe { libc::unlink(name.as_ptr()) };
    }

    /// In a forked child: the figures become the child's own again (a private copy of
    /// them, put in place in one `mremap`) and its copy of the descriptor is closed, so
    /// that the parent's death still drops the lock. Syscalls and a copy only: callable
    /// in a fork handler.
    pub fn forget_in_child(&self) {
        // SAFETY: a fresh private anonymous mapping, filled from the figures, then moved
        // over them whole (the child has one thread now); our descriptor, closed once.
        unsafe {
            let copy = libc::mmap(
                std::ptr::null_mut(),
                DEVICES_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if copy != libc::MAP_FAILED {
                std::ptr::copy_nonoverlapping(self.figures, copy.cast(), DEVICES_BYTES);
                libc::mremap(
                    copy,
                    DEVICES_BYTES,
                    DEVICES_BYTES,
                    libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                    self.figures,
                );
            }
            let fd = self.fd.swap(-1, Relaxed);
            if fd >= 0 {
                libc::close(fd);
            }
        }
    }
}

/// One lone process's file, read.
pub struct LoneReading {
    pub path: PathBuf,
    /// The file's owner.
    pub owner: u32,
    pub view: LoneView,
}

/// Reads every live lone process's file in `dir` (`*.lone`), read-only. A file whose
/// lock nobody holds is a dead process's (or, named `.*.lone.*.new`, one that died
/// before it showed itself): removed when this process may, never read.
pub fn read_lone_dir(dir: &Path) -> Vec<LoneReading> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.filter_map(Result::ok) {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let shown = !name.starts_with('.') && name.ends_with(LONE_SUFFIX);
        let unshown = name.starts_with('.') && name.contains(".lone.") && name.ends_with(".new");
        if !shown && !unshown {
            continue;
        }
        if let Some(r) = read_one(&e.path(), shown) {
            out.push(r);
        }
    }
    out.sort_by_key(|r| r.view.pid);
    out
}

fn read_one(path: &Path, shown: bool) -> Option<LoneReading> {
    let c = cstr(path).ok()?;
    // SAFETY: a NUL-terminated path; never follows a link, never waits on a FIFO.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return None;
    }
    let result = (|| {
        let meta = std::fs::metadata(format!("/proc/self/fd/{fd}")).ok()?;
        if !meta.is_file() || meta.len() != LONE_FILE_BYTES as u64 {
            return None;
        }
        if !held(fd) {
            // Dead: removed, unless the name now holds another file (a new process
            // with this pid replaced it since).
            if std::fs::symlink_metadata(path)
                .is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()))
            {
                let _ = std::fs::remove_file(path);
            }
            return None;
        }
        if !shown {
            return None;
        }
        let p = map(fd, std::ptr::null_mut(), LONE_FILE_BYTES, false)?;
        // SAFETY: a fresh read-only mapping of LONE_FILE_BYTES, read atomically (its
        // process writes it), unmapped below.
        let words = unsafe { std::slice::from_raw_parts(p as *const AtomicU64, LONE_WORDS) };
        let view = gpucap_core::lone::read(words).ok();
        // SAFETY: the mapping made above, not used after this.
        unsafe { libc::munmap(p.cast(), LONE_FILE_BYTES) };
        Some(LoneReading {
            path: path.to_path_buf(),
            owner: meta.uid(),
            view: view?,
        })
    })();
    // SAFETY: our descriptor, done with.
    unsafe { libc::close(fd) };
    result
}
