//! The caps that the cluster's GPU drivers hand a container in its environment, each
//! read by its own file, and the one resolver that merges them with `GPUCAP_LIMIT` and
//! HAMi-core's variables ([`super::from_vars`] calls [`apply`]):
//!
//! | file | driver | variables |
//! | --- | --- | --- |
//! | `vgpu_manager.rs` | vgpu-manager (`manager.nvidia.com`) | `CUDA_MEM_LIMIT[_<i>]`, `MANAGER_VISIBLE_DEVICE_<i>` |
//! | `dra_example.rs` | the Kubernetes DRA example driver | `GPU_DEVICE_<ID>_MEMORY` |
//! | `nvidia_toolkit.rs` | NVIDIA container toolkit | `NVIDIA_GPU_MEMORY_LIMIT`, `NVIDIA_GPU_MEMORY_REQUEST` |
//! | `hami_dra.rs` | HAMi's DRA kubelet plugin | HAMi-core's variables in a claim's directory |
//!
//! Every source that gives a cap is a [`CapSource`]; two that give one GPU different
//! caps are an error naming both (fail closed). Sources whose keys can be compared
//! before the GPUs are known (ordinals, or one cap for every GPU) are compared in
//! `from_vars`; the others (a GPU named by UUID) by [`check_sources_agree`] against the
//! visible GPUs, in the one key check the shim and the CLI both make
//! ([`super::check_gpu_keys`]).

mod dra_example;
mod hami_dra;
mod nvidia_toolkit;
mod quantity;
mod vgpu_manager;

pub use dra_example::DRA_EXAMPLE;
pub use hami_dra::{
    HAMI_CLASSIC, HAMI_DRA, NVIDIA_VISIBLE_DEVICES, hami_claim_dir, hami_classic_by_uuid,
    hami_dra_spec, merge_hami_by_uuid,
};
pub use nvidia_toolkit::NVIDIA_TOOLKIT;
pub use vgpu_manager::VGPU_MANAGER;

// Taken by the modules below through `super::`.
use quantity::{QUANTITY_ACCEPTED, parse_quantity};

use super::{
    Config, ConfigError, DeviceKey, DeviceUuid, HAMI_LIMIT, Limit, LimitFrom, LimitSpec,
    MAX_DEVICES, MIN_UNITLESS_BYTES, PoolSpec, check_shares, format_uuid, limit_is_none,
    unitless_message,
};

/// One variable a cap came from, for `gpucap check`: `CUDA_MEM_LIMIT_0="1024m"` from
/// vgpu-manager, for the GPU `key` (None: every GPU).
#[derive(Clone, Debug, PartialEq)]
pub struct Origin {
    /// The variable's name.
    pub var: String,
    /// Its value, as set.
    pub value: String,
    /// Who sets it: `GPUCAP_LIMIT`, `vgpu-manager`, ...
    pub driver: &'static str,
    /// The GPU it caps (None: every GPU the process sees).
    pub key: Option<DeviceKey>,
}

impl Origin {
    /// `CUDA_MEM_LIMIT_0="1024m" (vgpu-manager)`.
    pub fn text(&self) -> String {
        format!("{}={:?} ({})", self.var, self.value, self.driver)
    }

    /// Whether it caps the GPU with CUDA ordinal `ordinal` and UUID `uuid`.
    pub fn covers(&self, ordinal: u32, uuid: Option<&[u8; 16]>) -> bool {
        match &self.key {
            None => true,
            Some(DeviceKey::Ordinal(n)) => *n == ordinal,
            Some(DeviceKey::Uuid(u)) => uuid == Some(&u.bytes),
        }
    }
}

/// A source of caps: what it is called in messages, and the caps it gives.
#[derive(Clone, Debug, PartialEq)]
pub struct CapSource {
    /// `NVIDIA_GPU_MEMORY_LIMIT="512" (NVIDIA container toolkit)`.
    pub name: String,
    /// The first variable of it and its value, for the error's `invalid VAR="VALUE"`.
    pub var: String,
    pub value: String,
    pub spec: LimitSpec,
}

impl CapSource {
    fn has_uuid_keys(&self) -> bool {
        self.spec.uuid_keys().next().is_some()
    }
}

/// The variables of the environment a driver source reads: name and value, the first
/// occurrence of each name.
#[derive(Default)]
pub struct HandoverVars(pub Vec<(String, String)>);

impl HandoverVars {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The variables whose name starts with `prefix`, in the environment's order.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.0
            .iter()
            .filter(move |(n, _)| n.starts_with(prefix))
            .map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Adds a pair unless its name was seen (first occurrence wins, like getenv).
    pub fn push(&mut self, name: String, value: String) {
        if self.get(&name).is_none() {
            self.0.push((name, value));
        }
    }
}

/// Whether a driver source reads a variable of this name (the shim copies only those,
/// and only those make the shim skip the configuration file).
pub fn is_handover_name(name: &[u8]) -> bool {
    vgpu_manager::looks_at(name) || dra_example::looks_at(name) || nvidia_toolkit::looks_at(name)
}

/// What one driver's variables give.
#[derive(Default)]
pub struct Handover {
    /// The cap, if the driver gives one.
    pub cap: Option<(CapSource, Vec<Origin>)>,
    /// The request, where the driver gives one apart from the cap (the toolkit's).
    pub request: Option<(LimitSpec, String)>,
    /// The directory every container of the claim shares, for its pool.
    pub claim_dir: Option<(std::path::PathBuf, String)>,
    /// Why the driver's claim directory is not there (said unless GPUCAP_CLAIM_DIR
    /// names one).
    pub no_claim_dir: Option<String>,
    pub notes: Vec<String>,
}

/// An error about `var`=`value`, with what is accepted.
pub(crate) fn bad(var: &str, value: &str, reason: String, accepted: &'static str) -> ConfigError {
    ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        reason,
        accepted,
    }
}

/// Merges the drivers' hand-over into `config`, whose `GPUCAP_*` and HAMi-core
/// variables are read already (`gpucap_limit`: `GPUCAP_LIMIT` as set, if it is). Cap
/// sources must agree; the claim's directory becomes the pool when no `GPUCAP_POOL`
/// names another; the toolkit's request becomes the guarantee where the process shares
/// a pool with a cap of its own (`GPUCAP_LIMIT`).
pub fn apply(
    config: &mut Config,
    vars: &HandoverVars,
    raw: &dyn Fn(&str) -> Option<String>,
    explicit_claim_dir: bool,
) -> Result<(), ConfigError> {
    let drivers = [
        vgpu_manager::read(vars)?,
        dra_example::read(vars)?,
        nvidia_toolkit::read(vars)?,
    ];
    // The sources read so far: GPUCAP_LIMIT and/or HAMi-core's (already merged).
    if let Some(spec) = &config.limit {
        let name = match spec.from {
            LimitFrom::Gpucap | LimitFrom::Both => {
                format!("GPUCAP_LIMIT={:?}", raw("GPUCAP_LIMIT").unwrap_or_default())
            }
            _ => {
                let vars: Vec<String> = config
                    .origins
                    .iter()
                    .map(|o| format!("{}={:?}", o.var, o.value))
                    .collect();
                let driver = config.origins.first().map_or("HAMi-core", |o| o.driver);
                format!("{} ({driver})", vars.join(", "))
            }
        };
        let (var, value) = match config.origins.iter().find(|o| o.driver != "gpucap") {
            Some(o) if spec.from != LimitFrom::Gpucap && spec.from != LimitFrom::Both => {
                (o.var.clone(), o.value.clone())
            }
            _ => (
                "GPUCAP_LIMIT".to_string(),
                raw("GPUCAP_LIMIT").unwrap_or_default(),
            ),
        };
        if config.cap_sources.is_empty() {
            config.cap_sources.push(CapSource {
                name,
                var,
                value,
                spec: spec.clone(),
            });
        }
    }
    let none = raw("GPUCAP_LIMIT").filter(|v| limit_is_none(v));
    let pooled_with_own_cap = config.pool.is_some() && raw("GPUCAP_LIMIT").is_some();
    for d in drivers {
        if let (Some(v), Some((source, _))) = (&none, &d.cap) {
            return Err(none_conflict(v, &source.name));
        }
        config.notes.extend(d.notes);
        if !explicit_claim_dir {
            config.notes.extend(d.no_claim_dir);
        }
        if let Some((spec, name)) = d.request {
            toolkit_shares(config, &d.cap, spec, &name, pooled_with_own_cap, raw)?;
            if pooled_with_own_cap {
                // The limit became the ceiling: not a cap source.
                continue;
            }
        }
        if let Some((source, origins)) = d.cap {
            add_cap(config, source)?;
            config.origins.extend(origins);
        }
        if let Some((dir, why)) = d.claim_dir.filter(|_| !explicit_claim_dir) {
            set_claim_pool(config, dir, &why, raw)?;
        }
    }
    Ok(())
}

/// The error of `GPUCAP_LIMIT=none` (`v`) beside a driver's grant (`source`): the
/// driver's library would have enforced the grant, so running uncapped is refused.
pub(crate) fn none_conflict(v: &str, source: &str) -> ConfigError {
    ConfigError {
        var: "GPUCAP_LIMIT".into(),
        value: v.to_string(),
        reason: format!(
            "none asks for no cap, and {source} grants one; unset one of them (the driver's \
             grant is what the scheduler counted)"
        ),
        accepted: "",
    }
}

/// Adds a cap source: it must agree with every one before it (where that can be told
/// before the GPUs are known); the first source's spec is the one enforced.
fn add_cap(config: &mut Config, source: CapSource) -> Result<(), ConfigError> {
    for earlier in &config.cap_sources {
        if earlier.has_uuid_keys() || source.has_uuid_keys() {
            continue; // compared against the visible GPUs (check_sources_agree)
        }
        agree_by_ordinal(earlier, &source)?;
    }
    if config.limit.is_none() {
        config.limit = Some(source.spec.clone());
    } else if let Some(l) = config.limit.as_mut()
        && l.from == LimitFrom::Gpucap
    {
        l.from = LimitFrom::Both;
    }
    config.cap_sources.push(source);
    Ok(())
}

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
fn agree_by_ordinal(a: &CapSource, b: &CapSource) -> Result<(), ConfigError> {
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

/// The claim's directory becomes the pool, unless `GPUCAP_POOL` names another.
fn set_claim_pool(
    config: &mut Config,
    dir: std::path::PathBuf,
    why: &str,
    raw: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let claim = PoolSpec::Claim(dir);
    if let (Some(ours), Some(v)) = (&config.pool, raw("GPUCAP_POOL"))
        && *ours != claim
    {
        return Err(ConfigError {
            var: "GPUCAP_POOL".into(),
            value: v,
            reason: format!(
                "it names another pool than the claim's, {claim} ({why}); unset GPUCAP_POOL: \
                 every container of the claim shares that one"
            ),
            accepted: "",
        });
    }
    config.notes.push(claim_pool_note(&claim, why));
    config.pool = Some(claim);
    Ok(())
}

/// The line `gpucap check` prints for a claim's pool.
pub fn claim_pool_note(claim: &PoolSpec, why: &str) -> String {
    format!(
        "pool: one per claim, {claim} ({why}): every process of every container of the \
         claim shares its cap"
    )
}

/// The toolkit's request and limit where the process shares a pool whose cap is
/// `GPUCAP_LIMIT`: the request becomes the guarantee and the limit the ceiling (each
/// agreeing with `GPUCAP_GUARANTEE`/`GPUCAP_CEILING` if set). Elsewhere the limit is
/// the cap and the request only noted (nothing shares a pool to guarantee it against).
fn toolkit_shares(
    config: &mut Config,
    cap: &Option<(CapSource, Vec<Origin>)>,
    request: LimitSpec,
    request_name: &str,
    pooled_with_own_cap: bool,
    raw: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if !pooled_with_own_cap {
        config.notes.push(format!(
            "note: {request_name} is a guarantee only in a pool shared with others (GPUCAP_POOL \
             and its cap GPUCAP_LIMIT); here the container is capped at its limit"
        ));
        return Ok(());
    }
    let Some((limit, origins)) = cap else {
        return Ok(());
    };
    let guarantee = request.default.filter(|l| *l != Limit::Bytes(0));
    for (var, field, value, name) in [
        (
            "GPUCAP_CEILING",
            &mut config.ceiling,
            limit.spec.default,
            limit.name.as_str(),
        ),
        (
            "GPUCAP_GUARANTEE",
            &mut config.guarantee,
            guarantee,
            request_name,
        ),
    ] {
        let Some(value) = value else { continue };
        match field {
            Some(ours) if ours.default != Some(value) || !ours.devices.is_empty() => {
                return Err(ConfigError {
                    var: var.into(),
                    value: raw(var).unwrap_or_default(),
                    reason: format!(
                        "disagrees with {name}, which gives {value}; set only one of them, or \
                         both to the same value"
                    ),
                    accepted: "",
                });
            }
            Some(_) => {}
            None => {
                *field = Some(LimitSpec {
                    default: Some(value),
                    devices: Vec::new(),
                    from: LimitFrom::Handover(NVIDIA_TOOLKIT),
                });
            }
        }
    }
    config.origins.extend(origins.iter().cloned());
    config.notes.push(format!(
        "note: in the pool, {} is this process's ceiling and {request_name} its guarantee",
        limit.name
    ));
    check_shares(config, |v| raw(v))
}

#[cfg(test)]
mod tests;
