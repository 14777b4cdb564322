//! The loader's list of objects read without its locks, for the `exec` hooks: they may run
//! in a child made by `fork`, `vfork`, `forkpty` or a raw `clone` while another thread of
//! its parent held the loader's lock (copied held into the child), or from a signal
//! handler. Asking the loader there (`dl_iterate_phdr`, `dladdr`) hung such a child; a
//! lookup made before the `fork` instead (an exported `fork`, a fork handler) hung
//! programs whose own threads take a lock of theirs inside the loader's walk.
//!
//! The list is the link maps the loader publishes for debuggers (`r_debug`, which the
//! main program's `DT_DEBUG` entry points to, else the loader's `_r_debug`), read in
//! order; its first objects (the program, the preloads, the C library) are never
//! unloaded, and a lookup stops at the first definition after this library, which the C
//! library gives before any object opened later is reached.

use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicUsize, Ordering::*};

use crate::elf::Dynamic;

/// `struct link_map`'s public part (glibc's `<link.h>`).
#[repr(C)]
struct LinkMap {
    addr: usize,
    name: *const c_char,
    ld: usize,
    next: *const LinkMap,
    prev: *const LinkMap,
}

/// `struct r_debug` (glibc's `<link.h>`).
#[repr(C)]
struct RDebug {
    version: i32,
    map: *const LinkMap,
    brk: usize,
    state: i32,
    /// The loader's own base: its link map's `l_addr` (`AT_BASE`, which is 0 where the
    /// loader was started by name).
    ldbase: usize,
}

const DT_DEBUG: i64 = 21;

unsafe extern "C" {
    /// This library's own dynamic section (the static linker's symbol): how its link map
    /// is told from the others.
    #[link_name = "_DYNAMIC"]
    static OWN_DYNAMIC: u8;
}

/// The address of the loader's `r_debug` as found at this library's load
/// ([`find_at_load`]); 0 before, or where it was not found.
static FOUND_AT_LOAD: AtomicUsize = AtomicUsize::new(0);

/// The loader's `r_debug`: where the main program's `DT_DEBUG` entry points, else (a
/// program linked without one) the loader's own export `_r_debug`, looked up in the
/// loader at `AT_BASE` (not imported: a symbol more for the loader to bind at every
/// start), else as found at this library's load. None where none is there.
fn r_debug() -> Option<&'static RDebug> {
    let r = match FOUND_AT_LOAD.load(Acquire) {
        0 => from_dt_debug().or_else(from_loader)?,
        r => r,
    };
    // SAFETY: the loader's `r_debug`, filled before any constructor ran, alive for the
    // process.
    Some(unsafe { &*(r as *const RDebug) })
}

/// At this library's load (its `.init_array` entry, no fork copied into a child yet
/// from its own thread): finds the loader's `r_debug` once for the walks to come, and
/// where neither the program's `DT_DEBUG` nor `AT_BASE` leads to it (a program linked
/// without `DT_DEBUG` and started by naming the loader, where `AT_BASE` is 0), asks the
/// loader, this once, for the object that defines both `_r_debug` and `_dl_debug_state`
/// (the loader: a sanitizer's runtime defines `__tls_get_addr` too, and a program may
/// define an `_r_debug` of its own) and takes its `_r_debug`.
pub fn find_at_load() {
    let r = from_dt_debug().or_else(from_loader).or_else(|| {
        let mut found = None;
        crate::elf::each_object(|info, phdrs| {
            if found.is_none()
                && let Some(d) = Dynamic::of(info.dlpi_addr as usize, phdrs)
                && d.function(b"_dl_debug_state").is_some()
            {
                found = d.object(b"_r_debug");
            }
        });
        found
    });
    FOUND_AT_LOAD.store(r.unwrap_or(0), Release);
}

/// The main program's `DT_DEBUG` value (None where it has none, or it is 0).
fn from_dt_debug() -> Option<usize> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let (phdr, phnum) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR) as usize,
            libc::getauxval(libc::AT_PHNUM) as usize,
        )
    };
    if phdr == 0 || phnum == 0 {
        return None;
    }
    // SAFETY: the auxiliary vector's program headers of the main program, mapped.
    let phdrs = unsafe { std::slice::from_raw_parts(phdr as *const libc::Elf64_Phdr, phnum) };
    let bias = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_PHDR)
        .map_or(0, |p| phdr.wrapping_sub(p.p_vaddr as usize));
    let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    let mut e = bias.wrapping_add(dynamic.p_vaddr as usize) as *const [i64; 2];
    loop {
        // SAFETY: the main program's dynamic section, ended by DT_NULL.
        let [tag, val] = unsafe { *e };
        match tag {
            0 => return None,
            DT_DEBUG if val != 0 => return Some(val as usize),
            _ => {}
        }
        // SAFETY: within the section: the entry read was not DT_NULL.
        e = unsafe { e.add(1) };
    }
}

/// The loader's `_r_debug`, from its dynamic symbols (the loader at `AT_BASE`, mapped
/// whole with its ELF header).
fn from_loader() -> Option<usize> {
    // SAFETY: getauxval only reads the auxiliary vector.
    let base = unsafe { libc::getauxval(libc::AT_BASE) } as usize;
    if base == 0 {
        return None;
    }
    // SAFETY: the loader's ELF header and program headers, mapped at its base.
    let phdrs = unsafe {
        let header = &*(base as *const libc::Elf64_Ehdr);
        std::slice::from_raw_parts(
            (base + header.e_phoff as usize) as *const libc::Elf64_Phdr,
            usize::from(header.e_phnum),
        )
    };
    Dynamic::of(base, phdrs)?.object(b"_r_debug")
}

/// The first link map (None where the loader's `r_debug` cannot be found, or holds none).
fn first() -> Option<*const LinkMap> {
    let map = r_debug()?.map;
    (!map.is_null()).then_some(map)
}

/// Calls `each(map, whether it is this library)` for the loader's objects in order until
/// it answers false, this library's map and those loaded at the start (the loader's own
/// map, at `r_debug`'s `r_ldbase`, is the last of them) only: an object opened later may
/// be closed by another thread meanwhile. False where the list cannot be read.
fn walk(mut each: impl FnMut(&LinkMap, bool) -> bool) -> bool {
    let Some(mut m) = first() else {
        return false;
    };
    // The address of a symbol of this library, never read.
    let own = &raw const OWN_DYNAMIC as usize;
    let loader = r_debug().map_or(0, |r| r.ldbase);
    let mut past_start = false;
    while !m.is_null() {
        // SAFETY: a link map of the loader's list (see the module's doc).
        let map = unsafe { &*m };
        let is_own = map.ld == own;
        if (!past_start || is_own) && !each(map, is_own) {
            break;
        }
        past_start |= loader != 0 && map.addr == loader;
        m = map.next;
    }
    true
}

/// The first definition of the function `name` after this library in the loader's list,
/// else the first before it, other copies of this library passed over
/// ([`crate::elf::next_function`]'s rule), read without the loader's locks; None where
/// there is none or the list cannot be read.
pub fn next_function(name: &[u8]) -> Option<usize> {
    let (mut seen_own, mut after, mut before) = (false, None, None);
    walk(|map, own| {
        if own {
            seen_own = true;
            return true;
        }
        if map.ld == 0 {
            return true;
        }
        // SAFETY: the map's dynamic section, mapped while the object is.
        let Some(d) = (unsafe { Dynamic::at(map.addr, map.ld) }) else {
            return true;
        };
        if crate::elf::is_copy(&d) {
            crate::elf::OTHER_COPY.store(true, Relaxed);
            return true;
        }
        if seen_own {
            after = d.function(name);
            return after.is_none();
        }
        if before.is_none() {
            before = d.function(name);
        }
        true
    });
    after.or(before)
}

/// This library's path, as the loader named it (its link map's name).
pub fn own_name() -> Option<&'static [u8]> {
    let mut name = None;
    walk(|map, own| {
        if own && !map.name.is_null() {
            // SAFETY: the loader's NUL-terminated name of this library, alive while it is
            // loaded.
            name = Some(unsafe { CStr::from_ptr(map.name) }.to_bytes());
        }
        !own
    });
    name
}

/// A function of the C library found by name once, the first definition after this
/// library's ([`next_function`]): the cache of a hook that calls the function it exports.
pub struct Next {
    name: &'static [u8],
    at: AtomicUsize,
}

impl Next {
    pub const fn new(name: &'static [u8]) -> Next {
        Next {
            name,
            at: AtomicUsize::new(0),
        }
    }

    /// The function's address (found now where it was not yet), None where there is none:
    /// read without the loader's locks; where the list cannot be read so, asked of the
    /// loader.
    pub fn get(&self) -> Option<usize> {
        match self.at.load(Acquire) {
            0 => {
                // Asked of the loader only where its list cannot be read without it.
                let p = next_function(self.name).or_else(|| {
                    first()
                        .is_none()
                        .then(|| crate::elf::next_function(self.name))
                        .flatten()
                })?;
                self.at.store(p, Release);
                Some(p)
            }
            p => Some(p),
        }
    }
}
