//! The `GPUCAP_*` variables, one row each: the name, the forms it accepts, and how a
//! value sets the configuration. The known names ([`KNOWN_VARS`]), the list an error
//! names and each variable's accepted forms all come from this one table; `from_vars`
//! reads the rows that set a field in the table's order.

use std::path::PathBuf;

use super::{
    CEILING_ACCEPTED, CLAIM_DIR_ACCEPTED, Config, GROWTH_ACCEPTED, GUARANTEE_ACCEPTED,
    HOME_ACCEPTED, LD_SO_PRELOAD_ACCEPTED, LIB_ACCEPTED, LIMIT_ACCEPTED, LOG_ACCEPTED,
    POOL_ACCEPTED, POOL_DIR_ACCEPTED, POOL_MEMBERS_ACCEPTED, REPORT_ACCEPTED, TYPED_ACCEPTED,
    WAIT_ACCEPTED, parse_bool, parse_log_level, parse_pool, parse_pool_dir, parse_share_spec,
    parse_typed, parse_wait,
};

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
        set: Some(|c, v| {
            c.typed = parse_typed(v)?;
            Ok(())
        }),
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
