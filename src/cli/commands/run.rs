//! `gpucap run`: the environment validated, the library located and the driver checked
//! (`crate::launch`), one line when the program would run uncapped, then the program
//! executed with libgpucap.so preloaded.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::Path;

use gpucap_core::config::{self, Config, LogLevel};

use crate::args::Overrides;
use crate::environment::{as_the_shim_reads, load, lookup};
use crate::exit::exec_failure;
use crate::launch::{child_env, prepare};
use crate::{preload, report};

/// `gpucap run`.
pub fn command(overrides: &Overrides, program: &OsStr, args: &[OsString]) -> i32 {
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
    // A report that cannot be written is said now, not after the whole run (the shim
    // says it again at exit); the program runs all the same, as the shim would.
    if config.log >= LogLevel::Warn
        && let Some(p) = &config.report
        && let Some(why) = report::unwritable(p)
    {
        eprintln!("gpucap: report {}: {why}", p.display());
    }
    // Under a file's ceiling, with GPUCAP_LOG=info: the ceiling and what was asked (the
    // shim says a GPU held at the ceiling in one line, at warn).
    if config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v)))
        && let Ok((c, _)) = as_the_shim_reads(config.clone(), &vars, Some(&lib))
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
    // A member's ceiling in a pool (--ceiling, GPUCAP_CEILING) caps it as well.
    // The shim reads gpucap.env too: its cap counts (alone, or as a ceiling), and so does
    // its `GPUCAP_LIMIT=none` where the environment sets no cap.
    let shim = as_the_shim_reads(config.clone(), vars, Some(lib))
        .map_or_else(|_| config.clone(), |(c, _)| c);
    if shim.limit.is_some() || shim.ceiling.is_some() || shim.limit_none || shim.bound.is_some() {
        return None;
    }
    Some(format!(
        "gpucap: no cap is set, so {} runs uncapped (its allocations are only counted): \
         set one with --limit (8Gi, 50%) or GPUCAP_LIMIT; --limit none or --quiet silences \
         this line",
        program.to_string_lossy()
    ))
}
