//! GPU keys against the visible GPUs: the one check that the shim (at `cuInit`, and in
//! its NVML hooks) and `gpucap check`/`gpucap run` (before the program starts) make,
//! so that they can never disagree.
//!
//! Every per-GPU variable is checked: `GPUCAP_LIMIT` (with HAMi-core's
//! `CUDA_DEVICE_MEMORY_LIMIT_<n>`, which become its ordinal keys), `GPUCAP_GUARANTEE` and
//! `GPUCAP_CEILING`. A key must name a GPU the process sees: an ordinal below the number
//! of visible GPUs (after `CUDA_VISIBLE_DEVICES`), or the UUID of one of them (the 16
//! bytes compared, so `GPU-…` and `MIG-…` spellings are the same), and no GPU may be named
//! twice in one variable (by its ordinal and by its UUID). A key that names no GPU would
//! cap, guarantee or bound nothing, silently: the error is the one line to print, naming
//! the variable, the key and the keys that are accepted.

use super::agreement::{check_sources_agree, sources_need_gpus};
use super::limit::{DeviceKey, LimitFrom, LimitSpec, format_uuid};
use super::model::Config;

/// The visible GPUs listed in an error at most (64 would make a line of 3 KB).
const LISTED: usize = 16;

/// The per-GPU variables of `config` that name GPUs, in the order they are checked:
/// how to name the variable of a key, and the spec.
///
/// A ceiling's keys (a file's, /etc's over it) are checked as the environment's are: one
/// that names no GPU the process sees would hold none (a MIG instance's parent GPU named
/// by its UUID, say) while the environment's cap, under no ceiling there, would.
fn keyed(config: &Config) -> impl Iterator<Item = (Var, &LimitSpec)> {
    [
        (Var::Limit, config.limit.as_ref()),
        (Var::Named("GPUCAP_GUARANTEE"), config.guarantee.as_ref()),
        (Var::Named("GPUCAP_CEILING"), config.ceiling.as_ref()),
        (
            Var::Named("the configuration file's GPUCAP_LIMIT (a ceiling)"),
            config.bound.as_ref().map(|b| &b.spec),
        ),
        (
            Var::Named("/etc/gpucap/gpucap.env's GPUCAP_LIMIT (a ceiling)"),
            config.outer.as_ref().map(|b| &b.spec),
        ),
    ]
    .into_iter()
    .filter_map(|(var, spec)| Some((var, spec.filter(|s| !s.devices.is_empty())?)))
}

/// Whether any per-GPU variable of `config` names a GPU (then the driver must be asked
/// which GPUs there are before the keys can be checked).
pub fn names_gpus(config: &Config) -> bool {
    keyed(config).next().is_some() || sources_need_gpus(config)
}

/// Checks the keys of every per-GPU variable of `config` against the GPUs visible to
/// CUDA: `count` of them (None when the driver could not say), whose UUIDs by ordinal
/// `uuids()` gives (asked once, and only when a UUID key or an error needs them; None
/// when the driver could not list them). The error is the one line to print,
/// `gpucap: GPUCAP_GUARANTEE names GPU 1, but only 1 GPU is visible ...; accepted keys: 0
/// or GPU-…`.
pub fn check_gpu_keys<'a>(
    config: &Config,
    count: Option<usize>,
    uuids: impl FnOnce() -> Option<&'a [[u8; 16]]>,
) -> Result<(), String> {
    check_all_keys(config, count, uuids).map_err(|e| super::typed::name_flags_in(&e, &config.typed))
}

/// [`check_gpu_keys`], its line naming the variables.
fn check_all_keys<'a>(
    config: &Config,
    count: Option<usize>,
    uuids: impl FnOnce() -> Option<&'a [[u8; 16]]>,
) -> Result<(), String> {
    let mut visible = Visible::new(count, uuids);
    for (var, spec) in keyed(config) {
        check_spec(var, spec, &mut visible)?;
    }
    // Every other source of caps naming a GPU by UUID, against the visible GPUs; then
    // the sources compared on each of them.
    for source in config.cap_sources.iter().skip(1) {
        if !source.spec.devices.is_empty() {
            check_spec(Var::Limit, &source.spec, &mut visible)?;
        }
    }
    if sources_need_gpus(config) {
        check_sources_agree(config, visible.uuids())?;
    }
    Ok(())
}

/// [`check_gpu_keys`] for one variable `var` (not `GPUCAP_LIMIT`, whose keys may come
/// from HAMi-core's variables and are named by them): for a caller that has one spec.
pub fn check_var_keys<'a>(
    var: &'static str,
    spec: &LimitSpec,
    count: Option<usize>,
    uuids: impl FnOnce() -> Option<&'a [[u8; 16]]>,
) -> Result<(), String> {
    let var = if var == "GPUCAP_LIMIT" {
        Var::Limit
    } else {
        Var::Named(var)
    };
    check_spec(var, spec, &mut Visible::new(count, uuids))
}

/// How a variable is named in messages.
#[derive(Clone, Copy)]
enum Var {
    /// `GPUCAP_LIMIT`, or the HAMi-core variable an ordinal key came from.
    Limit,
    Named(&'static str),
}

impl Var {
    fn name(self, spec: &LimitSpec, key: &DeviceKey) -> String {
        match (self, key) {
            (Var::Named(v), _) => v.to_string(),
            (Var::Limit, DeviceKey::Ordinal(n)) => spec.var_for_ordinal(*n),
            (Var::Limit, DeviceKey::Uuid(_)) => match spec.from {
                LimitFrom::Handover(vars) => vars.to_string(),
                _ => "GPUCAP_LIMIT".to_string(),
            },
        }
    }
}

/// The visible GPUs: their count, and their UUIDs asked for at most once.
struct Visible<'a, F> {
    count: Option<usize>,
    query: Option<F>,
    uuids: Option<&'a [[u8; 16]]>,
}

impl<'a, F: FnOnce() -> Option<&'a [[u8; 16]]>> Visible<'a, F> {
    fn new(count: Option<usize>, query: F) -> Self {
        Visible {
            count,
            query: Some(query),
            uuids: None,
        }
    }

    fn uuids(&mut self) -> Option<&'a [[u8; 16]]> {
        if let Some(q) = self.query.take() {
            self.uuids = q();
        }
        self.uuids
    }

    /// `; accepted keys: 0 or GPU-…, 1 or GPU-…`: what a key may be here.
    fn accepted(&mut self) -> String {
        let Some(count) = self.count else {
            return String::new();
        };
        if count == 0 {
            return "; accepted keys: none (no GPU is visible to CUDA)".to_string();
        }
        let shown = count.min(LISTED);
        let more = match count - shown {
            0 => String::new(),
            n => format!(", and {n} more up to {}", count - 1),
        };
        match self.uuids().filter(|u| u.len() == count) {
            Some(uuids) => {
                let each: Vec<String> = uuids[..shown]
                    .iter()
                    .enumerate()
                    .map(|(n, u)| format!("{n} or {}", format_uuid(false, u)))
                    .collect();
                format!("; accepted keys: {}{more}", each.join(", "))
            }
            None => {
                let ordinals = if count == 1 {
                    "0".to_string()
                } else {
                    format!("0 to {}", count - 1)
                };
                format!("; accepted keys: {ordinals} (the driver could not list the GPUs' UUIDs)")
            }
        }
    }
}

/// Checks one variable's keys: ordinals first, then UUIDs.
fn check_spec<'a, F: FnOnce() -> Option<&'a [[u8; 16]]>>(
    var: Var,
    spec: &LimitSpec,
    visible: &mut Visible<'a, F>,
) -> Result<(), String> {
    for (key, _) in &spec.devices {
        let DeviceKey::Ordinal(n) = *key else {
            continue;
        };
        let name = var.name(spec, key);
        let Some(count) = visible.count else {
            return Err(format!(
                "gpucap: {name} names {key}, but the driver could not say how many GPUs are \
                 visible to CUDA"
            ));
        };
        if n as usize >= count {
            let seen = match count {
                0 => "no GPU is visible to CUDA".to_string(),
                1 => "only 1 GPU is visible to CUDA (GPU 0)".to_string(),
                c => format!("only {c} GPUs are visible to CUDA (GPU 0 to GPU {})", c - 1),
            };
            return Err(format!(
                "gpucap: {name} names {key}, but {seen}; ordinals count the GPUs \
                 CUDA_VISIBLE_DEVICES leaves visible, from 0{}",
                visible.accepted()
            ));
        }
    }
    for (key, _) in &spec.devices {
        let DeviceKey::Uuid(uuid) = key else {
            continue;
        };
        let name = var.name(spec, key);
        let Some(uuids) = visible.uuids() else {
            return Err(format!(
                "gpucap: {name} names {uuid}, but the driver could not list the UUIDs of the \
                 visible GPUs"
            ));
        };
        let Some(ordinal) = uuids.iter().position(|u| *u == uuid.bytes) else {
            return Err(format!(
                "gpucap: {name} names {uuid}, which matches none of the {} GPU(s) visible to \
                 CUDA (CUDA_VISIBLE_DEVICES may hide it; with MIG on, CUDA's devices are the \
                 MIG-… instances; `nvidia-smi -L` lists the UUIDs){}",
                uuids.len(),
                visible.accepted()
            ));
        };
        if spec
            .devices
            .iter()
            .any(|(k, _)| *k == DeviceKey::Ordinal(ordinal as u32))
        {
            return Err(format!(
                "gpucap: {name} names GPU {ordinal} twice: by its ordinal and as {uuid}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_vars;

    fn uuid(n: u8) -> [u8; 16] {
        let mut u = [0u8; 16];
        u[0] = 0xfa;
        u[1] = 0xce;
        u[15] = n;
        u
    }

    fn gpu(n: u8) -> String {
        format_uuid(false, &uuid(n))
    }

    fn config(pairs: &[(&str, &str)]) -> Config {
        let mut all = vec![("GPUCAP_POOL", "p")];
        all.extend_from_slice(pairs);
        from_vars(all).unwrap()
    }

    /// One visible GPU, physical GPU 1 (as `CUDA_VISIBLE_DEVICES=1` leaves it).
    fn one(c: &Config) -> Result<(), String> {
        let v = [uuid(1)];
        check_gpu_keys(c, Some(1), || Some(&v[..]))
    }

    #[test]
    fn every_per_gpu_variable_and_key_form() {
        for var in ["GPUCAP_LIMIT", "GPUCAP_GUARANTEE", "GPUCAP_CEILING"] {
            let value = if var == "GPUCAP_LIMIT" {
                "1Gi"
            } else {
                "512Mi"
            };
            for (key, named) in [
                ("0".to_string(), None),
                (gpu(1), None),
                (gpu(1).replace("GPU-", "MIG-"), None),
                (gpu(1).to_uppercase(), None),
                ("1".to_string(), Some("GPU 1".to_string())),
                ("63".to_string(), Some("GPU 63".to_string())),
                (gpu(0), Some(gpu(0))),
                (
                    gpu(9).replace("GPU-", "MIG-"),
                    Some(gpu(9).replace("GPU-", "MIG-")),
                ),
            ] {
                let c = config(&[(var, &format!("{key}={value}"))]);
                match named {
                    None => assert_eq!(one(&c), Ok(()), "{var}={key}"),
                    Some(k) => {
                        let e = one(&c).unwrap_err();
                        assert!(e.starts_with(&format!("gpucap: {var} names {k}")), "{e}");
                        assert!(
                            e.ends_with(&format!("; accepted keys: 0 or {}", gpu(1))),
                            "{e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_exact_lines() {
        let c = config(&[("GPUCAP_GUARANTEE", "1=1Gi")]);
        assert_eq!(
            one(&c).unwrap_err(),
            format!(
                "gpucap: GPUCAP_GUARANTEE names GPU 1, but only 1 GPU is visible to CUDA (GPU 0); \
                 ordinals count the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0; accepted \
                 keys: 0 or {}",
                gpu(1)
            )
        );
        let two = [uuid(3), uuid(4)];
        let c = config(&[("GPUCAP_CEILING", &format!("{}=1Gi", gpu(9)))]);
        assert_eq!(
            check_gpu_keys(&c, Some(2), || Some(&two[..])).unwrap_err(),
            format!(
                "gpucap: GPUCAP_CEILING names {}, which matches none of the 2 GPU(s) visible to \
                 CUDA (CUDA_VISIBLE_DEVICES may hide it; with MIG on, CUDA's devices are the \
                 MIG-… instances; `nvidia-smi -L` lists the UUIDs); accepted keys: 0 or {}, 1 \
                 or {}",
                gpu(9),
                gpu(3),
                gpu(4)
            )
        );
    }

    #[test]
    fn the_first_bad_variable_is_named_limit_first() {
        let c = config(&[
            ("GPUCAP_LIMIT", "4Gi,2=1Gi"),
            ("GPUCAP_GUARANTEE", "1=1Gi"),
            ("GPUCAP_CEILING", "3=2Gi"),
        ]);
        assert!(
            one(&c)
                .unwrap_err()
                .starts_with("gpucap: GPUCAP_LIMIT names GPU 2")
        );
        let c = config(&[
            ("GPUCAP_LIMIT", "4Gi,0=1Gi"),
            ("GPUCAP_GUARANTEE", &format!("{}=1Gi", gpu(1))),
            ("GPUCAP_CEILING", "3=2Gi"),
        ]);
        assert!(
            one(&c)
                .unwrap_err()
                .starts_with("gpucap: GPUCAP_CEILING names GPU 3")
        );
    }

    #[test]
    fn hami_keys_are_named_by_their_variable() {
        let c = from_vars([("CUDA_DEVICE_MEMORY_LIMIT_1", "8g")]).unwrap();
        let e = one(&c).unwrap_err();
        assert!(
            e.starts_with("gpucap: CUDA_DEVICE_MEMORY_LIMIT_1 names GPU 1, but only 1 GPU"),
            "{e}"
        );
        let v = [uuid(1), uuid(2)];
        assert_eq!(check_gpu_keys(&c, Some(2), || Some(&v[..])), Ok(()));
    }

    #[test]
    fn uuids_are_asked_only_when_needed_and_once() {
        // Ordinal keys that are fine, or no keys at all: the driver is never asked.
        let c = config(&[("GPUCAP_LIMIT", "4Gi,0=2Gi"), ("GPUCAP_CEILING", "0=1Gi")]);
        assert_eq!(check_gpu_keys(&c, Some(1), || panic!("not asked")), Ok(()));
        let c = config(&[("GPUCAP_LIMIT", "4Gi"), ("GPUCAP_GUARANTEE", "1Gi")]);
        assert!(!names_gpus(&c));
        assert_eq!(check_gpu_keys(&c, None, || panic!("not asked")), Ok(()));
        // UUID keys in two variables: one question.
        let c = config(&[
            ("GPUCAP_GUARANTEE", &format!("{}=1Gi", gpu(1))),
            ("GPUCAP_CEILING", &format!("{}=2Gi", gpu(1))),
        ]);
        assert!(names_gpus(&c));
        let v = [uuid(1)];
        let mut asked = 0;
        let r = check_gpu_keys(&c, Some(1), || {
            asked += 1;
            Some(&v[..])
        });
        assert_eq!((r, asked), (Ok(()), 1));
    }

    #[test]
    fn what_the_driver_could_not_say_fails_closed() {
        let c = config(&[("GPUCAP_GUARANTEE", "0=1Gi")]);
        let e = check_gpu_keys(&c, None, || None).unwrap_err();
        assert!(e.contains("could not say how many"), "{e}");
        let c = config(&[("GPUCAP_CEILING", &format!("{}=1Gi", gpu(1)))]);
        let e = check_gpu_keys(&c, Some(1), || None).unwrap_err();
        assert!(
            e.starts_with("gpucap: GPUCAP_CEILING names") && e.contains("could not list"),
            "{e}"
        );
        // An ordinal past them with the UUIDs unknown: the ordinals are still listed.
        let c = config(&[("GPUCAP_CEILING", "2=1Gi")]);
        let e = check_gpu_keys(&c, Some(2), || None).unwrap_err();
        assert!(
            e.ends_with("; accepted keys: 0 to 1 (the driver could not list the GPUs' UUIDs)"),
            "{e}"
        );
        let e = check_gpu_keys(&c, Some(0), || None).unwrap_err();
        assert!(
            e.ends_with("; accepted keys: none (no GPU is visible to CUDA)"),
            "{e}"
        );
    }

    #[test]
    fn a_gpu_named_twice_is_an_error() {
        let c = config(&[("GPUCAP_GUARANTEE", &format!("0=1Gi,{}=1Gi", gpu(1)))]);
        let e = one(&c).unwrap_err();
        assert_eq!(
            e,
            format!(
                "gpucap: GPUCAP_GUARANTEE names GPU 0 twice: by its ordinal and as {}",
                gpu(1)
            )
        );
    }

    #[test]
    fn many_gpus_are_listed_up_to_a_bound() {
        let c = config(&[("GPUCAP_LIMIT", "40=1Gi")]);
        let v: Vec<[u8; 16]> = (0..40).map(uuid).collect();
        let e = check_gpu_keys(&c, Some(40), || Some(&v[..])).unwrap_err();
        assert!(e.contains(&format!("15 or {}", gpu(15))), "{e}");
        assert!(!e.contains(&gpu(16)), "{e}");
        assert!(e.ends_with(", and 24 more up to 39"), "{e}");
        assert_eq!(
            check_var_keys(
                "GPUCAP_GUARANTEE",
                &c.limit.clone().unwrap(),
                Some(41),
                || { Some(&v[..]) }
            ),
            Ok(())
        );
    }
}
