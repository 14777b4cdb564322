//! The environment a command validates and gives its program: the process's variables
//! with the flags' values in place of theirs, the first occurrence of each name kept
//! (the one getenv finds), and errors and notes about a variable a flag set naming the
//! flag, as the user typed it. Also the library `run` would preload, and what the shim
//! makes of a configuration file beside it (or in `/etc/gpucap`) when the environment
//! has variables of its own: the shim's rule (`config::under_file`: the file's cap is a
//! ceiling).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use gpucap_core::config::{self, Config};

use crate::args::Overrides;
use crate::exit::EXIT_USAGE;
use crate::preload;

/// `--report PATH` made absolute against the current directory: CMD may change
/// directory before it exits.
pub fn absolute_report(mut overrides: Overrides) -> Overrides {
    if let Some(r) = &overrides.report
        && Path::new(r).is_relative()
        && !r.is_empty()
        && let Ok(abs) = std::env::current_dir().map(|d| d.join(r))
        && let Some(abs) = abs.to_str()
    {
        overrides.report = Some(abs.to_string());
    }
    overrides
}

/// The environment `vars` with the flags' variables replaced (every occurrence of an
/// overridden name is dropped, then the flag's value appended).
pub fn apply_overrides(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    overrides: &Overrides,
) -> Vec<(OsString, OsString)> {
    let set = overrides.vars();
    let mut out: Vec<(OsString, OsString)> = vars
        .into_iter()
        .filter(|(k, _)| !set.iter().any(|(name, _)| k == name))
        .collect();
    out.extend(
        set.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    out
}

/// `vars` with only the first occurrence of each name kept (the one getenv finds, and
/// the one `config::from_vars` validates).
pub fn dedup_first(vars: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    let mut seen = std::collections::HashSet::new();
    vars.into_iter()
        .filter(|(k, _)| seen.insert(k.clone()))
        .collect()
}

/// Sets `name` to `value` in `vars`, in place of any earlier value.
pub(crate) fn set_var(vars: &mut Vec<(OsString, OsString)>, name: &str, value: OsString) {
    vars.retain(|(k, _)| k != name);
    vars.push((name.into(), value));
}

/// The first value of `name` in `vars` (as getenv would find it).
pub(crate) fn lookup<'a>(vars: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsStr> {
    vars.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_os_str())
}

/// A ConfigError about a variable that a flag set names the flag instead
/// (`gpucap: invalid --limit="150%": ...`): that is what the user typed.
pub fn blame_flag(mut e: config::ConfigError, overrides: &Overrides) -> config::ConfigError {
    if let Some(flag) = flag_of(&e.var, overrides) {
        e.var = flag.to_string();
    }
    e
}

/// The flag that set variable `var`, if one did (`--limit` for GPUCAP_LIMIT when
/// `--limit` was typed): messages name what the user typed.
fn flag_of(var: &str, overrides: &Overrides) -> Option<&'static str> {
    Some(match var {
        "GPUCAP_LIMIT" if overrides.limit.is_some() => "--limit",
        "GPUCAP_LOG" if overrides.log.is_some() => "--log",
        "GPUCAP_REPORT" if overrides.report.is_some() => "--report",
        "GPUCAP_GROWTH" if overrides.growth => "--growth",
        "GPUCAP_POOL" if overrides.pool.is_some() => "--pool",
        "GPUCAP_WAIT" if overrides.wait.is_some() => "--wait",
        "GPUCAP_GUARANTEE" if overrides.guarantee.is_some() => "--guarantee",
        "GPUCAP_CEILING" if overrides.ceiling.is_some() => "--ceiling",
        _ => return None,
    })
}

/// The configuration's `note:` lines with a variable set by a flag named as the flag
/// (`note: --limit's 8GB is in decimal units ...`).
fn blame_flag_notes(mut config: Config, overrides: &Overrides) -> Config {
    for note in &mut config.notes {
        for var in config::KNOWN_VARS {
            if let Some(flag) = flag_of(var, overrides) {
                *note = note.replace(&format!("{var}'s "), &format!("{flag}'s "));
            }
        }
    }
    config
}

/// Under a file's ceiling (see [`as_the_shim_reads`]), what the environment asked with a
/// variable set by a flag named as the flag: `--limit="4Gi"`, as typed. (The notes are
/// left as they are: the file's own name its variables.)
pub(crate) fn blame_flag_asked(mut config: Config, overrides: &Overrides) -> Config {
    if let Some(asked) = config.bound.as_mut().and_then(|b| b.asked.as_mut()) {
        for var in config::KNOWN_VARS {
            if let Some(flag) = flag_of(var, overrides) {
                *asked = asked.replace(&format!("{var}=\""), &format!("{flag}=\""));
            }
        }
    }
    config
}

/// Validates the environment with the flags applied. On error prints the one-line
/// ConfigError to stderr.
pub(crate) fn load(overrides: &Overrides) -> Result<(Config, Vec<(OsString, OsString)>), i32> {
    let vars = dedup_first(apply_overrides(std::env::vars_os(), overrides));
    match config::from_vars(vars.iter().map(|(k, v)| (k, v))) {
        Ok(c) => Ok((blame_flag_notes(c, overrides), vars)),
        Err(e) => {
            eprintln!("{}", blame_flag(e, overrides));
            Err(EXIT_USAGE)
        }
    }
}

pub(crate) fn library(vars: &[(OsString, OsString)]) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().ok();
    let lib = preload::locate_library(lookup(vars, "GPUCAP_LIB"), exe.as_deref())?;
    preload::check_preloadable(&lib)?;
    Ok(lib)
}

/// The `gpucap.env` the shim would read for a process whose environment has no
/// GPUCAP_* variable (`lib` is the library `run` would preload), validated:
/// `Ok(None)` when there is none.
pub fn config_file(lib: Option<&Path>) -> Result<Option<(Config, PathBuf)>, String> {
    config::from_env_files(lib.and_then(Path::parent))
}

/// The configuration the shim under `lib` would use: the environment's (`config`, read
/// from `vars`) alone without a file; the file's where the environment has no
/// variable; else the environment's under the file's ceiling. Also the file, if one
/// was read. An unreadable or invalid file is an error, as in the shim.
pub fn as_the_shim_reads(
    config: Config,
    vars: &[(OsString, OsString)],
    lib: Option<&Path>,
) -> Result<(Config, Option<PathBuf>), String> {
    let file = config::from_env_files(lib.and_then(Path::parent))?;
    let Some((file, path)) = file else {
        return Ok((config, None));
    };
    if !config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v))) {
        return Ok((file, Some(path)));
    }
    let raw = |name: &str| {
        vars.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string_lossy().into_owned())
    };
    Ok((config::under_file(config, &raw, file, &path), Some(path)))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Environment pairs from string pairs (also for launch.rs's tests).
    pub(crate) fn pairs(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn what_was_asked_under_a_ceiling_names_the_flag_typed() {
        let config = |asked: &str| Config {
            bound: Some(config::Ceiling {
                spec: config::parse_limit_spec("256Mi").unwrap(),
                from: "/x/gpucap.env".into(),
                asked: Some(asked.into()),
                asked_none: false,
            }),
            notes: vec!["note: GPUCAP_LIMIT's 8GB is in decimal units".into()],
            ..Config::default()
        };
        let flag = Overrides {
            limit: Some("4Gi".into()),
            ..Overrides::default()
        };
        let c = blame_flag_asked(config("GPUCAP_LIMIT=\"4Gi\""), &flag);
        assert_eq!(c.bound.unwrap().asked.unwrap(), "--limit=\"4Gi\"");
        // The notes are the file's or the environment's own: left as they are.
        assert_eq!(c.notes, ["note: GPUCAP_LIMIT's 8GB is in decimal units"]);
        let c = blame_flag_asked(config("GPUCAP_LIMIT=\"4Gi\""), &Overrides::default());
        assert_eq!(c.bound.unwrap().asked.unwrap(), "GPUCAP_LIMIT=\"4Gi\"");
    }

    #[test]
    fn overrides_replace_variables() {
        let env = pairs(&[
            ("GPUCAP_LIMIT", "1Gi"),
            ("PATH", "/bin"),
            ("GPUCAP_LIMIT", "2Gi"),
            ("GPUCAP_LOG", "info"),
        ]);
        let o = Overrides {
            limit: Some("8Gi".into()),
            log: None,
            ..Overrides::default()
        };
        assert_eq!(
            apply_overrides(env.clone(), &o),
            pairs(&[
                ("PATH", "/bin"),
                ("GPUCAP_LOG", "info"),
                ("GPUCAP_LIMIT", "8Gi")
            ])
        );
        assert_eq!(apply_overrides(env.clone(), &Overrides::default()), env);
        // The flag is what gets validated: a bad variable is overridden by a good flag...
        let bad = pairs(&[("GPUCAP_LIMIT", "150%")]);
        assert!(config::from_vars(apply_overrides(bad.clone(), &o)).is_ok());
        // ...and a bad flag is an error even with a good variable.
        let o = Overrides {
            limit: Some("abc".into()),
            log: None,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(pairs(&[("GPUCAP_LIMIT", "8Gi")]), &o));
        assert_eq!(e.unwrap_err().value, "abc");
    }

    #[test]
    fn errors_name_the_flag() {
        let o = Overrides {
            limit: Some("150%".into()),
            log: None,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(Vec::new(), &o)).unwrap_err();
        let line = blame_flag(e, &o).to_string();
        assert!(
            line.starts_with("gpucap: invalid --limit=\"150%\": a percentage"),
            "{line}"
        );
        // A variable the flags did not set keeps its name.
        let o = Overrides {
            limit: Some("8Gi".into()),
            log: None,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(pairs(&[("GPUCAP_LOG", "loud")]), &o));
        let line = blame_flag(e.unwrap_err(), &o).to_string();
        assert!(
            line.starts_with("gpucap: invalid GPUCAP_LOG=\"loud\""),
            "{line}"
        );
        let o = Overrides {
            limit: None,
            log: Some("loud".into()),
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(Vec::new(), &o)).unwrap_err();
        assert_eq!(blame_flag(e, &o).var, "--log");
    }

    #[test]
    fn environment_edits() {
        let env = pairs(&[("A", "1"), ("B", "2"), ("A", "3"), ("LD_PRELOAD", "/a.so")]);
        let mut env = dedup_first(env);
        assert_eq!(
            env,
            pairs(&[("A", "1"), ("B", "2"), ("LD_PRELOAD", "/a.so")])
        );
        set_var(&mut env, "LD_PRELOAD", "/a.so:/b.so".into());
        assert_eq!(
            env,
            pairs(&[("A", "1"), ("B", "2"), ("LD_PRELOAD", "/a.so:/b.so")])
        );
    }

    #[test]
    fn lookup_takes_the_first() {
        let env = pairs(&[("A", "1"), ("GPUCAP_LIB", "/x.so"), ("GPUCAP_LIB", "/y.so")]);
        assert_eq!(lookup(&env, "GPUCAP_LIB"), Some(OsStr::new("/x.so")));
        assert_eq!(lookup(&env, "B"), None);
    }

    #[test]
    fn report_flag_is_made_absolute_and_blamed() {
        let o = absolute_report(Overrides {
            report: Some("r-%p.json".into()),
            ..Overrides::default()
        });
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(o.report.unwrap(), cwd.join("r-%p.json").to_str().unwrap());
        let o = absolute_report(Overrides {
            report: Some("/abs.json".into()),
            ..Overrides::default()
        });
        assert_eq!(o.report.as_deref(), Some("/abs.json"));
        let o = Overrides {
            report: Some(String::new()),
            growth: true,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(Vec::new(), &o)).unwrap_err();
        assert_eq!(blame_flag(e, &o).var, "--report");
    }
}
