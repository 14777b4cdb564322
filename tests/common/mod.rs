//! Shared helpers for the integration tests: where the built artefacts are, how to
//! run a program on the fake GPU under the shim, and how to read the fake driver's
//! statistics. Every test binary includes this with `mod common;`.
#![allow(dead_code)]

pub mod pool_scratch;

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

// ---------------------------------------------------------------------------
// Real clients (tests/cudarc-client, tests/clients/bindings_client.py): shared by
// tests/real_clients/real_clients.rs and tests/cli/cli.rs.

/// `target/<profile>/cudarc-client`, an unmodified cudarc program.
pub fn cudarc_client() -> PathBuf {
    built("cudarc-client")
}

/// What a real client printed (see tests/cudarc-client/src/main.rs for the format).
#[derive(Debug, Default)]
pub struct ClientReport {
    /// `device 0 total_mem=`: cuDeviceTotalMem.
    pub total_mem: Option<u64>,
    /// Every `mem_get_info free= total=` line, in order: (free, total).
    pub mem_info: Vec<(u64, u64)>,
    /// Every allocation: (kind `alloc`/`alloc_async`, MiB, `ok` or the error text).
    pub allocs: Vec<(String, u64, Result<(), String>)>,
    /// `init err <name>` when the driver could not be initialised.
    pub init_err: Option<String>,
    /// The client reached its end (`done`).
    pub done: bool,
}

impl ClientReport {
    pub fn parse(out: &str) -> ClientReport {
        let mut r = ClientReport::default();
        let field = |line: &str, key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        };
        for line in out.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["device", "0", ..] => r.total_mem = Some(field(line, "total_mem=")),
                ["mem_get_info", ..] => r
                    .mem_info
                    .push((field(line, "free="), field(line, "total="))),
                [kind @ ("alloc" | "alloc_async"), mib, rest @ ..] => {
                    let res = match rest {
                        ["ok"] => Ok(()),
                        ["err", e @ ..] => Err(e.join(" ")),
                        other => Err(other.join(" ")),
                    };
                    r.allocs
                        .push((kind.to_string(), mib.parse().expect("MiB"), res));
                }
                ["init", "err", e @ ..] => r.init_err = Some(e.join(" ")),
                ["done"] => r.done = true,
                _ => {}
            }
        }
        r
    }

    /// The outcome of each allocation as `"<MiB> ok"` / `"<MiB> <error>"`, to compare
    /// against expectations in one assertion.
    pub fn outcomes(&self) -> Vec<String> {
        self.allocs
            .iter()
            .map(|(_, mib, res)| match res {
                Ok(()) => format!("{mib} ok"),
                Err(e) => format!("{mib} {e}"),
            })
            .collect()
    }
}

/// The `gpucap: refused ...` lines of a program's stderr.
pub fn refusals(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| l.starts_with("gpucap: refused"))
        .map(str::to_owned)
        .collect()
}

/// The fake NVML, `libnvidia_ml.so` (SONAME `libnvidia-ml.so.1`; [`fake_lib_dir`] links
/// `libnvidia-ml.so.1` to it).
pub fn fake_nvml() -> PathBuf {
    built("libnvidia_ml.so")
}

/// The last `n` lines of `s`.
pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Panics unless a C test program (tests/c) passed all its checks, printed its
/// summary line, and left no crash or panic on stderr; shows its output otherwise.
#[track_caller]
pub fn assert_passed(o: &Output, what: &str) {
    let out = stdout(o);
    assert!(
        o.status.success() && !out.contains("FAIL") && out.contains("summary:"),
        "{what}: {:?}\n--- failed checks\n{}\n--- stdout (tail)\n{}\n--- stderr (tail)\n{}",
        o.status,
        out.lines()
            .filter(|l| l.starts_with("FAIL") || l.starts_with("FATAL") || l.starts_with("error"))
            .collect::<Vec<_>>()
            .join("\n"),
        tail(&out, 40),
        tail(&stderr(o), 20),
    );
    let err = stderr(o);
    for bad in ["panicked", "RUST_BACKTRACE", "Segmentation", "libother:"] {
        assert!(
            !err.contains(bad),
            "{what}: stderr mentions {bad:?}:\n{}",
            tail(&err, 40)
        );
    }
}

/// Panics unless a C test program reported failed checks (a control run without the
/// shim that expects the cap).
#[track_caller]
pub fn assert_failed(o: &Output, what: &str) {
    let out = stdout(o);
    assert!(
        !o.status.success() && out.lines().any(|l| l.starts_with("FAIL")),
        "{what}: expected failed checks without the shim, got {:?}\n{}",
        o.status,
        tail(&out, 40)
    );
}

/// Whether what a test needs must be there: in CI (`CI` set, not "", "0" or "false": CI
/// sets CI=true) or with GPUCAP_TEST_REQUIRE_CLIENTS=1 (scripts/test.sh sets it), a test
/// that cannot run fails instead of printing SKIP and passing.
pub fn required_here() -> bool {
    required_by(|k| std::env::var(k).ok())
}

/// [`required_here`] of the variables `var` gives.
pub fn required_by(var: impl Fn(&str) -> Option<String>) -> bool {
    var("CI").is_some_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
        || var("GPUCAP_TEST_REQUIRE_CLIENTS").as_deref() == Some("1")
}

/// The one skip rule, for every test that may not run for want of a tool, a virtual
/// environment or a build (`why`: what is missing and where scripts/test.sh gets it):
/// it prints `SKIP: why` and the test returns, passing; where the test is required
/// ([`required_here`]: `CI=true`, or `GPUCAP_TEST_REQUIRE_CLIENTS=1`) it fails here,
/// naming what is missing.
#[track_caller]
pub fn skip(why: &str) {
    assert!(
        !required_here(),
        "this test must run here (CI or GPUCAP_TEST_REQUIRE_CLIENTS=1 is set) but cannot: {why}"
    );
    eprintln!("SKIP: {why}");
}

/// Whether strace runs here (tests that count a program's system calls): false after a
/// SKIP line, or a failure where the test must run (`skip`).
pub fn strace_runs() -> bool {
    let ok = std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok();
    if !ok {
        skip("strace is not installed (Debian: apt-get install strace)");
    }
    ok
}

/// Whether `unshare -pf --mount-proc --kill-child` (util-linux) runs here: false after a
/// SKIP line naming what is missing, or a failure naming it where the test must run
/// (CI, or GPUCAP_TEST_REQUIRE_CLIENTS=1: `skip`). It needs the unshare program
/// and the right to make PID and mount namespaces: root (CAP_SYS_ADMIN), which a
/// container without privileges (Docker's default capabilities and seccomp profile)
/// does not give.
pub fn unshare_works() -> bool {
    let why = match Command::new("unshare")
        .args(["-pf", "--mount-proc", "--kill-child", "true"])
        .output()
    {
        Ok(o) if o.status.success() => return true,
        Ok(o) => format!(
            "`unshare -pf --mount-proc --kill-child true` failed ({}: {}): making PID and \
             mount namespaces needs root (CAP_SYS_ADMIN); a container must allow it \
             (--privileged, or --cap-add SYS_ADMIN with a seccomp profile that allows unshare)",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!(
            "no `unshare` ({e}): it is util-linux's (Debian: apt-get install util-linux; \
             scripts/test.sh installs it)"
        ),
    };
    skip(&format!("the PID-namespace tests cannot run here: {why}"));
    false
}

/// Whether `unshare --net` (util-linux) runs here, making a network namespace (a
/// Kubernetes pod's own): false after a SKIP line naming what is missing, or a failure
/// where the test must run (`skip`). It needs root (CAP_SYS_ADMIN).
pub fn unshare_net_works() -> bool {
    let why = match Command::new("unshare").args(["--net", "true"]).output() {
        Ok(o) if o.status.success() => return true,
        Ok(o) => format!(
            "`unshare --net true` failed ({}: {}): a network namespace needs root \
             (CAP_SYS_ADMIN)",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!(
            "no `unshare` ({e}): it is util-linux's (Debian: apt-get install util-linux; \
             scripts/test.sh installs it)"
        ),
    };
    skip(&format!(
        "the network-namespace tests cannot run here: {why}"
    ));
    false
}

/// A checker program the tests run (promtool, mdbook): the path in `var`, else `name` on
/// PATH, else None after a SKIP line; with CI or GPUCAP_TEST_REQUIRE_CLIENTS=1 set, a
/// missing one fails (`why`: what it is for and where scripts/test.sh gets it).
pub fn checker_tool(var: &str, name: &str, why: &str) -> Option<PathBuf> {
    let found = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        });
    match found {
        Some(p) => {
            assert!(p.exists(), "{var}={} does not exist", p.display());
            Some(p)
        }
        None => {
            skip(&format!("no {name} ({var} unset, none on PATH): {why}"));
            None
        }
    }
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

/// The first `n` figures (`1,085,838`, `**142**`) after `from` in the paragraph of
/// `docs/src/<page>` that starts with `marker` (a published benchmark's figures).
pub fn book_figures(page: &str, marker: &str, from: &str, n: usize) -> Vec<i64> {
    let book = std::fs::read_to_string(root().join("docs/src").join(page)).unwrap();
    let para = &book[book
        .find(marker)
        .unwrap_or_else(|| panic!("{page} has no paragraph {marker:?}"))..];
    let para = &para[..para.find("\n\n").unwrap_or(para.len())];
    let text = &para[para
        .find(from)
        .unwrap_or_else(|| panic!("{page}, {marker:?}: no {from:?} in\n{para}"))
        + from.len()..];
    let figures: Vec<i64> = text
        .split(|c: char| !c.is_ascii_digit() && c != ',')
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
        .take(n)
        .map(|w| w.replace(',', "").parse().unwrap())
        .collect();
    assert_eq!(
        figures.len(),
        n,
        "{page}, {marker:?} after {from:?}: {figures:?}"
    );
    figures
}

/// `n` as the documents write it: thousands separated by commas (61,431).
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// Whether README.md states `figure` (as the documents write it, `thousands`) followed by
/// `after`: a figure the front page repeats from the page that owns it.
pub fn readme_states(figure: i64, after: &str) -> bool {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    readme.contains(&format!("{}{after}", thousands(figure)))
}

/// Runs a benchmark script of `scripts/bench/` (with `args`, and `env` set) that writes its
/// figures to `BENCH_JSON`, against this tree's build (no `BENCH_SHIM`, no
/// `LD_PRELOAD`): its output and the figures.
pub fn bench_json(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, serde_json::Value) {
    let json = scratch(script).join("figures.json");
    let mut cmd = Command::new(root().join("scripts/bench").join(script));
    cmd.args(args)
        .env("BENCH_JSON", &json)
        .env_remove("BENCH_SHIM")
        .env_remove("LD_PRELOAD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run(&mut cmd);
    assert_ok(&o);
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (o, v)
}
