//! The `GPUCAP_*` environment variables: their names, `Config`, `ConfigError`, and
//! reading them (no envy: it would only copy the same strings into a struct).

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::*;

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
pub(crate) const KNOWN_VARS_LIST: &str = "GPUCAP_LIMIT, GPUCAP_LOG, GPUCAP_LIB, GPUCAP_GROWTH, \
     GPUCAP_REPORT, GPUCAP_LD_SO_PRELOAD, GPUCAP_HOME";

pub const LOG_ACCEPTED: &str = "off, error, warn, info, debug";
pub const GROWTH_ACCEPTED: &str = "0, 1, true, false, yes, no, on, off";
pub const REPORT_ACCEPTED: &str = "a file path, e.g. /tmp/gpucap-report.json";
pub const LIB_ACCEPTED: &str = "the path of libgpucap.so";
pub const LD_SO_PRELOAD_ACCEPTED: &str = GROWTH_ACCEPTED;
pub const HOME_ACCEPTED: &str =
    "the directory holding gpucap, libgpucap.so and docker-entrypoint.sh";

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
pub(crate) fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        "" => Err("empty value".to_string()),
        _ => Err("not a yes/no value".to_string()),
    }
}

pub(crate) const PREFIX: &str = "GPUCAP_";

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

pub(crate) fn accepted_of(var: &str) -> &'static str {
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
