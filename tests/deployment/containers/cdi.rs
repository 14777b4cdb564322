//! CDI: `gpucap cdi generate` and podman's own CDI support.

use super::*;

/// A CDI spec in a spec directory of the test's own: podman reads specs only from
/// /etc/cdi and /run/cdi (4.3 has no option for another), so a container that names the
/// device ([`Container::cdi`]) is run in a mount namespace of its own where that
/// directory is mounted over /run/cdi. Nothing is written into the system's directory.
pub struct CdiSpec {
    pub file: PathBuf,
    pub dir: PathBuf,
    pub device: String,
}

impl CdiSpec {
    pub fn generate(dir: &Path, extra: &[&str]) -> CdiSpec {
        CdiSpec::generate_by(&cli(), dir, extra)
    }

    /// [`generate`](Self::generate) by the `gpucap` command `cli` (which copies the
    /// library beside it).
    pub fn generate_by(cli: &Path, dir: &Path, extra: &[&str]) -> CdiSpec {
        let name = unique("cdi");
        let specs = scratch(&format!("{name}-specs"));
        let file = specs.join(format!("{name}.json"));
        let mut c = Command::new(cli);
        c.args(["cdi", "generate", "--name", &name, "--dir"])
            .arg(dir)
            .arg("--output")
            .arg(&file)
            .args(extra);
        let o = run(&mut c);
        assert_ok(&o);
        CdiSpec {
            file,
            dir: specs,
            device: format!("--device=gpucap.io/gpu={name}"),
        }
    }
}

impl Container {
    /// The container gets `spec`'s device, podman reading the spec from its own directory.
    pub fn cdi(&mut self, spec: &CdiSpec) -> &mut Self {
        self.cdi_specs = Some(spec.dir.clone());
        self.option(&spec.device)
    }
}

#[test]
pub fn a_cdi_device_caps_a_container_and_no_other() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-cdi");
    let spec = CdiSpec::generate(&dir, &["--limit", "1Gi"]);
    let text = std::fs::read_to_string(&spec.file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["cdiVersion"], "0.3.0", "{text}");
    let mut c = Container::new("cdi");
    c.cdi(&spec)
        .mount_ro(&compile_c("as_user", "", &[]), &format!("{BIN}/as-user"));
    assert_capped_at_1gib(
        &rt,
        &mut c,
        CDI_CHECK,
        "configuration: from /usr/local/lib/gpucap-cdi/gpucap.env",
    );
    // A process that starts with an empty environment is capped too (ld.so.preload and
    // gpucap.env), and shares the container's pool: 600 MiB held by the first leave the
    // second 424 MiB. So does a process of another user (before: a pool of its own, the
    // whole 1 GiB).
    c.shell(&format!(
        "{BIN}/script alloc:600Mi touch:/tmp/held wait:/tmp/done & \
         while ! [ -e /tmp/held ]; do sleep 0.05; done; \
         env -i {BIN}/script alloc:600Mi; \
         {BIN}/as-user 1000 {BIN}/script alloc:600Mi; \
         touch /tmp/done; wait"
    ));
    let o = rt.run(&c);
    assert_ok(&o);
    assert_eq!(
        script_allocs(&o),
        [(MIB600, 0), (MIB600, 2), (MIB600, 2)],
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
pub fn a_library_only_cdi_device_takes_the_cap_from_the_containers_variables() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-cdi-lib");
    let spec = CdiSpec::generate(&dir, &[]);
    let mut c = Container::new("cdi-lib");
    c.cdi(&spec)
        .env("NVIDIA_VISIBLE_DEVICES", GPU0)
        .env("NVIDIA_GPU_MEMORY_LIMIT", "1024")
        .env("NVIDIA_GPU_MEMORY_REQUEST", "1024");
    assert_capped_at_1gib(&rt, &mut c, CDI_CHECK, "NVIDIA_GPU_MEMORY_LIMIT");
}
