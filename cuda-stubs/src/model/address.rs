//! What an address is: device memory of any kind (linear allocations, VMM mappings, opened
//! IPC mappings) or pinned host memory. Copies and memsets check their ranges here, and
//! the pointer queries read what is known of an address.

use super::ctx::{Ctx, current};
use super::linear::{self, Kind};
use super::{host, ipc, vmm};
use crate::abi::types::CUdeviceptr;
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CuResult};

/// What cuPointerGetAttribute knows about a pointer.
#[derive(Debug, Clone, Copy)]
pub struct PtrInfo {
    pub base: usize,
    pub size: usize,
    /// The address range the pointer is in (`RANGE_START_ADDR`, `RANGE_SIZE`): the
    /// allocation, or for a VMM mapping its whole reservation (the real driver's answer).
    pub range: (usize, usize),
    pub dev: usize,
    pub ctx: Ctx,
    pub managed: bool,
    pub pool: usize,
    pub id: u64,
    pub host: bool,
    /// A plain `cuMemAlloc*` allocation: what the real driver calls legacy-IPC and
    /// GPUDirect-RDMA capable (both 1 on an H200 with driver 580).
    pub plain: bool,
}

/// The allocation, mapping or pinned range `ptr` lies in.
pub fn pointer_info(ptr: usize) -> Option<PtrInfo> {
    if let Some((base, a)) = linear::lookup(ptr) {
        let pool = if let Kind::Pool(p) = a.kind { p } else { 0 };
        return Some(PtrInfo {
            base,
            size: a.size as usize,
            range: (base, a.size as usize),
            dev: a.dev,
            ctx: a.ctx,
            managed: a.kind == Kind::Managed,
            pool,
            id: a.id,
            host: false,
            plain: a.kind == Kind::Device,
        });
    }
    let current_ctx = || current().map(|c| c.0).unwrap_or(0);
    if let Some((base, m)) = vmm::mapping_at(ptr) {
        return Some(PtrInfo {
            base,
            size: m.size,
            range: vmm::reservation_at(ptr).unwrap_or((base, m.size)),
            dev: m.dev,
            ctx: current_ctx(),
            managed: false,
            pool: 0,
            id: m.handle,
            host: false,
            plain: false,
        });
    }
    if let Some((base, o)) = ipc::opened_at(ptr) {
        return Some(PtrInfo {
            base,
            size: o.size,
            range: (base, o.size),
            dev: o.dev,
            ctx: current_ctx(),
            managed: false,
            pool: 0,
            id: o.key.1,
            host: false,
            plain: false,
        });
    }
    host::lookup(ptr).map(|(base, size)| PtrInfo {
        base,
        size,
        range: (base, size),
        dev: 0,
        ctx: current_ctx(),
        managed: false,
        pool: 0,
        id: base as u64,
        host: true,
        plain: false,
    })
}

/// Checks that [ptr, ptr+n) is memory the caller may access: device memory (with write
/// access to VMM mappings if `write`) or pinned host memory.
pub fn check_range(ptr: CUdeviceptr, n: usize, write: bool) -> CuResult {
    let ptr = ptr as usize;
    let end = ptr.checked_add(n).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if let Some((base, a)) = linear::lookup(ptr) {
        return if end <= base + a.len {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    if vmm::check_range(ptr, n, write) {
        return Ok(());
    }
    if let Some((base, o)) = ipc::opened_at(ptr) {
        return if end <= base + o.size {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    if host::lookup(ptr).is_some_and(|(b, len)| end <= b + len) {
        return Ok(());
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}
