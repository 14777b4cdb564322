//! scripts/docker-entrypoint.sh, run as a container would run it (no Docker engine):
//! the entrypoint with the command as its arguments, on the fake GPU.
//!
//! Each test installs gpucap, a COPY of libgpucap.so and the entrypoint in a scratch
//! "GPUCAP_HOME", so the gpucap.env the entrypoint writes beside the library stays
//! there. /etc is never touched: GPUCAP_ETC points the ld.so.preload install elsewhere.
//! The container's pool (GPUCAP_POOL=container-N by default, N the inode of the mount
//! namespace, the same for every process of a container) lives in the install's own
//! pool directory (GPUCAP_POOL_DIR), so tests running at once do not share a budget.

use super::common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A scratch install: `<dir>/home/{gpucap,libgpucap.so,docker-entrypoint.sh}`, and
/// `<dir>/pools` for the container's pool.
struct Install {
    dir: PathBuf,
    home: PathBuf,
    pools: PathBuf,
}

impl Install {
    fn new(tag: &str) -> Install {
        let dir = scratch(tag);
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::copy(cli(), home.join("gpucap")).unwrap();
        std::fs::copy(shim(), home.join("libgpucap.so")).unwrap();
        std::fs::copy(
            root().join("scripts/docker-entrypoint.sh"),
            home.join("docker-entrypoint.sh"),
        )
        .unwrap();
        let pools = dir.join("pools");
        std::fs::create_dir_all(&pools).unwrap();
        Install { dir, home, pools }
    }

    fn lib(&self) -> PathBuf {
        self.home.join("libgpucap.so")
    }

    fn env_file(&self) -> PathBuf {
        self.home.join("gpucap.env")
    }

    /// The entrypoint (the installed copy, which finds gpucap beside itself) with
    /// `args` as the container's command, on a 4 GiB fake GPU.
    fn entrypoint(&self, args: &[&str]) -> Command {
        let mut c = fake_cmd(
            self.home.join("docker-entrypoint.sh"),
            &self.dir.join("stats.json"),
        );
        c.args(args)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_POOL_DIR", &self.pools);
        c
    }
}

fn client() -> String {
    cudarc_client().to_str().unwrap().to_string()
}

#[test]
fn a_bad_configuration_stops_the_container() {
    let inst = Install::new("ep-bad");
    let marker = inst.dir.join("started");
    for (var, value) in [
        ("GPUCAP_LIMIT", "150%"),
        ("GPUCAP_LIMT", "1Gi"),
        ("GPUCAP_LD_SO_PRELOAD", "maybe"),
    ] {
        let o = run(inst
            .entrypoint(&["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()])
            .env(var, value));
        assert_eq!(o.status.code(), Some(2), "{var}={value}\n{}", dump(&o));
        let err = stderr(&o);
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("gpucap: invalid {var}=\"{value}\""))),
            "{}",
            dump(&o)
        );
        assert!(
            err.contains("gpucap-entrypoint: the gpucap configuration is not valid"),
            "{}",
            dump(&o)
        );
        assert!(!marker.exists(), "the command ran\n{}", dump(&o));
        assert!(
            !inst.env_file().exists(),
            "an invalid configuration was written"
        );
    }
    // No command at all, or no gpucap to be found: also status 2.
    let o = run(&mut inst.entrypoint(&[]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("no command to run"), "{}", dump(&o));
    let o = run(inst
        .entrypoint(&["true"])
        .env("GPUCAP_HOME", inst.dir.join("nowhere")));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("cannot find gpucap"), "{}", dump(&o));
}

/// LD_PRELOAD (and /etc/ld.so.preload) split on spaces and colons: a library whose path
/// has one cannot be preloaded, and the entrypoint says so in its own line before
/// anything runs (not as a configuration error).
#[test]
fn a_library_path_with_a_space_or_a_colon_stops_the_container() {
    let inst = Install::new("ep-space");
    let marker = inst.dir.join("started");
    for dir in ["lib dir", "lib:dir", "lib\tdir"] {
        let odd = inst.dir.join(dir);
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::copy(shim(), odd.join("libgpucap.so")).unwrap();
        let o = run(inst
            .entrypoint(&["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()])
            .env("GPUCAP_LIB", odd.join("libgpucap.so")));
        assert_eq!(o.status.code(), Some(2), "{dir:?}\n{}", dump(&o));
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{dir:?}\n{}", dump(&o));
        assert!(
            err.starts_with("gpucap-entrypoint: the path of libgpucap.so (")
                && err.contains("contains a space or a colon, which LD_PRELOAD"),
            "{dir:?}\n{}",
            dump(&o)
        );
        assert!(!marker.exists(), "the command ran\n{}", dump(&o));
        assert!(!inst.env_file().exists(), "gpucap.env was written");
    }
}

#[test]
fn a_good_configuration_caps_a_real_client() {
    let inst = Install::new("ep-cap");
    let o = run(inst
        .entrypoint(&[&client(), "600", "600", "free", "600"])
        .env("GPUCAP_LIMIT", "1Gi"));
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert_eq!(
        r.outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY", "600 ok"],
        "{}",
        dump(&o)
    );
    assert_eq!(r.total_mem, Some(GIB), "{}", dump(&o));
    assert_eq!(refusals(&stderr(&o)).len(), 1, "{}", dump(&o));
    let stats = read_stats(&inst.dir.join("stats.json"));
    assert!(stats[0].peak_used <= GIB);
    // The effective configuration, beside the library.
    let text = std::fs::read_to_string(inst.env_file()).unwrap();
    assert!(text.lines().any(|l| l == "GPUCAP_LIMIT=1Gi"), "{text}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(inst.env_file()).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o644);
}

#[test]
fn gpucap_home_names_the_install() {
    // The repository's script, not beside gpucap: GPUCAP_HOME says where to look.
    let inst = Install::new("ep-home");
    let mut c = fake_cmd(
        root().join("scripts/docker-entrypoint.sh"),
        &inst.dir.join("stats.json"),
    );
    c.args([&client(), "600", "600"])
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_HOME", &inst.home)
        .env("GPUCAP_POOL_DIR", &inst.pools)
        .env("GPUCAP_LIMIT", "1Gi");
    let o = run(&mut c);
    assert_ok(&o);
    assert_eq!(
        ClientReport::parse(&stdout(&o)).outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );
    assert!(inst.env_file().exists());
}

#[test]
fn exit_status_passes_through() {
    let inst = Install::new("ep-status");
    for code in [0, 1, 7, 42] {
        let script = format!("exit {code}");
        let o = run(inst
            .entrypoint(&["sh", "-c", &script])
            .env("GPUCAP_LIMIT", "1Gi"));
        assert_eq!(o.status.code(), Some(code), "{}", dump(&o));
    }
    let o = run(&mut inst.entrypoint(&["gpucap-no-such-command"]));
    assert_eq!(o.status.code(), Some(127), "{}", dump(&o));
    let o = run(&mut inst.entrypoint(&["sh", "-c", "kill -TERM $$"]));
    assert_eq!(o.status.signal(), Some(15), "{}", dump(&o));
}

/// Waits for `child` to exit, at most 10 s.
fn wait(child: &mut std::process::Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no exit after the signal"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn signals_reach_the_command_which_has_the_entrypoints_pid() {
    let inst = Install::new("ep-signal");
    let script = "trap 'echo got TERM; exit 42' TERM; echo ready $$; while :; do sleep 0.05; done";
    let mut child = inst
        .entrypoint(&["sh", "-c", script])
        .env("GPUCAP_LIMIT", "1Gi")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    // After the execs the command IS the process the container runtime started.
    assert_eq!(line, format!("ready {}\n", child.id()));
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait(&mut child);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(rest, "got TERM\n");
    assert_eq!(status.code(), Some(42));

    // A command without a handler dies of the signal, and that is the status.
    let mut child = inst.entrypoint(&["sleep", "30"]).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(wait(&mut child).signal(), Some(15));
}

/// A harmless shared library to preload.
fn marker_lib(dir: &Path) -> PathBuf {
    let src = dir.join("marker.c");
    std::fs::write(&src, "int gpucap_test_marker(void) { return 1; }\n").unwrap();
    let out = dir.join("libmarker.so");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success());
    out
}

#[test]
fn an_existing_ld_preload_is_kept() {
    let inst = Install::new("ep-preload");
    let marker = marker_lib(&inst.dir);
    let o = run(inst
        .entrypoint(&["sh", "-c", "printf '%s\\n' \"$LD_PRELOAD\""])
        .env("LD_PRELOAD", &marker));
    assert_ok(&o);
    let lib = inst.lib().canonicalize().unwrap();
    assert_eq!(
        stdout(&o),
        format!("{}:{}\n", marker.display(), lib.display()),
        "{}",
        dump(&o)
    );
    // And with both preloaded, the client is capped.
    let o = run(inst
        .entrypoint(&[&client(), "600", "600"])
        .env("LD_PRELOAD", &marker)
        .env("GPUCAP_LIMIT", "1Gi"));
    assert_ok(&o);
    assert_eq!(
        ClientReport::parse(&stdout(&o)).outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );
}

/// `env -i LD_PRELOAD=<lib> LD_LIBRARY_PATH=<fake> cudarc-client 600 600`: a process
/// whose launcher passed `LD_PRELOAD` on and nothing else of the container's environment
/// (`su -`, ssh and `sudo` drop `LD_PRELOAD` too: only `/etc/ld.so.preload` reaches them,
/// as the CDI container test's process with an empty environment shows).
fn emptied(lib: &Path) -> Output {
    Command::new("env")
        .arg("-i")
        .arg(format!("LD_PRELOAD={}", lib.display()))
        .arg(format!("LD_LIBRARY_PATH={}", fake_lib_dir().display()))
        .arg(cudarc_client())
        .args(["600", "600"])
        .output()
        .unwrap()
}

#[test]
fn a_process_with_an_emptied_environment_stays_capped() {
    let inst = Install::new("ep-emptied");
    let o = run(inst
        .entrypoint(&["true"])
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_LOG", "info"));
    assert_ok(&o);
    assert!(
        stderr(&o).contains("gpucap: configuration OK"),
        "info shows the check\n{}",
        dump(&o)
    );
    let o = emptied(&inst.lib());
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert_eq!(
        r.outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );
    assert_eq!(r.total_mem, Some(GIB), "{}", dump(&o));

    // Control: the same library without a gpucap.env beside it does not cap.
    let bare = inst.dir.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(shim(), bare.join("libgpucap.so")).unwrap();
    let o = emptied(&bare.join("libgpucap.so"));
    assert_ok(&o);
    assert_eq!(
        ClientReport::parse(&stdout(&o)).outcomes(),
        ["600 ok", "600 ok"],
        "{}",
        dump(&o)
    );

    // A damaged file fails closed: every CUDA call is refused, and the message names it.
    std::fs::write(inst.env_file(), "GPUCAP_LIMIT=lots\n").unwrap();
    let o = emptied(&inst.lib());
    let err = stderr(&o);
    assert!(
        err.contains(&"gpucap: invalid GPUCAP_LIMIT=\"lots\"".to_string())
            && err.contains(&inst.env_file().display().to_string()),
        "{}",
        dump(&o)
    );
    assert!(
        ClientReport::parse(&stdout(&o)).init_err.is_some(),
        "{}",
        dump(&o)
    );
    // gpucap check, in such an environment, shows the file the shim would read.
    let o = Command::new("env")
        .arg("-i")
        .arg(inst.home.join("gpucap"))
        .arg("check")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("(in "), "{}", dump(&o));
    std::fs::write(inst.env_file(), "GPUCAP_LIMIT=2Gi\n").unwrap();
    let o = Command::new("env")
        .arg("-i")
        .arg(inst.home.join("gpucap"))
        .arg("check")
        .output()
        .unwrap();
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "configuration: from {}",
            inst.env_file().display()
        )),
        "{out}"
    );
    assert!(out.contains("limit: every GPU: 2 GiB"), "{out}");
}

#[test]
fn ld_so_preload_install_is_idempotent_and_keeps_other_lines() {
    let inst = Install::new("ep-ldso");
    let etc = inst.dir.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let preload_file = etc.join("ld.so.preload");
    std::fs::write(&preload_file, "/usr/lib/other.so").unwrap(); // no final newline
    let lib = inst.lib();
    let expected = format!("/usr/lib/other.so\n{}\n", lib.display());
    for _ in 0..2 {
        let o = run(inst
            .entrypoint(&["sh", "-c", "env | grep '^GPUCAP_' | sort"])
            .env("GPUCAP_LD_SO_PRELOAD", "1")
            .env("GPUCAP_ETC", &etc)
            .env("GPUCAP_LIMIT", "1Gi"));
        assert_ok(&o);
        // GPUCAP_ETC is the script's own knob: the command does not see it.
        assert_eq!(
            stdout(&o),
            format!(
                "GPUCAP_LD_SO_PRELOAD=1\nGPUCAP_LIMIT=1Gi\nGPUCAP_POOL={}\n\
                 GPUCAP_POOL_DIR={}\n",
                default_pool(),
                inst.pools.display()
            ),
            "{}",
            dump(&o)
        );
        assert_eq!(std::fs::read_to_string(&preload_file).unwrap(), expected);
    }
    let text = std::fs::read_to_string(inst.env_file()).unwrap();
    assert!(text.contains("GPUCAP_LIMIT=1Gi\n"), "{text}");
    // Without the switch, nothing is installed.
    let etc2 = inst.dir.join("etc2");
    std::fs::create_dir_all(&etc2).unwrap();
    let o = run(inst.entrypoint(&["true"]).env("GPUCAP_ETC", &etc2));
    assert_ok(&o);
    assert!(!etc2.join("ld.so.preload").exists());
}

/// A relative `GPUCAP_LIB` goes into /etc/ld.so.preload as an absolute path: before, it
/// was written as given (`./libgpucap.so`), which the loader cannot preload for a
/// process started anywhere else, so those ran uncapped.
#[test]
fn a_relative_library_path_goes_into_ld_so_preload_absolute() {
    let inst = Install::new("ep-ldso-relative");
    let etc = inst.dir.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let o = run(inst
        .entrypoint(&["true"])
        .current_dir(&inst.home)
        .env("GPUCAP_LIB", "./libgpucap.so")
        .env("GPUCAP_LD_SO_PRELOAD", "1")
        .env("GPUCAP_ETC", &etc)
        .env("GPUCAP_LIMIT", "1Gi"));
    assert_ok(&o);
    assert_eq!(
        std::fs::read_to_string(etc.join("ld.so.preload")).unwrap(),
        format!("{}/./libgpucap.so\n", inst.home.display())
    );
}

/// A `gpucap.env` beside the library that this process may not write (an operator's,
/// mounted read-only: a ConfigMap) is checked, never written, and the container starts
/// under it; before, the entrypoint tried to write it and stopped the container with
/// "the gpucap configuration is not valid".
#[test]
fn a_gpucap_env_that_cannot_be_written_is_checked_not_written() {
    use std::os::unix::fs::PermissionsExt;
    let inst = Install::new("ep-env-readonly");
    std::fs::write(inst.env_file(), "GPUCAP_LIMIT=1Gi\n").unwrap();
    std::fs::set_permissions(inst.env_file(), std::fs::Permissions::from_mode(0o444)).unwrap();
    // A read-only file is writable by root all the same: the test asks as another user
    // where it runs as root, with `setpriv`.
    let mut c = inst.entrypoint(&[&client(), "600", "600"]);
    c.env("GPUCAP_LIMIT", "512Mi");
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY (above): geteuid has no preconditions.
        for d in [&inst.dir, &inst.home, &inst.pools] {
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
        }
        c = as_user(65534, &c);
    }
    let o = run(&mut c);
    assert_ok(&o);
    assert!(
        stderr(&o).contains("warning: cannot write"),
        "the warning, and the container started\n{}",
        dump(&o)
    );
    assert_eq!(
        std::fs::read_to_string(inst.env_file()).unwrap(),
        "GPUCAP_LIMIT=1Gi\n",
        "the operator's file is left as it is"
    );
    // Held at the environment's 512 MiB, under the file's 1 GiB ceiling.
    assert!(
        stdout(&o).contains("alloc 600 err CUDA_ERROR_OUT_OF_MEMORY"),
        "{}",
        dump(&o)
    );
}

/// A `gpucap.env` beside the library that is there when the container starts (an
/// image's, an operator's, or one an image's build wrote with `gpucap check
/// --write-env`) is a ceiling: the entrypoint writes the environment's configuration
/// under it. A container started with a higher `GPUCAP_LIMIT`, with `none` or with none
/// runs under the file's 512 MiB, and so do its processes that lose the environment, in
/// the container's pool (before, the entrypoint wrote the environment's configuration
/// over it: 4 GiB, or no cap at all, served 300 MiB past 256; and a first fix that kept
/// such a file left processes without the environment uncapped where it set no cap, and
/// out of the container's pool where it named none: two reviews). A lower cap is
/// written; what the file sets and the environment does not (`GPUCAP_LOG`) stays.
#[test]
fn a_gpucap_env_already_there_is_a_ceiling_the_entrypoint_writes_under() {
    let inst = Install::new("ep-env-image");
    let header = "# gpucap configuration, written by `gpucap check --write-env` (the container\n";
    let held = "err CUDA_ERROR_OUT_OF_MEMORY";
    // (the file there, the container's environment, the cap written, a process's two
    // allocations of 300 MiB without the environment)
    type Case<'a> = (String, &'a [(&'a str, &'a str)], &'a str, [&'a str; 2]);
    let cases: [Case; 6] = [
        (
            "# the image's cap\nGPUCAP_LIMIT=512Mi\n".into(),
            &[("GPUCAP_LIMIT", "4Gi")],
            "GPUCAP_LIMIT=512Mi",
            ["ok", held],
        ),
        (
            "# the image's cap\nGPUCAP_LIMIT=512Mi\n".into(),
            &[],
            "GPUCAP_LIMIT=512Mi",
            ["ok", held],
        ),
        (
            "# the image's cap\nGPUCAP_LIMIT=512Mi\n".into(),
            &[("GPUCAP_LIMIT", "none")],
            "GPUCAP_LIMIT=512Mi",
            ["ok", held],
        ),
        (
            format!("{header}GPUCAP_LIMIT=512Mi\n"),
            &[("GPUCAP_LIMIT", "4Gi")],
            "GPUCAP_LIMIT=512Mi",
            ["ok", held],
        ),
        (
            "GPUCAP_LOG=info\n".into(),
            &[("GPUCAP_LIMIT", "256Mi")],
            "GPUCAP_LIMIT=256Mi",
            [held, held],
        ),
        (
            "# filled in at the start\n".into(),
            &[("GPUCAP_LIMIT", "1Gi")],
            "GPUCAP_LIMIT=1Gi",
            ["ok", "ok"],
        ),
    ];
    for (before, env, written, outcomes) in cases {
        std::fs::write(inst.env_file(), &before).unwrap();
        let mut c = inst.entrypoint(&[&client(), "300", "300"]);
        c.env_remove("GPUCAP_LIMIT");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = run(&mut c);
        assert_ok(&o);
        let after = std::fs::read_to_string(inst.env_file()).unwrap();
        assert!(
            after.lines().any(|l| l == written)
                && after.contains("GPUCAP_POOL=container-mntns")
                && (!before.contains("GPUCAP_LOG") || after.contains("GPUCAP_LOG=info")),
            "{before:?} {env:?}: {written} expected in\n{after}\n{}",
            dump(&o)
        );
        // A process that lost the environment reads the file: held as the container.
        let lost = Command::new("env")
            .arg("-i")
            .arg(format!("LD_PRELOAD={}", inst.lib().display()))
            .arg(format!("LD_LIBRARY_PATH={}", fake_lib_dir().display()))
            .arg("FAKECUDA_TOTAL_MEM=4Gi")
            .arg(cudarc_client())
            .args(["300", "300"])
            .output()
            .unwrap();
        let expected = outcomes.map(|r| format!("alloc 300 {r}"));
        assert_eq!(
            allocs(&lost),
            expected,
            "{before:?} {env:?}: a process without the environment\n{}",
            dump(&lost)
        );
    }
}

/// Waits until `path` exists (a harness limit of 60 s, not a timing assertion).
fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `alloc SIZE rc` lines of tests/c/script.c's output.
fn allocs(o: &Output) -> Vec<String> {
    stdout(o)
        .lines()
        .filter(|l| l.starts_with("alloc "))
        .map(String::from)
        .collect()
}

/// Two containers' worth of processes through the entrypoint, capped at 1 GiB: the
/// first holds 600 MiB while the second asks for 600 MiB, then 300 MiB. `env` is added
/// to both. Returns the second's `alloc` lines.
fn second_of_two(inst: &Install, tag: &str, env: &[(&str, &str)]) -> Vec<String> {
    let script = compile_c("script", "", &["-lcuda"]);
    let script = script.to_str().unwrap();
    let (ready, go) = (
        inst.dir.join(format!("{tag}.ready")),
        inst.dir.join(format!("{tag}.go")),
    );
    let (ready_s, go_s) = (
        format!("touch:{}", ready.display()),
        format!("wait:{}", go.display()),
    );
    let mut first = inst.entrypoint(&[script, "alloc:600Mi", &ready_s, &go_s]);
    first
        .env("GPUCAP_LIMIT", "1Gi")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let first = first.spawn().unwrap();
    wait_for(&ready);
    let second = run(inst
        .entrypoint(&[script, "alloc:600Mi", "alloc:300Mi"])
        .env("GPUCAP_LIMIT", "1Gi")
        .envs(env.iter().copied()));
    std::fs::write(&go, "").unwrap();
    let first = first.wait_with_output().unwrap();
    assert_ok(&first);
    assert_eq!(
        allocs(&first),
        [format!("alloc {} 0", 600 << 20)],
        "{}",
        dump(&first)
    );
    assert_ok(&second);
    allocs(&second)
}

/// The entrypoint's default pool: the container's (`container-mntns`).
fn default_pool() -> String {
    "container-mntns".into()
}

/// The container's pool's directory: `gpucap-container-N`, N the inode of the mount
/// namespace (one per container; here the test's own), every user's.
fn container_dir(pools: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata("/proc/self/ns/mnt").unwrap().ino();
    pools.join(format!("gpucap-container-{ino}"))
}

#[test]
fn a_containers_processes_share_one_cap_by_default() {
    let inst = Install::new("ep-pool");
    // The entrypoint sets the default for the command, and writes it to gpucap.env.
    let o = run(&mut inst.entrypoint(&["sh", "-c", "printf '%s\\n' \"$GPUCAP_POOL\""]));
    assert_ok(&o);
    assert_eq!(stdout(&o), format!("{}\n", default_pool()), "{}", dump(&o));
    let text = std::fs::read_to_string(inst.env_file()).unwrap();
    let line = format!("GPUCAP_POOL={}", default_pool());
    assert!(text.lines().any(|l| l == line), "{text}");
    // Two processes share the 1 GiB: the second's 600 MiB is refused (600 + 600 >
    // 1 GiB), its 300 MiB fits.
    assert_eq!(
        second_of_two(&inst, "default", &[]),
        [
            format!("alloc {} 2", 600 << 20), // CUDA_ERROR_OUT_OF_MEMORY
            format!("alloc {} 0", 300 << 20),
        ]
    );
    assert!(container_dir(&inst.pools).join("gpucap.pool").exists());
    // The user's own pool name is kept.
    let o = run(inst
        .entrypoint(&["sh", "-c", "printf '%s\\n' \"$GPUCAP_POOL\""])
        .env("GPUCAP_POOL", "mine"));
    assert_eq!(stdout(&o), "mine\n", "{}", dump(&o));
    // HAMi-core's pool file is a pool too: no default is added beside it.
    let cache = inst.dir.join("hami.cache");
    let o = run(inst
        .entrypoint(&["sh", "-c", "printf '%s\\n' \"${GPUCAP_POOL-unset}\""])
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache));
    assert_ok(&o);
    assert_eq!(stdout(&o), "unset\n", "{}", dump(&o));
}

#[test]
fn gpucap_pool_off_gives_each_process_its_own_cap() {
    let inst = Install::new("ep-pool-off");
    assert_eq!(
        second_of_two(&inst, "off", &[("GPUCAP_POOL", "off")]),
        [
            format!("alloc {} 0", 600 << 20),
            format!("alloc {} 0", 300 << 20),
        ]
    );
    let text = std::fs::read_to_string(inst.env_file()).unwrap();
    assert!(text.lines().any(|l| l == "GPUCAP_POOL=off"), "{text}");
    // No pool file was made (the per-user directory may hold the lone processes' files,
    // `*.lone`, gone once they exit).
    assert_eq!(pool_files_under(&inst.pools), Vec::<PathBuf>::new());
}

/// The `*.pool` files under `dir`, at any depth.
fn pool_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(pool_files_under(&path));
        } else if path.extension().is_some_and(|e| e == "pool") {
            found.push(path);
        }
    }
    found
}

/// `docker exec -e GPUCAP_LIMIT=1Gi CONTAINER prog`: a process that has variables of
/// its own but not the GPUCAP_POOL the entrypoint exported still joins the container's
/// pool, the one gpucap.env names; so does one that sets `GPUCAP_POOL=off`.
#[test]
fn a_process_with_its_own_variables_but_no_pool_joins_the_containers_pool() {
    let inst = Install::new("ep-exec");
    let script = compile_c("script", "", &["-lcuda"]);
    let script = script.to_str().unwrap();
    let (ready, go) = (inst.dir.join("ready"), inst.dir.join("go"));
    let mut first = inst.entrypoint(&[
        script,
        "alloc:600Mi",
        &format!("touch:{}", ready.display()),
        &format!("wait:{}", go.display()),
    ]);
    first
        .env("GPUCAP_LIMIT", "1Gi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let first = first.spawn().unwrap();
    wait_for(&ready);
    // As docker exec starts it: the library preloaded, the container's -e variables,
    // not what the entrypoint exported.
    let exec = |pool: Option<&str>| {
        let mut c = fake_cmd(script, &inst.dir.join("exec.json"));
        c.env("LD_PRELOAD", inst.lib())
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_LIMIT", "1Gi")
            .args(["alloc:600Mi", "alloc:300Mi"]);
        if let Some(p) = pool {
            c.env("GPUCAP_POOL", p);
        }
        run(&mut c)
    };
    let joined = exec(None);
    let own = exec(Some("off"));
    std::fs::write(&go, "").unwrap();
    assert_ok(&first.wait_with_output().unwrap());
    assert_ok(&joined);
    assert_eq!(
        allocs(&joined),
        [
            format!("alloc {} 2", 600 << 20),
            format!("alloc {} 0", 300 << 20)
        ],
        "the container's pool holds 600 MiB already\n{}",
        dump(&joined)
    );
    // The pool gpucap.env names binds (a ceiling: docs/src/configuration.md#ceilings):
    // GPUCAP_POOL=off would give the process a 1 GiB of its own beside the container's.
    assert_ok(&own);
    assert_eq!(
        allocs(&own),
        [
            format!("alloc {} 2", 600 << 20),
            format!("alloc {} 0", 300 << 20)
        ],
        "GPUCAP_POOL=off stays in the container's pool\n{}",
        dump(&own)
    );
    assert!(
        stderr(&own).contains(&format!(
            "GPUCAP_POOL=\"off\" would leave the pool {}",
            default_pool()
        )),
        "{}",
        dump(&own)
    );
}

/// Does the .dockerignore pattern `pattern` (Docker's syntax: path segments with `*`,
/// `?` and `**`, a trailing `/` ignored, a leading `/` meaning the context's root)
/// match `path`, or a directory above it (an excluded directory takes its contents)?
fn docker_ignores(pattern: &str, path: &str) -> bool {
    fn seg(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => seg(&p[1..], s) || (!s.is_empty() && seg(p, &s[1..])),
            (Some(b'?'), Some(_)) => seg(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => seg(&p[1..], &s[1..]),
            _ => false,
        }
    }
    fn segs(p: &[&str], s: &[&str]) -> bool {
        match (p.first(), s.first()) {
            (None, _) => true, // a directory matched: everything below it too
            (Some(&"**"), _) => segs(&p[1..], s) || (!s.is_empty() && segs(p, &s[1..])),
            (Some(a), Some(b)) => seg(a.as_bytes(), b.as_bytes()) && segs(&p[1..], &s[1..]),
            (Some(_), None) => false,
        }
    }
    let pattern = pattern.trim_matches('/');
    let p: Vec<&str> = pattern.split('/').collect();
    let s: Vec<&str> = path.split('/').collect();
    segs(&p, &s)
}

/// The repository ships a .dockerignore, so that `docker build .` with
/// scripts/Dockerfile.example (`COPY . .`) does not send target/ (past a gigabyte after
/// the tests) or .git to the builder, and still sends every source the build needs.
#[test]
fn the_dockerignore_keeps_the_build_output_out_of_the_image_context() {
    let text = std::fs::read_to_string(root().join(".dockerignore"))
        .expect("a .dockerignore at the repository's root");
    let patterns: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        patterns.iter().all(|p| !p.starts_with('!')),
        "no exceptions expected: {patterns:?}"
    );
    let ignored = |path: &str| patterns.iter().any(|p| docker_ignores(p, path));
    for path in [
        "target",
        "target/release/libgpucap.so",
        "target/venv-cupy/bin/python",
        "tests/cudarc-client/target/debug/x",
        ".git/HEAD",
        ".venv/bin/python",
        "tests/clients/__pycache__/x.pyc",
    ] {
        assert!(ignored(path), "{path} would be sent: {patterns:?}");
    }
    // What the Dockerfile's build stage needs is sent.
    for path in [
        "Cargo.toml",
        "Cargo.lock",
        "src/shim/lib.rs",
        "src/cli/main.rs",
        "cuda-stubs/Cargo.toml",
        "tests/cudarc-client/Cargo.toml",
        "scripts/docker-entrypoint.sh",
    ] {
        assert!(!ignored(path), "{path} would be left out: {patterns:?}");
        assert!(
            root().join(path).exists(),
            "{path} is not in the repository"
        );
    }
    // The Dockerfile still copies the whole context, which this file trims.
    let dockerfile = std::fs::read_to_string(root().join("scripts/Dockerfile.example")).unwrap();
    assert!(dockerfile.contains("COPY . ."), "{dockerfile}");
}
