//! `gpucap status` with no pool named: every pool and every process capped on its own
//! of this user (root: of every user), as a table (`table.rs`) or JSON (`json.rs`).
//! `status --pool NAME` shows one pool in detail (`crate::pool`).

pub mod json;
pub mod table;

use std::path::PathBuf;

use crate::procs::{Gpus, Snapshot, Sources};

/// Reads everything once. Err: a line to print (the pool directory cannot be used).
pub fn snapshot(sources: &mut Sources, gpus: &Gpus) -> Result<Snapshot, String> {
    let (pools, lone, errors) = sources.read()?;
    Ok(Snapshot {
        processes: crate::procs::rows(&pools, &lone, crate::pool::own_pid_namespace(), gpus),
        pools,
        lone,
        errors,
        gpus: gpus.clone(),
    })
}

/// Whether this `gpucap` reads every user's directory (root) or its own.
pub fn every_user() -> bool {
    gpucap_pool_file::own_uid() == 0
}

/// `gpucap status [--json] [--uuid]` with no pool: printed; the exit status.
pub fn everything(pool_dir: Option<PathBuf>, json: bool, uuid: bool) -> i32 {
    let mut sources = Sources::new(pool_dir, every_user());
    let s = match snapshot(&mut sources, &Gpus::probe()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpucap: {e}");
            return crate::EXIT_USAGE;
        }
    };
    let text = if json {
        json::render(&s)
    } else {
        table::render(&s, crate::term::size().0, uuid)
    };
    crate::print_out(&text);
    0
}
