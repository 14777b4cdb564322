//! gpucap where it is deployed: real container runtimes, the image's entrypoint, the
//! Kubernetes examples (DRA included) and the Python wheel.
//!
//! One test binary of the suite (docs/src/fake-gpu.md, "The test suite"); each module is
//! a file of this folder, and its tests are named `<module>::<test>`.

#[path = "../common/mod.rs"]
mod common;

mod containers;
mod entrypoint;
mod k8s;
mod k8s_dra;
mod wheel;
