//! Lines name what the user typed. `gpucap run --limit 4Gi` hands the program
//! `GPUCAP_LIMIT=4Gi`, and the shim, which sees only the variable, would say
//! `GPUCAP_LIMIT="4Gi"` in a line about it. The CLI therefore also sets `GPUCAP_TYPED`
//! to the flags it turned into variables (`--limit,--pool`); the configuration keeps
//! them ([`Config::typed`]) and every line it makes about such a variable names the flag
//! instead ([`name_typed`]), in the CLI and in the shim alike. The variable renames
//! lines only: it sets no cap and lifts none.

use super::model::{Config, ConfigError};

/// `gpucap run`'s flags and the variable each sets, one row each.
pub const FLAG_VARS: &[(&str, &str)] = &[
    ("--limit", "GPUCAP_LIMIT"),
    ("--log", "GPUCAP_LOG"),
    ("--report", "GPUCAP_REPORT"),
    ("--growth", "GPUCAP_GROWTH"),
    ("--pool", "GPUCAP_POOL"),
    ("--wait", "GPUCAP_WAIT"),
    ("--guarantee", "GPUCAP_GUARANTEE"),
    ("--ceiling", "GPUCAP_CEILING"),
];

/// What `GPUCAP_TYPED` accepts, for its error line.
pub const TYPED_ACCEPTED: &str = "the flags gpucap run set the variables with, comma-separated \
    (--limit, --log, --report, --growth, --pool, --wait, --guarantee, --ceiling), each with \
    @ and 16 hex digits of the value it set or without; gpucap run sets it";

/// The flag that sets variable `var` (`--limit` for `GPUCAP_LIMIT`), if one does.
pub fn flag_of_var(var: &str) -> Option<&'static str> {
    FLAG_VARS.iter().find(|(_, v)| *v == var).map(|(f, _)| *f)
}

/// The entries of `GPUCAP_TYPED`'s value: each flag (one of `FLAG_VARS`'s, at most once)
/// with the digest of the value it set its variable to (`--limit@0123456789abcdef`;
/// None where written without one).
pub fn typed_entries(v: &str) -> Result<Vec<(&'static str, Option<u64>)>, String> {
    let mut entries: Vec<(&'static str, Option<u64>)> = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, digest) = match item.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (item, None),
        };
        let Some(&(flag, _)) = FLAG_VARS.iter().find(|(f, _)| *f == name) else {
            return Err(format!(
                "{item:?} is not a flag of gpucap run that sets a variable"
            ));
        };
        let digest = match digest {
            None => None,
            Some(d) if d.len() == 16 => Some(
                u64::from_str_radix(d, 16)
                    .map_err(|_| format!("{item:?}: {d:?} is not 16 hex digits"))?,
            ),
            Some(d) => return Err(format!("{item:?}: {d:?} is not 16 hex digits")),
        };
        if !entries.iter().any(|(f, _)| *f == flag) {
            entries.push((flag, digest));
        }
    }
    Ok(entries)
}

/// `GPUCAP_TYPED`'s flags ([`typed_entries`] without their digests).
pub fn parse_typed(v: &str) -> Result<Vec<&'static str>, String> {
    Ok(typed_entries(v)?.into_iter().map(|(f, _)| f).collect())
}

/// The flags of `GPUCAP_TYPED`'s value `v` whose variable still holds the value the
/// flag set (`value_of`: a variable's value): a program started by `gpucap run
/// --limit 1Gi` that starts a child with a `GPUCAP_LIMIT` of its own hands the child
/// `GPUCAP_TYPED` too, and the child's lines name its variable, not the parent's flag.
/// An entry without a digest names its flag.
pub fn typed_flags(v: &str, value_of: impl Fn(&str) -> Option<String>) -> Vec<&'static str> {
    typed_entries(v)
        .unwrap_or_default()
        .into_iter()
        .filter(|(flag, digest)| {
            let var = FLAG_VARS.iter().find(|(f, _)| f == flag).map(|(_, v)| *v);
            match (digest, var.and_then(&value_of)) {
                (None, _) => true,
                (Some(d), Some(value)) => *d == value_digest(value.as_bytes()),
                (Some(_), None) => false,
            }
        })
        .map(|(f, _)| f)
        .collect()
}

/// The digest of a value a flag set (FNV-1a, 64 bits): what [`typed_flags`] compares.
pub fn value_digest(value: &[u8]) -> u64 {
    super::ordinals::fnv(value)
}

/// `GPUCAP_TYPED`'s value for `entries` (the inverse of [`typed_entries`]).
pub fn typed_value(entries: &[(&str, Option<u64>)]) -> String {
    entries
        .iter()
        .map(|(f, d)| match d {
            Some(d) => format!("{f}@{d:016x}"),
            None => f.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `line` with each variable a typed flag set named as the flag: `GPUCAP_LIMIT="4Gi"`
/// becomes `--limit="4Gi"`, `GPUCAP_LIMIT's 8GB` becomes `--limit's 8GB`, `GPUCAP_LIMIT
/// names GPU 1` becomes `--limit names GPU 1`, `(1 GiB, GPUCAP_LIMIT)` becomes `(1 GiB,
/// --limit)`.
pub fn name_flags_in(line: &str, typed: &[&str]) -> String {
    let mut out = line.to_string();
    for &(flag, var) in FLAG_VARS {
        if typed.contains(&flag) {
            out = out
                .replace(&format!("{var}=\""), &format!("{flag}=\""))
                .replace(&format!("{var}'s "), &format!("{flag}'s "))
                .replace(&format!("{var} names "), &format!("{flag} names "))
                .replace(&format!(", {var})"), &format!(", {flag})"));
        }
    }
    out
}

/// The configuration's lines (its notes, and what the environment asked of a ceiling)
/// naming the flags typed instead of the variables they set.
pub fn name_typed(config: &mut Config) {
    if config.typed.is_empty() {
        return;
    }
    let typed = config.typed.clone();
    for note in &mut config.notes {
        *note = name_flags_in(note, &typed);
    }
    if let Some(asked) = config.bound.as_mut().and_then(|b| b.asked.as_mut()) {
        *asked = name_flags_in(asked, &typed);
    }
}

/// An error about a variable a typed flag set, naming the flag (`invalid --limit="150%"`).
pub fn name_typed_error(mut e: ConfigError, typed: &[&str]) -> ConfigError {
    if let Some(flag) = flag_of_var(&e.var).filter(|f| typed.contains(f)) {
        e.var = flag.to_string();
    }
    // Another variable the reason names (`the pool's cap (1 GiB, GPUCAP_LIMIT)`).
    e.reason = name_flags_in(&e.reason, typed);
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_flags_typed() {
        let typed = ["--limit", "--guarantee"];
        assert_eq!(
            name_flags_in(
                "GPUCAP_LIMIT names GPU 1; GPUCAP_GUARANTEE=\"2Gi\" is above the pool's cap (1 GiB, GPUCAP_LIMIT); GPUCAP_CEILING names GPU 2",
                &typed
            ),
            "--limit names GPU 1; --guarantee=\"2Gi\" is above the pool's cap (1 GiB, --limit); GPUCAP_CEILING names GPU 2"
        );
    }

    #[test]
    fn every_flag_is_read_back_and_nothing_else_is_accepted() {
        let all: Vec<&str> = FLAG_VARS.iter().map(|(f, _)| *f).collect();
        let entries: Vec<(&str, Option<u64>)> = all.iter().map(|f| (*f, None)).collect();
        assert_eq!(parse_typed(&typed_value(&entries)).unwrap(), all);
        let with = [("--limit", Some(value_digest(b"1Gi"))), ("--pool", None)];
        assert_eq!(typed_entries(&typed_value(&with)).unwrap(), with);
        assert!(parse_typed("--limit@12").is_err());
        assert!(parse_typed("--limit@zzzzzzzzzzzzzzzz").is_err());
        assert_eq!(
            parse_typed(" --pool, --limit,--pool ").unwrap(),
            ["--pool", "--limit"]
        );
        assert!(parse_typed("").unwrap().is_empty());
        let e = parse_typed("--limit,--limt").unwrap_err();
        assert!(e.contains("\"--limt\""), "{e}");
        assert!(parse_typed("GPUCAP_LIMIT").is_err());
    }

    #[test]
    fn a_flag_names_its_variable_only_while_it_holds_the_value_the_flag_set() {
        let typed = typed_value(&[
            ("--limit", Some(value_digest(b"1Gi"))),
            ("--pool", Some(value_digest(b"p"))),
            ("--log", None),
        ]);
        let values = |limit: &'static str| {
            move |var: &str| match var {
                "GPUCAP_LIMIT" => Some(limit.to_string()),
                "GPUCAP_POOL" => Some("p".to_string()),
                _ => None,
            }
        };
        assert_eq!(
            typed_flags(&typed, values("1Gi")),
            ["--limit", "--pool", "--log"]
        );
        // A child that set a GPUCAP_LIMIT of its own: its lines name the variable.
        assert_eq!(typed_flags(&typed, values("1=512Mi")), ["--pool", "--log"]);
    }

    #[test]
    fn only_the_flags_typed_are_named() {
        let line = "GPUCAP_LIMIT=\"4Gi\" and GPUCAP_POOL=\"p\"; GPUCAP_LIMIT's 8GB";
        assert_eq!(
            name_flags_in(line, &["--limit"]),
            "--limit=\"4Gi\" and GPUCAP_POOL=\"p\"; --limit's 8GB"
        );
        assert_eq!(name_flags_in(line, &[]), line);
    }

    #[test]
    fn an_error_names_the_flag_only_where_one_was_typed() {
        let e = ConfigError {
            var: "GPUCAP_LIMIT".into(),
            value: "150%".into(),
            reason: "too much".into(),
            accepted: "",
        };
        assert_eq!(name_typed_error(e.clone(), &["--limit"]).var, "--limit");
        assert_eq!(name_typed_error(e.clone(), &["--pool"]).var, "GPUCAP_LIMIT");
    }

    #[test]
    fn the_configuration_names_the_flags_typed_in_its_errors_and_notes() {
        let vars = |v: &[(&str, &str)]| super::super::from_vars(v.iter().copied());
        let e = vars(&[("GPUCAP_LIMIT", "150%"), ("GPUCAP_TYPED", "--limit")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("gpucap: invalid --limit=\"150%\""),
            "{e}"
        );
        let e = vars(&[("GPUCAP_REPORT", " "), ("GPUCAP_TYPED", "--report")]).unwrap_err();
        assert_eq!(e.var, "--report");
        let c = vars(&[("GPUCAP_LIMIT", "8GB"), ("GPUCAP_TYPED", "--limit")]).unwrap();
        assert_eq!(c.typed, ["--limit"]);
        assert!(
            c.notes.iter().any(|n| n.contains("--limit's 8GB")),
            "{:?}",
            c.notes
        );
        assert!(
            !c.notes.iter().any(|n| n.contains("GPUCAP_LIMIT's")),
            "{:?}",
            c.notes
        );
        // A bad value is an error naming the variable and what it accepts; it lifts nothing.
        let e = vars(&[("GPUCAP_LIMIT", "1Gi"), ("GPUCAP_TYPED", "--limt")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_TYPED");
        assert_eq!(e.accepted, TYPED_ACCEPTED);
        let c = vars(&[("GPUCAP_LIMIT", "1Gi"), ("GPUCAP_TYPED", "--limit")]).unwrap();
        assert_eq!(c.limit, vars(&[("GPUCAP_LIMIT", "1Gi")]).unwrap().limit);
    }
}
