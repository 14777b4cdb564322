//! Growth-only mode (`GPUCAP_GROWTH=1`): device memory the program frees stays with
//! the process and serves its later allocations. Placeholder: being written.

/// Bytes this process retains on `device` without a live allocation in them.
pub fn retained_bytes(_device: usize) -> u64 {
    0
}
