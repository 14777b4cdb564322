//! The CLI's doors to an uncapped program, closed: a `GPUCAP_LIB` that is not
//! libgpucap.so, a Jupyter kernel labelled gpucap with no cap, a `--ceiling` said to run
//! uncapped, and pool sizes that a typo makes bytes (or "no cap"). Each was served,
//! installed or accepted before (exit 0).

use super::common;

use common::*;
use std::path::Path;
use std::process::Command;

/// `gpucap ARGS` on the fake GPU (4 GiB), its pools and scratch in `dir`.
pub(crate) fn gpucap(args: &[&str], dir: &Path) -> Command {
    let mut cmd = fake_cmd(cli(), &dir.join("s.json"));
    cmd.args(args)
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_POOL_DIR", dir);
    cmd
}

#[test]
fn a_gpucap_lib_that_is_not_libgpucap_is_refused_and_nothing_runs() {
    let dir = scratch("cli-not-gpucap");
    let marker = dir.join("started");
    let empty = dir.join("empty.so");
    std::fs::write(&empty, b"").unwrap();
    let script = dir.join("script.sh");
    std::fs::write(&script, b"#!/bin/sh\n").unwrap();
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("the C library");
    for (lib, what) in [
        (Path::new(libc), "a shared library that is not gpucap's"),
        (empty.as_path(), "not an ELF file"),
        (script.as_path(), "not an ELF file"),
    ] {
        let m = marker.to_str().unwrap();
        let o = run(gpucap(
            &["run", "--limit", "1Gi", "--", "sh", "-c", "touch \"$0\"", m],
            &dir,
        )
        .env("GPUCAP_LIB", lib));
        assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
        let line = format!("GPUCAP_LIB={} is not libgpucap.so: {what}", lib.display());
        assert!(stderr(&o).contains(&line), "{}", dump(&o));
        assert!(
            !marker.exists(),
            "the program ran without the shim\n{}",
            dump(&o)
        );
        let o = run(gpucap(&["check", "--limit", "1Gi"], &dir).env("GPUCAP_LIB", lib));
        assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
        assert!(!stdout(&o).contains("configuration OK"), "{}", dump(&o));
        assert!(stderr(&o).contains(&line), "{}", dump(&o));
    }
    // The library itself passes.
    let o = run(gpucap(&["check", "--limit", "1Gi"], &dir).env("GPUCAP_LIB", shim()));
    assert_ok(&o);
    assert!(
        stdout(&o).starts_with("gpucap: configuration OK\n"),
        "{}",
        dump(&o)
    );
}

#[test]
fn a_jupyter_kernel_with_no_cap_is_not_installed() {
    let dir = scratch("cli-jupyter-uncapped");
    let data = dir.join("jupyter-data");
    // A cap in the installing shell's environment (or a driver's variable there) is not
    // the kernel's: the Jupyter server starts it with its own (before, the kernel was
    // installed as `gpucap run --pool team -- python …` and ran uncapped).
    for (args, env) in [
        (&["jupyter", "install", "--pool", "off"][..], None),
        (&["jupyter", "install", "--pool", "team"][..], None),
        (
            &["jupyter", "install", "--pool", "team"][..],
            Some(("GPUCAP_LIMIT", "8Gi")),
        ),
        (
            &["jupyter", "install", "--pool", "team"][..],
            Some(("CUDA_DEVICE_MEMORY_LIMIT", "8192m")),
        ),
    ] {
        let mut c = gpucap(args, &dir);
        c.env("JUPYTER_DATA_DIR", &data);
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let o = run(&mut c);
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains("no kernel installed: no cap is set"),
            "{args:?}\n{}",
            dump(&o)
        );
        assert!(
            !data.join("kernels").exists(),
            "{args:?}: a kernel was written\n{}",
            dump(&o)
        );
    }
}

#[test]
fn a_members_ceiling_is_a_cap_not_an_uncapped_run() {
    let dir = scratch("cli-ceiling-capped");
    let o = run(&mut gpucap(
        &["run", "--pool", "pc", "--ceiling", "1Gi", "--", "true"],
        &dir,
    ));
    assert_ok(&o);
    assert!(!stderr(&o).contains("runs uncapped"), "{}", dump(&o));
    let o = run(&mut gpucap(
        &[
            "check",
            "--limit",
            "none",
            "--pool",
            "pc",
            "--ceiling",
            "1Gi",
        ],
        &dir,
    ));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(
            "GPU 0: cap 1073741824 bytes (1 GiB) of 4294967296 (4 GiB) [FakeCUDA Device 0] \
             (this process's ceiling in the pool, which has no cap)"
        ),
        "{}",
        dump(&o)
    );
}

#[test]
fn pool_sizes_are_read_as_gpucap_limit_reads_them() {
    let dir = scratch("cli-pool-sizes");
    for (args, line) in [
        (&["pool", "resize", "p", "8"][..], "did you mean 8Gi?"),
        (
            &["pool", "set", "p", "1", "--ceiling", "8"][..],
            "did you mean 8Gi?",
        ),
        (
            &["pool", "resize", "p", "18446744073709551615"][..],
            "past any GPU's memory",
        ),
        (&["pool", "resize", "p", "1.5B"][..], "a fraction of a byte"),
    ] {
        let o = run(&mut gpucap(args, &dir));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(stderr(&o).contains(line), "{args:?}\n{}", dump(&o));
    }
    let o = run(&mut gpucap(&["run", "--limit", "1.5B", "--", "true"], &dir));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("a fraction of a byte"), "{}", dump(&o));
}
