//! The processes NVML lists on a device (`nvmlDeviceGet*RunningProcesses`,
//! `nvmlDeviceGetProcessesUtilizationInfo`): its structs as NVML lays them out, the
//! count protocol, and a pool's GPU with its live members holding memory of it.

use crate::budget::PoolView;

/// `nvmlProcessInfo_v1_t`: what `nvmlDeviceGetComputeRunningProcesses` fills (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlProcessV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_v2_t`: what `nvmlDeviceGetComputeRunningProcesses_v2` fills, and
/// `_v3` too (its `nvmlProcessInfo_t` is the same 24 bytes; the r535 headers briefly
/// gave it a fifth field, `usedGpuCcProtectedMemory`, since moved to
/// `nvmlProcessDetail_v1_t`; `nvidia-ml-py` reads `_v3` with this layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlProcessV2 {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// `nvmlProcessDetail_v1_t`: an entry of `nvmlDeviceGetRunningProcessDetailList`'s
/// list (r550 and later; `nvidia-smi` 580 lists a GPU's processes with it).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlProcessDetailV1 {
    pub pid: u32,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub used_gpu_cc_protected_memory: u64,
}

/// `nvmlProcessDetailList_v1_t`'s `version` (`NVML_STRUCT_VERSION(ProcessDetailList, 1)`:
/// its size, 24, with 1 in the top byte).
pub const PROCESS_DETAIL_LIST_V1: u32 = 0x0100_0018;
/// `nvmlProcessMode_t`: `NVML_PROCESS_MODE_COMPUTE` and `NVML_PROCESS_MODE_ALL` are the
/// modes that list compute processes (graphics and MPS are the others).
pub const PROCESS_MODE_COMPUTE: u32 = 0;
pub const PROCESS_MODE_ALL: u32 = 3;

const _: () = assert!(std::mem::size_of::<NvmlProcessV1>() == 16);
const _: () = assert!(std::mem::size_of::<NvmlProcessV2>() == 24);
const _: () = assert!(std::mem::size_of::<NvmlProcessDetailV1>() == 32);

/// The GPU and compute instance ids NVML gives a process outside MIG (`0xFFFFFFFF`).
pub const NO_INSTANCE: u32 = u32::MAX;

/// An NVML process struct, made from a pid, its bytes and (on a MIG device) the GPU and
/// compute instance ids.
pub trait ProcessInfo: Copy {
    fn new(pid: u32, used: u64, instance: Option<(u32, u32)>) -> Self;
}

impl ProcessInfo for NvmlProcessV1 {
    fn new(pid: u32, used: u64, _instance: Option<(u32, u32)>) -> Self {
        NvmlProcessV1 {
            pid,
            used_gpu_memory: used,
        }
    }
}

impl ProcessInfo for NvmlProcessV2 {
    fn new(pid: u32, used: u64, instance: Option<(u32, u32)>) -> Self {
        let (gi, ci) = instance.unwrap_or((NO_INSTANCE, NO_INSTANCE));
        NvmlProcessV2 {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: gi,
            compute_instance_id: ci,
        }
    }
}

impl ProcessInfo for NvmlProcessDetailV1 {
    fn new(pid: u32, used: u64, instance: Option<(u32, u32)>) -> Self {
        let (gi, ci) = instance.unwrap_or((NO_INSTANCE, NO_INSTANCE));
        NvmlProcessDetailV1 {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: gi,
            compute_instance_id: ci,
            used_gpu_cc_protected_memory: 0,
        }
    }
}

/// What `nvmlDeviceGet*RunningProcesses` answers for `n` processes, given the caller's
/// `*infoCount` (`room`) and whether it passed an array: NVML's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Write the `n` entries, `*infoCount = n`, `NVML_SUCCESS` (also for none, with or
    /// without an array: "NVML_SUCCESS if none are running").
    Write(u32),
    /// `*infoCount = n`, `NVML_ERROR_INSUFFICIENT_SIZE`, nothing written: the array is
    /// smaller than `n` (the size query passes `*infoCount = 0` and no array).
    TooSmall(u32),
}

pub fn listing(n: usize, room: u32, array: bool) -> Listing {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    if n == 0 {
        Listing::Write(0)
    } else if !array || room < n {
        Listing::TooSmall(n)
    } else {
        Listing::Write(n)
    }
}

/// One GPU of a pool (`GPUCAP_POOL`) as NVML shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolGpu {
    /// The cap every member holds it to (None: no cap).
    pub cap: Option<u64>,
    /// Bytes held by all members, including members that died and whose share no member
    /// took back yet.
    pub used: u64,
    /// `(pid, bytes)` of each live member holding memory of it, as the member recorded
    /// its pid (in its own PID namespace), in slot order.
    pub processes: Vec<(u32, u64)>,
}

/// The GPU `uuid` of the pool `view`; None when the pool has no such GPU.
pub fn pool_gpu(view: &PoolView, uuid: &[u8; 16]) -> Option<PoolGpu> {
    let gpu = view.gpus.iter().find(|g| &g.raw_uuid == uuid)?;
    let processes = view
        .members
        .iter()
        .filter(|m| m.alive)
        .filter_map(|m| {
            let used = m.gpus.iter().find(|g| &g.raw_uuid == uuid)?.used;
            (used > 0).then_some((m.pid, used))
        })
        .collect();
    Some(PoolGpu {
        cap: gpu.cap,
        used: gpu.used,
        processes,
    })
}
