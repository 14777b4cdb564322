//! Pools (`GPUCAP_POOL`): one budget per GPU shared by several processes, its life and
//! its resizing, NVML in a pool, the pool in the command line, the pool under storms
//! and stress, and the prototype of a claim's words in a sealed memfd.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;

mod pool;
mod pool_claim;
mod pool_cli;
mod pool_descriptors;
mod pool_lifecycle;
mod pool_many;
mod pool_memfd;
mod pool_nvml;
mod pool_resize;
mod pool_storm;
mod pool_stress;
