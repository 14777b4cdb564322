//! scripts/Dockerfile.example, and files and limits in containers.

use super::*;

/// The Dockerfile builds FROM the test's base image (its build arguments) and runs: the
/// entrypoint caps the container's command. The build stage's `cargo` is a stand-in
/// that checks it is asked for the shim and the CLI and finds them built (compiling them
/// again in the container would take minutes); everything else is the Dockerfile's own.
#[test]
pub fn the_example_dockerfile_builds_and_caps() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-dockerfile");
    let tag = unique("image");
    let (build_ctx, ctx) = example_contexts(&dir, &rt.image);
    let build_image = format!("localhost/{tag}-build");
    let python_image = format!("localhost/{tag}-python");
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
    let o = run(rt
        .podman()
        .args([
            "build",
            "--pull=never",
            "--network=none",
            "-q",
            "-t",
            &python_image,
        ])
        .arg(python_base_context(&dir, &rt.image)));
    assert_ok(&o);
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
        .arg(format!("--build-arg=BASE_IMAGE={python_image}"))
        .arg("-f")
        .arg(root().join("scripts/Dockerfile.example"))
        .arg(&ctx));
    let mut c = Container::new("dockerfile");
    c.image = Some(image.clone());
    c.env("GPUCAP_LIMIT", "1Gi");
    let o = built.status.success().then(|| run_600_600(&rt, &mut c));
    let _ = run(rt
        .podman()
        .args(["rmi", "-f", &image, &build_image, &python_image]));
    assert_ok(&built);
    assert_600_600(&o.unwrap(), CAPPED, GIB);
}

/// The build context of an image `FROM base` with this machine's own Python (Debian's
/// `python3.X-minimal` and what it needs beyond the base's libc: its files, copied from
/// the host, no download) and `python` naming it: the application's image the example's
/// runtime stage is built on in the tests, where `apt-get` has no network. Fails (never
/// skips) where the host has no Debian `python3-minimal`.
pub fn python_base_context(dir: &Path, base: &str) -> PathBuf {
    let ctx = dir.join("python-base");
    let rootfs = ctx.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let query = |args: &[&str]| {
        let o = run(Command::new("dpkg-query").args(args));
        assert_ok(&o);
        stdout(&o)
    };
    let python =
        std::fs::canonicalize("/usr/bin/python3").expect("no /usr/bin/python3 on the host");
    let version = python.file_name().unwrap().to_str().unwrap().to_string(); // python3.11
    let packages = [
        format!("{version}-minimal"),
        format!("lib{version}-minimal"),
        "libexpat1".to_string(),
        "zlib1g".to_string(),
    ];
    for pkg in &packages {
        for path in query(&["-L", pkg]).lines() {
            let p = Path::new(path);
            if path.starts_with("/usr/share/") || p.is_dir() || !p.exists() {
                continue;
            }
            // The base is /usr-merged: /lib/x.so is /usr/lib/x.so there.
            let merged = ["/lib/", "/lib64/", "/bin/", "/sbin/"]
                .iter()
                .any(|m| path.starts_with(m));
            let to = rootfs.join(if merged {
                format!("usr{path}")
            } else {
                path.trim_start_matches('/').to_string()
            });
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&to);
            match std::fs::read_link(p) {
                Ok(target) => std::os::unix::fs::symlink(target, &to).unwrap(),
                Err(_) => {
                    std::fs::copy(p, &to).unwrap();
                }
            }
        }
    }
    let link = rootfs.join("usr/bin/python");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&version, &link).unwrap();
    write(
        &ctx.join("Dockerfile"),
        &format!("FROM {base}\nCOPY rootfs/ /\n"),
    );
    ctx
}

/// `python train.py`, as docs/src/container.md runs it in the example's image: a
/// `train.py` (in `dir`, mounted at `/app`, the working directory) whose CUDA program is
/// `cudarc-client 600 600`, which it runs in its place.
pub fn train_py(c: &mut Container, dir: &Path) {
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    write(
        &app.join("train.py"),
        &format!(
            "import os\nos.execv(\"{BIN}/cudarc-client\", [\"cudarc-client\", \"600\", \"600\"])\n"
        ),
    );
    c.mount(&app, "/app")
        .option("--workdir=/app")
        .command(&["python", "train.py"]);
}

/// The two build contexts of scripts/Dockerfile.example's test build, in `dir`: the build
/// image's (`base` with a stand-in `cargo` that checks it is asked for the shim and the
/// CLI and finds them built: compiling them again in the container would take minutes),
/// and the example's own (what `COPY . .` needs, with the shim and the CLI already
/// built). Returns (build image's context, example's context).
pub fn example_contexts(dir: &Path, base: &str) -> (PathBuf, PathBuf) {
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
        &build_ctx.join("Dockerfile"),
        &format!("FROM {base}\nCOPY cargo /usr/local/bin/cargo\n"),
    );
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
    (build_ctx, ctx)
}

// ---------------------------------------------------------------------------------------
// Files and limits.

/// gpucap's library and a cap of 1 GiB in a pool named `pool` in `/pools` (a volume).
pub fn pooled(c: &mut Container, dir: &Path, pools: &Path, pool: &str) {
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
pub fn a_pool_directory_on_a_shared_volume_serves_each_user_its_pool() {
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
    assert_eq!(script_allocs(same_user), SHARED, "{}", dump(same_user));
    assert_eq!(script_allocs(other_user), OWN, "{}", dump(other_user));
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
pub fn a_read_only_root_and_a_non_root_user_are_capped() {
    let Some(rt) = runtime() else { return };
    let dir = host_dir("ctr-ro");
    let spec = CdiSpec::generate(&dir, &["--limit", "1Gi"]);
    let mut c = Container::new("ro");
    c.cdi(&spec)
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
        out.lines().any(|l| l.starts_with("gpucap-container-")),
        "the container's pool's directory\n{}",
        dump(&o)
    );
    // The HAMi DRA hand-over in the same conditions, the claim's directory the user's
    // alone (0755): the claim's pool file is the user's, 0600.
    let mut h = Container::new("ro-hami");
    hami_dra(&mut h, &dir, "claim-ro", 1024);
    let claim = dir.join("claims/claim-ro");
    let o = run(Command::new("chown").arg("1000:1000").arg(&claim));
    assert_ok(&o);
    set_mode(&claim, 0o755);
    h.option("--read-only").option("--user=1000:1000");
    assert_600_600(&run_600_600(&rt, &mut h), CAPPED, GIB);
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::metadata(claim.join("gpucap.pool")).unwrap();
    assert_eq!((file.mode() & 0o7777, file.uid()), (0o600, 1000));
}

/// A container killed by the runtime (`podman kill`: SIGKILL) while it holds 800 MiB of
/// a pool on a shared volume: its bytes come back to the other containers.
#[test]
pub fn a_container_killed_while_holding_gives_its_bytes_back() {
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
    killed_container_gives_its_bytes_back(&rt, &sync, "", container);
}
