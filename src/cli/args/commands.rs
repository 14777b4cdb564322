//! Each command's words after its name: `help`, `run`, `status`, `metrics`, `top`, `check`.

use super::options::{End, LISTEN_ACCEPTED, Options, parse_options};
use super::{Command, PoolSet, Topic, UsageError, lexopt_error, topic_name, usage};
use lexopt::Parser;
/// `help [run|check|status|top|metrics]`: the words after `help`, taken raw (`help --help` names no topic).
pub(super) fn parse_help(mut parser: Parser) -> Result<Command, UsageError> {
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
            Some("jupyter") => Topic::Jupyter,
            Some("cdi") => Topic::Cdi,
            Some("pool") => Topic::Pool,
            Some("help") => Topic::General,
            _ => {
                return Err(usage(
                    Topic::General,
                    format!(
                        "no help for '{}' (try: help run, help check, help status, help top, \
                         help metrics, help jupyter, help cdi, help pool)",
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
pub(super) fn parse_run(mut parser: Parser) -> Result<Command, UsageError> {
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

pub(super) fn parse_status(mut parser: Parser) -> Result<Command, UsageError> {
    let topic = Topic::Status;
    let Some(mut opts) = only_options(topic, &mut parser)? else {
        return Ok(Command::Help(topic));
    };
    if opts.prometheus {
        if opts.json {
            return Err(usage(topic, "--json and --prometheus exclude each other"));
        }
        if opts.uuid {
            return Err(usage(
                topic,
                "--uuid and --prometheus exclude each other (a GPU's series carry its UUID, \
                 label gpu_uuid)",
            ));
        }
        return Ok(Command::StatusPrometheus {
            pools: pool_set(topic, opts.pools, opts.all)?,
            hami: opts.hami,
        });
    }
    if opts.hami {
        return Err(usage(
            topic,
            "--hami adds HAMi's series to --prometheus's exposition: give --prometheus too",
        ));
    }
    if opts.all && !opts.pools.is_empty() {
        return Err(usage(
            topic,
            "--all and --pool exclude each other (--all shows every pool; several --pool \
             with --prometheus)",
        ));
    }
    if opts.pools.len() > 1 {
        return Err(usage(
            topic,
            "--pool given more than once (the table and the JSON show one pool; several \
             with --prometheus)",
        ));
    }
    if opts.uuid && !opts.pools.is_empty() {
        return Err(usage(
            topic,
            "--uuid goes with no pool named (a pool's table names its GPUs' UUIDs in its \
             header): drop --uuid or --pool",
        ));
    }
    Ok(Command::Status {
        pool: opts.pools.pop(),
        json: opts.json,
        uuid: opts.uuid,
        all: opts.all,
    })
}

pub(super) fn parse_metrics(mut parser: Parser) -> Result<Command, UsageError> {
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
        hami: opts.hami,
    })
}

pub(super) fn parse_top(mut parser: Parser) -> Result<Command, UsageError> {
    Ok(match only_options(Topic::Top, &mut parser)? {
        None => Command::Help(Topic::Top),
        Some(opts) => {
            if opts.once && opts.interval_ms.is_some() {
                return Err(usage(
                    Topic::Top,
                    "--once and --interval exclude each other (--once: one frame, no refresh)",
                ));
            }
            if opts.once && opts.iterations.is_some() {
                return Err(usage(
                    Topic::Top,
                    "--once and --iterations exclude each other (--once: one frame)",
                ));
            }
            if let Some(why) = opts.user.as_deref().and_then(crate::procs::unknown_user) {
                return Err(usage(Topic::Top, why));
            }
            Command::Top {
                pool: opts.overrides.pool,
                interval_ms: opts.interval_ms.unwrap_or(1000),
                iterations: opts.iterations,
                user: opts.user,
                sort: opts.sort.unwrap_or_default(),
                uuid: opts.uuid,
                once: opts.once,
            }
        }
    })
}

pub(super) fn parse_check(mut parser: Parser) -> Result<Command, UsageError> {
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
