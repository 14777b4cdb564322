//! The environment a command validates and gives its program: the process's variables
//! with the flags' values in place of theirs and `GPUCAP_TYPED` naming the flags (so that
//! errors and notes about a variable a flag set name the flag, as the user typed it:
//! `config::typed`), the first occurrence of each name kept (the one getenv finds). Also
//! the library `run` would preload, and what the shim makes of a configuration file
//! beside it (or in `/etc/gpucap`) when the environment has variables of its own: the
//! shim's rule (`config::under_file`: the file's cap is a ceiling).

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
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
/// overridden name is dropped, then the flag's value appended), and `GPUCAP_TYPED`
/// naming the flags (with those an outer `gpucap run` named): every line about such a
/// variable, the CLI's and the shim's, then names the flag as typed (`config::typed`).
pub fn apply_overrides(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    overrides: &Overrides,
) -> Vec<(OsString, OsString)> {
    let set = overrides.vars();
    // A flag's per-GPU figure counts the program's own GPUs: a `GPUCAP_ORDINALS` the
    // environment carries (a parent's, for the parent's keys) would move it. The
    // program gets its own instead (below), which a shim loaded in this process hands
    // on as the caller's.
    let keys_typed = set.iter().any(|(name, _)| {
        matches!(
            &name[..],
            "GPUCAP_LIMIT" | "GPUCAP_GUARANTEE" | "GPUCAP_CEILING"
        )
    });
    let mut out: Vec<(OsString, OsString)> = vars
        .into_iter()
        .filter(|(k, _)| !set.iter().any(|(name, _)| k == name))
        .filter(|(k, _)| !(keys_typed && k == "GPUCAP_ORDINALS"))
        .collect();
    out.extend(
        set.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    if keys_typed {
        let keys = config::pairs_digest(out.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes())));
        let visible = lookup(&out, "CUDA_VISIBLE_DEVICES").map(OsStr::as_bytes);
        let frame = match visible {
            None => Some(&b"all"[..]),
            Some(v) => config::visible_as_frame(v),
        };
        if let Some(frame) = frame.filter(|_| keys != 0) {
            let mut value = frame.to_vec();
            value.push(b'@');
            value.extend_from_slice(&config::digest_hex(keys));
            out.push(("GPUCAP_ORDINALS".into(), OsString::from_vec(value)));
        }
    }
    // Each flag with the digest of the value it set: a descendant that sets the variable
    // itself is named by its variable (`config::typed_flags`).
    let now: Vec<(&str, Option<u64>)> = set
        .iter()
        .filter_map(|(var, value)| {
            config::flag_of_var(var).map(|f| (f, Some(config::value_digest(value.as_bytes()))))
        })
        .collect();
    if !now.is_empty() {
        let mut typed = lookup(&out, "GPUCAP_TYPED")
            .and_then(OsStr::to_str)
            .and_then(|v| config::typed_entries(v).ok())
            .unwrap_or_default();
        for (f, d) in now {
            match typed.iter_mut().find(|(t, _)| *t == f) {
                Some(entry) => entry.1 = d,
                None => typed.push((f, d)),
            }
        }
        set_var(&mut out, "GPUCAP_TYPED", config::typed_value(&typed).into());
    }
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

/// Validates the environment with the flags applied. On error prints the one-line
/// ConfigError to stderr.
pub(crate) fn load(overrides: &Overrides) -> Result<(Config, Vec<(OsString, OsString)>), i32> {
    let vars = dedup_first(apply_overrides(std::env::vars_os(), overrides));
    match config::from_vars(vars.iter().map(|(k, v)| (k, v))) {
        Ok(c) => Ok((c, vars)),
        Err(e) => {
            eprintln!("{e}");
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
    config::from_env_files(lib.and_then(Path::parent).as_slice())
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
    let file = config::from_env_files(lib.and_then(Path::parent).as_slice())?;
    let Some((file, path)) = file else {
        return Ok((config, None));
    };
    if !config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v))) {
        let visible_chosen = config.visible_chosen;
        return Ok((
            Config {
                visible_chosen,
                ..file
            },
            Some(path),
        ));
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
    fn what_was_asked_under_a_ceiling_names_the_flag_typed_and_the_file_its_variable() {
        let file = config::from_vars(pairs(&[("GPUCAP_LIMIT", "8GB")])).unwrap();
        assert!(
            file.notes.iter().any(|n| n.contains("GPUCAP_LIMIT's 8GB")),
            "{file:?}"
        );
        let under = |o: &Overrides| {
            let vars = apply_overrides(pairs(&[("GPUCAP_POOL", "p")]), o);
            let env = config::from_vars(vars.iter().map(|(k, v)| (k, v))).unwrap();
            let raw = |name: &str| lookup(&vars, name).map(|v| v.to_string_lossy().into_owned());
            config::under_file(env, &raw, file.clone(), Path::new("/x/gpucap.env"))
        };
        let flag = Overrides {
            limit: Some("9GB".into()),
            ..Overrides::default()
        };
        let c = under(&flag);
        assert_eq!(
            c.bound.as_ref().unwrap().asked.as_deref(),
            Some("--limit=\"9GB\"")
        );
        // The environment's note names the flag; the file's names its own variable.
        assert!(
            c.notes.iter().any(|n| n.contains("--limit's 9GB")),
            "{:?}",
            c.notes
        );
        assert!(
            c.notes.iter().any(|n| n.contains("GPUCAP_LIMIT's 8GB")),
            "{:?}",
            c.notes
        );
        let c = under(&Overrides::default());
        assert!(c.bound.as_ref().unwrap().asked.is_none());
        let vars = apply_overrides(pairs(&[("GPUCAP_LIMIT", "9GB")]), &Overrides::default());
        let env = config::from_vars(vars.iter().map(|(k, v)| (k, v))).unwrap();
        let raw = |name: &str| lookup(&vars, name).map(|v| v.to_string_lossy().into_owned());
        let c = config::under_file(env, &raw, file.clone(), Path::new("/x/gpucap.env"));
        assert_eq!(
            c.bound.unwrap().asked.as_deref(),
            Some("GPUCAP_LIMIT=\"9GB\"")
        );
    }

    #[test]
    fn the_flags_typed_are_handed_on_with_an_outer_runs() {
        let o = Overrides {
            pool: Some("p".into()),
            ..Overrides::default()
        };
        let p = format!("--pool@{:016x}", config::value_digest(b"p"));
        let out = apply_overrides(pairs(&[("GPUCAP_TYPED", "--limit")]), &o);
        assert_eq!(
            lookup(&out, "GPUCAP_TYPED"),
            Some(OsStr::new(&format!("--limit,{p}")))
        );
        let out = apply_overrides(pairs(&[("GPUCAP_TYPED", "--pool@0000000000000000")]), &o);
        assert_eq!(lookup(&out, "GPUCAP_TYPED"), Some(OsStr::new(&p)));
        // No flag typed: the environment as it is.
        let env = pairs(&[("GPUCAP_TYPED", "--limit")]);
        assert_eq!(apply_overrides(env.clone(), &Overrides::default()), env);
    }

    #[test]
    fn a_typed_per_gpu_figure_counts_the_programs_own_gpus() {
        let env = pairs(&[("GPUCAP_ORDINALS", "all"), ("CUDA_VISIBLE_DEVICES", "1")]);
        let o = Overrides {
            limit: Some("0=1Gi".into()),
            ..Overrides::default()
        };
        let out = apply_overrides(env.clone(), &o);
        // The program's own frame, bound to the keys typed.
        let keys =
            config::pairs_digest([(b"GPUCAP_LIMIT".as_slice(), b"0=1Gi".as_slice())].into_iter());
        let own = format!("1@{keys:016x}");
        assert_eq!(lookup(&out, "GPUCAP_ORDINALS"), Some(OsStr::new(&own)));
        let c = config::from_vars(out).unwrap();
        assert_eq!(
            c.limit.unwrap().for_ordinal(0),
            Some(config::Limit::Bytes(1 << 30))
        );
        // Another flag leaves the frame to the parent's keys it came with.
        let o = Overrides {
            log: Some("info".into()),
            ..Overrides::default()
        };
        let out = apply_overrides(env, &o);
        assert_eq!(lookup(&out, "GPUCAP_ORDINALS"), Some(OsStr::new("all")));
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
                ("GPUCAP_LIMIT", "8Gi"),
                (
                    "GPUCAP_TYPED",
                    &format!("--limit@{:016x}", config::value_digest(b"8Gi"))
                )
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
        let line = e.to_string();
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
        let line = e.unwrap_err().to_string();
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
        assert_eq!(e.var, "--log");
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
        assert_eq!(e.var, "--report");
    }
}
