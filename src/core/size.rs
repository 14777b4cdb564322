//! Byte sizes: parsing (`8Gi`, `512MiB`, `1.5G`, `1073741824`) and formatting (`1.5 GiB`).
//!
//! Used by the core's configuration, the shim's messages, the CLI and the fake GPU
//! (`FAKECUDA_TOTAL_MEM=8Gi`, through the `fake-gpu` crate).

/// The forms `parse_size` accepts, for error messages.
pub const SIZE_FORMS: &str = "whole bytes (1073741824), or a number with a unit and no space: \
     Ki Mi Gi Ti / KiB MiB GiB TiB (binary, 1Ki = 1024), \
     k K M G T / kB KB MB GB TB (decimal, 1K = 1000), g t (binary, as HAMi-core reads \
     them: 8g = 8Gi), B (bytes); the units ending in B in any case (8gb = 8GB); \
     decimals are allowed with a unit (1.5Gi)";

/// The units `parse_size` accepts, for error messages.
pub const UNITS_LIST: &str = "Ki Mi Gi Ti, KiB MiB GiB TiB, k K M G T, kB KB MB GB TB \
     (those ending in B in any case), g t (binary, as HAMi-core: 8g = 8Gi), B";

const KI: u64 = 1 << 10;
const KILO: u64 = 1000;

/// (suffix, multiplier). Case is significant: the Kubernetes quantities keep their
/// meaning (`k` and `K` decimal kilo, `G` 10^9), `m` (milli in Kubernetes) is refused,
/// and the lowercase `g` and `t`, which Kubernetes does not define, are binary as
/// HAMi-core reads them (`CUDA_DEVICE_MEMORY_LIMIT=8g` is 8 GiB).
const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("k", KILO),
    ("K", KILO),
    ("M", KILO * KILO),
    ("G", KILO * KILO * KILO),
    ("T", KILO * KILO * KILO * KILO),
    ("g", KI * KI * KI),
    ("t", KI * KI * KI * KI),
    ("kB", KILO),
    ("KB", KILO),
    ("MB", KILO * KILO),
    ("GB", KILO * KILO * KILO),
    ("TB", KILO * KILO * KILO * KILO),
    ("Ki", KI),
    ("Mi", KI * KI),
    ("Gi", KI * KI * KI),
    ("Ti", KI * KI * KI * KI),
    ("KiB", KI),
    ("MiB", KI * KI),
    ("GiB", KI * KI * KI),
    ("TiB", KI * KI * KI * KI),
];

/// The multiplier of `unit`. The units that end in a `B` are read in any case (`gb`,
/// `Gb` and `GB` are 10^9 bytes, `gib` is 2^30): only the bare letters keep their case,
/// where it means something (`m` is milli in Kubernetes, and HAMi-core's `g` is binary).
fn unit_multiplier(unit: &str) -> Option<u64> {
    let exact = UNITS.iter().find(|(u, _)| *u == unit).map(|&(_, m)| m);
    exact.or_else(|| {
        let ends_in_b = unit.ends_with(['b', 'B']);
        UNITS
            .iter()
            .find(|(u, _)| ends_in_b && u.eq_ignore_ascii_case(unit))
            .map(|&(_, m)| m)
    })
}

/// Whether size `s` (as [`parse_size`] reads it) is written in a decimal unit (`8GB`,
/// `8G`, `500MB`, `1.5T`: powers of 1000), whose value in binary units is not the
/// number written (`8GB` is 7.45 GiB).
pub fn has_decimal_unit(s: &str) -> bool {
    let (_, unit) = split_number(s.trim());
    unit_multiplier(unit).is_some_and(|m| m > 1 && m % 1000 == 0)
}

/// Splits `s` into its leading number (digits and dots) and the rest. The split is
/// after an ASCII byte (or at the end), so it is always on a character boundary.
fn split_number(s: &str) -> (&str, &str) {
    let end = s
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.'))
        .unwrap_or(s.len());
    // `get` rather than indexing: a split that is not on a boundary is an error, never a panic.
    match (s.get(..end), s.get(end..)) {
        (Some(num), Some(rest)) => (num, rest),
        _ => ("", s),
    }
}

/// A checked decimal number: `123`, `1.5`, `.5`. Returns (integer digits, fraction digits).
/// Rejects `1.`, `1.2.3`, `.` and the empty string.
fn decimal_parts(num: &str) -> Option<(&str, &str)> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => {
            if f.is_empty() || f.contains('.') {
                return None;
            }
            (i, f)
        }
        None => (num, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((int, frac))
}

/// The value of an ASCII decimal digit (None for any other byte: never a wrapped
/// subtraction, whatever the caller checked).
fn digit(b: u8) -> Option<u8> {
    b.is_ascii_digit().then(|| b - b'0')
}

/// floor(int.frac * mult), exactly (no floating point), or None on u64 overflow or a
/// byte that is not a digit.
fn scale(int: &str, frac: &str, mult: u64) -> Option<u64> {
    let mut whole: u64 = 0;
    for d in int.bytes() {
        whole = whole.checked_mul(10)?.checked_add(u64::from(digit(d)?))?;
    }
    let whole = whole.checked_mul(mult)?;
    // Multiply the fraction's digit string by `mult`, right to left, in decimal: the
    // carry out of the most significant fraction digit is floor(0.frac * mult).
    let mut carry: u128 = 0;
    for d in frac.bytes().rev() {
        let v = u128::from(digit(d)?) * u128::from(mult) + carry;
        carry = v / 10;
    }
    // carry < mult <= u64::MAX here (9 * mult + carry < 10 * mult at every step).
    whole.checked_add(u64::try_from(carry).ok()?)
}

/// Parses a byte size.
///
/// Accepted: whole bytes (`1073741824`); a number followed directly (no space) by a unit:
/// Kubernetes quantities `k`/`K`, `M`, `G`, `T` (decimal) and `Ki`, `Mi`, `Gi`, `Ti`
/// (binary), `kB`/`KB`, `MB`, `GB`, `TB` (decimal), `KiB`, `MiB`, `GiB`, `TiB` (binary),
/// or `B`. Decimals are allowed with a unit other than `B` (`1.5Gi` = 1610612736) and
/// round down to whole bytes. Surrounding whitespace is ignored. Negative numbers, the empty string,
/// unknown units and values past `u64::MAX` are errors. Zero is returned as 0: whether a
/// zero size makes sense is the caller's business.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let fail = |what: String| Err(format!("{what}; accepted: {SIZE_FORMS}"));
    if s.is_empty() {
        return fail("empty size".to_string());
    }
    if s.starts_with('-') {
        return fail(format!("negative size {s:?}"));
    }
    if s.chars().any(char::is_whitespace) {
        return fail(format!(
            "{s:?} contains whitespace (write the unit right after the number, e.g. 8Gi)"
        ));
    }
    let (num, unit) = split_number(s);
    if num.is_empty() {
        return fail(format!("{s:?} does not start with a number"));
    }
    let Some((int, frac)) = decimal_parts(num) else {
        return fail(format!("{num:?} is not a number"));
    };
    if unit == "m" {
        return fail(format!(
            "unknown unit \"m\" in {s:?}: m is milli in Kubernetes (a thousandth of a \
             byte); write {num}Mi for mebibytes (HAMi-core's {num}m) or {num}M for megabytes"
        ));
    }
    let Some(mult) = unit_multiplier(unit) else {
        return fail(format!("unknown unit {unit:?} in {s:?}"));
    };
    if matches!(unit, "B" | "b") && !frac.is_empty() {
        return fail(format!("{s:?} has a fraction of a byte"));
    }
    if unit.is_empty() && !frac.is_empty() {
        return fail(format!(
            "{s:?} has a fraction but no unit (a size without a unit is whole bytes)"
        ));
    }
    match scale(int, frac, mult) {
        Some(b) => Ok(b),
        None => fail(format!(
            "{s:?} is too large (the most is {} bytes)",
            u64::MAX
        )),
    }
}

/// Formats a byte count with binary units: `123 B`, `512 MiB`, `1 GiB`, `1.5 GiB`.
/// At most two decimals, rounded down (so a cap is never overstated), trailing zeros
/// dropped.
pub fn format_bytes(b: u64) -> String {
    const NAMES: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut i = 0;
    while i + 1 < NAMES.len() && b >= 1u64 << (10 * (i + 1)) {
        i += 1;
    }
    if i == 0 {
        return format!("{b} B");
    }
    let unit = 1u128 << (10 * i);
    let hundredths = u128::from(b) * 100 / unit;
    let (whole, frac) = (hundredths / 100, hundredths % 100);
    match frac {
        0 => format!("{whole} {}", NAMES[i]),
        f if f % 10 == 0 => format!("{whole}.{} {}", f / 10, NAMES[i]),
        f => format!("{whole}.{f:02} {}", NAMES[i]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    #[test]
    fn plain_bytes() {
        assert_eq!(parse_size("1073741824"), Ok(GI));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("123B"), Ok(123));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("  42 "), Ok(42));
    }

    #[test]
    fn kubernetes_quantities() {
        assert_eq!(parse_size("1k"), Ok(1000));
        assert_eq!(parse_size("1K"), Ok(1000));
        assert_eq!(parse_size("2M"), Ok(2_000_000));
        assert_eq!(parse_size("8G"), Ok(8_000_000_000));
        assert_eq!(parse_size("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_size("1Ki"), Ok(1024));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("8Gi"), Ok(8 * GI));
        assert_eq!(parse_size("1Ti"), Ok(1 << 40));
    }

    #[test]
    fn byte_suffixed_units() {
        assert_eq!(parse_size("1KB"), Ok(1000));
        assert_eq!(parse_size("1kB"), Ok(1000));
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("4GB"), Ok(4_000_000_000));
        assert_eq!(parse_size("2TB"), Ok(2_000_000_000_000));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 * GI));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
    }

    #[test]
    fn units_ending_in_b_are_read_in_any_case() {
        for (s, b) in [
            ("8GB", 8_000_000_000),
            ("8gb", 8_000_000_000),
            ("8Gb", 8_000_000_000),
            ("500mb", 500_000_000),
            ("2tb", 2_000_000_000_000),
            ("4kb", 4000),
            ("8gib", 8 * GI),
            ("8GIB", 8 * GI),
            ("512mib", 512 << 20),
            ("12b", 12),
        ] {
            assert_eq!(parse_size(s), Ok(b), "{s}");
        }
        assert!(has_decimal_unit("8GB") && has_decimal_unit("8gb") && has_decimal_unit("8G"));
        assert!(has_decimal_unit(" 1.5T ") && has_decimal_unit("4k"));
        for s in ["8Gi", "8gib", "1073741824", "12B", "8x"] {
            assert!(!has_decimal_unit(s), "{s}");
        }
    }

    #[test]
    fn decimals_round_down() {
        assert_eq!(parse_size("1.5Gi"), Ok(1_610_612_736));
        assert_eq!(parse_size("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_size(".5Ki"), Ok(512));
        assert_eq!(parse_size("0.001Ki"), Ok(1)); // 1.024 -> 1
        assert_eq!(parse_size("0.0001Ki"), Ok(0)); // 0.1024 -> 0
        // A fraction of a byte is no size (before: 1.5B was 1 byte, silently).
        assert!(parse_size("1.9999999999999999999999999B").is_err());
        assert!(
            parse_size("1.5b")
                .unwrap_err()
                .contains("a fraction of a byte")
        );
        assert_eq!(parse_size("1.0Ki"), Ok(1024));
        // Exact, not floating point: 0.1Gi = 107374182.4
        assert_eq!(parse_size("0.1Gi"), Ok(107_374_182));
        assert_eq!(parse_size("2.50Gi"), Ok(2 * GI + GI / 2));
        // Many fraction digits are still exact.
        assert_eq!(parse_size("0.99999999999999999999999999999Ki"), Ok(1023));
    }

    fn err(s: &str) -> String {
        let e = parse_size(s).expect_err(s);
        assert!(e.contains("accepted:"), "{e}");
        e
    }

    #[test]
    fn rejects_bad_input() {
        assert!(err("").contains("empty"));
        assert!(err("   ").contains("empty"));
        assert!(err("-1Gi").contains("negative"));
        assert!(err("-5").contains("negative"));
        assert!(err("8 Gi").contains("whitespace"));
        assert!(err("abc").contains("does not start with a number"));
        assert!(err("Gi").contains("does not start with a number"));
        assert!(err("+1Gi").contains("does not start with a number"));
        assert!(err("8gi").contains("unknown unit"));
        assert!(err("8b8").contains("unknown unit"));
        assert!(err("8m").starts_with("unknown unit \"m\" in \"8m\": m is milli"));
        assert!(err("8m").contains("write 8Mi for mebibytes"));
        assert!(err("8T8").contains("unknown unit"));
        assert!(err("8Pi").contains("unknown unit"));
        assert!(err("1.2.3Gi").contains("not a number"));
        assert!(err("1.Gi").contains("not a number"));
        assert!(err(".Gi").contains("not a number"));
        assert!(err("1.5").contains("no unit"));
        assert!(err("1e9").contains("unknown unit"));
        assert!(err("0x10").contains("unknown unit"));
    }

    #[test]
    fn hamis_lowercase_g_and_t_are_binary() {
        assert_eq!(parse_size("8g"), Ok(8 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        // Kubernetes' own letters keep their meaning.
        assert_eq!(parse_size("8G"), Ok(8_000_000_000));
        assert_eq!(parse_size("8k"), Ok(8_000));
        assert_eq!(parse_size("8Gi"), Ok(8 << 30));
    }

    #[test]
    fn rejects_overflow() {
        assert!(err("18446744073709551616").contains("too large"));
        assert!(err("99999999999999999999999999").contains("too large"));
        assert!(err("16777216Ti").contains("too large")); // 2^64
        assert_eq!(parse_size("16777215Ti"), Ok(16_777_215u64 << 40));
        assert_eq!(
            parse_size("16777215.9999999999999999999999999999999999999999999999Ti"),
            Ok(u64::MAX)
        );
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(123), "123 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1 KiB");
        assert_eq!(format_bytes(512 << 20), "512 MiB");
        assert_eq!(format_bytes(GI), "1 GiB");
        assert_eq!(format_bytes(GI + GI / 2), "1.5 GiB");
        assert_eq!(format_bytes(GI + GI / 4), "1.25 GiB");
        assert_eq!(format_bytes(80 * GI), "80 GiB");
        assert_eq!(format_bytes(105 * GI / 100 + 1), "1.05 GiB");
        assert_eq!(format_bytes(105 * GI / 100), "1.04 GiB");
        assert_eq!(format_bytes(GI - 1), "1023.99 MiB"); // rounded down
        assert_eq!(format_bytes(1 << 40), "1 TiB");
        assert_eq!(format_bytes(u64::MAX), "15.99 EiB");
    }

    #[test]
    fn round_trip() {
        for b in [1u64, 1000, 1024, 4 * GI, 1536 << 20, 1 << 40] {
            let s = format_bytes(b).replace(' ', "");
            assert_eq!(parse_size(&s), Ok(b), "{s}");
        }
    }
}
