//! The scripts that measure and their published figures: the benchmarks
//! (scripts/bench/), the step profile, and the real-GPU proof and device run
//! (scripts/gpu-check.sh, scripts/gpu-run.sh) on the fake GPU through stand-ins.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;

mod bench_breakdown;
mod bench_hami;
mod bench_instructions;
mod bench_raise;
mod bench_start;
mod gpu_check;
mod gpu_run;
mod join_faults;
mod step_profile;
