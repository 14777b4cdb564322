//! The Kubernetes DRA example driver (kubernetes-sigs/dra-example-driver, GPU profile):
//! a claim's consumed `memory` capacity is handed over as
//! `GPU_DEVICE_<ID>_MEMORY=<quantity>` (internal/profiles/gpu/gpu.go, `applyGpuConfig`),
//! `<ID>` being the device's name without `gpu-`, upper-cased, `-` made `_` (`gpu-0` →
//! `0`, `gpu-0-partition-1` → `0_PARTITION_1`); `GPU_DEVICE_<ID>=<device name>` names it.
//! Nothing names the GPU's UUID or its CUDA ordinal, so the amount caps every GPU the
//! container sees; with several different amounts, every GPU gets the smallest (never
//! more than any one grant).

use super::handover::{Handover, HandoverVars, bad};
use super::quantity::{QUANTITY_ACCEPTED, parse_quantity};
use crate::config::limit::{Limit, LimitFrom, LimitSpec};
use crate::config::model::{CapSource, ConfigError, Origin};

pub const DRA_EXAMPLE: &str = "DRA example driver";
const PREFIX: &str = "GPU_DEVICE_";
const SUFFIX: &str = "_MEMORY";
const DRA_NAME_ACCEPTED: &str = "GPU_DEVICE_<ID>_MEMORY, <ID> of A-Z 0-9 _ (GPU_DEVICE_0_MEMORY, GPU_DEVICE_0_PARTITION_1_MEMORY)";

pub(super) fn looks_at(name: &[u8]) -> bool {
    name.starts_with(PREFIX.as_bytes()) && name.ends_with(SUFFIX.as_bytes())
}

/// Reads the DRA example driver's variables.
pub(super) fn read(vars: &HandoverVars) -> Result<Handover, ConfigError> {
    let mut out = Handover::default();
    let mut amounts: Vec<(String, String, u64)> = Vec::new();
    for (name, value) in vars.with_prefix(PREFIX) {
        let id = &name[PREFIX.len()..name.len().saturating_sub(SUFFIX.len()).max(PREFIX.len())];
        if !name.ends_with(SUFFIX) {
            continue;
        }
        // A name the driver never writes (`GPU_DEVICE_gpu-0_MEMORY`): its amount would
        // cap nothing, so it fails closed rather than being passed over.
        if id.is_empty()
            || !id
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(bad(
                name,
                value,
                "not a name the DRA example driver writes: its <ID> is the device's name \
                 without gpu-, upper-cased, - made _ (GPU_DEVICE_0_MEMORY for gpu-0)"
                    .into(),
                DRA_NAME_ACCEPTED,
            ));
        }
        let b = parse_quantity(value).map_err(|r| bad(name, value, r, QUANTITY_ACCEPTED))?;
        amounts.push((name.to_string(), value.to_string(), b));
    }
    let Some(&(_, _, least)) = amounts.iter().min_by_key(|a| a.2) else {
        return Ok(out);
    };
    if amounts.iter().any(|a| a.2 != least) {
        out.notes.push(format!(
            "note: the DRA example driver's amounts differ and name no GPU; every GPU is \
             capped at the smallest, {}",
            Limit::Bytes(least)
        ));
    }
    let names: Vec<String> = amounts
        .iter()
        .map(|(n, v, _)| format!("{n}={v:?}"))
        .collect();
    let (var, value) = (amounts[0].0.clone(), amounts[0].1.clone());
    let origins = amounts
        .into_iter()
        .map(|(var, value, _)| Origin {
            var,
            value,
            driver: DRA_EXAMPLE,
            key: None,
        })
        .collect();
    let spec = LimitSpec {
        default: Some(Limit::Bytes(least)),
        devices: Vec::new(),
        from: LimitFrom::Handover("the DRA example driver's GPU_DEVICE_<ID>_MEMORY"),
    };
    out.cap = Some((
        CapSource {
            name: format!("{} ({DRA_EXAMPLE})", names.join(", ")),
            var,
            value,
            spec,
        },
        origins,
    ));
    Ok(out)
}
