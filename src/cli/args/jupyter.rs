//! The words after `jupyter`: `install [OPTIONS]`, `list`, `remove NAME`.

use std::path::PathBuf;

use super::options::{option_value, unknown_option};
use super::{
    Command, Overrides, Topic, UsageError, lexopt_error, nothing_more, option_name, usage,
    with_attached,
};
use lexopt::{Arg, Parser};

/// Where `jupyter install` writes the kernelspec (as `jupyter kernelspec install` has it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelScope {
    /// `--user` (the default): this user's Jupyter data directory.
    User,
    /// `--sys-prefix`: the environment of the `jupyter` on PATH.
    SysPrefix,
    /// `--prefix DIR`: DIR/share/jupyter/kernels.
    Prefix(PathBuf),
}

/// `gpucap jupyter install`'s choices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JupyterInstall {
    /// The cap, as the flags of `run` (validated as `gpucap check` would).
    pub overrides: Overrides,
    /// `--kernel NAME`: the kernelspec to wrap (default python3).
    pub kernel: String,
    /// `--name NAME`: the new kernelspec's name (default: derived from the kernel and cap).
    pub name: Option<String>,
    /// `--display-name TEXT`: instead of the wrapped one's, suffixed with the cap.
    pub display_name: Option<String>,
    pub scope: KernelScope,
}

/// `gpucap jupyter ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JupyterCommand {
    Install(Box<JupyterInstall>),
    /// `list`: the kernelspecs gpucap wrote.
    List,
    /// `remove NAME`: one of them.
    Remove {
        name: String,
    },
}

/// What a kernelspec name may hold (Jupyter's own rule).
pub const KERNEL_NAME_ACCEPTED: &str = "letters, digits, '.', '_' and '-'";

/// Whether `name` is a valid kernelspec name.
pub fn valid_kernel_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

pub(super) fn parse_jupyter(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Jupyter;
    let first = match parser.next().map_err(|e| lexopt_error(topic, e))? {
        None => {
            return Err(usage(
                topic,
                "no jupyter command: gpucap jupyter install|list|remove",
            ));
        }
        Some(Arg::Value(word)) => Ok(word),
        Some(option) => Err(option_name(&option)),
    };
    let sub = match first {
        Ok(word) => word,
        Err(name) => {
            let typed = with_attached(&mut parser, &name);
            if typed == "-h" || typed == "--help" {
                nothing_more(&mut parser, topic, &typed)?;
                return Ok(Command::Help(topic));
            }
            if typed.starts_with("--help=") {
                return Err(usage(topic, "--help takes no value"));
            }
            return Err(usage(
                topic,
                format!("unknown option '{typed}' (gpucap jupyter install|list|remove ...)"),
            ));
        }
    };
    match sub.to_str() {
        Some("install") => parse_install(parser),
        Some("list") => match parse_rest(&mut parser, "list")? {
            Rest::Help => Ok(Command::Help(topic)),
            Rest::Words(w) if w.is_empty() => Ok(Command::Jupyter(JupyterCommand::List)),
            Rest::Words(w) => Err(usage(
                topic,
                format!("unexpected argument '{}' after list", w[0]),
            )),
        },
        Some("remove") => match parse_rest(&mut parser, "remove")? {
            Rest::Help => Ok(Command::Help(topic)),
            Rest::Words(w) if w.len() == 1 => Ok(Command::Jupyter(JupyterCommand::Remove {
                name: w.into_iter().next().unwrap_or_default(),
            })),
            Rest::Words(w) if w.is_empty() => Err(usage(
                topic,
                "no kernel to remove: gpucap jupyter remove NAME (gpucap jupyter list names them)",
            )),
            Rest::Words(w) => Err(usage(
                topic,
                format!("unexpected argument '{}' (remove takes one NAME)", w[1]),
            )),
        },
        _ => Err(usage(
            topic,
            format!(
                "unknown jupyter command '{}' (install, list or remove)",
                sub.to_string_lossy()
            ),
        )),
    }
}

enum Rest {
    Help,
    Words(Vec<String>),
}

/// The plain words of `list` and `remove` (which take no options but `--help`).
fn parse_rest(parser: &mut Parser, sub: &str) -> Result<Rest, UsageError> {
    let topic = Topic::Jupyter;
    let mut words = Vec::new();
    while let Some(arg) = parser.next().map_err(|e| lexopt_error(topic, e))? {
        let arg = match arg {
            Arg::Value(w) => Ok(w),
            option => Err(option_name(&option)),
        };
        match arg {
            Ok(w) => words.push(
                w.into_string()
                    .map_err(|_| usage(topic, "a kernel name is not valid UTF-8"))?,
            ),
            Err(name) => {
                let typed = with_attached(parser, &name);
                if typed == "-h" || typed == "--help" {
                    nothing_more(parser, topic, &typed)?;
                    return Ok(Rest::Help);
                }
                return Err(usage(
                    topic,
                    format!("unknown option '{typed}' ({sub} takes no options)"),
                ));
            }
        }
    }
    Ok(Rest::Words(words))
}

fn parse_install(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Jupyter;
    let mut o = Overrides::default();
    let (mut kernel, mut name, mut display_name, mut scope) = (None, None, None, None);
    while let Some(arg) = parser.next().map_err(|e| lexopt_error(topic, e))? {
        let name_typed = match arg {
            Arg::Value(w) => {
                return Err(usage(
                    topic,
                    format!(
                        "unexpected argument '{}' (install takes only options)",
                        w.to_string_lossy()
                    ),
                ));
            }
            option => option_name(&option),
        };
        if !name_typed.starts_with("--") {
            let typed = with_attached(&mut parser, &name_typed);
            if typed == "-h" {
                nothing_more(&mut parser, topic, &typed)?;
                return Ok(Command::Help(topic));
            }
            return Err(usage(topic, format!("unknown option '{typed}'")));
        }
        let attached = parser.optional_value();
        let new_scope = match name_typed.as_str() {
            "--help" if attached.is_none() => {
                nothing_more(&mut parser, topic, "--help")?;
                return Ok(Command::Help(topic));
            }
            "--help" => return Err(usage(topic, "--help takes no value")),
            "--growth" if attached.is_none() => {
                if o.growth {
                    return Err(usage(topic, "--growth given more than once"));
                }
                o.growth = true;
                continue;
            }
            "--user" if attached.is_none() => Some(KernelScope::User),
            "--sys-prefix" if attached.is_none() => Some(KernelScope::SysPrefix),
            "--prefix" => {
                let v = option_value(topic, &mut parser, "--prefix", attached.clone(), "DIR")?;
                if v.is_empty() {
                    return Err(usage(topic, "--prefix needs a directory"));
                }
                Some(KernelScope::Prefix(PathBuf::from(v)))
            }
            "--user" | "--sys-prefix" | "--growth" => {
                return Err(usage(topic, format!("{name_typed} takes no value")));
            }
            _ => None,
        };
        if let Some(s) = new_scope {
            if scope.is_some() {
                return Err(usage(
                    topic,
                    "--user, --sys-prefix and --prefix exclude each other (one place to write)",
                ));
            }
            scope = Some(s);
            continue;
        }
        let (slot, what) = match name_typed.as_str() {
            "--limit" => (&mut o.limit, "SPEC (e.g. 8Gi)"),
            "--log" => (&mut o.log, "LEVEL"),
            "--pool" => (&mut o.pool, "NAME|PATH"),
            "--wait" => (&mut o.wait, "DURATION (e.g. 30s)"),
            "--guarantee" => (&mut o.guarantee, "SPEC (e.g. 4Gi)"),
            "--ceiling" => (&mut o.ceiling, "SPEC (e.g. 6Gi)"),
            "--kernel" => (&mut kernel, "NAME"),
            "--name" => (&mut name, "NAME"),
            "--display-name" => (&mut display_name, "TEXT"),
            _ => return Err(usage(topic, unknown_option(topic, &name_typed))),
        };
        if slot.is_some() {
            return Err(usage(topic, format!("{name_typed} given more than once")));
        }
        let value = option_value(topic, &mut parser, &name_typed, attached, what)?
            .into_string()
            .map_err(|_| {
                usage(
                    topic,
                    format!("the value of {name_typed} is not valid UTF-8"),
                )
            })?;
        *slot = Some(value);
    }
    if o.limit.is_none() && o.pool.is_none() {
        return Err(usage(
            topic,
            "no cap: give --limit SPEC (e.g. --limit 8Gi), or --pool NAME to share one",
        ));
    }
    for (flag, value) in [("--kernel", &kernel), ("--name", &name)] {
        if let Some(v) = value
            && !valid_kernel_name(v)
        {
            return Err(usage(
                topic,
                format!("invalid {flag} {v:?}: a kernel name holds {KERNEL_NAME_ACCEPTED}"),
            ));
        }
    }
    Ok(Command::Jupyter(JupyterCommand::Install(Box::new(
        JupyterInstall {
            overrides: o,
            kernel: kernel.unwrap_or_else(|| "python3".to_string()),
            name,
            display_name,
            scope: scope.unwrap_or(KernelScope::User),
        },
    ))))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::super::parse;
    use super::*;

    fn p(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn install_options() {
        let Command::Jupyter(JupyterCommand::Install(i)) = p(&[
            "jupyter",
            "install",
            "--limit",
            "8Gi",
            "--pool=team",
            "--guarantee",
            "2Gi",
            "--name",
            "capped",
            "--sys-prefix",
        ])
        .unwrap() else {
            panic!("not an install")
        };
        assert_eq!(i.overrides.limit.as_deref(), Some("8Gi"));
        assert_eq!(i.overrides.pool.as_deref(), Some("team"));
        assert_eq!(i.overrides.guarantee.as_deref(), Some("2Gi"));
        assert_eq!(i.name.as_deref(), Some("capped"));
        assert_eq!(i.kernel, "python3");
        assert_eq!(i.scope, KernelScope::SysPrefix);
    }

    #[test]
    fn install_mistakes() {
        for (args, says) in [
            (&["jupyter", "install"][..], "no cap"),
            (
                &[
                    "jupyter",
                    "install",
                    "--limit",
                    "1Gi",
                    "--user",
                    "--sys-prefix",
                ],
                "exclude",
            ),
            (
                &["jupyter", "install", "--limit", "1Gi", "--name", "a b"],
                "kernel name",
            ),
            (
                &["jupyter", "install", "--limit", "1Gi", "--limit", "2Gi"],
                "more than once",
            ),
            (
                &["jupyter", "install", "--limit", "1Gi", "--bogus"],
                "unknown option '--bogus'",
            ),
            (
                &["jupyter", "install", "--limit", "1Gi", "x"],
                "unexpected argument 'x'",
            ),
            (&["jupyter"], "no jupyter command"),
            (&["jupyter", "frob"], "unknown jupyter command"),
            (&["jupyter", "remove"], "no kernel to remove"),
            (&["jupyter", "list", "x"], "unexpected argument"),
        ] {
            let e = p(args).unwrap_err();
            assert_eq!(e.topic, Topic::Jupyter, "{args:?}");
            assert!(e.message.contains(says), "{args:?}: {}", e.message);
        }
    }

    #[test]
    fn list_remove_and_help() {
        assert_eq!(
            p(&["jupyter", "list"]).unwrap(),
            Command::Jupyter(JupyterCommand::List)
        );
        assert_eq!(
            p(&["jupyter", "remove", "k"]).unwrap(),
            Command::Jupyter(JupyterCommand::Remove { name: "k".into() })
        );
        for args in [
            &["jupyter", "--help"][..],
            &["jupyter", "install", "-h"],
            &["help", "jupyter"],
        ] {
            assert_eq!(p(args).unwrap(), Command::Help(Topic::Jupyter), "{args:?}");
        }
    }
}
