//! The cap handed down to a program's children: the environment the `exec` and
//! `posix_spawn` hooks (`exec.rs`) start a child with, as `gpucap_core::config::plan`
//! plans it: the caller's environment, each configuration variable of this process's
//! the caller's does not set, and `LD_PRELOAD` naming this library. Nothing is handed
//! down by a process that has no configuration (no variable, no `gpucap.env`).
//!
//! This process's configuration variables: those its configuration was read from (at
//! its first CUDA call, [`remember`]), else those it started with, copied at the
//! library's load (`.init_array`) before the program could clear them (`env -i` empties
//! `environ` before its `execvp`; `unsetenv` moves the start's array in place; a
//! process title may be written over the start's strings).
//!
//! Runs between `fork` (or `vfork`) and `exec`: no allocation, no lock of this library;
//! the new environment is built in a buffer on the stack, or in pages of its own where it
//! does not fit (left mapped in a `vfork` parent when the `exec` succeeds).

use std::cell::UnsafeCell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};

use gpucap_core::config::{self, Part};

use crate::exec_buffer::Spare;
use crate::ordinals::{Frame, ORDINALS};

/// An argument or environment vector.
pub type Vector = *const *const c_char;

/// Room for the configuration variables a process starts with (their `NAME=value\0`).
const START_BYTES: usize = 16 * 1024;

/// Bytes written once, by the first thread to write them, and read only after: no lock,
/// no allocation (a constructor, a child between `fork` and `exec`).
struct WrittenOnce<const N: usize> {
    /// 0 not written, 1 being written, 2 written.
    state: AtomicU8,
    /// How many of `bytes` were written.
    len: AtomicUsize,
    bytes: UnsafeCell<[u8; N]>,
}

// SAFETY: `bytes` is written once, by the thread that moves `state` from 0 to 1, and
// read only after `state` is 2 (Release/Acquire).
unsafe impl<const N: usize> Sync for WrittenOnce<N> {}

impl<const N: usize> WrittenOnce<N> {
    const fn new() -> Self {
        WrittenOnce {
            state: AtomicU8::new(0),
            len: AtomicUsize::new(0),
            bytes: UnsafeCell::new([0; N]),
        }
    }

    /// Writes the bytes with `fill` (into the zeroed buffer; it answers how many it
    /// wrote), where no thread has begun to: a later call does nothing.
    fn write(&self, fill: impl FnOnce(&mut [u8; N]) -> usize) {
        if self.state.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
            return;
        }
        // SAFETY: this thread moved the state from 0 to 1: nothing else writes or reads
        // `bytes` until the state is 2.
        let len = fill(unsafe { &mut *self.bytes.get() }).min(N);
        self.len.store(len, Relaxed);
        self.state.store(2, Release);
    }

    /// Whether a thread has begun to write them.
    fn begun(&self) -> bool {
        self.state.load(Acquire) != 0
    }

    /// The bytes written (None before they are).
    fn get(&self) -> Option<&[u8]> {
        // SAFETY: the state is 2: `bytes` is written and no longer changes.
        (self.state.load(Acquire) == 2)
            .then(|| unsafe { &(&*self.bytes.get())[..self.len.load(Relaxed).min(N)] })
    }
}

/// The configuration variables this process started with, copied at the library's load
/// (entries NUL-terminated).
static START: WrittenOnce<START_BYTES> = WrittenOnce::new();

/// The variables of the configuration this process read (`NAME=value\0` each).
static READ: OnceLock<Vec<u8>> = OnceLock::new();

/// Whether a configuration file took part in it: 0 not known yet, 1 none, 2 one (or one
/// failed to be read).
static READ_FILE: AtomicU8 = AtomicU8::new(0);

/// Copies the configuration variables of `envp` (the environment the process starts
/// with, as the loader hands a constructor) once: a later call does nothing.
fn copy_start(envp: Vector) {
    START.write(|bytes| {
        let mut len = 0;
        let mut put = |parts: &[&[u8]]| {
            let n: usize = parts.iter().map(|p| p.len()).sum();
            if len + n < START_BYTES {
                for p in parts {
                    bytes[len..len + p.len()].copy_from_slice(p);
                    len += p.len();
                }
                bytes[len] = 0;
                len += 1;
            }
        };
        // The entries the configuration may read (most of an environment is not read
        // further than its first byte).
        let looked = || {
            Entries(envp)
                // SAFETY: a non-null entry is a NUL-terminated string: its first byte is
                // there.
                .filter(|&p| config::may_be_looked_at(unsafe { *p } as u8))
                // SAFETY: as above, the whole string.
                .map(|p| unsafe { CStr::from_ptr(p) }.to_bytes())
        };
        let frame = Frame::of(looked().map(split), config::keys_digest(looked()));
        for entry in looked().filter(|e| frame.keeps(split(e).0)) {
            put(&[entry]);
        }
        frame.add(put);
        len
    });
}

/// An entry `NAME=value` as its name and value (an empty value where it has no `=`).
fn split(entry: &[u8]) -> (&[u8], &[u8]) {
    match entry.iter().position(|&b| b == b'=') {
        Some(eq) => (&entry[..eq], &entry[eq + 1..]),
        None => (entry, &[]),
    }
}

/// Whether this process runs in secure execution (`AT_SECURE`: set-user-ID, started by
/// another user): it hands none of its environment down. Such a program (`su`, `sudo`)
/// starts its children with an environment of its own making on purpose, as another
/// user, and the starting user's variables would reach them (a `GPUCAP_REPORT` path a
/// child of root's then writes). Asked each time, not at the library's load: another
/// library's constructor may `exec` before this library's runs.
fn secure() -> bool {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Room for this library's path made whole ([`ABSOLUTE`]).
const PATH_BYTES: usize = 4096;

/// This library's path where the loader named it by one relative to the directory the
/// process was in when it loaded it (`LD_PRELOAD=./libgpucap.so`,
/// `LD_PRELOAD=target/release/libgpucap.so`): that directory and the name, made at the
/// library's load (a child started in another directory would not find the name). Empty
/// where the loader's name is whole.
static ABSOLUTE: WrittenOnce<PATH_BYTES> = WrittenOnce::new();

/// Makes [`ABSOLUTE`] where this library's name is relative: the working directory (a
/// system call) and the name. Left empty where the two do not fit.
fn make_absolute() {
    ABSOLUTE.write(|bytes| {
        let Some(name) = crate::link_maps::own_name().filter(|n| n.first() != Some(&b'/')) else {
            return 0;
        };
        // SAFETY: getcwd writes at most the buffer's length, NUL-terminated.
        let rc = unsafe { libc::syscall(libc::SYS_getcwd, bytes.as_mut_ptr(), PATH_BYTES) };
        let dir = if rc > 0 {
            bytes.iter().position(|&b| b == 0).unwrap_or(PATH_BYTES)
        } else {
            0
        };
        if dir == 0 || bytes[0] != b'/' || dir + 1 + name.len() >= PATH_BYTES {
            return 0;
        }
        bytes[dir] = b'/';
        bytes[dir + 1..dir + 1 + name.len()].copy_from_slice(name);
        dir + 1 + name.len()
    });
}

/// At the library's load: the environment the process starts with (glibc calls an
/// `.init_array` entry with `argc`, `argv` and `envp`), and this library's path made
/// whole where the loader named it by a relative one.
extern "C" fn at_load(_argc: c_int, _argv: Vector, envp: Vector) {
    if !secure() {
        copy_start(envp);
        crate::link_maps::find_at_load();
        make_absolute();
    }
}

#[used]
// SAFETY: an .init_array entry the loader calls once, with (argc, argv, envp).
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn(c_int, Vector, Vector) = at_load;

/// Remembers the variables of the configuration this process reads (at its first CUDA
/// call), before [`remember_file`].
pub fn remember_vars<'a>(vars: impl Iterator<Item = (&'a [u8], &'a [u8])>) {
    let vars: Vec<(&[u8], &[u8])> = vars.collect();
    let frame = Frame::of(
        vars.iter().copied(),
        config::pairs_digest(vars.iter().copied()),
    );
    let mut bytes = Vec::new();
    let mut put = |parts: &[&[u8]]| {
        for p in parts {
            bytes.extend_from_slice(p);
        }
        bytes.push(0);
    };
    for &(name, value) in vars.iter().filter(|(name, _)| frame.keeps(name)) {
        put(&[name, b"=", value]);
    }
    frame.add(put);
    let _ = READ.set(bytes);
}

/// Remembers whether a configuration file took part in this process's configuration
/// (also where reading one failed: a child then fails closed as this process does).
pub fn remember_file(file: bool) {
    READ_FILE.store(if file { 2 } else { 1 }, Release);
}

/// The entries of a NULL-terminated environment vector (none for a null one), each a
/// non-null NUL-terminated string.
#[derive(Clone, Copy)]
struct Entries(Vector);

impl Iterator for Entries {
    type Item = *const c_char;
    fn next(&mut self) -> Option<*const c_char> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: `self.0` points into a NULL-terminated vector, at most at its NULL.
        let entry = unsafe { *self.0 };
        if entry.is_null() {
            return None;
        }
        // SAFETY: not past the terminator (checked above).
        self.0 = unsafe { self.0.add(1) };
        Some(entry)
    }
}

/// The entries of `envp` as bytes.
fn entries(envp: Vector) -> impl Iterator<Item = &'static [u8]> + Clone {
    // SAFETY: each a NUL-terminated string, alive until the `exec`.
    Entries(envp).map(|e| unsafe { CStr::from_ptr(e) }.to_bytes())
}

/// This process's configuration variables: a copy (`NAME=value`, NUL-terminated), or
/// those of `environ` itself where the copy is being made.
#[derive(Clone, Copy)]
enum Vars {
    Copied(&'static [u8]),
    Live(Vector),
}

impl Vars {
    /// The variables, each `NAME=value`.
    fn iter(self) -> VarIter {
        match self {
            Vars::Copied(bytes) => VarIter::Copied(bytes),
            Vars::Live(envp) => VarIter::Live(Entries(envp)),
        }
    }
}

/// The entries of [`Vars`].
#[derive(Clone)]
enum VarIter {
    /// The rest of the copy.
    Copied(&'static [u8]),
    /// The rest of `environ`, its configuration variables taken.
    Live(Entries),
}

impl Iterator for VarIter {
    type Item = &'static [u8];
    fn next(&mut self) -> Option<&'static [u8]> {
        match self {
            VarIter::Copied(rest) => loop {
                if rest.is_empty() {
                    return None;
                }
                let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
                let entry = &rest[..end];
                *rest = &rest[(end + 1).min(rest.len())..];
                if !entry.is_empty() {
                    return Some(entry);
                }
            },
            VarIter::Live(entries) => loop {
                let p = entries.next()?;
                // SAFETY: a non-null entry is a NUL-terminated string: its first byte is
                // there.
                if !config::may_be_looked_at(unsafe { *p } as u8) {
                    continue;
                }
                // SAFETY: as above, the whole string, alive until the `exec`.
                let entry = unsafe { CStr::from_ptr(p) }.to_bytes();
                if config::handed_down(config::name_of(entry)) {
                    return Some(entry);
                }
            },
        }
    }
}

/// This process's configuration variables, and whether a file took part where that is
/// known (None: the configuration was not read).
fn parent() -> (Vars, Option<bool>) {
    if secure() {
        return (Vars::Copied(&[]), None);
    }
    if let Some(vars) = READ.get() {
        let file = match READ_FILE.load(Acquire) {
            0 => None,
            known => Some(known == 2),
        };
        return (Vars::Copied(vars), file);
    }
    // SAFETY: `environ` is the C library's vector of the environment.
    let environ = unsafe { libc::environ } as Vector;
    if !START.begun() {
        // Before the library's load finished (another library's constructor): what the
        // environment says now.
        copy_start(environ);
    }
    // Another thread copies them now (a thread another library's constructor started),
    // or did when this process was forked from it (the copy is never finished here):
    // the environment's own.
    (START.get().map_or(Vars::Live(environ), Vars::Copied), None)
}

/// Whether a configuration file is there for this library (beside it, or in /etc).
fn file_there(lib: &[u8]) -> bool {
    // The loader names a preloaded library by a path with a slash (one it found on its
    // search path by the whole path): none where this library's name is not known.
    let beside = lib
        .iter()
        .rposition(|&b| b == b'/')
        .is_some_and(|slash| exists(&[&lib[..slash + 1], config::ENV_FILE_NAME.as_bytes()]));
    beside || exists(&[config::ETC_ENV_FILE.as_bytes()])
}

/// `parts` joined into a NUL-terminated path in the hooks' small buffer (an `exec` may
/// run on a signal handler's stack); None where it does not fit.
fn joined(parts: &[&[u8]]) -> Option<[u8; 512]> {
    let mut path = [0u8; 512];
    let mut at = 0;
    for part in parts {
        if at + part.len() >= path.len() {
            return None;
        }
        path[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    Some(path)
}

/// Whether the file whose path is `parts` joined exists; true where the path is longer
/// than the hooks' small buffer (the library is then handed down, and the child reads
/// what is there).
fn exists(parts: &[&[u8]]) -> bool {
    let Some(path) = joined(parts) else {
        return true;
    };
    // SAFETY: `path` is NUL-terminated (zeroed past `at`); faccessat only reads it. A
    // system call, not the C library's `access`: each function the library imports is a
    // lookup at every process's start.
    unsafe {
        libc::syscall(
            libc::SYS_faccessat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::F_OK,
            0,
        ) == 0
    }
}

/// This library's path, as the loader named it (empty where unknown), made whole where
/// that name was relative ([`ABSOLUTE`]): from its link map, read without the loader's
/// locks (`link_maps.rs`), else asked of the loader (`dladdr`) where that list cannot be
/// read.
fn own_path() -> &'static [u8] {
    if let Some(whole) = ABSOLUTE.get().filter(|p| !p.is_empty()) {
        return whole;
    }
    static NAME: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
    let p = NAME.load(Acquire);
    if !p.is_null() {
        // SAFETY: the loader's NUL-terminated name of this library, alive while it is
        // loaded.
        return unsafe { CStr::from_ptr(p) }.to_bytes();
    }
    let name = crate::link_maps::own_name().or_else(|| {
        let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
        let addr = own_path as fn() -> &'static [u8] as *const c_void;
        // SAFETY: dladdr only reads `addr` (a function of this library) and fills `info`.
        if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
            return None;
        }
        // SAFETY: dladdr succeeded: `info` is filled (and was zeroed before).
        let p = unsafe { info.assume_init() }.dli_fname;
        // SAFETY: the loader's NUL-terminated name of this library, alive while loaded.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
    });
    match name {
        Some(n) => {
            NAME.store(n.as_ptr().cast_mut().cast(), Release);
            n
        }
        None => &[],
    }
}

/// Whether the `LD_PRELOAD` entry `entry` names this library (whose whole path is
/// `lib`) otherwise, for a child whose `LD_LIBRARY_PATH` is `search`: a path that is the
/// same file (its device and inode: a relative path from the directory the process is
/// in now, a link), or a bare name that is the same file in a directory of `search`
/// (one the loader finds elsewhere, or not at all, is not taken for it: the whole path
/// is added beside it, which the loader maps once where both are the same file). System
/// calls, nothing allocated.
fn names_lib(entry: &[u8], lib: &[u8], search: &[u8]) -> bool {
    let Some(own) = file_id(&[lib]) else {
        return false;
    };
    if entry.contains(&b'/') {
        return file_id(&[entry]) == Some(own);
    }
    search
        .split(|&b| b == b':' || b == b';')
        .map(|dir| if dir.is_empty() { &b"."[..] } else { dir })
        .any(|dir| file_id(&[dir, b"/", entry]) == Some(own))
}

/// The device and inode of the file whose path is `parts` joined (None where it cannot
/// be read, or the path is longer than the hooks' small buffer).
fn file_id(parts: &[&[u8]]) -> Option<(u64, u64)> {
    let buf = joined(parts)?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: a NUL-terminated path (zeroed past it) and room for the answer; a system
    // call, not the C library's `stat` (an import is a lookup at every start).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_newfstatat,
            libc::AT_FDCWD,
            buf.as_ptr(),
            st.as_mut_ptr(),
            0,
        )
    };
    // SAFETY: the call succeeded: the kernel filled it (and it was zeroed before).
    (rc == 0)
        .then(|| unsafe { st.assume_init() })
        .map(|s| (s.st_dev, s.st_ino))
}

/// The value of `LD_LIBRARY_PATH` in `envp`'s entries (empty where it sets none).
fn search_path(envp: impl Iterator<Item = &'static [u8]>) -> &'static [u8] {
    envp.filter_map(|e| e.strip_prefix(b"LD_LIBRARY_PATH="))
        .next()
        .unwrap_or_default()
}

/// Words of the buffer on the stack (2 KiB: an `exec` may run on a signal handler's
/// stack): pointers and the new `LD_PRELOAD` entry.
const STACK_WORDS: usize = 256;

/// Whether this process hands anything down: it has configuration variables (`vars`;
/// `GPUCAP_ORDINALS` alone, which every copy gains, configures nothing) or a
/// configuration file (read, or there for the library `lib`).
fn configured(vars: Vars, file: Option<bool>, lib: &[u8]) -> bool {
    vars.iter().any(|v| {
        let name = config::name_of(v);
        config::configures(name) && name != ORDINALS
    }) || file.unwrap_or_else(|| file_there(lib))
}

/// The C library's `gnu_get_libc_version`, found at its first use (not imported: a
/// binding more for the loader at every start).
static LIBC_VERSION: crate::link_maps::Next = crate::link_maps::Next::new(b"gnu_get_libc_version");

/// The C library's version (`2.36`), None where it has no `gnu_get_libc_version`.
fn libc_version() -> Option<&'static [u8]> {
    let f = LIBC_VERSION.get()?;
    // SAFETY: the C library's `const char *gnu_get_libc_version(void)`.
    let f = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn() -> *const c_char>(f) };
    // SAFETY: the C library's static, NUL-terminated text of its version.
    Some(unsafe { CStr::from_ptr(f()) }.to_bytes())
}

/// The command, NUL-terminated, that `system` or `popen` runs in place of `cmd`: the
/// shell they start with the process's environment handed what a child of this process
/// is handed and the environment lacks ([`config::shell_command`]); None where the
/// environment lacks nothing (or nothing is handed down). Allocates: not for a child
/// between `fork` and `exec`.
pub fn shell_command(cmd: &[u8]) -> Option<Vec<u8>> {
    let (vars, file) = parent();
    let lib = own_path();
    if !configured(vars, file, lib) {
        return None;
    }
    // SAFETY: `environ` is the C library's vector of the environment.
    let caller = entries(unsafe { libc::environ } as Vector);
    let search = search_path(caller.clone());
    let mut added: Vec<Vec<u8>> = Vec::new();
    config::plan(
        caller,
        vars.iter(),
        lib,
        |e| names_lib(e, lib, search),
        |p| match p {
            Part::Kept(_) => {}
            Part::Inherited(e) => added.push(e.to_vec()),
            Part::Preload { .. } => {
                let mut entry = vec![0; p.bytes(lib) + 1];
                let n = config::write_part(p, lib, &mut entry);
                entry.truncate(n - 1);
                added.push(entry);
            }
        },
    );
    if added.is_empty() {
        return None;
    }
    let dashes = libc_version().is_some_and(config::shell_gets_dashes);
    let mut command = config::shell_command(added.iter().map(Vec::as_slice), cmd, dashes);
    command.push(0);
    Some(command)
}

/// Calls `exec` with the environment a child of this process is started with, made
/// from `envp` (the caller's); `exec` with `envp` itself where nothing is handed down.
/// `no_memory`, with `errno` `ENOMEM`, where the environment fits neither the stack
/// nor fresh pages.
pub fn with_environment<R>(envp: Vector, no_memory: R, exec: impl FnOnce(Vector) -> R) -> R {
    let (vars, file) = parent();
    let lib = own_path();
    if !configured(vars, file, lib) {
        return exec(envp);
    }
    let caller = entries(envp);
    let search = search_path(caller.clone());
    let (mut count, mut bytes) = (1, 0);
    config::plan(
        caller.clone(),
        vars.iter(),
        lib,
        |e| names_lib(e, lib, search),
        |p| {
            count += 1;
            if let Part::Preload { .. } = p {
                bytes += p.bytes(lib) + 1;
            }
        },
    );
    let words = count + bytes.div_ceil(8);
    let mut stack = [0usize; STACK_WORDS];
    let mut spare = (words > STACK_WORDS).then(|| Spare::take(words));
    let buffer: &mut [usize] = match &mut spare {
        None => &mut stack[..words],
        Some(Some(pages)) => pages.words(words),
        Some(None) => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::ENOMEM };
            return no_memory;
        }
    };
    let (pointers, text) = buffer.split_at_mut(count);
    // SAFETY: `text` is `bytes` bytes (at least) of this call's buffer, seen as bytes.
    let text =
        unsafe { std::slice::from_raw_parts_mut(text.as_mut_ptr().cast::<u8>(), text.len() * 8) };
    let (mut i, mut at) = (0, 0);
    config::plan(
        caller,
        vars.iter(),
        lib,
        |e| names_lib(e, lib, search),
        |p| {
            let ptr = match p {
                // Each is a NUL-terminated string where it lies: the caller's entry, or
                // this process's copy of its variable.
                Part::Kept(e) | Part::Inherited(e) => e.as_ptr(),
                Part::Preload { .. } => {
                    let start = at;
                    at += config::write_part(p, lib, &mut text[at..]);
                    text[start..].as_ptr()
                }
            };
            if i + 1 < count {
                pointers[i] = ptr as usize;
                i += 1;
            }
        },
    );
    pointers[i] = 0;
    exec(pointers.as_ptr().cast())
}
