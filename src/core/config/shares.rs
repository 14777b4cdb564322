//! `GPUCAP_GUARANTEE` and `GPUCAP_CEILING`: a pool member's floor and ceiling, in
//! `GPUCAP_LIMIT`'s grammar (read by [`parse_limit_spec`]), except that a fraction or
//! percentage is of the pool's cap, not of the GPU. Only inside a pool.

use super::keys::check_var_keys;
use super::limit::{DeviceKey, Limit, LimitSpec, ZERO_CAP, parse_limit_spec};
use super::model::{Config, ConfigError};

pub const GUARANTEE_ACCEPTED: &str = "a size or a share of the pool's cap, as GPUCAP_LIMIT: 4Gi, \
     512MiB, 25%, 0.25, 0=4Gi,1=2Gi, GPU-<uuid>=4Gi (only with GPUCAP_POOL)";
pub const CEILING_ACCEPTED: &str = "a size or a share of the pool's cap, as GPUCAP_LIMIT: 6Gi, \
     75%, 0.75, 0=6Gi,1=50%, GPU-<uuid>=6Gi (only with GPUCAP_POOL; at most the cap)";

/// Parses a `GPUCAP_GUARANTEE` or `GPUCAP_CEILING` value (`var` names it in messages).
pub fn parse_share_spec(var: &str, value: &str) -> Result<LimitSpec, String> {
    parse_limit_spec(value).map_err(|reason| {
        if reason.contains(ZERO_CAP) {
            // Said of a cap; of a share, the remedy differs.
            reason.replace(
                ZERO_CAP,
                &format!("0 bytes is no {}: leave {var} unset instead", what(var)),
            )
        } else {
            reason
                .replace("GPUCAP_LIMIT", var)
                .replace("a share of the GPU", "a share of the pool's cap")
        }
    })
}

fn what(var: &str) -> &'static str {
    if var == "GPUCAP_CEILING" {
        "ceiling (nothing could be allocated)"
    } else {
        "guarantee"
    }
}

/// A share's bytes on a device whose pool cap is `cap` (None: no cap): bytes as given,
/// a fraction of the cap. Err: a fraction of a pool without a cap.
pub fn resolve_share(limit: Limit, cap: Option<u64>) -> Result<u64, String> {
    match (limit, cap) {
        (Limit::Bytes(b), _) => Ok(b),
        (Limit::Fraction(_), Some(cap)) => Ok(limit.resolve(cap)),
        (Limit::Fraction(_), None) => Err(format!(
            "{limit} is a share of the pool's cap, and the pool has no cap (set GPUCAP_LIMIT)"
        )),
    }
}

/// The guarantee and ceiling of the visible GPU `ordinal` (`uuid`) whose pool cap is
/// `cap`, in bytes (None: not set), after checking the keys against the visible GPUs
/// (`uuids`): a key naming no visible GPU is an error ([`check_var_keys`]; the shim
/// has checked them all at `cuInit` already, with `check_gpu_keys`).
pub fn shares_for(
    config: &Config,
    ordinal: usize,
    uuids: &[[u8; 16]],
    cap: Option<u64>,
) -> Result<(Option<u64>, Option<u64>), String> {
    let one = |var: &'static str, spec: Option<&LimitSpec>| -> Result<Option<u64>, String> {
        let Some(spec) = spec else {
            return Ok(None);
        };
        check_var_keys(var, spec, Some(uuids.len()), || Some(uuids))
            .map_err(|e| e.trim_start_matches("gpucap: ").to_string())?;
        match spec.for_device(ordinal as u32, uuids.get(ordinal)) {
            None => Ok(None),
            Some(l) => resolve_share(l, cap)
                .map(Some)
                .map_err(|e| format!("{var}: {e}")),
        }
    };
    Ok((
        one("GPUCAP_GUARANTEE", config.guarantee.as_ref())?,
        one("GPUCAP_CEILING", config.ceiling.as_ref())?,
    ))
}

/// Checks what can be checked before the GPUs are known: a pool is named, the guarantee
/// is not above the ceiling nor the ceiling above the cap wherever both are bytes or
/// both shares of the cap. The rest is checked when the process joins its pool
/// (`budget::shares::check`). `raw` gives each variable's value as set, for messages.
pub fn check_shares(
    config: &Config,
    raw: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let (g, c) = (config.guarantee.as_ref(), config.ceiling.as_ref());
    if g.is_none() && c.is_none() {
        return Ok(());
    }
    let bad = |var: &str, reason: String| ConfigError {
        var: var.to_string(),
        value: raw(var).unwrap_or_default(),
        reason,
        accepted: "",
    };
    if config.pool.is_none() {
        let var = if g.is_some() {
            "GPUCAP_GUARANTEE"
        } else {
            "GPUCAP_CEILING"
        };
        return Err(bad(
            var,
            "a guarantee or a ceiling is a share of a pool (GPUCAP_POOL): without one, the \
             process is capped alone by GPUCAP_LIMIT"
                .into(),
        ));
    }
    for key in keys_of(&[config.limit.as_ref(), g, c]) {
        let at = |s: Option<&LimitSpec>| s.and_then(|s| limit_at(s, &key));
        let (cap, g, c) = (at(config.limit.as_ref()), at(g), at(c));
        let on = match &key {
            None => String::new(),
            Some(k) => format!(" for {k}"),
        };
        if let (Some(Limit::Bytes(cb)), Some(Limit::Bytes(capb))) = (c, cap)
            && cb > capb
        {
            return Err(bad(
                "GPUCAP_CEILING",
                format!(
                    "the ceiling{on} ({}) is above the pool's cap ({}, GPUCAP_LIMIT)",
                    Limit::Bytes(cb),
                    Limit::Bytes(capb)
                ),
            ));
        }
        // Bytes against bytes, shares of the cap against shares of the cap.
        let above = |a: Option<Limit>, b: Option<Limit>| match (a, b) {
            (Some(Limit::Bytes(x)), Some(Limit::Bytes(y))) => x > y,
            (Some(Limit::Fraction(x)), Some(Limit::Fraction(y))) => x > y,
            _ => false,
        };
        if above(g, c) {
            return Err(bad(
                "GPUCAP_GUARANTEE",
                format!(
                    "the guarantee{on} ({}) is above the ceiling ({}, GPUCAP_CEILING)",
                    g.unwrap_or(Limit::Bytes(0)),
                    c.unwrap_or(Limit::Bytes(0))
                ),
            ));
        }
        if let (Some(Limit::Bytes(gb)), Some(Limit::Bytes(capb))) = (g, cap)
            && gb > capb
        {
            return Err(bad(
                "GPUCAP_GUARANTEE",
                format!(
                    "the guarantee{on} ({}) is above the pool's cap ({}, GPUCAP_LIMIT)",
                    Limit::Bytes(gb),
                    Limit::Bytes(capb)
                ),
            ));
        }
    }
    // With no cap on any GPU, a share of the cap is a share of nothing: the pool has no
    // cap. Said here, where the configuration is read (by the shim and by `gpucap check`
    // and `run` alike), not first when the process joins its pool at cuInit.
    if config.limit.is_none() {
        for (var, spec) in [("GPUCAP_GUARANTEE", g), ("GPUCAP_CEILING", c)] {
            let fraction = spec.and_then(|s| {
                s.default
                    .into_iter()
                    .chain(s.devices.iter().map(|(_, l)| *l))
                    .find(|l| matches!(l, Limit::Fraction(_)))
            });
            if let Some(l) = fraction {
                return Err(bad(var, resolve_share(l, None).err().unwrap_or_default()));
            }
        }
    }
    Ok(())
}

/// The value of `spec` for `key` (None: the default).
fn limit_at(spec: &LimitSpec, key: &Option<DeviceKey>) -> Option<Limit> {
    match key {
        None => spec.default,
        Some(k) => spec
            .devices
            .iter()
            .find(|(k2, _)| k2 == k)
            .map(|&(_, l)| l)
            .or(spec.default),
    }
}

/// The default (None) and every device key named by any of `specs`.
fn keys_of(specs: &[Option<&LimitSpec>]) -> Vec<Option<DeviceKey>> {
    let mut keys = vec![None];
    for s in specs.iter().flatten() {
        for (k, _) in &s.devices {
            if !keys.contains(&Some(k.clone())) {
                keys.push(Some(k.clone()));
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_vars;

    fn vars(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        from_vars(pairs.iter().copied())
    }
    const GIB: u64 = 1 << 30;

    #[test]
    fn guarantee_and_ceiling_read_like_the_limit() {
        let c = vars(&[
            ("GPUCAP_POOL", "p"),
            ("GPUCAP_LIMIT", "10Gi"),
            ("GPUCAP_GUARANTEE", "4Gi"),
            ("GPUCAP_CEILING", "0=75%,1=6Gi"),
        ])
        .unwrap();
        assert_eq!(c.guarantee.unwrap().default, Some(Limit::Bytes(4 * GIB)));
        let ceiling = c.ceiling.unwrap();
        assert_eq!(ceiling.for_ordinal(0), Some(Limit::Fraction(0.75)));
        assert_eq!(ceiling.for_ordinal(1), Some(Limit::Bytes(6 * GIB)));
        assert_eq!(ceiling.for_ordinal(2), None, "no ceiling: the cap");
    }

    #[test]
    fn a_share_is_of_the_pools_cap() {
        assert_eq!(
            resolve_share(Limit::Fraction(0.25), Some(8 * GIB)),
            Ok(2 * GIB)
        );
        assert_eq!(resolve_share(Limit::Bytes(3), None), Ok(3));
        let e = resolve_share(Limit::Fraction(0.25), None).unwrap_err();
        assert!(e.contains("no cap") && e.contains("25%"), "{e}");
    }

    #[test]
    fn outside_a_pool_both_are_errors() {
        for var in ["GPUCAP_GUARANTEE", "GPUCAP_CEILING"] {
            let e = vars(&[("GPUCAP_LIMIT", "8Gi"), (var, "2Gi")]).unwrap_err();
            assert_eq!(e.var, var);
            assert_eq!(e.value, "2Gi");
            assert!(e.reason.contains("GPUCAP_POOL"), "{e}");
            // GPUCAP_POOL=off is no pool either.
            let e = vars(&[("GPUCAP_POOL", "off"), (var, "2Gi")]).unwrap_err();
            assert_eq!(e.var, var);
        }
    }

    #[test]
    fn guarantee_above_ceiling_or_ceiling_above_cap_is_an_error() {
        let pool = ("GPUCAP_POOL", "p");
        let e = vars(&[pool, ("GPUCAP_GUARANTEE", "6Gi"), ("GPUCAP_CEILING", "4Gi")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_GUARANTEE");
        assert!(e.reason.contains("above the ceiling"), "{e}");
        let e = vars(&[pool, ("GPUCAP_GUARANTEE", "60%"), ("GPUCAP_CEILING", "50%")]).unwrap_err();
        assert!(e.reason.contains("above the ceiling"), "{e}");
        let e = vars(&[pool, ("GPUCAP_LIMIT", "8Gi"), ("GPUCAP_CEILING", "9Gi")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_CEILING");
        assert!(e.reason.contains("above the pool's cap (8 GiB"), "{e}");
        let e = vars(&[pool, ("GPUCAP_LIMIT", "8Gi"), ("GPUCAP_GUARANTEE", "9Gi")]).unwrap_err();
        assert!(e.reason.contains("above the pool's cap"), "{e}");
        // Per GPU: only GPU 1's pair is wrong, and the message says so.
        let e = vars(&[
            pool,
            ("GPUCAP_GUARANTEE", "2Gi,1=5Gi"),
            ("GPUCAP_CEILING", "4Gi"),
        ])
        .unwrap_err();
        assert!(e.reason.contains("for GPU 1"), "{e}");
        // Bytes against a share of a GPU-relative cap: checked when joining, not here.
        assert!(vars(&[pool, ("GPUCAP_LIMIT", "50%"), ("GPUCAP_CEILING", "9Gi")]).is_ok());
        assert!(vars(&[pool, ("GPUCAP_GUARANTEE", "4Gi"), ("GPUCAP_CEILING", "4Gi")]).is_ok());
    }

    #[test]
    fn bad_values_name_the_variable_and_what_is_accepted() {
        let pool = ("GPUCAP_POOL", "p");
        let e = vars(&[pool, ("GPUCAP_GUARANTEE", "lots")]).unwrap_err();
        assert_eq!(e.var, "GPUCAP_GUARANTEE");
        assert_eq!(e.accepted, GUARANTEE_ACCEPTED);
        let e = vars(&[pool, ("GPUCAP_GUARANTEE", "0")]).unwrap_err();
        assert!(e.reason.contains("leave GPUCAP_GUARANTEE unset"), "{e}");
        let e = vars(&[pool, ("GPUCAP_CEILING", "150%")]).unwrap_err();
        assert_eq!(
            (e.var.as_str(), e.accepted),
            ("GPUCAP_CEILING", CEILING_ACCEPTED)
        );
    }
}
