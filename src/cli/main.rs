//! The `gpucap` command: `run`, `check`, `status`, `top`, `metrics`, `pool`, `jupyter`,
//! `cdi`, `help`, `--version`. It uses the safe core (`gpucap-core`: configuration,
//! sizes, reports) and never links the shim's hooks, so this binary does not itself
//! export dlsym or cu* symbols.
//!
//! This module only parses the command line (`args`) and hands it to the command's file
//! in `commands/`; nothing imports from it.

pub mod args;
pub mod cdi;
pub mod commands;
pub mod driver;
pub mod environment;
pub mod exit;
pub mod handed_down;
pub mod help;
pub mod jupyter;
pub mod launch;
pub mod layout;
pub mod library_file;
pub mod measure;
pub mod metrics;
pub mod pool;
pub mod pool_files;
pub mod pool_names;
pub mod pool_operands;
pub mod preload;
pub mod procs;
pub mod report;
pub mod resize;
pub mod shown_pool;
pub mod status;
pub mod term;
pub mod text_width;
pub mod top;
pub mod users;

use std::ffi::OsString;

use args::{Command, Topic};
use environment::absolute_report;
use exit::EXIT_USAGE;
use term::print_out;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn main() {
    // A locale whose character set is not UTF-8 is written ASCII (`...` for `…`).
    text_width::set_ascii(!text_width::utf8_locale(|k| std::env::var(k).ok()));
    std::process::exit(run_command_line(std::env::args_os()));
}

/// Runs the command line `argv` (including the program name) and returns the exit
/// status; a successful `run` never returns (the process becomes CMD).
pub fn run_command_line(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let command = match args::parse(argv.into_iter().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            // One line, and where to read the command's usage: the usage itself would
            // bury the line that says what was wrong.
            eprintln!("gpucap: {}", e.message);
            let hint = match e.topic {
                Topic::General => "gpucap --help",
                Topic::Run => "gpucap help run",
                Topic::Check => "gpucap help check",
                Topic::Status => "gpucap help status",
                Topic::Top => "gpucap help top",
                Topic::Metrics => "gpucap help metrics",
                Topic::Jupyter => "gpucap help jupyter",
                Topic::Cdi => "gpucap help cdi",
                Topic::Pool => "gpucap help pool",
            };
            if let Some(usage) = help::usage_of(e.topic) {
                eprintln!("{usage}");
            }
            eprintln!("(see '{hint}')");
            return EXIT_USAGE;
        }
    };
    match command {
        Command::Help(topic) => {
            print_out(&format!("{}\n", help::help(topic)));
            0
        }
        Command::Version => {
            print_out(&format!("gpucap {VERSION}\n"));
            0
        }
        Command::Check {
            overrides,
            write_env,
        } => commands::check::command(&absolute_report(overrides), write_env.as_deref()),
        Command::Run {
            overrides,
            measure: false,
            program,
            args,
        } => commands::run::command(&absolute_report(overrides), &program, &args),
        Command::Run {
            overrides,
            measure: true,
            program,
            args,
        } => measure::measure(&overrides, &program, &args),
        Command::Status {
            pool,
            json,
            uuid,
            all,
        } => commands::status::command(pool, json, uuid, all),
        Command::StatusPrometheus { pools, hami } => commands::status::prometheus(pools, hami),
        Command::Metrics {
            listen,
            pools,
            hami,
        } => commands::metrics::command(listen, pools, hami),
        Command::Top {
            pool,
            interval_ms,
            iterations,
            user,
            sort,
            uuid,
            once,
        } => commands::top::command(
            pool,
            top::Options {
                filter: top::select::Filter { pool: None, user },
                sort,
                uuid,
                interval_ms,
                iterations,
                once,
            },
        ),
        Command::Jupyter(command) => commands::jupyter::command(command),
        Command::Cdi(request) => commands::cdi::command(&request),
        Command::Pool(action) => commands::pool::command(action),
    }
}
