//! gpucap-core: the safe core of gpucap, shared by the shim (`libgpucap.so`), the CLI
//! (`gpucap`) and the fake GPU. Plain safe Rust with unit tests; no FFI, no libc.
//!
//! - `size`: byte sizes, the Kubernetes quantity grammar, `format_bytes`.
//! - `config`: the `GPUCAP_*` configuration and the `gpucap.env` file.
//! - `ledger`: caps, reservations, peaks; `live_map`: the live allocations (lock-free,
//!   growable); `linear`: what a linear allocation is charged (the driver's pages).
//! - `growth`: growth-only mode's retained pages and mappings.
//! - `pools`, `contexts`, `arrays`, `modules`, `graphs`: what memory pools, contexts, CUDA arrays, graph memory
//!   and loaded modules are charged, behind small driver traits; `vmm`: when VMM
//!   handles stop being charged (last release and last unmap).
//! - `identity`: GPU/MIG UUID keys to CUDA ordinals; `nvml`: NVML devices to CUDA ones;
//!   `pid_namespace`: the pid NVML lists a process under, where provable.
//! - `report`: the `GPUCAP_REPORT` JSON file (schema, merge, `%p`).
//! - `budget`: the budget a `GPUCAP_POOL`'s processes share (its file's words).
//! - `lone`: the file a process capped on its own shows itself through (its ledger's
//!   figures, mapped).
#![forbid(unsafe_code)]

pub mod arrays;
pub mod budget;
pub mod config;
pub mod contexts;
pub mod counter;
pub mod graphs;
pub mod growth;
pub mod identity;
pub mod kernels;
pub mod ledger;
pub mod limits;
pub mod linear;
pub mod live_map;
pub mod lone;
pub mod modules;
pub mod nvml;
pub mod pid_namespace;
pub mod pools;
pub mod refusal_lines;
pub mod report;
pub mod residents;
pub mod size;
pub mod vmm;
