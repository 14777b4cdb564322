//! `gpucap top`: every capped process, or one pool's members, refreshed (the frames,
//! sorting and filters are `crate::top`'s).

use crate::exit::EXIT_USAGE;
use crate::procs::Sources;
use crate::shown_pool::{open_pool, pool_config};
use crate::{status, top};

/// `gpucap top [--pool NAME|PATH] [--user NAME] [--sort KEY] [--uuid] [--interval SECS]
/// [--iterations N | --once]`: every capped process, or the pool's members when the flag
/// or the environment names a pool (whose file must then be readable: exit 1 or 2 as
/// `status` gives).
pub fn command(pool_flag: Option<String>, mut opts: top::Options) -> i32 {
    let config = match pool_config(pool_flag.clone()) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut sources = Sources::new(config.pool_dir.clone(), status::every_user());
    if let Some(spec) = &config.pool {
        let file = match open_pool(pool_flag) {
            Ok(f) => f,
            Err(code) => return code,
        };
        let sharing = gpucap_pool_file::Sharing::of(spec);
        // Named as the rows name it.
        let name = crate::procs::pool_name(&file.path, sharing).unwrap_or_else(|| spec.to_string());
        opts.filter.pool = Some(name);
        // That file only: root's `top --pool train` is not every user's `train` too.
        sources = sources.only_pool_file(file.path.clone(), sharing);
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
