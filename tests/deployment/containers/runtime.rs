//! The container runtime: podman as scripts/dev/containers-setup.sh prepared it, one
//! `podman run` as a value, and the helpers every test uses.

use super::*;

/// Where the toolkit mounts the driver's libraries in a container.
pub const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
/// Where the test programs are mounted in a container.
pub const BIN: &str = "/opt/gpucap-test";
/// The fake GPU 0's UUID, as nvidia-smi prints it.
pub const GPU0: &str = "GPU-face0000-0000-0000-0000-000000000000";
/// 600 MiB in bytes, as the script prints an allocation.
pub const MIB600: u64 = 600 * MIB;

/// podman, configured by scripts/dev/containers-setup.sh.
pub struct Runtime {
    pub podman: PathBuf,
    pub conf: PathBuf,
    pub storage: PathBuf,
    pub image: String,
}

/// The runtime, or None (after SKIP) where none is prepared and none is required.
pub fn runtime() -> Option<Runtime> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let (Some(podman), Some(conf), Some(storage), Some(image)) = (
        var("GPUCAP_TEST_PODMAN"),
        var("GPUCAP_TEST_CONTAINERS_CONF"),
        var("GPUCAP_TEST_CONTAINERS_STORAGE_CONF"),
        var("GPUCAP_TEST_CONTAINER_IMAGE"),
    ) else {
        skip(
            "no container runtime prepared (GPUCAP_TEST_PODMAN & co. unset): scripts/test.sh \
             runs scripts/dev/containers-setup.sh, which installs podman and makes the base image \
             (by hand: `eval \"$(scripts/dev/containers-setup.sh --env)\"`)",
        );
        return None;
    };
    Some(Runtime {
        podman: podman.into(),
        conf: conf.into(),
        storage: storage.into(),
        image: image.into_string().unwrap(),
    })
}

/// A name no other container of this run has.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "gpucap-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One `podman run`: mounts, environment, podman options and the command.
pub struct Container {
    pub name: String,
    /// Another image than the runtime's base image.
    pub image: Option<String>,
    pub options: Vec<String>,
    pub env: Vec<(String, String)>,
    pub command: Vec<String>,
    /// A CDI spec directory of the test's own, seen by the engine as /run/cdi.
    pub cdi_specs: Option<PathBuf>,
}

impl Container {
    /// A container of the base image with the fake GPU where the toolkit mounts the
    /// driver (a 4 GiB GPU), and the test programs (cudarc-client, script, nvml, gpucap)
    /// in [`BIN`]. Nothing of gpucap is in it yet.
    pub fn new(tag: &str) -> Container {
        let mut c = Container {
            name: unique(tag),
            image: None,
            options: Vec::new(),
            env: Vec::new(),
            command: Vec::new(),
            cdi_specs: None,
        };
        let fake = profile_dir().join("libcuda.so");
        c.mount_ro(&fake, &format!("{LIBDIR}/libcuda.so.1"))
            .mount_ro(&fake, &format!("{LIBDIR}/libcuda.so"))
            .mount_ro(&fake_nvml(), &format!("{LIBDIR}/libnvidia-ml.so.1"))
            .mount_ro(&cudarc_client(), &format!("{BIN}/cudarc-client"))
            .mount_ro(&script(), &format!("{BIN}/script"))
            .mount_ro(&nvml_client(), &format!("{BIN}/nvml"))
            .mount_ro(&cli(), &format!("{BIN}/gpucap"))
            .env("FAKECUDA_TOTAL_MEM", "4Gi");
        c
    }

    pub fn mount_ro(&mut self, host: &Path, at: &str) -> &mut Self {
        self.options
            .push(format!("--volume={}:{at}:ro", host.display()));
        self
    }

    pub fn mount(&mut self, host: &Path, at: &str) -> &mut Self {
        self.options
            .push(format!("--volume={}:{at}", host.display()));
        self
    }

    pub fn env(&mut self, k: &str, v: &str) -> &mut Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn option(&mut self, o: &str) -> &mut Self {
        self.options.push(o.into());
        self
    }

    pub fn command(&mut self, words: &[&str]) -> &mut Self {
        self.command = words.iter().map(|w| w.to_string()).collect();
        self
    }

    /// tests/c/script.c with `steps`.
    pub fn script(&mut self, steps: &[&str]) -> &mut Self {
        self.command = std::iter::once(format!("{BIN}/script"))
            .chain(steps.iter().map(|s| s.to_string()))
            .collect();
        self
    }

    /// `sh -c SCRIPT` in the container.
    pub fn shell(&mut self, script: &str) -> &mut Self {
        self.command(&["sh", "-c", script])
    }
}

impl Runtime {
    pub fn podman(&self) -> Command {
        let mut c = Command::new(&self.podman);
        c.env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage);
        c
    }
}

impl Engine for Runtime {
    fn cli(&self) -> Command {
        self.podman()
    }

    fn base_image(&self) -> &str {
        &self.image
    }
}

/// A container engine: podman and Docker take the same `run`, `kill` options.
pub trait Engine {
    /// The engine's command, configured for the tests.
    fn cli(&self) -> Command;

    /// The image a container runs when it names none.
    fn base_image(&self) -> &str;

    /// `run` of `c`, removed when it ends, no pull, no network.
    fn run_command(&self, c: &Container) -> Command {
        let mut cmd = self.cli();
        cmd.args(["run", "--rm", "--pull=never", "--network=none", "--name"])
            .arg(&c.name)
            .args(&c.options);
        for (k, v) in &c.env {
            cmd.arg(format!("--env={k}={v}"));
        }
        cmd.arg(c.image.as_deref().unwrap_or(self.base_image()))
            .args(&c.command);
        match &c.cdi_specs {
            Some(dir) => with_cdi_specs(&cmd, dir),
            None => cmd,
        }
    }

    /// Runs the container to its end.
    fn run(&self, c: &Container) -> Output {
        run(&mut self.run_command(c))
    }

    /// Starts the container; it runs until its command ends or it is killed.
    fn spawn(&self, c: &Container) -> Child {
        self.run_command(c)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// `cmd` run in a mount namespace of its own in which `dir` is mounted over /run/cdi,
/// the spec directory podman reads (an empty mount point is made if the system has none).
fn with_cdi_specs(cmd: &Command, dir: &Path) -> Command {
    let mut w = Command::new("unshare");
    w.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mkdir -p /run/cdi && mount --bind "$0" /run/cdi && exec "$@""#)
        .arg(dir)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => w.env(k, v),
            None => w.env_remove(k),
        };
    }
    w
}

/// A container killed by the engine (`kill`: SIGKILL) while it holds 800 MiB of a pool:
/// its bytes come back to the other containers. `container(name, steps)` is a container
/// of that pool with `sync` mounted at /sync.
pub fn killed_container_gives_its_bytes_back(
    engine: &dyn Engine,
    sync: &Path,
    prefix: &str,
    container: impl Fn(&str, &[&str]) -> Container,
) {
    let victim = container(
        &format!("{prefix}victim"),
        &["alloc:800Mi", "touch:/sync/held", "wait:/sync/never"],
    );
    let mut held = engine.spawn(&victim);
    wait_for(&sync.join("held"), &mut held, "the holding container");
    let before = engine.run(&container(&format!("{prefix}before"), &["alloc:600Mi"]));
    let o = run(engine.cli().args(["kill", &victim.name]));
    assert_ok(&o);
    let killed = held.wait_with_output().unwrap();
    assert_eq!(
        killed.status.code(),
        Some(137),
        "killed by SIGKILL\n{}",
        dump(&killed)
    );
    let after = engine.run(&container(&format!("{prefix}after"), &["alloc:600Mi"]));
    assert_eq!(
        script_allocs(&before),
        [(MIB600, 2)],
        "the pool is shared\n{}",
        dump(&before)
    );
    assert_eq!(
        script_allocs(&after),
        [(MIB600, 0)],
        "the killed container's 800 MiB did not come back\n{}",
        dump(&after)
    );
}

/// tests/c/nvml.c, built against the fake NVML and libcuda.
pub fn nvml_client() -> PathBuf {
    compile_c("nvml", "", &["-lnvidia-ml", "-lcuda"])
}

/// Waits (60 s at most: a harness limit, not a timing assertion) until `file` exists,
/// failing with the container's output if it ended first.
pub fn wait_for(file: &Path, child: &mut Child, what: &str) {
    let start = Instant::now();
    while !file.exists() {
        if child.try_wait().unwrap().is_some() {
            let o = std::mem::replace(child, Command::new("true").spawn().unwrap());
            panic!(
                "{what} ended before {}\n{}",
                file.display(),
                dump(&o.wait_with_output().unwrap())
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} never appeared ({what})",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The holder's steps: 600 MiB, held until the others have run.
pub const HOLD_600: &[&str] = &["alloc:600Mi", "touch:/sync/held", "wait:/sync/done"];

/// What the second and the third container ask for while the first holds 600 MiB: 600
/// MiB (beyond a shared 1 GiB), then 400 MiB (within it: the container shares the
/// budget, it is not refused wholesale).
pub const ASK: &[&str] = &["alloc:600Mi", "alloc:400Mi"];

/// Three containers of `make(name, group, steps)`, `sync` mounted at /sync in each: the
/// first of group `same` holds 600 MiB ([`HOLD_600`]) while a second of `same` and one of
/// `other` (started together) ask for [`ASK`]; then the first lets go. Checks that the
/// first got them, and returns what the second and the third printed.
pub fn while_holding(
    rt: &Runtime,
    sync: &Path,
    make: impl Fn(&str, &str, &[&str]) -> Container,
    same: &str,
    other: &str,
) -> (Output, Output) {
    let mut child = rt.spawn(&make("holder", same, HOLD_600));
    wait_for(&sync.join("held"), &mut child, "the holding container");
    let second = rt.spawn(&make("second", same, ASK));
    let third = rt.spawn(&make("third", other, ASK));
    let [second, third] = [second, third].map(|c| c.wait_with_output().unwrap());
    std::fs::write(sync.join("done"), "").unwrap();
    let held = child.wait_with_output().unwrap();
    assert_ok(&held);
    assert_eq!(script_allocs(&held), [(MIB600, 0)], "{}", dump(&held));
    (second, third)
}

/// 400 MiB in bytes, as the script prints an allocation.
pub const MIB400: u64 = 400 * MIB;

/// What a container of the holder's group gets under a shared 1 GiB: 600 MiB refused
/// (out of memory), 400 MiB granted.
pub const SHARED: [(u64, i32); 2] = [(MIB600, 2), (MIB400, 0)];
/// What a container of another budget gets: both.
pub const OWN: [(u64, i32); 2] = [(MIB600, 0), (MIB400, 0)];

/// The script's `alloc` lines: (bytes, rc).
pub fn script_allocs(o: &Output) -> Vec<(u64, i32)> {
    stdout(o)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["alloc", size, rc] => Some((size.parse().ok()?, rc.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

/// A scratch directory on the host the containers may use as their volumes.
pub fn host_dir(tag: &str) -> PathBuf {
    let d = scratch(tag);
    set_mode(&d, 0o755);
    d
}

pub fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub fn write(p: &Path, text: &str) -> PathBuf {
    std::fs::write(p, text).unwrap();
    p.to_path_buf()
}

/// Checks that `o` ran cudarc-client `600 600` with these outcomes and this total memory.
pub fn assert_600_600(o: &Output, outcomes: [&str; 2], total: u64) {
    assert_ok(o);
    let r = ClientReport::parse(&stdout(o));
    assert_eq!(r.outcomes(), outcomes, "{}", dump(o));
    assert_eq!(r.total_mem, Some(total), "{}", dump(o));
}

pub const CAPPED: [&str; 2] = ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"];
pub const UNCAPPED: [&str; 2] = ["600 ok", "600 ok"];

/// cudarc-client `600 600` in `c`.
pub fn run_600_600(rt: &Runtime, c: &mut Container) -> Output {
    c.command(&[&format!("{BIN}/cudarc-client"), "600", "600"]);
    rt.run(c)
}

/// The same container without gpucap's library: nothing caps it (the negative control
/// that shows the assertions above can fail).
pub fn assert_uncapped(rt: &Runtime, c: &mut Container) {
    assert_600_600(&run_600_600(rt, c), UNCAPPED, 4 * GIB);
}
