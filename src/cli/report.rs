//! The text `gpucap check` prints: pure functions of the configuration and the probe.

use std::path::Path;

use super::driver::{Device, Probe};
use gpucap_core::config::{self, Config, DeviceKey, Limit, LimitFrom, LimitSpec};
use gpucap_core::size::format_bytes;

/// `8 GiB (8589934592 bytes)` or `50% of physical memory`.
pub fn limit_text(limit: Limit) -> String {
    match limit {
        Limit::Bytes(b) => format!("{} ({b} bytes)", format_bytes(b)),
        Limit::Fraction(_) => format!("{limit} of physical memory"),
    }
}

/// The `limit:` line's text, e.g.
/// `GPU 0: 8 GiB (8589934592 bytes); other GPUs: 50% of physical memory`.
pub fn describe_limit(spec: Option<&LimitSpec>) -> String {
    let Some(spec) = spec else {
        return "none (GPUCAP_LIMIT unset: allocations are counted, not capped)".to_string();
    };
    let mut parts: Vec<String> = spec
        .devices
        .iter()
        .map(|(key, limit)| match key {
            DeviceKey::Ordinal(_) | DeviceKey::Uuid(_) => format!("{key}: {}", limit_text(*limit)),
        })
        .collect();
    let others = if spec.devices.is_empty() {
        "every GPU"
    } else {
        "other GPUs"
    };
    match spec.default {
        Some(limit) => parts.push(format!("{others}: {}", limit_text(limit))),
        None => parts.push(format!("{others}: not capped (counted only)")),
    }
    parts.join("; ")
}

/// A guarantee or ceiling as given: `4 GiB`, `GPU 1: 25%; other GPUs: 2 GiB`.
fn share_text(spec: &LimitSpec) -> String {
    let mut parts: Vec<String> = spec
        .devices
        .iter()
        .map(|(k, l)| format!("{k}: {l}"))
        .collect();
    if let Some(l) = spec.default {
        parts.push(if spec.devices.is_empty() {
            l.to_string()
        } else {
            format!("other GPUs: {l}")
        });
    }
    parts.join("; ")
}

/// One device's line, e.g. `GPU 0: cap 4294967296 bytes (4 GiB) of 85899345920 (80 GiB)`.
pub fn device_line(device: &Device, limit: Option<Limit>) -> String {
    let total = format!("{} ({})", device.total, format_bytes(device.total));
    let mut line = match limit {
        None => format!("GPU {}: no cap (counted only) of {total}", device.ordinal),
        Some(limit) => {
            let cap = limit.resolve(device.total);
            let mut l = format!(
                "GPU {}: cap {cap} bytes ({}) of {total}",
                device.ordinal,
                format_bytes(cap)
            );
            if cap > device.total {
                l.push_str("; more than the GPU has, so it never binds");
            }
            l
        }
    };
    if let Some(name) = &device.name {
        line.push_str(&format!(" [{name}]"));
    }
    line
}

/// For each UUID key of `GPUCAP_LIMIT`, which visible GPU it names (a key that names
/// none is an error, found by [`key_check`] before the report is made).
pub fn uuid_key_notes(spec: &LimitSpec, devices: &[Device]) -> Vec<String> {
    spec.uuid_keys()
        .filter_map(|key| {
            let d = devices.iter().find(|d| d.uuid == Some(key.bytes))?;
            let var = match spec.from {
                gpucap_core::config::LimitFrom::Handover(vars) => vars,
                _ => "GPUCAP_LIMIT",
            };
            Some(format!("note: {var} key {key} is GPU {}", d.ordinal))
        })
        .collect()
}

/// Checks the keys of every per-GPU variable of `config` against the GPUs the driver
/// listed, with the shim's own check at `cuInit` (`config::check_gpu_keys`): the error
/// is the very line the shim would print (`gpucap: GPUCAP_GUARANTEE names GPU 1, but
/// only 1 GPU is visible ...; accepted keys: 0 or GPU-…`).
///
/// In a pool, each GPU's guarantee and ceiling are then checked against its cap with
/// the very function the shim claims them with when it joins (`budget::shares::for_gpu`):
/// what the library would refuse at `cuInit` is refused here, before anything (a
/// program, a pool file) is started or made.
pub fn key_check(config: &Config, devices: &[Device]) -> Result<(), String> {
    let uuids: Option<Vec<[u8; 16]>> = devices.iter().map(|d| d.uuid).collect();
    gpucap_core::config::check_gpu_keys(config, Some(devices.len()), || uuids.as_deref())?;
    let Some(pool) = &config.pool else {
        return Ok(());
    };
    let all: Vec<[u8; 16]> = devices.iter().map(|d| d.uuid.unwrap_or_default()).collect();
    for d in devices {
        let cap = config
            .limit
            .as_ref()
            .and_then(|l| l.for_device(d.ordinal, d.uuid.as_ref()))
            .map(|l| l.resolve(d.total));
        gpucap_core::budget::shares::for_gpu(config, d.ordinal as usize, &all, cap)
            .map_err(|e| format!("gpucap: pool {pool}: GPU {}: {e}", d.ordinal))?;
    }
    Ok(())
}

/// The `growth:` line of `gpucap check`.
pub fn growth_line(on: bool) -> &'static str {
    if on {
        "growth: on (memory the program frees stays with the process and serves its later \
         allocations; never handed back before exit)"
    } else {
        "growth: off"
    }
}

/// The `report:` line of `gpucap check`.
pub fn report_line(report: Option<&Path>) -> String {
    match report {
        None => "report: none".to_string(),
        Some(p) => {
            let per_process = p.as_os_str().to_string_lossy().contains("%p");
            format!(
                "report: {} (JSON usage report at exit; {})",
                p.display(),
                if per_process {
                    "%p = the process id"
                } else {
                    "processes sharing it add their entries"
                }
            )
        }
    }
}

/// The warning `gpucap check` prints on stderr when the driver could not be asked, as
/// every command prints its warnings: `gpucap: no NVIDIA driver: ...`, as `run` does.
pub fn probe_warning(probe: &Probe) -> Option<String> {
    match probe {
        Probe::NoDriver(why) => Some(format!("gpucap: {}", super::driver::no_driver_line(why))),
        Probe::Failed(why) => Some(format!(
            "gpucap: CUDA driver found but unusable: {why}; fractions resolve at run time"
        )),
        Probe::Devices(_) => None,
    }
}

/// Everything `gpucap check` prints after validating the configuration. `library` is
/// the library `run` would preload, or the error that says why none was found.
/// `preloaded` says this process already runs under a libgpucap.so preload.
/// `config_file` is the `gpucap.env` the configuration came from (the environment had
/// no GPUCAP_* variable), as the shim would read it. `pool_line` is the `pool:` line
/// (see `pool::check_line`).
pub fn check_report(
    config: &Config,
    library: Result<&Path, &str>,
    probe: &Probe,
    preloaded: bool,
    config_file: Option<&Path>,
    pool_line: &str,
) -> String {
    let mut out = vec!["gpucap: configuration OK".to_string()];
    match config_file {
        Some(file) if config.bound.is_some() => out.push(format!(
            "configuration: the environment's, under the ceiling of {}",
            file.display()
        )),
        Some(file) => out.push(format!(
            "configuration: from {} (the environment has no GPUCAP_* variable)",
            file.display()
        )),
        None => {}
    }
    if config.bound.is_some() {
        out.push(
            "limit: on each GPU the smaller of the ceiling and the environment's (below)"
                .to_string(),
        );
    } else {
        out.push(format!("limit: {}", describe_limit(config.limit.as_ref())));
    }
    out.extend(ceiling_lines(config));
    if let Some(spec) = config
        .limit
        .as_ref()
        .filter(|s| s.from != LimitFrom::Gpucap)
    {
        out.push(format!("limit source: from {}", spec.source()));
    }
    if config
        .limit
        .as_ref()
        .is_some_and(|s| s.from != LimitFrom::Gpucap)
    {
        for o in &config.origins {
            let gpu = match &o.key {
                None => "every GPU".to_string(),
                Some(k) => k.to_string(),
            };
            out.push(format!("cap from {}, for {gpu}", o.text()));
        }
    }
    out.extend(config.notes.iter().cloned());
    out.push(format!("log: {}", config.log));
    out.push(growth_line(config.growth).to_string());
    out.push(report_line(config.report.as_deref()));
    out.push(pool_line.to_string());
    for (what, spec, meaning) in [
        (
            "guarantee",
            &config.guarantee,
            "kept for this process in its pool even before it allocates it",
        ),
        (
            "ceiling",
            &config.ceiling,
            "the most this process may hold of its pool",
        ),
    ] {
        if let Some(spec) = spec {
            out.push(format!(
                "{what}: {} ({meaning}; a % is of the pool's cap)",
                share_text(spec)
            ));
        }
    }
    if config.ld_so_preload {
        out.push(
            "ld.so.preload: on (the container entrypoint installs libgpucap.so in /etc/ld.so.preload)"
                .to_string(),
        );
    }
    match library {
        Ok(path) => out.push(format!("library: {}", path.display())),
        Err(_) => out.push("library: NOT FOUND".to_string()),
    }
    match probe {
        // The reason is a warning, on stderr (see [`probe_warning`]), as `run` gives it.
        Probe::NoDriver(_) => {
            out.push("devices: unknown (no NVIDIA driver could be loaded)".to_string());
        }
        Probe::Failed(_) => {
            out.push("devices: unknown (the CUDA driver could not list them)".to_string());
        }
        Probe::Devices(devices) => {
            let n = devices.len();
            out.push(format!(
                "devices: {n} visible to CUDA{}",
                if n == 0 { "" } else { ":" }
            ));
            for d in devices {
                if let Some((cap, note)) = device_under_ceiling(config, d) {
                    out.push(device_line(d, cap) + &note);
                    continue;
                }
                let limit = config
                    .limit
                    .as_ref()
                    .and_then(|s| s.for_device(d.ordinal, d.uuid.as_ref()));
                let mut line = device_line(d, limit);
                if let Some(spec) = config.limit.as_ref().filter(|s| s.from == LimitFrom::Hami)
                    && limit.is_some()
                {
                    line.push_str(&format!(" (from {})", spec.var_for_ordinal(d.ordinal)));
                } else if config
                    .limit
                    .as_ref()
                    .is_some_and(|s| matches!(s.from, LimitFrom::Handover(_) | LimitFrom::Both))
                    && limit.is_some()
                {
                    let from: Vec<String> = config
                        .origins
                        .iter()
                        .filter(|o| o.covers(d.ordinal, d.uuid.as_ref()))
                        .map(|o| o.text())
                        .collect();
                    if !from.is_empty() {
                        line.push_str(&format!(" (from {})", from.join(", ")));
                    }
                }
                out.push(line);
            }
            if let Some(spec) = &config.limit {
                out.extend(uuid_key_notes(spec, devices));
            }
            if preloaded {
                out.push(
                    "note: this process runs with libgpucap.so in LD_PRELOAD, so the totals \
                     above may already be capped values"
                        .to_string(),
                );
            }
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}

/// The lines of a file's ceiling: the ceiling and its file, and what the environment
/// asked (empty without a ceiling).
pub fn ceiling_lines(config: &Config) -> Vec<String> {
    let Some(b) = &config.bound else {
        return Vec::new();
    };
    let mut out = vec![format!(
        "ceiling: {} (from {}: the environment may lower it, never raise or remove it)",
        describe_limit(Some(&b.spec)),
        b.from
    )];
    if let Some(asked) = &b.asked {
        out.push(format!(
            "asked: {asked} (the environment's; on each GPU the smaller of it and the ceiling \
             holds)"
        ));
    }
    out
}

/// GPU `d`'s cap in bytes under a ceiling, and what to add to its line: where the cap
/// came from. None without a ceiling.
pub fn device_under_ceiling(config: &Config, d: &Device) -> Option<(Option<Limit>, String)> {
    let b = config.bound.as_ref()?;
    let asked = if b.asked_none {
        None
    } else {
        config
            .limit
            .as_ref()
            .and_then(|s| s.for_device(d.ordinal, d.uuid.as_ref()))
    };
    let ceiling = b.spec.for_device(d.ordinal, d.uuid.as_ref());
    let capped = config::cap_under(asked, ceiling, Some(d.total));
    let note = match (&b.asked, capped.held, capped.cap) {
        (Some(asked), true, Some(cap)) => format!(
            " (the ceiling from {}, {}: {asked} asks more)",
            b.from,
            format_bytes(cap)
        ),
        (Some(asked), false, Some(_)) => {
            format!(" (from {asked}, under the ceiling of {})", b.from)
        }
        (None, _, Some(_)) => format!(" (from {})", b.from),
        (_, _, None) => String::new(),
    };
    Some((capped.cap.map(Limit::Bytes), note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpucap_core::config::{LogLevel, parse_limit_spec};
    use std::path::PathBuf;

    const GI: u64 = 1 << 30;

    fn spec(s: &str) -> Option<LimitSpec> {
        Some(parse_limit_spec(s).unwrap())
    }

    #[test]
    fn limit_lines() {
        assert_eq!(
            describe_limit(spec("0=8Gi,50%").as_ref()),
            "GPU 0: 8 GiB (8589934592 bytes); other GPUs: 50% of physical memory"
        );
        assert_eq!(
            describe_limit(spec("8Gi").as_ref()),
            "every GPU: 8 GiB (8589934592 bytes)"
        );
        assert_eq!(
            describe_limit(spec("1=12.5%").as_ref()),
            "GPU 1: 12.5% of physical memory; other GPUs: not capped (counted only)"
        );
        assert!(describe_limit(None).starts_with("none"));
    }

    fn dev(ordinal: u32, total: u64) -> Device {
        Device {
            ordinal,
            total,
            name: None,
            uuid: None,
        }
    }

    #[test]
    fn device_lines() {
        assert_eq!(
            device_line(&dev(0, 80 * GI), Some(Limit::Bytes(4 * GI))),
            "GPU 0: cap 4294967296 bytes (4 GiB) of 85899345920 (80 GiB)"
        );
        assert_eq!(
            device_line(&dev(1, 80 * GI), Some(Limit::Fraction(0.5))),
            "GPU 1: cap 42949672960 bytes (40 GiB) of 85899345920 (80 GiB)"
        );
        assert_eq!(
            device_line(&dev(2, 16 * GI), None),
            "GPU 2: no cap (counted only) of 17179869184 (16 GiB)"
        );
        assert!(device_line(&dev(0, GI), Some(Limit::Bytes(2 * GI))).contains("never binds"));
        let named = Device {
            name: Some("Fake GPU".into()),
            ..dev(0, GI)
        };
        assert!(device_line(&named, None).ends_with(" [Fake GPU]"));
    }

    #[test]
    fn whole_report() {
        let config = Config {
            limit: spec("0=8Gi,50%"),
            log: LogLevel::Warn,
            ..Config::default()
        };
        let lib = PathBuf::from("/x/libgpucap.so");
        let text = check_report(
            &config,
            Ok(&lib),
            &Probe::NoDriver("libcuda.so.1: cannot open".into()),
            false,
            None,
            "pool: none (each process is capped alone)",
        );
        assert_eq!(
            text,
            "gpucap: configuration OK\n\
             limit: GPU 0: 8 GiB (8589934592 bytes); other GPUs: 50% of physical memory\n\
             log: warn\n\
             growth: off\n\
             report: none\n\
             pool: none (each process is capped alone)\n\
             library: /x/libgpucap.so\n\
             devices: unknown (no NVIDIA driver could be loaded)\n"
        );
        // The reason goes to stderr, with the prefix every warning has.
        let warning = probe_warning(&Probe::NoDriver("libcuda.so.1: cannot open".into()));
        assert_eq!(
            warning.as_deref(),
            Some(
                "gpucap: no NVIDIA driver: libcuda.so.1 cannot be loaded (libcuda.so.1: cannot \
                 open); to try gpucap without a GPU, use its fake GPU: see \"Without a GPU\" \
                 under \"Using it\" in README.md (scripts/fake-gpu.sh)"
            )
        );
        assert!(
            probe_warning(&Probe::Failed("cuInit: 999".into()))
                .unwrap()
                .starts_with("gpucap: CUDA driver found but unusable: cuInit: 999")
        );
        assert_eq!(probe_warning(&Probe::Devices(Vec::new())), None);
        let probe = Probe::Devices(vec![dev(0, 80 * GI), dev(1, 80 * GI)]);
        let config = Config {
            limit: spec("4Gi,1=1Gi"),
            ..Config::default()
        };
        let text = check_report(&config, Err("missing"), &probe, true, None, "pool: none");
        assert!(text.contains("library: NOT FOUND\n"));
        assert!(text.contains("devices: 2 visible to CUDA:\n"));
        assert!(text.contains("GPU 0: cap 4294967296 bytes (4 GiB) of 85899345920 (80 GiB)\n"));
        assert!(text.contains("GPU 1: cap 1073741824 bytes"));
        assert!(text.contains("may already be capped"));
    }

    /// A configuration whose only setting is `GPUCAP_LIMIT=s`.
    fn limited(s: &str) -> Config {
        Config {
            limit: spec(s),
            ..Config::default()
        }
    }

    #[test]
    fn keys_past_the_visible_gpus_are_errors() {
        let two = [dev(0, 80 * GI), dev(1, 80 * GI)];
        assert_eq!(key_check(&limited("4Gi,1=1Gi"), &two), Ok(()));
        assert_eq!(key_check(&limited("4Gi"), &[]), Ok(()));
        let e = key_check(&limited("4Gi,5=1Gi"), &two).unwrap_err();
        assert_eq!(
            e,
            "gpucap: GPUCAP_LIMIT names GPU 5, but only 2 GPUs are visible to CUDA (GPU 0 to \
             GPU 1); ordinals count the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0; \
             accepted keys: 0 to 1 (the driver could not list the GPUs' UUIDs)"
        );
        let e = key_check(&limited("0=1Gi"), &[]).unwrap_err();
        assert!(
            e.starts_with("gpucap: GPUCAP_LIMIT names GPU 0, but no GPU is visible to CUDA;"),
            "{e}"
        );
        // A UUID key needs every visible GPU's UUID.
        let u = "GPU-face0000-0000-0000-0000-000000000001";
        let e = key_check(&limited(&format!("{u}=1Gi")), &two).unwrap_err();
        assert!(e.contains("could not list the UUIDs"), "{e}");
        // The keys of a guarantee and a ceiling are checked the same way.
        for var in ["GPUCAP_GUARANTEE", "GPUCAP_CEILING"] {
            let config =
                gpucap_core::config::from_vars([("GPUCAP_POOL", "p"), (var, "5=1Gi")]).unwrap();
            let e = key_check(&config, &two).unwrap_err();
            assert!(e.starts_with(&format!("gpucap: {var} names GPU 5")), "{e}");
        }
    }

    #[test]
    fn uuid_keys_are_shown_and_checked() {
        const U1: &str = "GPU-face0000-0000-0000-0000-000000000001";
        const U7: &str = "MIG-face0000-0000-0000-0000-000000000007";
        let mut u1 = [0u8; 16];
        u1[0] = 0xfa;
        u1[1] = 0xce;
        u1[15] = 1;
        let config = Config {
            limit: spec(&format!("{U1}=2Gi,{U7}=1Gi")),
            ..Config::default()
        };
        assert_eq!(
            describe_limit(config.limit.as_ref()),
            format!(
                "{U1}: 2 GiB (2147483648 bytes); {U7}: 1 GiB (1073741824 bytes); other GPUs: not capped (counted only)"
            )
        );
        let probe = Probe::Devices(vec![
            dev(0, 8 * GI),
            Device {
                uuid: Some(u1),
                ..dev(1, 8 * GI)
            },
        ]);
        let text = check_report(&config, Err("missing"), &probe, false, None, "pool: none");
        assert!(text.contains("GPU 0: no cap (counted only)"), "{text}");
        assert!(
            text.contains("GPU 1: cap 2147483648 bytes (2 GiB)"),
            "{text}"
        );
        assert!(
            text.contains(&format!("note: GPUCAP_LIMIT key {U1} is GPU 1\n")),
            "{text}"
        );
        // A key that names no GPU gets no note: key_check stops `check` before.
        assert!(!text.contains(&format!("key {U7}")), "{text}");
        let listed = [
            Device {
                uuid: Some([0; 16]),
                ..dev(0, GI)
            },
            Device {
                uuid: Some(u1),
                ..dev(1, GI)
            },
        ];
        let e = key_check(&config, &listed).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "gpucap: GPUCAP_LIMIT names {U7}, which matches none of the 2 GPU(s)"
            )),
            "{e}"
        );
    }

    #[test]
    fn growth_report_and_source_lines() {
        let config = Config {
            growth: true,
            report: Some(PathBuf::from("/tmp/r-%p.json")),
            ld_so_preload: true,
            ..Config::default()
        };
        let file = PathBuf::from("/opt/gpucap/gpucap.env");
        let text = check_report(
            &config,
            Err("missing"),
            &Probe::NoDriver("x".into()),
            false,
            Some(&file),
            "pool: none",
        );
        assert!(text.contains("\nconfiguration: from /opt/gpucap/gpucap.env (the environment has no GPUCAP_* variable)\n"), "{text}");
        assert!(
            text.contains("\ngrowth: on (memory the program frees"),
            "{text}"
        );
        assert!(
            text.contains(
                "\nreport: /tmp/r-%p.json (JSON usage report at exit; %p = the process id)\n"
            ),
            "{text}"
        );
        assert!(text.contains("\nld.so.preload: on"), "{text}");
        assert_eq!(
            report_line(Some(Path::new("/r.json"))),
            "report: /r.json (JSON usage report at exit; processes sharing it add their entries)"
        );
    }
}

#[cfg(test)]
mod ceiling_tests {
    use super::*;
    use gpucap_core::config::{Ceiling, parse_limit_spec};

    fn dev(total: u64) -> Device {
        Device {
            ordinal: 0,
            total,
            name: None,
            uuid: None,
        }
    }

    fn under(asked: Option<&str>, none: bool) -> Config {
        Config {
            limit: Some(parse_limit_spec(asked.unwrap_or("256Mi")).unwrap()),
            bound: Some(Ceiling {
                spec: parse_limit_spec("256Mi").unwrap(),
                from: "/x/gpucap.env".into(),
                asked: asked
                    .map(|a| format!("GPUCAP_LIMIT={a:?}"))
                    .or(none.then(|| "GPUCAP_LIMIT=\"none\"".into())),
                asked_none: none,
            }),
            ..Config::default()
        }
    }

    #[test]
    fn a_device_shows_the_figure_that_holds_and_where_it_came_from() {
        const MIB: u64 = 1 << 20;
        let gpu = dev(4 << 30);
        let (cap, note) = device_under_ceiling(&under(Some("4Gi"), false), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes(256 * MIB)));
        assert!(
            note.contains("the ceiling from /x/gpucap.env, 256 MiB"),
            "{note}"
        );
        assert!(note.contains("GPUCAP_LIMIT=\"4Gi\" asks more"), "{note}");
        let (cap, note) = device_under_ceiling(&under(Some("50%"), false), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes(256 * MIB)), "{note}");
        let (cap, note) = device_under_ceiling(&under(Some("3%"), false), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes((4u64 << 30) * 3 / 100)));
        assert!(note.contains("under the ceiling"), "{note}");
        let (cap, note) = device_under_ceiling(&under(None, true), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes(256 * MIB)));
        assert!(note.contains("GPUCAP_LIMIT=\"none\" asks more"), "{note}");
        let lines = ceiling_lines(&under(Some("4Gi"), false));
        assert!(
            lines[0].starts_with("ceiling: every GPU: 256 MiB"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("asked: GPUCAP_LIMIT=\"4Gi\""),
            "{lines:?}"
        );
        assert!(ceiling_lines(&Config::default()).is_empty());
    }
}
