//! Who the fake devices are: UUIDs (GPU and MIG), names, PCI bus ids, and which of them
//! `CUDA_VISIBLE_DEVICES` selects. The fake libcuda and the fake NVML name them alike.

/// At most this many physical devices (FAKECUDA_DEVICES).
pub const MAX_DEVICES: usize = 64;

/// UUID of physical GPU `phys`: `fa ce 00 00 .. 00 <phys as 8 big-endian bytes>`,
/// printed `GPU-face0000-0000-0000-0000-00000000000N`.
pub fn gpu_uuid(phys: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[0] = 0xfa;
    u[1] = 0xce;
    u[8..].copy_from_slice(&(phys as u64).to_be_bytes());
    u
}

/// UUID of the MIG instance of GPU `phys` (FAKECUDA_MIG=1): as the GPU's with byte 3 = 1,
/// printed `MIG-face0001-0000-0000-0000-00000000000N`.
pub fn mig_uuid(phys: usize) -> [u8; 16] {
    let mut u = gpu_uuid(phys);
    u[3] = 1;
    u
}

/// `PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lowercase hex), as nvidia-smi prints:
/// the text gpucap's core reads UUIDs from, written by the same function.
pub use gpucap_core::nvml::uuid_text as format_uuid;

pub fn gpu_uuid_string(phys: usize) -> String {
    format_uuid("GPU", &gpu_uuid(phys))
}

pub fn mig_uuid_string(phys: usize) -> String {
    format_uuid("MIG", &mig_uuid(phys))
}

/// The GPU's name; a MIG instance appends a profile like a real one
/// (`FakeCUDA Device 0 MIG 7g.80gb`).
pub fn device_name(phys: usize, mig: bool, total_mem: u64) -> String {
    if mig {
        format!("FakeCUDA Device {phys} MIG 7g.{}gb", total_mem >> 30)
    } else {
        format!("FakeCUDA Device {phys}")
    }
}

/// PCI bus number of GPU `phys` (bus phys+1, device 0, function 0, domain 0).
pub fn pci_bus(phys: usize) -> u32 {
    phys as u32 + 1
}

/// `00000000:0N:00.0`, the form cuDeviceGetPCIBusId and nvmlPciInfo_t.busId use.
pub fn pci_bus_id(phys: usize) -> String {
    format!("00000000:{:02X}:00.0", pci_bus(phys))
}

/// Parses a PCI bus id `[domain:]bus:device[.function]` (hex) into the GPU it names.
pub fn parse_pci_bus_id(s: &str, devices: usize) -> Option<usize> {
    let s = s.trim();
    let (rest, func) = match s.rsplit_once('.') {
        Some((r, f)) => (r, u32::from_str_radix(f, 16).ok()?),
        None => (s, 0),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, dev) = match parts.as_slice() {
        [d, b, v] => (u32::from_str_radix(d, 16).ok()?, *b, *v),
        [b, v] => (0, *b, *v),
        _ => return None,
    };
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    if domain != 0 || dev != 0 || func != 0 {
        return None;
    }
    (0..devices).find(|&p| pci_bus(p) == bus)
}

/// The physical devices `CUDA_VISIBLE_DEVICES` makes visible, in CUDA ordinal order.
///
/// Like the real driver: a comma list of physical indices, `GPU-<uuid>` (any prefix that
/// names exactly one GPU) or, with MIG on, `MIG-<uuid>` (same prefix rule) or the legacy
/// `MIG-GPU-<gpu uuid>/0/0`; the list ends at the first entry that names no device (an
/// out-of-range or negative index, an unknown or ambiguous UUID, an empty entry). An entry
/// naming a device already listed also ends it. With MIG on, an index or GPU UUID selects
/// that GPU's (only) MIG instance. Unset: every device in order.
pub fn parse_visible(spec: Option<&str>, devices: usize, mig: bool) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..devices).collect();
    };
    let mut out: Vec<usize> = Vec::new();
    for entry in spec.split(',') {
        match lookup_entry(entry.trim(), devices, mig) {
            Some(p) if !out.contains(&p) => out.push(p),
            _ => break,
        }
    }
    out
}

fn unique_prefix(want: &str, devices: usize, name: impl Fn(usize) -> String) -> Option<usize> {
    let want = want.to_ascii_lowercase();
    let mut hits = (0..devices).filter(|&p| name(p).to_ascii_lowercase().starts_with(&want));
    let first = hits.next()?;
    hits.next().is_none().then_some(first)
}

fn lookup_entry(e: &str, devices: usize, mig: bool) -> Option<usize> {
    if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
        return e.parse::<usize>().ok().filter(|&i| i < devices);
    }
    let upper = e.to_ascii_uppercase();
    if let Some(rest) = upper.strip_prefix("MIG-GPU-") {
        // Legacy MIG-GPU-<full gpu uuid>/<gi>/<ci>: the one instance is 0/0.
        let (uuid, ids) = rest.split_once('/')?;
        if !mig || ids != "0/0" {
            return None;
        }
        let full = format!("GPU-{uuid}");
        return (0..devices).find(|&p| gpu_uuid_string(p).eq_ignore_ascii_case(&full));
    }
    if upper.starts_with("MIG-") {
        return if mig && e.len() > 4 {
            unique_prefix(e, devices, mig_uuid_string)
        } else {
            None
        };
    }
    if upper.starts_with("GPU-") && e.len() > 4 {
        return unique_prefix(e, devices, gpu_uuid_string);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_strings() {
        assert_eq!(
            gpu_uuid_string(3),
            "GPU-face0000-0000-0000-0000-000000000003"
        );
        assert_eq!(
            mig_uuid_string(3),
            "MIG-face0001-0000-0000-0000-000000000003"
        );
        assert_ne!(gpu_uuid(0), mig_uuid(0));
        assert_eq!(pci_bus_id(10), "00000000:0B:00.0");
    }

    #[test]
    fn pci_ids() {
        assert_eq!(parse_pci_bus_id("00000000:02:00.0", 4), Some(1));
        assert_eq!(parse_pci_bus_id("0000:02:00.0", 4), Some(1));
        assert_eq!(parse_pci_bus_id("02:00.0", 4), Some(1));
        assert_eq!(parse_pci_bus_id("00000000:0a:00.0", 16), Some(9));
        assert_eq!(parse_pci_bus_id("00000000:05:00.0", 4), None);
        assert_eq!(parse_pci_bus_id("00000000:02:01.0", 4), None);
        assert_eq!(parse_pci_bus_id("nonsense", 4), None);
    }

    #[test]
    fn visible_devices() {
        let v = |s: &str| parse_visible(Some(s), 4, false);
        assert_eq!(parse_visible(None, 3, false), vec![0, 1, 2]);
        assert_eq!(v("2,1"), vec![2, 1]);
        assert_eq!(v("0,2,-1,1"), vec![0, 2]);
        assert_eq!(v("0, 3"), vec![0, 3]);
        assert_eq!(v("4,0"), Vec::<usize>::new());
        assert_eq!(v(""), Vec::<usize>::new());
        assert_eq!(v("1,1,2"), vec![1]);
        assert_eq!(v("GPU-face0000-0000-0000-0000-000000000002,0"), vec![2, 0]);
        // A prefix must name exactly one GPU.
        assert_eq!(
            v("GPU-face0000-0000-0000-0000-00000000000"),
            Vec::<usize>::new()
        );
        assert_eq!(v("GPU-FACE0000-0000-0000-0000-000000000003"), vec![3]);
        assert_eq!(v("1,GPU-dead"), vec![1]);
        // MIG UUIDs only name devices in MIG mode.
        assert_eq!(
            v("MIG-face0001-0000-0000-0000-000000000001"),
            Vec::<usize>::new()
        );
        let m = |s: &str| parse_visible(Some(s), 4, true);
        assert_eq!(m("MIG-face0001-0000-0000-0000-000000000001,0"), vec![1, 0]);
        assert_eq!(
            m("MIG-GPU-face0000-0000-0000-0000-000000000003/0/0"),
            vec![3]
        );
        assert_eq!(
            m("MIG-GPU-face0000-0000-0000-0000-000000000003/1/0"),
            Vec::<usize>::new()
        );
        assert_eq!(
            m("MIG-face0000-0000-0000-0000-000000000001"),
            Vec::<usize>::new()
        );
        let one = parse_visible(Some("GPU-face"), 1, false);
        assert_eq!(one, vec![0]);
    }
}
