//! HAMi's DRA kubelet plugin (Project-HAMi/k8s-dra-driver,
//! cmd/hami-kubelet-plugin/hami_core.go, `GetCDIContainerEdits`): HAMi-core's own
//! variables (read by `hami.rs`), with two differences that matter:
//!
//! - `CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/<claimUID>/<uuid>.cache`:
//!   the claim's directory, mounted read-write in every container of the claim, is the
//!   only place they share. The pool lives there (`gpucap.pool`), so all the claim's
//!   containers share one budget, whatever cache file each is given.
//! - `CUDA_DEVICE_MEMORY_LIMIT_<i>` is numbered in the order of a Go map (its own comment:
//!   "The idx here may not equals to the index in nvidia-smi"): `<i>` names no GPU. One
//!   amount caps every GPU; several different ones cap every GPU at the smallest (never
//!   more than any one grant).
//!
//! HAMi's classic device plugin (Project-HAMi/HAMi,
//! pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go, `Allocate` and
//! `getAllocateResponse`) numbers `CUDA_DEVICE_MEMORY_LIMIT_<i>` in the order of the
//! container's devices, the order in which it lists them in `NVIDIA_VISIBLE_DEVICES`
//! (their UUIDs by default). CUDA numbers the same GPUs in its own order (fastest first,
//! or PCI bus order), which need not be that one, so where the list is of UUIDs each cap
//! is keyed to its GPU's UUID ([`hami_classic_by_uuid`]).

use std::path::{Path, PathBuf};

use super::handover::bad;
use crate::config::hami::HAMI_LIMIT;
use crate::config::limit::{DeviceKey, DeviceUuid, Limit, LimitFrom, LimitSpec};
use crate::config::model::{CapSource, Config, ConfigError, Origin};

pub const HAMI_DRA: &str = "HAMi DRA kubelet plugin";
pub const HAMI_CLASSIC: &str = "HAMi device plugin";

/// The claim's directory when `cache` (a `CUDA_DEVICE_MEMORY_SHARED_CACHE`) is a file
/// in `…/claims/<claimUID>/`, as HAMi's DRA plugin names it.
pub fn hami_claim_dir(cache: &str) -> Option<PathBuf> {
    let dir = Path::new(cache).parent()?;
    let claims = dir.parent()?;
    let uid = dir.file_name()?.to_str()?;
    let ok = claims.file_name() == Some("claims".as_ref())
        && !uid.is_empty()
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then(|| dir.to_path_buf())
}

/// HAMi's per-index caps as the DRA plugin means them: one cap for every GPU, the
/// smallest of them; the note says so when they differ.
pub fn hami_dra_spec(spec: LimitSpec) -> (LimitSpec, Option<String>) {
    let amounts: Vec<Limit> = spec
        .default
        .into_iter()
        .chain(spec.devices.iter().map(|&(_, l)| l))
        .collect();
    let least = amounts
        .iter()
        .filter_map(|l| match l {
            Limit::Bytes(b) => Some(*b),
            Limit::Fraction(_) => None,
        })
        .min();
    let note = (amounts.iter().any(|l| Some(*l) != least.map(Limit::Bytes))).then(|| {
        format!(
            "note: {HAMI_DRA}'s CUDA_DEVICE_MEMORY_LIMIT_<i> name no GPU (their order is \
             arbitrary) and differ: every GPU is capped at the smallest, {}",
            least
                .map(Limit::Bytes)
                .map(|l| l.to_string())
                .unwrap_or_default()
        )
    });
    let spec = LimitSpec {
        default: least.map(Limit::Bytes),
        devices: Vec::new(),
        from: LimitFrom::Hami,
    };
    (spec, note)
}

/// The variable that lists the container's GPUs, set by the device plugins.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// HAMi's classic per-index caps keyed by UUID: when `visible` (`NVIDIA_VISIBLE_DEVICES`)
/// lists only UUIDs, `CUDA_DEVICE_MEMORY_LIMIT_<i>` caps the `<i>`th of them, whatever
/// its CUDA ordinal. `Ok(None)`: the list is not of UUIDs (`all`, indices) or there is
/// no per-index cap; the indices stay CUDA ordinals, as HAMi-core reads them. An index
/// past the list is an error: the cap could not be placed.
pub fn hami_classic_by_uuid(
    spec: &LimitSpec,
    origins: &mut [Origin],
    visible: &str,
) -> Result<Option<LimitSpec>, ConfigError> {
    if spec.devices.is_empty() {
        return Ok(None);
    }
    let uuids: Result<Vec<DeviceUuid>, String> = visible
        .split(',')
        .map(|u| DeviceUuid::parse(u.trim()))
        .collect();
    let uuids = match uuids {
        Ok(uuids) => uuids,
        // A list with a UUID in it is a list of UUIDs, one of them damaged: read as CUDA
        // ordinals, the caps would fall on other GPUs and the granted one run uncapped.
        Err(why) if looks_like_uuids(visible) => {
            let (var, value) = origins
                .iter()
                .find(|o| o.var.starts_with(HAMI_LIMIT) && o.var.len() > HAMI_LIMIT.len())
                .map_or((HAMI_LIMIT.to_string(), String::new()), |o| {
                    (o.var.clone(), o.value.clone())
                });
            return Err(bad(
                &var,
                &value,
                format!(
                    "{NVIDIA_VISIBLE_DEVICES}={visible:?} lists GPUs by UUID, but not all of \
                     them ({why}): HAMi numbers its caps in that list's order, so no cap \
                     can be placed"
                ),
                "",
            ));
        }
        // `all`, indices: the indices stay CUDA ordinals.
        Err(_) => return Ok(None),
    };
    let mut keyed = LimitSpec {
        default: spec.default,
        devices: Vec::new(),
        from: LimitFrom::Handover("HAMi's CUDA_DEVICE_MEMORY_LIMIT_<i>, by NVIDIA_VISIBLE_DEVICES"),
    };
    for (key, limit) in &spec.devices {
        let DeviceKey::Ordinal(i) = key else {
            return Ok(None);
        };
        let var = format!("{HAMI_LIMIT}_{i}");
        let Some(uuid) = uuids.get(*i as usize) else {
            let value = origins
                .iter()
                .find(|o| o.var == var)
                .map_or(String::new(), |o| o.value.clone());
            return Err(bad(
                &var,
                &value,
                format!(
                    "{NVIDIA_VISIBLE_DEVICES}={visible:?} lists {} GPU(s), so there is no GPU \
                     {i} to cap (HAMi numbers its caps in that list's order)",
                    uuids.len()
                ),
                "",
            ));
        };
        keyed.devices.push((DeviceKey::Uuid(*uuid), *limit));
        for o in origins.iter_mut().filter(|o| o.var == var) {
            o.key = Some(DeviceKey::Uuid(*uuid));
        }
    }
    Ok(Some(keyed))
}

/// Whether one entry of `visible` names a GPU by UUID (`GPU-…`, `MIG-…`, any case).
fn looks_like_uuids(visible: &str) -> bool {
    visible.split(',').any(|u| {
        let u = u.trim().as_bytes();
        u.len() >= 4
            && (u[..4].eq_ignore_ascii_case(b"GPU-") || u[..4].eq_ignore_ascii_case(b"MIG-"))
    })
}

/// Makes HAMi's caps keyed by UUID (`keyed`, from `origins`) the limit, or, beside
/// `GPUCAP_LIMIT` (`gpucap_limit`, already the limit), a second cap source that is
/// compared with it on the visible GPUs ([`check_sources_agree`]).
pub fn merge_hami_by_uuid(
    config: &mut Config,
    keyed: LimitSpec,
    origins: &[Origin],
    gpucap_limit: Option<&str>,
) {
    let listing = origins
        .iter()
        .map(|o| format!("{}={:?}", o.var, o.value))
        .collect::<Vec<_>>()
        .join(", ");
    let hami_source = CapSource {
        name: format!("{listing} ({HAMI_CLASSIC})"),
        var: origins[0].var.clone(),
        value: origins[0].value.clone(),
        spec: keyed.clone(),
    };
    match (config.limit.as_mut(), gpucap_limit) {
        (Some(ours), Some(v)) => {
            config.cap_sources.push(CapSource {
                name: format!("GPUCAP_LIMIT={v:?}"),
                var: "GPUCAP_LIMIT".into(),
                value: v.to_string(),
                spec: ours.clone(),
            });
            config.cap_sources.push(hami_source);
            ours.from = LimitFrom::Both;
        }
        _ => config.limit = Some(keyed),
    }
}
