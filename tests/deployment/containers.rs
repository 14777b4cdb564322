//! gpucap in a real container runtime: podman (runc), a plain Debian image with no gpucap
//! in it, and the fake GPU bind-mounted where NVIDIA's container toolkit mounts
//! the real driver (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`, `libnvidia-ml.so.1`).
//!
//! - Each Kubernetes GPU driver's hand-over (docs/src/kubernetes.md), with exactly the
//!   variables and mounts that driver gives a container, and gpucap's library where the
//!   driver puts its own (HAMi, vgpu-manager) or injected by gpucap's CDI spec (the DRA
//!   example driver, NVIDIA's toolkit): the program is capped at the granted amount.
//! - One budget per claim: two containers of one claim and one of another, on one GPU,
//!   each as another user; a claim shared by an fsGroup, and a user outside it refused.
//! - `gpucap cdi generate`: podman's own CDI support (`--device gpucap.io/gpu=NAME`, the
//!   spec in a directory of the test's own, mounted over /run/cdi for that run) caps a container with no entrypoint; one without the device is
//!   untouched.
//! - scripts/Dockerfile.example builds (FROM the test's base image) and runs.
//! - Files and limits: a pool directory on a volume shared by containers of two users, a
//!   read-only root file system with a non-root user, and a container killed by the
//!   runtime while it holds memory (its bytes come back to the others).
//! - Docker: the example image built by `docker build` and run by a dockerd the tests
//!   start and stop (docker.rs).
//! - An image with an older glibc than the native build asks for: the portable build
//!   (scripts/build-portable.sh) caps there (old_glibc.rs).
//!
//! The runtime comes from scripts/dev/containers-setup.sh (scripts/test.sh runs it and exports
//! its variables: GPUCAP_TEST_PODMAN, GPUCAP_TEST_CONTAINERS_CONF,
//! GPUCAP_TEST_CONTAINERS_STORAGE_CONF, GPUCAP_TEST_CONTAINER_IMAGE,
//! GPUCAP_TEST_OLD_GLIBC_IMAGE and the portable build's GPUCAP_TEST_PORTABLE; for Docker
//! GPUCAP_TEST_DOCKERD, GPUCAP_TEST_DOCKER, GPUCAP_TEST_CONTAINER_BASE_TAR). Without them the
//! tests print `SKIP: ...` and pass, unless `CI` or `GPUCAP_TEST_REQUIRE_CLIENTS=1` is set:
//! then they fail.
//!
//! The tests are in tests/deployment/containers/: `runtime.rs` (podman, one `podman run` as a value,
//! the shared helpers), `drivers.rs`, `claims.rs`, `cdi.rs`, `files.rs` (the Dockerfile,
//! files and limits), `docker.rs` (Docker), `old_glibc.rs` (the portable build).

use super::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::pool_scratch::script;
use common::*;

#[path = "containers/cdi.rs"]
mod cdi;
#[path = "containers/claims.rs"]
mod claims;
#[path = "containers/docker.rs"]
mod docker;
#[path = "containers/drivers.rs"]
mod drivers;
#[path = "containers/files.rs"]
mod files;
#[path = "containers/old_glibc.rs"]
mod old_glibc;
#[path = "containers/runtime.rs"]
mod runtime;

use cdi::*;
use drivers::*;
use files::*;
use runtime::*;
