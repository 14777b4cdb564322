//! `gpucap pool list|clean|resize`, in the pool directory `status` would use (the
//! lines are `pool_files`'s and `resize`'s).

use crate::args::PoolAction;
use crate::exit::EXIT_USAGE;
use crate::pool_files::{EXIT_NOT_REMOVED, clean, entries, list_text};
use crate::resize;
use crate::shown_pool::pool_config;
use crate::term::print_out;

/// `gpucap pool list`, `gpucap pool clean [NAME]` and `gpucap pool resize`.
pub fn command(action: PoolAction) -> i32 {
    let config = match pool_config(None) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let PoolAction::Resize(r) = &action {
        return resize::run(r, config.pool_dir.as_deref());
    }
    let dir = match gpucap_pool_file::user_dir(config.pool_dir.as_deref(), false) {
        Ok(Some(dir)) => dir,
        Ok(None) => {
            print_out("no pools (no pool directory yet: the first member makes it)\n");
            return match action {
                PoolAction::Clean(Some(_)) => EXIT_NOT_REMOVED,
                _ => 0,
            };
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            return EXIT_USAGE;
        }
    };
    match action {
        PoolAction::List => {
            print_out(&list_text(&dir, &entries(&dir)));
            0
        }
        PoolAction::Clean(name) => {
            let (out, err, code) = clean(&dir, name.as_deref());
            for line in out {
                print_out(&format!("{line}\n"));
            }
            for line in err {
                eprintln!("{line}");
            }
            code
        }
        PoolAction::Resize(r) => resize::run(&r, config.pool_dir.as_deref()),
    }
}
