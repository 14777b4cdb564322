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
    (--limit, --log, --report, --growth, --pool, --wait, --guarantee, --ceiling); gpucap run \
    sets it";

/// The flag that sets variable `var` (`--limit` for `GPUCAP_LIMIT`), if one does.
pub fn flag_of_var(var: &str) -> Option<&'static str> {
    FLAG_VARS.iter().find(|(_, v)| *v == var).map(|(f, _)| *f)
}

/// `GPUCAP_TYPED`'s value: the flags, each one of `FLAG_VARS`'s, at most once each.
pub fn parse_typed(v: &str) -> Result<Vec<&'static str>, String> {
    let mut flags: Vec<&'static str> = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some(&(flag, _)) = FLAG_VARS.iter().find(|(f, _)| *f == item) else {
            return Err(format!(
                "{item:?} is not a flag of gpucap run that sets a variable"
            ));
        };
        if !flags.contains(&flag) {
            flags.push(flag);
        }
    }
    Ok(flags)
}

/// `GPUCAP_TYPED`'s value for `flags` (the inverse of [`parse_typed`]).
pub fn typed_value(flags: &[&str]) -> String {
    flags.join(",")
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
        assert_eq!(parse_typed(&typed_value(&all)).unwrap(), all);
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
