//! Whether the sources of caps agree ([`CapSource`]: `GPUCAP_LIMIT`, HAMi-core's
//! variables, a driver's hand-over): two that give one GPU different caps are an error
//! naming both (fail closed). Sources keyed by ordinal, or giving one cap for every GPU,
//! are compared as they are read ([`agree_by_ordinal`]); a GPU named by UUID only against
//! the visible GPUs ([`check_sources_agree`], in the key check of `keys.rs`).

use super::limit::{Limit, MAX_DEVICES, format_uuid};
use super::model::{CapSource, Config, ConfigError};

/// The error of two sources that give one GPU different caps.
fn disagree(
    a: &CapSource,
    b: &CapSource,
    gpu: &str,
    ca: Option<Limit>,
    cb: Option<Limit>,
) -> ConfigError {
    let show = |l: Option<Limit>| l.map_or("no cap".to_string(), |l| l.to_string());
    ConfigError {
        var: b.var.clone(),
        value: b.value.clone(),
        reason: format!(
            "two sources give {gpu} different caps: {} from {} but {} from {}; set only one of \
             them, or both to the same cap",
            show(cb),
            b.name,
            show(ca),
            a.name
        ),
        accepted: "",
    }
}

/// Compares two sources without UUID keys: the same cap (or none) for every ordinal.
pub(super) fn agree_by_ordinal(a: &CapSource, b: &CapSource) -> Result<(), ConfigError> {
    for n in 0..MAX_DEVICES as u32 {
        let (ca, cb) = (a.spec.for_ordinal(n), b.spec.for_ordinal(n));
        if ca != cb {
            let gpu = if a.spec.devices.is_empty() && b.spec.devices.is_empty() {
                "every GPU".to_string()
            } else {
                format!("GPU {n}")
            };
            return Err(disagree(a, b, &gpu, ca, cb));
        }
    }
    Ok(())
}

/// Whether the cap sources must be compared against the visible GPUs (some name a GPU
/// by UUID and there is more than one).
pub fn sources_need_gpus(config: &Config) -> bool {
    config.cap_sources.len() > 1 && config.cap_sources.iter().any(CapSource::has_uuid_keys)
}

/// Compares every cap source on each visible GPU (`uuids`, by ordinal): the error is
/// the one line to print, naming both sources, their values and the GPU.
pub fn check_sources_agree(config: &Config, uuids: Option<&[[u8; 16]]>) -> Result<(), String> {
    if !sources_need_gpus(config) {
        return Ok(());
    }
    let Some(uuids) = uuids else {
        return Err(format!(
            "gpucap: {} name GPUs by UUID, but the driver could not list the UUIDs of the \
             visible GPUs to compare them",
            config
                .cap_sources
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(" and ")
        ));
    };
    let first = &config.cap_sources[0];
    for (o, u) in uuids.iter().enumerate() {
        let ca = first.spec.for_device(o as u32, Some(u));
        for other in &config.cap_sources[1..] {
            let cb = other.spec.for_device(o as u32, Some(u));
            if ca != cb {
                let gpu = format!("GPU {o} ({})", format_uuid(false, u));
                return Err(disagree(first, other, &gpu, ca, cb).to_string());
            }
        }
    }
    Ok(())
}
