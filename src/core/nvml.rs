//! What NVML reports under a cap (`nvmlDeviceGetMemoryInfo`, `_v2`), so that
//! `nvidia-smi`, `nvidia-ml-py`/`pynvml` and the frameworks that read NVML agree with
//! `cuMemGetInfo`: the total is the cap, the free memory the same capped figure
//! `cuMemGetInfo` shows for the device, and used (plus, in `_v2`, reserved) the rest.
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

/// The v2 figures: the driver's reserved memory stays reserved, as far as the capped
/// total leaves room for it.
pub fn capped_v2(driver: NvmlMemoryV2, (free, total): (u64, u64)) -> NvmlMemoryV2 {
    let free = free.min(total);
    let reserved = driver.reserved.min(total - free);
    NvmlMemoryV2 {
        version: driver.version,
        total,
        reserved,
        free,
        used: total - free - reserved,
    }
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

/// `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase, as NVML prints UUIDs.
pub fn uuid_text(prefix: &str, u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
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
    fn v2_keeps_reserved_within_the_cap() {
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
                reserved: GI / 2,
                free: 3 * GI,
                used: GI / 2
            }
        );
        assert_eq!(v.reserved + v.used + v.free, v.total);
        let v = capped_v2(driver, (4 * GI, 4 * GI));
        assert_eq!(
            (v.reserved, v.used),
            (0, 0),
            "reserved never pushes used below zero"
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
