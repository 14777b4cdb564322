//! Command-line parsing: pure functions over `OsString`s, with `lexopt` splitting the
//! words (`--name=value`, `--`, `-h`) and the help texts and messages our own.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;

use lexopt::{Arg, Parser};

pub use super::help::Topic;

/// Flags that override `GPUCAP_*` variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--limit SPEC`: sets GPUCAP_LIMIT.
    pub limit: Option<String>,
    /// `--log LEVEL`: sets GPUCAP_LOG.
    pub log: Option<String>,
    /// `--growth`: sets GPUCAP_GROWTH=1 (and, for `run`, the frameworks' own
    /// grow-on-demand switches: see [`FRAMEWORK_GROWTH_VARS`]).
    pub growth: bool,
    /// `--report PATH`: sets GPUCAP_REPORT.
    pub report: Option<String>,
    /// `--pool NAME|PATH|off`: sets GPUCAP_POOL.
    pub pool: Option<String>,
    /// `--wait DURATION`: sets GPUCAP_WAIT.
    pub wait: Option<String>,
    /// `--guarantee SPEC`: sets GPUCAP_GUARANTEE.
    pub guarantee: Option<String>,
    /// `--ceiling SPEC`: sets GPUCAP_CEILING.
    pub ceiling: Option<String>,
}

/// What `gpucap run --growth` also sets, unless the user already set them: the
/// frameworks' switches that make them grow on demand instead of preallocating.
pub const FRAMEWORK_GROWTH_VARS: &[(&str, &str)] = &[
    ("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
];

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
        if self.growth {
            v.push(("GPUCAP_GROWTH", "1"));
        }
        if let Some(r) = &self.report {
            v.push(("GPUCAP_REPORT", r.as_str()));
        }
        if let Some(p) = &self.pool {
            v.push(("GPUCAP_POOL", p.as_str()));
        }
        if let Some(w) = &self.wait {
            v.push(("GPUCAP_WAIT", w.as_str()));
        }
        if let Some(g) = &self.guarantee {
            v.push(("GPUCAP_GUARANTEE", g.as_str()));
        }
        if let Some(c) = &self.ceiling {
            v.push(("GPUCAP_CEILING", c.as_str()));
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
        /// `--measure`: run CMD uncapped as a child, then print its peak per GPU and a
        /// suggested `--limit`.
        measure: bool,
        program: OsString,
        args: Vec<OsString>,
    },
    /// `gpucap check [OPTIONS]`
    Check {
        overrides: Overrides,
        /// `--write-env FILE`: also write the validated GPUCAP_* variables to FILE (the
        /// container entrypoint's `gpucap.env`).
        write_env: Option<OsString>,
    },
    /// `gpucap status [--pool NAME|PATH] [--json]`: one snapshot of a pool.
    Status {
        /// `--pool`: the pool to show instead of the one the environment names.
        pool: Option<String>,
        /// `--json`: the snapshot as one JSON object.
        json: bool,
    },
    /// `gpucap status --prometheus [--pool NAME|PATH]... [--all]`: pools once, in
    /// Prometheus's text exposition format.
    StatusPrometheus { pools: PoolSet },
    /// `gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all]`: an HTTP server
    /// of that exposition.
    Metrics { listen: SocketAddr, pools: PoolSet },
    /// `gpucap top [--pool NAME|PATH] [--interval SECS] [--iterations N]`: the
    /// snapshot, refreshed.
    Top {
        pool: Option<String>,
        /// `--interval`: between snapshots, in milliseconds (200 to 60000).
        interval_ms: u64,
        /// `--iterations`: how many snapshots (None: until interrupted).
        iterations: Option<u64>,
    },
    /// `gpucap help [COMMAND]`, `--help`, `-h`
    Help(Topic),
    /// `gpucap --version`, `-V`, `version`
    Version,
}

/// The pools of `status --prometheus` and `metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolSet {
    /// The one `status` would show (the environment's, else gpucap.env's).
    Configured,
    /// `--pool` given once or more: these values (as given, not yet validated; repeats
    /// dropped), in order.
    Named(Vec<String>),
    /// `--all`: every pool file in this user's pool directory, listed at each reading.
    All,
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
    let mut parser = Parser::from_args(args);
    // `-h=x` stays one word in messages (lexopt would drop the `=`).
    parser.set_short_equals(false);
    // lexopt skips a `--`: here it is not a command, so say so.
    if next_is_double_dash(&mut parser) {
        return Err(usage(Topic::General, "unknown option '--'"));
    }
    let first = match parser.next().map_err(|e| lexopt_error(Topic::General, e))? {
        None => return Err(usage(Topic::General, "no command given")),
        Some(Arg::Value(word)) => word,
        Some(option) => {
            let name = option_name(&option);
            let typed = with_attached(&mut parser, &name);
            return match typed.as_str() {
                "-h" | "--help" => nothing_after(parser, &typed, Command::Help(Topic::General)),
                "-V" | "--version" => nothing_after(parser, &typed, Command::Version),
                s if s.starts_with("--limit") || s.starts_with("--log") => Err(usage(
                    Topic::General,
                    format!(
                        "unknown option '{s}' (options go after the command: gpucap run {s} ...)"
                    ),
                )),
                s => Err(usage(Topic::General, format!("unknown option '{s}'"))),
            };
        }
    };
    match first.to_str() {
        Some("run") => parse_run(parser),
        Some("check") => parse_check(parser),
        Some("status") => parse_status(parser),
        Some("top") => parse_top(parser),
        Some("metrics") => parse_metrics(parser),
        Some("help") => parse_help(parser),
        Some("version") => nothing_after(parser, "version", Command::Version),
        _ => {
            let s = first.to_string_lossy();
            if s.starts_with('-') {
                // Only `-` itself: lexopt calls it a value.
                Err(usage(Topic::General, format!("unknown option '{s}'")))
            } else {
                Err(usage(
                    Topic::General,
                    format!(
                        "unknown command '{s}' (the commands are run, check, status, top, \
                         metrics and help)"
                    ),
                ))
            }
        }
    }
}

/// `command` when nothing follows `word` (`--version`, `--help`, `version`), else a
/// usage error naming the first extra argument: `gpucap --version --bogus` is a mistake.
fn nothing_after(mut parser: Parser, word: &str, command: Command) -> Result<Command, UsageError> {
    let mut rest = parser
        .raw_args()
        .map_err(|e| lexopt_error(Topic::General, e))?;
    match rest.next() {
        None => Ok(command),
        Some(extra) => Err(usage(
            Topic::General,
            format!(
                "unexpected argument '{}' after {word} (it takes no arguments)",
                extra.to_string_lossy()
            ),
        )),
    }
}

/// Whether the next argument is exactly `--` (which lexopt would consume silently).
fn next_is_double_dash(parser: &mut Parser) -> bool {
    parser
        .try_raw_args()
        .is_some_and(|raw| raw.peek() == Some(OsStr::new("--")))
}

/// `-x` or `--name`, as typed (without any attached value).
fn option_name(arg: &Arg<'_>) -> String {
    match arg {
        Arg::Short(c) => format!("-{c}"),
        Arg::Long(name) => format!("--{name}"),
        Arg::Value(v) => v.to_string_lossy().into_owned(),
    }
}

/// The whole option word as typed: `name` with the value attached to it, if any
/// (`--name=value`, or the rest of a short cluster such as `-hx`), which is consumed.
fn with_attached(parser: &mut Parser, name: &str) -> String {
    match parser.optional_value() {
        None => name.to_string(),
        Some(v) if name.starts_with("--") => format!("{name}={}", v.to_string_lossy()),
        Some(v) => format!("{name}{}", v.to_string_lossy()),
    }
}

/// A lexopt error as a usage error. The parsing below consumes every attached value,
/// so lexopt has nothing to complain about; this only keeps its message if it does.
fn lexopt_error(topic: Topic, e: lexopt::Error) -> UsageError {
    usage(topic, e.to_string())
}

/// `help [run|check|status|top|metrics]`: the words after `help`, taken raw (`help --help` names no topic).
fn parse_help(mut parser: Parser) -> Result<Command, UsageError> {
    let mut args = parser
        .raw_args()
        .map_err(|e| lexopt_error(Topic::General, e))?;
    let topic = match args.next() {
        None => Topic::General,
        Some(t) => match t.to_str() {
            Some("run") => Topic::Run,
            Some("check") => Topic::Check,
            Some("status") => Topic::Status,
            Some("top") => Topic::Top,
            Some("metrics") => Topic::Metrics,
            Some("help") => Topic::General,
            _ => {
                return Err(usage(
                    Topic::General,
                    format!(
                        "no help for '{}' (try: help run, help check, help status, help top, \
                         help metrics)",
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

/// Where the options of `run` or `check` stopped.
enum End {
    /// `-h` / `--help`.
    Help,
    /// The first word that is not an option (for `run`: CMD, also after `--`).
    Word(OsString),
    /// The end of the command line.
    Done,
}

/// Everything the options of `run`, `check`, `status` and `top` set.
#[derive(Default)]
struct Options {
    overrides: Overrides,
    measure: bool,
    write_env: Option<OsString>,
    json: bool,
    interval_ms: Option<u64>,
    iterations: Option<u64>,
    /// `--pool` of `status` and `metrics`, which may be given several times.
    pools: Vec<String>,
    all: bool,
    prometheus: bool,
    listen: Option<SocketAddr>,
}

/// What `--interval` accepts.
pub const INTERVAL_ACCEPTED: &str = "a number of seconds from 0.2 to 60 (e.g. 1, 0.5, 2.5)";

/// Parses an `--interval` value: seconds in [0.2, 60], as whole milliseconds.
pub fn parse_interval(value: &str) -> Result<u64, String> {
    let secs: f64 = value
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite())
        .ok_or_else(|| format!("invalid --interval {value:?}: {INTERVAL_ACCEPTED}"))?;
    if !(0.2..=60.0).contains(&secs) {
        return Err(format!(
            "invalid --interval {value:?}: out of range; {INTERVAL_ACCEPTED}"
        ));
    }
    Ok((secs * 1000.0).round() as u64)
}

/// What `--listen` accepts.
pub const LISTEN_ACCEPTED: &str = "an IP address and a port, e.g. 127.0.0.1:9400, 0.0.0.0:9400 or [::]:9400 (port 0: any free port)";

/// Parses a `--listen` value: `IPv4:PORT` or `[IPv6]:PORT` (no host names: the address
/// a server binds to is better said than looked up).
pub fn parse_listen(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| format!("invalid --listen {value:?}: {LISTEN_ACCEPTED}"))
}

/// Parses an `--iterations` value: a whole number, at least 1.
pub fn parse_iterations(value: &str) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "invalid --iterations {value:?}: a whole number of snapshots, at least 1"
        )),
    }
}

/// The value of option `name`: attached (`--name=value`), else the next argument, even if
/// it starts with a dash (`--log -x`); `what` names the value in the error.
fn option_value(
    topic: Topic,
    parser: &mut Parser,
    name: &str,
    attached: Option<OsString>,
    what: &str,
) -> Result<OsString, UsageError> {
    match attached {
        Some(v) => Ok(v),
        None => parser
            .value()
            .map_err(|_| usage(topic, format!("{name} needs a value: {name} {what}"))),
    }
}

/// Reads the options of a command up to the first word that is not one: for `run`
/// and `check`, `--limit SPEC`, `--log LEVEL`, `--report PATH`, `--wait DURATION`
/// (also as `--name=value`), `--growth`, `--pool NAME|PATH`, and for `run` `--measure`, for
/// `check` `--write-env FILE`; for `status`, `--pool` and `--json`; for `top`,
/// `--pool`, `--interval SECS` and `--iterations N`; for `status`, also `--prometheus`
/// and `--all`, and for `metrics` `--listen ADDR:PORT`, `--pool` and `--all` (both take
/// `--pool` several times); `-h`, `--help` for all.
fn parse_options(topic: Topic, parser: &mut Parser, opts: &mut Options) -> Result<End, UsageError> {
    let config_flags = matches!(topic, Topic::Run | Topic::Check);
    loop {
        if topic != Topic::Run && next_is_double_dash(parser) {
            return Err(usage(
                topic,
                format!(
                    "unexpected argument '--' ({} takes only options)",
                    topic_name(topic)
                ),
            ));
        }
        let name = match parser.next().map_err(|e| lexopt_error(topic, e))? {
            None => return Ok(End::Done),
            Some(Arg::Value(word)) => return Ok(End::Word(word)),
            Some(option) => option_name(&option),
        };
        // A short option stands alone: `-hx` is not `-h`.
        if !name.starts_with("--") {
            let typed = with_attached(parser, &name);
            if typed == "-h" {
                return Ok(End::Help);
            }
            return Err(usage(topic, format!("unknown option '{typed}'")));
        }
        let attached = parser.optional_value();
        // Flags without a value.
        let flag = match (name.as_str(), topic) {
            ("--help", _) if attached.is_none() => return Ok(End::Help),
            ("--growth", Topic::Run | Topic::Check) => Some(&mut opts.overrides.growth),
            ("--measure", Topic::Run) => Some(&mut opts.measure),
            ("--json", Topic::Status) => Some(&mut opts.json),
            ("--prometheus", Topic::Status) => Some(&mut opts.prometheus),
            ("--all", Topic::Status | Topic::Metrics) => Some(&mut opts.all),
            _ => None,
        };
        if let Some(flag) = flag {
            if attached.is_some() {
                return Err(usage(topic, format!("{name} takes no value")));
            }
            if *flag {
                return Err(usage(topic, format!("{name} given more than once")));
            }
            *flag = true;
            continue;
        }
        if name == "--write-env" && topic == Topic::Check {
            if opts.write_env.is_some() {
                return Err(usage(topic, format!("{name} given more than once")));
            }
            // An OsString: a non-UTF-8 path survives.
            let value = option_value(topic, parser, &name, attached, "FILE")?;
            if value.is_empty() {
                return Err(usage(topic, format!("{name} needs a file name")));
            }
            opts.write_env = Some(value);
            continue;
        }
        // `status` and `metrics` take `--pool` several times (several pools in one
        // exposition); `parse_status` refuses a second one for the table and JSON.
        if name == "--pool" && matches!(topic, Topic::Status | Topic::Metrics) {
            let value = option_value(topic, parser, &name, attached, "NAME|PATH")?;
            let value = value
                .into_string()
                .map_err(|_| usage(topic, format!("the value of {name} is not valid UTF-8")))?;
            opts.pools.push(value);
            continue;
        }
        if name == "--listen" && topic == Topic::Metrics {
            if opts.listen.is_some() {
                return Err(usage(topic, format!("{name} given more than once")));
            }
            let value = option_value(topic, parser, &name, attached, "ADDR:PORT")?;
            opts.listen =
                Some(parse_listen(&value.to_string_lossy()).map_err(|m| usage(topic, m))?);
            continue;
        }
        if topic == Topic::Top && (name == "--interval" || name == "--iterations") {
            let given = if name == "--interval" {
                opts.interval_ms.is_some()
            } else {
                opts.iterations.is_some()
            };
            if given {
                return Err(usage(topic, format!("{name} given more than once")));
            }
            let what = if name == "--interval" { "SECS" } else { "N" };
            let value = option_value(topic, parser, &name, attached, what)?;
            let value = value.to_string_lossy();
            if name == "--interval" {
                opts.interval_ms = Some(parse_interval(&value).map_err(|m| usage(topic, m))?);
            } else {
                opts.iterations = Some(parse_iterations(&value).map_err(|m| usage(topic, m))?);
            }
            continue;
        }
        let (slot, what) = match name.as_str() {
            "--limit" if config_flags => (&mut opts.overrides.limit, "SPEC (e.g. 8Gi)"),
            "--log" if config_flags => (&mut opts.overrides.log, "LEVEL"),
            "--report" if config_flags => (&mut opts.overrides.report, "PATH"),
            "--wait" if config_flags => (&mut opts.overrides.wait, "DURATION (e.g. 30s)"),
            "--guarantee" if config_flags => (&mut opts.overrides.guarantee, "SPEC (e.g. 4Gi)"),
            "--ceiling" if config_flags => (&mut opts.overrides.ceiling, "SPEC (e.g. 6Gi)"),
            "--pool" => (&mut opts.overrides.pool, "NAME|PATH"),
            _ => return Err(usage(topic, format!("unknown option '{name}'"))),
        };
        if slot.is_some() {
            return Err(usage(topic, format!("{name} given more than once")));
        }
        let value = option_value(topic, parser, &name, attached, what)?;
        let value = value
            .into_string()
            .map_err(|_| usage(topic, format!("the value of {name} is not valid UTF-8")))?;
        *slot = Some(value);
    }
}

fn parse_run(mut parser: Parser) -> Result<Command, UsageError> {
    let mut opts = Options::default();
    let program = match parse_options(Topic::Run, &mut parser, &mut opts)? {
        End::Help => return Ok(Command::Help(Topic::Run)),
        End::Word(program) => program,
        End::Done => {
            return Err(usage(
                Topic::Run,
                "no command to run: gpucap run [OPTIONS] [--] CMD [ARGS...]",
            ));
        }
    };
    if program.is_empty() {
        return Err(usage(Topic::Run, "the command to run is empty"));
    }
    // Everything after CMD is CMD's, exactly as given: never read as gpucap's options.
    let args = parser
        .raw_args()
        .map_err(|e| lexopt_error(Topic::Run, e))?
        .collect();
    Ok(Command::Run {
        overrides: opts.overrides,
        measure: opts.measure,
        program,
        args,
    })
}

/// The command's name, for messages.
fn topic_name(topic: Topic) -> &'static str {
    match topic {
        Topic::General => "gpucap",
        Topic::Run => "run",
        Topic::Check => "check",
        Topic::Status => "status",
        Topic::Top => "top",
        Topic::Metrics => "metrics",
    }
}

/// The options of a command that takes nothing else (`status`, `top`).
fn only_options(topic: Topic, parser: &mut Parser) -> Result<Option<Options>, UsageError> {
    let mut opts = Options::default();
    match parse_options(topic, parser, &mut opts)? {
        End::Help => Ok(None),
        End::Word(word) => Err(usage(
            topic,
            format!(
                "unexpected argument '{}' ({} takes only options)",
                word.to_string_lossy(),
                topic_name(topic)
            ),
        )),
        End::Done => Ok(Some(opts)),
    }
}

/// The pools `--pool` (several times) and `--all` name; they exclude each other.
fn pool_set(topic: Topic, pools: Vec<String>, all: bool) -> Result<PoolSet, UsageError> {
    if all && !pools.is_empty() {
        return Err(usage(
            topic,
            "--all and --pool exclude each other (--all: every pool of this user)",
        ));
    }
    if all {
        return Ok(PoolSet::All);
    }
    if pools.is_empty() {
        return Ok(PoolSet::Configured);
    }
    let mut unique: Vec<String> = Vec::new();
    for p in pools {
        if !unique.contains(&p) {
            unique.push(p);
        }
    }
    Ok(PoolSet::Named(unique))
}

fn parse_status(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Status;
    let Some(mut opts) = only_options(topic, &mut parser)? else {
        return Ok(Command::Help(topic));
    };
    if opts.prometheus {
        if opts.json {
            return Err(usage(topic, "--json and --prometheus exclude each other"));
        }
        return Ok(Command::StatusPrometheus {
            pools: pool_set(topic, opts.pools, opts.all)?,
        });
    }
    if opts.all {
        return Err(usage(
            topic,
            "--all goes with --prometheus (the table and the JSON show one pool)",
        ));
    }
    if opts.pools.len() > 1 {
        return Err(usage(
            topic,
            "--pool given more than once (the table and the JSON show one pool; several \
             with --prometheus)",
        ));
    }
    Ok(Command::Status {
        pool: opts.pools.pop(),
        json: opts.json,
    })
}

fn parse_metrics(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Metrics;
    let Some(opts) = only_options(topic, &mut parser)? else {
        return Ok(Command::Help(topic));
    };
    let Some(listen) = opts.listen else {
        return Err(usage(
            topic,
            format!("no --listen: where to serve, {LISTEN_ACCEPTED}"),
        ));
    };
    Ok(Command::Metrics {
        listen,
        pools: pool_set(topic, opts.pools, opts.all)?,
    })
}

fn parse_top(mut parser: Parser) -> Result<Command, UsageError> {
    Ok(match only_options(Topic::Top, &mut parser)? {
        None => Command::Help(Topic::Top),
        Some(opts) => Command::Top {
            pool: opts.overrides.pool,
            interval_ms: opts.interval_ms.unwrap_or(1000),
            iterations: opts.iterations,
        },
    })
}

fn parse_check(mut parser: Parser) -> Result<Command, UsageError> {
    let mut opts = Options::default();
    match parse_options(Topic::Check, &mut parser, &mut opts)? {
        End::Help => Ok(Command::Help(Topic::Check)),
        End::Word(word) => Err(usage(
            Topic::Check,
            format!(
                "unexpected argument '{}' (check takes only options)",
                word.to_string_lossy()
            ),
        )),
        End::Done => Ok(Command::Check {
            overrides: opts.overrides,
            write_env: opts.write_env,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::help::help;
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
                ..Overrides::default()
            },
            measure: false,
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
    fn run_takes_a_guarantee_and_a_ceiling() {
        let Ok(Command::Run { overrides, .. }) = p(&[
            "run",
            "--pool",
            "p",
            "--guarantee",
            "4Gi",
            "--ceiling=0=6Gi,1=50%",
            "nb",
        ]) else {
            panic!("not a run");
        };
        assert_eq!(overrides.guarantee.as_deref(), Some("4Gi"));
        assert_eq!(overrides.ceiling.as_deref(), Some("0=6Gi,1=50%"));
        assert!(overrides.vars().contains(&("GPUCAP_GUARANTEE", "4Gi")));
        assert!(
            overrides
                .vars()
                .contains(&("GPUCAP_CEILING", "0=6Gi,1=50%"))
        );
        assert!(
            err(&["run", "--guarantee", "1Gi", "--guarantee", "2Gi", "x"])
                .message
                .contains("more than once")
        );
        assert!(
            err(&["status", "--guarantee", "1Gi"])
                .message
                .contains("unknown option")
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
                measure: false,
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
                overrides: Overrides::default(),
                write_env: None,
            })
        );
        assert_eq!(
            p(&["check", "--limit", "50%", "--log=off"]),
            Ok(Command::Check {
                overrides: Overrides {
                    limit: Some("50%".into()),
                    log: Some("off".into()),
                    ..Overrides::default()
                },
                write_env: None,
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
        // Nothing may follow them: a typo is an error, not ignored.
        for args in [
            &["--version", "--bogus"][..],
            &["-V", "x"],
            &["version", "--bogus"],
            &["--help", "--bogus"],
            &["-h", "run"],
        ] {
            let e = err(args);
            assert_eq!(e.topic, Topic::General);
            assert!(
                e.message.starts_with(&format!(
                    "unexpected argument '{}' after {}",
                    args[1], args[0]
                )),
                "{args:?}: {}",
                e.message
            );
        }
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
            ..Overrides::default()
        };
        assert_eq!(o.vars(), vec![("GPUCAP_LIMIT", "8Gi")]);
        let o = Overrides {
            growth: true,
            report: Some("/r.json".into()),
            ..Overrides::default()
        };
        assert_eq!(
            o.vars(),
            vec![("GPUCAP_GROWTH", "1"), ("GPUCAP_REPORT", "/r.json")]
        );
        assert!(Overrides::default().vars().is_empty());
    }

    #[test]
    fn growth_report_measure_flags() {
        assert_eq!(
            p(&[
                "run",
                "--growth",
                "--report",
                "/r-%p.json",
                "--measure",
                "--",
                "x",
                "--growth"
            ]),
            Ok(Command::Run {
                overrides: Overrides {
                    growth: true,
                    report: Some("/r-%p.json".into()),
                    ..Overrides::default()
                },
                measure: true,
                program: "x".into(),
                args: os(&["--growth"]),
            })
        );
        assert!(matches!(
            p(&["run", "--report=r.json", "x"]),
            Ok(Command::Run { overrides: Overrides { report: Some(r), .. }, .. }) if r == "r.json"
        ));
        assert_eq!(
            err(&["run", "--growth=1", "x"]).message,
            "--growth takes no value"
        );
        assert!(
            err(&["run", "--measure", "--measure", "x"])
                .message
                .contains("more than once")
        );
        assert!(
            err(&["run", "--report"])
                .message
                .contains("--report needs a value: --report PATH")
        );
        // --measure is run's; --write-env is check's.
        assert_eq!(
            err(&["check", "--measure"]).message,
            "unknown option '--measure'"
        );
        assert_eq!(
            err(&["run", "--write-env", "f", "x"]).message,
            "unknown option '--write-env'"
        );
        assert_eq!(
            p(&["check", "--growth", "--write-env", "/g/gpucap.env"]),
            Ok(Command::Check {
                overrides: Overrides {
                    growth: true,
                    ..Overrides::default()
                },
                write_env: Some("/g/gpucap.env".into()),
            })
        );
        assert!(matches!(
            p(&["check", "--write-env=/a=b"]),
            Ok(Command::Check { write_env: Some(f), .. }) if f == "/a=b"
        ));
        assert!(
            err(&["check", "--write-env"])
                .message
                .contains("needs a value")
        );
        assert!(
            err(&["check", "--write-env="])
                .message
                .contains("needs a file name")
        );
    }

    #[test]
    fn status_and_top_forms() {
        assert_eq!(
            p(&["status"]),
            Ok(Command::Status {
                pool: None,
                json: false
            })
        );
        assert_eq!(
            p(&["status", "--pool", "train", "--json"]),
            Ok(Command::Status {
                pool: Some("train".into()),
                json: true
            })
        );
        assert_eq!(
            p(&["status", "--pool=/dev/shm/x.pool"]),
            Ok(Command::Status {
                pool: Some("/dev/shm/x.pool".into()),
                json: false
            })
        );
        assert_eq!(p(&["status", "-h"]), Ok(Command::Help(Topic::Status)));
        assert_eq!(p(&["help", "status"]), Ok(Command::Help(Topic::Status)));
        assert_eq!(p(&["help", "top"]), Ok(Command::Help(Topic::Top)));
        assert_eq!(
            p(&["top"]),
            Ok(Command::Top {
                pool: None,
                interval_ms: 1000,
                iterations: None
            })
        );
        assert_eq!(
            p(&["top", "--interval", "0.2", "--iterations=3", "--pool", "p"]),
            Ok(Command::Top {
                pool: Some("p".into()),
                interval_ms: 200,
                iterations: Some(3)
            })
        );
        assert_eq!(
            p(&["top", "--interval=60"]),
            Ok(Command::Top {
                pool: None,
                interval_ms: 60_000,
                iterations: None
            })
        );
        assert_eq!(p(&["top", "--help"]), Ok(Command::Help(Topic::Top)));
    }

    #[test]
    fn status_and_top_errors() {
        for bad in ["0", "0.1", "61", "abc", "", "-1", "nan", "inf", "1s"] {
            let e = err(&["top", "--interval", bad]);
            assert_eq!(e.topic, Topic::Top);
            assert!(
                e.message
                    .starts_with(&format!("invalid --interval {bad:?}"))
                    && e.message.contains("from 0.2 to 60"),
                "{bad}: {}",
                e.message
            );
        }
        assert!(
            err(&["top", "--interval"])
                .message
                .contains("needs a value")
        );
        for bad in ["0", "-2", "x", "1.5"] {
            assert!(
                err(&["top", "--iterations", bad])
                    .message
                    .starts_with(&format!("invalid --iterations {bad:?}")),
                "{bad}"
            );
        }
        assert!(
            err(&["top", "--iterations", "1", "--iterations", "2"])
                .message
                .contains("more than once")
        );
        let e = err(&["status", "--bogus"]);
        assert_eq!(
            (e.topic, e.message.as_str()),
            (Topic::Status, "unknown option '--bogus'")
        );
        // Each command has its own options.
        assert_eq!(
            err(&["status", "--interval", "1"]).message,
            "unknown option '--interval'"
        );
        assert_eq!(err(&["top", "--json"]).message, "unknown option '--json'");
        assert_eq!(
            err(&["status", "--limit", "1Gi"]).message,
            "unknown option '--limit'"
        );
        assert_eq!(
            err(&["top", "--growth"]).message,
            "unknown option '--growth'"
        );
        assert_eq!(
            err(&["run", "--json", "x"]).message,
            "unknown option '--json'"
        );
        assert_eq!(
            err(&["status", "extra"]).message,
            "unexpected argument 'extra' (status takes only options)"
        );
        assert_eq!(
            err(&["top", "--"]).message,
            "unexpected argument '--' (top takes only options)"
        );
        assert_eq!(
            err(&["status", "--json=1"]).message,
            "--json takes no value"
        );
        assert!(
            err(&["status", "--pool"])
                .message
                .contains("--pool needs a value")
        );
        assert!(
            err(&["status", "--pool", "a", "--pool", "b"])
                .message
                .contains("more than once")
        );
    }

    #[test]
    fn prometheus_and_metrics_forms() {
        let named = |v: &[&str]| PoolSet::Named(v.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            p(&["status", "--prometheus"]),
            Ok(Command::StatusPrometheus {
                pools: PoolSet::Configured
            })
        );
        assert_eq!(
            p(&[
                "status",
                "--pool",
                "a",
                "--prometheus",
                "--pool=/x/b.pool",
                "--pool",
                "a"
            ]),
            Ok(Command::StatusPrometheus {
                pools: named(&["a", "/x/b.pool"])
            })
        );
        assert_eq!(
            p(&["status", "--all", "--prometheus"]),
            Ok(Command::StatusPrometheus {
                pools: PoolSet::All
            })
        );
        let listen = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            p(&["metrics", "--listen", "127.0.0.1:9400"]),
            Ok(Command::Metrics {
                listen: listen("127.0.0.1:9400"),
                pools: PoolSet::Configured
            })
        );
        assert_eq!(
            p(&["metrics", "--pool", "a", "--listen=[::]:0", "--pool", "b"]),
            Ok(Command::Metrics {
                listen: listen("[::]:0"),
                pools: named(&["a", "b"])
            })
        );
        assert_eq!(
            p(&["metrics", "--all", "--listen", "0.0.0.0:9400"]),
            Ok(Command::Metrics {
                listen: listen("0.0.0.0:9400"),
                pools: PoolSet::All
            })
        );
        assert_eq!(p(&["metrics", "-h"]), Ok(Command::Help(Topic::Metrics)));
        assert_eq!(p(&["help", "metrics"]), Ok(Command::Help(Topic::Metrics)));
        assert!(help(Topic::General).contains("gpucap metrics --listen ADDR:PORT"));
        assert!(help(Topic::Status).contains("--prometheus"));
        assert!(help(Topic::General).contains("  metrics "));
    }

    #[test]
    fn prometheus_and_metrics_errors() {
        let e = err(&["metrics"]);
        assert_eq!(e.topic, Topic::Metrics);
        assert!(e.message.starts_with("no --listen: "), "{}", e.message);
        for bad in [
            "9400",
            "localhost:9400",
            "127.0.0.1",
            "1.2.3.4:99999",
            "",
            ":9400",
        ] {
            let e = err(&["metrics", "--listen", bad]);
            assert_eq!(
                e.message,
                format!("invalid --listen {bad:?}: {LISTEN_ACCEPTED}"),
                "{bad}"
            );
        }
        assert!(
            err(&["metrics", "--listen"])
                .message
                .contains("--listen needs a value")
        );
        assert!(
            err(&["metrics", "--listen", ":1", "--listen", ":2"])
                .message
                .starts_with("invalid --listen")
        );
        assert!(
            err(&["metrics", "--listen", "[::]:1", "--listen", "[::]:2"])
                .message
                .contains("more than once")
        );
        assert_eq!(
            err(&["metrics", "--listen", "[::]:1", "--all", "--pool", "a"]).message,
            "--all and --pool exclude each other (--all: every pool of this user)"
        );
        assert_eq!(
            err(&["status", "--prometheus", "--json"]).message,
            "--json and --prometheus exclude each other"
        );
        assert!(
            err(&["status", "--all"])
                .message
                .starts_with("--all goes with --prometheus")
        );
        assert!(
            err(&["status", "--pool", "a", "--pool", "b", "--json"])
                .message
                .starts_with("--pool given more than once")
        );
        // Each command has its own options.
        for (args, opt) in [
            (&["metrics", "--listen", "[::]:1", "--json"][..], "--json"),
            (
                &["metrics", "--listen", "[::]:1", "--prometheus"],
                "--prometheus",
            ),
            (&["status", "--listen", "[::]:1"], "--listen"),
            (&["top", "--all"], "--all"),
            (&["top", "--prometheus"], "--prometheus"),
            (&["check", "--all"], "--all"),
        ] {
            assert_eq!(
                err(args).message,
                format!("unknown option '{opt}'"),
                "{args:?}"
            );
        }
        assert_eq!(
            err(&["metrics", "--listen", "[::]:1", "x"]).message,
            "unexpected argument 'x' (metrics takes only options)"
        );
        assert!(
            err(&["top", "--pool", "a", "--pool", "b"])
                .message
                .contains("more than once")
        );
    }

    #[test]
    fn the_pool_flag_of_run_and_check() {
        assert!(matches!(
            p(&["run", "--pool", "train", "x"]),
            Ok(Command::Run { overrides: Overrides { pool: Some(n), .. }, .. }) if n == "train"
        ));
        assert!(matches!(
            p(&["check", "--pool=off"]),
            Ok(Command::Check { overrides: Overrides { pool: Some(n), .. }, .. }) if n == "off"
        ));
        let o = Overrides {
            pool: Some("t".into()),
            ..Overrides::default()
        };
        assert_eq!(o.vars(), vec![("GPUCAP_POOL", "t")]);
        assert!(
            help(Topic::General).contains("gpucap status")
                && help(Topic::General).contains("gpucap top")
        );
        for topic in [Topic::General, Topic::Status, Topic::Top] {
            assert!(help(topic).contains("--pool NAME|PATH"), "{topic:?}");
        }
        assert!(help(Topic::General).contains("GPUCAP_POOL_DIR"));
    }

    /// Corners where lexopt alone would read the words differently; they keep the
    /// meaning and messages that the hand parser gave them.
    #[test]
    fn words_lexopt_would_read_otherwise() {
        // lexopt skips `--`: it is neither a command nor an argument of check.
        assert_eq!(err(&["--", "run", "x"]).message, "unknown option '--'");
        assert_eq!(
            err(&["check", "--"]).message,
            "unexpected argument '--' (check takes only options)"
        );
        assert!(
            err(&["check", "--limit", "1Gi", "--"])
                .message
                .contains("unexpected argument '--'")
        );
        // `help` takes words, not options.
        assert!(
            err(&["help", "--", "run"])
                .message
                .contains("no help for '--'")
        );
        assert!(
            err(&["help", "--help"])
                .message
                .contains("no help for '--help'")
        );
        // A short option stands alone: no clusters, no attached values.
        assert_eq!(err(&["run", "-hx", "y"]).message, "unknown option '-hx'");
        assert_eq!(err(&["run", "-h=x", "y"]).message, "unknown option '-h=x'");
        assert_eq!(err(&["check", "-hV"]).message, "unknown option '-hV'");
        assert_eq!(err(&["-Vh"]).message, "unknown option '-Vh'");
        assert_eq!(err(&["-"]).message, "unknown option '-'");
        assert_eq!(err(&["--help=x"]).message, "unknown option '--help=x'");
        assert_eq!(
            err(&["run", "--help=x", "y"]).message,
            "unknown option '--help'"
        );
        assert!(err(&["--limit=8Gi", "run"]).message.starts_with(
            "unknown option '--limit=8Gi' (options go after the command: gpucap run --limit=8Gi"
        ));
        // After `--` the next word is CMD whatever it looks like; after CMD all is CMD's.
        assert_eq!(
            p(&["run", "--", "--", "a"]),
            Ok(run(None, None, "--", &["a"]))
        );
        assert_eq!(
            p(&["run", "-", "-h", "--limit=1Gi", "--", "-Vx"]),
            Ok(run(None, None, "-", &["-h", "--limit=1Gi", "--", "-Vx"]))
        );
        assert_eq!(
            p(&["run", "--limit", "--", "x"]),
            Ok(run(Some("--"), None, "x", &[]))
        );
        assert_eq!(
            p(&["run", "--", ""]).unwrap_err().message,
            "the command to run is empty"
        );
    }

    #[test]
    fn non_utf8_values_and_option_names() {
        let bad = || OsString::from_vec(b"/tmp/caf\xe9.env".to_vec());
        let mut inline = b"--write-env=".to_vec();
        inline.extend_from_slice(bad().as_encoded_bytes());
        assert_eq!(
            parse([OsString::from("check"), OsString::from_vec(inline)]),
            Ok(Command::Check {
                overrides: Overrides::default(),
                write_env: Some(bad()),
            })
        );
        assert_eq!(
            parse([OsString::from("check"), "--write-env".into(), bad()]),
            Ok(Command::Check {
                overrides: Overrides::default(),
                write_env: Some(bad()),
            })
        );
        let e = parse([
            OsString::from("run"),
            OsString::from_vec(b"--limit=8G\xe9".to_vec()),
            "x".into(),
        ])
        .unwrap_err();
        assert_eq!(e.message, "the value of --limit is not valid UTF-8");
        let e = parse([
            OsString::from("run"),
            OsString::from_vec(b"--lim\xe9t".to_vec()),
            "x".into(),
        ])
        .unwrap_err();
        assert_eq!(e.message, "unknown option '--lim\u{fffd}t'");
        // CMD and its arguments are passed on byte for byte.
        assert_eq!(
            parse([OsString::from("run"), "--".into(), bad(), bad()]),
            Ok(Command::Run {
                overrides: Overrides::default(),
                measure: false,
                program: bad(),
                args: vec![bad()],
            })
        );
    }
}
