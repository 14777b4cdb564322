//! The text `gpucap check` prints: pure functions of the configuration and the probe.
//! The lines of a cap are `limits.rs`'s, those under a file's ceiling `ceiling.rs`'s;
//! `keys.rs` checks the per-GPU keys against the GPUs listed.

mod ceiling;
mod keys;
mod limits;

use std::path::Path;

use gpucap_core::config::{Config, LimitFrom};

pub use ceiling::ceiling_lines;
pub use keys::key_check;

use ceiling::device_under_ceiling;
use limits::{describe_limit, device_line, share_text, uuid_key_notes};

use crate::driver::{self, Probe};

/// The `growth:` line of `gpucap check`.
pub fn growth_line(on: bool) -> &'static str {
    if on {
        "growth: on (memory the program frees stays with the process and serves its later \
         allocations; never handed back before exit)"
    } else {
        "growth: off"
    }
}

/// The `wait:` line of `gpucap check`, with a pool: how long an allocation the pool
/// cannot take now waits for its members to free memory (`GPUCAP_WAIT`), and which flag
/// or variable said so: `set.wait`, the environment's (its flags applied); else a wait
/// is the configuration file's (`file`), as its cap is named with it, and so is none
/// where the file says `GPUCAP_WAIT=0` (`set.wait_in_file`).
pub fn wait_line(config: &Config, set: Set, file: ConfigFile) -> String {
    let said = set.wait || set.wait_in_file;
    let set = set.wait;
    let from = match file {
        _ if set && config.typed.contains(&"--wait") => "--wait".to_string(),
        ConfigFile::Whole(f) | ConfigFile::Over(f) if !set => {
            format!("GPUCAP_WAIT in {}", f.display())
        }
        _ => "GPUCAP_WAIT".to_string(),
    };
    let ms = config.wait.as_millis();
    if ms == 0 && said {
        return format!(
            "wait: none (from {from}: an allocation the pool cannot take now is refused at once)"
        );
    }
    if ms == 0 {
        return "wait: none (an allocation the pool cannot take now is refused at once; \
                --wait or GPUCAP_WAIT sets a wait)"
            .to_string();
    }
    let shown = if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    };
    format!(
        "wait: {shown} (from {from}: an allocation the pool cannot take now waits up to \
         {shown} for its members to free memory)"
    )
}

/// Why a report at `p` cannot be written, where that is known before the program runs
/// (the shim says at exit that it wrote nothing; `check` and `run` say it before).
pub fn unwritable(p: &Path) -> Option<String> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if p.is_dir() {
        Some("it is a directory: nothing will be written (name a file)".to_string())
    } else if dir.is_dir() {
        None
    } else if dir.exists() {
        Some(format!(
            "{} is not a directory: nothing will be written",
            dir.display()
        ))
    } else {
        Some(format!(
            "its directory {} does not exist: nothing will be written",
            dir.display()
        ))
    }
}

/// The `report:` line of `gpucap check`.
pub fn report_line(report: Option<&Path>) -> String {
    match report {
        None => "report: none".to_string(),
        Some(p) => {
            let per_process = p.as_os_str().to_string_lossy().contains("%p");
            let missing = unwritable(p).map_or(String::new(), |why| format!("; {why}"));
            format!(
                "report: {} (JSON usage report at exit; {}){missing}",
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
        Probe::NoDriver(why) => Some(format!("gpucap: {}", driver::no_driver_line(why))),
        Probe::Failed(why) => Some(format!(
            "gpucap: CUDA driver found but unusable: {why}; fractions resolve at run time"
        )),
        Probe::Devices(_) => None,
    }
}

/// The `gpucap.env` the shim would read beside the environment's configuration.
#[derive(Clone, Copy, Debug)]
pub enum ConfigFile<'a> {
    /// None: the environment's configuration alone.
    Absent,
    /// The environment has no GPUCAP_* variable: the file is the whole configuration.
    Whole(&'a Path),
    /// The environment has variables of its own: the file is a ceiling over them (where
    /// it sets a cap) and fills what they leave unset.
    Over(&'a Path),
}

/// What the environment (its flags applied) set itself, and the file, for lines that name where a
/// setting came from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Set {
    /// `GPUCAP_LIMIT=none` (or `--limit none`); else a `none` is the file's.
    pub limit_none: bool,
    /// `GPUCAP_WAIT` (or `--wait`).
    pub wait: bool,
    /// `GPUCAP_WAIT` in the configuration file (a `0` there is named with the file).
    pub wait_in_file: bool,
}

/// Everything `gpucap check` prints after validating the configuration. `library` is
/// the library `run` would preload, or the error that says why none was found.
/// `preloaded` says this process already runs under a libgpucap.so preload.
/// `file` is the `gpucap.env` the shim would read, and its part. `pool_line` is the
/// `pool:` line (see `pool::check_line`).
pub fn check_report(
    config: &Config,
    library: Result<&Path, &str>,
    probe: &Probe,
    preloaded: bool,
    file: ConfigFile,
    pool_line: &str,
    set: Set,
) -> String {
    // Not "OK" where the library `run` would preload is missing: check then fails (exit 2).
    let first = match library {
        Ok(_) => "gpucap: configuration OK",
        Err(_) => "gpucap: configuration valid, but no libgpucap.so to preload (below)",
    };
    let mut out = vec![first.to_string()];
    match file {
        ConfigFile::Over(f) if config.bound.is_some() => out.push(format!(
            "configuration: the environment's, under the ceiling of {}",
            f.display()
        )),
        ConfigFile::Over(f) => out.push(format!(
            "configuration: the environment's, with {} (it sets no cap, so no ceiling; it \
             fills what the environment leaves unset)",
            f.display()
        )),
        ConfigFile::Whole(f) => out.push(format!(
            "configuration: from {} (the environment has no GPUCAP_* variable)",
            f.display()
        )),
        ConfigFile::Absent => {}
    }
    if config.bound.is_some() {
        out.push(
            "limit: on each GPU the smaller of the ceiling and the environment's (below)"
                .to_string(),
        );
    } else {
        let none_from = config.limit_none.then(|| match file {
            ConfigFile::Whole(f) | ConfigFile::Over(f) if !set.limit_none => {
                format!("GPUCAP_LIMIT=none in {}", f.display())
            }
            _ if config.typed.contains(&"--limit") => "--limit none".to_string(),
            _ => "GPUCAP_LIMIT=none".to_string(),
        });
        out.push(format!(
            "limit: {}",
            describe_limit(config.limit.as_ref(), none_from.as_deref())
        ));
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
    out.extend(config.info.iter().cloned());
    out.push(format!("log: {}", config.log));
    out.push(growth_line(config.growth).to_string());
    out.push(report_line(config.report.as_deref()));
    out.push(pool_line.to_string());
    if config.pool.is_some() {
        out.push(wait_line(config, set, file));
    }
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
                // No cap, but this member's ceiling in the pool: that holds it.
                let ceiling = config
                    .ceiling
                    .as_ref()
                    .and_then(|s| s.for_device(d.ordinal, d.uuid.as_ref()))
                    .filter(|_| limit.is_none());
                if let Some(ceiling) = ceiling {
                    out.push(
                        device_line(d, Some(ceiling))
                            + " (this process's ceiling in the pool, which has no cap)",
                    );
                    continue;
                }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::driver::Device;
    use gpucap_core::config::{LimitSpec, LogLevel, parse_limit_spec};
    use std::path::PathBuf;

    pub(crate) const GI: u64 = 1 << 30;

    pub(crate) fn spec(s: &str) -> Option<LimitSpec> {
        Some(parse_limit_spec(s).unwrap())
    }

    pub(crate) fn dev(ordinal: u32, total: u64) -> Device {
        Device {
            ordinal,
            total,
            name: None,
            uuid: None,
        }
    }

    /// A configuration whose only setting is `GPUCAP_LIMIT=s`.
    pub(crate) fn limited(s: &str) -> Config {
        Config {
            limit: spec(s),
            ..Config::default()
        }
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
            ConfigFile::Absent,
            "pool: none (each process is capped alone)",
            Set::default(),
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
        let text = check_report(
            &config,
            Err("missing"),
            &probe,
            true,
            ConfigFile::Absent,
            "pool: none",
            Set::default(),
        );
        assert!(text.contains("library: NOT FOUND\n"));
        assert!(!text.contains("configuration OK"), "{text}");
        assert!(text.contains("devices: 2 visible to CUDA:\n"));
        assert!(text.contains("GPU 0: cap 4294967296 bytes (4 GiB) of 85899345920 (80 GiB)\n"));
        assert!(text.contains("GPU 1: cap 1073741824 bytes"));
        assert!(text.contains("may already be capped"));
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
            describe_limit(config.limit.as_ref(), None),
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
        let text = check_report(
            &config,
            Err("missing"),
            &probe,
            false,
            ConfigFile::Absent,
            "pool: none",
            Set::default(),
        );
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
    fn a_wait_is_named_with_its_source() {
        let config = Config {
            wait: std::time::Duration::from_secs(30),
            ..Config::default()
        };
        let file = PathBuf::from("/opt/gpucap/gpucap.env");
        let tail = ": an allocation the pool cannot take now waits up to 30 s for its \
                    members to free memory)";
        // The file's wait, whether the file is the whole configuration or over the
        // environment's variables; the environment's own, its variable's.
        let env = |wait, wait_in_file| Set {
            limit_none: false,
            wait,
            wait_in_file,
        };
        for f in [ConfigFile::Whole(&file), ConfigFile::Over(&file)] {
            assert_eq!(
                wait_line(&config, env(false, true), f),
                format!("wait: 30 s (from GPUCAP_WAIT in /opt/gpucap/gpucap.env{tail}")
            );
        }
        assert_eq!(
            wait_line(&config, env(true, false), ConfigFile::Over(&file)),
            format!("wait: 30 s (from GPUCAP_WAIT{tail}")
        );
        let typed = Config {
            typed: vec!["--wait"],
            ..config.clone()
        };
        assert_eq!(
            wait_line(&typed, env(true, false), ConfigFile::Over(&file)),
            format!("wait: 30 s (from --wait{tail}")
        );
        // No wait: named where the file or the environment says 0, else the default's.
        let none = Config {
            wait: std::time::Duration::ZERO,
            ..config.clone()
        };
        let refused = ": an allocation the pool cannot take now is refused at once)";
        assert_eq!(
            wait_line(&none, env(false, true), ConfigFile::Whole(&file)),
            format!("wait: none (from GPUCAP_WAIT in /opt/gpucap/gpucap.env{refused}")
        );
        assert_eq!(
            wait_line(&none, env(true, false), ConfigFile::Whole(&file)),
            format!("wait: none (from GPUCAP_WAIT{refused}")
        );
        assert!(
            wait_line(&none, env(false, false), ConfigFile::Whole(&file)).starts_with(
                "wait: none (an allocation the pool cannot take now is refused at once;"
            )
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
            ConfigFile::Whole(&file),
            "pool: none",
            Set::default(),
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
        assert_eq!(
            report_line(Some(Path::new("/gpucap-no-such-dir/r-%p.json"))),
            "report: /gpucap-no-such-dir/r-%p.json (JSON usage report at exit; %p = the process \
             id); its directory /gpucap-no-such-dir does not exist: nothing will be written"
        );
        assert!(!report_line(Some(Path::new("r.json"))).contains("does not exist"));
        // A directory, or a path under a file: said, each for what it is.
        assert!(
            report_line(Some(Path::new("/")))
                .ends_with("it is a directory: nothing will be written (name a file)")
        );
        assert!(
            report_line(Some(Path::new("/etc/passwd/r.json")))
                .ends_with("; /etc/passwd is not a directory: nothing will be written")
        );
    }
}
