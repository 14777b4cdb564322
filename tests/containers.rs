//! gpucap in a real container runtime: podman (runc), a plain Debian image with no gpucap
//! in it, and the fake GPU bind-mounted where NVIDIA's container toolkit mounts
//! the real driver (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`, `libnvidia-ml.so.1`).
//!
//! - Each Kubernetes GPU driver's hand-over (docs/src/kubernetes.md), with exactly the
//!   variables and mounts that driver gives a container, and gpucap's library where the
//!   driver puts its own (HAMi, vgpu-manager) or injected by gpucap's CDI spec (the DRA
//!   example driver, NVIDIA's toolkit): the program is capped at the granted amount.
//! - One budget per claim: two containers of one claim and one of another, on one GPU.
//! - `gpucap cdi generate`: podman's own CDI support (`--device gpucap.io/gpu=NAME`, the
//!   spec in /var/run/cdi) caps a container with no entrypoint; one without the device is
//!   untouched.
//! - scripts/Dockerfile.example builds (FROM the test's base image) and runs.
//! - Files and limits: a pool directory on a volume shared by containers of two users, a
//!   read-only root file system with a non-root user, and a container killed by the
//!   runtime while it holds memory (its bytes come back to the others).
//!
//! The runtime comes from scripts/containers-setup.sh (scripts/test.sh runs it and exports
//! its variables: GPUCAP_TEST_PODMAN, GPUCAP_TEST_CONTAINERS_CONF,
//! GPUCAP_TEST_CONTAINERS_STORAGE_CONF, GPUCAP_TEST_CONTAINER_IMAGE). Without them the
//! tests print `SKIP: ...` and pass, unless `CI` or `GPUCAP_TEST_REQUIRE_CLIENTS=1` is set:
//! then they fail.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::pool_scratch::script;
use common::*;

/// Where the toolkit mounts the driver's libraries in a container.
const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
/// Where the test programs are mounted in a container.
const BIN: &str = "/opt/gpucap-test";
/// The fake GPU 0's UUID, as nvidia-smi prints it.
const GPU0: &str = "GPU-face0000-0000-0000-0000-000000000000";
/// 600 MiB in bytes, as the script prints an allocation.
const MIB600: u64 = 600 * MIB;

/// podman, configured by scripts/containers-setup.sh.
struct Runtime {
    podman: PathBuf,
    conf: PathBuf,
    storage: PathBuf,
    image: String,
}

/// The runtime, or None (after SKIP) where none is prepared and none is required.
fn runtime() -> Option<Runtime> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let (Some(podman), Some(conf), Some(storage), Some(image)) = (
        var("GPUCAP_TEST_PODMAN"),
        var("GPUCAP_TEST_CONTAINERS_CONF"),
        var("GPUCAP_TEST_CONTAINERS_STORAGE_CONF"),
        var("GPUCAP_TEST_CONTAINER_IMAGE"),
    ) else {
        assert!(
            !required_here(),
            "no container runtime prepared (GPUCAP_TEST_PODMAN & co. unset) but CI or \
             GPUCAP_TEST_REQUIRE_CLIENTS=1 is set: the container tests must run; scripts/test.sh \
             runs scripts/containers-setup.sh, which installs podman and makes the base image"
        );
        eprintln!(
            "SKIP: no container runtime (run `eval \"$(scripts/containers-setup.sh --env)\"` first)"
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
fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "gpucap-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One `podman run`: mounts, environment, podman options and the command.
struct Container {
    name: String,
    /// Another image than the runtime's base image.
    image: Option<String>,
    options: Vec<String>,
    env: Vec<(String, String)>,
    command: Vec<String>,
}

impl Container {
    /// A container of the base image with the fake GPU where the toolkit mounts the
    /// driver (a 4 GiB GPU), and the test programs (cudarc-client, script, nvml, gpucap)
    /// in [`BIN`]. Nothing of gpucap is in it yet.
    fn new(tag: &str) -> Container {
        let mut c = Container {
            name: unique(tag),
            image: None,
            options: Vec::new(),
            env: Vec::new(),
            command: Vec::new(),
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

    fn mount_ro(&mut self, host: &Path, at: &str) -> &mut Self {
        self.options
            .push(format!("--volume={}:{at}:ro", host.display()));
        self
    }

    fn mount(&mut self, host: &Path, at: &str) -> &mut Self {
        self.options
            .push(format!("--volume={}:{at}", host.display()));
        self
    }

    fn env(&mut self, k: &str, v: &str) -> &mut Self {
        self.env.push((k.into(), v.into()));
        self
    }

    fn option(&mut self, o: &str) -> &mut Self {
        self.options.push(o.into());
        self
    }

    fn command(&mut self, words: &[&str]) -> &mut Self {
        self.command = words.iter().map(|w| w.to_string()).collect();
        self
    }

    /// tests/c/script.c with `steps`.
    fn script(&mut self, steps: &[&str]) -> &mut Self {
        self.command = std::iter::once(format!("{BIN}/script"))
            .chain(steps.iter().map(|s| s.to_string()))
            .collect();
        self
    }

    /// `sh -c SCRIPT` in the container.
    fn shell(&mut self, script: &str) -> &mut Self {
        self.command(&["sh", "-c", script])
    }
}

impl Runtime {
    fn podman(&self) -> Command {
        let mut c = Command::new(&self.podman);
        c.env("CONTAINERS_CONF", &self.conf)
            .env("CONTAINERS_STORAGE_CONF", &self.storage);
        c
    }

    fn run_command(&self, c: &Container) -> Command {
        let mut cmd = self.podman();
        cmd.args(["run", "--rm", "--pull=never", "--network=none", "--name"])
            .arg(&c.name)
            .args(&c.options);
        for (k, v) in &c.env {
            cmd.arg(format!("--env={k}={v}"));
        }
        cmd.arg(c.image.as_deref().unwrap_or(&self.image))
            .args(&c.command);
        cmd
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

/// tests/c/nvml.c, built against the fake NVML and libcuda.
fn nvml_client() -> PathBuf {
    compile_c("nvml", "", &["-lnvidia-ml", "-lcuda"])
}

/// Waits (60 s at most: a harness limit, not a timing assertion) until `file` exists,
/// failing with the container's output if it ended first.
fn wait_for(file: &Path, child: &mut Child, what: &str) {
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
const HOLD_600: &[&str] = &["alloc:600Mi", "touch:/sync/held", "wait:/sync/done"];

/// Three containers of `make(name, group, steps)`, `sync` mounted at /sync in each: the
/// first of group `same` holds 600 MiB ([`HOLD_600`]) while a second of `same`, then one of
/// `other`, ask for 600 MiB; then the first lets go. Checks that the first got them, and
/// returns what the second and the third printed.
fn while_holding(
    rt: &Runtime,
    sync: &Path,
    make: impl Fn(&str, &str, &[&str]) -> Container,
    same: &str,
    other: &str,
) -> (Output, Output) {
    let mut child = rt.spawn(&make("holder", same, HOLD_600));
    wait_for(&sync.join("held"), &mut child, "the holding container");
    let second = rt.run(&make("second", same, &["alloc:600Mi"]));
    let third = rt.run(&make("third", other, &["alloc:600Mi"]));
    std::fs::write(sync.join("done"), "").unwrap();
    let held = child.wait_with_output().unwrap();
    assert_ok(&held);
    assert_eq!(script_allocs(&held), [(MIB600, 0)], "{}", dump(&held));
    (second, third)
}

/// The script's `alloc` lines: (bytes, rc).
fn script_allocs(o: &Output) -> Vec<(u64, i32)> {
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
fn host_dir(tag: &str) -> PathBuf {
    let d = scratch(tag);
    set_mode(&d, 0o755);
    d
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write(p: &Path, text: &str) -> PathBuf {
    std::fs::write(p, text).unwrap();
    p.to_path_buf()
}

// ---------------------------------------------------------------------------------------
// The drivers' hand-overs.

/// HAMi's DRA kubelet plugin (`hami-core-gpu.project-hami.io`): gpucap's library where
/// HAMi's goes, the claim's directory, and the variables of a claim of `mib` MiB.
fn hami_dra(c: &mut Container, dir: &Path, claim: &str, mib: u64) {
    let claims = dir.join("claims").join(claim);
    std::fs::create_dir_all(&claims).unwrap();
    let vgpulock = dir.join("vgpulock");
    std::fs::create_dir_all(&vgpulock).unwrap();
    let preload = write(
        &dir.join("hami-ld.so.preload"),
        "/usr/local/vgpu/libvgpu.so\n",
    );
    c.mount_ro(&shim(), "/usr/local/vgpu/libvgpu.so")
        .mount_ro(&preload, "/etc/ld.so.preload")
        .mount(&claims, &format!("/usr/local/vgpu/claims/{claim}"))
        .mount(&vgpulock, "/tmp/vgpulock")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", &format!("{mib}m"))
        .env("CUDA_DEVICE_SM_LIMIT_0", "50")
        // A new file per container, as the plugin names it.
        .env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            &format!("/usr/local/vgpu/claims/{claim}/{}.cache", unique("cache")),
        );
}

/// vgpu-manager's DRA plugin (`manager.nvidia.com`, pkg/kubeletplugin/vgpu.go): its
/// library and ld.so.preload, the claim's partition directories, and exactly the
/// variables it sets (the common ones, several empty, and the device's, index 0).
fn vgpu_manager(c: &mut Container, dir: &Path, claim: &str, mib: u64) {
    let part = dir.join("vgpu-manager/claims").join(claim).join("default");
    for sub in ["config", "vgpu_lock", "vmem_node", "sm_node"] {
        std::fs::create_dir_all(part.join(sub)).unwrap();
    }
    let lib = "/etc/vgpu-manager/driver/libvgpu-control.so";
    let preload = write(&dir.join("vgpu-manager-ld.so.preload"), &format!("{lib}\n"));
    c.mount_ro(&shim(), lib)
        .mount_ro(&preload, "/etc/ld.so.preload")
        .mount(&part.join("config"), "/etc/vgpu-manager/config")
        .mount(&part.join("vgpu_lock"), "/tmp/.vgpu_lock")
        .mount(&part.join("vmem_node"), "/tmp/.vmem_node")
        .mount(&part.join("sm_node"), "/tmp/.sm_node");
    for (k, v) in [
        ("LD_PRELOAD", lib),
        ("MANAGER_COMPATIBILITY_MODE", "1"),
        ("MANAGER_VISIBLE_DEVICES", ""),
        ("CUDA_MEM_RATIO", "1.00"),
        ("CUDA_CORE_LIMIT", ""),
        ("CUDA_CORE_SOFT_LIMIT", ""),
        ("CUDA_MEM_LIMIT", ""),
        ("CUDA_MEM_OVERSOLD", "FALSE"),
        ("VMEMORY_NODE_ENABLED", "TRUE"),
        ("CUDA_SM_SHARED_BUCKET", "TRUE"),
        ("MANAGER_VGPU_CLAIM_UID", ""),
        ("EXTERNAL_SM_WATCHER_ENABLED", "FALSE"),
        ("CUDA_MEM_RATIO_0", "1.00"),
        ("CUDA_MEM_OVERSOLD_0", "FALSE"),
        ("MANAGER_VISIBLE_DEVICE_0", GPU0),
        ("CUDA_CORE_LIMIT_0", "50"),
        ("CUDA_CORE_SOFT_LIMIT_0", "50"),
    ] {
        c.env(k, v);
    }
    c.env("CUDA_MEM_LIMIT_0", &format!("{mib}m"));
}

/// gpucap's library and ld.so.preload as `gpucap cdi generate` without `--limit` mounts
/// them (the library alone: the container's variables set the cap), for the drivers that
/// mount no library of their own.
fn gpucap_library(c: &mut Container, dir: &Path) {
    let preload = write(
        &dir.join("gpucap-ld.so.preload"),
        "/usr/local/lib/gpucap-cdi/libgpucap.so\n",
    );
    c.mount_ro(&shim(), "/usr/local/lib/gpucap-cdi/libgpucap.so")
        .mount_ro(&preload, "/etc/ld.so.preload");
}

/// `gpucap check` for a library mounted at `lib` (GPUCAP_LIB names it: the test's gpucap
/// is elsewhere).
fn check_with(lib: &str) -> String {
    format!("GPUCAP_LIB={lib} {BIN}/gpucap check")
}

/// What the CDI device mounts: its own gpucap beside the library. No GPUCAP_LIB, which
/// as a GPUCAP_* variable would make gpucap.env unread.
const CDI_CHECK: &str = "/usr/local/lib/gpucap-cdi/gpucap check";

/// Runs cudarc-client `600 600` (and NVML's view, and `check`, the command line of
/// `gpucap check`) in `c` and checks that the second allocation was refused under a 1 GiB
/// cap that cuMemGetInfo and NVML show; `says` is what `gpucap check` must name as the
/// cap's source.
fn assert_capped_at_1gib(rt: &Runtime, c: &mut Container, check: &str, says: &str) {
    c.shell(&format!(
        "{BIN}/cudarc-client 600 600 && echo --- && {BIN}/nvml list dl && echo --- && {check}"
    ));
    let o = rt.run(c);
    let out = stdout(&o);
    let parts: Vec<&str> = out.split("---\n").collect();
    assert!(o.status.success() && parts.len() == 3, "{}", dump(&o));
    let r = ClientReport::parse(parts[0]);
    assert_eq!(r.outcomes(), CAPPED, "{}", dump(&o));
    assert_eq!(r.total_mem, Some(GIB), "cuDeviceTotalMem\n{}", dump(&o));
    assert_eq!(
        r.mem_info.first().map(|m| m.1),
        Some(GIB),
        "cuMemGetInfo\n{}",
        dump(&o)
    );
    let nvml_total = parts[1]
        .lines()
        .find(|l| l.starts_with("dev 0 "))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("total=")))
        .and_then(|v| v.parse::<u64>().ok());
    assert_eq!(nvml_total, Some(GIB), "NVML's total\n{}", dump(&o));
    assert!(
        parts[2].contains(says),
        "gpucap check does not name {says:?}\n{}",
        dump(&o)
    );
}

/// Checks that `o` ran cudarc-client `600 600` with these outcomes and this total memory.
fn assert_600_600(o: &Output, outcomes: [&str; 2], total: u64) {
    assert_ok(o);
    let r = ClientReport::parse(&stdout(o));
    assert_eq!(r.outcomes(), outcomes, "{}", dump(o));
    assert_eq!(r.total_mem, Some(total), "{}", dump(o));
}

const CAPPED: [&str; 2] = ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"];
const UNCAPPED: [&str; 2] = ["600 ok", "600 ok"];

/// cudarc-client `600 600` in `c`.
fn run_600_600(rt: &Runtime, c: &mut Container) -> Output {
    c.command(&[&format!("{BIN}/cudarc-client"), "600", "600"]);
    rt.run(c)
}

/// The same container without gpucap's library: nothing caps it (the negative control
/// that shows the assertions above can fail).
fn assert_uncapped(rt: &Runtime, c: &mut Container) {
    assert_600_600(&run_600_600(rt, c), UNCAPPED, 4 * GIB);
}

#[test]
fn hami_dra_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-hami-dra");
    let mut c = Container::new("hami-dra");
    hami_dra(&mut c, &dir, "claim-a", 1024);
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/vgpu/libvgpu.so"),
        "CUDA_DEVICE_MEMORY_LIMIT_0",
    );
    // The control: the same variables, but HAMi's place holds no library.
    let mut bare = Container::new("hami-dra-bare");
    bare.env("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m");
    assert_uncapped(&rt, &mut bare);
}

#[test]
fn hami_classic_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-hami");
    let preload = write(&dir.join("ld.so.preload"), "/usr/local/vgpu/libvgpu.so\n");
    let mut c = Container::new("hami");
    c.mount_ro(&shim(), "/usr/local/vgpu/libvgpu.so")
        .mount_ro(&preload, "/etc/ld.so.preload")
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m")
        .env("CUDA_DEVICE_SM_LIMIT", "50")
        .env(
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            "/usr/local/vgpu/0b3f0a52-31c6-4a5e-9d0b-6c8e1f4d2a11.cache",
        );
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/vgpu/libvgpu.so"),
        "CUDA_DEVICE_MEMORY_LIMIT_0",
    );
}

#[test]
fn vgpu_manager_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-vgpu-manager");
    let mut c = Container::new("vgpu-manager");
    vgpu_manager(&mut c, &dir, "claim-a", 1024);
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/etc/vgpu-manager/driver/libvgpu-control.so"),
        "CUDA_MEM_LIMIT_0",
    );
}

#[test]
fn dra_example_driver_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-dra-example");
    let mut c = Container::new("dra-example");
    gpucap_library(&mut c, &dir);
    c.env("GPU_DEVICE_0", "gpu-0")
        .env("GPU_DEVICE_0_MEMORY", "1Gi");
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/lib/gpucap-cdi/libgpucap.so"),
        "GPU_DEVICE_0_MEMORY",
    );
}

#[test]
fn nvidia_toolkit_handover_caps_a_plain_image() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-nvidia");
    let mut c = Container::new("nvidia");
    gpucap_library(&mut c, &dir);
    c.env("NVIDIA_VISIBLE_DEVICES", GPU0)
        .env("NVIDIA_GPU_MEMORY_LIMIT", "1024")
        .env("NVIDIA_GPU_MEMORY_REQUEST", "512");
    assert_capped_at_1gib(
        &rt,
        &mut c,
        &check_with("/usr/local/lib/gpucap-cdi/libgpucap.so"),
        "NVIDIA_GPU_MEMORY_LIMIT",
    );
}

// ---------------------------------------------------------------------------------------
// One budget per claim.

/// Two containers of claim A (1 GiB) and one of claim B (1 GiB), all on GPU 0: A's first
/// holds 600 MiB, so A's second is refused 600 MiB while B gets them. `driver` sets a
/// container up as a driver would for a claim.
fn one_budget_per_claim(tag: &str, driver: fn(&mut Container, &Path, &str, u64)) {
    let Some(rt) = runtime() else { return };
    let dir = host_dir(tag);
    let sync = dir.join("sync");
    std::fs::create_dir_all(&sync).unwrap();
    let container = |name: &str, claim: &str, steps: &[&str]| {
        let mut c = Container::new(name);
        driver(&mut c, &dir, claim, 1024);
        c.mount(&sync, "/sync").script(steps);
        c
    };
    let (a2, b) = &while_holding(&rt, &sync, container, "claim-a", "claim-b");
    assert_eq!(
        script_allocs(a2),
        [(MIB600, 2)],
        "claim A's second container was not refused: each container of a claim had its own \
         1 GiB\n{}",
        dump(a2)
    );
    assert_eq!(
        script_allocs(b),
        [(MIB600, 0)],
        "claim B's container\n{}",
        dump(b)
    );
}

#[test]
fn two_containers_of_one_hami_claim_share_its_budget() {
    one_budget_per_claim("ctr-claim-hami", hami_dra);
}

#[test]
fn two_containers_of_one_vgpu_manager_claim_share_its_budget() {
    one_budget_per_claim("ctr-claim-vgpu-manager", vgpu_manager);
}

// ---------------------------------------------------------------------------------------
// CDI.

/// A CDI spec in podman's spec directory, removed at the end of the test.
struct CdiSpec {
    file: PathBuf,
    device: String,
}

impl CdiSpec {
    fn generate(dir: &Path, extra: &[&str]) -> CdiSpec {
        let name = unique("cdi");
        let file = PathBuf::from(format!("/var/run/cdi/{name}.json"));
        let mut c = Command::new(cli());
        c.args(["cdi", "generate", "--name", &name, "--dir"])
            .arg(dir)
            .arg("--output")
            .arg(&file)
            .args(extra);
        let o = run(&mut c);
        assert_ok(&o);
        CdiSpec {
            file,
            device: format!("--device=gpucap.io/gpu={name}"),
        }
    }
}

impl Drop for CdiSpec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

#[test]
fn a_cdi_device_caps_a_container_and_no_other() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-cdi");
    let spec = CdiSpec::generate(&dir, &["--limit", "1Gi"]);
    let text = std::fs::read_to_string(&spec.file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["cdiVersion"], "0.3.0", "{text}");
    let mut c = Container::new("cdi");
    c.option(&spec.device);
    assert_capped_at_1gib(
        &rt,
        &mut c,
        CDI_CHECK,
        "configuration: from /usr/local/lib/gpucap-cdi/gpucap.env",
    );
    // A process that starts with an empty environment is capped too (ld.so.preload and
    // gpucap.env), and shares the container's pool: 600 MiB held by the first leave the
    // second 424 MiB.
    c.shell(&format!(
        "{BIN}/script alloc:600Mi touch:/tmp/held wait:/tmp/done & \
         while ! [ -e /tmp/held ]; do sleep 0.05; done; \
         env -i {BIN}/script alloc:600Mi; touch /tmp/done; wait"
    ));
    let o = rt.run(&c);
    assert_ok(&o);
    assert_eq!(
        script_allocs(&o),
        [(MIB600, 0), (MIB600, 2)],
        "{}",
        dump(&o)
    );
    // Without the device: untouched.
    let mut plain = Container::new("cdi-none");
    plain.shell(&format!(
        "test ! -e /etc/ld.so.preload && test ! -e /usr/local/lib/gpucap-cdi && \
         {BIN}/cudarc-client 600 600"
    ));
    assert_600_600(&rt.run(&plain), UNCAPPED, 4 * GIB);
}

/// Without `--limit`, the device injects the library alone: a DRA driver's variables
/// set the cap (here NVIDIA's toolkit's), and a container with no variable is counted,
/// not capped.
#[test]
fn a_library_only_cdi_device_takes_the_cap_from_the_containers_variables() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-cdi-lib");
    let spec = CdiSpec::generate(&dir, &[]);
    let mut c = Container::new("cdi-lib");
    c.option(&spec.device)
        .env("NVIDIA_VISIBLE_DEVICES", GPU0)
        .env("NVIDIA_GPU_MEMORY_LIMIT", "1024")
        .env("NVIDIA_GPU_MEMORY_REQUEST", "1024");
    assert_capped_at_1gib(&rt, &mut c, CDI_CHECK, "NVIDIA_GPU_MEMORY_LIMIT");
}

// ---------------------------------------------------------------------------------------
// scripts/Dockerfile.example.

/// The Dockerfile builds FROM the test's base image (its build arguments) and runs: the
/// entrypoint caps the container's command. The build stage's `cargo` is a stand-in
/// that checks it is asked for the shim and the CLI and finds them built (compiling them
/// again in the container would take minutes); everything else is the Dockerfile's own.
#[test]
fn the_example_dockerfile_builds_and_caps() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-dockerfile");
    let tag = unique("image");
    // The build image: the base image with the stand-in cargo.
    let build_ctx = dir.join("build-image");
    std::fs::create_dir_all(&build_ctx).unwrap();
    let cargo = write(
        &build_ctx.join("cargo"),
        "#!/bin/sh\n\
         [ \"$*\" = 'build --release --locked -p gpucap-shim -p gpucap' ] || { echo \"cargo: unexpected: $*\" >&2; exit 1; }\n\
         test -f target/release/libgpucap.so && test -x target/release/gpucap\n",
    );
    set_mode(&cargo, 0o755);
    write(
        &build_ctx.join("Containerfile"),
        &format!("FROM {}\nCOPY cargo /usr/local/bin/cargo\n", rt.image),
    );
    let build_image = format!("localhost/{tag}-build");
    let image = format!("localhost/{tag}");
    let o = run(rt
        .podman()
        .args([
            "build",
            "--pull=never",
            "--network=none",
            "-q",
            "-t",
            &build_image,
        ])
        .arg(&build_ctx));
    assert_ok(&o);
    // The build context: what `COPY . .` needs, with the shim and the CLI already built.
    let ctx = dir.join("context");
    std::fs::create_dir_all(ctx.join("scripts")).unwrap();
    std::fs::create_dir_all(ctx.join("target/release")).unwrap();
    std::fs::copy(
        root().join("scripts/docker-entrypoint.sh"),
        ctx.join("scripts/docker-entrypoint.sh"),
    )
    .unwrap();
    std::fs::copy(shim(), ctx.join("target/release/libgpucap.so")).unwrap();
    std::fs::copy(cli(), ctx.join("target/release/gpucap")).unwrap();
    let built = run(rt
        .podman()
        .args([
            "build",
            "--pull=never",
            "--network=none",
            "-q",
            "-t",
            &image,
        ])
        .arg(format!("--build-arg=BUILD_IMAGE={build_image}"))
        .arg(format!("--build-arg=BASE_IMAGE={}", rt.image))
        .arg("-f")
        .arg(root().join("scripts/Dockerfile.example"))
        .arg(&ctx));
    let mut c = Container::new("dockerfile");
    c.image = Some(image.clone());
    c.env("GPUCAP_LIMIT", "1Gi");
    let o = built.status.success().then(|| run_600_600(&rt, &mut c));
    let _ = run(rt.podman().args(["rmi", "-f", &image, &build_image]));
    assert_ok(&built);
    assert_600_600(&o.unwrap(), CAPPED, GIB);
}

// ---------------------------------------------------------------------------------------
// Files and limits.

/// gpucap's library and a cap of 1 GiB in a pool named `pool` in `/pools` (a volume).
fn pooled(c: &mut Container, dir: &Path, pools: &Path, pool: &str) {
    gpucap_library(c, dir);
    c.mount(pools, "/pools")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_POOL", pool)
        .env("GPUCAP_POOL_DIR", "/pools");
}

/// A pool directory on a volume that containers of two users share (mode 1777, as /tmp):
/// each user's containers share that user's pool (a gpucap-UID directory each), and
/// neither user's pool counts the other's.
#[test]
fn a_pool_directory_on_a_shared_volume_serves_each_user_its_pool() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-pool-users");
    let pools = dir.join("pools");
    let sync = dir.join("sync");
    for d in [&pools, &sync] {
        std::fs::create_dir_all(d).unwrap();
        set_mode(d, 0o1777);
    }
    let container = |name: &str, user: &str, steps: &[&str]| {
        let mut c = Container::new(name);
        pooled(&mut c, &dir, &pools, "train");
        c.option(&format!("--user={user}"))
            .mount(&sync, "/sync")
            .script(steps);
        c
    };
    let (same_user, other_user) = &while_holding(&rt, &sync, container, "1000:1000", "1001:1001");
    assert_eq!(
        script_allocs(same_user),
        [(MIB600, 2)],
        "{}",
        dump(same_user)
    );
    assert_eq!(
        script_allocs(other_user),
        [(MIB600, 0)],
        "{}",
        dump(other_user)
    );
    use std::os::unix::fs::MetadataExt;
    for uid in [1000, 1001] {
        let file = pools.join(format!("gpucap-{uid}/train.pool"));
        let meta = std::fs::metadata(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(meta.uid(), uid, "{}", file.display());
    }
}

/// `--read-only` and `--user 1000`: the CDI device caps the container, its processes
/// share the default pool (in the container's own /dev/shm).
#[test]
fn a_read_only_root_and_a_non_root_user_are_capped() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-ro");
    let spec = CdiSpec::generate(&dir, &["--limit", "1Gi"]);
    let mut c = Container::new("ro");
    c.option(&spec.device)
        .option("--read-only")
        .option("--user=1000:1000")
        .shell(&format!(
            "touch /probe 2>/dev/null && echo root-is-writable; \
             {BIN}/script alloc:600Mi touch:/tmp/held wait:/tmp/done & \
             while ! [ -e /tmp/held ]; do sleep 0.05; done; \
             {BIN}/script alloc:600Mi; touch /tmp/done; wait; id -u; ls /dev/shm"
        ));
    let o = rt.run(&c);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(!out.contains("root-is-writable"), "{}", dump(&o));
    assert_eq!(
        script_allocs(&o),
        [(MIB600, 0), (MIB600, 2)],
        "{}",
        dump(&o)
    );
    assert!(out.lines().any(|l| l == "1000"), "{}", dump(&o));
    assert!(
        out.lines().any(|l| l == "gpucap-1000"),
        "the pool's directory\n{}",
        dump(&o)
    );
    // The HAMi DRA hand-over in the same conditions (the claim's directory is the user's).
    let mut h = Container::new("ro-hami");
    hami_dra(&mut h, &dir, "claim-ro", 1024);
    let claim = dir.join("claims/claim-ro");
    let o = run(Command::new("chown").arg("1000:1000").arg(&claim));
    assert_ok(&o);
    h.option("--read-only").option("--user=1000:1000");
    assert_600_600(&run_600_600(&rt, &mut h), CAPPED, GIB);
}

/// A container killed by the runtime (`podman kill`: SIGKILL) while it holds 800 MiB of
/// a pool on a shared volume: its bytes come back to the other containers.
#[test]
fn a_container_killed_while_holding_gives_its_bytes_back() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-kill");
    let pools = dir.join("pools");
    let sync = dir.join("sync");
    for d in [&pools, &sync] {
        std::fs::create_dir_all(d).unwrap();
    }
    let container = |name: &str, steps: &[&str]| {
        let mut c = Container::new(name);
        pooled(&mut c, &dir, &pools, "shared");
        c.mount(&sync, "/sync").script(steps);
        c
    };
    let victim = container(
        "victim",
        &["alloc:800Mi", "touch:/sync/held", "wait:/sync/never"],
    );
    let mut held = rt.spawn(&victim);
    wait_for(&sync.join("held"), &mut held, "the holding container");
    let before = rt.run(&container("before", &["alloc:600Mi"]));
    let o = run(rt.podman().args(["kill", &victim.name]));
    assert_ok(&o);
    let killed = held.wait_with_output().unwrap();
    assert_eq!(
        killed.status.code(),
        Some(137),
        "killed by SIGKILL\n{}",
        dump(&killed)
    );
    let after = rt.run(&container("after", &["alloc:600Mi"]));
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
