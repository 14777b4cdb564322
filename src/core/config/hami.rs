//! HAMi-core's memory-limit variables as strict aliases of `GPUCAP_LIMIT`:
//! `CUDA_DEVICE_MEMORY_LIMIT` (every GPU) and `CUDA_DEVICE_MEMORY_LIMIT_<n>` (GPU `<n>`).
//!
//! HAMi-core (Project-HAMi/HAMi-core, `get_limit_from_env`) reads a value by its LAST
//! character only (`k`/`m`/`g`, any case, binary), then `strtoul(value, _, 0)`: a bare
//! number is bytes, a leading `0` is octal, `0x` is hex, parsing stops at the first
//! non-digit (`1Gi` is 1 byte), and a value it reads as 0 (`abc`, empty) means NO limit.
//! It reads `CUDA_DEVICE_MEMORY_LIMIT_0` to `_15` (its 16 devices). gpucap accepts only
//! the values both read the same way, and refuses the others with the reason; it also
//! refuses a bare number under 1 MiB (`8`: 8 bytes in both, surely `8g` meant), as it
//! does in `GPUCAP_LIMIT`. `Hami` gathers them as `from_vars` reads the environment.

use std::ffi::OsStr;

use super::limit::{
    DeviceKey, Limit, LimitFrom, LimitSpec, MAX_DEVICES, MIN_UNITLESS_BYTES, unitless_message,
};
use super::model::{ConfigError, Origin};
use super::pool_vars::{PoolSpec, parse_pool_spec};

/// The all-GPUs variable.
pub const HAMI_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// The prefix of the names gpucap checks for typos.
pub const HAMI_PREFIX: &str = "CUDA_DEVICE_MEMORY_";
/// HAMi-core's file of the budget its processes share: gpucap's pool file (`GPUCAP_POOL`).
pub const HAMI_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi-core reads the per-GPU variables of ordinals below this only.
pub const HAMI_MAX_DEVICES: u32 = 16;

/// HAMi-core's other variables: gpucap does not act on them; `gpucap check` and the
/// shim (at info) say so. `CUDA_DEVICE_SM_LIMIT_<n>` is matched by its prefix.
pub const HAMI_IGNORED: &[(&str, &str)] = &[
    (
        "CUDA_DEVICE_SM_LIMIT",
        "HAMi-core's compute (SM) limit; gpucap caps memory only, the GPU's compute is not limited",
    ),
    (
        "CUDA_TASK_PRIORITY",
        "HAMi-core's task priority; gpucap caps memory only",
    ),
    (
        "GPU_CORE_UTILIZATION_POLICY",
        "HAMi-core's compute policy; gpucap caps memory only",
    ),
    (
        "ACTIVE_OOM_KILLER",
        "HAMi-core's OOM killer; gpucap refuses the allocation instead (the program gets CUDA's out-of-memory error)",
    ),
];

/// Accepted HAMi values, for error messages.
pub const HAMI_ACCEPTED: &str = "decimal digits without a leading zero (bytes, at least 1048576), optionally followed by \
     k, m or g in any case (KiB, MiB, GiB), e.g. 8192m, 8g, 1073741824";

/// Accepted names, for the typo error.
pub const HAMI_NAMES: &str = "CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_<n> (n = 0 to 15, \
     no leading zero), CUDA_DEVICE_MEMORY_SHARED_CACHE";

/// What a `CUDA_DEVICE_MEMORY_*` name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HamiName {
    /// `CUDA_DEVICE_MEMORY_LIMIT`.
    All,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<n>`.
    Gpu(u32),
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`.
    SharedCache,
}

/// Classifies a name that starts with [`HAMI_PREFIX`]; the error says why it is not
/// one HAMi-core reads (a typo, a leading zero, an ordinal HAMi-core does not read).
pub fn hami_name(name: &str) -> Result<HamiName, String> {
    if name == HAMI_LIMIT {
        return Ok(HamiName::All);
    }
    if name == HAMI_SHARED_CACHE {
        return Ok(HamiName::SharedCache);
    }
    let unknown =
        || format!("unknown HAMi-core variable (a typo?); the known ones are {HAMI_NAMES}");
    let Some(n) = name.strip_prefix("CUDA_DEVICE_MEMORY_LIMIT_") else {
        return Err(unknown());
    };
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unknown());
    }
    if n.len() > 1 && n.starts_with('0') {
        return Err(format!(
            "HAMi-core never reads this name (it looks for CUDA_DEVICE_MEMORY_LIMIT_{}, without \
             the leading zero); the known ones are {HAMI_NAMES}",
            n.trim_start_matches('0').parse::<u64>().unwrap_or(0)
        ));
    }
    match n.parse::<u32>() {
        Ok(g) if g < HAMI_MAX_DEVICES => Ok(HamiName::Gpu(g)),
        _ => Err(format!(
            "HAMi-core reads CUDA_DEVICE_MEMORY_LIMIT_0 to _{} only (GPU {n} would not be capped \
             there); use GPUCAP_LIMIT={n}=<cap> for it",
            HAMI_MAX_DEVICES - 1
        )),
    }
}

/// Parses a HAMi limit value: digits without a leading zero, then optionally one of
/// `k K m M g G` (binary). Every other value is refused with what HAMi-core would
/// make of it, since it reads them differently from what the text plainly says.
pub fn parse_hami_value(v: &str) -> Result<u64, String> {
    if v.is_empty() {
        return Err(
            "empty value (HAMi-core reads it as no limit; unset the variable for no cap)".into(),
        );
    }
    if v.chars().any(char::is_whitespace) {
        return Err(
            "spaces in the value (HAMi-core skips leading ones and stops reading at any \
                    other, so it may read a different number or none)"
                .into(),
        );
    }
    if v.starts_with('-') {
        return Err(
            "a limit cannot be negative (HAMi-core's strtoul would wrap it to a huge cap)".into(),
        );
    }
    if v.starts_with('+') {
        return Err("a sign is not accepted; write the digits only".into());
    }
    let bytes = v.as_bytes();
    let last = bytes[bytes.len() - 1];
    let (digits, scale): (&str, u64) = match last {
        b'k' | b'K' => (&v[..v.len() - 1], 1 << 10),
        b'm' | b'M' => (&v[..v.len() - 1], 1 << 20),
        b'g' | b'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    let lead_digits = digits.bytes().take_while(u8::is_ascii_digit).count();
    if lead_digits == digits.len() && !digits.is_empty() {
        if digits.len() > 1 && digits.starts_with('0') {
            return Err(format!(
                "a leading zero makes the number octal in HAMi-core ({v} is not {} there); \
                 drop the zero",
                v.trim_start_matches('0')
            ));
        }
        let n: u64 = digits
            .parse()
            .map_err(|_| "too large (more than 64 bits of bytes)".to_string())?;
        if n == 0 {
            return Err(
                "a cap of 0 means no limit in HAMi-core and refuses everything in gpucap; \
                        unset the variable to count without capping"
                    .into(),
            );
        }
        // A bare number is bytes in HAMi-core too: 8 would be a cap of 8 bytes there as
        // here, which nobody means. Refused like GPUCAP_LIMIT=8 (both refuse everything
        // with such a cap, so refusing loses nothing).
        if scale == 1 && n < MIN_UNITLESS_BYTES {
            return Err(unitless_message(
                n,
                ["g", "m"],
                "a smaller cap needs the k unit",
            ));
        }
        return n.checked_mul(scale).ok_or_else(|| {
            "too large (more than 64 bits of bytes; HAMi-core would read it as no limit)".into()
        });
    }
    // Not plain digits: say what HAMi-core would make of it.
    let rest = &digits[lead_digits..];
    if lead_digits == 0 {
        return Err(if rest.starts_with('.') {
            "HAMi-core reads whole numbers only; write a whole number of k, m or g".into()
        } else {
            "not a number (HAMi-core would read it as no limit)".into()
        });
    }
    if digits.starts_with("0x") || digits.starts_with("0X") {
        return Err(
            "a hexadecimal number (HAMi-core reads 0x as hex); write decimal digits".into(),
        );
    }
    if rest.starts_with('.') {
        return Err(format!(
            "HAMi-core reads whole numbers only ({v} is {} there); write e.g. 1536m for 1.5g",
            human_prefix_reading(v, lead_digits)
        ));
    }
    let unit_like = rest.trim_end_matches(['i', 'I', 'b', 'B']);
    if matches!(unit_like, "t" | "T") || last == b't' || last == b'T' {
        return Err(format!(
            "HAMi-core has no T unit ({v} is {} there); write it in g, e.g. 1024g for 1t",
            human_prefix_reading(v, lead_digits)
        ));
    }
    Err(format!(
        "HAMi-core reads only the last character as a unit (k, m or g), so {v} is {} there; \
         write e.g. 8g for 8Gi",
        human_prefix_reading(v, lead_digits)
    ))
}

/// What HAMi-core makes of `v` whose first `lead` characters are digits followed by
/// something else: the digits times the unit of the last character (if it is one).
fn human_prefix_reading(v: &str, lead: usize) -> String {
    let scale: u64 = match v.as_bytes()[v.len() - 1] {
        b'k' | b'K' => 1 << 10,
        b'm' | b'M' => 1 << 20,
        b'g' | b'G' => 1 << 30,
        _ => 1,
    };
    let digits = &v[..lead];
    let radix = if digits.len() > 1 && digits.starts_with('0') {
        8
    } else {
        10
    };
    match u64::from_str_radix(digits, radix)
        .ok()
        .and_then(|n| n.checked_mul(scale))
    {
        Some(1) => "1 byte".to_string(),
        Some(b) => format!("{b} bytes"),
        None => "an overflowing number".to_string(),
    }
}

/// The limit the HAMi variables give, and where it came from: `all` is
/// `CUDA_DEVICE_MEMORY_LIMIT`'s bytes, `gpus` the per-GPU ones.
pub fn hami_spec(all: Option<u64>, gpus: &[(u32, u64)]) -> LimitSpec {
    let mut devices: Vec<(DeviceKey, Limit)> = gpus
        .iter()
        .map(|&(n, b)| (DeviceKey::Ordinal(n), Limit::Bytes(b)))
        .collect();
    devices.sort_by_key(|(k, _)| match k {
        DeviceKey::Ordinal(n) => *n,
        DeviceKey::Uuid(_) => u32::MAX,
    });
    LimitSpec {
        default: all.map(Limit::Bytes),
        devices,
        from: LimitFrom::Hami,
    }
}

/// Do `gpucap` (from `GPUCAP_LIMIT`) and `hami` agree? They agree when every CUDA
/// ordinal 0..MAX_DEVICES gets the same cap from both: the same number of bytes, or
/// no cap from either. `GPUCAP_LIMIT` must then use bytes and ordinals only (a
/// fraction or a UUID cannot be compared before the driver is asked). The error names
/// the first GPU where they differ.
pub fn check_agree(gpucap: &LimitSpec, hami: &LimitSpec) -> Result<(), String> {
    if gpucap
        .devices
        .iter()
        .any(|(k, _)| matches!(k, DeviceKey::Uuid(_)))
    {
        return Err(
            "names a GPU by UUID, which cannot be compared with HAMi-core's per-ordinal \
             CUDA_DEVICE_MEMORY_LIMIT* variables; set only one of them"
                .into(),
        );
    }
    let show = |l: Option<Limit>| match l {
        None => "no cap".to_string(),
        Some(l) => l.to_string(),
    };
    for n in 0..MAX_DEVICES as u32 {
        let (a, b) = (gpucap.for_ordinal(n), hami.for_ordinal(n));
        if matches!(a, Some(Limit::Fraction(_))) {
            return Err(format!(
                "gives GPU {n} a share of its memory ({}), which cannot be compared with \
                 HAMi-core's byte caps; set only one of them",
                show(a)
            ));
        }
        if a != b {
            // Where GPU n's cap (or its lack of one) comes from among HAMi-core's.
            let theirs = match b {
                Some(_) => format!("{} from {}", show(b), hami.var_for_ordinal(n)),
                None => format!(
                    "no cap from HAMi-core's variables ({} set, which name{} no cap for GPU {n})",
                    hami.source(),
                    if hami.source().contains(", ") {
                        ""
                    } else {
                        "s"
                    }
                ),
            };
            return Err(format!(
                "disagrees with HAMi-core's CUDA_DEVICE_MEMORY_LIMIT* variables: GPU {n} gets {} \
                 from GPUCAP_LIMIT but {theirs}; set only one of them (GPUCAP_LIMIT={} alone \
                 caps what HAMi-core's do), or both to the same cap for every GPU",
                show(a),
                hami_as_gpucap_limit(hami)
            ));
        }
    }
    Ok(())
}

/// HAMi-core's caps written as a `GPUCAP_LIMIT` (`8Gi`, `0=8Gi,1=512Mi`), with the
/// largest binary unit that keeps each one exact, for messages.
fn hami_as_gpucap_limit(hami: &LimitSpec) -> String {
    let text = |l: &Limit| match *l {
        Limit::Bytes(b) => exact_size(b),
        Limit::Fraction(_) => l.to_string(),
    };
    let mut items: Vec<String> = hami.default.iter().map(text).collect();
    for (k, l) in &hami.devices {
        if let DeviceKey::Ordinal(n) = k {
            items.push(format!("{n}={}", text(l)));
        }
    }
    items.join(",")
}

/// `b` bytes as a size GPUCAP_LIMIT reads back exactly: `8Gi`, `1536Mi`, `4Ki`, `1000B`.
fn exact_size(b: u64) -> String {
    for (unit, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        if b != 0 && b.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}B")
}

/// HAMi-core's variables as read so far (first occurrence of each name).
#[derive(Default)]
pub(super) struct Hami {
    all: Option<(String, u64)>,
    gpus: Vec<(u32, String, u64)>,
    pub(super) notes: Vec<String>,
    seen: Vec<String>,
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`: the pool's file.
    pub(super) shared_cache: Option<String>,
}

impl Hami {
    /// Reads one `CUDA_DEVICE_MEMORY_*` variable.
    pub(super) fn add(&mut self, k: &OsStr, v: &OsStr) -> Result<(), ConfigError> {
        let name = k.to_string_lossy().into_owned();
        let bad = |reason: String, accepted: &'static str| ConfigError {
            var: name.clone(),
            value: v.to_string_lossy().into_owned(),
            reason,
            accepted,
        };
        let kind = hami_name(&name).map_err(|r| bad(r, ""))?;
        let accepted = match kind {
            HamiName::SharedCache => "an absolute file path (the pool's file)",
            _ => HAMI_ACCEPTED,
        };
        let Some(value) = v.to_str() else {
            return Err(bad("the value is not valid UTF-8".into(), accepted));
        };
        if self.seen.contains(&name) {
            return Ok(()); // first occurrence wins, like getenv
        }
        self.seen.push(name.clone());
        match kind {
            HamiName::SharedCache => {
                if value.is_empty() {
                    return Err(bad("empty value".into(), accepted));
                }
                match parse_pool_spec(value) {
                    Ok(PoolSpec::Path(_)) => self.shared_cache = Some(value.to_string()),
                    Ok(PoolSpec::Name(_) | PoolSpec::Claim(_)) => {
                        return Err(bad(
                            "a path must be absolute (every process must name the same file)"
                                .into(),
                            accepted,
                        ));
                    }
                    Err(r) => return Err(bad(r, accepted)),
                }
            }
            HamiName::All => {
                let b = parse_hami_value(value).map_err(|r| bad(r, accepted))?;
                self.all = Some((value.to_string(), b));
            }
            HamiName::Gpu(n) => {
                let b = parse_hami_value(value).map_err(|r| bad(r, accepted))?;
                self.gpus.push((n, value.to_string(), b));
            }
        }
        Ok(())
    }

    /// The limit they give, if any limit variable was set.
    pub(super) fn spec(&self) -> Option<LimitSpec> {
        if self.all.is_none() && self.gpus.is_empty() {
            return None;
        }
        let gpus: Vec<(u32, u64)> = self.gpus.iter().map(|&(n, _, b)| (n, b)).collect();
        Some(hami_spec(self.all.as_ref().map(|&(_, b)| b), &gpus))
    }

    /// The variables a cap came from, for `gpucap check`.
    pub(super) fn origins(&self, driver: &'static str) -> Vec<Origin> {
        let mut out: Vec<Origin> = Vec::new();
        if let Some((v, _)) = &self.all {
            out.push(Origin {
                var: HAMI_LIMIT.into(),
                value: v.clone(),
                driver,
                key: None,
            });
        }
        for (n, v, _) in &self.gpus {
            out.push(Origin {
                var: format!("{HAMI_LIMIT}_{n}"),
                value: v.clone(),
                driver,
                key: Some(DeviceKey::Ordinal(*n)),
            });
        }
        out
    }

    /// `CUDA_DEVICE_MEMORY_LIMIT=8g, CUDA_DEVICE_MEMORY_LIMIT_1=4g`, for messages.
    pub(super) fn listing(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        if let Some((v, _)) = &self.all {
            out.push(format!("{HAMI_LIMIT}={v}"));
        }
        for (n, v, _) in &self.gpus {
            out.push(format!("{HAMI_LIMIT}_{n}={v}"));
        }
        out.join(", ")
    }
}

/// The note for a HAMi-core variable gpucap does not act on, if `k` is one.
pub(super) fn hami_ignored_note(k: &OsStr) -> Option<String> {
    let name = k.to_str()?;
    HAMI_IGNORED.iter().find_map(|&(var, what)| {
        let matches = name == var
            || (var == "CUDA_DEVICE_SM_LIMIT"
                && name
                    .strip_prefix("CUDA_DEVICE_SM_LIMIT_")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())));
        matches.then(|| format!("note: {name} is {what}; gpucap ignores it"))
    })
}
