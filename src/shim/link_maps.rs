//! The loader's list of objects read without its locks, for the `exec` hooks: they may run
//! in a child made by `fork`, `vfork`, `forkpty` or a raw `clone` while another thread of
//! its parent held the loader's lock (copied held into the child), or from a signal
//! handler. Asking the loader there (`dl_iterate_phdr`, `dladdr`) hung such a child; a
//! lookup made before the `fork` instead (an exported `fork`, a fork handler) hung
//! programs whose own threads take a lock of theirs inside the loader's walk.
//!
//! The list is the link maps the loader publishes for debuggers (`_r_debug`, which the
//! main program's `DT_DEBUG` entry points to), read in order; its first objects (the
//! program, the preloads, the C library) are never unloaded, and a lookup stops at the
//! first definition after this library, which the C library gives before any object
//! opened later is reached.

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

unsafe extern "C" {
    /// The loader's list for debuggers (`<link.h>`; exported by `ld.so`).
    #[link_name = "_r_debug"]
    static R_DEBUG: RDebug;

    /// This library's own dynamic section (the static linker's symbol): how its link map
    /// is told from the others.
    #[link_name = "_DYNAMIC"]
    static OWN_DYNAMIC: u8;
}

/// The first link map: the loader's `r_debug`, where the main program's `DT_DEBUG` entry
/// points to (its own export, bound when this library was loaded: a program linked
/// without `DT_DEBUG`, or started by naming the loader, is read as any other); None
/// before the loader has filled it.
fn first() -> Option<*const LinkMap> {
    // SAFETY: the loader's `r_debug`, filled before any constructor ran.
    let map = unsafe { R_DEBUG.map };
    (!map.is_null()).then_some(map)
}

/// Calls `each(map, whether it is this library)` for the loader's objects in order until
/// it answers false, this library's map and those loaded at the start (the loader's own
/// map, at `r_debug`'s `r_ldbase`, is the last of them) only: an object opened later may be closed by
/// another thread meanwhile. False where the list cannot be read.
fn walk(mut each: impl FnMut(&LinkMap, bool) -> bool) -> bool {
    let Some(mut m) = first() else {
        return false;
    };
    // The address of a symbol of this library, never read.
    let own = &raw const OWN_DYNAMIC as usize;
    // SAFETY: the loader's `r_debug`, filled before any constructor ran.
    let loader = unsafe { R_DEBUG.ldbase };
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
