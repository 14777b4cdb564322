//! What `run` and `run --measure` share before the program starts: the library to
//! preload located, the driver checked, and the environment the program gets.

use std::ffi::OsString;
use std::path::PathBuf;

use gpucap_core::config::{self, Config, LogLevel};

use crate::args::{self, Overrides};
use crate::environment::{as_the_shim_reads, library, lookup, set_var};
use crate::exit::EXIT_USAGE;
use crate::{driver, pool, report};

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
/// preload, the driver checked (see [`check_driver`]), and the pool named checked as
/// `check` checks it (its directory, its live members' cap); the error is printed, and
/// the exit status returned.
pub(crate) fn prepare(config: &Config, vars: &[(OsString, OsString)]) -> Result<PathBuf, i32> {
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
    // A cap other than the live members' of the pool: the library would refuse every
    // CUDA call at cuInit, so the program does not start; the line is `check`'s (the
    // configuration as the shim reads it, a `gpucap.env` beside the library included).
    if config.pool.is_some() {
        let shim = as_the_shim_reads(config.clone(), vars, Some(&lib)).map(|(c, _)| c);
        if let Some(msg) =
            pool::live_cap_mismatch(shim.as_ref().unwrap_or(config), || match driver::probe() {
                driver::Probe::Devices(devices) => Some(devices),
                _ => None,
            })
        {
            eprintln!("{msg}");
            return Err(EXIT_USAGE);
        }
    }
    Ok(lib)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::environment::tests::pairs;

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
}
