//! `cdi generate`'s words: its options, each at most once; `--output` required.

use std::path::PathBuf;

use super::options::{option_value, unknown_among};
use super::{Command, Topic, UsageError, lexopt_error, nothing_more, option_name, usage};
use crate::cdi::{DEFAULT_DIR, DEFAULT_KIND, DEFAULT_NAME, Request};
use lexopt::{Arg, Parser};

pub(super) fn parse_cdi(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Cdi;
    match parser.next().map_err(|e| lexopt_error(topic, e))? {
        Some(Arg::Value(v)) if v == "generate" => {}
        Some(Arg::Short('h')) => {
            nothing_more(&mut parser, topic, "-h")?;
            return Ok(Command::Help(topic));
        }
        Some(Arg::Long("help")) => {
            return match parser.optional_value() {
                None => nothing_more(&mut parser, topic, "--help").map(|()| Command::Help(topic)),
                Some(_) => Err(usage(topic, "--help takes no value")),
            };
        }
        Some(other) => {
            return Err(usage(
                topic,
                format!(
                    "unknown cdi command '{}' (the one there is: gpucap cdi generate)",
                    option_name(&other)
                ),
            ));
        }
        None => {
            return Err(usage(
                topic,
                "no cdi command given (gpucap cdi generate ...)",
            ));
        }
    }
    let mut values: [(&str, &str, Option<String>); 7] = [
        ("--limit", "SPEC (e.g. 8Gi)", None),
        ("--output", "FILE", None),
        ("--pool", "NAME|PATH|off", None),
        ("--name", "NAME", None),
        ("--kind", "VENDOR/CLASS", None),
        ("--dir", "DIR", None),
        ("--root", "DIR", None),
    ];
    while let Some(arg) = parser.next().map_err(|e| lexopt_error(topic, e))? {
        let name = match arg {
            Arg::Short('h') => {
                nothing_more(&mut parser, topic, "-h")?;
                return Ok(Command::Help(topic));
            }
            Arg::Long(_) => option_name(&arg),
            Arg::Short(_) => {
                return Err(usage(
                    topic,
                    format!("unknown option '{}'", option_name(&arg)),
                ));
            }
            Arg::Value(v) => {
                return Err(usage(
                    topic,
                    format!(
                        "unexpected argument '{}' (cdi generate takes only options)",
                        v.to_string_lossy()
                    ),
                ));
            }
        };
        let attached = parser.optional_value();
        if name == "--help" {
            return match attached {
                None => nothing_more(&mut parser, topic, "--help").map(|()| Command::Help(topic)),
                Some(_) => Err(usage(topic, "--help takes no value")),
            };
        }
        let Some(slot) = values.iter_mut().find(|(n, _, _)| *n == name) else {
            let names: Vec<&str> = values
                .iter()
                .map(|(n, _, _)| *n)
                .chain(["--help"])
                .collect();
            return Err(usage(topic, unknown_among(&name, &names)));
        };
        if slot.2.is_some() {
            return Err(usage(topic, format!("{name} given more than once")));
        }
        let value = option_value(topic, &mut parser, &name, attached, slot.1)?
            .into_string()
            .map_err(|_| usage(topic, format!("the value of {name} is not valid UTF-8")))?;
        if value.is_empty() {
            return Err(usage(topic, format!("{name} is empty: {name} {}", slot.1)));
        }
        slot.2 = Some(value);
    }
    let [limit, output, pool, name, kind, dir, root] = values.map(|(_, _, v)| v);
    let required = |v: Option<String>, what: &str| {
        v.ok_or_else(|| {
            usage(
                topic,
                format!("no {what} given: gpucap cdi generate {what} ..."),
            )
        })
    };
    Ok(Command::Cdi(Request {
        limit,
        output: PathBuf::from(required(output, "--output FILE")?),
        pool,
        name: name.unwrap_or_else(|| DEFAULT_NAME.to_string()),
        kind: kind.unwrap_or_else(|| DEFAULT_KIND.to_string()),
        dir: PathBuf::from(dir.unwrap_or_else(|| DEFAULT_DIR.to_string())),
        root: PathBuf::from(root.unwrap_or_else(|| "/".to_string())),
    }))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::super::parse;
    use super::*;

    fn p(words: &[&str]) -> Result<Command, UsageError> {
        parse(words.iter().map(OsString::from))
    }

    #[test]
    fn generate_takes_its_options_once_each() {
        let Ok(Command::Cdi(r)) = p(&[
            "cdi",
            "generate",
            "--limit",
            "8Gi",
            "--output=/etc/cdi/g.json",
        ]) else {
            panic!("not parsed")
        };
        assert_eq!(r.limit.as_deref(), Some("8Gi"));
        assert_eq!(r.output, PathBuf::from("/etc/cdi/g.json"));
        assert_eq!((r.pool, r.name.as_str()), (None, DEFAULT_NAME));
        assert_eq!(
            (r.kind.as_str(), r.root.as_path()),
            (DEFAULT_KIND, std::path::Path::new("/"))
        );
        assert_eq!(p(&["cdi", "--help"]), Ok(Command::Help(Topic::Cdi)));
        assert_eq!(p(&["cdi", "generate", "-h"]), Ok(Command::Help(Topic::Cdi)));
        assert_eq!(p(&["help", "cdi"]), Ok(Command::Help(Topic::Cdi)));
        for (words, says) in [
            (&["cdi"][..], "no cdi command given"),
            (&["cdi", "make"], "unknown cdi command 'make'"),
            (
                &["cdi", "generate", "--limit", "1Gi"],
                "no --output FILE given",
            ),
            (
                &["cdi", "generate", "--limit", "1Gi", "--limit", "2Gi"],
                "--limit given more than once",
            ),
            (&["cdi", "generate", "--bogus"], "unknown option '--bogus'"),
            (&["cdi", "generate", "--name"], "--name needs a value"),
            (&["cdi", "generate", "--name", ""], "--name is empty"),
            (&["cdi", "generate", "extra"], "unexpected argument 'extra'"),
        ] {
            let e = p(words).unwrap_err();
            assert_eq!(e.topic, Topic::Cdi, "{words:?}");
            assert!(e.message.starts_with(says), "{words:?}: {}", e.message);
        }
    }
}
