//! Shared helpers for the integration tests: where the built artefacts are, how to
//! run a program on the fake GPU under the shim, and how to read the fake driver's
//! statistics (here); the real clients' helpers (`clients`), the one skip rule
//! (`skips`), the book's published figures (`book`) and a pool's scratch setup
//! (`pool_scratch`). Every test binary includes this with `mod common;`.
#![allow(dead_code)]

mod book;
mod clients;
pub mod pool_scratch;
mod skips;

// Every test binary has its own copy of this module and uses part of it.
#[allow(unused_imports)]
pub use book::*;
#[allow(unused_imports)]
pub use clients::*;
#[allow(unused_imports)]
pub use skips::*;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The profile the test binaries are built with by scripts/test.sh (Cargo.toml): the
/// release profile without link-time optimisation, in `target/test-release`.
pub const TEST_PROFILE: &str = "test-release";

/// `target/<profile>`: the directory that holds this test binary's `deps/`, whose shim,
/// CLI and fake GPU the tests run. A test binary built with [`TEST_PROFILE`] runs those
/// of `target/release` beside it: the release build whose figures the documents publish.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    if dir.file_name().is_some_and(|p| p == TEST_PROFILE) {
        dir.with_file_name("release")
    } else {
        dir.to_path_buf()
    }
}

fn built(name: &str) -> PathBuf {
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (scripts/test.sh does, or `cargo build --workspace{}`)",
        p.display(),
        if profile_dir().ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    p
}

/// The shim, `libgpucap.so`.
pub fn shim() -> PathBuf {
    built("libgpucap.so")
}

/// The `gpucap` CLI.
pub fn cli() -> PathBuf {
    built("gpucap")
}

/// A directory holding `libcuda.so.1` and `libcuda.so`, both links to the fake driver,
/// and, when the fake NVML (`cuda-stubs/nvml`, `libnvidia_ml.so`) is built,
/// `libnvidia-ml.so.1` and `libnvidia-ml.so` linking to it.
pub fn fake_lib_dir() -> PathBuf {
    let fake = built("libcuda.so");
    let nvml = profile_dir().join("libnvidia_ml.so");
    let dir = profile_dir().join("fakecuda");
    std::fs::create_dir_all(&dir).unwrap();
    let mut links = vec![("libcuda.so.1", &fake), ("libcuda.so", &fake)];
    if nvml.exists() {
        links.extend([("libnvidia-ml.so.1", &nvml), ("libnvidia-ml.so", &nvml)]);
    }
    for (name, target) in links {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            let tmp = dir.join(format!(".{name}.{}", unique()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp).unwrap();
            std::fs::rename(&tmp, &link).unwrap();
        }
    }
    dir
}

/// A name part no other process or thread of the test run uses at the same time
/// (test threads build and link the same files concurrently).
fn unique() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether the callgrind benchmarks (scripts/bench/bench-instructions.sh, bench-breakdown.sh)
/// can run here: valgrind installed (scripts/test.sh installs it) and a release build
/// (they measure target/release). Where they cannot: false after a SKIP line, or a
/// failure where the published figures must be measured ([`skip`]).
pub fn callgrind_benchmarks_run() -> bool {
    if Command::new("valgrind").arg("--version").output().is_err() {
        skip(
            "valgrind is not installed: the instruction benchmarks need it (scripts/test.sh installs it)",
        );
        return false;
    }
    if profile_dir().file_name().is_none_or(|p| p != "release") {
        skip("this is a debug build: the benchmarks measure target/release (cargo test --release)");
        return false;
    }
    true
}

/// A fresh scratch directory for one test. The first in a test process removes the
/// scratch directories of test processes that are gone (named `TAG-PID-N`): left in place,
/// every run added its own, and a developer's checkout had 56 GB of them after a few weeks.
pub fn scratch(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let root = profile_dir().join("test-scratch");
    SWEPT.call_once(|| sweep_scratch(&root));
    let dir = root.join(format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the scratch directories under `root` whose test process (the PID in the name)
/// no longer runs; a directory it cannot remove is left.
fn sweep_scratch(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.rsplit('-').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A command that runs `program` on the fake GPU: the fake driver on the library
/// path, no inherited `GPUCAP_*`/`FAKECUDA_*`/`LD_PRELOAD`, and the fake's statistics
/// written to `stats` at exit. The shim is NOT preloaded: add it with [`preload`].
pub fn fake_cmd(program: impl AsRef<OsStr>, stats: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GPUCAP_")
            || k.starts_with("CUDA_DEVICE_MEMORY_")
            || k.starts_with("FAKECUDA_")
            || k == "LD_PRELOAD"
        {
            cmd.env_remove(&k);
        }
    }
    cmd.env("LD_LIBRARY_PATH", fake_lib_dir())
        .env("FAKECUDA_STATS", stats);
    cmd
}

/// Preload the shim into `cmd`.
pub fn preload(cmd: &mut Command) -> &mut Command {
    cmd.env("LD_PRELOAD", shim())
}

/// A finished program's status and output, for assertion messages.
pub fn dump(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        stdout(o),
        stderr(o)
    )
}

/// The Python of a real client, from `var` (scripts/test.sh sets it to a virtual
/// environment holding `what`). `None`, after a SKIP line, when unset — unless the
/// client is required here ([`skip`]), when a missing client fails the test.
pub fn client_python(var: &str, what: &str) -> Option<PathBuf> {
    let Some(python) = std::env::var_os(var).filter(|v| !v.is_empty()) else {
        skip(&format!(
            "{var} is not set (a Python with {what}): scripts/test.sh creates a virtual \
             environment with it and sets {var}"
        ));
        return None;
    };
    let python = PathBuf::from(python);
    assert!(python.exists(), "{var}={} does not exist", python.display());
    Some(python)
}

/// Run and capture; panics with the output if the program could not start.
///
/// `cmd` with its limit on `resource` (`libc::RLIMIT_NOFILE`, `RLIMIT_AS`, ...) set to
/// `soft`/`hard` in the child before it execs (the spawn fails where it cannot be set).
pub fn with_rlimit(
    cmd: &mut Command,
    resource: libc::__rlimit_resource_t,
    soft: u64,
    hard: u64,
) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only setrlimit, async-signal-safe, is called.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            match libc::setrlimit(resource, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        })
    }
}

/// A program file a test has just written (a copied script or binary) can be briefly
/// "busy" (ETXTBSY): another test thread that forked while the file was open for
/// writing holds the descriptor until its child execs. That is retried.
pub fn run(cmd: &mut Command) -> Output {
    let mut tries = 0;
    loop {
        match cmd.output() {
            Ok(o) => return o,
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("could not run {cmd:?}: {e}"),
        }
    }
}

/// `ETXTBSY` on Linux.
const ETXTBSY: i32 = 26;

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Panics with the program's output unless it exited 0.
#[track_caller]
pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "program failed: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

/// One device's figures as the fake driver recorded them.
#[derive(Debug, Clone)]
pub struct DevStats {
    pub ordinal: u64,
    pub total: u64,
    pub peak_used: u64,
    pub final_used: u64,
    pub alloc_calls: u64,
    pub free_calls: u64,
    /// The device's peak over every process sharing it (`FAKECUDA_SHARED`; this
    /// process's own peak where the device is not shared).
    pub shared_peak_used: u64,
}

/// Reads the fake driver's `FAKECUDA_STATS` file.
pub fn read_stats(path: &Path) -> Vec<DevStats> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("fake driver stats {} not written: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats JSON");
    let num = |d: &serde_json::Value, k: &str| {
        d[k].as_u64()
            .unwrap_or_else(|| panic!("stats field {k} missing in {text}"))
    };
    v["devices"]
        .as_array()
        .expect("devices array")
        .iter()
        .map(|d| DevStats {
            ordinal: num(d, "ordinal"),
            total: num(d, "total"),
            peak_used: num(d, "peak_used"),
            final_used: num(d, "final_used"),
            alloc_calls: num(d, "alloc_calls"),
            free_calls: num(d, "free_calls"),
            shared_peak_used: num(d, "shared_peak_used"),
        })
        .collect()
}

/// The pid a program that forks prints as `child pid N` (`tests/c/pool_fork.c`), returned
/// once the child has said `child up` too (it is past `fork` and its handlers: the shim's
/// letting go of what a child must not keep has run); read up to those lines only: the
/// child keeps the pipe open.
pub fn child_pid_line(program: &mut Child) -> i32 {
    use std::io::BufRead;
    let mut out = std::io::BufReader::new(program.stdout.take().expect("a piped stdout"));
    let (mut line, mut pid, mut up) = (String::new(), None, false);
    while pid.is_none() || !up {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "no `child pid` and `child up` lines (pid {pid:?}, up {up})"
        );
        if let Some(p) = line.trim().strip_prefix("child pid ") {
            pid = Some(p.parse().unwrap());
        }
        up |= line.trim() == "child up";
    }
    pid.unwrap()
}

/// Compiles the C file `tests/c/<name>.c` (cached by modification time) into
/// `target/<profile>/ctests/<name><suffix>`. `extra` goes to the compiler after the
/// source (libraries, `-shared -fPIC`, ...). `-lcuda` finds the fake driver.
pub fn compile_c(name: &str, suffix: &str, extra: &[&str]) -> PathBuf {
    let src = root().join("tests/c").join(format!("{name}.c"));
    let out_dir = profile_dir().join("ctests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join(format!("{name}{suffix}"));
    let fresh = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    // Any header of tests/c may be included (fakecuda.h, driver_probe.h).
    let headers = std::fs::read_dir(root().join("tests/c"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "h"));
    let newest_src = headers.chain([src.clone()]).filter_map(|p| fresh(&p)).max();
    if let (Some(s), Some(o)) = (newest_src, fresh(&out))
        && o >= s
    {
        return out;
    }
    let tmp = out_dir.join(format!(".{name}{suffix}.{}", unique()));
    let status = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Werror", "-pthread", "-I"])
        .arg(root().join("tests/c"))
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .arg("-L")
        .arg(fake_lib_dir())
        .args(extra)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(status.success(), "compiling {} failed", src.display());
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// Waits (at most 60 s) until `child` made its `ready` file; panics with its output if it
/// exits first. `what` names it in the message.
pub fn wait_ready(child: &mut std::process::Child, ready: &Path, what: &str) {
    let start = std::time::Instant::now();
    while !ready.exists() {
        if child.try_wait().unwrap().is_some() {
            let child =
                std::mem::replace(child, std::process::Command::new("true").spawn().unwrap());
            panic!(
                "{what} exited before {} appeared\n{}",
                ready.display(),
                dump(&child.wait_with_output().unwrap())
            );
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{} never appeared",
            ready.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `inner` run as user and group `uid`, without supplementary groups (`setpriv`, from
/// root).
pub fn as_user(uid: u32, inner: &Command) -> Command {
    let mut w = Command::new("setpriv");
    w.args([
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
        "--".into(),
    ]);
    wrap(w, inner)
}

/// `outer` (a wrapper: `setpriv …`, `unshare … sh -c …`, its own arguments given) running
/// `inner`'s program and arguments last, with `inner`'s environment changes.
pub fn wrap(mut outer: Command, inner: &Command) -> Command {
    outer.arg(inner.get_program()).args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => outer.env(k, v),
            None => outer.env_remove(k),
        };
    }
    outer
}

/// The name `/etc/passwd` gives `uid` (its number where it has none): what gpucap's
/// readers show as a process's or pool's user (`status`, the metrics' `user` label).
pub fn user_name(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_string())
        })
        .unwrap_or_else(|| uid.to_string())
}

/// [`user_name`] of this process's effective user.
pub fn own_user() -> String {
    // SAFETY: geteuid has no preconditions.
    user_name(unsafe { libc::geteuid() })
}
