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
    /// `--quiet` (`run`): no line saying that the program runs with no cap. Sets no
    /// variable.
    pub quiet: bool,
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
        /// `--uuid`: the GPU's UUID column too.
        uuid: bool,
        /// `--all`: the pools no process uses (no live member, nothing held) too.
        all: bool,
    },
    /// `gpucap status --prometheus [--pool NAME|PATH]... [--all]`: pools once, in
    /// Prometheus's text exposition format.
    StatusPrometheus {
        pools: PoolSet,
        /// `--hami`: HAMi's monitor series too (`metrics::hami`).
        hami: bool,
    },
    /// `gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all]`: an HTTP server
    /// of that exposition.
    Metrics {
        listen: SocketAddr,
        pools: PoolSet,
        /// `--hami`: HAMi's monitor series too (`metrics::hami`).
        hami: bool,
    },
    /// `gpucap top [--pool NAME|PATH] [--interval SECS] [--iterations N]`: the
    /// snapshot, refreshed.
    Top {
        pool: Option<String>,
        /// `--interval`: between snapshots, in milliseconds (200 to 60000).
        interval_ms: u64,
        /// `--iterations`: how many snapshots (None: until interrupted).
        iterations: Option<u64>,
        /// `--user`: that user's processes only (a name or a uid).
        user: Option<String>,
        /// `--sort`: the order of the rows.
        sort: crate::top::select::SortKey,
        /// `--uuid`: the GPU's UUID column too.
        uuid: bool,
        /// `--once`: one frame, every row, no screen codes.
        once: bool,
    },
    /// `gpucap jupyter install|list|remove ...`: capped Jupyter kernels.
    Jupyter(JupyterCommand),
    /// `gpucap cdi generate --limit SPEC --output FILE [...]`
    Cdi(super::cdi::Request),
    /// `gpucap pool list` / `gpucap pool clean [NAME]`: this user's pool files.
    Pool(PoolAction),
    /// `gpucap help [COMMAND]`, `--help`, `-h`
    Help(Topic),
    /// `gpucap --version`, `-V`, `version`
    Version,
}

/// What `gpucap pool` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolAction {
    /// `list`: every pool file with its members, held bytes and last use.
    List,
    /// `clean [NAME]`: remove the pools no process uses (or the one named).
    Clean(Option<String>),
    /// `resize NAME SIZE [--gpu N|UUID] [--dir DIR]`: change a live pool's cap.
    Resize(crate::resize::Request),
    /// `set NAME PID [--guarantee SIZE] [--ceiling SIZE|none] ...`: change a live
    /// member's guarantee and ceiling.
    Set(pool_set::Request),
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
                s if s.starts_with("--help=") || s.starts_with("--version=") => Err(usage(
                    Topic::General,
                    format!("{} takes no value", &s[..s.find('=').unwrap_or(s.len())]),
                )),
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
        Some("jupyter") => parse_jupyter(parser),
        Some("cdi") => parse_cdi(parser),
        Some("pool") => pools::parse_pool(parser),
        Some("help") => parse_help(parser),
        Some("version") => nothing_after(parser, "version", Command::Version),
        _ => {
            let s = first.to_string_lossy();
            if s.starts_with('-') {
                // Only `-` itself: lexopt calls it a value.
                Err(usage(Topic::General, format!("unknown option '{s}'")))
            } else {
                const COMMANDS: [&str; 9] = [
                    "run", "check", "status", "top", "metrics", "jupyter", "cdi", "pool", "help",
                ];
                Err(usage(
                    Topic::General,
                    match gpucap_core::config::nearest_name(&s, &COMMANDS) {
                        Some(n) => format!("unknown command '{s}' (did you mean {n}?)"),
                        None => format!(
                            "unknown command '{s}' (the commands are run, check, status, top, \
                             metrics, jupyter, cdi, pool and help)"
                        ),
                    },
                ))
            }
        }
    }
}

/// `command` when nothing follows `word` (`--version`, `--help`, `version`), else a
/// usage error naming the first extra argument: `gpucap --version --bogus` is a mistake.
fn nothing_after(mut parser: Parser, word: &str, command: Command) -> Result<Command, UsageError> {
    nothing_more(&mut parser, Topic::General, word)?;
    Ok(command)
}

/// Ok when nothing follows `word` (a command's `-h`, `--help`), else the usage error
/// that names the first extra argument, as `gpucap --help extra` gives it: `gpucap check
/// --help extra` is the same mistake.
fn nothing_more(parser: &mut Parser, topic: Topic, word: &str) -> Result<(), UsageError> {
    let extra = parser
        .raw_args()
        .map_err(|e| lexopt_error(topic, e))?
        .next();
    extra_after(topic, word, extra.as_deref())
}

/// Ok where nothing (`extra`: None) follows `word`, else the usage error naming it.
fn extra_after(topic: Topic, word: &str, extra: Option<&OsStr>) -> Result<(), UsageError> {
    match extra {
        None => Ok(()),
        Some(extra) => Err(usage(
            topic,
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

/// The command's name, for messages.
fn topic_name(topic: Topic) -> &'static str {
    match topic {
        Topic::General => "gpucap",
        Topic::Run => "run",
        Topic::Check => "check",
        Topic::Status => "status",
        Topic::Top => "top",
        Topic::Metrics => "metrics",
        Topic::Jupyter => "jupyter",
        Topic::Cdi => "cdi",
        Topic::Pool => "pool",
    }
}

mod cdi;
mod commands;
mod jupyter;
mod options;
pub mod pool_set;
mod pools;
#[cfg(test)]
mod tests;

use cdi::parse_cdi;
use commands::{parse_check, parse_help, parse_metrics, parse_run, parse_status, parse_top};
use jupyter::parse_jupyter;
pub use jupyter::{
    JupyterCommand, JupyterInstall, KERNEL_NAME_ACCEPTED, KernelScope, valid_kernel_name,
};
pub use options::{
    INTERVAL_ACCEPTED, LISTEN_ACCEPTED, parse_interval, parse_iterations, parse_listen,
};
