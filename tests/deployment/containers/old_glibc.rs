//! An image whose C library is older than the one gpucap's native build asks for (Debian
//! 11, glibc 2.31; the native build on Debian 12 asks for GLIBC_2.35): the CDI device and
//! the Kubernetes installs mount the host's library into images they do not choose. The
//! portable build (scripts/build-portable.sh, glibc 2.27 and later; scripts/test.sh builds
//! it with `--with-fake` and names its folder in GPUCAP_TEST_PORTABLE) loads there and caps;
//! the native one is refused by that image's loader (the control: the image is old
//! enough).

use super::*;

/// The portable build's folder (libgpucap.so, gpucap, the fake GPU and `script` built for
/// glibc 2.27) and the old image, or None (after SKIP) where either is missing.
fn portable() -> Option<(Runtime, PathBuf, String)> {
    let rt = runtime()?;
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let (Some(dir), Some(image)) = (
        var("GPUCAP_TEST_PORTABLE"),
        var("GPUCAP_TEST_OLD_GLIBC_IMAGE"),
    ) else {
        skip(
            "no portable build or old-glibc image (GPUCAP_TEST_PORTABLE, \
             GPUCAP_TEST_OLD_GLIBC_IMAGE unset): scripts/test.sh runs \
             scripts/build-portable.sh --with-fake and scripts/dev/containers-setup.sh",
        );
        return None;
    };
    Some((rt, dir.into(), image.into_string().unwrap()))
}

/// The newest `GLIBC_2.N` version `file` asks for, as N.
fn newest_glibc(file: &Path) -> u32 {
    let o = run(Command::new("objdump").arg("-T").arg(file));
    assert_ok(&o);
    stdout(&o)
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter_map(|w| w.strip_prefix("GLIBC_2."))
        .filter_map(|n| n.parse::<u32>().ok())
        .max()
        .unwrap_or(0)
}

/// A container of the old image with the portable fake GPU where the toolkit mounts the
/// driver, the portable build in /opt/gpucap and the native library in /opt/native.
fn old_container(dir: &Path, image: &str, script: &str) -> Container {
    let mut c = Container {
        name: unique("old-glibc"),
        image: Some(image.into()),
        options: Vec::new(),
        env: Vec::new(),
        command: Vec::new(),
        cdi_specs: None,
    };
    c.mount_ro(&dir.join("libcuda.so.1"), &format!("{LIBDIR}/libcuda.so.1"))
        .mount_ro(
            &dir.join("libnvidia-ml.so.1"),
            &format!("{LIBDIR}/libnvidia-ml.so.1"),
        )
        .mount_ro(dir, "/opt/gpucap")
        .mount_ro(&shim(), "/opt/native/libgpucap.so")
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .shell(script);
    c
}

#[test]
fn the_portable_build_caps_in_an_image_with_an_older_glibc() {
    let Some((rt, dir, image)) = portable() else {
        return;
    };
    for f in [
        "libgpucap.so",
        "gpucap",
        "libcuda.so.1",
        "script",
        "exec_edges",
    ] {
        let n = newest_glibc(&dir.join(f));
        assert!(n <= 27, "{f} asks for GLIBC_2.{n}, newer than 2.27");
    }
    assert!(
        newest_glibc(&shim()) > 31,
        "the native build loads in glibc 2.31: the control below proves nothing"
    );
    let o = rt.run(&old_container(
        &dir,
        &image,
        "ldd --version | head -n 1; \
         echo native; LD_PRELOAD=/opt/native/libgpucap.so GPUCAP_LIMIT=256Mi \
           /opt/gpucap/script alloc:400Mi; \
         echo portable; LD_PRELOAD=/opt/gpucap/libgpucap.so GPUCAP_LIMIT=256Mi \
           /opt/gpucap/script alloc:200Mi alloc:400Mi; \
         echo run; /opt/gpucap/gpucap run --limit 256Mi -- env -i /opt/gpucap/script alloc:400Mi; \
         echo check; GPUCAP_LIMIT=256Mi /opt/gpucap/gpucap check; \
         echo forks; export LD_PRELOAD=/opt/gpucap/libgpucap.so GPUCAP_LIMIT=256Mi; \
           /opt/gpucap/exec_edges threaded-fork 5; /opt/gpucap/exec_edges atfork-lock; \
           /opt/gpucap/exec_edges lock-fork; /opt/gpucap/exec_edges altstack 8192; echo altstack $?; \
           unset LD_PRELOAD; /opt/gpucap/exec_edges unloaded-fork /opt/gpucap/libgpucap.so",
    ));
    let (out, err) = (stdout(&o), stderr(&o));
    let text = dump(&o);
    assert!(out.contains("2.31"), "not the old image: {text}");
    let section = |name: &str| {
        out.split_once(&format!("{name}\n"))
            .map(|(_, rest)| {
                rest.lines()
                    .take_while(|l| !["native", "portable", "run", "check", "forks"].contains(l))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    // The native build: the image's loader refuses it (the program does not start).
    assert!(
        err.contains("version `GLIBC_2.3") && err.contains("/opt/native/libgpucap.so"),
        "the native build must be refused by glibc 2.31's loader: {text}"
    );
    assert!(
        section("native").iter().all(|l| !l.starts_with("alloc")),
        "{text}"
    );
    // The portable build caps: 200 MiB served, 400 MiB more refused with the line.
    assert_eq!(
        section("portable"),
        ["cuInit 0", "alloc 209715200 0", "alloc 419430400 2"],
        "{text}"
    );
    assert!(
        err.contains("refused cuMemAlloc of 400 MiB on GPU 0: 200 MiB of the 256 MiB cap in use"),
        "{text}"
    );
    // The portable command runs there, and its child started by `env -i` is capped.
    assert_eq!(section("run"), ["cuInit 0", "alloc 419430400 2"], "{text}");
    assert!(
        section("check").contains(&"gpucap: configuration OK"),
        "{text}"
    );
    // That glibc's fork handlers and loader locks: children forked beside a thread that
    // walks the loader's list exec, a program's own fork handler beside such a thread
    // forks, and a program that opened and closed the library forks.
    assert_eq!(
        section("forks"),
        ["hung 0", "forked", "forked", "altstack 0", "forked"],
        "{text}"
    );
    assert!(o.status.success(), "{text}");
}

/// The CDI device made by the portable command (`target/portable/gpucap cdi generate`,
/// which copies the portable library beside it) caps a container of the old image with no
/// preload of its own; the native command's device stops every process of that container
/// (its `/etc/ld.so.preload` names a library the old loader refuses).
#[test]
fn a_portable_cdi_device_caps_a_container_with_an_older_glibc() {
    let Some((rt, dir, image)) = portable() else {
        return;
    };
    let steps = "/opt/gpucap/script alloc:200Mi alloc:400Mi";
    let spec = CdiSpec::generate_by(
        &dir.join("gpucap"),
        &host_dir("old-glibc-cdi"),
        &["--limit", "256Mi"],
    );
    let mut c = old_container(&dir, &image, steps);
    let o = rt.run(c.cdi(&spec));
    assert_eq!(
        stdout(&o).lines().collect::<Vec<_>>(),
        ["cuInit 0", "alloc 209715200 0", "alloc 419430400 2"],
        "{}",
        dump(&o)
    );
    let native = CdiSpec::generate(&host_dir("old-glibc-cdi-native"), &["--limit", "256Mi"]);
    let mut c = old_container(&dir, &image, steps);
    let o = rt.run(c.cdi(&native));
    assert!(
        !o.status.success() && stderr(&o).contains("GLIBC_2.3"),
        "the native device in a glibc 2.31 image\n{}",
        dump(&o)
    );
}
