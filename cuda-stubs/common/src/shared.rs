//! FAKECUDA_SHARED: the device memory in use of every process that names the same file.
//!
//! The file (created by the first process, under `flock`) holds a header (the device count
//! and size it was made with, the highest total use seen per device) and one slot per
//! process: its pid, its start time and the bytes it holds on each physical device, all
//! atomics.
//!
//! A process's memory is released as the real driver releases it: when the last
//! descriptor of its device file closes. The NVIDIA driver keeps a process's allocations
//! in the client of its open `/dev/nvidia*` files and frees them when those files are
//! released (their last close, so a forked child still holding them keeps the memory:
//! NVIDIA/Megatron-LM#3684); a killed process's files close in the kernel's exit
//! teardown (`exit_files`, one `fput` per descriptor), before it becomes a zombie, in an
//! order of descriptors no other process can rely on. Here the device file is this file:
//! each process holds an open-file-description lock (`F_OFD_SETLK`) on its slot's byte,
//! which the kernel drops on that same last close, and a slot counts while its lock is
//! held. So a killed process's memory stays counted until its descriptor of this file is
//! closed, whatever other files (a pool file's locks) closed before it. A slot whose lock
//! is free counts for nothing and is reused; a pid or start time is never compared.
//!
//! Taking memory locks the file (`flock`, dropped by the kernel if the holder dies), adds
//! up the live slots and adds to the process's own slot if the total still fits. Giving
//! memory back and reading the total take no file lock.
//!
//! The fake libcuda joins the file (`join`); the fake NVML only reads it (`observe`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};

use libc::c_int;

pub const MAX_DEV: usize = 64;
pub const MAX_SLOTS: usize = 256;
const MAGIC: u64 = u64::from_be_bytes(*b"FAKECUD1");

#[repr(C)]
struct Slot {
    pid: AtomicU32,
    /// 1: a slot charged for another process by a test (`charge_for`), which holds no
    /// lock: alive while its pid runs. 0: alive while its lock is held.
    by_pid: AtomicU32,
    /// Start time of the process (/proc/PID/stat field 22), 0 when unknown.
    start: AtomicU64,
    used: [AtomicU64; MAX_DEV],
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    devices: AtomicU64,
    total_mem: AtomicU64,
    _reserved: [AtomicU64; 5],
    /// Highest sum over live processes seen per physical device.
    peak: [AtomicU64; MAX_DEV],
    slots: [Slot; MAX_SLOTS],
}

const FILE_SIZE: usize = std::mem::size_of::<Header>();

struct Inner {
    fd: c_int,
    /// The process that owns `slot` (differs from getpid() in a forked child).
    pid: u32,
    slot: Option<usize>,
    /// `leave` ran: later releases (exit-time frees of other handlers) are ignored.
    left: bool,
}

/// An open shared-state file.
pub struct Shared {
    hdr: &'static Header,
    path: PathBuf,
    devices: usize,
    total: u64,
    inner: Mutex<Inner>,
}

fn errno_msg(what: &str, path: &Path) -> String {
    format!(
        "FAKECUDA_SHARED: {what} {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    )
}

struct FileLock(c_int);

impl FileLock {
    /// The file's lock, held alone: taking memory, (re)initialising, reaping.
    fn new(fd: c_int) -> FileLock {
        Self::take(fd, libc::LOCK_EX)
    }

    /// The file's lock shared with other readers: no process takes memory meanwhile.
    fn shared(fd: c_int) -> FileLock {
        Self::take(fd, libc::LOCK_SH)
    }

    fn take(fd: c_int, how: c_int) -> FileLock {
        // SAFETY: flock on our own fd; EINTR is retried.
        while unsafe { libc::flock(fd, how) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        FileLock(fd)
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: unlocking our own fd.
        unsafe { libc::flock(self.0, libc::LOCK_UN) };
    }
}

/// Where the slots' lock bytes start (past the file's end: locks need no data).
const LOCK_BASE: i64 = 1 << 40;

/// An OFD lock request of `kind` on slot `slot`'s byte.
fn slot_lock(fd: c_int, cmd: c_int, kind: c_int, slot: usize) -> Option<libc::flock> {
    // SAFETY: flock is plain data; all-zero is valid (l_pid must be 0 for OFD locks).
    let mut f: libc::flock = unsafe { std::mem::zeroed() };
    f.l_type = kind as _;
    f.l_whence = libc::SEEK_SET as _;
    f.l_start = LOCK_BASE + slot as i64;
    f.l_len = 1;
    // SAFETY: a valid flock for the duration of the call on our own fd.
    (unsafe { libc::fcntl(fd, cmd, &mut f as *mut libc::flock) } == 0).then_some(f)
}

/// Whether another open file description holds slot `slot`'s lock: its process (or a
/// forked child sharing the description) still has its device file open.
fn lock_held(fd: c_int, slot: usize) -> bool {
    slot_lock(fd, libc::F_OFD_GETLK, libc::F_RDLCK, slot)
        .is_some_and(|f| c_int::from(f.l_type) != libc::F_UNLCK)
}

fn open_fd(path: &Path, create: bool) -> Result<Option<c_int>, String> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("FAKECUDA_SHARED: bad path {}", path.display()))?;
    let flags = libc::O_RDWR | libc::O_CLOEXEC | if create { libc::O_CREAT } else { 0 };
    // SAFETY: open with a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o666 as libc::c_uint) };
    if fd < 0 {
        if !create && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(errno_msg("cannot open", path));
    }
    Ok(Some(fd))
}

/// (state char, start time) of a process, from /proc/PID/stat; None if there is no such file.
fn proc_stat(pid: u32) -> Option<(u8, u64)> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = s.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&s[close + 1..]).ok()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.bytes().next()?;
    let start = f.get(19)?.parse().ok()?;
    Some((state, start))
}

fn own_start() -> u64 {
    proc_stat(std::process::id()).map(|s| s.1).unwrap_or(0)
}

/// Is the process that took a slot (pid, start time) still running?
pub fn alive(pid: u32, start: u64) -> bool {
    match proc_stat(pid) {
        Some((state, st)) => !matches!(state, b'Z' | b'X') && (start == 0 || st == start),
        None if Path::new("/proc/self/stat").exists() => false,
        // No /proc: ask the kernel.
        // SAFETY: signal 0 only checks that the process exists.
        None => {
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

impl Shared {
    /// Opens (creating it if needed) the file of a process that uses the devices, and
    /// takes a slot for it. Errors name the variable: a file made for other devices, or
    /// no free slot.
    pub fn join(path: &Path, devices: usize, total: u64) -> Result<Shared, String> {
        let fd = open_fd(path, true)?.expect("created");
        let s = Self::map(path, fd, Some((devices, total)))?;
        s.claim_slot()?;
        Ok(s)
    }

    /// Opens an existing file to read it (the fake NVML); None if it does not exist yet.
    pub fn observe(path: &Path) -> Result<Option<Shared>, String> {
        match open_fd(path, false)? {
            None => Ok(None),
            Some(fd) => Self::map(path, fd, None).map(Some),
        }
    }

    fn map(path: &Path, fd: c_int, config: Option<(usize, u64)>) -> Result<Shared, String> {
        let fail = |msg: String| {
            // SAFETY: closing the fd we opened.
            unsafe { libc::close(fd) };
            Err(msg)
        };
        let _lock = FileLock::new(fd);
        // SAFETY: fstat into a zeroed stat buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return fail(errno_msg("cannot stat", path));
        }
        let size = st.st_size as usize;
        if size == 0 && config.is_some() {
            // SAFETY: sizing our own file (zero-filled).
            if unsafe { libc::ftruncate(fd, FILE_SIZE as libc::off_t) } != 0 {
                return fail(errno_msg("cannot size", path));
            }
        } else if size != FILE_SIZE {
            return fail(format!(
                "FAKECUDA_SHARED: {} is not a fake-driver state file of this version ({size} bytes, expected {FILE_SIZE})",
                path.display()
            ));
        }
        // SAFETY: maps the whole file shared; it stays mapped for the life of the process.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return fail(errno_msg("cannot map", path));
        }
        // SAFETY: FILE_SIZE bytes of zero-initialised or previously initialised atomics.
        let hdr: &'static Header = unsafe { &*(p as *const Header) };
        let magic = hdr.magic.load(SeqCst);
        let (devices, total) = match (magic == MAGIC, config) {
            (true, Some((d, t))) => {
                let (hd, ht) = (
                    hdr.devices.load(SeqCst) as usize,
                    hdr.total_mem.load(SeqCst),
                );
                if (hd, ht) != (d, t) {
                    // SAFETY: unmapping what we just mapped.
                    unsafe { libc::munmap(p, FILE_SIZE) };
                    return fail(format!(
                        "FAKECUDA_SHARED: {} was created for FAKECUDA_DEVICES={hd} FAKECUDA_TOTAL_MEM={ht}, \
                         this process has FAKECUDA_DEVICES={d} FAKECUDA_TOTAL_MEM={t}",
                        path.display()
                    ));
                }
                (d, t)
            }
            (true, None) => (
                hdr.devices.load(SeqCst) as usize,
                hdr.total_mem.load(SeqCst),
            ),
            // New, or its creator died before finishing: (re)initialise under the lock.
            (false, Some((d, t))) => {
                hdr.devices.store(d as u64, SeqCst);
                hdr.total_mem.store(t, SeqCst);
                hdr.magic.store(MAGIC, SeqCst);
                (d, t)
            }
            (false, None) => (0, 0),
        };
        Ok(Shared {
            hdr,
            path: path.to_path_buf(),
            devices,
            total,
            inner: Mutex::new(Inner {
                fd,
                pid: std::process::id(),
                slot: None,
                left: false,
            }),
        })
    }

    pub fn devices(&self) -> usize {
        self.devices
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether slot `i`, taken by `pid`, counts: this process's own, or one whose
    /// process still has the file open (see the module's comment).
    fn slot_live(&self, fd: c_int, i: usize, pid: u32) -> bool {
        let s = &self.hdr.slots[i];
        pid != 0
            && (pid == std::process::id()
                || if s.by_pid.load(SeqCst) != 0 {
                    alive(pid, s.start.load(SeqCst))
                } else {
                    lock_held(fd, i)
                })
    }

    /// Runs `read` over the slots as one snapshot, as the real driver's figures are: under
    /// the file's shared lock no process takes memory, and releases and deaths only lower
    /// what a slot counts, so the sum is at most what was in use when it began. Without it
    /// a reader that counted a killed process's slot before its files closed could count
    /// the memory another process took in its place a moment later: a device over its
    /// total, seen once by the pool's kill storm under load (212 MiB past a pool's cap).
    fn reading<T>(&self, read: impl FnOnce(c_int) -> T) -> T {
        let mut inner = self.inner();
        // A forked child reads through a description of its own: a lock through the one it
        // shares with its parent would be the parent's lock, converted and then dropped.
        let fd = self.own_fd(&mut inner).unwrap_or(inner.fd);
        let _lock = FileLock::shared(fd);
        read(fd)
    }

    /// This process's descriptor of the file; a forked child opens its own (and so
    /// holds no slot until it takes one: the parent's slot lock belongs to the
    /// description they share).
    fn own_fd(&self, inner: &mut Inner) -> Result<c_int, String> {
        let me = std::process::id();
        if inner.pid != me {
            let fd = open_fd(&self.path, false)?
                .ok_or_else(|| errno_msg("cannot reopen", &self.path))?;
            // SAFETY: the child's copy of the parent's fd; the parent keeps its own.
            unsafe { libc::close(inner.fd) };
            inner.fd = fd;
            inner.pid = me;
            inner.slot = None;
            inner.left = false;
        }
        Ok(inner.fd)
    }

    /// Frees the slots of processes that are gone (call with the file lock held).
    fn reap(&self, fd: c_int) {
        for (i, s) in self.hdr.slots.iter().enumerate() {
            let pid = s.pid.load(SeqCst);
            if pid != 0 && !self.slot_live(fd, i, pid) {
                for u in &s.used {
                    u.store(0, SeqCst);
                }
                s.start.store(0, SeqCst);
                s.by_pid.store(0, SeqCst);
                s.pid.store(0, SeqCst);
            }
        }
    }

    fn claim_locked(&self, inner: &mut Inner) -> Result<usize, String> {
        let _lock = FileLock::new(inner.fd);
        self.reap(inner.fd);
        let me = std::process::id();
        // A free slot whose lock this open file can take: held by this open file until
        // its last descriptor closes.
        let i = (0..MAX_SLOTS)
            .find(|&i| {
                self.hdr.slots[i].pid.load(SeqCst) == 0
                    && slot_lock(inner.fd, libc::F_OFD_SETLK, libc::F_WRLCK, i).is_some()
            })
            .ok_or_else(|| {
                format!(
                    "FAKECUDA_SHARED: {} has no free process slot ({MAX_SLOTS} processes)",
                    self.path.display()
                )
            })?;
        let s = &self.hdr.slots[i];
        for u in &s.used {
            u.store(0, SeqCst);
        }
        s.start.store(own_start(), SeqCst);
        s.by_pid.store(0, SeqCst);
        s.pid.store(me, SeqCst);
        inner.pid = me;
        inner.slot = Some(i);
        Ok(i)
    }

    fn claim_slot(&self) -> Result<usize, String> {
        let mut inner = self.inner();
        self.claim_locked(&mut inner)
    }

    /// This process's slot; a forked child gets a fresh one (see `own_fd`).
    fn own_slot(&self, inner: &mut Inner) -> Result<usize, String> {
        self.own_fd(inner)?;
        match inner.slot {
            Some(i) => Ok(i),
            None => self.claim_locked(inner),
        }
    }

    fn live_used(&self, fd: c_int, phys: usize) -> u64 {
        self.hdr
            .slots
            .iter()
            .enumerate()
            .filter(|&(i, s)| self.slot_live(fd, i, s.pid.load(SeqCst)))
            .map(|(_, s)| s.used[phys].load(SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// Takes `size` bytes of physical device `phys` for this process if the live processes'
    /// total stays within the device; false otherwise (or if the file cannot be used).
    pub fn reserve(&self, phys: usize, size: u64) -> bool {
        let mut inner = self.inner();
        inner.left = false;
        let Ok(slot) = self.own_slot(&mut inner) else {
            return false;
        };
        let _lock = FileLock::new(inner.fd);
        let in_use = self.live_used(inner.fd, phys);
        match in_use.checked_add(size).filter(|&n| n <= self.total) {
            Some(n) => {
                self.hdr.slots[slot].used[phys].fetch_add(size, SeqCst);
                self.hdr.peak[phys].fetch_max(n, SeqCst);
                true
            }
            None => {
                // Dead processes' memory is already left out of the sum; free their slots.
                self.reap(inner.fd);
                false
            }
        }
    }

    /// Gives back `size` bytes of `phys` (saturating: a forked child giving back what its
    /// parent took changes nothing).
    pub fn release(&self, phys: usize, size: u64) {
        let mut inner = self.inner();
        if inner.left && inner.pid == std::process::id() {
            return;
        }
        if let Ok(slot) = self.own_slot(&mut inner) {
            let _ = self.hdr.slots[slot].used[phys]
                .fetch_update(SeqCst, SeqCst, |u| Some(u.saturating_sub(size)));
        }
    }

    /// Bytes of `phys` held by all live processes.
    pub fn used(&self, phys: usize) -> u64 {
        if phys >= MAX_DEV {
            return 0;
        }
        self.reading(|fd| self.live_used(fd, phys))
    }

    /// Highest total use of `phys` seen since the file was created.
    pub fn peak(&self, phys: usize) -> u64 {
        self.hdr.peak.get(phys).map_or(0, |p| p.load(SeqCst))
    }

    /// (pid, bytes) of each live process holding memory of `phys`.
    pub fn processes(&self, phys: usize) -> Vec<(u32, u64)> {
        self.reading(|fd| {
            self.hdr
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let pid = s.pid.load(SeqCst);
                    let used = s.used.get(phys)?.load(SeqCst);
                    (used > 0 && self.slot_live(fd, i, pid)).then_some((pid, used))
                })
                .collect()
        })
    }

    /// Gives back everything this process holds and frees its slot (at exit). Lock-free,
    /// so it is safe in an exit handler of a forked child.
    pub fn leave(&self) {
        let me = std::process::id();
        let Ok(mut inner) = self.inner.try_lock() else {
            return; // another thread holds it; the slot is reaped once we are gone
        };
        if inner.pid != me {
            return;
        }
        inner.left = true;
        if let Some(i) = inner.slot.take() {
            let s = &self.hdr.slots[i];
            if s.pid.load(SeqCst) == me {
                for u in &s.used {
                    u.store(0, SeqCst);
                }
                s.pid.store(0, SeqCst);
                // Its memory is released: the slot's lock too (fcntl: safe at exit).
                let _ = slot_lock(inner.fd, libc::F_OFD_SETLK, libc::F_UNLCK, i);
            }
        }
    }

    /// Test helper: takes a slot for another process and charges it.
    #[cfg(test)]
    pub fn charge_for(&self, pid: u32, phys: usize, size: u64) {
        let inner = self.inner();
        let _lock = FileLock::new(inner.fd);
        let s = self
            .hdr
            .slots
            .iter()
            .find(|s| s.pid.load(SeqCst) == pid)
            .or_else(|| self.hdr.slots.iter().find(|s| s.pid.load(SeqCst) == 0))
            .unwrap();
        s.start
            .store(proc_stat(pid).map(|x| x.1).unwrap_or(0), SeqCst);
        s.by_pid.store(1, SeqCst);
        s.pid.store(pid, SeqCst);
        s.used[phys].fetch_add(size, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("fakecuda-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn processes_share_the_total_and_dead_ones_give_it_back() {
        let path = tmp("share");
        let s = Shared::join(&path, 2, 1000).unwrap();
        assert!(s.reserve(0, 600));
        // Another live process holds 300 of device 0.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        s.charge_for(child.id(), 0, 300);
        assert_eq!(s.used(0), 900);
        assert_eq!(s.processes(0).len(), 2);
        assert!(!s.reserve(0, 101));
        assert!(s.reserve(0, 100));
        assert!(s.reserve(1, 1000), "devices are separate");
        s.release(0, 100);
        // It dies (and is reaped by its parent): its memory counts no more.
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(s.used(0), 600);
        assert!(s.reserve(0, 400));
        assert_eq!(s.peak(0), 1000);
        // A reader sees the same.
        let r = Shared::observe(&path).unwrap().unwrap();
        assert_eq!(
            (r.used(0), r.used(1), r.devices(), r.total()),
            (1000, 1000, 2, 1000)
        );
        s.leave();
        assert_eq!(r.used(0), 0);
        // Frees after leaving (other exit handlers) change nothing.
        s.release(0, 100);
        assert_eq!(r.used(0), 0);
        let _ = std::fs::remove_file(&path);
    }

    /// A reader's figures are one snapshot: no process takes memory while it sums the
    /// slots (a killed process's slot counted before its files closed and the memory
    /// another took in its place after would add up past the device).
    #[test]
    fn memory_is_not_taken_while_a_reader_sums_the_slots() {
        let path = tmp("snapshot");
        let taker = std::sync::Arc::new(Shared::join(&path, 1, 1000).unwrap());
        let reader = Shared::observe(&path).unwrap().unwrap();
        let took = reader.reading(|fd| {
            let first = reader.live_used(fd, 0);
            let t = std::sync::Arc::clone(&taker);
            let other = std::thread::spawn(move || t.reserve(0, 400));
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert!(
                !other.is_finished(),
                "memory was taken during a reader's sum"
            );
            assert_eq!(reader.live_used(fd, 0), first);
            other
        });
        assert!(took.join().unwrap());
        assert_eq!(reader.used(0), 400);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn zombies_and_recycled_pids_count_as_dead() {
        let path = tmp("zombie");
        let s = Shared::join(&path, 1, 1000).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        s.charge_for(child.id(), 0, 500);
        // Not yet waited for: a zombie.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(s.used(0), 0);
        child.wait().unwrap();
        // A slot whose start time differs is another process that happens to have the pid.
        let me = std::process::id();
        let slot = s
            .hdr
            .slots
            .iter()
            .find(|x| x.pid.load(SeqCst) == me)
            .unwrap();
        assert!(alive(me, slot.start.load(SeqCst)));
        assert!(!alive(me, slot.start.load(SeqCst) + 1));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn other_configurations_are_refused() {
        let path = tmp("config");
        let _a = Shared::join(&path, 2, 1 << 30).unwrap();
        let err = Shared::join(&path, 2, 2 << 30).err().unwrap();
        assert!(err.contains("FAKECUDA_TOTAL_MEM"), "{err}");
        let err = Shared::join(&path, 1, 1 << 30).err().unwrap();
        assert!(err.contains("FAKECUDA_DEVICES=2"), "{err}");
        assert!(Shared::observe(&tmp("missing")).unwrap().is_none());
        std::fs::write(&path, b"junk").unwrap();
        assert!(Shared::join(&path, 2, 1 << 30).is_err());
        let _ = std::fs::remove_file(&path);
    }
}
