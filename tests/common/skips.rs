//! The one skip rule ([`skip`]) and the probes of what a test needs (strace, namespaces,
//! a checker program): where a test is required (CI, or GPUCAP_TEST_REQUIRE_CLIENTS=1)
//! a missing one fails it, else it prints SKIP and passes.

use std::path::PathBuf;
use std::process::Command;

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

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a test that must run as root runs here: as root, else a SKIP line, or a
/// failure where the test must run (`skip`; CI runs the tests as root).
#[track_caller]
pub fn as_root(what: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(&format!("{what} needs root (CI runs the tests as root)"));
    false
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

/// Whether `unshare -rm` with an overlay on `/etc` runs here (tests that give a program
/// an `/etc/gpucap/gpucap.env` or an `/etc/ld.so.preload` of their own, never writing the
/// system's): false after a SKIP line, or a failure where the test must run (`skip`).
pub fn etc_overlay_works(dir: &std::path::Path) -> bool {
    let t = dir.join("probe-overlay");
    std::fs::create_dir_all(&t).unwrap();
    let o = Command::new("unshare")
        .args(["-rm", "sh", "-c"])
        .arg(
            "set -e; t=$1; mount -t tmpfs none \"$t\"; mkdir -p \"$t/u/gpucap\" \"$t/w\"; \
             mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$t/u\",workdir=\"$t/w\" /etc; \
             test -d /etc/gpucap",
        )
        .arg("sh")
        .arg(&t)
        .output();
    match o {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr).trim().to_string();
            skip(&format!(
                "`unshare -rm` with an overlay mount on /etc failed: {why}"
            ));
            false
        }
        Err(e) => {
            skip(&format!(
                "`unshare -rm` with an overlay on /etc: no unshare ({e}; util-linux)"
            ));
            false
        }
    }
}
