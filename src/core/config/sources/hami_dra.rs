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

use std::path::{Path, PathBuf};

use super::*;

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
