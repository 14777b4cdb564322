//! libgpucap: an `LD_PRELOAD` shim that caps the device memory an unmodified CUDA
//! program may take. See README.md.
//!
//! - `config`, `size`: the `GPUCAP_*` configuration (shared with the CLI).
//! - `ledger`: caps, reservations, live allocations, peaks (safe Rust).
//! - `report`: the `GPUCAP_REPORT` JSON file (schema, merge, `%p`).
//! - `shim`: process-wide state tying configuration and ledger together.
//! - `growth`: growth-only mode's retained pages and mappings (safe Rust).
//! - `hooks`: what each intercepted driver call does; `arena`: growth mode's driver calls.
//! - `ffi`: the exported symbols, `dlsym` and `cuGetProcAddress` (the FFI edge).

mod arrays;
mod config;
mod contexts;
mod growth;
mod identity;
mod ledger;
mod nvml;
mod pools;
mod report;
mod shim;
mod size;

#[cfg(not(test))]
mod arena;
#[cfg(not(test))]
mod ffi;
#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
mod real;
