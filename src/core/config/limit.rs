//! Limits: a cap per device (bytes or a fraction of the device), device keys (CUDA
//! ordinals, GPU and MIG UUIDs) and `GPUCAP_LIMIT`'s grammar.

use std::fmt;

use crate::size::{UNITS_LIST, format_bytes, parse_size};

/// Devices are CUDA ordinals below this.
pub const MAX_DEVICES: usize = 64;

/// Accepted forms of each variable, for error messages.
pub const LIMIT_ACCEPTED: &str = "8Gi, 512MiB, 1073741824, 50%, 0.5, 0=8Gi,1=50%, 4Gi,1=8Gi, \
     GPU-<uuid>=8Gi, MIG-<uuid>=4Gi, none (no cap, on purpose)";

/// Whether a `GPUCAP_LIMIT` value is `none` (any case): no cap, said on purpose. The
/// configuration then has no limit, as with the variable unset, but `gpucap run` does
/// not warn that the program runs uncapped, and a `gpucap.env` file is not read instead.
pub fn limit_is_none(value: &str) -> bool {
    value.trim().eq_ignore_ascii_case("none")
}

/// A memory cap for one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// A fixed number of bytes (never 0).
    Bytes(u64),
    /// A share of the device's physical memory, in (0, 1].
    Fraction(f64),
}

impl Limit {
    /// The cap in bytes for a device with `physical_total` bytes of memory. Fractions round
    /// down. A byte cap is returned as is, even when larger than the device.
    pub fn resolve(&self, physical_total: u64) -> u64 {
        match *self {
            Limit::Bytes(b) => b,
            Limit::Fraction(f) => (physical_total as f64 * f) as u64,
        }
    }
}

/// Formats `x` with at most two decimals, trailing zeros dropped.
pub(crate) fn trim_decimals(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// A percentage with two decimals (`12.5`), and below 1 with two significant digits
/// (`0.00001`, `0.0025`): a positive share is never shown as `0`, nor rounded up.
fn percent_text(pct: f64) -> String {
    if pct > 0.0 && pct < 1.0 {
        // The zeros after the point, counted by multiplying (not `log10`: an import of
        // libm's, and libm loaded at every process's start).
        let (mut zeros, mut x) = (0, pct);
        while x < 1.0 && zeros < 40 {
            x *= 10.0;
            zeros += 1;
        }
        let decimals = (zeros + 1).max(2);
        let s = format!("{pct:.decimals$}");
        return s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    trim_decimals(pct)
}

impl fmt::Display for Limit {
    /// `8 GiB`, `1.5 GiB`, `50%`, `12.5%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Limit::Bytes(b) => f.write_str(&format_bytes(b)),
            Limit::Fraction(x) => write!(f, "{}%", percent_text(x * 100.0)),
        }
    }
}

/// Which device a per-device limit applies to.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceKey {
    /// A CUDA ordinal as the process sees it (after `CUDA_VISIBLE_DEVICES`), < MAX_DEVICES.
    Ordinal(u32),
    /// A GPU or MIG instance by UUID (`GPU-…`/`MIG-…`, as `nvidia-smi -L` prints them).
    /// The shim maps it to an ordinal with `cuDeviceGetUuid_v2` at first use; a UUID that
    /// matches no visible device is an error there.
    Uuid(DeviceUuid),
}

/// A device UUID: the 16 bytes `cuDeviceGetUuid_v2`/`nvmlDeviceGetUUID` name, and whether
/// it was written as a MIG instance (`MIG-…`) or a whole GPU (`GPU-…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceUuid {
    pub mig: bool,
    pub bytes: [u8; 16],
}

impl DeviceUuid {
    /// Parses `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` or `MIG-…` (prefix and hex in any case).
    ///
    /// Any string is safe to pass: prefixes are compared as bytes and the text is never
    /// sliced at a byte offset, so a multi-byte character anywhere is an error, not a panic.
    pub fn parse(s: &str) -> Result<DeviceUuid, String> {
        let mig = if starts_with_ignore_case(s, "GPU-") {
            false
        } else if starts_with_ignore_case(s, "MIG-") {
            true
        } else {
            return Err(format!("{s:?} is not a GPU-… or MIG-… UUID"));
        };
        let kind = if mig { "MIG" } else { "GPU" };
        // The prefix is 4 ASCII bytes, so byte 4 is a character boundary.
        let hex = s.get(4..).unwrap_or_default();
        if mig && starts_with_ignore_case(hex, "GPU-") {
            return Err(format!(
                "{s:?} is the old MIG-GPU-<uuid>/<gi>/<ci> form; use the MIG-… UUID that \
                 `nvidia-smi -L` prints for the instance (driver R470 and later)"
            ));
        }
        let not_a_uuid = || {
            format!(
                "{s:?} is not a UUID (expected {kind}-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in hex)"
            )
        };
        let lens: Vec<usize> = hex.split('-').map(str::len).collect();
        if lens != [8, 4, 4, 4, 12] {
            return Err(not_a_uuid());
        }
        // 32 hex digits, each one ASCII character: their values, then pairs of them.
        let nibbles: Option<Vec<u8>> = hex
            .chars()
            .filter(|&c| c != '-')
            .map(|c| c.to_digit(16).and_then(|d| u8::try_from(d).ok()))
            .collect();
        let nibbles = nibbles.ok_or_else(not_a_uuid)?;
        let mut bytes = [0u8; 16];
        if nibbles.len() != 2 * bytes.len() {
            return Err(not_a_uuid());
        }
        for (b, pair) in bytes.iter_mut().zip(nibbles.chunks_exact(2)) {
            *b = pair.iter().fold(0, |acc, n| (acc << 4) | n);
        }
        Ok(DeviceUuid { mig, bytes })
    }
}

/// Does `s` start with the ASCII `prefix`, in any case? Compares bytes, so it is safe
/// whatever characters `s` holds (slicing `s` at `prefix.len()` may not be).
pub(crate) fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (`MIG-` for an instance), lowercase hex.
pub fn format_uuid(mig: bool, b: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "{}-{}-{}-{}-{}-{}",
        if mig { "MIG" } else { "GPU" },
        h(0..4),
        h(4..6),
        h(6..8),
        h(8..10),
        h(10..16)
    )
}

impl fmt::Display for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_uuid(self.mig, &self.bytes))
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKey::Ordinal(n) => write!(f, "GPU {n}"),
            DeviceKey::Uuid(u) => write!(f, "{u}"),
        }
    }
}

/// Which variables a limit was read from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LimitFrom {
    /// `GPUCAP_LIMIT` (or `--limit`).
    #[default]
    Gpucap,
    /// HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT` and `CUDA_DEVICE_MEMORY_LIMIT_<n>`.
    Hami,
    /// `GPUCAP_LIMIT` and HAMi-core's variables, which agree (see `check_agree`).
    Both,
    /// A driver's hand-over (`config::sources`): the variables, for messages.
    Handover(&'static str),
}

/// A parsed `GPUCAP_LIMIT`: a default for every device, and per-device overrides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimitSpec {
    /// The limit of devices not listed in `devices`; None = those are not capped.
    pub default: Option<Limit>,
    /// Per-device limits, in the order written; each device appears at most once.
    pub devices: Vec<(DeviceKey, Limit)>,
    /// Where it was read from.
    pub from: LimitFrom,
}

impl LimitSpec {
    /// The variable that gives device `ordinal` its cap, for messages: `GPUCAP_LIMIT`,
    /// or `CUDA_DEVICE_MEMORY_LIMIT_<n>` / `CUDA_DEVICE_MEMORY_LIMIT` for HAMi's.
    pub fn var_for_ordinal(&self, ordinal: u32) -> String {
        match self.from {
            LimitFrom::Gpucap | LimitFrom::Both => "GPUCAP_LIMIT".to_string(),
            LimitFrom::Handover(vars) => vars.to_string(),
            LimitFrom::Hami => {
                if self
                    .devices
                    .iter()
                    .any(|(k, _)| *k == DeviceKey::Ordinal(ordinal))
                {
                    format!("CUDA_DEVICE_MEMORY_LIMIT_{ordinal}")
                } else if self.default.is_some() {
                    "CUDA_DEVICE_MEMORY_LIMIT".to_string()
                } else {
                    "no variable".to_string()
                }
            }
        }
    }

    /// Where the limit came from, for `gpucap check`: `GPUCAP_LIMIT`,
    /// `CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_MEMORY_LIMIT_1`, ...
    pub fn source(&self) -> String {
        let hami = || {
            let mut names: Vec<String> = Vec::new();
            if self.default.is_some() {
                names.push("CUDA_DEVICE_MEMORY_LIMIT".to_string());
            }
            for (k, _) in &self.devices {
                if let DeviceKey::Ordinal(n) = k {
                    names.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{n}"));
                }
            }
            names.join(", ")
        };
        match self.from {
            LimitFrom::Gpucap => "GPUCAP_LIMIT".to_string(),
            LimitFrom::Hami => hami(),
            LimitFrom::Handover(vars) => vars.to_string(),
            LimitFrom::Both => {
                "GPUCAP_LIMIT, which agrees with HAMi-core's CUDA_DEVICE_MEMORY_LIMIT*".to_string()
            }
        }
    }

    /// The same limit as a `GPUCAP_LIMIT` value (bytes as whole numbers, so that it
    /// reads back exactly), or None when a device has a fraction (only byte caps are
    /// written this way: HAMi's variables, for `gpucap.env`).
    pub fn to_gpucap_limit(&self) -> Option<String> {
        // Below MIN_UNITLESS_BYTES a bare number is refused: those get their unit.
        let text = |l: &Limit| match l {
            Limit::Bytes(b) if *b < MIN_UNITLESS_BYTES => Some(format!("{b}B")),
            Limit::Bytes(b) => Some(b.to_string()),
            Limit::Fraction(_) => None,
        };
        let mut items = Vec::new();
        if let Some(d) = &self.default {
            items.push(text(d)?);
        }
        for (k, l) in &self.devices {
            let key = match k {
                DeviceKey::Ordinal(n) => n.to_string(),
                DeviceKey::Uuid(u) => u.to_string(),
            };
            items.push(format!("{key}={}", text(l)?));
        }
        (!items.is_empty()).then(|| items.join(","))
    }

    /// The limit of device `ordinal`: its own entry, else the default, else None (uncapped).
    pub fn for_ordinal(&self, ordinal: u32) -> Option<Limit> {
        self.devices
            .iter()
            .find(|(key, _)| matches!(key, DeviceKey::Ordinal(n) if *n == ordinal))
            .map(|&(_, limit)| limit)
            .or(self.default)
    }

    /// The limit of the device with CUDA ordinal `ordinal` and UUID `uuid` (the 16 bytes
    /// `cuDeviceGetUuid_v2` reports; None when unknown): the entry naming its UUID, else
    /// the one naming its ordinal, else the default. A UUID key matches on the bytes, so
    /// `GPU-…` and `MIG-…` spellings of the same UUID are the same device.
    pub fn for_device(&self, ordinal: u32, uuid: Option<&[u8; 16]>) -> Option<Limit> {
        let by_uuid = uuid.and_then(|want| {
            self.devices
                .iter()
                .find(|(key, _)| matches!(key, DeviceKey::Uuid(u) if u.bytes == *want))
        });
        by_uuid
            .map(|&(_, limit)| limit)
            .or_else(|| self.for_ordinal(ordinal))
    }

    /// The UUID keys, in the order written.
    pub fn uuid_keys(&self) -> impl Iterator<Item = &DeviceUuid> {
        self.devices.iter().filter_map(|(key, _)| match key {
            DeviceKey::Uuid(u) => Some(u),
            DeviceKey::Ordinal(_) => None,
        })
    }
}

/// Is `s` a plain decimal number: digits with at most one dot, not ending in the dot?
pub(crate) fn is_decimal(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    !(int.is_empty() && frac.is_empty()) && digits(int) && digits(frac) && !(s.ends_with('.'))
}

pub(crate) const ZERO_CAP: &str = "a cap of 0 bytes would make every allocation fail, which is almost \
     certainly a mistake (to count without capping, leave GPUCAP_LIMIT unset)";

/// One limit value: `8Gi`, `512MiB`, `1073741824`, `50%`, `12.5%`, `0.5`, `1.0`.
pub(crate) fn parse_limit(v: &str) -> Result<Limit, String> {
    if v.is_empty() {
        return Err("empty limit".to_string());
    }
    if v.starts_with('-') {
        return Err("a limit cannot be negative".to_string());
    }
    if let Some(pct) = v.strip_suffix('%') {
        if !is_decimal(pct) {
            return Err("not a percentage (write a number then %, e.g. 50% or 12.5%)".into());
        }
        let p: f64 = pct.parse().map_err(|_| "not a percentage".to_string())?;
        if !(p > 0.0 && p <= 100.0) {
            return Err("a percentage must be in (0%, 100%]".into());
        }
        return Ok(Limit::Fraction(p / 100.0));
    }
    if v.contains('.') && is_decimal(v) {
        // A plain number with a dot is a fraction of physical memory.
        let f: f64 = v.parse().map_err(|_| "not a number".to_string())?;
        if f == 0.0 {
            return Err(ZERO_CAP.into());
        }
        if f > 1.0 {
            return Err(format!(
                "a fraction must be in (0, 1], and a size needs a unit (e.g. {v}Gi) \
                 or must be whole bytes"
            ));
        }
        return Ok(Limit::Fraction(f));
    }
    // Everything else (including a plain integer: whole bytes) is a size.
    if v.bytes().all(|b| b.is_ascii_digit()) {
        unitless_bytes(v)?;
    }
    let bytes = parse_size(v).map_err(|e| {
        // parse_size lists its accepted forms; ConfigError lists GPUCAP_LIMIT's own.
        let reason = e.split("; accepted: ").next().unwrap_or(&e);
        if reason.starts_with("unknown unit") {
            format!("{reason} (units: {UNITS_LIST})")
        } else {
            reason.to_string()
        }
    })?;
    if bytes == 0 {
        return Err(ZERO_CAP.into());
    }
    Ok(Limit::Bytes(bytes))
}

/// A size in bytes as `GPUCAP_LIMIT` reads one (for `pool resize` and `pool set`): a
/// bare number under [`MIN_UNITLESS_BYTES`] is refused with the unit it probably lacks,
/// and `u64::MAX` (the pool file's word for no cap) is refused as past any GPU.
pub fn parse_cap_size(v: &str) -> Result<u64, String> {
    let v = v.trim();
    if v.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = v.parse::<u64>()
        && (1..MIN_UNITLESS_BYTES).contains(&n)
    {
        return Err(unitless_message(
            n,
            ["Gi", "Mi"],
            &format!("write {n}B if you do mean bytes"),
        ));
    }
    // A pool keeps a cap as its bytes + 1, and u64::MAX there is "no cap": the two
    // largest values cannot be caps.
    match parse_size(v)? {
        b if b >= u64::MAX - 1 => Err(format!(
            "{v:?} is past any GPU's memory (the most is {} bytes)",
            u64::MAX - 2
        )),
        b => Ok(b),
    }
}

/// The least number of bytes a size may give without a unit: a bare number below it
/// (`8`) is far more likely a cap in GiB with its unit forgotten than a cap of 8 bytes.
pub const MIN_UNITLESS_BYTES: u64 = 1 << 20;

/// The unit a bare number `n` was probably meant in, for the error's suggestion: Gi for
/// the numbers GPUs have gigabytes of, Mi above.
/// The least bare number not suggested as MiB: 512 GiB, more than any GPU has.
const LARGEST_MIB_SUGGESTED: u64 = 512 * 1024;

fn likely_unit(n: u64) -> &'static str {
    if n < 1024 { "Gi" } else { "Mi" }
}

/// Checks a size written without a unit (`digits`, ASCII digits only): it is bytes, and
/// must then be 0 (refused as [`ZERO_CAP`] by the caller) or at least
/// [`MIN_UNITLESS_BYTES`]. The error suggests the unit (`did you mean 8Gi?`).
pub(crate) fn unitless_bytes(digits: &str) -> Result<(), String> {
    match digits.parse::<u64>() {
        // Up to 100 it may as well be a percentage with its `%` forgotten: both are
        // suggested (`did you mean 50Gi? (or 50%, a share of the GPU?)`).
        Ok(n) if n > 0 && n < MIN_UNITLESS_BYTES => {
            Err(
                unitless_message(n, ["Gi", "Mi"], &format!("write {n}B if you do mean bytes"))
                    .replacen(
                        &format!("{n}Gi?"),
                        &format!("{n}Gi? (or {n}%, a share of the GPU?)"),
                        usize::from(n <= 100),
                    ),
            )
        }
        _ => Ok(()),
    }
}

/// The error for a bare `n` under [`MIN_UNITLESS_BYTES`]: `units` are this variable's
/// spellings of GiB and MiB, `bytes` says how to write a cap in bytes on purpose.
pub(crate) fn unitless_message(n: u64, units: [&str; 2], bytes: &str) -> String {
    let unit = if likely_unit(n) == "Gi" {
        units[0]
    } else {
        units[1]
    };
    // As MiB, more than any GPU has (512 GiB and up): bytes were meant, just too few.
    if n >= LARGEST_MIB_SUGGESTED {
        return format!(
            "{n} has no unit, so it would be a cap of {n} bytes, and {n}{unit} would be more \
             than any GPU has: did you mean 1{unit}? (a number without a unit is bytes and \
             must be at least {MIN_UNITLESS_BYTES}, 1 MiB; {bytes})"
        );
    }
    format!(
        "{n} has no unit, so it would be a cap of {n} bytes: did you mean {n}{unit}? (a \
         number without a unit is bytes and must be at least {MIN_UNITLESS_BYTES}, 1 MiB; \
         {bytes})"
    )
}

/// A device key: a CUDA ordinal below MAX_DEVICES, or a `GPU-…`/`MIG-…` UUID.
pub(crate) fn parse_device(k: &str) -> Result<DeviceKey, String> {
    if k.is_empty() {
        return Err("missing device before '='".to_string());
    }
    if starts_with_ignore_case(k, "GPU-") || starts_with_ignore_case(k, "MIG-") {
        return DeviceUuid::parse(k).map(DeviceKey::Uuid);
    }
    if !k.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "device {k:?} is not a CUDA ordinal (a whole number 0..{}) or a GPU-…/MIG-… UUID",
            MAX_DEVICES - 1
        ));
    }
    match k.parse::<u32>() {
        Ok(n) if (n as usize) < MAX_DEVICES => Ok(DeviceKey::Ordinal(n)),
        _ => Err(format!(
            "device {k:?} is out of range (CUDA ordinals 0..{} are supported)",
            MAX_DEVICES - 1
        )),
    }
}

/// Why `item`, a value that did not parse, reads as a GPU's own cap written with `:`
/// (`0:8Gi`, as some tools write a device's figure) instead of `=`; `None` where the part
/// before the first `:` is not a device.
fn colon_key(item: &str) -> Option<String> {
    let (k, v) = item.split_once(':')?;
    let (k, v) = (k.trim(), v.trim());
    (parse_device(k).is_ok() && !v.is_empty()).then(|| {
        format!("{item:?} names a GPU with ':'; a GPU's own figure is written with '=': {k}={v}")
    })
}

/// The notes a valid `GPUCAP_LIMIT` value (`value`, set as `var`) gets, one line each:
/// a size in decimal units, whose bytes are not that many GiB (`8GB is 8000000000
/// bytes, 7.45 GiB`), and a share below 1 % of the GPU (`0.5%`), almost never meant.
/// The shim says them when it reads its configuration, `gpucap check` prints them.
pub fn limit_notes(var: &str, value: &str) -> Vec<String> {
    let mut notes = Vec::new();
    for item in value.split(',') {
        let v = item.split_once('=').map_or(item, |(_, v)| v).trim();
        match parse_limit(v) {
            Ok(Limit::Bytes(b)) if crate::size::has_decimal_unit(v) => {
                let number = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
                let letter = v[number.len()..].chars().next().unwrap_or('G');
                notes.push(format!(
                    "note: {var}'s {v} is in decimal units: {b} bytes, {} (for binary units \
                     write {number}{}i)",
                    format_bytes(b),
                    letter.to_ascii_uppercase()
                ));
            }
            Ok(Limit::Fraction(f)) if f < 0.01 => notes.push(format!(
                "note: {var}'s {v} is {} of the GPU's memory, below 1 %",
                Limit::Fraction(f)
            )),
            _ => {}
        }
    }
    notes
}

/// Parses a `GPUCAP_LIMIT` value.
///
/// One value for every device (`8Gi`, `50%`, `0.5`), or a comma list of items, each either
/// `DEVICE=VALUE` (`0=8Gi,1=50%`) or a bare value, the default of the devices not listed
/// (`4Gi,1=8Gi`; at most one). DEVICE is a CUDA ordinal < MAX_DEVICES or a device UUID
/// (`GPU-…`, `MIG-…`; matched against the visible devices by the shim). VALUE is a size
/// (see `parse_size`; a plain integer is bytes, and must be at least 1 MiB: `8` is
/// refused with `did you mean 8Gi?`), a fraction in (0, 1] written with a dot
/// (`0.5`, `1.0`), or a percentage in (0%, 100%] (`50%`, `12.5%`). Zero is an error.
/// Whitespace around items, keys and values is ignored.
pub fn parse_limit_spec(value: &str) -> Result<LimitSpec, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("empty value (to count without capping, leave GPUCAP_LIMIT unset)".into());
    }
    let items: Vec<&str> = value.split(',').map(str::trim).collect();
    let many = items.len() > 1;
    let mut spec = LimitSpec::default();
    for (i, item) in items.iter().enumerate() {
        let in_item = |msg: String| {
            if many {
                format!("item {} ({item:?}): {msg}", i + 1)
            } else {
                msg
            }
        };
        if item.is_empty() {
            return Err(format!("item {} is empty (stray comma?)", i + 1));
        }
        match item.split_once('=') {
            Some((k, v)) => {
                let key = parse_device(k.trim()).map_err(in_item)?;
                let v = v.trim();
                if v.is_empty() {
                    return Err(in_item(format!("no limit after '{}='", k.trim())));
                }
                let limit = parse_limit(v).map_err(in_item)?;
                if spec.devices.iter().any(|(k2, _)| *k2 == key) {
                    return Err(in_item(format!("{key} is listed twice")));
                }
                spec.devices.push((key, limit));
            }
            None => {
                let limit = parse_limit(item).map_err(|e| in_item(colon_key(item).unwrap_or(e)))?;
                if spec.default.is_some() {
                    return Err(in_item(
                        "more than one default (bare) value; give the others a device, e.g. 1=8Gi"
                            .to_string(),
                    ));
                }
                spec.default = Some(limit);
            }
        }
    }
    Ok(spec)
}
