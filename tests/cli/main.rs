//! The `gpucap` command line: `run`, `check`, its conventions and GPU keys, `status`,
//! `top` and what they make of the files others write, usage reports, and the metrics
//! in Prometheus's format with the monitoring files that read them.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod check_ceilings;
mod cli;
mod cli_conventions;
mod cli_gpu_keys;
mod metrics;
mod metrics_users;
mod monitoring;
mod never_uncapped_cli;
mod readers;
mod readers_descriptors;
mod readers_opening;
mod readers_swapped;
mod report;
mod watching;
mod watching_terminals;
