//! The cap in one process, on the fake GPU: where it comes from (the environment, a
//! configuration file, HAMi-core's variables, the cluster's drivers, GPU keys), every way
//! a program reaches the driver's memory (interception, contexts, graphs, VMM, pools,
//! growth mode, NVML), and that no input or shared file crashes or uncaps it.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;

mod ceilings;
mod context_charge;
mod contexts;
mod coverage;
mod deepbind;
mod device_tracking;
mod driver_edges;
mod escapes;
mod graphs;
mod growth;
mod growth_small;
mod hami;
mod handover;
mod hostile_config;
mod identity;
mod interception;
mod never_uncapped;
mod nvml;
mod nvml_pids;
mod process_tree;
mod robustness;
mod secure_execution;
mod shared_files;
mod true_words;
mod two_copies;
