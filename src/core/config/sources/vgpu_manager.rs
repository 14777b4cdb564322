//! vgpu-manager (coldzerofear/vgpu-manager, DRA driver `manager.nvidia.com` and device
//! plugin): `CUDA_MEM_LIMIT_<i>=<MiB>m` caps the GPU whose UUID
//! `MANAGER_VISIBLE_DEVICE_<i>` gives (`<i>` is the node's index of the GPU, not CUDA's
//! ordinal in the container: pkg/kubeletplugin/vgpu.go, `GetAllocationEnvContainerEdits`).
//! An empty value means no cap (the whole GPU); the unindexed `CUDA_MEM_LIMIT` is every
//! GPU's, as its library reads it (library/src/util.c, `get_mem_limit`).
//!
//! The claim's directory: the DRA driver mounts `<host>/claims/<claimUID>/<partition>/config`
//! read-write at `/etc/vgpu-manager/config` in every container of the claim
//! (`GetPartitionMountContainerEdits`); the pool file lives there, so the claim's
//! containers share one budget. `GPUCAP_CLAIM_DIR` names the directory where it is
//! mounted elsewhere.

use super::handover::{Handover, HandoverVars, bad};
use crate::config::limit::{
    DeviceKey, DeviceUuid, Limit, LimitFrom, LimitSpec, MIN_UNITLESS_BYTES, unitless_message,
};
use crate::config::model::{CapSource, ConfigError, Origin};

pub const VGPU_MANAGER: &str = "vgpu-manager";
pub const VGPU_LIMIT: &str = "CUDA_MEM_LIMIT";
pub const VGPU_UUID: &str = "MANAGER_VISIBLE_DEVICE_";
/// Where vgpu-manager mounts the claim's directory in its containers.
pub const VGPU_CONFIG_DIR: &str = "/etc/vgpu-manager/config";
pub const VGPU_ACCEPTED: &str = "empty (no cap), or decimal digits optionally followed by k, m, g or t \
     in any case (KiB, MiB, GiB, TiB; a bare number is bytes, at least 1048576), e.g. 1024m";

pub(super) fn looks_at(name: &[u8]) -> bool {
    name.starts_with(VGPU_LIMIT.as_bytes()) || name.starts_with(VGPU_UUID.as_bytes())
}

/// What `CUDA_MEM_LIMIT*` names: None for the unindexed one, the index otherwise; an
/// error for a name that is neither (`CUDA_MEM_LIMITS`, `CUDA_MEM_LIMIT_x`).
fn index_of(name: &str, prefix: &str) -> Result<Option<u32>, String> {
    if name == prefix {
        return Ok(None);
    }
    let digits = name
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('_'))
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        .filter(|d| d.len() == 1 || !d.starts_with('0'));
    match digits.and_then(|d| d.parse::<u32>().ok()) {
        Some(i) => Ok(Some(i)),
        None => Err(format!(
            "unknown vgpu-manager variable (a typo?); the known ones are {VGPU_LIMIT}, \
             {VGPU_LIMIT}_<index> and {VGPU_UUID}<index>, index without a leading zero"
        )),
    }
}

/// Parses a vgpu-manager size: digits, then optionally one of k m g t (binary).
pub fn parse_vgpu_value(v: &str) -> Result<u64, String> {
    let (digits, shift) = match v.as_bytes().last() {
        Some(b'k' | b'K') => (&v[..v.len() - 1], 10),
        Some(b'm' | b'M') => (&v[..v.len() - 1], 20),
        Some(b'g' | b'G') => (&v[..v.len() - 1], 30),
        Some(b't' | b'T') => (&v[..v.len() - 1], 40),
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a whole number with one unit letter".into());
    }
    let n: u64 = digits.parse().map_err(|_| "too large".to_string())?;
    if n == 0 {
        return Err("a cap of 0 would refuse every allocation; leave it empty for no cap".into());
    }
    if shift == 0 && n < MIN_UNITLESS_BYTES {
        return Err(unitless_message(
            n,
            ["g", "m"],
            "a smaller cap needs the k unit",
        ));
    }
    n.checked_mul(1 << shift)
        .ok_or_else(|| "too large".to_string())
}

/// Reads vgpu-manager's variables.
pub(super) fn read(vars: &HandoverVars) -> Result<Handover, ConfigError> {
    let mut all: Option<(String, u64)> = None;
    let mut limits: Vec<(u32, String, String, u64)> = Vec::new();
    let mut uuids: Vec<(u32, String, DeviceUuid)> = Vec::new();
    for (name, value) in vars.with_prefix(VGPU_LIMIT) {
        let index = index_of(name, VGPU_LIMIT).map_err(|r| bad(name, value, r, ""))?;
        if value.is_empty() {
            continue; // no cap: the claim has the whole GPU
        }
        let b = parse_vgpu_value(value).map_err(|r| bad(name, value, r, VGPU_ACCEPTED))?;
        match index {
            None => all = Some((value.to_string(), b)),
            Some(i) => limits.push((i, name.to_string(), value.to_string(), b)),
        }
    }
    for (name, value) in vars.with_prefix(VGPU_UUID) {
        let i = match index_of(name, VGPU_UUID.trim_end_matches('_')) {
            Ok(Some(i)) => i,
            // MANAGER_VISIBLE_DEVICES (its list of every UUID) places no cap.
            _ if name == "MANAGER_VISIBLE_DEVICES" => continue,
            Ok(None) => continue,
            Err(r) => return Err(bad(name, value, r, "")),
        };
        if value.is_empty() {
            continue;
        }
        let u = DeviceUuid::parse(value)
            .map_err(|r| bad(name, value, r, "the GPU-… or MIG-… UUID of the GPU"))?;
        uuids.push((i, name.to_string(), u));
    }
    let mut out = Handover::default();
    if all.is_none() && limits.is_empty() {
        return Ok(out);
    }
    let mut spec = LimitSpec {
        default: all.as_ref().map(|&(_, b)| Limit::Bytes(b)),
        devices: Vec::new(),
        from: LimitFrom::Handover("vgpu-manager's CUDA_MEM_LIMIT_<i>"),
    };
    let mut origins = Vec::new();
    let mut names = Vec::new();
    if let Some((v, _)) = &all {
        origins.push(Origin {
            var: VGPU_LIMIT.into(),
            value: v.clone(),
            driver: VGPU_MANAGER,
            key: None,
        });
        names.push(format!("{VGPU_LIMIT}={v:?}"));
    }
    for (i, name, value, b) in limits {
        let Some((_, _, uuid)) = uuids.iter().find(|(j, _, _)| *j == i) else {
            return Err(bad(
                &name,
                &value,
                format!(
                    "no {VGPU_UUID}{i} names the GPU it caps (vgpu-manager's index is the \
                     node's, not CUDA's ordinal in the container, so the cap cannot be placed)"
                ),
                "",
            ));
        };
        let key = DeviceKey::Uuid(*uuid);
        if spec.devices.iter().any(|(k, _)| *k == key) {
            return Err(bad(&name, &value, format!("{uuid} is capped twice"), ""));
        }
        spec.devices.push((key.clone(), Limit::Bytes(b)));
        names.push(format!("{name}={value:?}"));
        origins.push(Origin {
            var: name,
            value,
            driver: VGPU_MANAGER,
            key: Some(key),
        });
    }
    let name = format!("{} ({VGPU_MANAGER})", names.join(", "));
    let (var, value) = (origins[0].var.clone(), origins[0].value.clone());
    out.cap = Some((
        CapSource {
            name,
            var,
            value,
            spec,
        },
        origins,
    ));
    let dir = std::path::PathBuf::from(VGPU_CONFIG_DIR);
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        out.claim_dir = Some((dir, "vgpu-manager's per-claim directory".to_string()));
    } else {
        out.no_claim_dir = Some(format!(
            "note: no vgpu-manager claim directory at {VGPU_CONFIG_DIR} (the container's \
             processes share the grant in the container's pool, not with the claim's other \
             containers; GPUCAP_CLAIM_DIR names one mounted elsewhere)"
        ));
    }
    Ok(out)
}
