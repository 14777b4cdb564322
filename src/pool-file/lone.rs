//! The file of a process capped on its own (`gpucap_core::lone`): the shim makes it
//! under a temporary name, empty, locks it (an open-file-description lock the
//! kernel drops when the process dies or execs), maps a sealed memfd of the same layout
//! over the ledger's figures (the live figures: no other process can write, shrink or
//! grow it) and names the file, a copy, once its header is whole. The CLI reads every
//! such file of a directory (read, never mapped), the live figures from the memfd
//! (`/proc/PID/fd/N`), and removes the files nobody holds (their process died).

use std::ffi::CString;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Release},
};

use gpucap_core::lone::{
    DEVICE_FIGURES_BYTES, DEVICE_WORDS, DEVICES_BYTES, LONE_FILE_BYTES, LONE_WORDS,
};

use crate::kept::Kept;
use crate::sys::{cstr, os_err};

/// A whole-file lock of `kind` (`F_WRLCK`, `F_RDLCK`, `F_UNLCK`).
fn whole(kind: i32) -> libc::flock {
    // SAFETY: flock is plain data; all-zero is a valid value (l_pid must be 0 for OFD locks).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as _;
    f.l_whence = libc::SEEK_SET as _;
    f
}

/// Whether another open file holds `fd`'s file's lock (a live process).
pub(crate) fn held(fd: RawFd) -> bool {
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
    let p = unsafe { crate::sys::mmap(at.cast(), len, prot, libc::MAP_SHARED | fixed, fd, 0) };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// This process's own file, while it lives.
pub struct Lone {
    /// The visible file's descriptor (its lock says the process lives; a page of it
    /// mapped with no access keeps the lock where the program closes the descriptor).
    fd: Kept,
    /// The sealed memfd of the live figures.
    memfd: Kept,
    /// The temporary name, then the file's name once shown.
    tmp: CString,
    path: CString,
    shown: std::sync::atomic::AtomicBool,
    /// The memfd, mapped a second time whole: the header is written through it.
    words: &'static [AtomicU64],
    figures: *mut u8,
}

// SAFETY: the raw pointer names the ledger's static figures, shared by every thread
// anyway; everything else is atomics and immutable strings.
unsafe impl Sync for Lone {}
// SAFETY: as above.
unsafe impl Send for Lone {}

/// Puts a private copy of the figures at `figures` in place of what is mapped there (one
/// `mremap`): they are this process's own memory again. Syscalls and a copy only.
fn privatize(figures: *mut u8) {
    // SAFETY: a fresh private anonymous mapping, filled from the figures (mapped and
    // readable: a sealed memfd cannot shrink), then moved over them whole.
    unsafe {
        let copy = crate::sys::mmap(
            std::ptr::null_mut(),
            DEVICES_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if copy != libc::MAP_FAILED {
            std::ptr::copy_nonoverlapping(figures, copy.cast(), DEVICES_BYTES);
            libc::mremap(
                copy,
                DEVICES_BYTES,
                DEVICES_BYTES,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                figures,
            );
        }
    }
}

/// Adds `seals` to the memfd `fd`.
fn seal(fd: RawFd, seals: i32) -> bool {
    // SAFETY: our descriptor; F_ADD_SEALS takes an int.
    unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) == 0 }
}

/// A sealable memfd of the whole layout: the live figures. Its pages are taken as they
/// are first written: a memfd lives on the kernel's internal shared-memory mount, which
/// has no size limit (a full `/dev/shm` is no concern), so writing one never faults.
fn live_figures() -> Result<RawFd, String> {
    let fd = crate::sys::memfd(c"gpucap-lone", libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
    if fd < 0 {
        return Err(format!(
            "cannot make a memfd for the figures: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: our descriptor; sets the size only, allocates nothing.
    let sized = (unsafe { libc::ftruncate(fd, LONE_FILE_BYTES as libc::off_t) } == 0)
        .then_some(())
        .ok_or_else(|| {
            format!(
                "cannot size the figures' memfd: {}",
                std::io::Error::last_os_error()
            )
        })
        .and_then(|()| {
            seal(fd, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
                .then_some(())
                .ok_or_else(|| {
                    format!(
                        "cannot seal the figures' memfd: {}",
                        std::io::Error::last_os_error()
                    )
                })
        });
    if let Err(e) = sized {
        // SAFETY: our descriptor, given up on.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

impl Lone {
    /// Makes the file `name` will be in `dir` under a temporary name, empty and locked
    /// (it is written, never mapped: a full file system is an error of
    /// [`show`](Self::show)'s write, never a fault); and
    /// the live figures: a sealed memfd mapped over the ledger's (`figures`: its
    /// `Devices`, [`DEVICES_BYTES`] of whole pages; their words from now on are the
    /// memfd's, which no other process can write, shrink or grow). Nothing is shown
    /// until [`show`](Self::show). On an error nothing is changed: the figures stay the
    /// process's own memory, the cap holds, only the display is missing.
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
        let create = || {
            // SAFETY: a NUL-terminated path; O_EXCL never follows or reuses an existing
            // entry.
            unsafe {
                crate::sys::open(
                    ctmp.as_ptr(),
                    libc::O_RDWR
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    0o600 as libc::c_uint,
                )
            }
        };
        let mut fd = create();
        if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
            // A stale temporary name of this pid (a process that died making its file)
            // is replaced.
            // SAFETY: a NUL-terminated path.
            unsafe { libc::unlink(ctmp.as_ptr()) };
            fd = create();
        }
        if fd < 0 {
            return Err(os_err("cannot create", &tmp));
        }
        let mut memfd = -1;
        let fail = |msg: String, memfd: RawFd| {
            // SAFETY: our descriptors and our temporary name, given up on.
            unsafe {
                libc::close(fd);
                if memfd >= 0 {
                    libc::close(memfd);
                }
                libc::unlink(ctmp.as_ptr());
            }
            Err(msg)
        };
        // SAFETY: our descriptor; fchmod undoes a stricter umask only.
        unsafe { libc::fchmod(fd, 0o600) };
        let mut lock = whole(libc::F_WRLCK);
        // SAFETY: our descriptor, a flock for the call.
        if unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut lock as *mut libc::flock) } != 0 {
            return fail(os_err("cannot lock", &tmp), memfd);
        }
        // The lock held for the process's life, closed descriptor or not (a program that
        // closes every descriptor it did not open, as daemons do, was taken for dead).
        if let Err(e) = crate::mapping::pin(fd) {
            return fail(format!("{}: {e}", tmp.display()), memfd);
        }
        memfd = match live_figures() {
            Ok(m) => m,
            Err(e) => return fail(e, memfd),
        };
        let Some(whole_map) = map(memfd, std::ptr::null_mut(), LONE_FILE_BYTES, true) else {
            return fail(os_err("cannot map the figures' memfd for", &tmp), memfd);
        };
        // SAFETY: a fresh mapping of LONE_FILE_BYTES of a memfd that cannot shrink,
        // page-aligned, never unmapped, only ever used atomically (readers read it too).
        let words: &'static [AtomicU64] =
            unsafe { std::slice::from_raw_parts(whole_map as *const AtomicU64, LONE_WORDS) };
        // The figures as they are, into the memfd: each device's words where any is not
        // zero, one `pwrite` a device. A fresh memfd reads as zero, which is what a device
        // nothing was set on holds (its cap word is stored inverted), so at a process's
        // first `cuInit` nothing is copied and no page is taken until a device is used; a
        // forked child's figures (its parent's) are copied. No thread changes them
        // meanwhile (the caller's guarantee).
        const BLOCK: usize = DEVICE_WORDS * 8;
        for d in 0..DEVICE_FIGURES_BYTES / BLOCK {
            let offset = d * BLOCK;
            // SAFETY: `at` is the start of the caller's `Devices`, page-aligned and
            // readable for DEVICES_BYTES (checked above); no thread writes them while
            // this runs (the caller's guarantee), so their words may be read as plain
            // words.
            let block: &[u64] = unsafe {
                std::slice::from_raw_parts(at.add(offset).cast::<u64>().cast_const(), DEVICE_WORDS)
            };
            // Every word or'ed, no early exit (the compiler reads several at a time): 5,000
            // instructions for all 64 devices, against the kernel's copy of 36 KiB into 9
            // pages it would otherwise take.
            if block.iter().fold(0, |any, &w| any | w) == 0 {
                continue;
            }
            // SAFETY: our descriptor and BLOCK readable bytes.
            let wrote =
                unsafe { libc::pwrite(memfd, block.as_ptr().cast(), BLOCK, offset as libc::off_t) };
            if usize::try_from(wrote).ok() != Some(BLOCK) {
                return fail(os_err("cannot copy the ledger's figures for", &tmp), memfd);
            }
        }
        if map(memfd, at, DEVICES_BYTES, true).is_none() {
            return fail(os_err("cannot map the ledger's figures for", &tmp), memfd);
        }
        // From now on no other process may write it (the two mappings made above still
        // may), nor add or remove seals.
        if !seal(memfd, libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL) {
            let e = std::io::Error::last_os_error();
            privatize(at);
            return fail(format!("cannot seal the figures' memfd: {e}"), memfd);
        }
        Ok(Lone {
            fd: Kept::new(fd),
            memfd: Kept::new(memfd),
            tmp: ctmp,
            path: cpath,
            shown: false.into(),
            words,
            figures: at,
        })
    }

    /// The live figures' whole words (to write the header with
    /// `gpucap_core::lone::write_header`).
    pub fn words(&self) -> &'static [AtomicU64] {
        self.words
    }

    /// Whether [`show`](Self::show) named it.
    pub fn is_shown(&self) -> bool {
        self.shown.load(Acquire)
    }

    /// Names the file (the header written in [`words`](Self::words)): it gets a copy of
    /// the live words, the memfd's descriptor in its header, and readers find it from
    /// now on. A stale file of the same name (a dead process with this pid) is replaced.
    /// The copy holds the figures of the GPUs the header names and the header; the other
    /// devices' figures, which no reader reads, stay a hole (a start writes two pages,
    /// not seventeen).
    pub fn show(&self) -> Result<(), String> {
        if self.shown.load(Acquire) {
            return Ok(());
        }
        if let Some(memfd) = self.memfd.get() {
            gpucap_core::lone::set_figures_fd(self.words, memfd);
        }
        let named = gpucap_core::lone::named_figure_bytes(self.words).min(DEVICES_BYTES);
        for range in [0..named, DEVICES_BYTES..LONE_FILE_BYTES] {
            self.write_copy(range)?;
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

    /// Copies the header (as written in [`words`](Self::words) since [`show`](Self::show))
    /// into the named file again, for its readers; nothing before `show` (which copies
    /// it). Its figures are left as they are: readers take them live.
    pub fn rewrite_header(&self) -> Result<(), String> {
        if !self.shown.load(Acquire) {
            return Ok(());
        }
        self.write_copy(DEVICES_BYTES..LONE_FILE_BYTES)
    }

    /// Writes the live words' bytes `range` at the same place of the visible file: through
    /// its descriptor, or where the program took that number, the file opened again by
    /// its name (never the program's file).
    fn write_copy(&self, range: std::ops::Range<usize>) -> Result<(), String> {
        let name = if self.shown.load(Acquire) {
            &self.path
        } else {
            &self.tmp
        };
        let Some(fd) = self.fd.get_or_reopen(name, libc::O_WRONLY) else {
            return Err(format!(
                "cannot write {}: the program closed its descriptor, and the name is no \
                 longer that file",
                name.to_string_lossy()
            ));
        };
        let bytes: Vec<u8> = self.words[range.start / 8..range.end / 8]
            .iter()
            .flat_map(|w| w.load(Acquire).to_le_bytes())
            .collect();
        // SAFETY: our descriptor (checked to be the file) and a buffer of bytes.len()
        // bytes.
        let n = unsafe {
            libc::pwrite(
                fd,
                bytes.as_ptr() as *const libc::c_void,
                bytes.len(),
                range.start as libc::off_t,
            )
        };
        if n != bytes.len() as isize {
            return Err(format!(
                "cannot write {}: {}",
                name.to_string_lossy(),
                if n < 0 {
                    std::io::Error::last_os_error().to_string()
                } else {
                    format!("{n} of {} bytes written", bytes.len())
                }
            ));
        }
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
    /// them, put in place in one `mremap`) and its copies of the descriptors are closed,
    /// so that the parent's death still drops the lock (the pinned page is not
    /// inherited); a number the program reused is its own file, left open. Syscalls and
    /// a copy only: callable in a fork handler.
    pub fn forget_in_child(&self) {
        privatize(self.figures);
        self.fd.close();
        self.memfd.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lone_read::read_lone_dir;
    use gpucap_core::ledger::{DEVICE_WORDS, Devices, Ledger};
    use gpucap_core::lone::{LoneInfo, write_header};
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::sync::atomic::Ordering::Relaxed;

    fn dir(tag: &str) -> PathBuf {
        crate::test_dir("lone", tag)
    }

    /// A ledger's figures of its own, as the shim's static ones: whole pages, never freed.
    fn figures() -> &'static [AtomicU64] {
        let devices: &'static Devices = Box::leak(Box::new(Ledger::new())).devices();
        // SAFETY: `Devices` is `repr(C)`, AtomicU64s only, DEVICES_BYTES long (asserted
        // in the core), and leaked.
        unsafe {
            std::slice::from_raw_parts(
                devices as *const Devices as *const AtomicU64,
                DEVICES_BYTES / 8,
            )
        }
    }

    #[test]
    fn the_figures_written_before_the_memfd_is_mapped_over_them_stay_every_devices() {
        let d = dir("carried");
        let figures = figures();
        // What a forked child's ledger holds of its parent's: figures on the first and
        // the last device, up to the last device's last word.
        let last = DEVICE_FIGURES_BYTES / 8 - 1;
        figures[0].store(256 << 20, Relaxed);
        figures[1].store(3 << 20, Relaxed);
        figures[last - DEVICE_WORDS + 1].store(1 << 30, Relaxed);
        figures[last].store(7, Relaxed);
        let before: Vec<u64> = figures.iter().map(|w| w.load(Relaxed)).collect();
        let lone = Lone::prepare(&d, "8-8.lone", figures).unwrap();
        let after: Vec<u64> = figures.iter().map(|w| w.load(Relaxed)).collect();
        assert_eq!(
            before, after,
            "the ledger's words read the same once mapped"
        );
        // The memfd holds them (its second mapping, the header's), and nothing past them.
        let memfd: Vec<u64> = lone.words()[..DEVICES_BYTES / 8]
            .iter()
            .map(|w| w.load(Relaxed))
            .collect();
        assert_eq!(memfd, before);
        // Now the same words: what the ledger writes is the memfd's.
        figures[last].store(8, Relaxed);
        assert_eq!(lone.words()[last].load(Relaxed), 8);
        lone.remove();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn fresh_figures_take_no_page_of_the_memfd_until_a_device_is_used() {
        let d = dir("fresh");
        let figures = figures();
        assert!(
            figures.iter().all(|w| w.load(Relaxed) == 0),
            "a fresh ledger is all zero"
        );
        let lone = Lone::prepare(&d, "7-7.lone", figures).unwrap();
        let memfd = lone.memfd.number();
        let blocks = || {
            // SAFETY: a stat buffer for our own descriptor.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::fstat(memfd, &mut st) }, 0);
            st.st_blocks * 512
        };
        assert_eq!(
            blocks(),
            0,
            "nothing copied into the memfd for a fresh ledger"
        );
        figures[1].store(5, Relaxed); // device 0's use
        assert_eq!(blocks(), 4096, "device 0's page, taken when written");
        lone.remove();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_shown_file_holds_its_gpus_figures_and_the_header_and_no_other_page() {
        let d = dir("shown");
        let figures = figures();
        // Named as the shim names it: a reader checks the header's pid against the name.
        let name = gpucap_core::lone::file_name(std::process::id(), crate::own_pid_namespace());
        let lone = Lone::prepare(&d, &name, figures).unwrap();
        // The live words are the memfd's now: what the ledger writes, readers read.
        figures[0].store(!(256u64 << 20), Relaxed); // GPU 0's cap (its word inverted)
        figures[1].store(3 << 20, Relaxed); // and use
        write_header(
            lone.words(),
            &LoneInfo {
                pid: std::process::id(),
                pid_namespace: crate::own_pid_namespace(),
                start_ms: 1,
                uid: crate::own_uid(),
                growth: false,
                command: "test".into(),
                uuids: vec![[7; 16]],
            },
        );
        lone.show().unwrap();
        let path = d.join(&name);
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.len(), LONE_FILE_BYTES as u64);
        assert!(
            m.blocks() * 512 <= 4 * 4096,
            "the copy takes {} bytes on disk: more than its GPU's figures and its header",
            m.blocks() * 512
        );
        let bytes = std::fs::read(&path).unwrap();
        let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(
            (word(0), word(1)),
            (!(256u64 << 20), 3 << 20),
            "GPU 0's figures copied"
        );
        assert_eq!(
            word(DEVICE_WORDS * 8),
            0,
            "a device the header does not name is a hole"
        );
        let read = read_lone_dir(&held(&d)).0;
        assert_eq!(read.len(), 1);
        let gpus = &read[0].view.gpus;
        assert_eq!(gpus.len(), 1);
        assert_eq!((gpus[0].cap, gpus[0].used), (Some(256 << 20), 3 << 20));
        lone.remove();
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn held(d: &Path) -> crate::HeldDir {
        crate::HeldDir::open(d, crate::own_uid()).unwrap().unwrap()
    }

    #[test]
    fn an_empty_file_of_a_process_that_died_before_it_showed_itself_is_removed() {
        let d = dir("unshown");
        let stale = d.join(".4242-1.lone.1092.new");
        std::fs::write(&stale, b"").unwrap();
        assert!(read_lone_dir(&held(&d)).0.is_empty());
        assert!(
            !stale.exists(),
            "nobody holds it: a dead process's, removed"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
