//! The caps that the cluster's GPU drivers hand a container in its environment, each
//! read by its own file, and the one resolver that merges them with `GPUCAP_LIMIT` and
//! HAMi-core's variables (`from_vars`, in `env.rs`, calls [`apply`]):
//!
//! | file | driver | variables |
//! | --- | --- | --- |
//! | `vgpu_manager.rs` | vgpu-manager (`manager.nvidia.com`) | `CUDA_MEM_LIMIT[_<i>]`, `MANAGER_VISIBLE_DEVICE_<i>` |
//! | `dra_example.rs` | the Kubernetes DRA example driver | `GPU_DEVICE_<ID>_MEMORY` |
//! | `nvidia_toolkit.rs` | NVIDIA container toolkit | `NVIDIA_GPU_MEMORY_LIMIT`, `NVIDIA_GPU_MEMORY_REQUEST` |
//! | `hami_dra.rs` | HAMi's DRA kubelet plugin | HAMi-core's variables in a claim's directory |
//!
//! `handover.rs` holds what each of those files reads ([`HandoverVars`]) and gives
//! (`Handover`); this file, the resolver over them.
//!
//! Every source that gives a cap is a [`CapSource`]; two that give one GPU different
//! caps are an error naming both (fail closed): `agreement.rs` compares them, those keyed
//! by ordinal here as they are read, a GPU named by UUID against the visible GPUs in the
//! one key check the shim and the CLI both make (`check_gpu_keys`, in `keys.rs`).

mod dra_example;
mod hami_dra;
mod handover;
mod nvidia_toolkit;
mod quantity;
mod vgpu_manager;

pub use dra_example::DRA_EXAMPLE;
pub use hami_dra::{
    HAMI_CLASSIC, HAMI_DRA, NVIDIA_VISIBLE_DEVICES, hami_claim_dir, hami_classic_by_uuid,
    hami_dra_spec, merge_hami_by_uuid,
};
pub use handover::HandoverVars;
pub use nvidia_toolkit::NVIDIA_TOOLKIT;
pub use vgpu_manager::VGPU_MANAGER;

use super::agreement::agree_by_ordinal;
use super::limit::{Limit, LimitFrom, LimitSpec, limit_is_none};
use super::model::{CapSource, Config, ConfigError, Origin};
use super::pool_vars::{CONTAINER_POOL, PoolSpec};
use super::shares::check_shares;

/// Whether a driver source reads a variable of this name (the shim copies only those,
/// and only those make the shim skip the configuration file).
pub fn is_handover_name(name: &[u8]) -> bool {
    vgpu_manager::looks_at(name) || dra_example::looks_at(name) || nvidia_toolkit::looks_at(name)
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
    // The first grant that no claim directory comes with: the container's (and whether
    // its driver has claim directories at all, one of which GPUCAP_CLAIM_DIR may name).
    let mut container_grant = None;
    for d in drivers {
        let has_claims = d.no_claim_dir.is_some() || d.claim_dir.is_some();
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
            if d.claim_dir.is_none() && container_grant.is_none() {
                container_grant = Some((source.name.clone(), has_claims));
            }
            add_cap(config, source)?;
            config.origins.extend(origins);
        }
        if let Some((dir, why)) = d.claim_dir.filter(|_| !explicit_claim_dir) {
            set_claim_pool(config, dir, &why, raw)?;
        }
    }
    if let Some((grant, has_claims)) = container_grant {
        set_container_pool(config, grant, has_claims, raw);
    }
    Ok(())
}

/// A driver's grant that no claim directory comes with (the DRA example driver's, the
/// toolkit's, vgpu-manager's without its claim's directory) is the container's: its
/// processes share it in the container's pool ([`CONTAINER_POOL`]), not each the whole
/// of it. The environment may not leave that pool (`GPUCAP_POOL=off` or another pool):
/// a process of the container doing so would hold the grant beside its siblings'. It
/// stays, said in a line. `GPUCAP_POOL_DIR` places it (a pod's volume where `/dev/shm`
/// cannot be written; set for the whole container). A claim's directory named
/// (`GPUCAP_CLAIM_DIR`) is that claim's pool where the driver has claim directories
/// (`has_claims`: vgpu-manager's, mounted elsewhere); otherwise it, or HAMi-core's cache
/// file, would leave the container's pool as another `GPUCAP_POOL` would.
fn set_container_pool(
    config: &mut Config,
    grant: String,
    has_claims: bool,
    raw: &dyn Fn(&str) -> Option<String>,
) {
    let container = PoolSpec::Name(CONTAINER_POOL.into());
    match (&config.pool, raw("GPUCAP_POOL")) {
        (Some(p), _) if *p == container => {}
        (_, Some(v)) => config.notes.push(leaving_container_pool(&v, &grant)),
        (Some(PoolSpec::Claim(_)), None) if has_claims => return,
        (Some(_), None) => {
            let var = if raw("GPUCAP_CLAIM_DIR").is_some() {
                "GPUCAP_CLAIM_DIR"
            } else {
                super::hami::HAMI_SHARED_CACHE
            };
            let asked = match raw(var) {
                Some(v) => format!("{var}={v:?}"),
                None => var.to_string(),
            };
            config.notes.push(leaving_container_pool_as(&asked, &grant));
        }
        (None, None) => {}
    }
    config.info.push(container_pool_note(&grant));
    config.pool = Some(container);
    config.pool_of_grant = Some(grant);
}

/// The line of `GPUCAP_POOL=v` (off, or another pool) beside `grant`.
pub fn leaving_container_pool(v: &str, grant: &str) -> String {
    leaving_container_pool_as(&format!("GPUCAP_POOL={v:?}"), grant)
}

/// The line of `asked` (a variable naming another pool than the container's, as set)
/// beside `grant`.
fn leaving_container_pool_as(asked: &str, grant: &str) -> String {
    format!(
        "{asked} would leave the container's pool, which shares {grant}: the process stays \
         in it (a driver's grant is the container's, not each process's)"
    )
}

/// The line `gpucap check` prints for a grant's container pool.
pub fn container_pool_note(grant: &str) -> String {
    format!(
        "pool: one per container, {CONTAINER_POOL} (the container's mount namespace): every \
         process of the container shares {grant}"
    )
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
    config.info.push(claim_pool_note(&claim, why));
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
             and its cap GPUCAP_LIMIT); here the container's processes share the limit, and \
             the request is only noted"
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
