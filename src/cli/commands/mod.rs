//! One file per command, each the command's wiring to the process: its configuration
//! read, its work done by the modules beside `commands` (which never import from here),
//! its lines printed and its exit status returned. `run --measure` is `crate::measure`.

pub mod cdi;
pub mod check;
pub mod jupyter;
pub mod metrics;
pub mod pool;
pub mod run;
pub mod status;
pub mod top;
mod write_env;
