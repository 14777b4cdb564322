//! Kubernetes resource quantities (`16Gi`, `1500M`, `1.5Gi`, `2e9`), as the DRA example
//! driver writes a claim's consumed `memory` (k8s.io/apimachinery `Quantity.String()`),
//! read exactly: a number, then one suffix, binary (`Ki` … `Ei`), decimal (`n u m k M G
//! T P E`) or an exponent (`e<n>`, `E<n>`).

/// Accepted forms, for error messages.
pub const QUANTITY_ACCEPTED: &str = "a Kubernetes quantity of whole bytes: digits (a decimal point \
     allowed) and one suffix of Ki Mi Gi Ti Pi Ei (binary), k M G T P E (decimal) or e<n>, \
     e.g. 16Gi, 1536Mi, 4G";

/// Bytes of a quantity: it must be a whole number of bytes, above 0.
pub fn parse_quantity(v: &str) -> Result<u64, String> {
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, suffix) = v.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(if v.starts_with('-') {
            "a memory amount cannot be negative".into()
        } else {
            "not a number".into()
        });
    }
    // value = digits / 10^frac.len() * 2^bin * 10^dec
    let (bin, dec): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => {
            let e: i32 = s[1..]
                .parse()
                .map_err(|_| format!("unknown suffix {s:?}"))?;
            (0, e)
        }
        s => return Err(format!("unknown suffix {s:?}")),
    };
    let too_large = || "too large".to_string();
    let digits = format!("{int}{frac}");
    let mut n: u128 = digits.parse().map_err(|_| too_large())?;
    n = n.checked_mul(1u128 << bin).ok_or_else(too_large)?;
    let exp = dec - frac.len() as i32;
    if exp >= 0 {
        n = 10u128
            .checked_pow(exp as u32)
            .and_then(|p| n.checked_mul(p))
            .ok_or_else(too_large)?;
    } else {
        let p = 10u128.checked_pow((-exp) as u32).unwrap_or(u128::MAX);
        if !n.is_multiple_of(p) {
            return Err("a fraction of a byte".into());
        }
        n /= p;
    }
    if n == 0 {
        return Err("a cap of 0 bytes would refuse every allocation".into());
    }
    u64::try_from(n).map_err(|_| too_large())
}
