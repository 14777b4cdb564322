//! The exported `dlopen` and `dlmopen`: every call goes to glibc's by a tail jump (glibc
//! then sees the original caller, whose search path and namespace a bare name is looked
//! up in), except one asking for `RTLD_DEEPBIND` in the process's base namespace: that
//! library is opened here and bound to the hooks as a library opened without the flag
//! is (`rebind`), else the CUDA calls it makes would bypass the cap.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::entry::{Decision, tail_jump_entry};
use crate::log::log;
use crate::resolve::{DlopenFn, glibc_loader_function, real_dlmopen, real_dlopen, real_dlsym};
use crate::table::row_named;

/// Decides a `dlopen` call made from `caller` (its return address).
extern "C" fn dlopen_decide(
    file: *const c_char,
    flags: c_int,
    _none: usize,
    caller: *mut c_void,
) -> Decision {
    let Some(real) = real_dlopen() else {
        return Decision::answer(null_mut());
    };
    decide_open(real as *mut c_void, file, flags, caller)
}

/// Decides a `dlmopen` call made from `caller`: in the base namespace (`LM_ID_BASE`) as
/// `dlopen` (glibc's `dlmopen` there is its `dlopen`); in another, glibc's, untouched
/// (a namespace of its own loads its own libcuda, which the shim does not reach: the
/// threat model's residual), said once in a warning line.
extern "C" fn dlmopen_decide(
    lmid: libc::Lmid_t,
    file: *const c_char,
    flags: c_int,
    caller: *mut c_void,
) -> Decision {
    let Some(real) = real_dlmopen() else {
        return Decision::answer(null_mut());
    };
    if lmid != libc::LM_ID_BASE {
        say_uncapped_namespace(file);
        return Decision::forward(real);
    }
    decide_open(real, file, flags, caller)
}

/// Says, once a process, that a library opened in a namespace other than the base one
/// (`dlmopen`) is out of the cap's reach: a driver it loads there is the namespace's own.
fn say_uncapped_namespace(file: *const c_char) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Relaxed) {
        return;
    }
    // No panic crosses into the caller.
    let _ = std::panic::catch_unwind(|| {
        let name = match file.is_null() {
            true => "the program".into(),
            // SAFETY: dlmopen's contract: a NUL-terminated name.
            false => unsafe { CStr::from_ptr(file) }.to_string_lossy(),
        };
        log!(
            Warn,
            "dlmopen opens {name} in a namespace of its own, where gpucap is not: a CUDA \
             driver loaded there is not capped (dlopen, or dlmopen with LM_ID_BASE, is)"
        );
    });
}

/// Forwards an open to glibc's `forward` (its `dlopen`, or its `dlmopen` in the base
/// namespace: the same arguments after the first), unless it asks for `RTLD_DEEPBIND`:
/// that one is opened here.
fn decide_open(
    forward: *mut c_void,
    file: *const c_char,
    flags: c_int,
    caller: *mut c_void,
) -> Decision {
    if flags & libc::RTLD_DEEPBIND == 0 || file.is_null() {
        return Decision::forward(forward);
    }
    let Some(real) = real_dlopen() else {
        return Decision::answer(null_mut());
    };
    // glibc's dlopen opens files inside this library's frames: no cancellation there
    // (`cancel.rs`).
    let _held = crate::cancel::NoCancel::hold();
    // No panic crosses into the caller: one is taken for a library that cannot be opened.
    let value = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open_deep(real, file, flags, caller)
    }))
    .unwrap_or(null_mut());
    Decision::answer(value)
}

/// Opens `file` with `flags` (which hold `RTLD_DEEPBIND`) as `caller` would have, and
/// binds what it loaded to the hooks.
fn open_deep(
    real: DlopenFn,
    file: *const c_char,
    flags: c_int,
    caller: *mut c_void,
) -> *mut c_void {
    // SAFETY: dlopen's contract: a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(file) };
    // Loaded already (by this name or its soname): glibc's answer whoever asks, with no
    // relocation to make.
    // SAFETY: glibc's dlopen with the caller's name; RTLD_NOLOAD loads nothing.
    let h = unsafe { real(file, flags | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        return h;
    }
    let path = if name.to_bytes().contains(&b'/') {
        None
    } else {
        found_for(caller, name)
    };
    let before = crate::rebind::objects();
    // SAFETY: glibc's dlopen with a NUL-terminated name (the caller's, or the file its
    // search path finds).
    let h = unsafe { real(path.as_ref().map_or(file, |p| p.as_ptr()), flags) };
    if h.is_null() {
        return h;
    }
    let (set, failed) = crate::rebind::rebind_since(&before, ours);
    let shown = path.as_deref().unwrap_or(name).to_string_lossy();
    if failed > 0 {
        log!(
            Warn,
            "{shown} was opened with RTLD_DEEPBIND and {failed} of its references to the \
             driver could not be bound to gpucap (a page that could not be made \
             writable): its calls through them are not counted"
        );
    } else if set > 0 {
        log!(
            Debug,
            "{shown} was opened with RTLD_DEEPBIND: {set} of its references to the driver \
             bound to gpucap"
        );
    }
    h
}

/// This library's export that a reference to `name` binds to in a library opened
/// without `RTLD_DEEPBIND`, where it is one of ours: a hook, or one of the loader's names
/// (`resolve`'s list), read from this library's symbol table as `dlsym` answers them.
fn ours(name: &[u8]) -> Option<usize> {
    match row_named(name) {
        Some(h) => Some(h.hook as usize),
        None if glibc_loader_function(name).is_some() => crate::elf::own_function(name),
        None => None,
    }
}

/// Where `caller`'s own search path (its `DT_RPATH` or `DT_RUNPATH`, which a call from
/// here would not search) finds `name` first; None where the first directory holding it
/// is one this library's search has too (glibc's search from here then finds the same
/// file: the directories before it are the caller's as well), or where none holds it.
fn found_for(caller: *mut c_void, name: &CStr) -> Option<CString> {
    let theirs = search_dirs(caller)?;
    let mine = search_dirs(found_for as *mut c_void).unwrap_or_default();
    for dir in theirs {
        let mut p = dir.clone();
        p.push(b'/');
        p.extend_from_slice(name.to_bytes());
        let p = CString::new(p).ok()?;
        // SAFETY: a NUL-terminated path; raw call, as the shim imports no `access`.
        let there = unsafe {
            libc::syscall(
                libc::SYS_faccessat,
                libc::AT_FDCWD,
                p.as_ptr(),
                libc::F_OK,
                0,
            )
        } == 0;
        if there {
            return (!mine.contains(&dir)).then_some(p);
        }
    }
    None
}

/// The directories glibc searches for a bare name opened from the object holding `addr`,
/// in order (`dlinfo`'s `RTLD_DI_SERINFO`; its cache of `ld.so.conf` aside).
fn search_dirs(addr: *mut c_void) -> Option<Vec<Vec<u8>>> {
    type Dladdr1 =
        unsafe extern "C" fn(*const c_void, *mut libc::Dl_info, *mut *mut c_void, c_int) -> c_int;
    type Dlinfo = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
    let dlsym = real_dlsym()?;
    // Looked up here, not imported: each import is a lookup at every process's start.
    // SAFETY: glibc's dlsym with constant NUL-terminated names.
    let (dladdr1, dlinfo) = unsafe {
        (
            dlsym(libc::RTLD_DEFAULT, c"dladdr1".as_ptr()),
            dlsym(libc::RTLD_DEFAULT, c"dlinfo".as_ptr()),
        )
    };
    if dladdr1.is_null() || dlinfo.is_null() {
        return None;
    }
    // SAFETY: glibc's functions of these signatures, found above.
    let (dladdr1, dlinfo) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Dladdr1>(dladdr1),
            std::mem::transmute::<*mut c_void, Dlinfo>(dlinfo),
        )
    };
    const RTLD_DL_LINKMAP: c_int = 2;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut map: *mut c_void = null_mut();
    // SAFETY: an address, a writable result and a pointer for the link map.
    if unsafe { dladdr1(addr, info.as_mut_ptr(), &mut map, RTLD_DL_LINKMAP) } == 0 || map.is_null()
    {
        return None;
    }
    // Dl_serinfo: its size in bytes and count, then `count` Dl_serpath entries (a name
    // and flags each), the names' bytes after them.
    #[repr(C)]
    struct Serpath {
        name: *const c_char,
        flags: u32,
    }
    #[repr(C)]
    struct Serinfo {
        size: usize,
        count: u32,
        paths: [Serpath; 0],
    }
    let mut head = Serinfo {
        size: 0,
        count: 0,
        paths: [],
    };
    // SAFETY: a link map is a handle; the header to fill.
    if unsafe {
        dlinfo(
            map,
            libc::RTLD_DI_SERINFOSIZE,
            (&mut head as *mut Serinfo).cast(),
        )
    } != 0
    {
        return None;
    }
    // Room for what it said, aligned for the header.
    let mut buf = vec![0u64; head.size.div_ceil(8).max(2)];
    let whole = buf.as_mut_ptr() as *mut Serinfo;
    // SAFETY: `buf` holds `head.size` bytes, aligned; glibc fills it after the header.
    unsafe {
        (*whole).size = head.size;
        (*whole).count = head.count;
        if dlinfo(map, libc::RTLD_DI_SERINFO, whole.cast()) != 0 {
            return None;
        }
        let paths = std::slice::from_raw_parts((*whole).paths.as_ptr(), (*whole).count as usize);
        Some(
            paths
                .iter()
                .filter(|p| !p.name.is_null())
                .map(|p| CStr::from_ptr(p.name).to_bytes().to_vec())
                .collect(),
        )
    }
}

// The exported `dlopen` and `dlmopen`: glibc then sees the original return address (the
// caller whose search path and namespace a name is looked up in).
tail_jump_entry!(dlopen(file: *const c_char, flags: c_int) -> *mut c_void => dlopen_decide);
tail_jump_entry!(dlmopen(lmid: libc::Lmid_t, file: *const c_char, flags: c_int) -> *mut c_void => dlmopen_decide);
