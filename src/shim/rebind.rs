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

use std::ffi::{CStr, c_char, c_int, c_void};

/// What the dynamic section of a loaded object says, as far as its relocations go.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// One relocation with an addend (x86_64 and aarch64 use no other kind).
#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;

/// The two kinds of relocation that fill a slot with a function's address: a call
/// through the PLT, and a function pointer taken (`&dlsym`).
#[cfg(target_arch = "x86_64")]
const SLOT_KINDS: [u32; 2] = [6, 7]; // R_X86_64_GLOB_DAT, R_X86_64_JUMP_SLOT
#[cfg(target_arch = "aarch64")]
const SLOT_KINDS: [u32; 2] = [1025, 1026]; // R_AARCH64_GLOB_DAT, R_AARCH64_JUMP_SLOT

/// The loaded objects, by base address.
pub fn objects() -> Vec<usize> {
    let mut found: Vec<usize> = Vec::new();
    each_object(|info| found.push(info.dlpi_addr as usize));
    found
}

/// Sets each slot of every object loaded since `before` (from [`objects`]) whose name
/// `target` gives an address to that address; how many slots were set, and how many
/// could not be (a page that would not be made writable). This library's own slots stay.
pub fn rebind_since(before: &[usize], target: impl Fn(&[u8]) -> Option<usize>) -> (usize, usize) {
    let own = crate::resolve::own_base();
    let mut counts = (0, 0);
    each_object(|info| {
        let base = info.dlpi_addr as usize;
        if base == own || before.contains(&base) {
            return;
        }
        // SAFETY: the loader's program headers of a loaded object, alive during the
        // iteration, `dlpi_phnum` of them.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let (set, failed) = rebind_object(base, phdrs, &target);
        counts.0 += set;
        counts.1 += failed;
    });
    counts
}

/// Whether the object holding the code address `addr` comes after this library in the
/// loader's list of loaded objects (the program, the preloads, their dependencies, then
/// what was opened since) and does not hold `not_in` (a function this library forwards
/// to): `dlsym(RTLD_NEXT)` from such an object searches past this library (to the
/// driver's own function, for a driver name). No allocation.
pub fn loaded_after_this_library(addr: usize, not_in: usize) -> bool {
    let own = loaded_after_this_library as *const () as usize;
    let (mut seen_own, mut after) = (false, false);
    each_object(|info| {
        // SAFETY: the loader's program headers of a loaded object, alive during the
        // iteration, `dlpi_phnum` of them.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let holds = |a: usize| {
            phdrs.iter().any(|ph| {
                let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
                ph.p_type == libc::PT_LOAD && (start..start + ph.p_memsz as usize).contains(&a)
            })
        };
        if holds(own) {
            seen_own = true;
        } else if seen_own && holds(addr) && !holds(not_in) {
            after = true;
        }
    });
    after
}

/// Calls `f` with each loaded object (the loader's lock is held meanwhile).
fn each_object(mut f: impl FnMut(&libc::dl_phdr_info)) {
    unsafe extern "C" fn one(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut dyn FnMut` below, `info` the loader's entry.
        let (f, info) = unsafe {
            (
                &mut *(data as *mut &mut dyn FnMut(&libc::dl_phdr_info)),
                &*info,
            )
        };
        f(info);
        0
    }
    let mut f: &mut dyn FnMut(&libc::dl_phdr_info) = &mut f;
    // SAFETY: a callback of the loader's signature and a pointer to `f`, which outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(one), &mut f as *mut _ as *mut c_void) };
}

/// Sets the slots of one object (loaded at `base`, with program headers `phdrs`).
fn rebind_object(
    base: usize,
    phdrs: &[libc::Elf64_Phdr],
    target: &impl Fn(&[u8]) -> Option<usize>,
) -> (usize, usize) {
    // The loader has made most of the dynamic section's addresses absolute in place;
    // where it has not (a read-only section), they are offsets from the base.
    let at = |v: u64| {
        if (v as usize) < base {
            base + v as usize
        } else {
            v as usize
        }
    };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else {
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
    let (mut symtab, mut strtab) = (0usize, 0usize);
    let mut tables = [(0usize, 0usize); 2]; // (DT_RELA, DT_RELASZ), (DT_JMPREL, DT_PLTRELSZ)
    let mut d = (base + dynamic.p_vaddr as usize) as *const Dyn;
    loop {
        // SAFETY: the object's dynamic section, ended by DT_NULL.
        let e = unsafe { &*d };
        match e.tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = at(e.val),
            DT_STRTAB => strtab = at(e.val),
            DT_RELA => tables[0].0 = at(e.val),
            DT_RELASZ => tables[0].1 = e.val as usize,
            DT_JMPREL => tables[1].0 = at(e.val),
            DT_PLTRELSZ => tables[1].1 = e.val as usize,
            _ => {}
        }
        // SAFETY: within the section: the entry read was not DT_NULL.
        d = unsafe { d.add(1) };
    }
    if symtab == 0 || strtab == 0 {
        return (0, 0);
    }
    let mut counts = (0, 0);
    for (table, bytes) in tables {
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
            let sym = (r.info >> 32) as usize;
            // SAFETY: the symbol the relocation names (an Elf64_Sym, whose first word
            // is its name's offset in the string table).
            let name_at =
                unsafe { *((symtab + sym * std::mem::size_of::<libc::Elf64_Sym>()) as *const u32) };
            // SAFETY: a NUL-terminated name in the object's string table.
            let name = unsafe { CStr::from_ptr((strtab + name_at as usize) as *const c_char) };
            let Some(to) = target(name.to_bytes()) else {
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
