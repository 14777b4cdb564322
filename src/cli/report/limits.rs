//! The lines that show a cap: a limit as given (`8 GiB (8589934592 bytes)`, `50% of
//! physical memory`), per GPU and for the others, a guarantee or ceiling as given, one
//! device's cap of its memory, and which GPU each UUID key names.

use gpucap_core::config::{DeviceKey, Limit, LimitSpec};
use gpucap_core::size::format_bytes;

use crate::driver::Device;

/// `8 GiB (8589934592 bytes)` or `50% of physical memory`.
pub fn limit_text(limit: Limit) -> String {
    match limit {
        Limit::Bytes(b) => format!("{} ({b} bytes)", format_bytes(b)),
        Limit::Fraction(_) => format!("{limit} of physical memory"),
    }
}

/// The `limit:` line's text, e.g.
/// `GPU 0: 8 GiB (8589934592 bytes); other GPUs: 50% of physical memory`. With no cap,
/// `none_from` is how no cap was asked (`--limit none`, `GPUCAP_LIMIT=none`); None: it
/// was left unset.
pub fn describe_limit(spec: Option<&LimitSpec>, none_from: Option<&str>) -> String {
    let Some(spec) = spec else {
        return match none_from {
            Some(from) => {
                format!("none (no cap asked, {from}: allocations are counted, not capped)")
            }
            None => "none (GPUCAP_LIMIT unset: allocations are counted, not capped)".to_string(),
        };
    };
    let mut parts: Vec<String> = spec
        .devices
        .iter()
        .map(|(key, limit)| match key {
            DeviceKey::Ordinal(_) | DeviceKey::Uuid(_) => format!("{key}: {}", limit_text(*limit)),
        })
        .collect();
    let others = if spec.devices.is_empty() {
        "every GPU"
    } else {
        "other GPUs"
    };
    match spec.default {
        Some(limit) => parts.push(format!("{others}: {}", limit_text(limit))),
        None => parts.push(format!("{others}: not capped (counted only)")),
    }
    parts.join("; ")
}

/// A guarantee or ceiling as given: `4 GiB`, `GPU 1: 25%; other GPUs: 2 GiB`.
pub fn share_text(spec: &LimitSpec) -> String {
    let mut parts: Vec<String> = spec
        .devices
        .iter()
        .map(|(k, l)| format!("{k}: {l}"))
        .collect();
    if let Some(l) = spec.default {
        parts.push(if spec.devices.is_empty() {
            l.to_string()
        } else {
            format!("other GPUs: {l}")
        });
    }
    parts.join("; ")
}

/// One device's line, e.g. `GPU 0: cap 4294967296 bytes (4 GiB) of 85899345920 (80 GiB)`.
pub fn device_line(device: &Device, limit: Option<Limit>) -> String {
    let total = format!("{} ({})", device.total, format_bytes(device.total));
    let mut line = match limit {
        None => format!("GPU {}: no cap (counted only) of {total}", device.ordinal),
        Some(limit) => {
            let cap = limit.resolve(device.total);
            let mut l = format!(
                "GPU {}: cap {cap} bytes ({}) of {total}",
                device.ordinal,
                format_bytes(cap)
            );
            if cap > device.total {
                l.push_str("; more than the GPU has, so it never binds");
            }
            l
        }
    };
    if let Some(name) = &device.name {
        line.push_str(&format!(" [{name}]"));
    }
    line
}

/// For each UUID key of `GPUCAP_LIMIT`, which visible GPU it names (a key that names
/// none is an error, found by [`key_check`](super::keys::key_check) before the report is made).
pub fn uuid_key_notes(spec: &LimitSpec, devices: &[Device]) -> Vec<String> {
    spec.uuid_keys()
        .filter_map(|key| {
            let d = devices.iter().find(|d| d.uuid == Some(key.bytes))?;
            let var = match spec.from {
                gpucap_core::config::LimitFrom::Handover(vars) => vars,
                _ => "GPUCAP_LIMIT",
            };
            Some(format!("note: {var} key {key} is GPU {}", d.ordinal))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{GI, dev, spec};

    #[test]
    fn limit_lines() {
        assert_eq!(
            describe_limit(spec("0=8Gi,50%").as_ref(), None),
            "GPU 0: 8 GiB (8589934592 bytes); other GPUs: 50% of physical memory"
        );
        assert_eq!(
            describe_limit(spec("8Gi").as_ref(), None),
            "every GPU: 8 GiB (8589934592 bytes)"
        );
        assert_eq!(
            describe_limit(spec("1=12.5%").as_ref(), None),
            "GPU 1: 12.5% of physical memory; other GPUs: not capped (counted only)"
        );
        assert_eq!(
            describe_limit(None, None),
            "none (GPUCAP_LIMIT unset: allocations are counted, not capped)"
        );
        assert_eq!(
            describe_limit(None, Some("--limit none")),
            "none (no cap asked, --limit none: allocations are counted, not capped)"
        );
    }

    #[test]
    fn device_lines() {
        assert_eq!(
            device_line(&dev(0, 80 * GI), Some(Limit::Bytes(4 * GI))),
            "GPU 0: cap 4294967296 bytes (4 GiB) of 85899345920 (80 GiB)"
        );
        assert_eq!(
            device_line(&dev(1, 80 * GI), Some(Limit::Fraction(0.5))),
            "GPU 1: cap 42949672960 bytes (40 GiB) of 85899345920 (80 GiB)"
        );
        assert_eq!(
            device_line(&dev(2, 16 * GI), None),
            "GPU 2: no cap (counted only) of 17179869184 (16 GiB)"
        );
        assert!(device_line(&dev(0, GI), Some(Limit::Bytes(2 * GI))).contains("never binds"));
        let named = Device {
            name: Some("Fake GPU".into()),
            ..dev(0, GI)
        };
        assert!(device_line(&named, None).ends_with(" [Fake GPU]"));
    }
}
