//! What a module image names, at the bottom of the crate (it imports nothing of it; safe,
//! over byte slices): the kernels and globals of a cubin (ELF symbol table), of PTX text
//! (`.entry NAME`, `.global ... NAME[n]`), and of every entry of a fat binary. The fake runs
//! no kernel; it only needs the names (cuModuleGetFunction) and the globals' sizes
//! (cuModuleGetGlobal).
//!
//! Fat binary layout (as nvcc writes it; the same one ZLUDA documents): a header
//! `{u32 magic 0xBA55ED50, u16 version, u16 header_size, u64 size of what follows}`, then
//! entries `{u16 kind (1 PTX, 2 ELF), u16 version, u32 header_size, u32 payload_size, ...,
//! u32 packed_size at 16, u64 flags at 40, u64 unpacked_size at 56}`, each followed (at
//! `header_size`) by its payload. A payload compressed by nvcc (`flags` 0x2000 LZ4, 0x8000
//! Zstandard) is unpacked first ([`crate::unpack`]); one that cannot be read leaves its
//! names unknown, and a module holding it accepts any function name.

use std::collections::{BTreeMap, BTreeSet};

use crate::unpack;

pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `__fatBinC_Wrapper_t.magic`: `{u32 magic, u32 version, const u64 *data, void *}`.
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x466243B1;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";

const FLAG_COMPRESSED: u64 = 0x2000 | 0x8000;

/// What an image names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Names {
    /// Kernel (function) names.
    pub functions: Vec<String>,
    /// Globals and their sizes in bytes.
    pub globals: BTreeMap<String, u64>,
    /// The globals that are `__managed__` variables (PTX `.attribute(.managed)`):
    /// `cuLibraryGetManaged` answers for these only.
    pub managed: BTreeSet<String>,
    /// Some part could not be read (compressed): any name is accepted.
    pub open: bool,
    /// The local memory each thread of a kernel takes (its `.local` declarations in PTX:
    /// local arrays and spills, `__local_depot`), by kernel; none: 0 bytes.
    pub local: BTreeMap<String, u64>,
}

impl Names {
    fn merge(&mut self, other: Names) {
        for f in other.functions {
            if !self.functions.contains(&f) {
                self.functions.push(f);
            }
        }
        self.globals.extend(other.globals);
        self.managed.extend(other.managed);
        self.local.extend(other.local);
        self.open |= other.open;
    }
}

/// The kind of image at the start of `head` (its first bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Elf,
    Fatbin,
    /// A `__fatBinC_Wrapper_t` pointing at a fat binary.
    FatbinWrapper,
    Ptx,
}

pub fn kind(head: &[u8]) -> Option<Kind> {
    let word = |i: usize| {
        head.get(i..i + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    if head.starts_with(ELF_MAGIC) {
        Some(Kind::Elf)
    } else if word(0) == Some(FATBIN_MAGIC) {
        Some(Kind::Fatbin)
    } else if word(0) == Some(FATBIN_WRAPPER_MAGIC) {
        Some(Kind::FatbinWrapper)
    } else if looks_like_ptx(head) {
        Some(Kind::Ptx)
    } else {
        None
    }
}

/// PTX is text: printable ASCII or whitespace up to the first NUL or the end of `head`.
fn looks_like_ptx(head: &[u8]) -> bool {
    let text: Vec<u8> = head.iter().copied().take_while(|&b| b != 0).collect();
    !text.is_empty()
        && text
            .iter()
            .all(|&b| b.is_ascii_graphic() || b.is_ascii_whitespace())
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(i..i + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?))
}

/// The byte length of the ELF image that starts `head` (64-bit little-endian only): the end
/// of its section header table or of its furthest section, whichever is later.
/// `head` must hold at least the 64-byte ELF header; `read` gives more bytes on demand.
pub fn elf_len(head: &[u8], read: impl Fn(usize, usize) -> Vec<u8>) -> Option<usize> {
    if !head.starts_with(ELF_MAGIC) || head.get(4) != Some(&2) || head.get(5) != Some(&1) {
        return None;
    }
    let shoff = u64_at(head, 0x28)? as usize;
    let shentsize = u16_at(head, 0x3a)? as usize;
    let shnum = u16_at(head, 0x3c)? as usize;
    let mut end = shoff.checked_add(shentsize.checked_mul(shnum)?)?;
    if shentsize < 64 || end > 1 << 31 {
        return None;
    }
    let sh = read(shoff, shentsize * shnum);
    for i in 0..shnum {
        let s = &sh[i * shentsize..];
        let ty = u32_at(s, 4)?;
        let off = u64_at(s, 0x18)? as usize;
        let size = u64_at(s, 0x20)? as usize;
        if ty != 8 {
            // not SHT_NOBITS
            end = end.max(off.checked_add(size)?);
        }
    }
    (end <= 1 << 31).then_some(end)
}

/// Kernels (STT_FUNC) and globals (STT_OBJECT, with st_size) of a 64-bit ELF image.
pub fn elf_names(elf: &[u8]) -> Option<Names> {
    if !elf.starts_with(ELF_MAGIC) || elf.get(4) != Some(&2) {
        return None;
    }
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
        let s = elf.get(shoff + i * shentsize..shoff + (i + 1) * shentsize)?;
        // (type, offset, size, link, entsize)
        Some((
            u32_at(s, 4)?,
            u64_at(s, 0x18)? as usize,
            u64_at(s, 0x20)? as usize,
            u32_at(s, 0x28)?,
            u64_at(s, 0x38)? as usize,
        ))
    };
    let mut names = Names::default();
    for i in 0..shnum {
        let (ty, off, size, link, entsize) = section(i)?;
        if ty != 2 || entsize < 24 {
            continue; // SHT_SYMTAB only
        }
        let (_, stroff, strsize, _, _) = section(link as usize)?;
        let strtab = elf.get(stroff..stroff + strsize)?;
        let syms = elf.get(off..off + size)?;
        for sym in syms.chunks_exact(entsize) {
            let name_off = u32_at(sym, 0)? as usize;
            let info = sym[4];
            let value_size = u64_at(sym, 16)?;
            let name = strtab.get(name_off..)?;
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            match info & 0xf {
                2 => names.functions.push(name.to_string()), // STT_FUNC
                1 => {
                    names.globals.insert(name.to_string(), value_size);
                } // STT_OBJECT
                _ => {}
            }
        }
    }
    Some(names)
}

/// The size of one PTX element type (`.b8`, `.u32`, `.f64`, ...).
fn ptx_type_size(t: &str) -> Option<u64> {
    let bits: u64 = t
        .strip_prefix(".b")
        .or_else(|| t.strip_prefix(".u"))
        .or_else(|| t.strip_prefix(".s"))
        .or_else(|| t.strip_prefix(".f"))?
        .parse()
        .ok()?;
    Some(bits.div_ceil(8))
}

/// Whether PTX text has the `.version` directive every PTX module starts with.
pub fn has_ptx_version(text: &str) -> bool {
    text.split(|c: char| c.is_whitespace())
        .any(|w| w == ".version")
}

/// Kernels (`.entry NAME`), globals (`.global [.attribute(.managed)] [.align n] .type
/// NAME[count]...;`, a managed one noted as such) and each
/// kernel's local memory per thread (the `.local` declarations of its body) of PTX.
pub fn ptx_names(text: &str) -> Names {
    let mut names = Names::default();
    let mut entry: Option<String> = None;
    for line in text.lines() {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '(' || c == ';' || c == '=')
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(i) = words.iter().position(|w| *w == ".entry") {
            if let Some(name) = words.get(i + 1) {
                names.functions.push(name.to_string());
                entry = Some(name.to_string());
            }
            continue;
        }
        if let Some(i) = words.iter().position(|w| *w == ".local") {
            if let (Some(e), Some((_, bytes))) = (&entry, declared(&words[i + 1..])) {
                *names.local.entry(e.clone()).or_default() += bytes;
            }
            continue;
        }
        let Some(i) = words.iter().position(|w| *w == ".global") else {
            continue;
        };
        if let Some((name, bytes)) = declared(&words[i + 1..]) {
            if words[i + 1..]
                .iter()
                .any(|w| w.trim_end_matches(')') == ".managed")
            {
                names.managed.insert(name.to_string());
            }
            names.globals.insert(name.to_string(), bytes);
        }
    }
    names
}

/// The name and size in bytes of a PTX variable declared by `words` (what follows its
/// state space: `[.align n] .type NAME[count]...`).
fn declared<'a>(words: &[&'a str]) -> Option<(&'a str, u64)> {
    let mut size = None;
    let mut rest = words.iter();
    while let Some(w) = rest.next() {
        if *w == ".align" {
            rest.next();
        } else if let Some(s) = ptx_type_size(w) {
            size = Some(s);
        } else if !w.starts_with('.') {
            let (name, dims) = match w.find('[') {
                Some(b) => (&w[..b], &w[b..]),
                None => (*w, ""),
            };
            let mut count = 1u64;
            for d in dims.split(['[', ']']).filter(|d| !d.is_empty()) {
                count = count.saturating_mul(d.parse().unwrap_or(1));
            }
            return size.map(|s| (name, s.saturating_mul(count)));
        }
    }
    None
}

/// The byte length of a fat binary starting with its header.
pub fn fatbin_len(head: &[u8]) -> Option<usize> {
    if u32_at(head, 0)? != FATBIN_MAGIC {
        return None;
    }
    let header = u16_at(head, 6)? as usize;
    let size = u64_at(head, 8)? as usize;
    let len = header.checked_add(size)?;
    (len <= 1 << 34).then_some(len)
}

/// The names of every entry of a fat binary (`fatbin` holds all of it).
pub fn fatbin_names(fatbin: &[u8]) -> Option<Names> {
    let len = fatbin_len(fatbin)?;
    let fatbin = fatbin.get(..len)?;
    let mut pos = u16_at(fatbin, 6)? as usize;
    let mut names = Names::default();
    while pos + 16 <= fatbin.len() {
        let kind = u16_at(fatbin, pos)?;
        let header = u32_at(fatbin, pos + 4)? as usize;
        let payload = u32_at(fatbin, pos + 8)? as usize;
        let flags = u64_at(fatbin, pos + 40).unwrap_or(0);
        let start = pos.checked_add(header)?;
        let mut body = fatbin.get(start..start.checked_add(payload)?)?;
        if header == 0 {
            break;
        }
        let unpacked;
        if flags & FLAG_COMPRESSED != 0 {
            // The packed bytes (the payload is padded to 8) and their unpacked length.
            let packed = match u32_at(fatbin, pos + 16) {
                Some(n) if n > 0 && n as usize <= payload => n as usize,
                _ => payload,
            };
            unpacked = u64_at(fatbin, pos + 56)
                .and_then(|len| unpack::unpack(flags, &body[..packed], len));
            body = unpacked.as_deref().unwrap_or_default();
        }
        if body.is_empty() && payload > 0 {
            names.open = true;
        } else {
            match kind {
                1 => {
                    let text = &body[..body.iter().position(|&b| b == 0).unwrap_or(body.len())];
                    names.merge(ptx_names(&String::from_utf8_lossy(text)));
                }
                2 => names.merge(elf_names(body).unwrap_or(Names {
                    open: true,
                    ..Names::default()
                })),
                _ => names.open = true,
            }
        }
        pos = start + payload;
    }
    Some(names)
}

/// A minimal 64-bit ELF whose symbol table names `kernels` (STT_FUNC) and `globals`
/// (STT_OBJECT, with their sizes): what cuLinkComplete hands back, which cuModuleLoadData
/// reads again.
pub fn build_elf(kernels: &[&str], globals: &[(&str, u64)]) -> Vec<u8> {
    let mut strtab = vec![0u8];
    let mut syms = vec![0u8; 24]; // the null symbol
    let mut add = |name: &str, info: u8, size: u64, strtab: &mut Vec<u8>| {
        let off = strtab.len() as u32;
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
        let mut s = vec![0u8; 24];
        s[0..4].copy_from_slice(&off.to_le_bytes());
        s[4] = info;
        s[16..24].copy_from_slice(&size.to_le_bytes());
        syms.extend(s);
    };
    for k in kernels {
        add(k, 0x12, 0x80, &mut strtab);
    }
    for (g, size) in globals {
        add(g, 0x11, *size, &mut strtab);
    }
    let symoff = 64usize;
    let stroff = symoff + syms.len();
    let shoff = (stroff + strtab.len()).next_multiple_of(8);
    let mut elf = vec![0u8; shoff + 3 * 64];
    elf[..4].copy_from_slice(ELF_MAGIC);
    elf[4] = 2;
    elf[5] = 1;
    elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    elf[symoff..stroff].copy_from_slice(&syms);
    elf[stroff..stroff + strtab.len()].copy_from_slice(&strtab);
    let mut sh = |i: usize, ty: u32, off: usize, size: usize, link: u32, entsize: u64| {
        let s = &mut elf[shoff + i * 64..shoff + (i + 1) * 64];
        s[4..8].copy_from_slice(&ty.to_le_bytes());
        s[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
        s[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
        s[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
        s[0x38..0x40].copy_from_slice(&entsize.to_le_bytes());
    };
    sh(1, 2, symoff, syms.len(), 2, 24);
    sh(2, 3, stroff, strtab.len(), 0, 0);
    elf
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A fat binary holding `entries` (kind, payload, flags).
    pub fn tiny_fatbin(entries: &[(u16, Vec<u8>, u64)]) -> Vec<u8> {
        let unpacked: Vec<_> = entries.iter().map(|(_, p, _)| p.len() as u64).collect();
        packed_fatbin(entries, &unpacked)
    }

    /// A fat binary whose entries (kind, payload as stored, flags) state these unpacked
    /// lengths; payloads are padded to 8 bytes as nvcc pads them.
    pub fn packed_fatbin(entries: &[(u16, Vec<u8>, u64)], unpacked: &[u64]) -> Vec<u8> {
        let mut body = Vec::new();
        for ((kind, payload, flags), unpacked) in entries.iter().zip(unpacked) {
            let padded = payload.len().div_ceil(8) * 8;
            let mut h = vec![0u8; 64];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x101u16.to_le_bytes());
            h[4..8].copy_from_slice(&64u32.to_le_bytes());
            h[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
            h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            h[40..48].copy_from_slice(&flags.to_le_bytes());
            h[56..64].copy_from_slice(&unpacked.to_le_bytes());
            body.extend(h);
            body.extend(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut f = vec![0u8; 16];
        f[0..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f[4..6].copy_from_slice(&1u16.to_le_bytes());
        f[6..8].copy_from_slice(&16u16.to_le_bytes());
        f[8..16].copy_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend(body);
        f
    }

    #[test]
    fn symbols_of_a_cubin() {
        let elf = build_elf(&["add_kernel", "mul"], &[("counter", 12)]);
        assert_eq!(kind(&elf), Some(Kind::Elf));
        let n = elf_names(&elf).unwrap();
        assert_eq!(n.functions, ["add_kernel", "mul"]);
        assert_eq!(n.globals.get("counter"), Some(&12));
        assert!(!n.open);
        let len = elf_len(&elf, |o, l| elf[o..o + l].to_vec()).unwrap();
        assert_eq!(len, elf.len());
    }

    #[test]
    fn ptx_managed_globals_are_noted() {
        let n =
            ptx_names(".global .attribute(.managed) .align 4 .u32 counter;\n.global .u64 plain;\n");
        assert_eq!(n.globals.get("counter"), Some(&4));
        assert!(n.managed.contains("counter"));
        assert!(!n.managed.contains("plain"));
        assert_eq!(n.globals.get("plain"), Some(&8));
    }

    #[test]
    fn ptx_entries_and_globals() {
        let ptx = "//\n.version 8.0\n.target sm_90\n.address_size 64\n\
                   .global .align 4 .b8 table[16];\n.global .u64 total;\n\
                   .visible .entry my_kernel(\n\t.param .u64 p0\n)\n{\n ret;\n}\n\
                   .entry other_kernel()\n{\n}\n";
        assert_eq!(kind(ptx.as_bytes()), Some(Kind::Ptx));
        let n = ptx_names(ptx);
        assert_eq!(n.functions, ["my_kernel", "other_kernel"]);
        assert_eq!(n.globals.get("table"), Some(&16));
        assert_eq!(n.globals.get("total"), Some(&8));
        assert!(n.local.is_empty(), "no .local: none");
    }

    #[test]
    fn ptx_local_memory_per_kernel() {
        let ptx = ".version 8.0\n.entry deep()\n{\n\t.local .align 16 .b8 \t__local_depot0[8192];\n\t.local .u32 spill;\n ret;\n}\n\
                   .entry flat()\n{\n ret;\n}\n";
        let n = ptx_names(ptx);
        assert_eq!(n.functions, ["deep", "flat"]);
        assert_eq!(n.local.get("deep"), Some(&8196));
        assert_eq!(n.local.get("flat"), None);
        assert!(n.globals.is_empty(), "a .local is no global");
    }

    #[test]
    fn fatbin_entries_and_compressed_ones() {
        let elf = build_elf(&["k_elf"], &[("g", 4)]);
        let ptx = b".version 8.0\n.entry k_ptx()\n{\n}\n\0".to_vec();
        let f = tiny_fatbin(&[(2, elf.clone(), 0x11), (1, ptx, 0x11)]);
        assert_eq!(kind(&f), Some(Kind::Fatbin));
        assert_eq!(fatbin_len(&f), Some(f.len()));
        let n = fatbin_names(&f).unwrap();
        assert_eq!(n.functions, ["k_elf", "k_ptx"]);
        assert_eq!(n.globals.get("g"), Some(&4));
        assert!(!n.open);
        let c = tiny_fatbin(&[(2, vec![1, 2, 3, 4], 0x2011)]);
        assert!(
            fatbin_names(&c).unwrap().open,
            "LZ4 bytes that do not unpack: names unknown"
        );
        assert_eq!(kind(b"\x01\x02garbage"), None);
    }

    /// As cuBLAS 13 ships its kernels: each entry Zstandard-packed (and LZ4 as older nvcc
    /// packed them): the names and globals' sizes are those of the unpacked images.
    #[test]
    fn packed_entries_are_read() {
        let elf = build_elf(
            &["gemm_kernel"],
            &[("_ZN6cublas8internal15deviceConstantsE", 384)],
        );
        let ptx = b".version 8.0\n.global .u64 total;\n.entry k_ptx()\n{\n}\n\0".to_vec();
        let zstd = |b: &[u8]| {
            ruzstd::encoding::compress_to_vec(b, ruzstd::encoding::CompressionLevel::Fastest)
        };
        let f = packed_fatbin(
            &[
                (2, zstd(&elf), 0x8011),
                (1, lz4_flex::block::compress(&ptx), 0x2011),
            ],
            &[elf.len() as u64, ptx.len() as u64],
        );
        assert_eq!(fatbin_len(&f), Some(f.len()));
        let n = fatbin_names(&f).unwrap();
        assert_eq!(n.functions, ["gemm_kernel", "k_ptx"]);
        assert_eq!(
            n.globals.get("_ZN6cublas8internal15deviceConstantsE"),
            Some(&384)
        );
        assert_eq!(n.globals.get("total"), Some(&8));
        assert!(!n.open);
        // A wrong unpacked length: the entry is not read.
        let bad = packed_fatbin(&[(2, zstd(&elf), 0x8011)], &[elf.len() as u64 + 8]);
        assert!(fatbin_names(&bad).unwrap().open);
    }
}
