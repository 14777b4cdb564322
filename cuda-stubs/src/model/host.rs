//! Pinned host memory (cuMemAllocHost, cuMemHostAlloc, cuMemHostRegister): plain host
//! mappings or the caller's own memory, never device memory.

use std::collections::BTreeMap;
use std::sync::Mutex;

use std::sync::LazyLock;

use super::os::{map_anonymous, page_size, unmap};
use crate::abi::{
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult, CuResult,
};

#[derive(Debug, Clone, Copy)]
struct HostRange {
    len: usize,
    /// cuMemHostRegister'ed caller memory (not ours to unmap).
    registered: bool,
}

static HOST: LazyLock<Mutex<BTreeMap<usize, HostRange>>> = LazyLock::new(Default::default);

fn host() -> std::sync::MutexGuard<'static, BTreeMap<usize, HostRange>> {
    HOST.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pinned range containing `ptr`: (base, length).
pub fn lookup(ptr: usize) -> Option<(usize, usize)> {
    let m = host();
    let (&b, r) = m.range(..=ptr).next_back()?;
    (ptr < b + r.len).then_some((b, r.len))
}

/// Maps `size` (> 0) bytes of pinned host memory, rounded up to pages; its address.
pub fn alloc(size: usize) -> Result<usize, CUresult> {
    let page = page_size();
    let len = size.checked_add(page - 1).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? / page * page;
    let p = map_anonymous(len).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    host().insert(
        p,
        HostRange {
            len,
            registered: false,
        },
    );
    Ok(p)
}

/// Unmaps pinned memory this library mapped (cuMemFreeHost); CUDA_ERROR_INVALID_VALUE for
/// anything else, registered memory included.
pub fn free(p: usize) -> CuResult {
    let mut h = host();
    match h.get(&p) {
        Some(r) if !r.registered => {
            let len = r.len;
            h.remove(&p);
            drop(h);
            unmap(p, len);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Registers the caller's memory [start, end) as pinned (cuMemHostRegister);
/// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED if it overlaps a pinned range.
pub fn register(start: usize, end: usize) -> CuResult {
    let mut h = host();
    let overlaps = h
        .range(..end)
        .next_back()
        .is_some_and(|(&b, r)| b + r.len > start);
    if overlaps {
        return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    h.insert(
        start,
        HostRange {
            len: end - start,
            registered: true,
        },
    );
    Ok(())
}

/// Forgets registered memory starting at `p` (cuMemHostUnregister);
/// CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED if none does.
pub fn unregister(p: usize) -> CuResult {
    let mut h = host();
    match h.get(&p) {
        Some(r) if r.registered => {
            h.remove(&p);
            Ok(())
        }
        _ => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
    }
}
