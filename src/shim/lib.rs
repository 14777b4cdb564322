//! libgpucap: an `LD_PRELOAD` shim that caps the device memory an unmodified CUDA
//! program may take. See README.md.
//!
//! Safe Rust, unit-tested:
//! - `config`, `size`: the `GPUCAP_*` configuration (shared with the CLI).
//! - `ledger`: caps, reservations, live allocations, peaks.
//! - `shim`: process-wide state tying configuration and ledger together.
//! - `growth`: growth-only mode's retained pages and mappings.
//! - `pools`, `contexts`, `arrays`: what memory pools, contexts and CUDA arrays are
//!   charged, behind small driver traits; `vmm`: when VMM handles stop being charged
//!   (last release and last unmap).
//! - `identity`: GPU/MIG UUID keys to CUDA ordinals; `nvml`: NVML devices to CUDA ones.
//! - `report`: the `GPUCAP_REPORT` JSON file (schema, merge, `%p`).
//!
//! The FFI edge:
//! - `ffi`: the table of hooked symbols, the exported symbols, `dlsym` and
//!   `cuGetProcAddress`; `real`: the driver traits over the real driver.
//! - `hooks`: what each intercepted driver call does; `arena`: growth mode's driver calls.

// The unit-test build leaves out the FFI edge (it exports `dlsym` and the driver's
// symbols, which must not interpose on the test binary itself), so the process-wide
// state that only the FFI edge uses looks dead there.
#![cfg_attr(test, allow(dead_code, unused_imports))]

mod shim;

#[cfg(not(test))]
mod arena;
#[cfg(not(test))]
mod ffi;
#[cfg(not(test))]
mod hooks;
#[cfg(not(test))]
mod real;
