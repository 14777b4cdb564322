//! `gpucap jupyter`: Jupyter kernelspecs that start an existing kernel under `gpucap run`
//! (`install`), and the ones gpucap wrote (`list`, `remove`). A kernelspec is a
//! directory with a kernel.json (argv, display_name, language, env, metadata); the one
//! gpucap writes is the wrapped kernel's with `gpucap run OPTIONS --` before its argv and
//! `metadata.gpucap` saying what it wraps, which is how `list` and `remove` know theirs.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Map, Value, json};

use crate::args::{JupyterInstall, KernelScope, Overrides};

/// One kernelspec: its name, directory and kernel.json.
#[derive(Clone, Debug)]
pub struct KernelSpec {
    pub name: String,
    pub resource_dir: PathBuf,
    pub spec: Map<String, Value>,
}

impl KernelSpec {
    /// What gpucap recorded in a kernelspec it wrote (None: not one of gpucap's).
    pub fn gpucap(&self) -> Option<&Map<String, Value>> {
        self.spec.get("metadata")?.get("gpucap")?.as_object()
    }
}

/// This user's Jupyter data directory, as jupyter_core finds it on Linux:
/// `$JUPYTER_DATA_DIR`, else `$XDG_DATA_HOME/jupyter`, else `~/.local/share/jupyter`.
pub fn user_data_dir(env: &dyn Fn(&str) -> Option<OsString>) -> Result<PathBuf, String> {
    if let Some(d) = env("JUPYTER_DATA_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = env("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("jupyter"));
    }
    match env("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/jupyter")),
        None => Err(
            "cannot find the Jupyter data directory: neither JUPYTER_DATA_DIR, \
                     XDG_DATA_HOME nor HOME is set"
                .to_string(),
        ),
    }
}

/// Jupyter's data directories in its order of precedence, without running Python:
/// `$JUPYTER_PATH`, the user's, then the system's (an environment's own
/// `share/jupyter` is known only to its Python: `jupyter kernelspec list` finds it).
fn data_dirs(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env("JUPYTER_PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .filter(|d| !d.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    dirs.extend(user_data_dir(env).ok());
    dirs.extend(["/usr/local/share/jupyter", "/usr/share/jupyter"].map(PathBuf::from));
    dirs
}

/// The kernelspecs Jupyter knows: from `jupyter kernelspec list --json` when a `jupyter`
/// can be run, else read from the standard data directories (the first of a name wins).
pub fn kernelspecs() -> Result<Vec<KernelSpec>, String> {
    match Command::new("jupyter")
        .args(["kernelspec", "list", "--json"])
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => parse_list(&String::from_utf8_lossy(&out.stdout)),
        Ok(out) => Err(format!(
            "`jupyter kernelspec list --json` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(_) => Ok(scan(&data_dirs(&|k| std::env::var_os(k)))),
    }
}

/// The specs of `jupyter kernelspec list --json`'s output, sorted by name.
pub fn parse_list(json: &str) -> Result<Vec<KernelSpec>, String> {
    let v: Value = serde_json::from_str(json)
        .map_err(|e| format!("`jupyter kernelspec list --json` printed no JSON: {e}"))?;
    let Some(specs) = v.get("kernelspecs").and_then(Value::as_object) else {
        return Err("`jupyter kernelspec list --json` printed no \"kernelspecs\" object".into());
    };
    let mut out = Vec::new();
    for (name, entry) in specs {
        let (Some(dir), Some(spec)) = (
            entry.get("resource_dir").and_then(Value::as_str),
            entry.get("spec").and_then(Value::as_object),
        ) else {
            continue;
        };
        out.push(KernelSpec {
            name: name.clone(),
            resource_dir: PathBuf::from(dir),
            spec: spec.clone(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The kernelspecs of `dirs` (each `DIR/kernels/NAME/kernel.json`), the first of a name
/// winning, sorted by name. Unreadable ones are left out, as Jupyter does.
pub fn scan(dirs: &[PathBuf]) -> Vec<KernelSpec> {
    let mut out: Vec<KernelSpec> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir.join("kernels")) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            if out.iter().any(|k| k.name.eq_ignore_ascii_case(&name)) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(entry.path().join("kernel.json")) else {
                continue;
            };
            if let Ok(Value::Object(spec)) = serde_json::from_str(&text) {
                out.push(KernelSpec {
                    name,
                    resource_dir: entry.path(),
                    spec,
                });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// `run`'s options for these overrides, in a fixed order.
pub fn run_flags(o: &Overrides) -> Vec<String> {
    let mut f = Vec::new();
    for (flag, value) in [
        ("--limit", &o.limit),
        ("--pool", &o.pool),
        ("--guarantee", &o.guarantee),
        ("--ceiling", &o.ceiling),
        ("--wait", &o.wait),
        ("--log", &o.log),
        ("--report", &o.report),
    ] {
        if let Some(v) = value {
            f.push(flag.to_string());
            f.push(v.clone());
        }
    }
    if o.growth {
        f.push("--growth".to_string());
    }
    f
}

/// The default name: `KERNEL-gpucap-LIMIT` (the limit lower-cased, other characters
/// than a name allows made '-'), or `KERNEL-gpucap-POOL` with a pool and no limit.
pub fn default_name(kernel: &str, o: &Overrides) -> String {
    let what = o.limit.as_deref().or(o.pool.as_deref()).unwrap_or("capped");
    let what: String = what
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("{kernel}-gpucap-{}", what.trim_matches('-'))
}

/// What the display name gets appended: `[gpucap 8Gi]`, `[gpucap 8Gi, pool team]`.
pub fn cap_suffix(o: &Overrides) -> String {
    let mut parts = Vec::new();
    if let Some(l) = &o.limit {
        parts.push(l.clone());
    }
    if let Some(p) = &o.pool {
        parts.push(format!("pool {p}"));
    }
    if let Some(g) = &o.guarantee {
        parts.push(format!("guarantee {g}"));
    }
    format!("[gpucap {}]", parts.join(", "))
}

/// The wrapped kernel's `argv[0]` as the new argv needs it. jupyter_client replaces a
/// bare `python`/`python3`/`python3.X` at `argv[0]` by its own interpreter; behind
/// `gpucap run --` it no longer is `argv[0]`, so it is resolved here: the `bin/` of the
/// environment the kernelspec belongs to (`PREFIX/share/jupyter/kernels/NAME`), else
/// PATH (`python3` when `python` is not there).
pub fn resolve_python(
    argv0: &str,
    resource_dir: &Path,
    path: Option<&OsString>,
) -> Option<PathBuf> {
    let bare = argv0 == "python"
        || argv0 == "python3"
        || argv0
            .strip_prefix("python3.")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit()));
    if !bare {
        return Some(PathBuf::from(argv0));
    }
    let in_prefix = resource_dir.ancestors().nth(4).filter(|_| {
        resource_dir
            .ancestors()
            .nth(2)
            .is_some_and(|d| d.ends_with("share/jupyter"))
    });
    let names = if argv0 == "python" {
        vec![argv0, "python3"]
    } else {
        vec![argv0]
    };
    for name in &names {
        if let Some(prefix) = in_prefix {
            let p = prefix.join("bin").join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let path = path?;
    names.iter().find_map(|name| {
        std::env::split_paths(path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The kernelspec gpucap writes for `wrapped`: its kernel.json with argv
/// `[gpucap, run, FLAGS..., --, wrapped argv...]`, the display name suffixed, and
/// `metadata.gpucap` = {wraps, options}.
pub fn wrap(
    wrapped: &KernelSpec,
    install: &JupyterInstall,
    gpucap: &Path,
    path: Option<&OsString>,
) -> Result<Map<String, Value>, String> {
    let kernel = &wrapped.name;
    if wrapped.gpucap().is_some() {
        return Err(format!(
            "kernel {kernel} is already one of gpucap's (it runs under gpucap run): wrap the \
             kernel it wraps instead"
        ));
    }
    let argv: Vec<&str> = wrapped
        .spec
        .get("argv")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some((first, rest)) = argv.split_first() else {
        return Err(format!(
            "kernel {kernel} ({}) has no argv to wrap",
            wrapped.resource_dir.display()
        ));
    };
    let Some(program) = resolve_python(first, &wrapped.resource_dir, path) else {
        return Err(format!(
            "kernel {kernel} runs {first:?}, which is neither in its environment's bin/ nor on PATH"
        ));
    };
    let flags = run_flags(&install.overrides);
    let mut new_argv: Vec<Value> = vec![json!(gpucap.to_string_lossy()), json!("run")];
    new_argv.extend(flags.iter().map(|f| json!(f)));
    new_argv.push(json!("--"));
    new_argv.push(json!(program.to_string_lossy()));
    new_argv.extend(rest.iter().map(|a| json!(a)));
    let shown = install.display_name.clone().unwrap_or_else(|| {
        wrapped
            .spec
            .get("display_name")
            .and_then(Value::as_str)
            .unwrap_or(kernel)
            .to_string()
    });
    let mut spec = wrapped.spec.clone();
    spec.insert("argv".into(), Value::Array(new_argv));
    spec.insert(
        "display_name".into(),
        json!(format!("{shown} {}", cap_suffix(&install.overrides))),
    );
    let metadata = spec
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !metadata.is_object() {
        *metadata = Value::Object(Map::new());
    }
    if let Some(m) = metadata.as_object_mut() {
        m.insert(
            "gpucap".into(),
            json!({ "wraps": kernel, "options": flags }),
        );
    }
    Ok(spec)
}

/// Where `scope` keeps kernelspecs (`.../share/jupyter/kernels`).
pub fn kernels_dir(scope: &KernelScope) -> Result<PathBuf, String> {
    let dir = match scope {
        KernelScope::User => user_data_dir(&|k| std::env::var_os(k))?,
        KernelScope::Prefix(p) => p.join("share/jupyter"),
        KernelScope::SysPrefix => {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let jupyter = std::env::split_paths(&path)
                .map(|d| d.join("jupyter"))
                .find(|p| p.is_file())
                .ok_or(
                    "--sys-prefix: no jupyter on PATH to name the environment (use --prefix DIR)",
                )?;
            let jupyter = jupyter.canonicalize().unwrap_or(jupyter);
            let prefix = jupyter
                .parent()
                .and_then(Path::parent)
                .ok_or("--sys-prefix: the jupyter on PATH is not in a PREFIX/bin")?;
            prefix.join("share/jupyter")
        }
    };
    Ok(dir.join("kernels"))
}

/// `gpucap jupyter install` once the options were validated: writes the kernelspec and
/// returns its directory.
pub fn install(install: &JupyterInstall, gpucap: &Path) -> Result<PathBuf, String> {
    let specs = kernelspecs()?;
    let Some(wrapped) = specs.iter().find(|k| k.name == install.kernel) else {
        let names: Vec<&str> = specs.iter().map(|k| k.name.as_str()).collect();
        return Err(format!(
            "no Jupyter kernel named {:?} (found: {}); install one first, e.g. \
             `python3 -m ipykernel install --user`, or name another with --kernel",
            install.kernel,
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ));
    };
    let path = std::env::var_os("PATH");
    let spec = wrap(wrapped, install, gpucap, path.as_ref())?;
    let name = install
        .name
        .clone()
        .unwrap_or_else(|| default_name(&install.kernel, &install.overrides));
    let dest = kernels_dir(&install.scope)?.join(&name);
    if let Some(existing) = scan_one(&dest)
        && existing.gpucap().is_none()
    {
        return Err(format!(
            "{} holds a kernel gpucap did not write: not replacing it (choose another --name)",
            dest.display()
        ));
    }
    std::fs::create_dir_all(&dest).map_err(|e| format!("cannot create {}: {e}", dest.display()))?;
    // The wrapped kernel's other files (its logos), so that Jupyter shows the same icon.
    if let Ok(entries) = std::fs::read_dir(&wrapped.resource_dir) {
        for e in entries.flatten() {
            let file = e.file_name();
            if file != "kernel.json" && e.path().is_file() {
                let _ = std::fs::copy(e.path(), dest.join(&file));
            }
        }
    }
    let text =
        serde_json::to_string_pretty(&Value::Object(spec)).map_err(|e| e.to_string())? + "\n";
    gpucap_core::report::write_atomically(&dest.join("kernel.json"), text.as_bytes(), Some(0o644))
        .map_err(|e| format!("cannot write {}: {e}", dest.join("kernel.json").display()))?;
    Ok(dest)
}

/// The kernelspec in `dir`, if it holds one.
fn scan_one(dir: &Path) -> Option<KernelSpec> {
    let text = std::fs::read_to_string(dir.join("kernel.json")).ok()?;
    let Value::Object(spec) = serde_json::from_str(&text).ok()? else {
        return None;
    };
    Some(KernelSpec {
        name: dir.file_name()?.to_string_lossy().into_owned(),
        resource_dir: dir.to_path_buf(),
        spec,
    })
}

/// `gpucap jupyter list`: one line per kernelspec gpucap wrote.
pub fn list() -> Result<String, String> {
    let mut out = String::new();
    for k in kernelspecs()? {
        let Some(meta) = k.gpucap() else { continue };
        let options: Vec<&str> = meta
            .get("options")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        out.push_str(&format!(
            "{}\t{}\twraps {} with: gpucap run {}\t{}\n",
            k.name,
            k.spec
                .get("display_name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            meta.get("wraps").and_then(Value::as_str).unwrap_or("?"),
            options.join(" "),
            k.resource_dir.display()
        ));
    }
    Ok(out)
}

/// `gpucap jupyter remove NAME`: deletes that kernelspec's directory, if gpucap wrote it.
pub fn remove(name: &str) -> Result<PathBuf, String> {
    let specs = kernelspecs()?;
    let Some(k) = specs.iter().find(|k| k.name == name) else {
        return Err(format!(
            "no Jupyter kernel named {name:?} (gpucap jupyter list shows gpucap's)"
        ));
    };
    if k.gpucap().is_none() {
        return Err(format!(
            "kernel {name} ({}) was not written by gpucap: not removing it (jupyter kernelspec \
             remove does)",
            k.resource_dir.display()
        ));
    }
    std::fs::remove_dir_all(&k.resource_dir)
        .map_err(|e| format!("cannot remove {}: {e}", k.resource_dir.display()))?;
    Ok(k.resource_dir.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn install(limit: &str, pool: Option<&str>) -> JupyterInstall {
        JupyterInstall {
            overrides: Overrides {
                limit: Some(limit.into()),
                pool: pool.map(Into::into),
                ..Overrides::default()
            },
            kernel: "python3".into(),
            name: None,
            display_name: None,
            scope: KernelScope::User,
        }
    }

    #[test]
    fn names_and_suffixes() {
        let i = install("8Gi", None);
        assert_eq!(default_name("python3", &i.overrides), "python3-gpucap-8gi");
        assert_eq!(cap_suffix(&i.overrides), "[gpucap 8Gi]");
        let i = install("0=8Gi,1=50%", Some("team"));
        assert_eq!(
            default_name("python3", &i.overrides),
            "python3-gpucap-0-8gi-1-50"
        );
        assert_eq!(cap_suffix(&i.overrides), "[gpucap 0=8Gi,1=50%, pool team]");
        assert!(crate::args::valid_kernel_name(&default_name(
            "python3",
            &i.overrides
        )));
        let mut o = i.overrides.clone();
        o.growth = true;
        o.guarantee = Some("2Gi".into());
        assert_eq!(
            run_flags(&o),
            [
                "--limit",
                "0=8Gi,1=50%",
                "--pool",
                "team",
                "--guarantee",
                "2Gi",
                "--growth"
            ]
        );
    }

    fn listed(argv: Value, dir: &Path) -> KernelSpec {
        let json = json!({"kernelspecs": {"python3": {"resource_dir": dir, "spec": {
            "argv": argv, "display_name": "Python 3 (ipykernel)", "language": "python",
            "env": {"A": "1"}, "metadata": {"debugger": true}}}}});
        parse_list(&json.to_string()).unwrap().remove(0)
    }

    #[test]
    fn wrapping_a_kernel() {
        let root = std::env::temp_dir().join(format!("gpucap-jupyter-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = root.join("venv/share/jupyter/kernels/python3");
        fs::create_dir_all(&dir).unwrap();
        fs::create_dir_all(root.join("venv/bin")).unwrap();
        fs::write(root.join("venv/bin/python"), b"").unwrap();
        let k = listed(
            json!([
                "python",
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}"
            ]),
            &dir,
        );
        let spec = wrap(&k, &install("1Gi", None), Path::new("/x/gpucap"), None).unwrap();
        let python = root.join("venv/bin/python");
        assert_eq!(
            spec["argv"],
            json!([
                "/x/gpucap",
                "run",
                "--limit",
                "1Gi",
                "--",
                python,
                "-m",
                "ipykernel_launcher",
                "-f",
                "{connection_file}"
            ])
        );
        assert_eq!(spec["display_name"], "Python 3 (ipykernel) [gpucap 1Gi]");
        assert_eq!(spec["language"], "python");
        assert_eq!(spec["env"], json!({"A": "1"}));
        assert_eq!(spec["metadata"]["debugger"], true);
        assert_eq!(spec["metadata"]["gpucap"]["wraps"], "python3");
        // An absolute interpreter stays as it is; a gpucap kernel is not wrapped again.
        let k = listed(json!(["/opt/py/bin/python3", "-m", "ipykernel"]), &dir);
        let spec = wrap(&k, &install("1Gi", None), Path::new("/x/gpucap"), None).unwrap();
        assert_eq!(spec["argv"][5], "/opt/py/bin/python3");
        let again = KernelSpec {
            spec: spec.clone(),
            ..k.clone()
        };
        let e = wrap(&again, &install("1Gi", None), Path::new("/x/gpucap"), None).unwrap_err();
        assert!(e.contains("already one of gpucap's"), "{e}");
        // No python to be found: the error says so.
        let elsewhere = root.join("elsewhere/kernels/python3");
        let k = listed(json!(["python3.99", "-m", "ipykernel"]), &elsewhere);
        let e = wrap(&k, &install("1Gi", None), Path::new("/x/gpucap"), None).unwrap_err();
        assert!(e.contains("python3.99"), "{e}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn scanning_data_directories() {
        let root = std::env::temp_dir().join(format!("gpucap-jscan-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (d, name, shown) in [("a", "k", "first"), ("b", "k", "second"), ("b", "m", "m")] {
            let dir = root.join(d).join("kernels").join(name);
            fs::create_dir_all(&dir).unwrap();
            let spec = json!({"argv": ["x"], "display_name": shown, "language": "python"});
            fs::write(dir.join("kernel.json"), spec.to_string()).unwrap();
        }
        let found = scan(&[root.join("a"), root.join("b")]);
        let names: Vec<(&str, &str)> = found
            .iter()
            .map(|k| (k.name.as_str(), k.spec["display_name"].as_str().unwrap()))
            .collect();
        assert_eq!(names, [("k", "first"), ("m", "m")]);
        let env = |k: &str| match k {
            "HOME" => Some(OsString::from("/home/ada")),
            _ => None,
        };
        assert_eq!(
            user_data_dir(&env).unwrap(),
            Path::new("/home/ada/.local/share/jupyter")
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
