//! `gpucap jupyter install|list|remove`: the kernelspecs `crate::jupyter` writes, lists
//! and removes, with the lines printed.

use crate::args::JupyterCommand;
use crate::exit::EXIT_USAGE;
use crate::jupyter;
use crate::term::print_out;

/// Whether a kernel with these options would run uncapped (where `run` says so; the
/// options were checked already). The kernel runs in the Jupyter server's environment,
/// not this shell's: only its options and the configuration files count, none of this
/// shell's variables gpucap reads (a `GPUCAP_LIMIT` exported here is not the kernel's).
fn uncapped(overrides: &crate::args::Overrides) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let vars = std::env::vars_os()
        .filter(|(k, _)| !gpucap_core::config::looked_at(k.as_bytes()))
        .collect::<Vec<_>>();
    let vars =
        crate::environment::dedup_first(crate::environment::apply_overrides(vars, overrides));
    let Ok(config) = gpucap_core::config::from_vars(vars.iter().map(|(k, v)| (k, v))) else {
        return false;
    };
    let Ok(lib) = crate::environment::library(&vars) else {
        return false;
    };
    super::run::uncapped_line(&config, &vars, &lib, std::ffi::OsStr::new("")).is_some()
}

/// `gpucap jupyter install|list|remove`. install validates its options as `check` does
/// (printing the same report) before anything is written.
pub fn command(command: JupyterCommand) -> i32 {
    let done = match command {
        JupyterCommand::Install(install) => {
            let code = super::check::command(&install.overrides, None);
            if code != 0 {
                eprintln!("gpucap: no kernel installed: the options above are not valid");
                return code;
            }
            let Ok(exe) = std::env::current_exe() else {
                eprintln!("gpucap: cannot find the gpucap executable's path for the kernel");
                return EXIT_USAGE;
            };
            // A kernel labelled gpucap runs capped: a pool alone (or --pool off) with no
            // cap from --limit, --ceiling or a gpucap.env is refused, as `run` would warn.
            if uncapped(&install.overrides) {
                eprintln!(
                    "gpucap: no kernel installed: no cap is set (no --limit, no --ceiling, no \
                     gpucap.env with a cap; a cap in this shell's environment is not the \
                     kernel's, which the Jupyter server starts with its own), so the kernel \
                     would run uncapped; give --limit SPEC (e.g. --limit 8Gi), with --pool \
                     NAME to share it"
                );
                return EXIT_USAGE;
            }
            jupyter::install(&install, &exe).map(|dir| {
                format!(
                    "installed kernel {} in {}\n",
                    dir.file_name().unwrap_or_default().to_string_lossy(),
                    dir.display()
                )
            })
        }
        JupyterCommand::List => jupyter::list(),
        JupyterCommand::Remove { name } => {
            jupyter::remove(&name).map(|dir| format!("removed {}\n", dir.display()))
        }
    };
    match done {
        Ok(text) => {
            print_out(&text);
            0
        }
        Err(e) => {
            eprintln!("gpucap: {e}");
            EXIT_USAGE
        }
    }
}
