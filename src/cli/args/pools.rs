//! `gpucap pool list`, `gpucap pool clean [NAME]`, `gpucap pool resize …` (parsed in
//! `resize`) and `gpucap pool set …` (`pool_set`): the words after `pool`.

use super::{Command, PoolAction, Topic, UsageError, extra_after, lexopt_error, usage};
use lexopt::Parser;

/// `pool list` | `pool clean [NAME]` (`-h`/`--help` anywhere: the help).
pub(super) fn parse_pool(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Pool;
    let mut words: Vec<String> = Vec::new();
    let args = parser
        .raw_args()
        .map_err(|e| lexopt_error(topic, e))?
        .collect::<Vec<_>>();
    let action = args.first().and_then(|a| a.to_str());
    if action == Some("resize") || action == Some("set") {
        let mut words = Vec::new();
        for (i, a) in args.iter().enumerate().skip(1) {
            let Some(w) = a.to_str() else {
                return Err(usage(topic, "an argument is not valid UTF-8"));
            };
            if w == "-h" || w == "--help" {
                extra_after(topic, w, args.get(i + 1).map(|a| a.as_os_str()))?;
                return Ok(Command::Help(topic));
            }
            if w.starts_with("--help=") {
                return Err(usage(topic, "--help takes no value"));
            }
            words.push(w.to_string());
        }
        let parsed = if action == Some("set") {
            super::pool_set::parse(&words).map(PoolAction::Set)
        } else {
            crate::resize::parse(&words).map(PoolAction::Resize)
        };
        return parsed.map(Command::Pool).map_err(|e| usage(topic, e));
    }
    for (i, a) in args.iter().enumerate() {
        let Some(w) = a.to_str() else {
            return Err(usage(topic, "an argument is not valid UTF-8"));
        };
        if w == "-h" || w == "--help" {
            extra_after(topic, w, args.get(i + 1).map(|a| a.as_os_str()))?;
            return Ok(Command::Help(topic));
        }
        if w.starts_with("--help=") {
            return Err(usage(topic, "--help takes no value"));
        }
        if w.starts_with('-') {
            return Err(usage(topic, format!("unknown option '{w}'")));
        }
        words.push(w.to_string());
    }
    let mut words = words.into_iter();
    let action = match words.next().as_deref() {
        None => return Err(usage(topic, "no action given (list, clean, resize or set)")),
        Some("list") => PoolAction::List,
        Some("clean") => match words.next() {
            None => PoolAction::Clean(None),
            Some(name) => match gpucap_core::config::parse_pool(&name) {
                Ok(Some(gpucap_core::config::PoolSpec::Name(_))) => PoolAction::Clean(Some(name)),
                _ => {
                    return Err(usage(
                        topic,
                        format!(
                            "invalid pool name {name:?}: the name of a pool of this user's pool \
                             directory (as `gpucap pool list` shows it)"
                        ),
                    ));
                }
            },
        },
        Some(other) => {
            let near =
                gpucap_core::config::nearest_name(other, &["list", "clean", "resize", "set"]);
            return Err(usage(
                topic,
                match near {
                    Some(n) => format!("unknown action '{other}' (did you mean {n}?)"),
                    None => format!(
                        "unknown action '{other}' (the actions are list, clean, resize and set)"
                    ),
                },
            ));
        }
    };
    if let Some(extra) = words.next() {
        return Err(usage(topic, format!("unexpected argument '{extra}'")));
    }
    Ok(Command::Pool(action))
}
