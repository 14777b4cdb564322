//! The wheel, as a user gets it: `pip install gpucap` into a fresh virtual environment,
//! with no Rust toolchain on PATH, then the installed `gpucap` caps the demo program on
//! the fake GPU, the Python module's tests pass (python/tests, run by the installed
//! Python), `python -m gpucap` is the command, and the container entrypoint finds
//! pip's gpucap and its library.
//!
//! The wheel comes from `GPUCAP_TEST_WHEEL` (scripts/test.sh builds it with
//! scripts/build-wheel.sh), and a venv where `pip install ./python` built and installed
//! gpucap from this checkout from `GPUCAP_TEST_SOURCE_VENV`; unset, the tests print SKIP, unless
//! GPUCAP_TEST_REQUIRE_CLIENTS=1 or CI is set, when they fail.

use super::common;
use common::*;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The built wheel, or None after a SKIP line.
fn wheel() -> Option<PathBuf> {
    let Some(w) = std::env::var_os("GPUCAP_TEST_WHEEL").filter(|v| !v.is_empty()) else {
        skip(
            "GPUCAP_TEST_WHEEL is not set: scripts/test.sh builds the wheel with \
             scripts/build-wheel.sh and sets it",
        );
        return None;
    };
    let w = PathBuf::from(w);
    assert!(
        w.is_file(),
        "GPUCAP_TEST_WHEEL={} does not exist",
        w.display()
    );
    Some(w)
}

/// PATH without any directory that holds cargo, rustc or rustup: what a user without
/// Rust has.
pub fn path_without_rust() -> OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| {
            !["cargo", "rustc", "rustup"]
                .iter()
                .any(|t| d.join(t).exists())
        })
        .collect();
    std::env::join_paths(kept).unwrap()
}

/// A command with no Rust in reach: PATH scrubbed, cargo's variables removed, and no
/// inherited gpucap, fake-GPU or preload variables.
pub fn without_rust(program: impl AsRef<std::ffi::OsStr>, path: &OsString) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CARGO")
            || k.starts_with("RUSTUP")
            || k.starts_with("RUST")
            || k.starts_with("GPUCAP_")
            || k.starts_with("FAKECUDA_")
            || k.starts_with("CUDA_DEVICE_MEMORY_")
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(&k);
        }
    }
    cmd.env("PATH", path).env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

/// `python -m pip install WHEEL` offline (the wheel has no dependencies), `extra` first.
fn pip_install(python: &Path, path: &OsString, extra: &[&std::ffi::OsStr], wheel: &Path) {
    let o = run(without_rust(python, path)
        .args(["-m", "pip", "install", "-q", "--no-index", "--no-deps"])
        .args(["--no-cache-dir", "--disable-pip-version-check"])
        .args(extra)
        .arg(wheel));
    assert_ok(&o);
}

/// A fresh venv with the wheel installed by pip, without Rust on PATH.
pub struct Installed {
    pub venv: PathBuf,
    /// The venv's bin/ first, then PATH without Rust.
    pub path: OsString,
}

impl Installed {
    pub fn bin(&self, name: &str) -> PathBuf {
        self.venv.join("bin").join(name)
    }

    /// The package directory pip installed (site-packages/gpucap).
    pub fn package(&self) -> PathBuf {
        let lib = self.venv.join("lib");
        let python = std::fs::read_dir(&lib)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .expect("the venv's lib/python3.X");
        python.path().join("site-packages").join("gpucap")
    }
}

fn install(wheel: &Path) -> Installed {
    let dir = scratch("wheel-venv");
    let venv = dir.join("venv");
    let rustless = path_without_rust();
    for tool in ["cargo", "rustc"] {
        let found = std::env::split_paths(&rustless).find(|d| d.join(tool).exists());
        assert!(found.is_none(), "{tool} is still on the scrubbed PATH");
    }
    let o = run(without_rust("python3", &rustless)
        .args(["-m", "venv"])
        .arg(&venv));
    assert_ok(&o);
    pip_install(&venv.join("bin/python"), &rustless, &[], wheel);
    let mut path = vec![venv.join("bin")];
    path.extend(std::env::split_paths(&rustless));
    Installed {
        venv,
        path: std::env::join_paths(path).unwrap(),
    }
}

/// The one install the tests of this file share (made once, by the first that needs it).
fn installed() -> Option<&'static Installed> {
    static INSTALLED: OnceLock<Option<Installed>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| wheel().map(|w| install(&w)))
        .as_ref()
}

/// The wheel installs where the portable build loads: tagged `manylinux_2_27` or older
/// (RHEL 8 and 9, Ubuntu 20.04: a native build on Debian 12 made `manylinux_2_35`), and
/// no ELF file in it asks for a newer glibc than its tag says.
#[test]
fn the_wheel_is_tagged_for_glibc_2_27() {
    let Some(wheel) = wheel() else {
        return;
    };
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let minor: u32 = name
        .split("manylinux_2_")
        .nth(1)
        .and_then(|r| r.split('_').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: no manylinux_2_N tag"));
    assert!(minor <= 27, "{name}: tagged for glibc 2.{minor}");
    let dir = scratch("wheel-tag");
    let o = run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir));
    assert_ok(&o);
    for file in ["gpucap/libgpucap.so", "gpucap-0.1.0.data/scripts/gpucap"] {
        let o = run(Command::new("objdump").arg("-T").arg(dir.join(file)));
        assert_ok(&o);
        let newest = stdout(&o)
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .filter_map(|w| w.strip_prefix("GLIBC_2."))
            .filter_map(|n| n.parse::<u32>().ok())
            .max()
            .unwrap_or(0);
        assert!(
            newest <= minor,
            "{file} asks for GLIBC_2.{newest}, the tag says 2.{minor}"
        );
    }
}

#[test]
fn the_installed_command_caps_the_demo_without_rust() {
    let Some(inst) = installed() else { return };
    caps_the_demo(inst);
}

/// `pip install ./python` (scripts/test.sh made `GPUCAP_TEST_SOURCE_VENV` so, from this
/// checkout, with the library the wheel script copies removed first): the package's build
/// backend built the shim and maturin the command, and the installed command caps the
/// demo as the wheel's does, run without Rust on PATH.
#[test]
fn pip_install_of_the_source_folder_installs_a_command_that_caps() {
    let Some(venv) = std::env::var_os("GPUCAP_TEST_SOURCE_VENV").filter(|v| !v.is_empty()) else {
        skip(
            "GPUCAP_TEST_SOURCE_VENV is not set: scripts/test.sh makes it with \
             pip install ./python",
        );
        return;
    };
    let venv = PathBuf::from(venv);
    let mut path = vec![venv.join("bin")];
    path.extend(std::env::split_paths(&path_without_rust()));
    caps_the_demo(&Installed {
        venv,
        path: std::env::join_paths(path).unwrap(),
    });
}

/// The installed `gpucap` caps the demo program on the fake GPU with the package's
/// library (not one beside the command).
fn caps_the_demo(inst: &Installed) {
    let gpucap = inst.bin("gpucap");
    assert!(gpucap.is_file(), "pip installed no {}", gpucap.display());
    // The library is in the package, not beside the command.
    let lib = inst.package().join("libgpucap.so");
    assert!(lib.is_file(), "no {}", lib.display());
    // The licence texts the metadata names (MIT OR Apache-2.0) are installed with it.
    let dist_info = inst
        .package()
        .with_file_name(format!("gpucap-{}.dist-info", env!("CARGO_PKG_VERSION")));
    for name in ["LICENSE-MIT", "LICENSE-APACHE"] {
        let found = [dist_info.join(name), dist_info.join("licenses").join(name)]
            .into_iter()
            .find(|p| p.is_file());
        let found = found.unwrap_or_else(|| panic!("no {name} in {}", dist_info.display()));
        assert_eq!(
            std::fs::read(&found).unwrap(),
            std::fs::read(root().join(name)).unwrap(),
            "{}",
            found.display()
        );
    }
    assert!(!inst.bin("libgpucap.so").exists());

    let scratch = scratch("wheel-demo");
    let mut cmd = without_rust("gpucap", &inst.path);
    cmd.env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("FAKECUDA_STATS", scratch.join("stats.json"))
        .env("FAKECUDA_TOTAL_MEM", "16Gi")
        .args(["run", "--limit", "1Gi", "--"])
        .arg(cudarc_client())
        .args(["256", "256", "600", "256"]);
    let o = run(&mut cmd);
    assert_ok(&o);
    let report = ClientReport::parse(&stdout(&o));
    assert_eq!(report.total_mem, Some(GIB), "{}", dump(&o));
    let outcomes: Vec<bool> = report.allocs.iter().map(|a| a.2.is_ok()).collect();
    assert_eq!(outcomes, [true, true, false, true], "{}", dump(&o));
    let refused = refusals(&stderr(&o));
    assert_eq!(refused.len(), 1, "{}", dump(&o));
    assert!(refused[0].contains("600 MiB"), "{}", dump(&o));

    // What it preloaded is the package's library.
    let o = run(without_rust("gpucap", &inst.path).args([
        "run",
        "--limit",
        "1Gi",
        "--",
        "sh",
        "-c",
        "printf %s \"$LD_PRELOAD\"",
    ]));
    assert_ok(&o);
    assert_eq!(
        stdout(&o),
        lib.canonicalize().unwrap().to_str().unwrap(),
        "{}",
        dump(&o)
    );
}

#[test]
fn the_python_module_passes_its_tests() {
    let Some(inst) = installed() else { return };
    let tests = root().join("python").join("tests");
    let o = run(without_rust(inst.bin("python"), &inst.path)
        .current_dir(scratch("wheel-unittest"))
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(&tests)
        .arg("-t")
        .arg(&tests)
        .env("WHEEL_TEST_FAKE_LIBDIR", fake_lib_dir())
        .env("WHEEL_TEST_CLIENT", cudarc_client()));
    let err = stderr(&o);
    assert!(o.status.success(), "{}", dump(&o));
    // Every test ran: none was skipped for want of the fake GPU, and the module that ran
    // them is the installed one, not python/gpucap of the checkout.
    assert!(err.contains("\nOK\n"), "{}", dump(&o));
    assert!(!err.contains("skipped"), "{}", dump(&o));
    let o = run(without_rust(inst.bin("python"), &inst.path)
        .current_dir(scratch("wheel-import"))
        .args(["-c", "import gpucap; print(gpucap.__file__)"]));
    assert_ok(&o);
    assert!(
        Path::new(stdout(&o).trim()).starts_with(&inst.venv),
        "{}",
        dump(&o)
    );
}

#[test]
fn the_entrypoint_finds_pips_gpucap_and_its_library() {
    let Some(wheel) = wheel() else { return };
    let Some(inst) = installed() else { return };
    if Path::new("/usr/local/lib/gpucap/gpucap").exists() {
        eprintln!("SKIP: /usr/local/lib/gpucap/gpucap exists here, and the entrypoint prefers it");
        return;
    }
    // An install of its own (pip install --target: DIR/bin/gpucap and DIR/gpucap/): the
    // entrypoint writes gpucap.env beside the library, which the shared venv must not get.
    let dir = scratch("wheel-entrypoint");
    let target = dir.join("site");
    pip_install(
        &inst.bin("python"),
        &inst.path,
        &["--target".as_ref(), target.as_os_str()],
        &wheel,
    );
    let lib = target.join("gpucap").join("libgpucap.so");
    // The module finds the command pip put in DIR/bin (its record says `../../bin/gpucap`,
    // relative to the scheme pip installed into before moving it to DIR), not the venv's.
    let o = run(without_rust(inst.bin("python"), &inst.path)
        .current_dir(&dir)
        .env("PYTHONPATH", &target)
        .args(["-c", "import gpucap; print(gpucap.executable())"]));
    assert_ok(&o);
    let command = target.join("bin").join("gpucap").canonicalize().unwrap();
    assert_eq!(stdout(&o).trim(), command.to_str().unwrap(), "{}", dump(&o));
    let path = std::env::join_paths(
        std::iter::once(target.join("bin")).chain(std::env::split_paths(&path_without_rust())),
    )
    .unwrap();
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    // The entrypoint is copied away from the checkout, as in an image: nothing beside it.
    let entrypoint = dir.join("docker-entrypoint.sh");
    std::fs::copy(root().join("scripts/docker-entrypoint.sh"), &entrypoint).unwrap();
    let o = run(without_rust("sh", &path)
        .arg(&entrypoint)
        .args([
            "sh",
            "-c",
            "printf '%s|%s' \"$LD_PRELOAD\" \"$GPUCAP_LIMIT\"",
        ])
        .env("GPUCAP_LIMIT", "2Gi")
        .env("GPUCAP_POOL_DIR", &pools));
    assert_ok(&o);
    let lib = lib.canonicalize().unwrap();
    assert_eq!(stdout(&o), format!("{}|2Gi", lib.display()), "{}", dump(&o));
    let env_file = std::fs::read_to_string(lib.with_file_name("gpucap.env")).unwrap();
    assert!(env_file.contains("GPUCAP_LIMIT=2Gi"), "{env_file}");
    // A bad configuration stops it with gpucap's message, the command never runs.
    let o = run(without_rust("sh", &path)
        .arg(&entrypoint)
        .args(["sh", "-c", "echo ran"])
        .env("GPUCAP_LIMIT", "8Gx")
        .env("GPUCAP_POOL_DIR", &pools));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("unknown unit \"Gx\""), "{}", dump(&o));
    assert!(!stdout(&o).contains("ran"), "{}", dump(&o));
}

/// The environment of a Jupyter of its own: data, config, runtime and IPython
/// directories in `dir`, nothing from this user's.
fn jupyter_env(cmd: &mut Command, dir: &Path) {
    for (var, sub) in [
        ("HOME", "home"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
    ] {
        cmd.env(var, dir.join(sub));
    }
    cmd.env_remove("JUPYTER_PATH")
        .env_remove("XDG_DATA_HOME")
        .env_remove("VIRTUAL_ENV");
}

#[test]
fn a_kernel_installed_by_gpucap_jupyter_is_capped() {
    let Some(inst) = installed() else { return };
    let Some(python) = client_python(
        "GPUCAP_TEST_PYTHON_JUPYTER",
        "jupyter_client, ipykernel, cuda-bindings 13 and nvidia-ml-py",
    ) else {
        return;
    };
    let dir = scratch("wheel-jupyter");
    // The installed gpucap first, then the Jupyter environment's jupyter (which
    // `gpucap jupyter install` asks for the kernel to wrap), then no Rust.
    let jupyter_bin = python.parent().unwrap().to_path_buf();
    let path = std::env::join_paths(
        [inst.venv.join("bin"), jupyter_bin.clone()]
            .into_iter()
            .chain(std::env::split_paths(&path_without_rust())),
    )
    .unwrap();
    let gpucap = |args: &[&str]| {
        let mut cmd = without_rust("gpucap", &path);
        jupyter_env(&mut cmd, &dir);
        cmd.args(args);
        run(&mut cmd)
    };
    let kernels = dir.join("data").join("kernels");

    // A bad cap: gpucap's message, and nothing written.
    let o = gpucap(&["jupyter", "install", "--limit", "8Gx"]);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("unknown unit \"Gx\""), "{}", dump(&o));
    assert!(!kernels.exists(), "{} was written", kernels.display());

    let o = gpucap(&["jupyter", "install", "--limit", "1Gi", "--name", "capped"]);
    assert_ok(&o);
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(kernels.join("capped/kernel.json")).unwrap())
            .unwrap();
    let argv: Vec<&str> = spec["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let installed_gpucap = inst.bin("gpucap").canonicalize().unwrap();
    assert_eq!(argv[0], installed_gpucap.to_str().unwrap(), "{spec}");
    assert_eq!(argv[1..5], ["run", "--limit", "1Gi", "--"], "{spec}");
    // The wrapped kernel: the Jupyter environment's own Python, running ipykernel.
    assert!(
        Path::new(argv[5]).starts_with(jupyter_bin.parent().unwrap()),
        "{spec}"
    );
    assert!(argv.contains(&"{connection_file}"), "{spec}");
    assert_eq!(spec["language"], "python", "{spec}");
    assert_eq!(
        spec["display_name"], "Python 3 (ipykernel) [gpucap 1Gi]",
        "{spec}"
    );
    let o = gpucap(&["jupyter", "list"]);
    assert_ok(&o);
    assert!(stdout(&o).starts_with("capped\t"), "{}", dump(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "{}", dump(&o));

    // Started by jupyter_client as a notebook server starts it, on the fake GPU.
    let kernel_stderr = dir.join("kernel.stderr");
    let mut cmd = without_rust(&python, &path);
    jupyter_env(&mut cmd, &dir);
    cmd.arg(root().join("tests/clients/jupyter_kernel_client.py"))
        .arg("capped")
        .arg(&kernel_stderr)
        .args(["256", "900"])
        .env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("FAKECUDA_TOTAL_MEM", "16Gi");
    let o = run(&mut cmd);
    let log = std::fs::read_to_string(&kernel_stderr).unwrap_or_default();
    assert!(
        o.status.success(),
        "{}\n--- kernel's stderr\n{log}",
        dump(&o)
    );
    let cells: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let cell = |name: &str, key: &str| cells[name][key].as_str().unwrap_or("").to_string();
    for name in ["setup", "info", "under", "after"] {
        assert_eq!(cell(name, "status"), "ok", "{name}: {cells:#}\n{log}");
    }
    // cuMemGetInfo and NVML inside the kernel show the cap.
    let info = cell("info", "stdout");
    assert!(
        info.contains(&format!("mem_get_info free={GIB} total={GIB}\n")),
        "{info}"
    );
    assert!(info.contains(&format!("nvml total={GIB} ")), "{info}");
    assert_eq!(cell("under", "stdout"), "alloc 256 ok\n", "{cells:#}");
    // Over the cap: the out-of-memory error in the reply, gpucap's line in the kernel's
    // stderr (forwarded to the notebook, and in the kernel's log).
    assert_eq!(cell("over", "status"), "error", "{cells:#}");
    assert_eq!(cell("over", "ename"), "MemoryError", "{cells:#}");
    assert!(
        cell("over", "evalue").contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{cells:#}"
    );
    let line = "gpucap: refused cuMemAlloc of 900 MiB on GPU 0";
    assert!(cell("over", "stderr").contains(line), "{cells:#}");
    assert!(log.contains(line), "the kernel's stderr:\n{log}");
    // And the kernel is alive afterwards: a further cell runs, and allocates.
    assert_eq!(
        cell("after", "stdout"),
        "alive 42\nalloc 256 ok\n",
        "{cells:#}"
    );
    assert_eq!(cells["alive_at_end"], true, "{cells:#}");

    // remove: gpucap's kernel only.
    let o = gpucap(&["jupyter", "remove", "python3"]);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("not written by gpucap"), "{}", dump(&o));
    let o = gpucap(&["jupyter", "remove", "capped"]);
    assert_ok(&o);
    assert!(!kernels.join("capped").exists());
    let o = gpucap(&["jupyter", "list"]);
    assert_ok(&o);
    assert_eq!(stdout(&o), "", "{}", dump(&o));
}
