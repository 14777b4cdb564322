//! NVML's devices and the ones CUDA sees: UUIDs as NVML spells them, and CUDA's device
//! order worked out from NVML's enumeration and `CUDA_VISIBLE_DEVICES`.

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
/// by digit, not through `format!` (far fewer instructions: the first context's
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
