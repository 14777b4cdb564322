//! Finding the real functions: glibc's `dlvsym` (from the loaded objects' symbol
//! tables) and `dlsym` (through it), handles of the
//! libcuda and NVML the program uses, a driver export by name, and where this
//! library itself lives. Runs on the `dlsym` path: no allocation, no locks, no
//! environment; state is lazily set atomics.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`. Called only from this library's own code, so its notion of
/// "the caller" (for `RTLD_NEXT`) is libgpucap itself.
static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

pub fn real_dlsym() -> Option<DlsymFn> {
    let p = glibc_next(&REAL_DLSYM, c"dlsym")?;
    // SAFETY: `p` is glibc's dlsym, whose signature DlsymFn is.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// glibc's `dlvsym`: the first definition after this library's, read from the loaded
/// objects' symbol tables, as this library exports a `dlvsym` of its own that its own
/// reference to the name binds to: from the loader's list read without its locks
/// (`link_maps`), else through `dl_iterate_phdr` (`elf`). Not `dl_iterate_phdr` first: a
/// library preloaded before this one that interposes on it and finds the C library's
/// with `dlsym(RTLD_NEXT)` made the two call each other until the stack ran out.
static REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

pub fn real_dlvsym() -> Option<DlvsymFn> {
    let mut p = REAL_DLVSYM.load(Acquire);
    if p.is_null() {
        p = crate::link_maps::next_function(b"dlvsym")
            .or_else(|| crate::elf::next_function(b"dlvsym"))? as *mut c_void;
        REAL_DLVSYM.store(p, Release);
    }
    // SAFETY: `p` is glibc's dlvsym, whose signature DlvsymFn is.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(p) })
}

/// The definition of `name` after this library's (glibc's), found with `dlvsym` once and
/// kept in `cache`.
fn glibc_next(cache: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> Option<*mut c_void> {
    let p = cache.load(Acquire);
    if !p.is_null() {
        return Some(p);
    }
    let dlvsym = real_dlvsym()?;
    let mut p = [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"]
        .iter()
        // SAFETY: glibc's dlvsym with NUL-terminated strings.
        .map(|v| unsafe { dlvsym(libc::RTLD_NEXT, name.as_ptr(), v.as_ptr()) })
        .find(|p| !p.is_null())?;
    // A second copy of this library after this one exports the name too (unversioned:
    // a lookup by version takes it); glibc's is the next one that is not a copy (the
    // check is a load where no copy was seen).
    if crate::elf::in_other_copy(p as usize) {
        p = crate::elf::next_function(name.to_bytes())? as *mut c_void;
    }
    cache.store(p, Release);
    Some(p)
}

pub type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// glibc's `dlopen` (this library exports its own: `dlopen.rs`). Called from this
/// library's code, glibc takes it for the caller: a bare name is searched for as this
/// library would (the program's `LD_LIBRARY_PATH`, the system's cache and folders).
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

pub fn real_dlopen() -> Option<DlopenFn> {
    let p = glibc_next(&REAL_DLOPEN, c"dlopen")?;
    // SAFETY: `p` is glibc's dlopen, whose signature DlopenFn is.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlopenFn>(p) })
}

/// glibc's `dlopen` of `name` with `flags`; null where there is none.
pub fn open_library(name: &std::ffi::CStr, flags: c_int) -> *mut c_void {
    match real_dlopen() {
        // SAFETY: glibc's dlopen with a NUL-terminated name.
        Some(dlopen) => unsafe { dlopen(name.as_ptr(), flags) },
        None => null_mut(),
    }
}

/// glibc's `dlmopen` (this library exports its own: `dlopen.rs`), to tail-jump to.
static REAL_DLMOPEN: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

pub fn real_dlmopen() -> Option<*mut c_void> {
    glibc_next(&REAL_DLMOPEN, c"dlmopen")
}

/// glibc's function of a loader name this library exports too (`dlsym`, `dlvsym`,
/// `dlopen`, `dlmopen`); None for any other name.
#[inline(always)] // every lookup asks: every other name is told in one comparison
pub fn glibc_loader_function(name: &[u8]) -> Option<*mut c_void> {
    if !name.starts_with(b"dl") {
        return None;
    }
    loader_function_named(name)
}

fn loader_function_named(name: &[u8]) -> Option<*mut c_void> {
    match name {
        b"dlsym" => glibc_next(&REAL_DLSYM, c"dlsym"),
        b"dlvsym" => real_dlvsym().map(|f| f as *mut c_void),
        b"dlopen" => glibc_next(&REAL_DLOPEN, c"dlopen"),
        b"dlmopen" => real_dlmopen(),
        _ => None,
    }
}

/// A handle to the libcuda the program uses, once one is known.
static LIBCUDA: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn libcuda() -> *mut c_void {
    let h = LIBCUDA.load(Acquire);
    if !h.is_null() {
        return h;
    }
    // Already loaded (linked, or dlopened even RTLD_LOCAL)? Take a reference to it;
    // else load it ourselves, as the program is evidently calling into CUDA.
    for flags in [libc::RTLD_LAZY | libc::RTLD_NOLOAD, libc::RTLD_LAZY] {
        for name in [c"libcuda.so.1", c"libcuda.so"] {
            let h = open_library(name, flags);
            if !h.is_null() {
                return match LIBCUDA.compare_exchange(null_mut(), h, AcqRel, Acquire) {
                    Ok(_) => h,
                    Err(other) => other,
                };
            }
        }
    }
    null_mut()
}

/// Whether the program has libcuda loaded, without ever loading it (an NVML-only
/// process must not get the driver API loaded by the shim).
pub fn cuda_loaded() -> bool {
    if !LIBCUDA.load(Acquire).is_null() {
        return true;
    }
    for name in [c"libcuda.so.1", c"libcuda.so"] {
        // RTLD_NOLOAD: it never loads anything.
        let h = open_library(name, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if !h.is_null() {
            if LIBCUDA
                .compare_exchange(null_mut(), h, AcqRel, Acquire)
                .is_err()
            {
                // SAFETY: the reference this dlopen took; another was kept first.
                unsafe { libc::dlclose(h) };
            }
            return true;
        }
    }
    false
}

/// A handle to the NVML library the program uses, once one is known. Never loaded by
/// the shim: NVML hooks run only in programs that loaded it.
static LIBNVML: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

fn libnvml() -> *mut c_void {
    let h = LIBNVML.load(Acquire);
    if !h.is_null() {
        return h;
    }
    // RTLD_NOLOAD: it never loads anything.
    let h = open_library(c"libnvidia-ml.so.1", libc::RTLD_LAZY | libc::RTLD_NOLOAD);
    if h.is_null() {
        return h;
    }
    match LIBNVML.compare_exchange(null_mut(), h, AcqRel, Acquire) {
        Ok(_) => h,
        Err(other) => other,
    }
}

/// Whether a symbol name is NVML's (`nvml…`) rather than the driver API's (`cu…`).
pub fn is_nvml(name: &[u8]) -> bool {
    name.starts_with(b"nvml")
}

/// The driver's export `name` (NUL-terminated), never one of our own exports. `nvml…`
/// names are looked up in NVML.
pub fn driver_symbol(name: &'static str) -> *mut c_void {
    let Some(dlsym) = real_dlsym() else {
        return null_mut();
    };
    let cname = name.as_ptr().cast::<c_char>();
    let h = if is_nvml(name.as_bytes()) {
        libnvml()
    } else {
        libcuda()
    };
    // SAFETY: real dlsym with a live handle (or RTLD_NEXT) and a NUL-terminated name.
    let mut p = if h.is_null() {
        null_mut()
    } else {
        unsafe { dlsym(h, cname) }
    };
    if p.is_null() || is_ours(p) {
        // SAFETY: as above; RTLD_NEXT from our own code finds the next definition.
        p = unsafe { dlsym(libc::RTLD_NEXT, cname) };
    }
    if is_ours(p) { null_mut() } else { p }
}

/// The loaded range of the driver's object and of NVML's (`[start, end)`, 0 to 0 until
/// one was seen), once a lookup answered a function in it.
static DRIVER_OBJECT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static NVML_OBJECT: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Whether `p`, a lookup's answer for a hooked name, is a function of the driver (or of
/// NVML, for an `nvml…` name): it lies in an object that defines `cuInit` (`nvmlInit`),
/// as the driver and a whole interposer of it do, not a library that defines the one
/// name for its own ends (a wrapper of it).
pub fn in_driver(nvml: bool, p: *mut c_void) -> bool {
    let (range, marker): (_, &[u8]) = match nvml {
        true => (&NVML_OBJECT, b"nvmlInit"),
        false => (&DRIVER_OBJECT, b"cuInit"),
    };
    let p = p as usize;
    let end = range[1].load(Acquire);
    if end != 0 && (range[0].load(Relaxed)..end).contains(&p) {
        return true;
    }
    let Some((start, end)) = crate::elf::object_defining(p, marker) else {
        return false;
    };
    range[0].store(start, Relaxed);
    range[1].store(end, Release);
    true
}

/// Keeps `handle`, on which a program found a hooked symbol, as the library to ask
/// (NVML's for an `nvml…` name, else libcuda's), unless one is known already.
pub fn remember_library(nvml: bool, handle: *mut c_void) {
    let library = if nvml { &LIBNVML } else { &LIBCUDA };
    let _ = library.compare_exchange(null_mut(), handle, AcqRel, Acquire);
}

/// Whether `p` lies in this library's mapped range, where glibc can say it (a
/// comparison once the range is known); None where it cannot.
pub fn in_this_library(p: *const c_void) -> Option<bool> {
    own_range().map(|(start, end)| (start..end).contains(&(p as usize)))
}

/// Whether `p` is in this library (one of our exports), asked of the loader: a
/// driver lookup must never come back to a hook. Only on first resolution of a name.
/// By this library's mapped range where glibc can say it (a comparison); else by
/// `dladdr` on both addresses, which searches the object's symbols (thousands of
/// instructions each, and a driver resolves dozens of names on first use).
fn is_ours(p: *mut c_void) -> bool {
    if p.is_null() {
        return false;
    }
    if let Some((start, end)) = own_range() {
        return (start..end).contains(&(p as usize));
    }
    object_of(p).is_some_and(|o| Some(o) == object_of(is_ours as *mut c_void))
}

/// Whether `p` is in the main program's mapped range. A program built without PIE that
/// takes a driver function's address makes its own PLT entry that function's canonical
/// address: the loader binds every reference to it there (this library's too, unless
/// bound at link time) and `dlsym` answers it. Such an address leads back to our hook,
/// so it is never the driver's function. No lock, no allocation: the range comes from
/// the program headers the kernel handed over (`getauxval`), read once.
pub fn in_main_program(p: *const c_void) -> bool {
    let p = p as usize;
    let end = MAIN_END.load(Acquire);
    if end != 0 {
        return (MAIN_START.load(Relaxed)..end).contains(&p);
    }
    if MAIN_ASKED.load(Acquire) {
        return false;
    }
    let found = main_program_range();
    if let Some((start, end)) = found {
        MAIN_START.store(start, Relaxed);
        MAIN_END.store(end, Release);
    }
    MAIN_ASKED.store(true, Release);
    found.is_some_and(|(start, end)| (start..end).contains(&p))
}

static MAIN_START: AtomicUsize = AtomicUsize::new(0);
static MAIN_END: AtomicUsize = AtomicUsize::new(0);
static MAIN_ASKED: AtomicBool = AtomicBool::new(false);

/// The main program's loaded range `[start, end)`: its `PT_LOAD` segments, moved by
/// the load bias that its `PT_PHDR` gives (None without one).
fn main_program_range() -> Option<(usize, usize)> {
    const PT_PHDR: u32 = 6;
    // SAFETY: getauxval only reads the auxiliary vector.
    let (phdr, phnum) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR),
            libc::getauxval(libc::AT_PHNUM),
        )
    };
    if phdr == 0 || phnum == 0 || phnum > 4096 {
        return None;
    }
    // SAFETY: AT_PHDR points at the main program's AT_PHNUM program headers, mapped for
    // the life of the process.
    let headers =
        unsafe { std::slice::from_raw_parts(phdr as *const libc::Elf64_Phdr, phnum as usize) };
    let bias = headers
        .iter()
        .find(|h| h.p_type == PT_PHDR)
        .map(|h| (phdr as usize).wrapping_sub(h.p_vaddr as usize))?;
    crate::elf::loaded_range(bias, headers)
}

/// This library's mapped range `[start, end)`, once found; `OWN_END` is 0 until then.
static OWN_START: AtomicUsize = AtomicUsize::new(0);
static OWN_END: AtomicUsize = AtomicUsize::new(0);
/// Set once the range was looked for, found or not (not: glibc before 2.35).
static OWN_ASKED: AtomicBool = AtomicBool::new(false);

/// glibc's `struct dl_find_object` (2.35+), with room to spare for later fields.
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *mut c_void,
    eh_frame: *mut c_void,
    reserved: [u64; 16],
}

type FindObject = unsafe extern "C" fn(*mut c_void, *mut DlFindObject) -> c_int;

/// This library's mapped range, by glibc's `_dl_find_object` (lock-free, no symbol
/// search; looked up at run time, so an older glibc still loads this library).
fn own_range() -> Option<(usize, usize)> {
    let end = OWN_END.load(Acquire);
    if end != 0 {
        return Some((OWN_START.load(Relaxed), end));
    }
    if OWN_ASKED.load(Acquire) {
        return None;
    }
    let found = find_own_range();
    if let Some((start, end)) = found {
        OWN_START.store(start, Relaxed);
        OWN_END.store(end, Release);
    }
    OWN_ASKED.store(true, Release);
    found
}

fn find_own_range() -> Option<(usize, usize)> {
    let dlsym = real_dlsym()?;
    // SAFETY: glibc's dlsym with a constant NUL-terminated name.
    let f = unsafe { dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: glibc's `_dl_find_object`, whose C signature FindObject is.
    let find = unsafe { std::mem::transmute::<*mut c_void, FindObject>(f) };
    let mut o = DlFindObject {
        flags: 0,
        map_start: null_mut(),
        map_end: null_mut(),
        link_map: null_mut(),
        eh_frame: null_mut(),
        reserved: [0; 16],
    };
    // SAFETY: an address of this library's code and a writable result of glibc's layout.
    let rc = unsafe { find(is_ours as *mut c_void, &mut o) };
    let (start, end) = (o.map_start as usize, o.map_end as usize);
    (rc == 0 && start < end).then_some((start, end))
}

/// This library's base address, as the loader lists its objects (0 where unknown).
pub fn own_base() -> usize {
    object_of(is_ours as *mut c_void).map_or(0, |b| b as usize)
}

/// The base address of the loaded object that holds `p`.
fn object_of(p: *mut c_void) -> Option<*mut c_void> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and fills `info`.
    if unsafe { libc::dladdr(p, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised (and was zeroed before).
    Some(unsafe { info.assume_init() }.dli_fbase)
}

/// The directories of the copies of this library the process has loaded, this one's
/// first (where a configuration file beside one of them is read). Allocates.
pub fn library_dirs() -> Vec<std::path::PathBuf> {
    // glibc's dlvsym looked for (once): the walk that sees a copy preloaded beside this one.
    let _ = real_dlvsym();
    let others = crate::elf::other_copies();
    let others = others
        .iter()
        .filter_map(|p| p.parent())
        .map(|d| d.to_path_buf());
    own_dir().into_iter().chain(others).collect()
}

/// The directory this library was loaded from, as the loader names it.
pub fn own_dir() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = own_dir as fn() -> Option<std::path::PathBuf> as *const std::ffi::c_void;
    // SAFETY: dladdr only reads `addr` (a function of this library) and fills `info`.
    if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised (and was zeroed before).
    let fname = unsafe { info.assume_init() }.dli_fname;
    if fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the loader's NUL-terminated name of this library, alive as
    // long as the library is loaded.
    let name = unsafe { std::ffi::CStr::from_ptr(fname) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    Some(
        path.parent()
            .unwrap_or(std::path::Path::new("."))
            .to_path_buf(),
    )
}
