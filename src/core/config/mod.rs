//! gpucap's configuration: the `GPUCAP_*` environment variables, parsed and validated:
//! `limit` (caps and device keys), `env` (the variables, `Config`), `pool_vars` (which pool,
//! how long to wait for it, where), `file` (`gpucap.env`),
//! `shares` (a pool member's guarantee and ceiling), `ceiling` (a file's cap, which the
//! environment may lower but never raise), `device_cap` (one GPU's cap in bytes under it), `keys` (every per-GPU variable's
//! keys against the visible GPUs), `sources` (the caps the cluster's GPU drivers hand a
//! container, merged with the others by one resolver), `typed` (lines name the flags of
//! `gpucap run` that set variables).
//!
//! Part of gpucap-core, used by the shim and the CLI: plain safe Rust that only needs
//! `crate::size`. The variables are read by name from the pairs given (no envy: it
//! would only copy the same strings into a struct).
//!
//! Any error is returned as a [`ConfigError`]; callers must fail closed (refuse to start,
//! or refuse every allocation), never fall back to running uncapped.

mod ceiling;
mod device_cap;
mod env;
mod file;
mod hami;
mod keys;
mod limit;
mod pool_vars;
mod shares;
mod sources;
mod typed;
mod vars;

pub use ceiling::*;
pub use device_cap::*;
pub use env::*;
pub use file::*;
pub use hami::*;
pub use keys::*;
pub use limit::*;
pub use pool_vars::*;
pub use shares::*;
pub use sources::*;
pub use typed::*;
pub use vars::*;

#[cfg(test)]
mod tests;
