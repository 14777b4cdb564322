//! Whether a file is libgpucap.so: an ELF shared object whose dynamic symbol table
//! defines `gpucap_shim_version`, the export every copy of the library has (the shim's
//! `elf::MARKER`). `gpucap run`, `check`, `cdi generate` and `jupyter install` preload
//! the library they find; any other file there (`GPUCAP_LIB` pointed at another library,
//! an empty file, a program) would be preloaded to no effect, or refused by the loader
//! with a warning, and the program would run uncapped.

use std::path::Path;

/// The export that marks the library.
pub const MARKER: &str = "gpucap_shim_version";

/// Ok where `bytes` are a 64-bit little-endian ELF shared object whose `.dynsym` defines
/// [`MARKER`]; else what it is instead, in a few words (the unit tests' form of [`check`]).
#[cfg(test)]
fn check_bytes(bytes: &[u8]) -> Result<(), &'static str> {
    check_with(|off, len| slice(bytes, off, len as u64).map(<[u8]>::to_vec))
}

/// Whether the file `read` reads is libgpucap.so, reading `len` bytes at `off` with it
/// (None: past the end): the header, the section table and the dynamic symbols, not the
/// whole library; else what it is instead, in a few words.
fn check_with(read: impl Fn(u64, usize) -> Option<Vec<u8>>) -> Result<(), &'static str> {
    const ET_DYN: u16 = 3;
    const SHT_DYNSYM: u32 = 11;
    const DAMAGED: &str = "a damaged ELF file";
    let head = read(0, 64)
        .filter(|h| h.starts_with(b"\x7fELF"))
        .ok_or("not an ELF file")?;
    if head[4] != 2 || head[5] != 1 {
        return Err("not a 64-bit little-endian ELF file");
    }
    if u16_at(&head, 16) != Some(ET_DYN) {
        return Err("not a shared library");
    }
    let (Some(shoff), Some(shentsize), Some(shnum)) =
        (u64_at(&head, 40), u16_at(&head, 58), u16_at(&head, 60))
    else {
        return Err(DAMAGED);
    };
    if shentsize < 64 {
        return Err(DAMAGED);
    }
    let table = read(shoff, usize::from(shentsize) * usize::from(shnum)).ok_or(DAMAGED)?;
    // sh_type, sh_link, sh_offset, sh_size, sh_entsize of section `i`.
    let section = |i: usize| -> Option<(u32, u32, u64, u64, u64)> {
        let at = i * usize::from(shentsize);
        Some((
            u32_at(&table, at + 4)?,
            u32_at(&table, at + 40)?,
            u64_at(&table, at + 24)?,
            u64_at(&table, at + 32)?,
            u64_at(&table, at + 56)?,
        ))
    };
    for i in 0..usize::from(shnum) {
        let (kind, link, off, size, entsize) = section(i).ok_or(DAMAGED)?;
        if kind != SHT_DYNSYM || entsize < 24 {
            continue;
        }
        let (_, _, str_off, str_size, _) = section(link as usize).ok_or(DAMAGED)?;
        let length = |n: u64| usize::try_from(n).ok().filter(|&n| n <= 64 << 20);
        let strings = read(str_off, length(str_size).ok_or(DAMAGED)?).ok_or(DAMAGED)?;
        let symbols = read(off, length(size).ok_or(DAMAGED)?).ok_or(DAMAGED)?;
        let defines = symbols.chunks_exact(entsize as usize).any(|sym| {
            let name = u32_at(sym, 0).unwrap_or(0) as usize;
            let shndx = u16_at(sym, 6).unwrap_or(0);
            shndx != 0
                && strings
                    .get(name..)
                    .and_then(|s| s.split(|&b| b == 0).next())
                    .is_some_and(|s| s == MARKER.as_bytes())
        });
        if defines {
            return Ok(());
        }
    }
    Err("a shared library that is not gpucap's (it has no gpucap_shim_version)")
}

/// Ok where the file at `path` is libgpucap.so; else a line naming it (after
/// `named_by`, such as `GPUCAP_LIB=`) and what it is.
pub fn check(path: &Path, named_by: &str) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let file =
        std::fs::File::open(path).map_err(|e| format!("{named_by}{}: {e}", path.display()))?;
    let read = |off: u64, len: usize| {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, off).ok().map(|()| buf)
    };
    check_with(read).map_err(|what| {
        format!(
            "{named_by}{} is not libgpucap.so: {what}; the library is the libgpucap.so that \
             comes with this gpucap (beside the executable, or in its Python package)",
            path.display()
        )
    })
}

#[cfg(test)]
fn slice(bytes: &[u8], off: u64, size: u64) -> Option<&[u8]> {
    let start = usize::try_from(off).ok()?;
    bytes.get(start..start.checked_add(usize::try_from(size).ok()?)?)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The smallest file [`check_bytes`] takes for libgpucap.so: an ELF header, three
/// sections (none, `.dynsym` with the marker, its strings). For the CLI's unit tests.
#[cfg(test)]
pub(crate) fn fake_library() -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little-endian
    f[16] = 3; // ET_DYN
    f[40..48].copy_from_slice(&64u64.to_le_bytes()); // e_shoff
    f[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
    f[60..62].copy_from_slice(&3u16.to_le_bytes()); // e_shnum
    let strings = format!("\0{MARKER}\0");
    let section = |kind: u32, link: u32, off: u64, size: u64, entsize: u64| {
        let mut s = vec![0u8; 64];
        s[4..8].copy_from_slice(&kind.to_le_bytes());
        s[24..32].copy_from_slice(&off.to_le_bytes());
        s[32..40].copy_from_slice(&size.to_le_bytes());
        s[40..44].copy_from_slice(&link.to_le_bytes());
        s[56..64].copy_from_slice(&entsize.to_le_bytes());
        s
    };
    f.extend(vec![0u8; 64]);
    f.extend(section(11, 2, 256, 48, 24));
    f.extend(section(3, 0, 304, strings.len() as u64, 0));
    let mut marker = vec![0u8; 24];
    marker[0..4].copy_from_slice(&1u32.to_le_bytes()); // st_name
    marker[6..8].copy_from_slice(&1u16.to_le_bytes()); // st_shndx: defined
    f.extend(vec![0u8; 24]);
    f.extend(marker);
    f.extend(strings.as_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_told_by_its_export() {
        let lib = fake_library();
        assert_eq!(check_bytes(&lib), Ok(()));
        // The same symbol undefined (imported) is not the library.
        let mut imported = lib.clone();
        imported[256 + 24 + 6] = 0;
        assert!(check_bytes(&imported).is_err());
        // Truncated inside its symbols: damaged, not a panic.
        assert_eq!(check_bytes(&lib[..270]), Err("a damaged ELF file"));
    }

    #[test]
    fn other_files_are_told_apart() {
        assert_eq!(check_bytes(b""), Err("not an ELF file"));
        assert_eq!(check_bytes(b"#!/bin/sh\n"), Err("not an ELF file"));
        let mut head = vec![0u8; 64];
        head[..4].copy_from_slice(b"\x7fELF");
        head[4] = 1;
        head[5] = 1;
        assert_eq!(
            check_bytes(&head),
            Err("not a 64-bit little-endian ELF file")
        );
        head[4] = 2;
        head[16] = 2; // ET_EXEC
        assert_eq!(check_bytes(&head), Err("not a shared library"));
        head[16] = 3;
        head[40] = 0xff; // section headers past the end
        head[60] = 1;
        assert_eq!(check_bytes(&head), Err("a damaged ELF file"));
    }

    #[test]
    fn a_system_library_is_not_gpucap() {
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
        ]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .expect("the C library");
        assert_eq!(
            check_bytes(&libc),
            Err("a shared library that is not gpucap's (it has no gpucap_shim_version)")
        );
    }
}
