//! `gpucap status`: the pool `--pool` or the environment names, in detail (`crate::pool`),
//! else every pool and every process capped on its own (`crate::status`); and `status
//! --prometheus`, the pools' exposition printed once.

use super::metrics::pools_reader;
use crate::args::PoolSet;
use crate::exit::EXIT_USAGE;
use crate::shown_pool::{open_pool, pool_config};
use crate::term::print_out;
use crate::{metrics, pool, status};

/// `gpucap status [--pool NAME|PATH] [--json] [--uuid]`: the pool the flag or the
/// environment names, in detail; else every pool and every process capped on its own.
pub fn command(pool_flag: Option<String>, json: bool, uuid: bool, all: bool) -> i32 {
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
        // A file removed while its members run is read through a member's descriptor.
        let shown = match file.joined_through {
            Some(t) => std::path::PathBuf::from(format!(
                "{}, removed while its members run: read through {}",
                file.path.display(),
                t.via()
            )),
            None => file.path.clone(),
        };
        print_out(&pool::render(&view, &shown, pool::own_pid_namespace()));
    }
    0
}

/// `gpucap status --prometheus [--pool NAME|PATH]... [--all]`: the exposition, printed
/// whatever could be read; the exit status is the worst pool's, as `status` gives it.
pub fn prometheus(pools: PoolSet, hami: bool) -> i32 {
    let mut reader = match pools_reader(pools, true) {
        Ok(r) => r.with_hami(hami),
        Err(code) => return code,
    };
    let readings = match reader.read() {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("{msg}");
            return EXIT_USAGE;
        }
    };
    print_out(&metrics::exposition(
        &readings,
        reader.lone(),
        reader.unreadable(),
        reader.hami(),
    ));
    // `--all`'s lines about what it could not read beside the pools (a lone process's
    // file; root's own directory), as `status` shows them: the exit status stays; but
    // files named like pool files that could not be read are 2, as a pool's file is.
    for note in reader.notes() {
        eprintln!("{note}");
    }
    let mut code = if reader.unreadable().is_empty() { 0 } else { 2 };
    for r in &readings {
        if let Err((c, msg)) = &r.result {
            eprintln!("{msg}");
            code = code.max(*c);
        }
    }
    code
}
