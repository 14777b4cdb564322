//! Unpacking a fat binary entry's compressed payload (safe, over byte slices; imports
//! nothing of the crate). nvcc compresses entries with LZ4 (`flags` 0x2000, CUDA 11–12) or
//! Zstandard (`flags` 0x8000, CUDA 12.8 and later: every cuBLAS 13 kernel image is one).
//! The entry header gives the compressed length (u32 at offset 16) and the unpacked length
//! (u64 at offset 56). The real driver unpacks them to load the code; the fake unpacks them
//! to learn the names and globals' sizes that clients ask for (cuBLAS asks
//! `cuLibraryGetGlobal` for its `deviceConstants`).

/// `flags` bit of an LZ4-compressed entry.
pub const FLAG_LZ4: u64 = 0x2000;
/// `flags` bit of a Zstandard-compressed entry.
pub const FLAG_ZSTD: u64 = 0x8000;

/// The most an entry may unpack to (a guard against a corrupt length; cuBLAS's largest
/// kernel images are a few MiB).
const MAX_UNPACKED: u64 = 1 << 30;

/// The unpacked payload of an entry whose `flags` say how it was packed, or None when it
/// cannot be read (corrupt, truncated, or unpacking to another length than `unpacked`).
pub fn unpack(flags: u64, packed: &[u8], unpacked: u64) -> Option<Vec<u8>> {
    if unpacked == 0 || unpacked > MAX_UNPACKED {
        return None;
    }
    let out = if flags & FLAG_ZSTD != 0 {
        zstd(packed, unpacked as usize)?
    } else if flags & FLAG_LZ4 != 0 {
        lz4_block(packed, unpacked as usize)?
    } else {
        return None;
    };
    (out.len() as u64 == unpacked).then_some(out)
}

/// A Zstandard stream (one or more frames) unpacking to `len` bytes.
fn zstd(packed: &[u8], len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    let mut decoder = ruzstd::decoding::FrameDecoder::new();
    decoder.decode_all_to_vec(packed, &mut out).ok()?;
    Some(out)
}

/// An LZ4 block (the raw block format, no frame) unpacking to `len` bytes.
fn lz4_block(packed: &[u8], len: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(len);
    let mut i = 0;
    // A length nibble of 15 continues in the following bytes, each added until one is
    // below 255.
    let more = |i: &mut usize, mut n: usize| -> Option<usize> {
        if n == 15 {
            loop {
                let b = *packed.get(*i)?;
                *i += 1;
                n = n.checked_add(b as usize)?;
                if b != 255 {
                    break;
                }
            }
        }
        Some(n)
    };
    while i < packed.len() {
        let token = packed[i];
        i += 1;
        let literals = more(&mut i, (token >> 4) as usize)?;
        let end = i.checked_add(literals)?;
        out.extend_from_slice(packed.get(i..end)?);
        i = end;
        if out.len() > len {
            return None;
        }
        if i == packed.len() {
            break; // the last sequence has literals only
        }
        let offset = u16::from_le_bytes(packed.get(i..i + 2)?.try_into().ok()?) as usize;
        i += 2;
        let matched = more(&mut i, (token & 15) as usize)?.checked_add(4)?;
        if offset == 0 || offset > out.len() || out.len() + matched > len {
            return None;
        }
        // The match may overlap what it writes (offset < length): copy byte by byte.
        let from = out.len() - offset;
        for k in 0..matched {
            let b = out[from + k];
            out.push(b);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut s = Vec::new();
        for i in 0..5000u32 {
            s.extend_from_slice(format!("kernel_{} ", i % 37).as_bytes());
        }
        s.extend_from_slice(&[0u8; 3000]);
        s
    }

    #[test]
    fn zstd_entries_unpack_to_their_stated_length() {
        let data = sample();
        let packed = ruzstd::encoding::compress_to_vec(
            &data[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert!(packed.len() < data.len() / 4, "{} bytes", packed.len());
        assert_eq!(
            unpack(FLAG_ZSTD | 0x11, &packed, data.len() as u64),
            Some(data.clone())
        );
        // Another stated length, a cut stream, or no flag: not read.
        assert_eq!(unpack(FLAG_ZSTD, &packed, data.len() as u64 + 1), None);
        assert_eq!(
            unpack(FLAG_ZSTD, &packed[..packed.len() / 2], data.len() as u64),
            None
        );
        assert_eq!(unpack(0x11, &packed, data.len() as u64), None);
    }

    #[test]
    fn lz4_blocks_unpack_with_overlapping_matches_and_long_lengths() {
        let data = sample();
        let packed = lz4_flex::block::compress(&data);
        assert!(packed.len() < data.len() / 4, "{} bytes", packed.len());
        assert_eq!(
            unpack(FLAG_LZ4, &packed, data.len() as u64),
            Some(data.clone())
        );
        // A hand-made block: "ab" then a match of 10 at offset 2 (overlapping), then
        // literals: "abababababab" + "xyz".
        let hand = [0x26, b'a', b'b', 2, 0, 0x30, b'x', b'y', b'z'];
        assert_eq!(
            lz4_block(&hand, 15).as_deref(),
            Some(&b"ababababababxyz"[..])
        );
        // An offset reaching before the start, or past the stated length: not read.
        assert_eq!(lz4_block(&[0x10, b'a', 5, 0], 100), None);
        assert_eq!(unpack(FLAG_LZ4, &packed, data.len() as u64 - 1), None);
    }
}
