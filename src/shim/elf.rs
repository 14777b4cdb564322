//! Reading the objects the loader has mapped: its list of them, each one's dynamic
//! section (the symbol and string tables, the relocations `rebind` rewrites), and a
//! function by name in an object's dynamic symbol table. Without asking the loader by
//! name: glibc's `dlvsym` is found so (this library exports one of its own, which every
//! reference to the name, this library's own included, binds to). No allocation.

use std::ffi::{CStr, c_char, c_int, c_void};

/// One entry of a dynamic section.
#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
/// Symbol types (`STT_OBJECT`, `STT_FUNC`).
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;

/// What an object's dynamic section says, as addresses in this process (0: absent).
#[derive(Default)]
pub struct Dynamic {
    pub base: usize,
    pub symtab: usize,
    pub strtab: usize,
    /// `DT_RELA` and its size in bytes.
    pub rela: (usize, usize),
    /// `DT_JMPREL` (the PLT's relocations) and its size in bytes.
    pub jmprel: (usize, usize),
    gnu_hash: usize,
    hash: usize,
    versym: usize,
}

impl Dynamic {
    /// The dynamic section of the object loaded at `base` with program headers `phdrs`;
    /// None where it has none, or no symbol or string table.
    pub fn of(base: usize, phdrs: &[libc::Elf64_Phdr]) -> Option<Dynamic> {
        let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
        // SAFETY: the object's mapped dynamic section, as its program header places it.
        unsafe { Dynamic::at(base, base + dynamic.p_vaddr as usize) }
    }

    /// The dynamic section at `section` of the object loaded at `base` (a link map's
    /// `l_addr` and `l_ld`); None where it has no symbol or string table.
    ///
    /// # Safety
    /// `section` is the object's mapped dynamic section, ended by `DT_NULL`.
    pub unsafe fn at(base: usize, section: usize) -> Option<Dynamic> {
        // The loader has made most of the dynamic section's addresses absolute in place;
        // where it has not (a read-only section: the vDSO's), they are offsets from the
        // base.
        let at = |v: u64| {
            if (v as usize) < base {
                base + v as usize
            } else {
                v as usize
            }
        };
        let mut d = Dynamic {
            base,
            ..Dynamic::default()
        };
        let mut e = section as *const Dyn;
        loop {
            // SAFETY: the object's dynamic section, ended by DT_NULL.
            let entry = unsafe { &*e };
            match entry.tag {
                DT_NULL => break,
                DT_SYMTAB => d.symtab = at(entry.val),
                DT_STRTAB => d.strtab = at(entry.val),
                DT_RELA => d.rela.0 = at(entry.val),
                DT_RELASZ => d.rela.1 = entry.val as usize,
                DT_JMPREL => d.jmprel.0 = at(entry.val),
                DT_PLTRELSZ => d.jmprel.1 = entry.val as usize,
                DT_GNU_HASH => d.gnu_hash = at(entry.val),
                DT_HASH => d.hash = at(entry.val),
                DT_VERSYM => d.versym = at(entry.val),
                _ => {}
            }
            // SAFETY: within the section: the entry read was not DT_NULL.
            e = unsafe { e.add(1) };
        }
        (d.symtab != 0 && d.strtab != 0).then_some(d)
    }

    /// The name of symbol `index`.
    pub fn name(&self, index: usize) -> &[u8] {
        let sym = self.symbol(index);
        // SAFETY: a NUL-terminated name in the object's string table.
        unsafe { CStr::from_ptr((self.strtab + sym.st_name as usize) as *const c_char) }.to_bytes()
    }

    fn symbol(&self, index: usize) -> &libc::Elf64_Sym {
        // SAFETY: an index the object's own hash table or relocations gave, within its
        // symbol table.
        unsafe { &*((self.symtab + index * std::mem::size_of::<libc::Elf64_Sym>()) as *const _) }
    }

    /// The address of the function `name` this object defines at its default version
    /// (what a reference without a version binds to), by its hash table.
    pub fn function(&self, name: &[u8]) -> Option<usize> {
        self.defined(name, STT_FUNC)
    }

    /// The address of the data object `name` this object defines at its default version.
    pub fn object(&self, name: &[u8]) -> Option<usize> {
        self.defined(name, STT_OBJECT)
    }

    /// The address of the symbol `name` of type `kind` this object defines at its
    /// default version, by its hash table.
    fn defined(&self, name: &[u8], kind: u8) -> Option<usize> {
        let fits = |i: usize| {
            self.defines(i, name, kind)
                .then(|| self.base + self.symbol(i).st_value as usize)
        };
        if self.gnu_hash != 0 {
            self.gnu_candidates(name, fits)
        } else if self.hash != 0 {
            self.sysv_candidates(name, fits)
        } else {
            None
        }
    }

    /// Whether symbol `i` is of type `kind` and named `name`, defined here at its default
    /// version.
    fn defines(&self, i: usize, name: &[u8], kind: u8) -> bool {
        const HIDDEN: u16 = 0x8000; // a version only `dlvsym` of it finds
        let sym = self.symbol(i);
        // SAFETY: the version table has an entry per symbol.
        let hidden =
            self.versym != 0 && unsafe { *((self.versym + 2 * i) as *const u16) } & HIDDEN != 0;
        sym.st_shndx != 0 && sym.st_info & 0xf == kind && !hidden && self.name(i) == name
    }

    /// The symbols GNU's hash table chains to `name`, until `fits` takes one.
    fn gnu_candidates(&self, name: &[u8], fits: impl Fn(usize) -> Option<usize>) -> Option<usize> {
        let h = name
            .iter()
            .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
        let words = self.gnu_hash as *const u32;
        // SAFETY: the table's header: buckets, first hashed symbol, bloom words, shift.
        let [nbuckets, symoffset, bloom_words] = unsafe { [0, 1, 2].map(|i| *words.add(i)) };
        if nbuckets == 0 {
            return None;
        }
        // SAFETY: the buckets follow the header (4 words) and the 64-bit bloom words.
        let buckets = unsafe { words.add(4 + 2 * bloom_words as usize) };
        // SAFETY: a bucket of the table.
        let mut i = unsafe { *buckets.add((h % nbuckets) as usize) } as usize;
        if i < symoffset as usize {
            return None;
        }
        // SAFETY: the chains follow the buckets, one per symbol from the first hashed.
        let chain = unsafe { buckets.add(nbuckets as usize) };
        loop {
            // SAFETY: within the chain, which ends at an entry with its low bit set.
            let c = unsafe { *chain.add(i - symoffset as usize) };
            if c | 1 == h | 1
                && let Some(p) = fits(i)
            {
                return Some(p);
            }
            if c & 1 != 0 {
                return None;
            }
            i += 1;
        }
    }

    /// The symbols the System V hash table chains to `name`, until `fits` takes one.
    fn sysv_candidates(&self, name: &[u8], fits: impl Fn(usize) -> Option<usize>) -> Option<usize> {
        let h = name.iter().fold(0u32, |h, &c| {
            let h = (h << 4).wrapping_add(c as u32);
            (h ^ ((h & 0xf000_0000) >> 24)) & 0x0fff_ffff
        });
        let words = self.hash as *const u32;
        // SAFETY: the table's header: its bucket and chain counts.
        let [nbucket, nchain] = unsafe { [0, 1].map(|i| *words.add(i)) };
        if nbucket == 0 {
            return None;
        }
        // SAFETY: a bucket of the table (after the two header words).
        let mut i = unsafe { *words.add(2 + (h % nbucket) as usize) };
        let mut steps = 0;
        while i != 0 && i < nchain && steps < nchain {
            if let Some(p) = fits(i as usize) {
                return Some(p);
            }
            // SAFETY: the chain entry of symbol `i` (after the buckets).
            i = unsafe { *words.add(2 + nbucket as usize + i as usize) };
            steps += 1;
        }
        None
    }
}

/// The function every copy of this library exports and no other object does
/// (`gpucap_shim_version`, `lib.rs`): how a second copy loaded beside this one (another
/// path in `LD_PRELOAD` beside `/etc/ld.so.preload`'s) is told apart. The first copy in
/// the loader's list is the one every reference binds to; it passes over the others, so
/// they stay idle (before, each took the other's `dlvsym` for glibc's: a stack overflow).
pub const MARKER: &[u8] = b"gpucap_shim_version";

/// Whether the object `d` describes is a copy of this library: it exports [`MARKER`], or,
/// a copy built before the marker, the loader names `dlvsym` and `dlmopen` beside the
/// driver's `cuGetProcAddress_v2` (no C library, driver or NVML exports all three).
pub fn is_copy(d: &Dynamic) -> bool {
    d.function(MARKER).is_some()
        || (d.function(b"dlvsym").is_some()
            && d.function(b"dlmopen").is_some()
            && d.function(b"cuGetProcAddress_v2").is_some())
}

/// Set once [`next_function`] passed over another copy of this library: one preloaded
/// beside it (preloads come before the C library in the loader's list, and glibc's
/// `dlvsym` is looked for there before anything else).
pub static OTHER_COPY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether another copy of this library was seen (see [`OTHER_COPY`]).
pub fn other_copy_seen() -> bool {
    OTHER_COPY.load(std::sync::atomic::Ordering::Relaxed)
}

/// The first definition of the function `name` in an object after this library in the
/// loader's list, at its default version: what this library's own reference to the name
/// would bind to if this library did not define it too. Where none comes after it (this
/// library opened with `dlopen`, after the C library), the first before it. Other copies
/// of this library are passed over.
pub fn next_function(name: &[u8]) -> Option<usize> {
    let own = next_function as *const () as usize;
    let (mut seen_own, mut after, mut before) = (false, None, None);
    each_object(|info, phdrs| {
        if after.is_some() {
            return;
        }
        if holds(info, phdrs, own) {
            seen_own = true;
            return;
        }
        let d = Dynamic::of(info.dlpi_addr as usize, phdrs);
        if d.as_ref().is_some_and(is_copy) {
            OTHER_COPY.store(true, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        // After this library the first definition; before it, the first too, kept for
        // where none comes after (a definition before this library does not end the
        // walk: one did, and a wrapper preloaded first called itself through it).
        if seen_own {
            after = d.and_then(|d| d.function(name));
        } else if before.is_none() {
            before = d.and_then(|d| d.function(name));
        }
    });
    after.or(before)
}

/// This library's own definition of the function `name`.
pub fn own_function(name: &[u8]) -> Option<usize> {
    let own = own_function as *const () as usize;
    let mut found = None;
    each_object(|info, phdrs| {
        if found.is_none() && holds(info, phdrs, own) {
            found = Dynamic::of(info.dlpi_addr as usize, phdrs).and_then(|d| d.function(name));
        }
    });
    found
}

/// The loaded range `[start, end)` of the object holding the address `p`, where that
/// object defines the function `marker` too.
pub fn object_defining(p: usize, marker: &[u8]) -> Option<(usize, usize)> {
    let mut found = None;
    each_object(|info, phdrs| {
        if found.is_some() || !holds(info, phdrs, p) {
            return;
        }
        let base = info.dlpi_addr as usize;
        if Dynamic::of(base, phdrs)
            .and_then(|d| d.function(marker))
            .is_none()
        {
            return;
        }
        found = loaded_range(base, phdrs);
    });
    found
}

/// Whether `p` lies in another copy of this library (see [`MARKER`]); false at once
/// where none was seen.
pub fn in_other_copy(p: usize) -> bool {
    if !other_copy_seen() {
        return false;
    }
    let own = in_other_copy as *const () as usize;
    let mut found = false;
    each_object(|info, phdrs| {
        if !found && holds(info, phdrs, p) && !holds(info, phdrs, own) {
            found = Dynamic::of(info.dlpi_addr as usize, phdrs).is_some_and(|d| is_copy(&d));
        }
    });
    found
}

/// The paths of the other copies of this library loaded in the process, in the
/// loader's order, as the loader names them; none where [`next_function`] saw none (the
/// caller has it look first). Allocates: never on the `dlsym` path.
pub fn other_copies() -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if !other_copy_seen() {
        return Vec::new();
    }
    let own = other_copies as *const () as usize;
    let mut found = Vec::new();
    each_object(|info, phdrs| {
        if holds(info, phdrs, own) || info.dlpi_name.is_null() {
            return;
        }
        if Dynamic::of(info.dlpi_addr as usize, phdrs).is_some_and(|d| is_copy(&d)) {
            // SAFETY: the loader's NUL-terminated name of a loaded object, alive while it is.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) };
            found.push(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
                name.to_bytes(),
            )));
        }
    });
    found
}

/// The range `[start, end)` an object's `PT_LOAD` segments take, loaded at `bias`.
pub fn loaded_range(bias: usize, phdrs: &[libc::Elf64_Phdr]) -> Option<(usize, usize)> {
    let loads = phdrs.iter().filter(|ph| ph.p_type == libc::PT_LOAD);
    let start = loads.clone().map(|ph| ph.p_vaddr as usize).min()?;
    let end = loads.map(|ph| (ph.p_vaddr + ph.p_memsz) as usize).max()?;
    Some((bias.wrapping_add(start), bias.wrapping_add(end)))
}

/// Whether the object `info` describes holds the address `a`.
pub fn holds(info: &libc::dl_phdr_info, phdrs: &[libc::Elf64_Phdr], a: usize) -> bool {
    phdrs.iter().any(|ph| {
        let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
        ph.p_type == libc::PT_LOAD && (start..start + ph.p_memsz as usize).contains(&a)
    })
}

/// Calls `f` with each loaded object and its program headers, in the loader's order
/// (the loader's lock is held meanwhile).
pub fn each_object(mut f: impl FnMut(&libc::dl_phdr_info, &[libc::Elf64_Phdr])) {
    type Each<'a> = &'a mut dyn FnMut(&libc::dl_phdr_info, &[libc::Elf64_Phdr]);
    unsafe extern "C" fn one(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut dyn FnMut` below, `info` the loader's entry.
        let (f, info) = unsafe { (&mut *(data as *mut Each), &*info) };
        // SAFETY: the loader's program headers of a loaded object, alive during the
        // iteration, `dlpi_phnum` of them.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        f(info, phdrs);
        0
    }
    let mut f: Each = &mut f;
    // SAFETY: a callback of the loader's signature and a pointer to `f`, which outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(one), &mut f as *mut _ as *mut c_void) };
}
