//! The wheel, as a user gets it: `pip install gpucap` into a fresh virtual environment,
//! with no Rust toolchain on PATH, then the installed `gpucap` caps the demo program on
//! the fake GPU, the Python module's tests pass (python/tests, run by the installed
//! Python), `python -m gpucap` is the command, and the container entrypoint finds
//! pip's gpucap and its library.
//!
//! The wheel comes from `GPUCAP_TEST_WHEEL` (scripts/test.sh builds it with
//! scripts/build-wheel.sh); unset, the tests print SKIP, unless
//! GPUCAP_TEST_REQUIRE_CLIENTS=1 or CI is set, when they fail.

mod common;
use common::*;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The built wheel, or None after a SKIP line.
fn wheel() -> Option<PathBuf> {
    let Some(w) = std::env::var_os("GPUCAP_TEST_WHEEL").filter(|v| !v.is_empty()) else {
        assert!(
            !required_here(),
            "GPUCAP_TEST_WHEEL is not set but CI or GPUCAP_TEST_REQUIRE_CLIENTS=1 is: \
             scripts/test.sh builds the wheel with scripts/build-wheel.sh and sets it"
        );
        eprintln!("SKIP: GPUCAP_TEST_WHEEL is not set (scripts/build-wheel.sh builds the wheel)");
        return None;
    };
    let w = PathBuf::from(w);
    assert!(w.is_file(), "GPUCAP_TEST_WHEEL={} does not exist", w.display());
    Some(w)
}

/// PATH without any directory that holds cargo, rustc or rustup: what a user without
/// Rust has.
pub fn path_without_rust() -> OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| !["cargo", "rustc", "rustup"].iter().any(|t| d.join(t).exists()))
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
    let o = run(without_rust("python3", &rustless).args(["-m", "venv"]).arg(&venv));
    assert_ok(&o);
    let o = run(without_rust(venv.join("bin/python"), &rustless)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
        ])
        .arg(wheel));
    assert_ok(&o);
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

#[test]
fn the_installed_command_caps_the_demo_without_rust() {
    let Some(inst) = installed() else { return };
    let gpucap = inst.bin("gpucap");
    assert!(gpucap.is_file(), "pip installed no {}", gpucap.display());
    // The library is in the package, not beside the command.
    let lib = inst.package().join("libgpucap.so");
    assert!(lib.is_file(), "no {}", lib.display());
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
    let o = run(without_rust(inst.bin("python"), &inst.path)
        .args(["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target"])
        .arg(&target)
        .arg(&wheel));
    assert_ok(&o);
    let lib = target.join("gpucap").join("libgpucap.so");
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
        .args(["sh", "-c", "printf '%s|%s' \"$LD_PRELOAD\" \"$GPUCAP_LIMIT\""])
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
