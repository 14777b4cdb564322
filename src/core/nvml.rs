//! What NVML reports under a cap (`nvmlDeviceGetMemoryInfo`, `_v2`), so that
//! `nvidia-smi`, `nvidia-ml-py`/`pynvml` and the frameworks that read NVML agree with
//! `cuMemGetInfo`: the total is the cap, the free memory the same capped figure
//! `cuMemGetInfo` shows for the device, and used the rest (`_v2`'s reserved is 0 under a
//! cap: see [`capped_v2`]).
//!
//! The NVML device is matched to a CUDA ordinal by UUID (see `identity`); a GPU that
//! CUDA does not see in this process, or one without a cap, is shown as the driver
//! reports it.
//!
//! Reading NVML never initialises CUDA (nor loads it): a monitor such as `nvidia-smi`
//! is not a CUDA process and must not become one. When the process itself initialised
//! CUDA, the driver says which devices it sees. Otherwise [`cuda_view`] works out what
//! CUDA would see from NVML's own enumeration and `CUDA_VISIBLE_DEVICES`, as the
//! driver reads it; the approximation is CUDA's device order (see `cuda_view`).
//!
//! In a pool (`GPUCAP_POOL`), a GPU of the pool shows the pool's figures ([`within_pool`]:
//! what every member holds counts as used) and `nvmlDeviceGetComputeRunningProcesses`
//! lists the pool's live members holding memory of it ([`pool_gpu`], [`listing`]).

use crate::budget::PoolView;

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`: `total = reserved + used + free`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NvmlMemoryV2 {
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// An NVML memory struct: the driver's figures, and the same struct under a cap.
pub trait MemoryInfo: Copy {
    /// `(free, total)` as the driver reported them.
    fn free_total(&self) -> (u64, u64);
    /// The struct with `(free, total)` as the program should see them.
    fn capped(self, free_total: (u64, u64)) -> Self;
}

impl MemoryInfo for NvmlMemory {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn capped(self, free_total: (u64, u64)) -> Self {
        capped(self, free_total)
    }
}

impl MemoryInfo for NvmlMemoryV2 {
    fn free_total(&self) -> (u64, u64) {
        (self.free, self.total)
    }
    fn capped(self, free_total: (u64, u64)) -> Self {
        capped_v2(self, free_total)
    }
}

/// The v1 figures given the capped `(free, total)` `cuMemGetInfo` would show.
pub fn capped(_driver: NvmlMemory, (free, total): (u64, u64)) -> NvmlMemory {
    NvmlMemory {
        total,
        free,
        used: total - free.min(total),
    }
}

/// The v2 figures: as v1's, with nothing reserved. The driver's reserved memory lies
/// outside what gpucap charges, so inside a cap every byte that is not free is used by
/// the program (or the pool): `used` agrees with v1's, with `cuMemGetInfo` and with the
/// pool's figure. Keeping the driver's reserved (614 MiB on an H200, driver 580) made
/// `nvidia-smi`, which reads `_v2`, show a pool's used that much below what its members
/// hold (seen on an H200 by the real-GPU check `pool-pidns`).
pub fn capped_v2(driver: NvmlMemoryV2, (free, total): (u64, u64)) -> NvmlMemoryV2 {
    let free = free.min(total);
    NvmlMemoryV2 {
        version: driver.version,
        total,
        reserved: 0,
        free,
        used: total - free,
    }
}

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

/// `(free, total)` of a pool's GPU capped at `cap` of which the pool's members hold
/// `pool_used`: total = min(physical, cap), free = min(physical free, cap - pool used).
pub fn within_pool((free, total): (u64, u64), cap: u64, pool_used: u64) -> (u64, u64) {
    let total = total.min(cap);
    (free.min(cap.saturating_sub(pool_used)).min(total), total)
}

/// `nvmlPciInfo_t` (`nvmlDeviceGetPciInfo_v3`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub bus_id: [u8; 32],
}

/// A GPU as NVML enumerates it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlGpu {
    pub uuid: [u8; 16],
    /// `(domain, bus, device)`, when NVML gives it.
    pub pci: Option<(u32, u32, u32)>,
    /// With MIG mode on: its MIG devices (else None).
    pub migs: Option<Vec<NvmlMig>>,
}

/// A MIG device of a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlMig {
    pub uuid: [u8; 16],
    /// GPU and compute instance ids, when NVML gives them (the legacy
    /// `MIG-GPU-<uuid>/<gi>/<ci>` spelling names them).
    pub gi_ci: Option<(u32, u32)>,
}

/// `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase, as NVML prints UUIDs (an
/// empty prefix: the bare `xxxxxxxx-…`, as the driver's export tables are named). Digit
/// by digit, not through `format!` (a tenth of the instructions: the first context's
/// measurement formats one, and so does every NVML lookup by UUID on the fake GPU).
pub fn uuid_text(prefix: &str, u: &[u8; 16]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(prefix.len() + 37);
    s.push_str(prefix);
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) || (i == 0 && !prefix.is_empty()) {
            s.push('-');
        }
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// The UUIDs of the devices CUDA would number 0, 1, ... in this process, worked out
/// without CUDA from NVML's GPUs and `CUDA_VISIBLE_DEVICES` (`visible`), as the driver
/// reads that variable:
///
/// - CUDA's devices are the GPUs in PCI bus order (NVML's order when a GPU's PCI
///   address is unknown), a GPU in MIG mode standing for its MIG devices;
/// - unset: all of them; set: a comma list of indices (into that GPU order), `GPU-…`
///   and `MIG-…` UUIDs or any prefix naming exactly one (case-insensitive), and the
///   legacy `MIG-GPU-<uuid>/<gi>/<ci>`; an index or GPU UUID of a GPU in MIG mode names
///   its first MIG device. The list ends at the first entry naming no device (empty,
///   out of range, negative, unknown or ambiguous) or one already listed. Set but
///   empty: no devices.
///
/// The approximation: CUDA orders devices by `CUDA_DEVICE_ORDER`, `FASTEST_FIRST` by
/// default, which is PCI order only when the GPUs are alike (`PCI_BUS_ID` is exact).
/// On a machine with different GPUs, an NVML-only process may match ordinal keys (and
/// indices in `CUDA_VISIBLE_DEVICES`) to other GPUs than CUDA would; UUID keys and UUID
/// entries are exact.
pub fn cuda_view(gpus: &[NvmlGpu], visible: Option<&str>) -> Vec<[u8; 16]> {
    let mut gpus: Vec<&NvmlGpu> = gpus.iter().collect();
    if gpus.iter().all(|g| g.pci.is_some()) {
        gpus.sort_by_key(|g| g.pci);
    }
    let stands_for = |g: &NvmlGpu| -> Vec<[u8; 16]> {
        match &g.migs {
            Some(migs) => migs.iter().map(|m| m.uuid).collect(),
            None => vec![g.uuid],
        }
    };
    let Some(list) = visible else {
        return gpus.iter().flat_map(|g| stands_for(g)).collect();
    };
    let mut out: Vec<[u8; 16]> = Vec::new();
    for entry in list.split(',') {
        match visible_entry(&gpus, entry.trim()) {
            Some(u) if !out.contains(&u) => out.push(u),
            _ => break,
        }
    }
    out
}

/// The device one `CUDA_VISIBLE_DEVICES` entry names.
fn visible_entry(gpus: &[&NvmlGpu], e: &str) -> Option<[u8; 16]> {
    let first_of = |g: &NvmlGpu| match &g.migs {
        Some(migs) => migs.first().map(|m| m.uuid),
        None => Some(g.uuid),
    };
    if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
        let i: usize = e.parse().ok()?;
        return gpus.get(i).and_then(|g| first_of(g));
    }
    let lower = e.to_ascii_lowercase();
    let unique = |mut hits: Vec<[u8; 16]>| (hits.len() == 1).then(|| hits.remove(0));
    if let Some(rest) = lower.strip_prefix("mig-gpu-") {
        let (uuid, ids) = rest.split_once('/')?;
        let (gi, ci) = ids.split_once('/')?;
        let ids = (gi.parse::<u32>().ok()?, ci.parse::<u32>().ok()?);
        let full = format!("gpu-{uuid}");
        let g = gpus.iter().find(|g| uuid_text("gpu", &g.uuid) == full)?;
        let migs = g.migs.as_ref()?;
        return migs.iter().find(|m| m.gi_ci == Some(ids)).map(|m| m.uuid);
    }
    if lower.starts_with("mig-") && lower.len() > 4 {
        return unique(
            gpus.iter()
                .flat_map(|g| g.migs.iter().flatten())
                .filter(|m| uuid_text("mig", &m.uuid).starts_with(&lower))
                .map(|m| m.uuid)
                .collect(),
        );
    }
    if lower.starts_with("gpu-") && lower.len() > 4 {
        let hits: Vec<&&NvmlGpu> = gpus
            .iter()
            .filter(|g| uuid_text("gpu", &g.uuid).starts_with(&lower))
            .collect();
        return match hits.as_slice() {
            [g] => first_of(g),
            _ => None,
        };
    }
    None
}

/// `(free, total)` under a cap of `cap` bytes for a process that holds nothing on the
/// device (it has not initialised CUDA): what `cuMemGetInfo` would show it.
pub fn within_cap((free, total): (u64, u64), cap: u64) -> (u64, u64) {
    let total = total.min(cap);
    (free.min(total), total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    #[test]
    fn uuid_text_spells_nvml_uuids() {
        let u: [u8; 16] = std::array::from_fn(|i| (i as u8) * 0x11);
        assert_eq!(
            uuid_text("GPU", &u),
            "GPU-00112233-4455-6677-8899-aabbccddeeff"
        );
        assert_eq!(
            uuid_text("MIG", &[0xff; 16]),
            "MIG-ffffffff-ffff-ffff-ffff-ffffffffffff"
        );
        assert_eq!(uuid_text("", &u), "00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn v1_shows_the_cap() {
        let driver = NvmlMemory {
            total: 80 * GI,
            free: 70 * GI,
            used: 10 * GI,
        };
        assert_eq!(
            capped(driver, (3 * GI, 4 * GI)),
            NvmlMemory {
                total: 4 * GI,
                free: 3 * GI,
                used: GI
            }
        );
        assert_eq!(capped(driver, (5 * GI, 4 * GI)).used, 0, "never negative");
    }

    #[test]
    fn v2_reserves_nothing_inside_the_cap() {
        let driver = NvmlMemoryV2 {
            version: 0x0200_0028,
            total: 80 * GI,
            reserved: GI / 2,
            free: 70 * GI,
            used: 9 * GI,
        };
        let v = capped_v2(driver, (3 * GI, 4 * GI));
        assert_eq!(
            v,
            NvmlMemoryV2 {
                version: 0x0200_0028,
                total: 4 * GI,
                reserved: 0,
                free: 3 * GI,
                used: GI
            }
        );
        let v1 = capped(
            NvmlMemory {
                total: 80 * GI,
                free: 70 * GI,
                used: 10 * GI,
            },
            (3 * GI, 4 * GI),
        );
        assert_eq!(v.used, v1.used, "v1 and v2 agree on used");
        assert_eq!(
            capped_v2(driver, (5 * GI, 4 * GI)).used,
            0,
            "never negative"
        );
    }

    fn u(n: u8, mig: bool) -> [u8; 16] {
        let mut u = [0u8; 16];
        u[0] = 0xfa;
        u[1] = 0xce;
        u[3] = mig as u8;
        u[15] = n;
        u
    }

    /// GPUs 0..n, PCI bus n+1, MIG on for those in `mig`.
    fn gpus(n: u8, mig: &[u8]) -> Vec<NvmlGpu> {
        (0..n)
            .map(|i| NvmlGpu {
                uuid: u(i, false),
                pci: Some((0, i as u32 + 1, 0)),
                migs: mig.contains(&i).then(|| {
                    vec![NvmlMig {
                        uuid: u(i, true),
                        gi_ci: Some((0, 0)),
                    }]
                }),
            })
            .collect()
    }

    #[test]
    fn cuda_visible_devices_as_the_driver_reads_it() {
        let g = gpus(4, &[]);
        let v = |s: Option<&str>| cuda_view(&g, s);
        let ids = |n: &[u8]| n.iter().map(|&i| u(i, false)).collect::<Vec<_>>();
        assert_eq!(v(None), ids(&[0, 1, 2, 3]));
        assert_eq!(v(Some("2,0")), ids(&[2, 0]));
        assert_eq!(v(Some(" 1 , 3")), ids(&[1, 3]));
        assert_eq!(
            v(Some("0,2,-1,1")),
            ids(&[0, 2]),
            "cut at the first invalid entry"
        );
        assert_eq!(v(Some("4,0")), ids(&[]));
        assert_eq!(v(Some("")), ids(&[]), "set but empty: no devices");
        assert_eq!(v(Some("1,1,2")), ids(&[1]));
        assert_eq!(v(Some("0,,1")), ids(&[0]));
        assert_eq!(
            v(Some("GPU-face0000-0000-0000-0000-000000000002,0")),
            ids(&[2, 0])
        );
        assert_eq!(
            v(Some("gpu-FACE0000-0000-0000-0000-000000000003")),
            ids(&[3])
        );
        assert_eq!(
            v(Some("GPU-face0000-0000-0000-0000-00000000000")),
            ids(&[]),
            "a prefix must name exactly one GPU"
        );
        assert_eq!(v(Some("1,GPU-dead")), ids(&[1]));
        assert_eq!(v(Some("GPU-")), ids(&[]));
        assert_eq!(
            v(Some("MIG-face0001-0000-0000-0000-000000000001")),
            ids(&[]),
            "no MIG device without MIG mode"
        );
    }

    #[test]
    fn gpus_in_pci_order_whatever_nvml_lists_first() {
        let mut g = gpus(3, &[]);
        g.reverse();
        assert_eq!(cuda_view(&g, Some("0")), vec![u(0, false)]);
        // Without PCI addresses, NVML's order.
        for x in &mut g {
            x.pci = None;
        }
        assert_eq!(cuda_view(&g, Some("0")), vec![u(2, false)]);
    }

    #[test]
    fn mig_devices_are_cudas_devices() {
        let g = gpus(3, &[0, 2]);
        assert_eq!(
            cuda_view(&g, None),
            vec![u(0, true), u(1, false), u(2, true)]
        );
        assert_eq!(
            cuda_view(&g, Some("MIG-face0001-0000-0000-0000-000000000002,0,1")),
            vec![u(2, true), u(0, true), u(1, false)],
            "an index of a GPU in MIG mode names its MIG device"
        );
        assert_eq!(
            cuda_view(&g, Some("GPU-face0000-0000-0000-0000-000000000002")),
            vec![u(2, true)]
        );
        assert_eq!(
            cuda_view(
                &g,
                Some("MIG-GPU-face0000-0000-0000-0000-000000000000/0/0,1")
            ),
            vec![u(0, true), u(1, false)]
        );
        assert_eq!(
            cuda_view(&g, Some("MIG-GPU-face0000-0000-0000-0000-000000000000/1/0")),
            Vec::<[u8; 16]>::new()
        );
        assert_eq!(
            cuda_view(&g, Some("MIG-face0001")),
            Vec::<[u8; 16]>::new(),
            "ambiguous"
        );
    }

    /// A member: pid, alive, (GPU, bytes) held.
    type Held<'a> = (u32, bool, &'a [([u8; 16], u64)]);

    fn pool(members: &[Held]) -> PoolView {
        use crate::budget::{GpuView, MemberGpuView, MemberView};
        let gpu = |raw: [u8; 16], cap: Option<u64>, used: u64| GpuView {
            uuid: uuid_text("GPU", &raw),
            cap,
            used,
            peak: used,
            refusals: 0,
            largest_refused: 0,
            held_by_dead: 0,
            waiters: 0,
            waits: 0,
            wait_ms: 0,
            members_hold: used,
            drift: 0,
            cap_drift: false,
            lock: None,
            raw_uuid: raw,
            guaranteed: 0,
            share_drift: false,
        };
        let used_of = |raw: [u8; 16]| {
            members
                .iter()
                .flat_map(|m| m.2.iter())
                .filter(|g| g.0 == raw)
                .map(|g| g.1)
                .sum()
        };
        PoolView {
            slots: 256,
            version: 1,
            created: 0,
            gpus: vec![
                gpu(u(0, false), Some(GI), used_of(u(0, false))),
                gpu(u(1, false), None, used_of(u(1, false))),
            ],
            members: members
                .iter()
                .enumerate()
                .map(|(slot, &(pid, alive, gpus))| MemberView {
                    slot,
                    pid,
                    pid_namespace: 0,
                    command: String::new(),
                    start_ms: 0,
                    alive,
                    gpus: gpus
                        .iter()
                        .map(|&(raw, used)| MemberGpuView {
                            uuid: uuid_text("GPU", &raw),
                            used,
                            peak: used,
                            raw_uuid: raw,
                            guarantee: 0,
                            ceiling: None,
                            borrowed: used,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn a_pool_gpu_lists_its_live_members_holding_memory() {
        let (g0, g1) = (u(0, false), u(1, false));
        let view = pool(&[
            (100, true, &[(g0, 300 * MI)]),
            (101, true, &[(g0, 200 * MI), (g1, 5 * MI)]),
            (102, true, &[(g0, 0)]),        // a member holding nothing of it
            (103, false, &[(g0, 50 * MI)]), // died; not taken back yet
            (104, true, &[(g1, MI)]),
        ]);
        assert_eq!(
            pool_gpu(&view, &g0),
            Some(PoolGpu {
                cap: Some(GI),
                used: 550 * MI,
                processes: vec![(100, 300 * MI), (101, 200 * MI)],
            }),
            "the dead member's bytes stay in used until taken back, but it is not listed"
        );
        assert_eq!(
            pool_gpu(&view, &g1).map(|g| (g.cap, g.processes)),
            Some((None, vec![(101, 5 * MI), (104, MI)]))
        );
        assert_eq!(pool_gpu(&view, &u(2, false)), None, "not a GPU of the pool");
    }

    #[test]
    fn a_pool_gpu_shows_the_pool_used_within_the_cap() {
        // Physical 80 GiB, 70 free; cap 4 GiB of which the pool holds 1.5.
        assert_eq!(
            within_pool((70 * GI, 80 * GI), 4 * GI, 3 * GI / 2),
            (5 * GI / 2, 4 * GI)
        );
        // The physical GPU has less free than the cap leaves: that shows.
        assert_eq!(within_pool((GI, 80 * GI), 4 * GI, GI), (GI, 4 * GI));
        // Over the cap (a member died holding memory and the cap was lowered): 0 free.
        assert_eq!(within_pool((70 * GI, 80 * GI), 4 * GI, 5 * GI), (0, 4 * GI));
        // A GPU smaller than the cap.
        assert_eq!(within_pool((GI, 2 * GI), 4 * GI, 0), (GI, 2 * GI));
        // An empty pool shows what a process holding nothing sees.
        assert_eq!(
            within_pool((70 * GI, 80 * GI), 4 * GI, 0),
            within_cap((70 * GI, 80 * GI), 4 * GI)
        );
        let v1 = capped(
            NvmlMemory::default(),
            within_pool((70 * GI, 80 * GI), GI, 500 * MI),
        );
        assert_eq!(
            (v1.total, v1.used),
            (GI, 500 * MI),
            "v1 used = the pool's used"
        );
    }

    #[test]
    fn the_running_processes_count_protocol() {
        // The size query: *infoCount = 0, no array.
        assert_eq!(listing(2, 0, false), Listing::TooSmall(2));
        assert_eq!(listing(0, 0, false), Listing::Write(0), "SUCCESS if none");
        assert_eq!(listing(0, 0, true), Listing::Write(0));
        assert_eq!(listing(3, 2, true), Listing::TooSmall(3));
        assert_eq!(listing(3, 3, true), Listing::Write(3));
        assert_eq!(
            listing(3, 9, true),
            Listing::Write(3),
            "*infoCount = the number written"
        );
        assert_eq!(
            listing(3, 9, false),
            Listing::TooSmall(3),
            "no array to write to"
        );
    }

    #[test]
    fn process_structs_as_nvml_lays_them_out() {
        let p = <NvmlProcessV2 as ProcessInfo>::new(7, 9, None);
        assert_eq!(
            (p.gpu_instance_id, p.compute_instance_id),
            (NO_INSTANCE, NO_INSTANCE),
            "0xFFFFFFFF outside MIG"
        );
        let p = <NvmlProcessV2 as ProcessInfo>::new(7, 9, Some((1, 0)));
        assert_eq!(
            (
                p.pid,
                p.used_gpu_memory,
                p.gpu_instance_id,
                p.compute_instance_id
            ),
            (7, 9, 1, 0)
        );
        assert_eq!(std::mem::offset_of!(NvmlProcessV2, used_gpu_memory), 8);
        assert_eq!(std::mem::offset_of!(NvmlProcessV2, gpu_instance_id), 16);
        assert_eq!(std::mem::offset_of!(NvmlProcessV2, compute_instance_id), 20);
        assert_eq!(std::mem::offset_of!(NvmlProcessV1, used_gpu_memory), 8);
    }

    #[test]
    fn an_nvml_only_process_sees_the_cap() {
        assert_eq!(within_cap((70 * GI, 80 * GI), 4 * GI), (4 * GI, 4 * GI));
        assert_eq!(within_cap((GI, 80 * GI), 4 * GI), (GI, 4 * GI));
        assert_eq!(within_cap((GI, 2 * GI), 4 * GI), (GI, 2 * GI));
        assert_eq!(
            uuid_text("MIG", &u(9, true)),
            "MIG-face0001-0000-0000-0000-000000000009"
        );
    }
}
