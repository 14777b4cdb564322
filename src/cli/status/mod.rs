//! `gpucap status` with no pool named: every pool and every process capped on its own
//! of this user (root: of every user), as a table (`table.rs`) or JSON (`json.rs`).
//! `status --pool NAME` shows one pool in detail (`crate::pool`).

pub mod json;
pub mod table;

use std::path::PathBuf;

use crate::exit::EXIT_USAGE;
use crate::procs::{Gpus, Snapshot, Sources};
use crate::term::print_out;

/// Reads everything once. Err: a line to print (the pool directory cannot be used).
pub fn snapshot(sources: &mut Sources, gpus: &Gpus) -> Result<Snapshot, String> {
    let (pools, lone, errors, warnings) = sources.read()?;
    Ok(Snapshot {
        processes: crate::procs::rows(&pools, &lone, crate::pool::own_pid_namespace(), gpus),
        pools,
        lone,
        errors,
        warnings,
        gpus: gpus.clone(),
    })
}

/// Whether this `gpucap` reads every user's directory (root) or its own.
pub fn every_user() -> bool {
    gpucap_pool_file::own_uid() == 0
}

/// Whether a pool is one no process uses: no live member and nothing held (what
/// `gpucap pool clean` removes without being named).
pub fn unused(p: &crate::procs::PoolReading) -> bool {
    p.view.members.iter().all(|m| !m.alive) && p.view.gpus.iter().all(|g| g.used == 0)
}

/// Leaves out of `s` the pools no process uses ([`unused`]) and their rows (what `status`
/// without `--all` and `top` without `--pool` show): each pool by its file, never by its
/// name (another user's pool of the same name may be in use).
pub fn hide_unused(s: &mut Snapshot) {
    let hidden: Vec<String> = s
        .pools
        .iter()
        .filter(|p| unused(p))
        .map(|p| p.path.clone())
        .collect();
    s.pools.retain(|p| !hidden.contains(&p.path));
    s.processes
        .retain(|r| r.pool_path.as_ref().is_none_or(|n| !hidden.contains(n)));
}

/// `gpucap status [--json] [--uuid] [--all]` with no pool: printed; the exit status.
/// The pools no process uses ([`unused`]) are left out unless `all`.
pub fn everything(pool_dir: Option<PathBuf>, json: bool, uuid: bool, all: bool) -> i32 {
    let mut sources = Sources::new(pool_dir, every_user());
    let mut s = match snapshot(&mut sources, &Gpus::probe()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpucap: {e}");
            return EXIT_USAGE;
        }
    };
    if !all {
        hide_unused(&mut s);
    }
    let text = if json {
        json::render(&s)
    } else {
        table::render(&s, crate::term::size().0, uuid, crate::term::is_terminal())
    };
    print_out(&text);
    0
}
