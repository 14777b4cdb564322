//! The pool `status`, `top`, `metrics` and `pool` look at: the one `--pool` names, else
//! the environment's, else the `gpucap.env` file's the shim reads; and its file opened
//! read-only.

use gpucap_core::config::{self, Config};

use crate::args::Overrides;
use crate::environment::{apply_overrides, config_file, dedup_first, library, lookup};
use crate::exit::EXIT_USAGE;
use crate::pool;
use crate::pool_names::suggestion;

/// The configuration that names the pool `status` and `top` show: the environment
/// with `--pool` applied (which then replaces HAMi-core's
/// CUDA_DEVICE_MEMORY_SHARED_CACHE too). When neither `--pool` nor the environment
/// names a pool (GPUCAP_POOL, CUDA_DEVICE_MEMORY_SHARED_CACHE), the gpucap.env file the
/// shim reads (beside libgpucap.so, else /etc/gpucap) names it: what the container
/// entrypoint wrote, so that `docker exec CONTAINER gpucap top` shows the container's
/// pool even with other GPUCAP_* variables set. Errors are printed; the exit status
/// returned.
pub fn pool_config(pool_flag: Option<String>) -> Result<Config, i32> {
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
        eprintln!("{e}");
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

pub const NO_POOL_CONFIGURED: &str = "gpucap: no pool configured: name one with --pool NAME|PATH, \
     or set GPUCAP_POOL (or CUDA_DEVICE_MEMORY_SHARED_CACHE) as the pool's processes have it";

/// Opens the pool `status` and `top` show (see [`pool_config`]), read-only.
pub fn open_pool(pool_flag: Option<String>) -> Result<gpucap_pool_file::PoolFile, i32> {
    let config = pool_config(pool_flag)?;
    let Some(spec) = &config.pool else {
        eprintln!("{NO_POOL_CONFIGURED}");
        return Err(EXIT_USAGE);
    };
    pool::open(spec, config.pool_dir.as_deref()).map_err(|(code, msg)| {
        // A name that names no pool: the nearest one there is (`did you mean train?`).
        let hint = match pool::locate(spec, config.pool_dir.as_deref()) {
            Ok(pool::Located::File(p)) if code == pool::EXIT_NO_POOL_FILE => suggestion(&p),
            _ => String::new(),
        };
        eprintln!("{msg}{hint}");
        code
    })
}
