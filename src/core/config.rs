//! gpucap's configuration: the `GPUCAP_*` environment variables, parsed and validated.
//!
//! Part of gpucap-core, used by the shim and the CLI: plain safe Rust that only needs
//! `crate::size`. The variables are read by name from the pairs given (no envy: it
//! would only copy the same strings into a struct).
//!
//! Any error is returned as a [`ConfigError`]; callers must fail closed (refuse to start,
//! or refuse every allocation), never fall back to running uncapped.
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::size::{UNITS_LIST, format_bytes, parse_size};

/// Devices are CUDA ordinals below this.
pub const MAX_DEVICES: usize = 64;

/// The `GPUCAP_*` variables the shim and the CLI understand. Any other variable whose name
/// starts with `GPUCAP_` is an error (it is most likely a typo such as `GPUCAP_LIMT`).
pub const KNOWN_VARS: &[&str] = &[
    "GPUCAP_LIMIT",
    "GPUCAP_LOG",
    "GPUCAP_LIB",
    "GPUCAP_GROWTH",
    "GPUCAP_REPORT",
    "GPUCAP_LD_SO_PRELOAD",
    "GPUCAP_HOME",
];

/// `KNOWN_VARS` as one line, for error messages (a test keeps the two in step).
const KNOWN_VARS_LIST: &str = "GPUCAP_LIMIT, GPUCAP_LOG, GPUCAP_LIB, GPUCAP_GROWTH, \
     GPUCAP_REPORT, GPUCAP_LD_SO_PRELOAD, GPUCAP_HOME";

/// Accepted forms of each variable, for error messages.
pub const LIMIT_ACCEPTED: &str =
    "8Gi, 512MiB, 1073741824, 50%, 0.5, 0=8Gi,1=50%, 4Gi,1=8Gi, GPU-<uuid>=8Gi, MIG-<uuid>=4Gi";
pub const LOG_ACCEPTED: &str = "off, error, warn, info, debug";
pub const GROWTH_ACCEPTED: &str = "0, 1, true, false, yes, no, on, off";
pub const REPORT_ACCEPTED: &str = "a file path, e.g. /tmp/gpucap-report.json";
pub const LIB_ACCEPTED: &str = "the path of libgpucap.so";
pub const LD_SO_PRELOAD_ACCEPTED: &str = GROWTH_ACCEPTED;
pub const HOME_ACCEPTED: &str =
    "the directory holding gpucap, libgpucap.so and docker-entrypoint.sh";

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
fn trim_decimals(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

impl fmt::Display for Limit {
    /// `8 GiB`, `1.5 GiB`, `50%`, `12.5%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Limit::Bytes(b) => f.write_str(&format_bytes(b)),
            Limit::Fraction(x) => write!(f, "{}%", trim_decimals(x * 100.0)),
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
fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
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

/// A parsed `GPUCAP_LIMIT`: a default for every device, and per-device overrides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimitSpec {
    /// The limit of devices not listed in `devices`; None = those are not capped.
    pub default: Option<Limit>,
    /// Per-device limits, in the order written; each device appears at most once.
    pub devices: Vec<(DeviceKey, Limit)>,
}

impl LimitSpec {
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

    /// Checks the keys against the visible devices (`uuids[ordinal]`): every UUID key must
    /// name one of them, and no device may be named twice (by its ordinal and its UUID).
    /// The error names the key, for the shim to print before failing closed.
    pub fn check_keys(&self, uuids: &[[u8; 16]]) -> Result<(), String> {
        for key in self.uuid_keys() {
            let Some(ordinal) = uuids.iter().position(|u| *u == key.bytes) else {
                return Err(format!(
                    "GPUCAP_LIMIT names {key}, which matches none of the {} GPU(s) visible to \
                     CUDA (CUDA_VISIBLE_DEVICES may hide it; with MIG on, CUDA's devices are the \
                     MIG-… instances; `nvidia-smi -L` lists the UUIDs)",
                    uuids.len()
                ));
            };
            if self
                .devices
                .iter()
                .any(|(k, _)| *k == DeviceKey::Ordinal(ordinal as u32))
            {
                return Err(format!(
                    "GPUCAP_LIMIT names GPU {ordinal} twice: by its ordinal and as {key}"
                ));
            }
        }
        Ok(())
    }

    /// Checks every key against the GPUs visible to CUDA, as the shim does at `cuInit`
    /// and `gpucap run`/`gpucap check` do before the program starts: an ordinal key must
    /// be below `count` (the visible GPUs, after `CUDA_VISIBLE_DEVICES`; None when the
    /// driver could not say), and the UUID keys must pass [`LimitSpec::check_keys`]
    /// against `uuids()` (the visible GPUs' UUIDs by ordinal, asked for only when there
    /// are UUID keys; None when the driver could not list them). A key that matches no
    /// visible GPU would otherwise cap nothing, silently. The error is the one line to
    /// print, `gpucap: GPUCAP_LIMIT names GPU 1, but ...`.
    pub fn check_visible<'a>(
        &self,
        count: Option<usize>,
        uuids: impl FnOnce() -> Option<&'a [[u8; 16]]>,
    ) -> Result<(), String> {
        for (key, _) in &self.devices {
            let DeviceKey::Ordinal(n) = *key else {
                continue;
            };
            let Some(count) = count else {
                return Err(format!(
                    "gpucap: GPUCAP_LIMIT names {key}, but the driver could not say how many \
                     GPUs are visible to CUDA"
                ));
            };
            if n as usize >= count {
                let visible = match count {
                    0 => "no GPU is visible to CUDA".to_string(),
                    1 => "only 1 GPU is visible to CUDA (GPU 0)".to_string(),
                    c => format!("only {c} GPUs are visible to CUDA (GPU 0 to GPU {})", c - 1),
                };
                return Err(format!(
                    "gpucap: GPUCAP_LIMIT names {key}, but {visible}; ordinals count the GPUs \
                     CUDA_VISIBLE_DEVICES leaves visible, from 0"
                ));
            }
        }
        let Some(first) = self.uuid_keys().next() else {
            return Ok(());
        };
        match uuids() {
            Some(v) => self.check_keys(v),
            None => Err(format!(
                "GPUCAP_LIMIT names {first}, but the driver could not list the UUIDs of the \
                 visible GPUs"
            )),
        }
        .map_err(|msg| format!("gpucap: {msg}"))
    }
}

/// How much the shim logs (to stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `GPUCAP_LIMIT`; None = unset: allocations are counted, not capped.
    pub limit: Option<LimitSpec>,
    /// `GPUCAP_LOG`, default `warn`.
    pub log: LogLevel,
    /// `GPUCAP_GROWTH` (reserved; validated, not yet used), default false.
    pub growth: bool,
    /// `GPUCAP_REPORT`: where the shim writes its JSON usage report at exit (`%p` is
    /// replaced by the process id). See src/report.rs.
    pub report: Option<PathBuf>,
    /// `GPUCAP_LD_SO_PRELOAD`: the container entrypoint also installs the shim in
    /// `/etc/ld.so.preload`. Only scripts/docker-entrypoint.sh acts on it.
    pub ld_so_preload: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limit: None,
            log: LogLevel::Warn,
            growth: false,
            report: None,
            ld_so_preload: false,
        }
    }
}

/// A bad `GPUCAP_*` variable. Displays as one line:
/// `gpucap: invalid GPUCAP_LIMIT="150%": a percentage must be in (0%, 100%]; accepted: ...`
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// The variable's name.
    pub var: String,
    /// Its value (lossily converted if it was not UTF-8).
    pub value: String,
    /// What is wrong.
    pub reason: String,
    /// The forms that would have been accepted ("" = none to show).
    pub accepted: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The name is escaped like the value: a line break in it stays on one line.
        write!(
            f,
            "gpucap: invalid {}={:?}: {}",
            self.var.escape_debug(),
            self.value,
            self.reason
        )?;
        if !self.accepted.is_empty() {
            write!(f, "; accepted: {}", self.accepted)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Is `s` a plain decimal number: digits with at most one dot, not ending in the dot?
fn is_decimal(s: &str) -> bool {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    !(int.is_empty() && frac.is_empty()) && digits(int) && digits(frac) && !(s.ends_with('.'))
}

const ZERO_CAP: &str = "a cap of 0 bytes would make every allocation fail, which is almost \
     certainly a mistake (to count without capping, leave GPUCAP_LIMIT unset)";

/// One limit value: `8Gi`, `512MiB`, `1073741824`, `50%`, `12.5%`, `0.5`, `1.0`.
fn parse_limit(v: &str) -> Result<Limit, String> {
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

/// A device key: a CUDA ordinal below MAX_DEVICES, or a `GPU-…`/`MIG-…` UUID.
fn parse_device(k: &str) -> Result<DeviceKey, String> {
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

/// Parses a `GPUCAP_LIMIT` value.
///
/// One value for every device (`8Gi`, `50%`, `0.5`), or a comma list of items, each either
/// `DEVICE=VALUE` (`0=8Gi,1=50%`) or a bare value, the default of the devices not listed
/// (`4Gi,1=8Gi`; at most one). DEVICE is a CUDA ordinal < MAX_DEVICES or a device UUID
/// (`GPU-…`, `MIG-…`; matched against the visible devices by the shim). VALUE is a size
/// (see `parse_size`; a plain integer is bytes), a fraction in (0, 1] written with a dot
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
                let limit = parse_limit(item).map_err(in_item)?;
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

/// Parses a `GPUCAP_LOG` value: `off`, `error`, `warn`, `info` or `debug`, any case.
pub fn parse_log_level(value: &str) -> Result<LogLevel, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "off" => Ok(LogLevel::Off),
        "error" => Ok(LogLevel::Error),
        "warn" => Ok(LogLevel::Warn),
        "info" => Ok(LogLevel::Info),
        "debug" => Ok(LogLevel::Debug),
        "" => Err("empty value".to_string()),
        _ => Err("unknown log level".to_string()),
    }
}

/// Parses a `GPUCAP_GROWTH` value.
fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        "" => Err("empty value".to_string()),
        _ => Err("not a yes/no value".to_string()),
    }
}

const PREFIX: &str = "GPUCAP_";

/// Builds the configuration from `(name, value)` pairs, e.g. `std::env::vars_os()`.
///
/// Only variables whose name starts with `GPUCAP_` are looked at; other variables,
/// non-UTF-8 ones included, are ignored. A `GPUCAP_*` name not in [`KNOWN_VARS`], a
/// non-UTF-8 value, an empty value or an invalid value is an error. When a name occurs
/// twice, the first occurrence wins (as with `getenv`).
pub fn from_vars<I, K, V>(vars: I) -> Result<Config, ConfigError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut ours: Vec<(String, String)> = Vec::new();
    for (k, v) in vars {
        let (k, v) = (k.as_ref(), v.as_ref());
        if !k.as_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let name = k.to_string_lossy();
        let Some(&known) = KNOWN_VARS.iter().find(|&&n| n == name) else {
            return Err(ConfigError {
                var: name.into_owned(),
                value: v.to_string_lossy().into_owned(),
                reason: format!(
                    "unknown gpucap variable (a typo?); the known variables are {KNOWN_VARS_LIST}"
                ),
                accepted: "",
            });
        };
        let Some(value) = v.to_str() else {
            return Err(ConfigError {
                var: known.to_string(),
                value: v.to_string_lossy().into_owned(),
                reason: "the value is not valid UTF-8".into(),
                accepted: accepted_of(known),
            });
        };
        if ours.iter().any(|(n, _)| n == known) {
            continue; // first occurrence wins, like getenv
        }
        if value.trim().is_empty() {
            return Err(ConfigError {
                var: known.to_string(),
                value: value.to_string(),
                reason: format!("empty value (unset {known} instead of setting it empty)"),
                accepted: accepted_of(known),
            });
        }
        ours.push((known.to_string(), value.to_string()));
    }

    // The value of a known variable, as given (the first occurrence).
    let raw = |name: &str| {
        ours.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };

    let bad = |var: &str, value: &str, reason: String| ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        reason,
        accepted: accepted_of(var),
    };
    let mut config = Config::default();
    if let Some(v) = raw("GPUCAP_LIMIT") {
        config.limit = Some(parse_limit_spec(v).map_err(|r| bad("GPUCAP_LIMIT", v, r))?);
    }
    if let Some(v) = raw("GPUCAP_LOG") {
        config.log = parse_log_level(v).map_err(|r| bad("GPUCAP_LOG", v, r))?;
    }
    if let Some(v) = raw("GPUCAP_GROWTH") {
        config.growth = parse_bool(v).map_err(|r| bad("GPUCAP_GROWTH", v, r))?;
    }
    if let Some(v) = raw("GPUCAP_REPORT") {
        config.report = Some(PathBuf::from(v));
    }
    if let Some(v) = raw("GPUCAP_LD_SO_PRELOAD") {
        config.ld_so_preload = parse_bool(v).map_err(|r| bad("GPUCAP_LD_SO_PRELOAD", v, r))?;
    }
    // GPUCAP_LIB is the CLI's business and GPUCAP_HOME the entrypoint's; only their
    // emptiness was checked above.
    Ok(config)
}

fn accepted_of(var: &str) -> &'static str {
    match var {
        "GPUCAP_LIMIT" => LIMIT_ACCEPTED,
        "GPUCAP_LOG" => LOG_ACCEPTED,
        "GPUCAP_GROWTH" => GROWTH_ACCEPTED,
        "GPUCAP_REPORT" => REPORT_ACCEPTED,
        "GPUCAP_LIB" => LIB_ACCEPTED,
        "GPUCAP_LD_SO_PRELOAD" => LD_SO_PRELOAD_ACCEPTED,
        "GPUCAP_HOME" => HOME_ACCEPTED,
        _ => KNOWN_VARS_LIST,
    }
}

/// `from_vars(std::env::vars_os())`.
pub fn from_env() -> Result<Config, ConfigError> {
    from_vars(std::env::vars_os())
}

// ---- the configuration file ----------------------------------------------------------
//
// A process whose environment was emptied (`ssh`, `su -`, `sudo`, `env -i`) but that
// still loads the shim (`/etc/ld.so.preload`, or an explicit LD_PRELOAD) must stay
// capped. The container entrypoint therefore writes the validated `GPUCAP_*`
// variables to `gpucap.env` beside libgpucap.so (`gpucap check --write-env FILE`), and
// the shim reads that file, or else `/etc/gpucap/gpucap.env`, when its environment
// has no `GPUCAP_*` variable at all. The file replaces the (empty) environment
// configuration as a whole; it is never merged with variables that are set.

/// The name of the configuration file the shim looks for beside itself.
pub const ENV_FILE_NAME: &str = "gpucap.env";

/// Where the shim looks when there is no `gpucap.env` beside it.
pub const ETC_ENV_FILE: &str = "/etc/gpucap/gpucap.env";

/// Does `vars` hold any `GPUCAP_*` variable (whatever its value)? If not, the shim
/// falls back to the configuration file.
pub fn has_gpucap_vars<I, K, V>(vars: I) -> bool
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
{
    vars.into_iter()
        .any(|(k, _)| k.as_ref().as_bytes().starts_with(PREFIX.as_bytes()))
}

/// The configuration of the first configuration file that exists: `gpucap.env` in
/// `lib_dir` (the directory of libgpucap.so), then [`ETC_ENV_FILE`]. `Ok(None)` when
/// there is neither; an unreadable or invalid file is an error naming it. Used by the
/// shim for a process whose environment has no `GPUCAP_*` variable, and by
/// `gpucap check` to show what the shim would read.
pub fn from_env_files(
    lib_dir: Option<&std::path::Path>,
) -> Result<Option<(Config, std::path::PathBuf)>, String> {
    use std::io::ErrorKind;
    let beside = lib_dir.map(|d| d.join(ENV_FILE_NAME));
    for file in beside
        .into_iter()
        .chain([std::path::PathBuf::from(ETC_ENV_FILE)])
    {
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                continue;
            }
            Err(e) => {
                return Err(format!(
                    "gpucap: cannot read the configuration file {}: {e}",
                    file.display()
                ));
            }
        };
        let pairs = String::from_utf8(bytes)
            .map_err(|_| "not UTF-8 text".to_string())
            .and_then(|t| parse_env_file(&t))
            .map_err(|why| {
                format!(
                    "gpucap: invalid configuration file {}: {why}",
                    file.display()
                )
            })?;
        return match from_vars(pairs) {
            Ok(c) => Ok(Some((c, file))),
            Err(e) => Err(format!("{e} (in {})", file.display())),
        };
    }
    Ok(None)
}

/// Parses a `gpucap.env` file: one `GPUCAP_NAME=value` per line, the value taken
/// verbatim up to the end of the line (no quoting, no `export`); blank lines and
/// lines starting with `#` are skipped. Anything else is an error naming the line:
/// the file stands in for the environment, so a damaged one must fail closed.
/// The pairs go to [`from_vars`], which validates names and values.
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((name, value)) = trimmed.split_once('=') else {
            return Err(format!("line {}: expected GPUCAP_NAME=value", i + 1));
        };
        if !name.starts_with(PREFIX) || name.contains(char::is_whitespace) {
            return Err(format!(
                "line {}: {name:?} is not a GPUCAP_* variable name (only those belong here)",
                i + 1
            ));
        }
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

/// The text of a `gpucap.env` file holding `vars` (the `GPUCAP_*` ones only, in
/// order, first occurrence of each name). A value with a line break cannot be
/// written (the format has no quoting): an error naming the variable.
pub fn format_env_file<I, K, V>(vars: I) -> Result<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut text = String::from(
        "# gpucap configuration, written by `gpucap check --write-env` (the container\n\
         # entrypoint). The shim reads it when its environment has no GPUCAP_* variable.\n",
    );
    let mut seen: Vec<String> = Vec::new();
    for (k, v) in vars {
        let (k, v) = (k.as_ref(), v.as_ref());
        if !k.as_bytes().starts_with(PREFIX.as_bytes()) {
            continue;
        }
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            return Err(format!("{} is not valid UTF-8", k.to_string_lossy()));
        };
        if seen.iter().any(|s| s == k) {
            continue;
        }
        if v.contains(['\n', '\r']) {
            return Err(format!(
                "{k} contains a line break, which {ENV_FILE_NAME} cannot hold"
            ));
        }
        text.push_str(&format!("{k}={v}\n"));
        seen.push(k.to_string());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    const GI: u64 = 1 << 30;

    fn spec(s: &str) -> LimitSpec {
        parse_limit_spec(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn single(s: &str) -> Limit {
        let sp = spec(s);
        assert!(sp.devices.is_empty());
        sp.default.unwrap()
    }

    fn spec_err(s: &str) -> String {
        parse_limit_spec(s).expect_err(s)
    }

    #[test]
    fn single_values() {
        assert_eq!(single("8Gi"), Limit::Bytes(8 * GI));
        assert_eq!(single("512MiB"), Limit::Bytes(512 << 20));
        assert_eq!(single("1073741824"), Limit::Bytes(GI));
        assert_eq!(single("1"), Limit::Bytes(1)); // a plain integer is bytes
        assert_eq!(single("1.5Gi"), Limit::Bytes(1_610_612_736));
        assert_eq!(single("4G"), Limit::Bytes(4_000_000_000));
        assert_eq!(single("50%"), Limit::Fraction(0.5));
        assert_eq!(single("12.5%"), Limit::Fraction(0.125));
        assert_eq!(single("100%"), Limit::Fraction(1.0));
        assert_eq!(single("0.5"), Limit::Fraction(0.5));
        assert_eq!(single(".25"), Limit::Fraction(0.25));
        assert_eq!(single("1.0"), Limit::Fraction(1.0));
        assert_eq!(single("  8Gi  "), Limit::Bytes(8 * GI));
    }

    #[test]
    fn lists() {
        assert_eq!(
            spec("0=8Gi,1=50%"),
            LimitSpec {
                default: None,
                devices: vec![
                    (DeviceKey::Ordinal(0), Limit::Bytes(8 * GI)),
                    (DeviceKey::Ordinal(1), Limit::Fraction(0.5)),
                ],
            }
        );
        assert_eq!(
            spec("4Gi,1=8Gi"),
            LimitSpec {
                default: Some(Limit::Bytes(4 * GI)),
                devices: vec![(DeviceKey::Ordinal(1), Limit::Bytes(8 * GI))],
            }
        );
        // The default may come anywhere; whitespace is trimmed everywhere.
        assert_eq!(spec(" 1 = 8Gi , 4Gi "), spec("4Gi,1=8Gi"));
        assert_eq!(
            spec("63=1Gi").devices,
            vec![(DeviceKey::Ordinal(63), Limit::Bytes(GI))]
        );
        assert_eq!(spec("0=0.25").devices[0].1, Limit::Fraction(0.25));
    }

    #[test]
    fn for_ordinal() {
        let s = spec("4Gi,1=8Gi");
        assert_eq!(s.for_ordinal(0), Some(Limit::Bytes(4 * GI)));
        assert_eq!(s.for_ordinal(1), Some(Limit::Bytes(8 * GI)));
        assert_eq!(s.for_ordinal(7), Some(Limit::Bytes(4 * GI)));
        let s = spec("0=8Gi,1=50%");
        assert_eq!(s.for_ordinal(1), Some(Limit::Fraction(0.5)));
        assert_eq!(s.for_ordinal(2), None);
    }

    #[test]
    fn uuid_keys() {
        const G2: &str = "GPU-face0000-0000-0000-0000-000000000002";
        let s = spec(&format!("1Gi,{G2}=2Gi,1=3Gi"));
        let DeviceKey::Uuid(u) = &s.devices[0].0 else {
            panic!("{s:?}")
        };
        assert!(!u.mig);
        assert_eq!(
            u.bytes,
            [0xfa, 0xce, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]
        );
        assert_eq!(u.to_string(), G2);
        assert_eq!(s.devices[0].0.to_string(), G2);
        // Upper case and a MIG spelling parse to the same bytes; display is canonical.
        let m = spec("mig-FACE0000-0000-0000-0000-000000000002=4Gi");
        let DeviceKey::Uuid(mu) = &m.devices[0].0 else {
            panic!()
        };
        assert!(mu.mig);
        assert_eq!(mu.bytes, u.bytes);
        assert_eq!(mu.to_string(), "MIG-face0000-0000-0000-0000-000000000002");
        // By UUID first, then by ordinal, then the default.
        let u2 = u.bytes;
        let mut u0 = u2;
        u0[15] = 0;
        assert_eq!(s.for_device(0, Some(&u2)), Some(Limit::Bytes(2 * GI)));
        assert_eq!(s.for_device(1, Some(&u0)), Some(Limit::Bytes(3 * GI)));
        assert_eq!(s.for_device(0, Some(&u0)), Some(Limit::Bytes(GI)));
        assert_eq!(s.for_device(0, None), Some(Limit::Bytes(GI)));
        assert_eq!(
            s.for_ordinal(0),
            Some(Limit::Bytes(GI)),
            "for_ordinal ignores UUID keys"
        );
        assert_eq!(s.uuid_keys().count(), 1);
        // Checking against the visible devices.
        assert!(s.check_keys(&[u0, [9; 16], u2]).is_ok());
        let e = s.check_keys(&[u0, [9; 16]]).unwrap_err();
        assert!(
            e.contains(G2) && e.contains("matches none of the 2 GPU(s)"),
            "{e}"
        );
        let e = s.check_keys(&[u0, u2]).unwrap_err();
        assert!(e.contains("names GPU 1 twice") && e.contains(G2), "{e}");
        assert!(spec("4Gi").check_keys(&[]).is_ok());
    }

    #[test]
    fn resolve_and_display() {
        assert_eq!(Limit::Bytes(8 * GI).resolve(80 * GI), 8 * GI);
        assert_eq!(Limit::Bytes(100 * GI).resolve(80 * GI), 100 * GI);
        assert_eq!(Limit::Fraction(0.5).resolve(80 * GI), 40 * GI);
        assert_eq!(Limit::Fraction(1.0).resolve(85_899_345_920), 85_899_345_920);
        assert_eq!(Limit::Fraction(1.0 / 3.0).resolve(10), 3);
        assert_eq!(Limit::Bytes(8 * GI).to_string(), "8 GiB");
        assert_eq!(Limit::Bytes(GI + GI / 2).to_string(), "1.5 GiB");
        assert_eq!(Limit::Fraction(0.5).to_string(), "50%");
        assert_eq!(Limit::Fraction(0.125).to_string(), "12.5%");
        assert_eq!(Limit::Fraction(1.0).to_string(), "100%");
        assert_eq!(Limit::Fraction(1.0 / 3.0).to_string(), "33.33%");
    }

    #[test]
    fn bad_limits() {
        for (input, needle) in [
            ("", "empty value"),
            ("   ", "empty value"),
            ("abc", "does not start with a number"),
            ("150%", "(0%, 100%]"),
            ("0%", "(0%, 100%]"),
            ("-5%", "negative"),
            ("abc%", "not a percentage"),
            ("%", "not a percentage"),
            ("-1Gi", "negative"),
            ("8Gb", "unknown unit"),
            ("8XiB", "unknown unit"),
            ("8 Gi", "whitespace"),
            ("0", "cap of 0 bytes"),
            ("0Gi", "cap of 0 bytes"),
            ("0.0", "cap of 0 bytes"),
            ("0.0%", "(0%, 100%]"),
            ("2.5", "a fraction must be in (0, 1]"),
            ("1.01", "a fraction must be in (0, 1]"),
            ("1.", "not a number"),
            ("18446744073709551616", "too large"),
            ("4Gi,,1=2Gi", "item 2 is empty"),
            ("4Gi,", "item 2 is empty"),
            (",4Gi", "item 1 is empty"),
            ("4Gi,8Gi", "more than one default"),
            ("0=1Gi,0=2Gi", "GPU 0 is listed twice"),
            ("0=1Gi, 00=2Gi", "GPU 0 is listed twice"),
            ("0=", "no limit after '0='"),
            ("0=  ,1=1Gi", "no limit after '0='"),
            ("=8Gi", "missing device"),
            ("64=1Gi", "out of range"),
            ("99999999999=1Gi", "out of range"),
            ("-1=1Gi", "not a CUDA ordinal"),
            ("GPU-0=1Gi", "is not a UUID"),
            ("GPU=1Gi", "not a CUDA ordinal"),
            (
                "MIG-GPU-face0000-0000-0000-0000-000000000001/1/0=1Gi",
                "old MIG-GPU-",
            ),
            (
                "GPU-face0000-0000-0000-0000-00000000000g=1Gi",
                "is not a UUID",
            ),
            (
                "GPU-face0000-0000-0000-00000000000000001=1Gi",
                "is not a UUID",
            ),
            (
                "GPU-face0000-0000-0000-0000-000000000001=1Gi,gpu-FACE0000-0000-0000-0000-000000000001=2Gi",
                "is listed twice",
            ),
            ("a=1Gi", "not a CUDA ordinal"),
            ("0=abc", "does not start with a number"),
            ("0=8Gi=9Gi", "unknown unit"),
            ("1=150%,2Gi", "(0%, 100%]"),
        ] {
            let e = spec_err(input);
            assert!(e.contains(needle), "{input:?}: {e:?} lacks {needle:?}");
        }
        // In a list the error names the item.
        assert!(spec_err("4Gi,1=abc").starts_with("item 2 (\"1=abc\"): "));
    }

    #[test]
    fn log_levels() {
        assert_eq!(parse_log_level("off"), Ok(LogLevel::Off));
        assert_eq!(parse_log_level("error"), Ok(LogLevel::Error));
        assert_eq!(parse_log_level("warn"), Ok(LogLevel::Warn));
        assert_eq!(parse_log_level("info"), Ok(LogLevel::Info));
        assert_eq!(parse_log_level("debug"), Ok(LogLevel::Debug));
        assert_eq!(parse_log_level("DEBUG"), Ok(LogLevel::Debug));
        assert_eq!(parse_log_level(" Warn "), Ok(LogLevel::Warn));
        assert!(parse_log_level("").is_err());
        assert!(parse_log_level("verbose").is_err());
        assert!(parse_log_level("warning").is_err());
        assert!(LogLevel::Off < LogLevel::Error && LogLevel::Info < LogLevel::Debug);
        assert_eq!(LogLevel::Info.to_string(), "info");
    }

    fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_vars(pairs.iter().copied())
    }

    #[test]
    fn known_vars_list_matches() {
        assert_eq!(KNOWN_VARS.join(", "), KNOWN_VARS_LIST);
    }

    #[test]
    fn defaults_when_unset() {
        let c = vars(&[("PATH", "/usr/bin"), ("HOME", "/root")]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.limit, None);
        assert_eq!(c.log, LogLevel::Warn);
        assert!(!c.growth);
        assert_eq!(c.report, None);
    }

    #[test]
    fn all_vars() {
        let c = vars(&[
            ("GPUCAP_LIMIT", "4Gi,1=50%"),
            ("GPUCAP_LOG", "Debug"),
            ("GPUCAP_LIB", "/opt/gpucap/libgpucap.so"),
            ("GPUCAP_GROWTH", "yes"),
            ("GPUCAP_REPORT", "/tmp/r.json"),
            ("OTHER", ""),
        ])
        .unwrap();
        assert_eq!(c.limit, Some(spec("4Gi,1=50%")));
        assert_eq!(c.log, LogLevel::Debug);
        assert!(c.growth);
        assert_eq!(c.report, Some(PathBuf::from("/tmp/r.json")));
    }

    #[test]
    fn growth_values() {
        for (v, b) in [
            ("0", false),
            ("1", true),
            ("true", true),
            ("FALSE", false),
            ("yes", true),
            ("no", false),
            ("on", true),
            ("off", false),
        ] {
            assert_eq!(vars(&[("GPUCAP_GROWTH", v)]).unwrap().growth, b, "{v}");
        }
        let e = vars(&[("GPUCAP_GROWTH", "maybe")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_GROWTH");
        assert_eq!(e.accepted, GROWTH_ACCEPTED);
    }

    #[test]
    fn error_line_format() {
        let e = vars(&[("GPUCAP_LIMIT", "150%")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpucap: invalid GPUCAP_LIMIT=\"150%\": a percentage must be in \
             (0%, 100%]; accepted: 8Gi, 512MiB, 1073741824, 50%, 0.5, 0=8Gi,1=50%, 4Gi,1=8Gi, \
             GPU-<uuid>=8Gi, MIG-<uuid>=4Gi"
        );
        assert!(!e.to_string().contains('\n'));
        let e = vars(&[("GPUCAP_LOG", "loud")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpucap: invalid GPUCAP_LOG=\"loud\": unknown log level; \
             accepted: off, error, warn, info, debug"
        );
    }

    #[test]
    fn unknown_gpucap_variable() {
        let e = vars(&[("GPUCAP_LIMIT", "8Gi"), ("GPUCAP_LIMT", "8Gi")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LIMT");
        assert!(e.to_string().contains("unknown gpucap variable"));
        for known in KNOWN_VARS {
            assert!(e.to_string().contains(known));
        }
        // Case matters: GPUCAP_limit is not GPUCAP_LIMIT.
        assert_eq!(
            vars(&[("GPUCAP_limit", "8Gi")]).unwrap_err().var,
            "GPUCAP_limit"
        );
        assert_eq!(vars(&[("GPUCAP_", "x")]).unwrap_err().var, "GPUCAP_");
        // Only the GPUCAP_ prefix is ours.
        assert!(vars(&[("GPUCAPLIMIT", "x"), ("gpucap_limit", "x")]).is_ok());
    }

    #[test]
    fn empty_values_are_errors() {
        for var in KNOWN_VARS {
            let e = vars(&[(var, "")]).unwrap_err();
            assert_eq!(e.var, *var);
            assert!(e.reason.contains("empty"), "{e}");
            let e = vars(&[(var, "  ")]).unwrap_err();
            assert_eq!(e.var, *var);
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("GPUCAP_LIMIT", "abc"),
            ("GPUCAP_LIMIT", "-1Gi"),
            ("GPUCAP_LIMIT", "4Gi,,1=2Gi"),
            ("GPUCAP_LOG", "trace"),
            ("GPUCAP_GROWTH", "2"),
        ] {
            let e = vars(&[(var, value)]).unwrap_err();
            assert_eq!((e.var.as_str(), e.value.as_str()), (var, value));
            assert!(
                e.to_string()
                    .starts_with(&format!("gpucap: invalid {var}="))
            );
        }
    }

    #[test]
    fn first_occurrence_wins() {
        let c = vars(&[("GPUCAP_LOG", "info"), ("GPUCAP_LOG", "debug")]).unwrap();
        assert_eq!(c.log, LogLevel::Info);
    }

    #[test]
    fn non_utf8_variables() {
        let bad = OsStr::from_bytes(b"caf\xe9");
        // Ignored outside our prefix, as a name or as a value.
        let c = from_vars([
            (OsStr::new("GPUCAP_LIMIT"), OsStr::new("8Gi")),
            (OsStr::new("OTHER"), bad),
            (bad, OsStr::new("x")),
        ])
        .unwrap();
        assert_eq!(c.limit, Some(spec("8Gi")));
        // A GPUCAP_ value that is not UTF-8 is an error naming the variable.
        let e = from_vars([(OsStr::new("GPUCAP_LIMIT"), bad)]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LIMIT");
        assert_eq!(e.value, "caf\u{fffd}");
        assert!(e.reason.contains("UTF-8"));
        // So is a non-UTF-8 name with our prefix (it cannot be a known one).
        let name = OsStr::from_bytes(b"GPUCAP_\xff");
        let e = from_vars([(name, OsStr::new("1"))]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_\u{fffd}");
        // OsString pairs work too.
        let owned: Vec<(OsString, OsString)> =
            vec![(OsString::from("GPUCAP_LOG"), OsString::from("off"))];
        assert_eq!(from_vars(owned).unwrap().log, LogLevel::Off);
    }

    #[test]
    fn ld_so_preload_and_home() {
        let c = vars(&[
            ("GPUCAP_LD_SO_PRELOAD", "1"),
            ("GPUCAP_HOME", "/opt/gpucap"),
        ])
        .unwrap();
        assert!(c.ld_so_preload);
        assert!(!Config::default().ld_so_preload);
        let e = vars(&[("GPUCAP_LD_SO_PRELOAD", "sometimes")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_LD_SO_PRELOAD");
        assert_eq!(e.accepted, LD_SO_PRELOAD_ACCEPTED);
        assert_eq!(
            vars(&[("GPUCAP_HOME", " ")]).unwrap_err().var,
            "GPUCAP_HOME"
        );
    }

    #[test]
    fn env_file_round_trip() {
        let env = [
            ("PATH", "/bin"),
            ("GPUCAP_LIMIT", "4Gi,1=50%"),
            ("GPUCAP_REPORT", "/tmp/r %p.json"),
            ("GPUCAP_LIMIT", "ignored: getenv finds the first"),
        ];
        let text = format_env_file(env).unwrap();
        assert!(text.starts_with('#'));
        assert!(
            text.ends_with("GPUCAP_LIMIT=4Gi,1=50%\nGPUCAP_REPORT=/tmp/r %p.json\n"),
            "{text}"
        );
        let pairs = parse_env_file(&text).unwrap();
        assert_eq!(
            pairs,
            [
                ("GPUCAP_LIMIT".to_string(), "4Gi,1=50%".to_string()),
                ("GPUCAP_REPORT".to_string(), "/tmp/r %p.json".to_string()),
            ]
        );
        let c = from_vars(pairs).unwrap();
        assert_eq!(c.limit, Some(spec("4Gi,1=50%")));
        // Nothing to write: only the comment, which reads back as the default configuration.
        let empty = format_env_file([("HOME", "/root")]).unwrap();
        assert_eq!(
            from_vars(parse_env_file(&empty).unwrap()).unwrap(),
            Config::default()
        );
        assert!(
            format_env_file([("GPUCAP_REPORT", "a\nb")])
                .unwrap_err()
                .contains("line break")
        );
    }

    #[test]
    fn env_file_syntax() {
        let pairs =
            parse_env_file("\n  # comment\r\nGPUCAP_LOG=info\r\n\nGPUCAP_LIMIT=1=8Gi\n").unwrap();
        assert_eq!(
            pairs,
            [
                ("GPUCAP_LOG".to_string(), "info".to_string()),
                ("GPUCAP_LIMIT".to_string(), "1=8Gi".to_string()),
            ]
        );
        assert!(
            parse_env_file("GPUCAP_LOG info")
                .unwrap_err()
                .starts_with("line 1:")
        );
        assert!(
            parse_env_file("# x\nPATH=/bin")
                .unwrap_err()
                .starts_with("line 2:")
        );
        assert!(parse_env_file("export GPUCAP_LOG=info").is_err());
        // Names are validated by from_vars like the environment's.
        assert_eq!(
            from_vars(parse_env_file("GPUCAP_LIMT=1Gi").unwrap())
                .unwrap_err()
                .var,
            "GPUCAP_LIMT"
        );
        assert!(has_gpucap_vars([("GPUCAP_X", "")]));
        assert!(!has_gpucap_vars([("PATH", "/bin"), ("gpucap_limit", "1")]));
    }
}

/// Property tests: no input, of any characters or bytes, makes a parser panic (the shim
/// would turn a panic into CUDA_ERROR_UNKNOWN on every call, the CLI into exit 101), and
/// what is accepted is well formed. Case counts are bounded so these run in seconds.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn config(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            // Found inputs are printed; nothing is written into the source tree.
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Strings made of the pieces the parsers look at (prefixes, separators, units,
    /// digits) and of multi-byte characters, so that a prefix is often followed by a
    /// character that a byte offset would cut in two (`GPUé`, `MIG-abc€`).
    fn hostile() -> impl Strategy<Value = String> {
        const PIECES: &[&str] = &[
            "GPU-",
            "MIG-",
            "GPU",
            "gpu-",
            "MIG-GPU-",
            "face0000",
            "-0000",
            "000000000001",
            "é",
            "€",
            "𝄞",
            "\u{fffd}",
            "\u{a0}",
            "ab",
            "0",
            "1",
            "63",
            "64",
            ".",
            "%",
            "=",
            ",",
            " ",
            "-",
            "Gi",
            "MiB",
            "k",
            "B",
        ];
        let piece = prop_oneof![
            prop::sample::select(PIECES).prop_map(String::from),
            "\\PC{0,3}",
        ];
        prop::collection::vec(piece, 0..10).prop_map(|v| v.concat())
    }

    /// Checks what `parse_limit_spec` accepted: keys once each, in range; caps non-zero;
    /// fractions in (0, 1].
    fn well_formed(spec: &LimitSpec) -> Result<(), TestCaseError> {
        let limits = spec
            .devices
            .iter()
            .map(|(_, l)| l)
            .chain(spec.default.as_ref());
        for limit in limits {
            match *limit {
                Limit::Bytes(b) => prop_assert!(b > 0),
                Limit::Fraction(f) => prop_assert!(f > 0.0 && f <= 1.0, "{f}"),
            }
        }
        for (i, (key, _)) in spec.devices.iter().enumerate() {
            if let DeviceKey::Ordinal(n) = key {
                prop_assert!((*n as usize) < MAX_DEVICES);
            }
            prop_assert!(!spec.devices[..i].iter().any(|(k, _)| k == key));
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(config(2000))]

        #[test]
        fn limit_spec_of_any_string(s in "\\PC*") {
            if let Ok(spec) = parse_limit_spec(&s) {
                well_formed(&spec)?;
            }
        }

        #[test]
        fn limit_spec_of_hostile_strings(key in hostile(), value in hostile()) {
            for s in [format!("{key}={value}"), format!("1Gi,{key}=1Gi"), key.clone()] {
                match parse_limit_spec(&s) {
                    Ok(spec) => well_formed(&spec)?,
                    Err(e) => prop_assert!(!e.is_empty() && !e.contains('\n'), "{e:?}"),
                }
            }
        }

        #[test]
        fn uuid_of_any_string(s in prop_oneof!["\\PC*", hostile()]) {
            if let Ok(u) = DeviceUuid::parse(&s) {
                // What is accepted prints in the canonical form, which reads back the same.
                prop_assert_eq!(DeviceUuid::parse(&u.to_string()), Ok(u));
            }
        }

        #[test]
        fn size_of_any_string(s in prop_oneof!["\\PC*", hostile()]) {
            if let Err(e) = parse_size(&s) {
                prop_assert!(e.contains("accepted:"), "{e:?}");
            }
        }

        #[test]
        fn sizes_round_trip(b in any::<u64>()) {
            prop_assert_eq!(parse_size(&b.to_string()), Ok(b));
            prop_assert!(!format_bytes(b).is_empty());
        }

        #[test]
        fn any_bytes_in_any_variable(
            name in prop_oneof![
                Just(b"GPUCAP_LIMIT".to_vec()),
                Just(b"GPUCAP_LOG".to_vec()),
                Just(b"GPUCAP_GROWTH".to_vec()),
                Just(b"GPUCAP_LD_SO_PRELOAD".to_vec()),
                Just(b"GPUCAP_REPORT".to_vec()),
                prop::collection::vec(any::<u8>().prop_filter("no NUL or =", |b| *b != 0 && *b != b'='), 0..16)
                    .prop_map(|tail| [b"GPUCAP_".as_slice(), &tail].concat()),
            ],
            value in prop_oneof![
                prop::collection::vec(any::<u8>(), 0..40),
                hostile().prop_map(String::into_bytes),
            ],
        ) {
            let pair = (OsStr::from_bytes(&name), OsStr::from_bytes(&value));
            if let Err(e) = from_vars([pair]) {
                // The error names the variable and is one line, whatever the bytes.
                if let Ok(n) = std::str::from_utf8(&name) {
                    prop_assert_eq!(e.var.as_str(), n);
                }
                prop_assert!(!e.to_string().contains(['\n', '\r']), "{e}");
            }
        }

        #[test]
        fn env_file_of_any_text(text in "(\\PC|\n|\r){0,120}", tail in hostile()) {
            let text = format!("{text}\nGPUCAP_LIMIT={tail}\n");
            if let Ok(pairs) = parse_env_file(&text) {
                let _ = from_vars(pairs);
            }
        }
    }
}
