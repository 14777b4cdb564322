//! Binding a library opened with `RTLD_DEEPBIND` to the hooks as any other library is.
//!
//! A library opened with `RTLD_DEEPBIND` (Julia's default for every library it loads;
//! some plugin hosts') looks its references up in its own dependencies before the
//! process's global scope, where this library comes first: its `cuMemAlloc_v2` (linked
//! with `-lcuda`) is the driver's, and its `dlsym` (the C library's, a dependency of
//! every library) hands the CUDA runtime linked into it (nvcc's default) the driver's
//! functions. Both went past the cap: 700 MiB served twice under a 1 GiB cap.
//!
//! So, once such a library is loaded, each object it brought in has the slots of its
//! global offset table that name a hooked symbol, `dlsym` or `dlopen` set to this
//! library's export of that name (`dlopen.rs` says which): what the same reference holds
//! in a library opened without the flag. Every other reference keeps the library's own
//! scope (the reason a program asks for the flag). Outside the `dlsym` path: it may
//! allocate.

use std::ffi::c_int;

use crate::elf::{Dynamic, each_object, holds};

/// One relocation with an addend (x86_64 and aarch64 use no other kind).
#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

/// The two kinds of relocation that fill a slot with a function's address: a call
/// through the PLT, and a function pointer taken (`&dlsym`).
#[cfg(target_arch = "x86_64")]
const SLOT_KINDS: [u32; 2] = [6, 7]; // R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT
#[cfg(target_arch = "aarch64")]
const SLOT_KINDS: [u32; 2] = [1025, 1026]; // R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT

/// The loaded objects, by base address.
pub fn objects() -> Vec<usize> {
    let mut found: Vec<usize> = Vec::new();
    each_object(|info, _| found.push(info.dlpi_addr as usize));
    found
}

/// Sets each slot of every object loaded since `before` (from [`objects`]) whose name
/// `target` gives an address to that address; how many slots were set, and how many
/// could not be (a page that would not be made writable). This library's own slots stay.
pub fn rebind_since(before: &[usize], target: impl Fn(&[u8]) -> Option<usize>) -> (usize, usize) {
    let own = crate::resolve::own_base();
    let mut counts = (0, 0);
    each_object(|info, phdrs| {
        let base = info.dlpi_addr as usize;
        if base == own || before.contains(&base) {
            return;
        }
        let (set, failed) = rebind_object(base, phdrs, &target);
        counts.0 += set;
        counts.1 += failed;
    });
    counts
}

/// Whether the object holding the code address `addr` comes after this library in the
/// loader's list of loaded objects (the program, the preloads, their dependencies, then
/// what was opened since) and does not hold `not_in` (a function this library forwards
/// to; 0: none): `dlsym(RTLD_NEXT)` from such an object searches past this library (to
/// the driver's own function, for a driver name; the C library's, for `dlsym`). No
/// allocation.
pub fn loaded_after_this_library(addr: usize, not_in: usize) -> bool {
    let own = loaded_after_this_library as *const () as usize;
    let (mut seen_own, mut after) = (false, false);
    each_object(|info, phdrs| {
        if holds(info, phdrs, own) {
            seen_own = true;
        } else if seen_own && holds(info, phdrs, addr) && !holds(info, phdrs, not_in) {
            after = true;
        }
    });
    after
}

/// Sets the slots of one object (loaded at `base`, with program headers `phdrs`).
fn rebind_object(
    base: usize,
    phdrs: &[libc::Elf64_Phdr],
    target: &impl Fn(&[u8]) -> Option<usize>,
) -> (usize, usize) {
    let Some(dynamic) = Dynamic::of(base, phdrs) else {
        return (0, 0);
    };
    // What the loader made read-only after relocating: the pages the RELRO segment
    // covers (glibc leaves the page it ends within writable).
    let page = page_size();
    let relro = phdrs
        .iter()
        .find(|p| p.p_type == libc::PT_GNU_RELRO)
        .map(|p| {
            let start = base + p.p_vaddr as usize;
            start & !(page - 1)..(start + p.p_memsz as usize) & !(page - 1)
        });
    let mut counts = (0, 0);
    for (table, bytes) in [dynamic.rela, dynamic.jmprel] {
        if table == 0 {
            continue;
        }
        // SAFETY: the object's relocation table, `bytes` long.
        let relas = unsafe {
            std::slice::from_raw_parts(table as *const Rela, bytes / std::mem::size_of::<Rela>())
        };
        for r in relas {
            if !SLOT_KINDS.contains(&(r.info as u32)) {
                continue;
            }
            let Some(to) = target(dynamic.name((r.info >> 32) as usize)) else {
                continue;
            };
            let slot = (base + r.offset as usize) as *mut usize;
            match set(
                slot,
                to,
                relro.as_ref().is_some_and(|r| r.contains(&(slot as usize))),
            ) {
                Some(true) => counts.0 += 1,
                Some(false) => {}
                None => counts.1 += 1,
            }
        }
    }
    counts
}

fn page_size() -> usize {
    // SAFETY: getauxval reads the process's auxiliary vector.
    (unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize).max(4096)
}

/// Writes `target` into `slot`, making its page writable for the write where the loader
/// made it read-only (`relro`): Some(true) where it changed, Some(false) where it held
/// `target` already, None where the page could not be made writable.
fn set(slot: *mut usize, target: usize, relro: bool) -> Option<bool> {
    // SAFETY: a slot of a loaded object's global offset table, readable.
    if unsafe { slot.read_volatile() } == target {
        return Some(false);
    }
    let page = page_size();
    let start = slot as usize & !(page - 1);
    let protect = |prot: c_int| {
        // SAFETY: the page of a loaded object's slot; raw call, as the shim imports no
        // `mprotect`.
        unsafe { libc::syscall(libc::SYS_mprotect, start, page, prot) == 0 }
    };
    if relro && !protect(libc::PROT_READ | libc::PROT_WRITE) {
        return None;
    }
    // SAFETY: the slot, writable now.
    unsafe { slot.write_volatile(target) };
    if relro {
        protect(libc::PROT_READ);
    }
    Some(true)
}
