//! The `GPUCAP_*` variables, one row each: the name, the forms it accepts, and how a
//! value sets the configuration. The known names ([`KNOWN_VARS`]), the list an error
//! names and each variable's accepted forms all come from this one table; `from_vars`
//! reads the rows that set a field in the table's order.

use std::path::PathBuf;

use super::limit::LIMIT_ACCEPTED;
use super::model::{Config, LogLevel};
use super::ordinals::{ORDINALS_ACCEPTED, ORDINALS_VAR, parse_ordinals};
use super::pool_vars::{
    CLAIM_DIR_ACCEPTED, POOL_ACCEPTED, POOL_DIR_ACCEPTED, WAIT_ACCEPTED, parse_pool,
    parse_pool_dir, parse_wait,
};
use super::shares::{CEILING_ACCEPTED, GUARANTEE_ACCEPTED, parse_share_spec};
use super::typed::{TYPED_ACCEPTED, parse_typed};

// What the variables read here accept, for their error lines.
pub const LOG_ACCEPTED: &str = "off, error, warn, info, debug";
pub const GROWTH_ACCEPTED: &str = "0, 1, true, false, yes, no, on, off";
pub const REPORT_ACCEPTED: &str = "a file path, e.g. /tmp/gpucap-report.json";
pub const LIB_ACCEPTED: &str = "the path of libgpucap.so";
pub const LD_SO_PRELOAD_ACCEPTED: &str = GROWTH_ACCEPTED;
pub const HOME_ACCEPTED: &str =
    "the directory holding gpucap, libgpucap.so and docker-entrypoint.sh";
pub const POOL_MEMBERS_ACCEPTED: &str =
    "a member count from 1 to 4096 (read by the process that makes the pool's file)";

/// One `GPUCAP_*` variable.
pub struct Var {
    pub name: &'static str,
    /// What a value may be, for the error line.
    pub accepted: &'static str,
    /// Sets the configuration from a value (not empty, valid UTF-8), or says what is
    /// wrong with it. None where `from_vars` reads it with others (`GPUCAP_LIMIT`, met
    /// with HAMi-core's; `GPUCAP_CLAIM_DIR`, met with `GPUCAP_POOL`) or another program
    /// does (`GPUCAP_LIB`: the CLI; `GPUCAP_HOME`: the container entrypoint).
    pub set: Option<Setter>,
}

/// How a variable's value sets the configuration.
pub type Setter = fn(&mut Config, &str) -> Result<(), String>;

/// Every `GPUCAP_*` variable. Any other name that starts with `GPUCAP_` is an error (most
/// likely a typo such as `GPUCAP_LIMT`).
pub const VARS: &[Var] = &[
    Var {
        name: "GPUCAP_LIMIT",
        accepted: LIMIT_ACCEPTED,
        set: None,
    },
    Var {
        name: ORDINALS_VAR,
        accepted: ORDINALS_ACCEPTED,
        set: Some(|c, v| {
            c.ordinals = Some(parse_ordinals(v)?);
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_LOG",
        accepted: LOG_ACCEPTED,
        set: Some(|c, v| {
            c.log = parse_log_level(v)?;
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_LIB",
        accepted: LIB_ACCEPTED,
        set: None,
    },
    Var {
        name: "GPUCAP_GROWTH",
        accepted: GROWTH_ACCEPTED,
        set: Some(|c, v| {
            c.growth = parse_bool(v)?;
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_REPORT",
        accepted: REPORT_ACCEPTED,
        set: Some(|c, v| {
            c.report = Some(PathBuf::from(v));
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_LD_SO_PRELOAD",
        accepted: LD_SO_PRELOAD_ACCEPTED,
        set: Some(|c, v| {
            c.ld_so_preload = parse_bool(v)?;
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_HOME",
        accepted: HOME_ACCEPTED,
        set: None,
    },
    Var {
        name: "GPUCAP_POOL",
        accepted: POOL_ACCEPTED,
        set: Some(|c, v| {
            c.pool = parse_pool(v)?;
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_POOL_DIR",
        accepted: POOL_DIR_ACCEPTED,
        set: Some(|c, v| {
            c.pool_dir = Some(parse_pool_dir(v)?);
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_POOL_MEMBERS",
        accepted: POOL_MEMBERS_ACCEPTED,
        set: Some(|c, v| {
            c.pool_members = Some(parse_pool_members(v)?);
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_WAIT",
        accepted: WAIT_ACCEPTED,
        set: Some(|c, v| {
            c.wait = parse_wait(v)?;
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_GUARANTEE",
        accepted: GUARANTEE_ACCEPTED,
        set: Some(|c, v| {
            c.guarantee = Some(parse_share_spec("GPUCAP_GUARANTEE", v)?);
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_CEILING",
        accepted: CEILING_ACCEPTED,
        set: Some(|c, v| {
            c.ceiling = Some(parse_share_spec("GPUCAP_CEILING", v)?);
            Ok(())
        }),
    },
    Var {
        name: "GPUCAP_TYPED",
        accepted: TYPED_ACCEPTED,
        // Checked here; the flags kept are those whose variable still holds what the
        // flag set (`typed_flags`, once every variable is read).
        set: Some(|_, v| parse_typed(v).map(drop)),
    },
    Var {
        name: "GPUCAP_CLAIM_DIR",
        accepted: CLAIM_DIR_ACCEPTED,
        set: None,
    },
];

const NAMES: [&str; VARS.len()] = {
    let mut names = [""; VARS.len()];
    let mut i = 0;
    while i < VARS.len() {
        names[i] = VARS[i].name;
        i += 1;
    }
    names
};

/// The names of [`VARS`], in its order.
pub const KNOWN_VARS: &[&str] = &NAMES;

/// [`KNOWN_VARS`] as one line, for error messages.
pub fn known_vars_list() -> String {
    KNOWN_VARS.join(", ")
}

/// What variable `var` accepts ("" for a name that is not gpucap's).
pub fn accepted_of(var: &str) -> &'static str {
    VARS.iter()
        .find(|v| v.name == var)
        .map_or("", |v| v.accepted)
}

/// `GPUCAP_POOL_MEMBERS`: a member count from 1 to 4096 (the pool's most slots; config
/// does not depend on the budget that defines them).
fn parse_pool_members(v: &str) -> Result<usize, String> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=4096).contains(n))
        .ok_or_else(|| "not a count from 1 to 4096".into())
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
pub(crate) fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        "" => Err("empty value".to_string()),
        _ => Err("not a yes/no value".to_string()),
    }
}
