//! The options of `run`, `check`, `status`, `top` and `metrics`, and their values.

use super::{
    Overrides, Topic, UsageError, lexopt_error, next_is_double_dash, nothing_more, option_name,
    topic_name, usage, with_attached,
};
use lexopt::{Arg, Parser};
use std::ffi::OsString;
use std::net::SocketAddr;

/// Where the options of `run` or `check` stopped.
pub(super) enum End {
    /// `-h` / `--help`.
    Help,
    /// The first word that is not an option (for `run`: CMD, also after `--`).
    Word(OsString),
    /// The end of the command line.
    Done,
}

/// Everything the options of `run`, `check`, `status` and `top` set.
#[derive(Default)]
pub(super) struct Options {
    pub(super) overrides: Overrides,
    pub(super) measure: bool,
    pub(super) write_env: Option<OsString>,
    pub(super) json: bool,
    pub(super) interval_ms: Option<u64>,
    pub(super) iterations: Option<u64>,
    /// `--pool` of `status` and `metrics`, which may be given several times.
    pub(super) pools: Vec<String>,
    pub(super) all: bool,
    pub(super) prometheus: bool,
    /// `--hami` (status --prometheus, metrics): HAMi's monitor series too.
    pub(super) hami: bool,
    pub(super) listen: Option<SocketAddr>,
    /// `--uuid` (status, top): the GPU's UUID column.
    pub(super) uuid: bool,
    /// `--once` (top): one frame for a log.
    pub(super) once: bool,
    /// `--sort KEY` (top).
    pub(super) sort: Option<crate::top::select::SortKey>,
    /// `--user NAME|UID` (top).
    pub(super) user: Option<String>,
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
pub(super) fn option_value(
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
pub(super) fn parse_options(
    topic: Topic,
    parser: &mut Parser,
    opts: &mut Options,
) -> Result<End, UsageError> {
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
                nothing_more(parser, topic, &typed)?;
                return Ok(End::Help);
            }
            return Err(usage(topic, format!("unknown option '{typed}'")));
        }
        let attached = parser.optional_value();
        // Flags without a value.
        let flag = match (name.as_str(), topic) {
            ("--help", _) if attached.is_none() => {
                nothing_more(parser, topic, &name)?;
                return Ok(End::Help);
            }
            ("--help", _) => return Err(usage(topic, "--help takes no value")),
            ("--growth", Topic::Run | Topic::Check) => Some(&mut opts.overrides.growth),
            ("--measure", Topic::Run) => Some(&mut opts.measure),
            ("--quiet", Topic::Run) => Some(&mut opts.overrides.quiet),
            ("--json", Topic::Status) => Some(&mut opts.json),
            ("--prometheus", Topic::Status) => Some(&mut opts.prometheus),
            ("--all", Topic::Status | Topic::Metrics) => Some(&mut opts.all),
            ("--hami", Topic::Status | Topic::Metrics) => Some(&mut opts.hami),
            ("--uuid", Topic::Status | Topic::Top) => Some(&mut opts.uuid),
            ("--once", Topic::Top) => Some(&mut opts.once),
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
        if topic == Topic::Top && name == "--sort" {
            if opts.sort.is_some() {
                return Err(usage(topic, format!("{name} given more than once")));
            }
            let value = option_value(topic, parser, &name, attached, "KEY")?;
            let key = crate::top::select::SortKey::parse(&value.to_string_lossy())
                .map_err(|m| usage(topic, m))?;
            opts.sort = Some(key);
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
            "--user" if topic == Topic::Top => (&mut opts.user, "NAME|UID"),
            _ => return Err(usage(topic, unknown_option(topic, &name))),
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

/// The long options each command reads (`parse_options`), for "did you mean".
fn options_of(topic: Topic) -> &'static [&'static str] {
    const CONFIG: [&str; 8] = [
        "--limit",
        "--log",
        "--report",
        "--wait",
        "--guarantee",
        "--ceiling",
        "--pool",
        "--growth",
    ];
    match topic {
        Topic::Run => &[
            CONFIG[0],
            CONFIG[1],
            CONFIG[2],
            CONFIG[3],
            CONFIG[4],
            CONFIG[5],
            CONFIG[6],
            CONFIG[7],
            "--measure",
            "--quiet",
            "--help",
        ],
        Topic::Check => &[
            CONFIG[0],
            CONFIG[1],
            CONFIG[2],
            CONFIG[3],
            CONFIG[4],
            CONFIG[5],
            CONFIG[6],
            CONFIG[7],
            "--write-env",
            "--help",
        ],
        Topic::Status => &[
            "--pool",
            "--json",
            "--prometheus",
            "--hami",
            "--all",
            "--uuid",
            "--help",
        ],
        Topic::Metrics => &["--listen", "--pool", "--all", "--hami", "--help"],
        Topic::Top => &[
            "--pool",
            "--user",
            "--sort",
            "--interval",
            "--iterations",
            "--uuid",
            "--once",
            "--help",
        ],
        Topic::Jupyter => &[
            CONFIG[0],
            CONFIG[1],
            CONFIG[3],
            CONFIG[4],
            CONFIG[5],
            CONFIG[6],
            CONFIG[7],
            "--kernel",
            "--name",
            "--display-name",
            "--user",
            "--sys-prefix",
            "--prefix",
            "--help",
        ],
        _ => &["--help"],
    }
}

/// "unknown option '--limt' (did you mean --limit?)": the nearest option of this
/// command within 2 edits, if any.
pub(super) fn unknown_option(topic: Topic, name: &str) -> String {
    unknown_among(name, options_of(topic))
}

/// "unknown option '--limt' (did you mean --limit?)": the nearest of `options` within 2
/// edits, if any (a command that lists its options itself: `cdi generate`).
pub(super) fn unknown_among(name: &str, options: &[&str]) -> String {
    match gpucap_core::config::nearest_name(name, options) {
        // `--help=x` is itself a known name, refused for its value: no guess.
        Some(near) if near != name => format!("unknown option '{name}' (did you mean {near}?)"),
        _ => format!("unknown option '{name}'"),
    }
}
