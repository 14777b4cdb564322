//! Docker: Debian's docker.io, a dockerd of the tests' own, the base image imported with
//! `docker import` (no registry), and scripts/Dockerfile.example built with `docker build`
//! and run: what docs/src/container.md promises, under Docker.
//!
//! The daemon is started by the first test that needs it and stopped when the last one
//! holding it ends, passes or fails ([`Docker`]'s `Drop`); a shell that started it stops
//! it too when this test process dies, killed or not (its standard input closes). Its
//! data root is the test's scratch directory; its exec root, socket and pid file are in a
//! short directory under /tmp (a socket's path is at most 107 bytes). Flags for a machine
//! without iptables: `--iptables=false --bridge=none` (the containers run with
//! `--network=none`).

use super::*;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A running dockerd of the tests' own, with the base image imported.
pub struct Docker {
    docker: PathBuf,
    /// `unix://RUN/docker.sock`.
    host: String,
    /// The exec root, the socket, the pid file, the client's configuration, the log.
    run_dir: PathBuf,
    data_root: PathBuf,
    /// [`KEEPER`], the shell that started dockerd: it ends when dockerd does, and stops
    /// dockerd when its standard input closes.
    keeper: Option<Child>,
    /// The base image, as imported.
    pub base: String,
    /// scripts/Dockerfile.example built FROM the base image, once per daemon.
    example: OnceLock<Result<String, String>>,
}

/// The shell that runs dockerd (`sh -c KEEPER sh LOG DOCKERD ARGS...`): it ends when
/// dockerd does, and a reader of its standard input sends dockerd SIGTERM when that input
/// closes (the test's [`Drop`], or the test process's end, however it ends).
const KEEPER: &str = r#"log=$1; shift
exec 3<&0
"$@" </dev/null >"$log" 2>&1 3<&- &
d=$!
{ read -r _ <&3; kill -TERM "$d" 2>/dev/null; } &
exec 3<&-
wait "$d""#;

/// The daemon the tests share, or None (after SKIP) where Docker is not prepared and not
/// required. Panics with a clear line where it is prepared but cannot start.
pub fn docker() -> Option<Arc<Docker>> {
    static SHARED: Mutex<Weak<Docker>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = shared.upgrade() {
        return Some(d);
    }
    let d = Arc::new(Docker::start()?);
    *shared = Arc::downgrade(&d);
    Some(d)
}

impl Docker {
    /// Starts a dockerd and imports the base image; None (after SKIP) where the setup's
    /// variables are unset and nothing requires the test.
    pub fn start() -> Option<Docker> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let (Some(dockerd), Some(docker), Some(tar)) = (
            var("GPUCAP_TEST_DOCKERD"),
            var("GPUCAP_TEST_DOCKER"),
            var("GPUCAP_TEST_CONTAINER_BASE_TAR"),
        ) else {
            skip(
                "Docker is not prepared (GPUCAP_TEST_DOCKERD, GPUCAP_TEST_DOCKER, \
                 GPUCAP_TEST_CONTAINER_BASE_TAR unset): scripts/test.sh runs \
                 scripts/dev/containers-setup.sh, which installs Debian's docker.io \
                 (by hand: `eval \"$(scripts/dev/containers-setup.sh --env)\"`)",
            );
            return None;
        };
        remove_stale_run_dirs();
        let data_root = scratch("dockerd");
        let run_dir = PathBuf::from(format!("/tmp/{}", unique("dockerd")));
        let _ = std::fs::remove_dir_all(&run_dir);
        std::fs::create_dir_all(run_dir.join("config")).unwrap();
        // The daemon's configuration is the flags alone, not the machine's
        // /etc/docker/daemon.json.
        let config = write(&run_dir.join("daemon.json"), "{}\n");
        let sock = run_dir.join("docker.sock");
        let host = format!("unix://{}", sock.display());
        let log = run_dir.join("dockerd.log");
        let mut keeper = Command::new("sh")
            .arg("-c")
            .arg(KEEPER)
            .arg("sh")
            .arg(&log)
            .arg(&dockerd)
            .arg(format!("--config-file={}", config.display()))
            .args(["--iptables=false", "--bridge=none", "--shutdown-timeout=10"])
            .arg(format!("--data-root={}", data_root.display()))
            .arg(format!("--exec-root={}", run_dir.join("exec").display()))
            .arg(format!(
                "--pidfile={}",
                run_dir.join("dockerd.pid").display()
            ))
            .arg(format!("--host={host}"))
            .stdin(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start sh for dockerd: {e}"));
        let mut d = Docker {
            docker: docker.into(),
            host,
            run_dir,
            data_root,
            keeper: None,
            base: String::new(),
            example: OnceLock::new(),
        };
        // Up within 60 s (a harness limit, not a timing assertion) or its log says why.
        let start = Instant::now();
        loop {
            if let Some(status) = keeper.try_wait().unwrap() {
                panic!(
                    "{} ended ({status}) before it answered; its log:\n{}",
                    Path::new(&dockerd).display(),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if run(d.cmd().args(["version", "--format", "{{.Server.Version}}"]))
                .status
                .success()
            {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                d.keeper = Some(keeper);
                panic!(
                    "dockerd did not answer on {} within 60 s; its log:\n{}",
                    d.host,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        d.keeper = Some(keeper);
        d.base = "gpucap-test-base:imported".into();
        let o = run(d.cmd().arg("import").arg(&tar).arg(&d.base));
        assert_ok(&o);
        Some(d)
    }

    /// The docker client, talking to this daemon, with a configuration of its own.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(&self.docker);
        c.env("DOCKER_HOST", &self.host)
            .env("DOCKER_CONFIG", self.run_dir.join("config"))
            .env("DOCKER_BUILDKIT", "0");
        c
    }

    /// dockerd's pid, from its pid file.
    pub fn daemon_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.run_dir.join("dockerd.pid")).ok()?;
        text.trim().parse().ok()
    }

    /// The pid of the containerd dockerd started for itself.
    pub fn containerd_pid(&self) -> Option<u32> {
        let file = self.run_dir.join("exec/containerd/containerd.pid");
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    /// scripts/Dockerfile.example built FROM the base image (both stages' build
    /// arguments), once per daemon: its tag.
    pub fn example(&self) -> String {
        let built = self.example.get_or_init(|| {
            let dir = host_dir("docker-example");
            let (build_ctx, ctx) = example_contexts(&dir, &self.base);
            let build_image = "gpucap-test-build:stand-in";
            let python_image = "gpucap-test-python:host";
            let image = "gpucap-test-example:built";
            let o = run(self
                .cmd()
                .args(["build", "--network=none", "-q", "-t", build_image])
                .arg(&build_ctx));
            if !o.status.success() {
                return Err(format!("the build image did not build\n{}", dump(&o)));
            }
            // The application's image the runtime stage is built on: the base with
            // Python (the stage installs it only where the base has none).
            let o = run(self
                .cmd()
                .args(["build", "--network=none", "-q", "-t", python_image])
                .arg(python_base_context(&dir, &self.base)));
            if !o.status.success() {
                return Err(format!("the Python base did not build\n{}", dump(&o)));
            }
            let o = run(self
                .cmd()
                .args(["build", "--network=none", "-q", "-t", image])
                .arg(format!("--build-arg=BUILD_IMAGE={build_image}"))
                .arg(format!("--build-arg=BASE_IMAGE={python_image}"))
                .arg("-f")
                .arg(root().join("scripts/Dockerfile.example"))
                .arg(&ctx));
            if !o.status.success() {
                return Err(format!(
                    "scripts/Dockerfile.example did not build\n{}",
                    dump(&o)
                ));
            }
            Ok(image.to_string())
        });
        built.clone().unwrap_or_else(|e| panic!("{e}"))
    }

    /// A container of the example image, capped at 1 GiB through its entrypoint.
    pub fn capped(&self, tag: &str) -> Container {
        let mut c = Container::new(tag);
        c.image = Some(self.example());
        c.env("GPUCAP_LIMIT", "1Gi");
        c
    }

    /// Runs `holder` (its command makes `/sync/held` once it holds its memory, then waits
    /// for `/sync/done`, with `sync` mounted there) and, while it holds, `during(self)`;
    /// then lets the holder go. Returns the holder's output and `during`'s.
    pub fn while_holding<T>(
        &self,
        holder: &Container,
        sync: &Path,
        during: impl FnOnce(&Docker) -> T,
    ) -> (Output, T) {
        let mut child = self.spawn(holder);
        wait_for(&sync.join("held"), &mut child, "the holding container");
        let t = during(self);
        std::fs::write(sync.join("done"), "").unwrap();
        (child.wait_with_output().unwrap(), t)
    }
}

impl Drop for Docker {
    /// Stops dockerd (its containers and its containerd with it): the keeper's standard
    /// input closes, its reader sends SIGTERM, the keeper ends with dockerd. Killed where
    /// it is not gone within 60 s; then the daemon's directories are removed.
    fn drop(&mut self) {
        let (dockerd, containerd) = (self.daemon_pid(), self.containerd_pid());
        if let Some(mut keeper) = self.keeper.take() {
            drop(keeper.stdin.take());
            let start = Instant::now();
            while keeper.try_wait().ok().flatten().is_none() {
                if start.elapsed() > Duration::from_secs(60) {
                    eprintln!("dockerd did not stop within 60 s: killing it");
                    for pid in [dockerd, containerd].into_iter().flatten() {
                        let _ = Command::new("kill")
                            .args(["-KILL", &pid.to_string()])
                            .status();
                    }
                    let _ = keeper.kill();
                    let _ = keeper.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
        let _ = std::fs::remove_dir_all(&self.data_root);
    }
}

/// Removes the /tmp directories of daemons whose test process is gone (killed before its
/// `Drop` ran: the keeper stopped dockerd, nothing removed the directory).
fn remove_stale_run_dirs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix("gpucap-test-dockerd-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !alive(p)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` still runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next())
            != Some("Z")
    })
}

/// A host directory for `/sync`, which containers of any user may write in.
fn sync_dir(tag: &str) -> PathBuf {
    let dir = host_dir(tag);
    let sync = dir.join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    set_mode(&sync, 0o1777);
    sync
}

/// The example image's entrypoint caps the container's command: of two 600 MiB under
/// 1 GiB the second is refused, and the program sees a 1 GiB GPU; a misspelt `GPUCAP_*`
/// variable stops the container before the program starts. The negative control:
/// the same command with the entrypoint bypassed and the image's LD_PRELOAD emptied is
/// not capped.
#[test]
pub fn docker_runs_the_example_image_capped_through_its_entrypoint() {
    let Some(d) = docker() else { return };
    assert_600_600(
        &run_600_600_in(&d, &mut d.capped("docker-cap")),
        CAPPED,
        GIB,
    );
    // A misspelt variable stops the container (status 2) before the program starts.
    let mut typo = d.capped("docker-typo");
    typo.env("GPUCAP_LIMT", "1Gi");
    let o = run_600_600_in(&d, &mut typo);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("GPUCAP_LIMT"), "{}", dump(&o));
    assert_eq!(stdout(&o), "", "the program ran\n{}", dump(&o));
    let mut bare = d.capped("docker-bare");
    bare.option("--entrypoint=").env("LD_PRELOAD", "");
    assert_600_600(&run_600_600_in(&d, &mut bare), UNCAPPED, 4 * GIB);
}

/// What docs/src/container.md runs: `docker run … -e GPUCAP_LIMIT=… my-app-capped python
/// train.py` (the example image, Python from its base): the program `train.py` runs is
/// capped through the entrypoint, as `python` itself.
#[test]
pub fn docker_runs_python_train_py_as_the_page_shows() {
    let Some(d) = docker() else { return };
    let mut c = d.capped("docker-python");
    train_py(&mut c, &host_dir("docker-python"));
    assert_600_600(&d.run(&c), CAPPED, GIB);
}

/// cudarc-client `600 600` in `c`, under Docker.
fn run_600_600_in(d: &Docker, c: &mut Container) -> Output {
    c.command(&[&format!("{BIN}/cudarc-client"), "600", "600"]);
    d.run(c)
}

/// `docker exec` into a running container: the process joins the container's pool (the
/// 1 GiB is shared with the container's command, which holds 600 MiB), with no other
/// set-up than the image's; `gpucap status` run the same way shows the pool.
#[test]
pub fn docker_exec_joins_the_containers_pool() {
    let Some(d) = docker() else { return };
    let sync = sync_dir("docker-exec");
    let mut holder = d.capped("docker-exec");
    holder.mount(&sync, "/sync").shell(&format!(
        "echo pool $GPUCAP_POOL; exec {BIN}/script {}",
        HOLD_600.join(" ")
    ));
    let (held, (exec, status)) = d.while_holding(&holder, &sync, |d| {
        let exec = run(d
            .cmd()
            .args(["exec", &holder.name, &format!("{BIN}/script")])
            .args(ASK));
        let status = run(d.cmd().args(["exec", &holder.name, "gpucap", "status"]));
        (exec, status)
    });
    assert_ok(&held);
    assert_eq!(script_allocs(&held), [(MIB600, 0)], "{}", dump(&held));
    assert_ok(&exec);
    assert_eq!(
        script_allocs(&exec),
        SHARED,
        "the exec'd process does not share the container's 1 GiB\n{}",
        dump(&exec)
    );
    let pool = stdout(&held)
        .lines()
        .find_map(|l| l.strip_prefix("pool ").map(String::from))
        .unwrap_or_else(|| panic!("no pool line\n{}", dump(&held)));
    assert_ok(&status);
    // The container's pool is its directory's, every user's (gpucap-container-N).
    let shown = match pool.as_str() {
        "container-mntns" => "/dev/shm/gpucap-container-".to_string(),
        p => p.to_string(),
    };
    assert!(
        stdout(&status).contains(&shown),
        "{pool}\n{}",
        dump(&status)
    );
}

/// `docker stop` delivers SIGTERM to the program, PID 1 behind the entrypoint: it sees
/// it and exits 0 (without it, the SIGKILL after the grace period: 137).
#[test]
pub fn docker_stop_delivers_sigterm_to_the_program() {
    let Some(d) = docker() else { return };
    let sync = sync_dir("docker-stop");
    let mut c = d.capped("docker-stop");
    c.mount(&sync, "/sync").shell(&format!(
        "trap 'echo got SIGTERM; exit 0' TERM; echo pid $$; {BIN}/script alloc:600Mi; \
         touch /sync/held; while :; do sleep 0.1; done"
    ));
    let mut child = d.spawn(&c);
    wait_for(&sync.join("held"), &mut child, "the container");
    let o = run(d.cmd().args(["stop", "--time=30", &c.name]));
    assert_ok(&o);
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let out = stdout(&o);
    assert!(out.lines().any(|l| l == "pid 1"), "{}", dump(&o));
    assert!(out.lines().any(|l| l == "got SIGTERM"), "{}", dump(&o));
}

/// `--user 1000:1000`: the entrypoint cannot write gpucap.env beside the library, warns,
/// and caps the program.
#[test]
pub fn docker_caps_a_non_root_user() {
    let Some(d) = docker() else { return };
    let mut c = d.capped("docker-user");
    c.option("--user=1000:1000")
        .shell(&format!("id -u; exec {BIN}/cudarc-client 600 600"));
    let o = d.run(&c);
    assert_600_600(&o, CAPPED, GIB);
    assert!(stdout(&o).lines().any(|l| l == "1000"), "{}", dump(&o));
}

/// Two containers with `--ipc=host` (one /dev/shm, the host's) keep apart: each has its
/// own default pool. Two that name one pool share it.
#[test]
pub fn docker_ipc_host_containers_keep_their_own_pools_unless_they_name_one() {
    let Some(d) = docker() else { return };
    let sync = sync_dir("docker-ipc");
    let shared = unique("ipc");
    // Their pool files are in the host's /dev/shm: removed at the end, passed or failed.
    let mut pools = RemoveOnDrop(Vec::new());
    for (tag, pool) in [
        ("docker-ipc-own", None),
        ("docker-ipc-shared", Some(&shared)),
    ] {
        let _ = std::fs::remove_file(sync.join("held"));
        let _ = std::fs::remove_file(sync.join("done"));
        let container = |name: &str, steps: &[&str]| {
            let mut c = d.capped(name);
            c.option("--ipc=host").mount(&sync, "/sync").shell(&format!(
                "echo pool $GPUCAP_POOL $(readlink /proc/self/ns/mnt | tr -cd 0-9); \
                 exec {BIN}/script {}",
                steps.join(" ")
            ));
            if let Some(p) = pool {
                c.env("GPUCAP_POOL", p);
            }
            c
        };
        let holder = container(tag, HOLD_600);
        let (held, other) = d.while_holding(&holder, &sync, |d| d.run(&container(tag, ASK)));
        for o in [&held, &other] {
            pools.0.extend(
                stdout(o)
                    .lines()
                    .filter_map(|l| l.strip_prefix("pool ")?.split_once(' '))
                    .map(|(p, ns)| match p {
                        // The container's pool: a directory of the container's users.
                        "container-mntns" => {
                            PathBuf::from(format!("/dev/shm/gpucap-container-{ns}"))
                        }
                        p => PathBuf::from(format!("/dev/shm/gpucap-0/{p}.pool")),
                    }),
            );
        }
        assert_ok(&held);
        assert_eq!(script_allocs(&held), [(MIB600, 0)], "{}", dump(&held));
        let expected = if pool.is_some() { SHARED } else { OWN };
        assert_eq!(
            script_allocs(&other),
            expected,
            "pool {pool:?}\n{}",
            dump(&other)
        );
    }
}

/// A container killed by `docker kill` (SIGKILL) while it holds 800 MiB of a pool on a
/// shared volume: its bytes come back to the other containers.
#[test]
pub fn docker_kill_gives_a_containers_bytes_back() {
    let Some(d) = docker() else { return };
    let sync = sync_dir("docker-kill");
    let pools = sync.parent().unwrap().join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let container = |name: &str, steps: &[&str]| {
        let mut c = d.capped(name);
        c.mount(&pools, "/pools")
            .mount(&sync, "/sync")
            .env("GPUCAP_POOL", "shared")
            .env("GPUCAP_POOL_DIR", "/pools")
            .script(steps);
        c
    };
    killed_container_gives_its_bytes_back(&*d, &sync, "docker-", container);
}

/// A daemon of its own, with a container running, stopped: dockerd, its containerd and
/// the container's process are gone, and so is the socket.
#[test]
pub fn docker_leaves_nothing_running_when_its_daemon_is_dropped() {
    let Some(d) = Docker::start() else { return };
    let mut c = Container::new("docker-left");
    c.option("--detach").command(&["sleep", "600"]);
    let o = d.run(&c);
    assert_ok(&o);
    let o = run(d
        .cmd()
        .args(["inspect", "--format={{.State.Pid}}", &c.name]));
    assert_ok(&o);
    let container: u32 = stdout(&o).trim().parse().unwrap();
    let pids = [
        ("dockerd", d.daemon_pid().expect("dockerd's pid file")),
        (
            "containerd",
            d.containerd_pid().expect("containerd's pid file"),
        ),
        ("the container's sleep", container),
    ];
    for (what, pid) in pids {
        assert!(alive(pid), "{what} ({pid}) is not running");
    }
    let sock = d.host.trim_start_matches("unix://").to_string();
    drop(d);
    for (what, pid) in pids {
        assert!(
            !alive(pid),
            "{what} ({pid}) still runs after the daemon was stopped"
        );
    }
    assert!(!Path::new(&sock).exists(), "{sock} is left");
}

/// Files removed when it is dropped.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f).or_else(|_| std::fs::remove_dir_all(f));
        }
    }
}

impl Engine for Docker {
    fn cli(&self) -> Command {
        self.cmd()
    }

    fn base_image(&self) -> &str {
        &self.base
    }
}
