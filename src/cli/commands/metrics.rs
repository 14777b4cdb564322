//! `gpucap metrics --listen ADDR:PORT`: which pools are read (also for `status
//! --prometheus`), and `crate::metrics`'s server started on the address.

use std::io;

use gpucap_core::config::{self, Config};

use crate::args::{Overrides, PoolSet};
use crate::environment::apply_overrides;
use crate::exit::EXIT_USAGE;
use crate::metrics;
use crate::shown_pool::{NO_POOL_CONFIGURED, pool_config};

/// The reader of the pools `status --prometheus` and `metrics` show: `--pool`'s
/// (each validated as GPUCAP_POOL is), every pool of the pool directory (`--all`), or
/// the one `status` would show. The pool directory is the one `status` would use.
/// With no pool configured, `everything` says what is read: every pool and every
/// process capped alone, as `status` shows them (`status --prometheus`), or nothing
/// (`metrics`, a server, names what it serves: the error line).
pub fn pools_reader(pools: PoolSet, everything: bool) -> Result<metrics::Reader, i32> {
    match pools {
        PoolSet::Configured => {
            let config = pool_config(None)?;
            let Some(spec) = config.pool else {
                if everything {
                    return Ok(metrics::Reader::new(metrics::Which::All, config.pool_dir));
                }
                // A server names what it serves: `--all` is the other way to say it.
                eprintln!("{NO_POOL_CONFIGURED}; or --all for every pool of the pool directory");
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
                        eprintln!("{e}");
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

/// `gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all] [--hami]`.
pub fn command(listen: std::net::SocketAddr, pools: PoolSet, hami: bool) -> i32 {
    let reader = match pools_reader(pools, false) {
        Ok(r) => r.with_hami(hami),
        Err(code) => return code,
    };
    // `--all` in a directory that cannot be used (missing, others may write in it): said
    // now, not found at the first scrape (answered 500 if it goes bad later).
    if let Err(e) = reader.check_dir() {
        eprintln!("{e}");
        return EXIT_USAGE;
    }
    crate::procs::raise_open_files_limit();
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
