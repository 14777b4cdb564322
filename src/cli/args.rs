//! Command-line parsing, by hand (no clap): pure functions over `OsString`s.

use std::ffi::OsString;

/// Which help text to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    General,
    Run,
    Check,
}

/// Flags that override `GPUCAP_*` variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--limit SPEC`: sets GPUCAP_LIMIT.
    pub limit: Option<String>,
    /// `--log LEVEL`: sets GPUCAP_LOG.
    pub log: Option<String>,
}

impl Overrides {
    /// The (variable, value) pairs these flags set.
    pub fn vars(&self) -> Vec<(&'static str, &str)> {
        let mut v = Vec::new();
        if let Some(l) = &self.limit {
            v.push(("GPUCAP_LIMIT", l.as_str()));
        }
        if let Some(l) = &self.log {
            v.push(("GPUCAP_LOG", l.as_str()));
        }
        v
    }
}

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `gpucap run [OPTIONS] [--] CMD ARGS...`
    Run {
        overrides: Overrides,
        program: OsString,
        args: Vec<OsString>,
    },
    /// `gpucap check [OPTIONS]`
    Check { overrides: Overrides },
    /// `gpucap help [COMMAND]`, `--help`, `-h`
    Help(Topic),
    /// `gpucap --version`, `-V`, `version`
    Version,
}

/// A bad command line: the message, and the help topic to point at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError {
    pub message: String,
    pub topic: Topic,
}

fn usage(topic: Topic, message: impl Into<String>) -> UsageError {
    UsageError {
        message: message.into(),
        topic,
    }
}

/// Parses the arguments after the program name (`std::env::args_os().skip(1)`).
pub fn parse<I>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = OsString>,
{
    let mut args = args.into_iter();
    let Some(first) = args.next() else {
        return Err(usage(Topic::General, "no command given"));
    };
    match first.to_str() {
        Some("run") => parse_run(args),
        Some("check") => parse_check(args),
        Some("help") => parse_help(args),
        Some("-h" | "--help") => Ok(Command::Help(Topic::General)),
        Some("-V" | "--version" | "version") => Ok(Command::Version),
        _ => {
            let s = first.to_string_lossy();
            if s.starts_with("--limit") || s.starts_with("--log") {
                Err(usage(
                    Topic::General,
                    format!(
                        "unknown option '{s}' (options go after the command: gpucap run {s} ...)"
                    ),
                ))
            } else if s.starts_with('-') {
                Err(usage(Topic::General, format!("unknown option '{s}'")))
            } else {
                Err(usage(
                    Topic::General,
                    format!("unknown command '{s}' (the commands are run, check and help)"),
                ))
            }
        }
    }
}

fn parse_help(mut args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let topic = match args.next() {
        None => Topic::General,
        Some(t) => match t.to_str() {
            Some("run") => Topic::Run,
            Some("check") => Topic::Check,
            Some("help") => Topic::General,
            _ => {
                return Err(usage(
                    Topic::General,
                    format!(
                        "no help for '{}' (try: help run, help check)",
                        t.to_string_lossy()
                    ),
                ));
            }
        },
    };
    if let Some(extra) = args.next() {
        return Err(usage(
            topic,
            format!(
                "unexpected argument '{}' after help",
                extra.to_string_lossy()
            ),
        ));
    }
    Ok(Command::Help(topic))
}

/// What one argument is, as an option of `run` or `check`.
enum Opt {
    /// An option that was handled (value consumed).
    Handled,
    /// `-h` / `--help`.
    Help,
    /// Not an option: `--`, or the first word of the command.
    NotAnOption,
}

/// Handles `--limit SPEC`, `--limit=SPEC`, `--log LEVEL`, `--log=LEVEL`, `-h`, `--help`.
fn parse_option(
    topic: Topic,
    arg: &OsString,
    rest: &mut dyn Iterator<Item = OsString>,
    overrides: &mut Overrides,
) -> Result<Opt, UsageError> {
    let lossy = arg.to_string_lossy();
    if lossy == "--" || !lossy.starts_with('-') || lossy == "-" {
        return Ok(Opt::NotAnOption);
    }
    if lossy == "-h" || lossy == "--help" {
        return Ok(Opt::Help);
    }
    let (name, inline) = match lossy.split_once('=') {
        Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v)),
        _ => (lossy.to_string(), None),
    };
    let slot = match name.as_str() {
        "--limit" => &mut overrides.limit,
        "--log" => &mut overrides.log,
        _ => return Err(usage(topic, format!("unknown option '{name}'"))),
    };
    if slot.is_some() {
        return Err(usage(topic, format!("{name} given more than once")));
    }
    let value = match inline {
        Some(v) => {
            if arg.to_str().is_none() {
                return Err(usage(
                    topic,
                    format!("the value of {name} is not valid UTF-8"),
                ));
            }
            v.to_string()
        }
        None => {
            let what = if name == "--limit" {
                "SPEC (e.g. 8Gi)"
            } else {
                "LEVEL"
            };
            let Some(v) = rest.next() else {
                return Err(usage(topic, format!("{name} needs a value: {name} {what}")));
            };
            match v.into_string() {
                Ok(v) => v,
                Err(_) => {
                    return Err(usage(
                        topic,
                        format!("the value of {name} is not valid UTF-8"),
                    ));
                }
            }
        }
    };
    *slot = Some(value);
    Ok(Opt::Handled)
}

fn parse_run(mut args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut overrides = Overrides::default();
    let mut program = None;
    while let Some(arg) = args.next() {
        match parse_option(Topic::Run, &arg, &mut args, &mut overrides)? {
            Opt::Handled => continue,
            Opt::Help => return Ok(Command::Help(Topic::Run)),
            Opt::NotAnOption => {
                program = if arg == "--" { args.next() } else { Some(arg) };
                break;
            }
        }
    }
    let Some(program) = program else {
        return Err(usage(
            Topic::Run,
            "no command to run: gpucap run [--limit SPEC] [--log LEVEL] [--] CMD [ARGS...]",
        ));
    };
    if program.is_empty() {
        return Err(usage(Topic::Run, "the command to run is empty"));
    }
    Ok(Command::Run {
        overrides,
        program,
        args: args.collect(),
    })
}

fn parse_check(mut args: impl Iterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut overrides = Overrides::default();
    while let Some(arg) = args.next() {
        match parse_option(Topic::Check, &arg, &mut args, &mut overrides)? {
            Opt::Handled => {}
            Opt::Help => return Ok(Command::Help(Topic::Check)),
            Opt::NotAnOption => {
                return Err(usage(
                    Topic::Check,
                    format!(
                        "unexpected argument '{}' (check takes only --limit and --log)",
                        arg.to_string_lossy()
                    ),
                ));
            }
        }
    }
    Ok(Command::Check { overrides })
}

pub const USAGE: &str = "\
usage: gpucap run [--limit SPEC] [--log LEVEL] [--] CMD [ARGS...]
       gpucap check [--limit SPEC] [--log LEVEL]
       gpucap help [run|check]
       gpucap --version";

const GENERAL_HELP: &str = "\
gpucap: cap the GPU memory of unmodified CUDA programs.

usage: gpucap run [--limit SPEC] [--log LEVEL] [--] CMD [ARGS...]
       gpucap check [--limit SPEC] [--log LEVEL]
       gpucap help [run|check]
       gpucap --version

commands:
  run     run CMD with libgpucap.so preloaded, so that its CUDA allocations are capped
  check   validate the configuration and show the cap of each visible GPU
  help    show this help, or the help of a command

environment:
  GPUCAP_LIMIT   the cap: one value for every GPU, or a comma list (see below);
                 unset = allocations are counted, not capped
  GPUCAP_LOG     off, error, warn (default), info or debug
  GPUCAP_LIB     the path of libgpucap.so (default: beside the gpucap executable)
  GPUCAP_GROWTH  reserved: 0/1, true/false, yes/no, on/off
  GPUCAP_REPORT  reserved: a file path
  Any other GPUCAP_* variable is an error, to catch typos.

limit SPEC:
  8Gi, 512Mi, 4GiB, 1.5G, 100MB   a size (Ki Mi Gi Ti KiB... binary; k K M G T KB... decimal)
  1073741824                      whole bytes
  50%, 12.5%                      a share of the GPU's physical memory, in (0%, 100%]
  0.5, 1.0                        the same as a fraction in (0, 1]
  0=8Gi,1=50%                     per GPU (CUDA ordinals, after CUDA_VISIBLE_DEVICES)
  4Gi,1=8Gi                       GPU 1 gets 8Gi, every other GPU 4Gi

exit status: that of CMD for run; 2 for a usage or configuration error;
126 if CMD cannot be executed; 127 if CMD is not found.";

const RUN_HELP: &str = "\
usage: gpucap run [--limit SPEC] [--log LEVEL] [--] CMD [ARGS...]

Runs CMD with libgpucap.so added to LD_PRELOAD, so that its CUDA allocations are
capped. gpucap replaces itself with CMD (exec): the exit status and signals are CMD's.

options:
  --limit SPEC   set GPUCAP_LIMIT (overrides the variable), e.g. 8Gi, 50%, 0=8Gi,1=50%
  --log LEVEL    set GPUCAP_LOG: off, error, warn, info or debug
  -h, --help     show this help
  --             end of options; everything after it is CMD and its arguments

The whole GPUCAP_* environment is validated before CMD starts: an error stops
gpucap with exit status 2, and CMD never runs uncapped by mistake.
libgpucap.so is taken from GPUCAP_LIB if set, else from the directory of the gpucap
executable; it is appended to an existing LD_PRELOAD (unless already there).
exit status: CMD's; 2 for a usage or configuration error; 126 if CMD cannot be
executed; 127 if CMD is not found.";

const CHECK_HELP: &str = "\
usage: gpucap check [--limit SPEC] [--log LEVEL]

Validates the GPUCAP_* environment (with the flags applied, as run would) and prints
the effective configuration and the library that run would preload. If a CUDA driver
can be loaded, it also prints the cap in bytes of each visible GPU.

options:
  --limit SPEC   check this GPUCAP_LIMIT instead of the variable's
  --log LEVEL    check this GPUCAP_LOG instead of the variable's
  -h, --help     show this help

exit status: 0 if the configuration is valid and libgpucap.so was found, else 2.";

/// The help text of `topic`.
pub fn help(topic: Topic) -> &'static str {
    match topic {
        Topic::General => GENERAL_HELP,
        Topic::Run => RUN_HELP,
        Topic::Check => CHECK_HELP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn p(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from))
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn run(limit: Option<&str>, log: Option<&str>, program: &str, args: &[&str]) -> Command {
        Command::Run {
            overrides: Overrides {
                limit: limit.map(String::from),
                log: log.map(String::from),
            },
            program: program.into(),
            args: os(args),
        }
    }

    fn err(args: &[&str]) -> UsageError {
        p(args).expect_err(&format!("{args:?}"))
    }

    #[test]
    fn run_forms() {
        assert_eq!(
            p(&["run", "python", "x.py"]),
            Ok(run(None, None, "python", &["x.py"]))
        );
        assert_eq!(
            p(&[
                "run", "--limit", "8Gi", "--log", "debug", "python", "-m", "t"
            ]),
            Ok(run(Some("8Gi"), Some("debug"), "python", &["-m", "t"]))
        );
        assert_eq!(
            p(&["run", "--limit=0=8Gi,1=50%", "--log=info", "--", "./a.out"]),
            Ok(run(Some("0=8Gi,1=50%"), Some("info"), "./a.out", &[]))
        );
        // Options after CMD belong to CMD.
        assert_eq!(
            p(&["run", "prog", "--limit", "1Gi", "--"]),
            Ok(run(None, None, "prog", &["--limit", "1Gi", "--"]))
        );
        // After --, a leading dash is CMD's.
        assert_eq!(
            p(&["run", "--", "-weird", "a"]),
            Ok(run(None, None, "-weird", &["a"]))
        );
        // An empty --limit value is passed on, for config to reject with its message.
        assert_eq!(
            p(&["run", "--limit=", "x"]),
            Ok(run(Some(""), None, "x", &[]))
        );
        // A value that looks like an option is still the value.
        assert_eq!(
            p(&["run", "--log", "-x", "y"]),
            Ok(run(None, Some("-x"), "y", &[]))
        );
    }

    #[test]
    fn run_passes_non_utf8_arguments() {
        let bad = OsString::from_vec(b"caf\xe9".to_vec());
        let args = vec![OsString::from("run"), OsString::from("echo"), bad.clone()];
        assert_eq!(
            parse(args),
            Ok(Command::Run {
                overrides: Overrides::default(),
                program: "echo".into(),
                args: vec![bad.clone()],
            })
        );
        let args = vec![OsString::from("run"), OsString::from("--limit"), bad];
        assert!(parse(args).unwrap_err().message.contains("not valid UTF-8"));
    }

    #[test]
    fn run_errors() {
        let e = err(&["run"]);
        assert_eq!(e.topic, Topic::Run);
        assert!(e.message.contains("no command to run"));
        assert!(err(&["run", "--"]).message.contains("no command to run"));
        assert!(
            err(&["run", "--limit", "8Gi"])
                .message
                .contains("no command to run")
        );
        assert!(
            err(&["run", "--limit"])
                .message
                .contains("--limit needs a value")
        );
        assert!(
            err(&["run", "--log"])
                .message
                .contains("--log needs a value")
        );
        assert_eq!(
            err(&["run", "--lmit", "8Gi", "x"]).message,
            "unknown option '--lmit'"
        );
        assert_eq!(
            err(&["run", "--lmit=8Gi", "x"]).message,
            "unknown option '--lmit'"
        );
        assert_eq!(
            err(&["run", "-l", "8Gi", "x"]).message,
            "unknown option '-l'"
        );
        assert!(
            err(&["run", "--limit", "1Gi", "--limit", "2Gi", "x"])
                .message
                .contains("more than once")
        );
        assert!(err(&["run", ""]).message.contains("empty"));
    }

    #[test]
    fn check_forms() {
        assert_eq!(
            p(&["check"]),
            Ok(Command::Check {
                overrides: Overrides::default()
            })
        );
        assert_eq!(
            p(&["check", "--limit", "50%", "--log=off"]),
            Ok(Command::Check {
                overrides: Overrides {
                    limit: Some("50%".into()),
                    log: Some("off".into()),
                },
            })
        );
        assert_eq!(p(&["check", "--help"]), Ok(Command::Help(Topic::Check)));
        let e = err(&["check", "extra"]);
        assert_eq!(e.topic, Topic::Check);
        assert!(e.message.contains("unexpected argument 'extra'"));
        assert_eq!(
            err(&["check", "--bogus"]).message,
            "unknown option '--bogus'"
        );
        assert!(err(&["check", "--limit"]).message.contains("needs a value"));
    }

    #[test]
    fn help_and_version() {
        assert_eq!(p(&["--help"]), Ok(Command::Help(Topic::General)));
        assert_eq!(p(&["-h"]), Ok(Command::Help(Topic::General)));
        assert_eq!(p(&["help"]), Ok(Command::Help(Topic::General)));
        assert_eq!(p(&["help", "run"]), Ok(Command::Help(Topic::Run)));
        assert_eq!(p(&["help", "check"]), Ok(Command::Help(Topic::Check)));
        assert_eq!(p(&["run", "-h"]), Ok(Command::Help(Topic::Run)));
        assert_eq!(
            p(&["run", "--limit", "1Gi", "--help", "x"]),
            Ok(Command::Help(Topic::Run))
        );
        assert_eq!(p(&["--version"]), Ok(Command::Version));
        assert_eq!(p(&["-V"]), Ok(Command::Version));
        assert_eq!(p(&["version"]), Ok(Command::Version));
        assert!(
            err(&["help", "nope"])
                .message
                .contains("no help for 'nope'")
        );
        assert!(
            err(&["help", "run", "x"])
                .message
                .contains("unexpected argument")
        );
    }

    #[test]
    fn top_level_errors() {
        assert_eq!(err(&[]).message, "no command given");
        assert!(
            err(&["frobnicate"])
                .message
                .starts_with("unknown command 'frobnicate'")
        );
        assert!(
            err(&["--limit", "8Gi"])
                .message
                .starts_with("unknown option '--limit' (options go")
        );
        assert_eq!(err(&["-x"]).message, "unknown option '-x'");
    }

    #[test]
    fn overrides_vars() {
        let o = Overrides {
            limit: Some("8Gi".into()),
            log: None,
        };
        assert_eq!(o.vars(), vec![("GPUCAP_LIMIT", "8Gi")]);
        assert!(Overrides::default().vars().is_empty());
    }
}
