//! The `gpucap` command: `run`, `check`, `status`, `top`, `metrics`, `jupyter`, `help`, `--version`. It uses the safe core
//! (`gpucap-core`: configuration, sizes, reports) and never links the shim's hooks, so
//! this binary does not itself export dlsym or cu* symbols.
//!
//! The pure parts (argument parsing, LD_PRELOAD merging, the check report, the exit
//! status of a failed exec) live in submodules and are unit-tested; this module only
//! wires them to the process environment.

pub mod args;
pub mod cdi;
pub mod check;
pub mod driver;
pub mod help;
pub mod jupyter;
pub mod layout;
pub mod measure;
pub mod metrics;
pub mod pool;
pub mod pool_files;
pub mod preload;
pub mod procs;
pub mod report;
pub mod resize;
pub mod status;
pub mod term;
pub mod top;

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use args::{Command, JupyterCommand, Overrides, PoolSet, Topic};

use gpucap_core::config::{self, Config, LogLevel};

/// Exit status for a usage or configuration error (nothing was run).
pub const EXIT_USAGE: i32 = 2;
/// Exit status when CMD exists but cannot be executed (as in a shell).
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit status when CMD is not found (as in a shell).
pub const EXIT_NOT_FOUND: i32 = 127;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

fn main() {
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
        } => check(&absolute_report(overrides), write_env.as_deref()),
        Command::Run {
            overrides,
            measure: false,
            program,
            args,
        } => run(&absolute_report(overrides), &program, &args),
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
        } => status(pool, json, uuid, all),
        Command::StatusPrometheus { pools } => status_prometheus(pools),
        Command::Metrics { listen, pools } => serve_metrics(listen, pools),
        Command::Top {
            pool,
            interval_ms,
            iterations,
            user,
            sort,
            uuid,
            once,
        } => top(
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
        Command::Jupyter(command) => jupyter_command(command),
        Command::Cdi(request) => cdi_generate(&request),
        Command::Pool(action) => pools(action),
    }
}

/// `gpucap jupyter install|list|remove`. install validates its options as `check` does
/// (printing the same report) before anything is written.
fn jupyter_command(command: JupyterCommand) -> i32 {
    let done = match command {
        JupyterCommand::Install(install) => {
            let code = check(&install.overrides, None);
            if code != 0 {
                eprintln!("gpucap: no kernel installed: the options above are not valid");
                return code;
            }
            let Ok(exe) = std::env::current_exe() else {
                eprintln!("gpucap: cannot find the gpucap executable's path for the kernel");
                return EXIT_USAGE;
            };
            jupyter::install(&install, &exe).map(|dir| {
                format!(
                    "installed kernel {} in {}\n",
                    dir.file_name().unwrap_or_default().to_string_lossy(),
                    dir.display()
                )
            })
        }
        JupyterCommand::List => jupyter::list(),
        JupyterCommand::Remove { name } => {
            jupyter::remove(&name).map(|dir| format!("removed {}\n", dir.display()))
        }
    };
    match done {
        Ok(text) => {
            print_out(&text);
            0
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            EXIT_USAGE
        }
    }
}

/// `gpucap cdi generate`: the device's files and the spec, from this gpucap and its
/// libgpucap.so (GPUCAP_LIB names another).
fn cdi_generate(request: &cdi::Request) -> i32 {
    let exe = std::env::current_exe().ok();
    let written = exe
        .as_deref()
        .ok_or_else(|| "cannot tell where the gpucap executable is".to_string())
        .and_then(|exe| {
            let lib =
                preload::locate_library(std::env::var_os("GPUCAP_LIB").as_deref(), Some(exe))?;
            cdi::generate(request, exe, &lib)
        });
    match written {
        Ok(text) => {
            print_out(&text);
            0
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            EXIT_USAGE
        }
    }
}

/// `--report PATH` made absolute against the current directory: CMD may change
/// directory before it exits.
fn absolute_report(mut overrides: Overrides) -> Overrides {
    if let Some(r) = &overrides.report
        && Path::new(r).is_relative()
        && !r.is_empty()
        && let Ok(abs) = std::env::current_dir().map(|d| d.join(r))
        && let Some(abs) = abs.to_str()
    {
        overrides.report = Some(abs.to_string());
    }
    overrides
}

/// Writes to stdout, ignoring a closed pipe (`gpucap check | head -1`).
fn print_out(s: &str) {
    let _ = io::stdout().lock().write_all(s.as_bytes());
}

/// The environment `vars` with the flags' variables replaced (every occurrence of an
/// overridden name is dropped, then the flag's value appended).
pub fn apply_overrides(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    overrides: &Overrides,
) -> Vec<(OsString, OsString)> {
    let set = overrides.vars();
    let mut out: Vec<(OsString, OsString)> = vars
        .into_iter()
        .filter(|(k, _)| !set.iter().any(|(name, _)| k == name))
        .collect();
    out.extend(
        set.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    out
}

/// `vars` with only the first occurrence of each name kept (the one getenv finds, and
/// the one `config::from_vars` validates).
pub fn dedup_first(vars: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    let mut seen = std::collections::HashSet::new();
    vars.into_iter()
        .filter(|(k, _)| seen.insert(k.clone()))
        .collect()
}

/// Sets `name` to `value` in `vars`, in place of any earlier value.
pub(crate) fn set_var(vars: &mut Vec<(OsString, OsString)>, name: &str, value: OsString) {
    vars.retain(|(k, _)| k != name);
    vars.push((name.into(), value));
}

/// The first value of `name` in `vars` (as getenv would find it).
pub(crate) fn lookup<'a>(vars: &'a [(OsString, OsString)], name: &str) -> Option<&'a OsStr> {
    vars.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_os_str())
}

/// A ConfigError about a variable that a flag set names the flag instead
/// (`gpucap: invalid --limit="150%": ...`): that is what the user typed.
pub fn blame_flag(mut e: config::ConfigError, overrides: &Overrides) -> config::ConfigError {
    if let Some(flag) = flag_of(&e.var, overrides) {
        e.var = flag.to_string();
    }
    e
}

/// The flag that set variable `var`, if one did (`--limit` for GPUCAP_LIMIT when
/// `--limit` was typed): messages name what the user typed.
fn flag_of(var: &str, overrides: &Overrides) -> Option<&'static str> {
    Some(match var {
        "GPUCAP_LIMIT" if overrides.limit.is_some() => "--limit",
        "GPUCAP_LOG" if overrides.log.is_some() => "--log",
        "GPUCAP_REPORT" if overrides.report.is_some() => "--report",
        "GPUCAP_GROWTH" if overrides.growth => "--growth",
        "GPUCAP_POOL" if overrides.pool.is_some() => "--pool",
        "GPUCAP_WAIT" if overrides.wait.is_some() => "--wait",
        "GPUCAP_GUARANTEE" if overrides.guarantee.is_some() => "--guarantee",
        "GPUCAP_CEILING" if overrides.ceiling.is_some() => "--ceiling",
        _ => return None,
    })
}

/// The configuration's `note:` lines with a variable set by a flag named as the flag
/// (`note: --limit's 8GB is in decimal units ...`).
fn blame_flag_notes(mut config: Config, overrides: &Overrides) -> Config {
    for note in &mut config.notes {
        for var in config::KNOWN_VARS {
            if let Some(flag) = flag_of(var, overrides) {
                *note = note.replace(&format!("{var}'s "), &format!("{flag}'s "));
            }
        }
    }
    config
}

/// Validates the environment with the flags applied. On error prints the one-line
/// ConfigError to stderr.
pub(crate) fn load(overrides: &Overrides) -> Result<(Config, Vec<(OsString, OsString)>), i32> {
    let vars = dedup_first(apply_overrides(std::env::vars_os(), overrides));
    match config::from_vars(vars.iter().map(|(k, v)| (k, v))) {
        Ok(c) => Ok((blame_flag_notes(c, overrides), vars)),
        Err(e) => {
            eprintln!("{}", blame_flag(e, overrides));
            Err(EXIT_USAGE)
        }
    }
}

pub(crate) fn library(vars: &[(OsString, OsString)]) -> Result<std::path::PathBuf, String> {
    let exe = std::env::current_exe().ok();
    let lib = preload::locate_library(lookup(vars, "GPUCAP_LIB"), exe.as_deref())?;
    preload::check_preloadable(&lib)?;
    Ok(lib)
}

/// The `gpucap.env` the shim would read for a process whose environment has no
/// GPUCAP_* variable (`lib` is the library `run` would preload), validated:
/// `Ok(None)` when there is none.
fn config_file(lib: Option<&Path>) -> Result<Option<(Config, PathBuf)>, String> {
    config::from_env_files(lib.and_then(Path::parent))
}

/// `gpucap check [--write-env FILE]`.
fn check(overrides: &Overrides, write_env: Option<&OsStr>) -> i32 {
    let (mut config, vars) = match load(overrides) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let lib = library(&vars);
    // What the shim would do with an environment without GPUCAP_* variables; not when
    // writing that file (the environment is then the configuration to write).
    // Beside variables of the environment, the file is a ceiling (check::as_the_shim_reads).
    let mut source = None;
    if write_env.is_none() {
        match check::as_the_shim_reads(config, &vars, lib.as_deref().ok()) {
            Ok((c, file)) => {
                config = c;
                source = file;
            }
            Err(e) => {
                eprintln!("{e}");
                return EXIT_USAGE;
            }
        }
    }
    let probe = driver::probe();
    // A key of any per-GPU variable that names no visible GPU fails closed in the shim:
    // say so now, with the shim's own check, before anything (a pool) is looked at.
    if let driver::Probe::Devices(devices) = &probe
        && let Err(msg) = report::key_check(&config, devices)
    {
        eprintln!("{msg}");
        return EXIT_USAGE;
    }
    let pool_line = match pool::check_line(config.pool.as_ref(), config.pool_dir.as_deref()) {
        Ok(line) => line,
        Err(msg) => {
            eprintln!("{msg}");
            return EXIT_USAGE;
        }
    };
    if let Some(warning) = report::probe_warning(&probe) {
        eprintln!("{warning}");
    }
    let preloaded = preload::preloads_gpucap(lookup(&vars, "LD_PRELOAD"));
    let text = report::check_report(
        &config,
        lib.as_deref().map_err(String::as_str),
        &probe,
        preloaded,
        source.as_deref(),
        &pool_line,
    );
    print_out(&text);
    if let Err(e) = lib {
        eprintln!("gpucap: {e}");
        return EXIT_USAGE;
    }
    if let Some(file) = write_env {
        let file = Path::new(file);
        let mut vars = vars;
        // A pool named by HAMi-core's CUDA_DEVICE_MEMORY_SHARED_CACHE alone goes into the
        // file as GPUCAP_POOL (the file holds GPUCAP_* variables only).
        if let Some(config::PoolSpec::Path(p)) = &config.pool
            && lookup(&vars, "GPUCAP_POOL").is_none()
        {
            vars.push(("GPUCAP_POOL".into(), p.clone().into_os_string()));
        }
        // A claim's pool (HAMi's DRA plugin, vgpu-manager) as GPUCAP_CLAIM_DIR.
        if let Some(config::PoolSpec::Claim(d)) = &config.pool
            && lookup(&vars, "GPUCAP_CLAIM_DIR").is_none()
        {
            vars.push(("GPUCAP_CLAIM_DIR".into(), d.clone().into_os_string()));
        }
        let written = config::format_env_file(vars.iter().map(|(k, v)| (k, v))).and_then(|text| {
            gpucap_core::report::write_atomically(file, text.as_bytes(), Some(0o644))
                .map_err(|e| format!("cannot write {}: {e}", file.display()))
        });
        match written {
            Ok(()) => print_out(&format!("wrote {}\n", file.display())),
            Err(e) => {
                eprintln!("gpucap: {e}");
                return EXIT_USAGE;
            }
        }
    }
    0
}

/// The exit status and message for a failed exec of `program`, as a shell would give:
/// 127 when it does not exist, 126 when it exists but cannot be executed.
pub fn exec_failure(program: &OsStr, err: &io::Error) -> (i32, String) {
    let name = program.to_string_lossy();
    let has_slash = program.to_string_lossy().contains('/');
    match err.kind() {
        io::ErrorKind::NotFound if !has_slash => {
            (EXIT_NOT_FOUND, format!("gpucap: {name}: command not found"))
        }
        io::ErrorKind::NotFound => (EXIT_NOT_FOUND, format!("gpucap: {name}: {err}")),
        _ => (
            EXIT_CANNOT_EXECUTE,
            format!("gpucap: {name}: cannot execute: {err}"),
        ),
    }
}

/// CMD's environment: exactly the one that was validated, plus LD_PRELOAD, plus with
/// `--growth` the frameworks' grow-on-demand switches the user has not set.
pub(crate) fn child_env(
    overrides: &Overrides,
    vars: Vec<(OsString, OsString)>,
    ld_preload: OsString,
) -> Vec<(OsString, OsString)> {
    let mut env = vars;
    set_var(&mut env, "LD_PRELOAD", ld_preload);
    if overrides.growth {
        for (k, v) in args::FRAMEWORK_GROWTH_VARS {
            if lookup(&env, k).is_none() {
                env.push((k.into(), v.into()));
            }
        }
    }
    env
}

/// Before `run` starts the program: without a loadable libcuda.so.1, one line says so
/// (a warning: the program may not need the GPU; it runs all the same). When a per-GPU
/// variable (`GPUCAP_LIMIT`, `GPUCAP_GUARANTEE`, `GPUCAP_CEILING`, HAMi-core's
/// `CUDA_DEVICE_MEMORY_LIMIT_<n>`) names GPUs, they are checked against the ones the
/// driver shows with the shim's own check at `cuInit`: the error is the shim's line. A
/// driver that loads but cannot list its GPUs is left to the program (its own `cuInit`
/// gets the same answer).
pub(crate) fn check_driver(config: &Config) -> Result<(), String> {
    let warn_no_driver = |why: &str| {
        if config.log >= LogLevel::Warn {
            eprintln!("gpucap: {}", driver::no_driver_line(why));
        }
    };
    let shares = config.pool.is_some() && (config.guarantee.is_some() || config.ceiling.is_some());
    if config::names_gpus(config) || shares {
        match driver::probe() {
            driver::Probe::Devices(devices) => report::key_check(config, &devices)?,
            driver::Probe::NoDriver(why) => warn_no_driver(&why),
            driver::Probe::Failed(_) => {}
        }
    } else if let Err(why) = driver::loadable() {
        warn_no_driver(&why);
    }
    Ok(())
}

/// What `run` and `run --measure` need before the program starts: the library to
/// preload, and the driver checked (see [`check_driver`]); the error is printed, and
/// the exit status returned.
pub(crate) fn prepare(
    config: &Config,
    vars: &[(OsString, OsString)],
) -> Result<std::path::PathBuf, i32> {
    let lib = library(vars).map_err(|e| {
        eprintln!("gpucap: {e}");
        EXIT_USAGE
    })?;
    check_driver(config).map_err(|msg| {
        eprintln!("{msg}");
        EXIT_USAGE
    })?;
    // A pool directory the shim would refuse: say so now rather than at cuInit.
    if let Some(spec) = &config.pool
        && let Err(e) = pool::locate(spec, config.pool_dir.as_deref())
    {
        eprintln!("gpucap: pool {spec}: {e}");
        return Err(EXIT_USAGE);
    }
    Ok(lib)
}

/// The configuration that names the pool `status` and `top` show: the environment
/// with `--pool` applied (which then replaces HAMi-core's
/// CUDA_DEVICE_MEMORY_SHARED_CACHE too). When neither `--pool` nor the environment
/// names a pool (GPUCAP_POOL, CUDA_DEVICE_MEMORY_SHARED_CACHE), the gpucap.env file the
/// shim reads (beside libgpucap.so, else /etc/gpucap) names it: what the container
/// entrypoint wrote, so that `docker exec CONTAINER gpucap top` shows the container's
/// pool even with other GPUCAP_* variables set. Errors are printed; the exit status
/// returned.
fn pool_config(pool_flag: Option<String>) -> Result<Config, i32> {
    let flagged = pool_flag.is_some();
    let overrides = Overrides {
        pool: pool_flag,
        ..Overrides::default()
    };
    let mut vars = dedup_first(apply_overrides(std::env::vars_os(), &overrides));
    if flagged {
        vars.retain(|(k, _)| k != config::HAMI_SHARED_CACHE);
    }
    let config = config::from_vars(vars.iter().map(|(k, v)| (k, v))).map_err(|e| {
        eprintln!("{}", blame_flag(e, &overrides));
        EXIT_USAGE
    })?;
    let named = lookup(&vars, "GPUCAP_POOL").is_some()
        || lookup(&vars, config::HAMI_SHARED_CACHE).is_some();
    if named {
        return Ok(config);
    }
    // Without any GPUCAP_* variable the file is the configuration, as for the shim: its
    // errors are errors here too. Otherwise only its pool is of interest.
    let env_has_vars = config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v)));
    match config_file(library(&vars).ok().as_deref()) {
        Ok(Some((c, _))) if !env_has_vars || c.pool.is_some() => Ok(c),
        Ok(_) => Ok(config),
        Err(e) if !env_has_vars => {
            eprintln!("{e}");
            Err(EXIT_USAGE)
        }
        Err(_) => Ok(config),
    }
}

const NO_POOL_CONFIGURED: &str = "gpucap: no pool configured: name one with --pool NAME|PATH, \
     or set GPUCAP_POOL (or CUDA_DEVICE_MEMORY_SHARED_CACHE) as the pool's processes have it";

/// Opens the pool `status` and `top` show (see [`pool_config`]), read-only.
fn open_pool(pool_flag: Option<String>) -> Result<gpucap_pool_file::PoolFile, i32> {
    let config = pool_config(pool_flag)?;
    let Some(spec) = &config.pool else {
        eprintln!("{NO_POOL_CONFIGURED}");
        return Err(EXIT_USAGE);
    };
    pool::open(spec, config.pool_dir.as_deref()).map_err(|(code, msg)| {
        // A name that names no pool: the nearest one there is (`did you mean train?`).
        let hint = match pool::locate(spec, config.pool_dir.as_deref()) {
            Ok(pool::Located::File(p)) if code == pool::EXIT_NO_POOL_FILE => {
                pool_files::suggestion(&p)
            }
            _ => String::new(),
        };
        eprintln!("{msg}{hint}");
        code
    })
}

/// `gpucap pool list` and `gpucap pool clean [NAME]`, in the pool directory `status`
/// would use.
fn pools(action: args::PoolAction) -> i32 {
    let config = match pool_config(None) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let args::PoolAction::Resize(r) = &action {
        return resize::run(r, config.pool_dir.as_deref());
    }
    let dir = match gpucap_pool_file::user_dir(config.pool_dir.as_deref(), false) {
        Ok(Some(dir)) => dir,
        Ok(None) => {
            print_out(
                "no pools (no pool directory yet: the first member makes it)
",
            );
            return match action {
                args::PoolAction::Clean(Some(_)) => pool_files::EXIT_NOT_REMOVED,
                _ => 0,
            };
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            return EXIT_USAGE;
        }
    };
    match action {
        args::PoolAction::List => {
            print_out(&pool_files::list_text(&dir, &pool_files::entries(&dir)));
            0
        }
        args::PoolAction::Clean(name) => {
            let (out, err, code) = pool_files::clean(&dir, name.as_deref());
            for line in out {
                print_out(&format!("{line}\n"));
            }
            for line in err {
                eprintln!("{line}");
            }
            code
        }
        args::PoolAction::Resize(r) => resize::run(&r, config.pool_dir.as_deref()),
    }
}

/// `gpucap status [--pool NAME|PATH] [--json] [--uuid]`: the pool the flag or the
/// environment names, in detail; else every pool and every process capped on its own.
fn status(pool_flag: Option<String>, json: bool, uuid: bool, all: bool) -> i32 {
    let config = match pool_config(pool_flag.clone()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if config.pool.is_none() {
        return status::everything(config.pool_dir, json, uuid, all);
    }
    let file = match open_pool(pool_flag) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let view = match file.view() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("gpucap: {e}");
            return 2;
        }
    };
    if json {
        print_out(&pool::json(&view, &file.path));
    } else {
        print_out(&pool::render(&view, &file.path, pool::own_pid_namespace()));
    }
    0
}

/// The reader of the pools `status --prometheus` and `metrics` show: `--pool`'s
/// (each validated as GPUCAP_POOL is), every pool of the pool directory (`--all`), or
/// the one `status` would show. The pool directory is the one `status` would use.
/// With no pool configured, `everything` says what is read: every pool and every
/// process capped alone, as `status` shows them (`status --prometheus`), or nothing
/// (`metrics`, a server, names what it serves: the error line).
fn metrics_reader(pools: PoolSet, everything: bool) -> Result<metrics::Reader, i32> {
    match pools {
        PoolSet::Configured => {
            let config = pool_config(None)?;
            let Some(spec) = config.pool else {
                if everything {
                    return Ok(metrics::Reader::new(metrics::Which::All, config.pool_dir));
                }
                eprintln!("{NO_POOL_CONFIGURED}");
                return Err(EXIT_USAGE);
            };
            Ok(metrics::Reader::new(
                metrics::Which::Pools(vec![spec]),
                config.pool_dir,
            ))
        }
        PoolSet::Named(values) => {
            let config = pool_config(values.first().cloned())?;
            let mut specs = Vec::new();
            for v in values {
                let overrides = Overrides {
                    pool: Some(v.clone()),
                    ..Overrides::default()
                };
                let vars = apply_overrides(Vec::new(), &overrides);
                match config::from_vars(vars.iter().map(|(k, v)| (k, v))) {
                    Ok(Config {
                        pool: Some(spec), ..
                    }) => specs.push(spec),
                    Ok(_) => {
                        eprintln!("gpucap: invalid --pool={v:?}: off names no pool");
                        return Err(EXIT_USAGE);
                    }
                    Err(e) => {
                        eprintln!("{}", blame_flag(e, &overrides));
                        return Err(EXIT_USAGE);
                    }
                }
            }
            Ok(metrics::Reader::new(
                metrics::Which::Pools(specs),
                config.pool_dir,
            ))
        }
        PoolSet::All => {
            let config = pool_config(None)?;
            Ok(metrics::Reader::new(metrics::Which::All, config.pool_dir))
        }
    }
}

/// `gpucap status --prometheus [--pool NAME|PATH]... [--all]`: the exposition, printed
/// whatever could be read; the exit status is the worst pool's, as `status` gives it.
fn status_prometheus(pools: PoolSet) -> i32 {
    let mut reader = match metrics_reader(pools, true) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let readings = match reader.read() {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("{msg}");
            return EXIT_USAGE;
        }
    };
    print_out(&metrics::exposition(&readings, &reader.lone()));
    let mut code = 0;
    for r in &readings {
        if let Err((c, msg)) = &r.result {
            eprintln!("{msg}");
            code = code.max(*c);
        }
    }
    code
}

/// `gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all]`.
fn serve_metrics(listen: std::net::SocketAddr, pools: PoolSet) -> i32 {
    let reader = match metrics_reader(pools, false) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let listener = match std::net::TcpListener::bind(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("gpucap: cannot listen on {listen}: {e}");
            return EXIT_USAGE;
        }
    };
    let addr = listener.local_addr().map_or(listen, |a| a);
    eprintln!(
        "gpucap metrics: serving http://{addr}/metrics ({})",
        reader.describe()
    );
    let e = metrics::serve(listener, reader, &mut io::stderr());
    eprintln!("gpucap: metrics: cannot accept connections on {addr}: {e}");
    1
}

/// `gpucap top [--pool NAME|PATH] [--user NAME] [--sort KEY] [--uuid] [--interval SECS]
/// [--iterations N | --once]`: every capped process, or the pool's members when the flag
/// or the environment names a pool (whose file must then be readable: exit 1 or 2 as
/// `status` gives).
fn top(pool_flag: Option<String>, mut opts: top::Options) -> i32 {
    let config = match pool_config(pool_flag.clone()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut sources = procs::Sources::new(config.pool_dir.clone(), status::every_user());
    if let Some(spec) = &config.pool {
        let file = match open_pool(pool_flag) {
            Ok(f) => f,
            Err(code) => return code,
        };
        let name = file
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.strip_suffix(".pool").unwrap_or(n).to_string())
            .unwrap_or_else(|| spec.to_string());
        opts.filter.pool = Some(name);
        sources = sources.with_pool_file(file.path.clone());
        file.locks.forget_in_child(); // closes its descriptor: `sources` reads it
    }
    // A closed pipe (`gpucap top | head`) ends it quietly, as a pipeline expects.
    match top::run_to_stdout(&mut sources, &opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpucap: {e}");
            EXIT_USAGE
        }
    }
}

/// The line `run` prints when `program` would run with no cap from any source (no
/// `--limit`, no GPUCAP_LIMIT nor HAMi-core's variables, no gpucap.env the shim would
/// read instead): never silently uncapped. None when it is capped, or when the cap
/// was set to `none` on purpose.
pub(crate) fn uncapped_line(
    config: &Config,
    vars: &[(OsString, OsString)],
    lib: &Path,
    program: &OsStr,
) -> Option<String> {
    if config.limit.is_some()
        || lookup(vars, "GPUCAP_LIMIT")
            .and_then(OsStr::to_str)
            .is_some_and(config::limit_is_none)
    {
        return None;
    }
    // The shim reads gpucap.env too: its cap counts (alone, or as a ceiling).
    if let Ok(Some((file, _))) = config_file(Some(lib))
        && file.limit.is_some()
    {
        return None;
    }
    Some(format!(
        "gpucap: no cap is set, so {} runs uncapped (its allocations are only counted): \
         set one with --limit (8Gi, 50%) or GPUCAP_LIMIT; --limit none or --quiet silences \
         this line",
        program.to_string_lossy()
    ))
}

/// `gpucap run`.
fn run(overrides: &Overrides, program: &OsStr, args: &[OsString]) -> i32 {
    let (config, vars) = match load(overrides) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let lib = match prepare(&config, &vars) {
        Ok(lib) => lib,
        Err(code) => return code,
    };
    if !overrides.quiet
        && config.log >= LogLevel::Warn
        && let Some(line) = uncapped_line(&config, &vars, &lib, program)
    {
        eprintln!("{line}");
    }
    // Under a file's ceiling, with GPUCAP_LOG=info: the ceiling and what was asked (the
    // shim says a GPU held at the ceiling in one line, at warn).
    if config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v)))
        && let Ok((c, _)) = check::as_the_shim_reads(config.clone(), &vars, Some(&lib))
        && c.log >= LogLevel::Info
    {
        for line in report::ceiling_lines(&c) {
            eprintln!("gpucap: {line}");
        }
    }
    let ld_preload = preload::merge_ld_preload(lookup(&vars, "LD_PRELOAD"), &lib);
    if config.log >= LogLevel::Debug {
        eprintln!(
            "gpucap: running {} with LD_PRELOAD={}",
            program.to_string_lossy(),
            ld_preload.to_string_lossy()
        );
    }
    let env = child_env(overrides, vars, ld_preload);
    let err = std::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(env)
        .exec();
    let (code, message) = exec_failure(program, &err);
    eprintln!("{message}");
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        v.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn overrides_replace_variables() {
        let env = pairs(&[
            ("GPUCAP_LIMIT", "1Gi"),
            ("PATH", "/bin"),
            ("GPUCAP_LIMIT", "2Gi"),
            ("GPUCAP_LOG", "info"),
        ]);
        let o = Overrides {
            limit: Some("8Gi".into()),
            log: None,
            ..Overrides::default()
        };
        assert_eq!(
            apply_overrides(env.clone(), &o),
            pairs(&[
                ("PATH", "/bin"),
                ("GPUCAP_LOG", "info"),
                ("GPUCAP_LIMIT", "8Gi")
            ])
        );
        assert_eq!(apply_overrides(env.clone(), &Overrides::default()), env);
        // The flag is what gets validated: a bad variable is overridden by a good flag...
        let bad = pairs(&[("GPUCAP_LIMIT", "150%")]);
        assert!(config::from_vars(apply_overrides(bad.clone(), &o)).is_ok());
        // ...and a bad flag is an error even with a good variable.
        let o = Overrides {
            limit: Some("abc".into()),
            log: None,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(pairs(&[("GPUCAP_LIMIT", "8Gi")]), &o));
        assert_eq!(e.unwrap_err().value, "abc");
    }

    #[test]
    fn errors_name_the_flag() {
        let o = Overrides {
            limit: Some("150%".into()),
            log: None,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(Vec::new(), &o)).unwrap_err();
        let line = blame_flag(e, &o).to_string();
        assert!(
            line.starts_with("gpucap: invalid --limit=\"150%\": a percentage"),
            "{line}"
        );
        // A variable the flags did not set keeps its name.
        let o = Overrides {
            limit: Some("8Gi".into()),
            log: None,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(pairs(&[("GPUCAP_LOG", "loud")]), &o));
        let line = blame_flag(e.unwrap_err(), &o).to_string();
        assert!(
            line.starts_with("gpucap: invalid GPUCAP_LOG=\"loud\""),
            "{line}"
        );
        let o = Overrides {
            limit: None,
            log: Some("loud".into()),
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(Vec::new(), &o)).unwrap_err();
        assert_eq!(blame_flag(e, &o).var, "--log");
    }

    #[test]
    fn environment_edits() {
        let env = pairs(&[("A", "1"), ("B", "2"), ("A", "3"), ("LD_PRELOAD", "/a.so")]);
        let mut env = dedup_first(env);
        assert_eq!(
            env,
            pairs(&[("A", "1"), ("B", "2"), ("LD_PRELOAD", "/a.so")])
        );
        set_var(&mut env, "LD_PRELOAD", "/a.so:/b.so".into());
        assert_eq!(
            env,
            pairs(&[("A", "1"), ("B", "2"), ("LD_PRELOAD", "/a.so:/b.so")])
        );
    }

    #[test]
    fn lookup_takes_the_first() {
        let env = pairs(&[("A", "1"), ("GPUCAP_LIB", "/x.so"), ("GPUCAP_LIB", "/y.so")]);
        assert_eq!(lookup(&env, "GPUCAP_LIB"), Some(OsStr::new("/x.so")));
        assert_eq!(lookup(&env, "B"), None);
    }

    #[test]
    fn exec_failures_like_a_shell() {
        let nf = io::Error::from(io::ErrorKind::NotFound);
        let (code, msg) = exec_failure(OsStr::new("nosuchcmd"), &nf);
        assert_eq!(code, 127);
        assert_eq!(msg, "gpucap: nosuchcmd: command not found");
        let (code, msg) = exec_failure(OsStr::new("./nosuch"), &nf);
        assert_eq!(code, 127);
        assert!(msg.starts_with("gpucap: ./nosuch: "));
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(exec_failure(OsStr::new("./file.txt"), &denied).0, 126);
        let noexec = io::Error::from_raw_os_error(libc::ENOEXEC);
        assert_eq!(exec_failure(OsStr::new("./data"), &noexec).0, 126);
    }

    #[test]
    fn real_exec_failures() {
        // exec only returns on failure, so these are safe to run in the test process.
        let err = std::process::Command::new("gpucap-no-such-command-xyz").exec();
        assert_eq!(
            exec_failure(OsStr::new("gpucap-no-such-command-xyz"), &err).0,
            127
        );
        let dir = std::env::temp_dir().join(format!("gpucap-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("not-executable");
        std::fs::write(&file, b"hello").unwrap();
        let err = std::process::Command::new(&file).exec();
        assert_eq!(exec_failure(file.as_os_str(), &err).0, 126);
        let err = std::process::Command::new(&dir).exec();
        assert_eq!(exec_failure(dir.as_os_str(), &err).0, 126);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn growth_sets_the_framework_switches_unless_set() {
        let o = Overrides {
            growth: true,
            ..Overrides::default()
        };
        let env = child_env(
            &o,
            pairs(&[("TF_FORCE_GPU_ALLOW_GROWTH", "false")]),
            "/l.so".into(),
        );
        assert_eq!(
            env,
            pairs(&[
                ("TF_FORCE_GPU_ALLOW_GROWTH", "false"),
                ("LD_PRELOAD", "/l.so"),
                ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
            ])
        );
        let env = child_env(&Overrides::default(), Vec::new(), "/l.so".into());
        assert_eq!(env, pairs(&[("LD_PRELOAD", "/l.so")]));
    }

    #[test]
    fn report_flag_is_made_absolute_and_blamed() {
        let o = absolute_report(Overrides {
            report: Some("r-%p.json".into()),
            ..Overrides::default()
        });
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(o.report.unwrap(), cwd.join("r-%p.json").to_str().unwrap());
        let o = absolute_report(Overrides {
            report: Some("/abs.json".into()),
            ..Overrides::default()
        });
        assert_eq!(o.report.as_deref(), Some("/abs.json"));
        let o = Overrides {
            report: Some(String::new()),
            growth: true,
            ..Overrides::default()
        };
        let e = config::from_vars(apply_overrides(Vec::new(), &o)).unwrap_err();
        assert_eq!(blame_flag(e, &o).var, "--report");
    }
}
