//! fake-gpu: what the fake `libcuda.so.1` (cuda-stubs) and the fake `libnvidia-ml.so.1`
//! (cuda-stubs/nvml) share, so that both show the same devices.
//!
//! - `config`: the FAKECUDA_* variables and CUDA_VISIBLE_DEVICES, read once
//! - `identity`: UUIDs, names, PCI bus ids, CUDA_VISIBLE_DEVICES parsing
//! - `shared`: the FAKECUDA_SHARED state file (memory of every process sharing the devices)
//! - `stubs_doc`: the check of STUBS.md against the stubs a build generated (for tests)
//! - `trace`: FAKECUDA_TRACE and the one-line log both write to stderr

pub mod config;
pub mod identity;
pub mod shared;
pub mod stubs_doc;
pub mod trace;

// Byte sizes (FAKECUDA_TOTAL_MEM, FAKECUDA_CONTEXT_MEM) use gpucap's size grammar.
use gpucap_core::size;
