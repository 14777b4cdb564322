//! NVIDIA's container toolkit (NVIDIA/nvidia-container-toolkit,
//! cmd/nvidia-cdi-hook/apply-cuda-memory-limits/apply-cuda-memory-limits.go): its CDI
//! hook reads `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT`, whole MiB
//! (`strconv.ParseUint(_, 10, 64)`), one value for every GPU of the container, and acts
//! only when both are set, with request <= limit. gpucap reads them the same way and
//! refuses what the hook would ignore or refuse (one without the other, request above
//! limit, anything but digits), and a zero limit.

use super::handover::{Handover, HandoverVars, bad};
use crate::config::limit::{Limit, LimitFrom, LimitSpec};
use crate::config::model::{CapSource, ConfigError, Origin};

pub const NVIDIA_TOOLKIT: &str = "NVIDIA container toolkit";
pub const NVIDIA_LIMIT: &str = "NVIDIA_GPU_MEMORY_LIMIT";
pub const NVIDIA_REQUEST: &str = "NVIDIA_GPU_MEMORY_REQUEST";
const PREFIX: &str = "NVIDIA_GPU_MEMORY_";
pub const NVIDIA_ACCEPTED: &str = "a whole number of MiB (decimal digits), the same for the request and at least it for the limit, e.g. 4096";

pub(super) fn looks_at(name: &[u8]) -> bool {
    name.starts_with(PREFIX.as_bytes())
}

fn mib(var: &str, v: &str) -> Result<u64, ConfigError> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(
            var,
            v,
            "not a whole number of MiB".into(),
            NVIDIA_ACCEPTED,
        ));
    }
    v.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << 20))
        .ok_or_else(|| bad(var, v, "too large".into(), NVIDIA_ACCEPTED))
}

/// Reads the toolkit's two variables.
pub(super) fn read(vars: &HandoverVars) -> Result<Handover, ConfigError> {
    let mut out = Handover::default();
    for (name, value) in vars.with_prefix(PREFIX) {
        if name != NVIDIA_LIMIT && name != NVIDIA_REQUEST {
            return Err(bad(
                name,
                value,
                format!(
                    "unknown variable (a typo?): the toolkit's hook reads {NVIDIA_LIMIT} and \
                     {NVIDIA_REQUEST} only, so this one caps nothing there"
                ),
                "",
            ));
        }
    }
    let (limit, request) = (vars.get(NVIDIA_LIMIT), vars.get(NVIDIA_REQUEST));
    let (l, r) = match (limit, request) {
        (None, None) => return Ok(out),
        (Some(l), Some(r)) => (l, r),
        (Some(v), None) | (None, Some(v)) => {
            let (set, unset) = if limit.is_some() {
                (NVIDIA_LIMIT, NVIDIA_REQUEST)
            } else {
                (NVIDIA_REQUEST, NVIDIA_LIMIT)
            };
            return Err(bad(
                set,
                v,
                format!(
                    "{unset} is not set: the toolkit's hook applies both or neither (it ignores \
                     one alone); set both"
                ),
                "",
            ));
        }
    };
    let (lb, rb) = (mib(NVIDIA_LIMIT, l)?, mib(NVIDIA_REQUEST, r)?);
    if lb == 0 {
        return Err(bad(
            NVIDIA_LIMIT,
            l,
            "a limit of 0 would refuse every allocation".into(),
            NVIDIA_ACCEPTED,
        ));
    }
    if rb > lb {
        return Err(bad(
            NVIDIA_REQUEST,
            r,
            format!("the request is above {NVIDIA_LIMIT}={l} (the toolkit's hook refuses it too)"),
            NVIDIA_ACCEPTED,
        ));
    }
    let one = |b: u64| LimitSpec {
        default: Some(Limit::Bytes(b)),
        devices: Vec::new(),
        from: LimitFrom::Handover("NVIDIA_GPU_MEMORY_LIMIT"),
    };
    let origin = |var: &str, value: &str| Origin {
        var: var.into(),
        value: value.into(),
        driver: NVIDIA_TOOLKIT,
        key: None,
    };
    out.cap = Some((
        CapSource {
            name: format!("{NVIDIA_LIMIT}={l:?} ({NVIDIA_TOOLKIT})"),
            var: NVIDIA_LIMIT.into(),
            value: l.into(),
            spec: one(lb),
        },
        vec![origin(NVIDIA_LIMIT, l)],
    ));
    out.request = Some((one(rb), format!("{NVIDIA_REQUEST}={r:?}")));
    Ok(out)
}
