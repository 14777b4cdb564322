//! Green contexts (CUDA 12.4): a partition of a device's multiprocessors
//! (`cuDeviceGetDevResource`, `cuDevSmResourceSplitByCount`), a descriptor of one
//! (`cuDevResourceGenerateDesc`), and the green contexts made with it. A green context
//! retains the device's primary context for its life (NVIDIA's documentation of
//! `cuGreenCtxCreate`: "This API will retain the primary context on device dev, which
//! will is released when the green context is destroyed"), shares its memory, and is
//! used through the handle `cuCtxFromGreenCtx` gives: here the primary context's own
//! (the fake runs no kernel, so a partition changes nothing it does). What a green
//! context takes of its own is `FAKECUDA_GREEN_CTX_MEM` (default 0: not recorded).

use super::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use super::ctx::Ctx;
use super::os::new_handle;
use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUresult};

/// The fake device's multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
pub const SMS: u32 = 132;
/// The smallest partition and its alignment on compute capability 9.0 ("the minimum count
/// is 8 SMs and must be a multiple of 8", NVIDIA's guideline for `cuDevSmResourceSplitByCount`).
pub const MIN_PARTITION: u32 = 8;
pub const ALIGNMENT: u32 = 8;
/// `CU_DEV_RESOURCE_TYPE_SM`.
pub const TYPE_SM: u32 = 1;

/// `CUdevResource` as CUDA 13's `cuda.h` lays it out (144 bytes; CUDA 12.4's has the same
/// size and the SM fields at the same offsets): the type, padding, the SM resource's
/// fields in a 40-byte union, then `nextResource`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DevResource {
    pub ty: u32,
    pub padding: [u8; 92],
    pub sm_count: u32,
    pub min_partition: u32,
    pub alignment: u32,
    pub flags: u32,
    pub rest: [u8; 24],
    pub next: usize,
}

const _: () = assert!(std::mem::size_of::<DevResource>() == 144);

impl DevResource {
    /// An SM resource of `sms` multiprocessors.
    pub fn sm(sms: u32) -> DevResource {
        DevResource {
            ty: TYPE_SM,
            padding: [0; 92],
            sm_count: sms,
            min_partition: MIN_PARTITION,
            alignment: ALIGNMENT,
            flags: 0,
            rest: [0; 24],
            next: 0,
        }
    }
}

/// The size of each partition `cuDevSmResourceSplitByCount` makes for `min_count`: at least
/// the minimum, rounded up to the alignment.
pub fn partition_size(min_count: u32) -> u32 {
    min_count.max(MIN_PARTITION).div_ceil(ALIGNMENT) * ALIGNMENT
}

/// A green context: its device, its multiprocessors, the primary context it retains.
#[derive(Clone, Copy)]
pub struct Green {
    pub dev: usize,
    pub sms: u32,
    pub primary: Ctx,
}

#[derive(Default)]
struct Registry {
    /// Descriptors: handle -> multiprocessors.
    descs: HashMap<usize, u32>,
    greens: HashMap<usize, Green>,
    /// Streams made in a green context (`cuGreenCtxStreamCreate`): stream -> green context.
    streams: HashMap<usize, usize>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A descriptor of `sms` multiprocessors.
pub fn new_desc(sms: u32) -> usize {
    let h = new_handle();
    registry().descs.insert(h, sms);
    h
}

/// The multiprocessors descriptor `desc` holds.
pub fn desc(desc: usize) -> Result<u32, CUresult> {
    registry()
        .descs
        .get(&desc)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Records a green context made; its handle.
pub fn insert(green: Green) -> usize {
    let h = new_handle();
    registry().greens.insert(h, green);
    h
}

/// Green context `h`.
pub fn get(h: usize) -> Result<Green, CUresult> {
    registry()
        .greens
        .get(&h)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// Green context `h` destroyed: what it was; its streams forget it.
pub fn remove(h: usize) -> Result<Green, CUresult> {
    let mut reg = registry();
    let g = reg.greens.remove(&h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    reg.streams.retain(|_, green| *green != h);
    Ok(g)
}

/// Stream `stream` was made in green context `green`.
pub fn stream_made(stream: usize, green: usize) {
    registry().streams.insert(stream, green);
}

/// The green context stream `stream` was made in (0: none).
pub fn of_stream(stream: usize) -> usize {
    registry().streams.get(&stream).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_at_least_eight_multiprocessors_in_eights() {
        assert_eq!(partition_size(0), 8);
        assert_eq!(partition_size(8), 8);
        assert_eq!(partition_size(9), 16);
        assert_eq!(partition_size(66), 72);
    }
}
