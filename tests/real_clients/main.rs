//! Real, unmodified clients on the fake GPU (cudarc, cuda-bindings, CuPy, numba, the NVML tools
//! gpustat and nvitop), and the fake
//! GPU held to a real driver's recorded answers.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;
mod cupy;
mod driver_answers;
mod numba;
mod nvml_tools;
mod python_client;
mod real_clients;
mod scenarios;
