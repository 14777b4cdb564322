//! `gpucap check [--write-env FILE]`: the configuration validated as the shim would read
//! it, printed (the text is `report`'s, the pool's line `pool`'s), and optionally
//! written as a `gpucap.env`.

use std::ffi::OsStr;
use std::path::Path;

use gpucap_core::config;

use crate::args::Overrides;
use crate::environment::{as_the_shim_reads, library, load, lookup};
use crate::exit::EXIT_USAGE;
use crate::term::print_out;
use crate::{driver, pool, preload, report};

/// `gpucap check [--write-env FILE]`.
pub fn command(overrides: &Overrides, write_env: Option<&OsStr>) -> i32 {
    let (mut config, vars) = match load(overrides) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let lib = library(&vars);
    // What the shim would do with an environment without GPUCAP_* variables; not when
    // writing that file (the environment is then the configuration to write).
    // Beside variables of the environment, the file is a ceiling (environment::as_the_shim_reads).
    let mut source = None;
    if write_env.is_none() {
        match as_the_shim_reads(config, &vars, lib.as_deref().ok()) {
            Ok((c, file)) => {
                // What the file's ceiling added names a flag as typed (`--limit="4Gi"`).
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
    let members = config
        .pool_members
        .unwrap_or(gpucap_core::budget::DEFAULT_SLOTS);
    let pool_line =
        match pool::check_line(config.pool.as_ref(), config.pool_dir.as_deref(), members) {
            Ok(line) => line,
            Err(msg) => {
                eprintln!("{msg}");
                return EXIT_USAGE;
            }
        };
    // A cap other than the live members' is refused by the library at cuInit: said now
    // (as `run` says it before CMD starts).
    if let Some(msg) = pool::live_cap_mismatch(&config, || match &probe {
        driver::Probe::Devices(devices) => Some(devices.clone()),
        _ => None,
    }) {
        eprintln!("{msg}");
        return EXIT_USAGE;
    }
    if let Some(warning) = report::probe_warning(&probe) {
        eprintln!("{warning}");
    }
    // Alone, the shim shows the process through a file there, and says at its start when
    // it cannot: said here first.
    if config.pool.is_none()
        && let Some(dir) = config.pool_dir.as_deref().filter(|d| !d.is_dir())
    {
        eprintln!(
            "gpucap: GPUCAP_POOL_DIR={} is not a directory: a process capped alone will not \
             show in gpucap status, top or metrics (its cap holds)",
            dir.display()
        );
    }
    // Alone, each start makes and removes that file: on a disk, at the journal's cost.
    if config.pool.is_none()
        && let Some(dir) = config.pool_dir.as_deref().filter(|d| d.is_dir())
        && let Some(kind) = gpucap_pool_file::disk_file_system(dir)
    {
        eprintln!(
            "gpucap: note: GPUCAP_POOL_DIR={} is on {kind}, not in memory (a tmpfs): a process \
             capped alone makes and removes its file there at each start, at a disk's cost (1,000 \
             such starts took x1.6-x1.8 of the raw driver's time where /dev/shm gave x1.3; \
             docs/src/performance.md); /dev/shm, the default, is a tmpfs",
            dir.display()
        );
    }
    let preloaded = preload::preloads_gpucap(lookup(&vars, "LD_PRELOAD"));
    let file = match source.as_deref() {
        None => report::ConfigFile::Absent,
        Some(f) if config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v))) => {
            report::ConfigFile::Over(f)
        }
        Some(f) => report::ConfigFile::Whole(f),
    };
    let text = report::check_report(
        &config,
        lib.as_deref().map_err(String::as_str),
        &probe,
        preloaded,
        file,
        &pool_line,
        // A flag sets the variable too.
        report::Set {
            limit_none: lookup(&vars, "GPUCAP_LIMIT")
                .and_then(OsStr::to_str)
                .is_some_and(config::limit_is_none),
            wait: lookup(&vars, "GPUCAP_WAIT").is_some(),
            wait_in_file: source.as_deref().is_some_and(file_sets_wait),
        },
    );
    print_out(&text);
    if let Err(e) = lib {
        eprintln!("gpucap: {e}");
        return EXIT_USAGE;
    }
    if let Some(file) = write_env {
        let file = Path::new(file);
        if let Err(msg) = super::write_env::within_etc_ceiling(&config, &vars, &probe, file) {
            eprintln!("{msg}");
            return EXIT_USAGE;
        }
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
        // A file there is a ceiling: the environment's configuration goes under it
        // (`write_env::under_existing`).
        let written = config::format_env_file(vars.iter().map(|(k, v)| (k, v)))
            .and_then(|text| super::write_env::under_existing(text, &config, &vars, &probe, file))
            .and_then(|(text, said)| {
                for line in said {
                    eprintln!("gpucap: {line}");
                }
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

/// Whether the configuration file `f` sets `GPUCAP_WAIT` (read again: the configuration
/// keeps the value, not where it came from; a file that cannot be read here was read by
/// the loading above, or named there).
fn file_sets_wait(f: &Path) -> bool {
    std::fs::read_to_string(f)
        .ok()
        .and_then(|t| config::parse_env_file(&t).ok())
        .is_some_and(|vars| vars.iter().any(|(k, _)| k == "GPUCAP_WAIT"))
}
