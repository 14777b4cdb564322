//! A 64-bit value as the 16 hex digits of a name (a pool file's temporary name, an
//! announcement's path hash), written the same way whatever the value: `format!("{:016x}")`
//! takes the formatter's padding path for a value with a leading zero digit (one in 16),
//! some 240 instructions more, so a start's instruction count moved with a random name
//! (`bench_start::the_published_start_instructions_are_this_trees` failed on it).

/// `v` as exactly 16 lower-case hex digits.
pub(crate) fn hex16(v: u64) -> String {
    hex16_bytes(v).iter().map(|&b| char::from(b)).collect()
}

/// The same digits as bytes, with no allocation (a claim's serving thread names a socket
/// with them).
pub(crate) fn hex16_bytes(v: u64) -> [u8; 16] {
    std::array::from_fn(|i| b"0123456789abcdef"[((v >> ((15 - i) * 4)) & 0xf) as usize])
}

#[cfg(test)]
mod tests {
    use super::hex16;

    #[test]
    fn sixteen_digits_as_the_formatter_pads_them() {
        for v in [
            0,
            1,
            0xf,
            0x0123_4567_89ab_cdef,
            u64::MAX,
            1 << 60,
            (1 << 60) - 1,
        ] {
            assert_eq!(hex16(v), format!("{v:016x}"));
        }
    }
}
