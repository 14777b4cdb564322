//! `gpucap cdi generate`: a Container Device Interface (CDI) spec that caps the containers
//! given its device, with no change to their image or entrypoint.
//!
//! The spec's one device mounts, read-only, a directory the command fills on the host
//! (`<dir>/<name>/`: a copy of libgpucap.so, of the gpucap executable, and the validated
//! configuration as `gpucap.env`) at [`CONTAINER_DIR`], and a file holding the library's
//! path at `/etc/ld.so.preload`: the dynamic loader then loads the shim into every
//! process of the container, and the shim, finding no `GPUCAP_*` variable in its
//! environment, reads `gpucap.env` beside itself. No environment variable is injected:
//! the configuration has one source, which `gpucap check` in the container names.
//!
//! The spec's `cdiVersion` is the lowest that its fields need (`0.3.0`, the earliest the
//! CDI packages still load; `0.5.0` for a device name that starts with a digit, `0.6.0`
//! for a dot in the class), so that older runtimes (podman 4, containerd 1.7) load it.

use std::path::{Path, PathBuf};

use gpucap_core::config;
use serde_json::{Value, json};

/// Where the spec mounts gpucap's directory in the container. Not
/// `/usr/local/lib/gpucap`, where an image with gpucap's entrypoint has its own copy.
pub const CONTAINER_DIR: &str = "/usr/local/lib/gpucap-cdi";

/// The default `--kind`: `vendor/class` of the device (`--device gpucap.io/gpu=NAME`).
pub const DEFAULT_KIND: &str = "gpucap.io/gpu";
/// The default `--name` of the device.
pub const DEFAULT_NAME: &str = "capped";
/// The default `--dir`: where the device's files are put on the host.
pub const DEFAULT_DIR: &str = "/var/lib/gpucap/cdi";
/// The default `--pool`: the container's processes share one cap per GPU, as under
/// gpucap's entrypoint ([`PoolSpec::per_container`](gpucap_core::config::PoolSpec::per_container)).
pub const DEFAULT_POOL: &str = gpucap_core::config::CONTAINER_POOL;

/// What `gpucap cdi generate` was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `--limit SPEC`: the cap (GPUCAP_LIMIT). None: the device injects the library
    /// alone, and the cap comes from the container's own variables (a DRA driver's,
    /// `GPUCAP_*`).
    pub limit: Option<String>,
    /// `--pool NAME|PATH|off` (GPUCAP_POOL; default [`DEFAULT_POOL`]); only with a limit.
    pub pool: Option<String>,
    /// `--name NAME`: the device's name.
    pub name: String,
    /// `--kind VENDOR/CLASS`.
    pub kind: String,
    /// `--dir DIR`: the host directory the device's files go in (`DIR/NAME/`).
    pub dir: PathBuf,
    /// `--output FILE`: the spec's path on the host (`/etc/cdi/gpucap.json`).
    pub output: PathBuf,
    /// `--root DIR`: where the host's `/` is for this command (a DaemonSet's host mount):
    /// files are written under it, the spec names them without it.
    pub root: PathBuf,
}

/// A CDI name segment: starts and ends with a letter or digit, with letters, digits,
/// `-`, `_` and `.` between (the spec's rule for device names and kind names).
fn valid_segment(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Checks `--kind` (`vendor.example/class`: a DNS subdomain, a slash, a name).
pub fn check_kind(kind: &str) -> Result<(), String> {
    let bad = || {
        format!(
            "invalid --kind {kind:?}: VENDOR/CLASS, the vendor a domain name (lower-case \
             letters, digits, '-' and '.') and the class letters, digits, '-', '_' or '.', \
             each starting with a letter, as CDI asks (e.g. {DEFAULT_KIND})"
        )
    };
    let (vendor, class) = kind.split_once('/').ok_or_else(bad)?;
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    // CDI's parser wants each to start with a letter (`validateVendorOrClassName`,
    // cncf-tags/container-device-interface pkg/parser): a runtime refuses the spec else.
    let starts_with_letter = |s: &str| s.bytes().next().is_some_and(|c| c.is_ascii_alphabetic());
    if vendor.len() > 253
        || !vendor.split('.').all(label_ok)
        || !valid_segment(class)
        || !starts_with_letter(vendor)
        || !starts_with_letter(class)
    {
        return Err(bad());
    }
    Ok(())
}

/// Checks `--name`.
pub fn check_name(name: &str) -> Result<(), String> {
    if valid_segment(name) {
        Ok(())
    } else {
        Err(format!(
            "invalid --name {name:?}: letters, digits, '-', '_' and '.', starting and ending \
             with a letter or digit, at most 63 characters (e.g. {DEFAULT_NAME}, limit-8gi)"
        ))
    }
}

/// The lowest `cdiVersion` that a spec with this kind and device name needs.
pub fn min_version(kind: &str, name: &str) -> &'static str {
    let class = kind.split_once('/').map_or("", |(_, c)| c);
    if class.contains('.') {
        "0.6.0"
    } else if name.starts_with(|c: char| c.is_ascii_digit()) {
        "0.5.0"
    } else {
        "0.3.0"
    }
}

/// A read-only bind mount of the spec.
fn ro_mount(host: &Path, container: &str) -> Value {
    json!({
        "hostPath": host.to_string_lossy(),
        "containerPath": container,
        "options": ["ro", "nosuid", "nodev", "bind"],
    })
}

/// The spec: one device `name` of `kind` whose files are in the host directory
/// `device_dir` (`DIR/NAME`).
pub fn spec(kind: &str, name: &str, device_dir: &Path) -> Value {
    json!({
        "cdiVersion": min_version(kind, name),
        "kind": kind,
        "devices": [{
            "name": name,
            "containerEdits": {
                "mounts": [
                    ro_mount(device_dir, CONTAINER_DIR),
                    ro_mount(&device_dir.join("ld.so.preload"), "/etc/ld.so.preload"),
                ],
            },
        }],
    })
}

/// The `gpucap.env` text of the request, validated as the shim will read it.
pub fn env_file(limit: &str, pool: &str) -> Result<String, String> {
    let vars = [("GPUCAP_LIMIT", limit), ("GPUCAP_POOL", pool)];
    // The message names the flag typed (`--limit`, `--pool`), as `check`'s does; it
    // starts with `gpucap: `, as main's does.
    config::from_vars(vars).map_err(|mut e| {
        e.var = match e.var.as_str() {
            "GPUCAP_LIMIT" => "--limit".to_string(),
            "GPUCAP_POOL" => "--pool".to_string(),
            _ => e.var,
        };
        e.to_string().trim_start_matches("gpucap: ").to_string()
    })?;
    let text = config::format_env_file(vars)?;
    // The file's header names the entrypoint's command; this one is written here.
    Ok(text.replacen(
        "written by `gpucap check --write-env` (the container\n# entrypoint). The shim",
        "written by `gpucap cdi generate`.\n# The shim",
        1,
    ))
}

/// `path` under `root` (`/host` + `/etc/cdi/x.json`).
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Writes `bytes` to `path` through a temporary file and a rename (a container that has
/// the old library mapped keeps its copy), with `mode`.
fn install(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    gpucap_core::report::write_atomically(path, bytes, Some(mode))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Does it: the device's files under `root`+`dir`/`name`, then the spec. `exe` and `lib`
/// are the gpucap executable and libgpucap.so to copy. Returns what it wrote, a line each.
pub fn generate(req: &Request, exe: &Path, lib: &Path) -> Result<String, String> {
    check_kind(&req.kind)?;
    check_name(&req.name)?;
    for (what, p) in [
        ("--dir", &req.dir),
        ("--output", &req.output),
        ("--root", &req.root),
    ] {
        if !p.is_absolute() {
            return Err(format!(
                "{what} {} is not an absolute path (the spec names host paths)",
                p.display()
            ));
        }
    }
    // The host's / as this command sees it exists (a mistyped mount would get a tree of
    // its own, and the host no device).
    if !req.root.is_dir() {
        return Err(format!(
            "--root {} is not a directory: it names where the host's / is mounted for this \
             command (a DaemonSet's host mount; / itself by default)",
            req.root.display()
        ));
    }
    let env = match (&req.limit, &req.pool) {
        (Some(limit), pool) => Some(env_file(limit, pool.as_deref().unwrap_or(DEFAULT_POOL))?),
        (None, Some(_)) => {
            return Err(
                "--pool goes with --limit (without --limit the device injects the \
                        library alone, and the container's own variables configure it)"
                    .to_string(),
            );
        }
        (None, None) => None,
    };
    let device_dir = req.dir.join(&req.name);
    let preload_line = format!("{CONTAINER_DIR}/libgpucap.so\n");
    let here = under(&req.root, &device_dir);
    std::fs::create_dir_all(&here).map_err(|e| format!("cannot create {}: {e}", here.display()))?;
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    install(&here.join("libgpucap.so"), &read(lib)?, 0o644)?;
    install(&here.join("gpucap"), &read(exe)?, 0o755)?;
    let env_path = here.join(config::ENV_FILE_NAME);
    match &env {
        Some(text) => install(&env_path, text.as_bytes(), 0o644)?,
        None => match std::fs::remove_file(&env_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot remove the old {}: {e}", env_path.display()));
            }
            _ => {}
        },
    }
    install(&here.join("ld.so.preload"), preload_line.as_bytes(), 0o644)?;
    let text = serde_json::to_string_pretty(&spec(&req.kind, &req.name, &device_dir))
        .map_err(|e| e.to_string())?;
    let out = under(&req.root, &req.output);
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    install(&out, format!("{text}\n").as_bytes(), 0o644)?;
    let configuration = match &req.limit {
        Some(limit) => format!(
            "GPUCAP_LIMIT={limit} GPUCAP_POOL={} (in {})",
            req.pool.as_deref().unwrap_or(DEFAULT_POOL),
            config::ENV_FILE_NAME
        ),
        None => "the library alone: the container's variables set the cap".to_string(),
    };
    Ok(format!(
        "wrote {}\nwrote {}: device {}={} (cdiVersion {}), {configuration}\n",
        here.display(),
        out.display(),
        req.kind,
        req.name,
        min_version(&req.kind, &req.name),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_names_follow_the_cdi_rules() {
        for ok in [
            "gpucap.io/gpu",
            "example.com/gpu-capped",
            "a/b",
            "x.y.z/c_1",
        ] {
            assert_eq!(check_kind(ok), Ok(()), "{ok}");
        }
        for bad in [
            "gpu",
            "gpucap.io/",
            "/gpu",
            "Gpucap.io/gpu",
            "a/b/c",
            "a/-b",
            "a_b/c",
            // CDI's parser: a vendor and a class start with a letter.
            "gpucap.io/8gi",
            "3dfx.com/gpu",
        ] {
            assert!(
                check_kind(bad).unwrap_err().contains("invalid --kind"),
                "{bad}"
            );
        }
        for ok in ["capped", "limit-8gi", "8gi", "a.b_c"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "a/b", "a b", &"x".repeat(64)] {
            assert!(
                check_name(bad).unwrap_err().contains("invalid --name"),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_version_is_the_lowest_the_fields_need() {
        assert_eq!(min_version("gpucap.io/gpu", "capped"), "0.3.0");
        assert_eq!(min_version("gpucap.io/gpu", "8gi"), "0.5.0");
        assert_eq!(min_version("gpucap.io/gpu.mem", "capped"), "0.6.0");
    }

    #[test]
    fn the_spec_mounts_the_directory_and_ld_so_preload_read_only() {
        let s = spec(
            "gpucap.io/gpu",
            "capped",
            Path::new("/var/lib/gpucap/cdi/capped"),
        );
        assert_eq!(s["cdiVersion"], "0.3.0");
        assert_eq!(s["kind"], "gpucap.io/gpu");
        let dev = &s["devices"][0];
        assert_eq!(dev["name"], "capped");
        let mounts = dev["containerEdits"]["mounts"].as_array().unwrap();
        let pairs: Vec<(&str, &str)> = mounts
            .iter()
            .map(|m| {
                (
                    m["hostPath"].as_str().unwrap(),
                    m["containerPath"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            pairs,
            [
                ("/var/lib/gpucap/cdi/capped", CONTAINER_DIR),
                (
                    "/var/lib/gpucap/cdi/capped/ld.so.preload",
                    "/etc/ld.so.preload"
                ),
            ]
        );
        for m in mounts {
            assert_eq!(m["options"][0], "ro");
        }
        // No environment: the configuration is gpucap.env's alone.
        assert!(dev["containerEdits"].get("env").is_none());
    }

    #[test]
    fn the_configuration_is_validated() {
        let text = env_file("8Gi", DEFAULT_POOL).unwrap();
        assert!(text.lines().any(|l| l == "GPUCAP_LIMIT=8Gi"), "{text}");
        assert!(
            text.lines().any(|l| l == "GPUCAP_POOL=container-mntns"),
            "{text}"
        );
        assert!(text.contains("written by `gpucap cdi generate`"), "{text}");
        let e = env_file("150%", "container").unwrap_err();
        assert!(e.starts_with("invalid --limit=\"150%\""), "{e}");
        let e = env_file("8Gi", "a/b").unwrap_err();
        assert!(e.starts_with("invalid --pool=\"a/b\""), "{e}");
    }

    #[test]
    fn host_paths_go_under_the_root() {
        assert_eq!(
            under(Path::new("/host"), Path::new("/etc/cdi/g.json")),
            Path::new("/host/etc/cdi/g.json")
        );
        assert_eq!(
            under(Path::new("/"), Path::new("/etc/cdi/g.json")),
            Path::new("/etc/cdi/g.json")
        );
    }
}
