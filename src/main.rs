//! `gpucap`, the command-line front end of the libgpucap.so shim.
//!
//! It shares the safe configuration modules with the shim by path and never links the
//! shim's hooks, so this binary does not itself export dlsym or cu* symbols.

#[path = "size.rs"]
mod size;

#[path = "config.rs"]
mod config;

#[path = "report.rs"]
mod report;

mod cli;

fn main() {
    std::process::exit(cli::main(std::env::args_os()));
}
