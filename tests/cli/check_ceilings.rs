//! `gpucap check` and `gpucap run` under a ceiling handed down (a `gpucap.env` beside the
//! library): on each GPU both figures in bytes (the ceiling's and what was asked, a
//! fraction resolved against the GPU's total), where each came from, which one holds,
//! a driver's grant called a ceiling too, and a flag named as typed (`--limit`).
//! On the fake GPU of 4 GiB; the library is a copy in the scratch (GPUCAP_LIB).

use super::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A copy of the library in `dir/home` with `gpucap.env` holding `file`: the library and
/// the file's path as printed.
fn library_with(dir: &Path, file: &str) -> (PathBuf, String) {
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let lib = home.join("libgpucap.so");
    std::fs::copy(shim(), &lib).unwrap();
    std::fs::write(home.join("gpucap.env"), file).unwrap();
    (lib, home.join("gpucap.env").display().to_string())
}

/// `gpucap ARGS` with the library `lib` and `vars`.
fn gpucap(dir: &Path, lib: &Path, vars: &[(&str, &str)], args: &[&str]) -> Command {
    let mut c = fake_cmd(cli(), &dir.join("s.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIB", lib)
        .envs(vars.iter().copied())
        .args(args);
    c
}

/// The line of `gpucap check`'s output that starts with `prefix`.
fn line<'a>(o: &'a Output, out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line\n{}", dump(o)))
}

#[test]
fn check_under_a_ceiling_shows_both_figures_per_gpu_where_each_came_from_and_which_holds() {
    // The file's 256 MiB against --limit 50% (2 GiB of this GPU): the ceiling holds.
    let dir = scratch("check-ceiling-bytes");
    let (lib, file) = library_with(&dir, "GPUCAP_LIMIT=256Mi\n");
    let o = run(&mut gpucap(&dir, &lib, &[], &["check", "--limit", "50%"]));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "asked: "),
        "asked: --limit=\"50%\" (the environment's; on each GPU the smaller of it and the \
         ceiling holds)"
    );
    assert_eq!(
        line(&o, &out, "GPU 0: "),
        format!(
            "GPU 0: cap 268435456 bytes (256 MiB) of 4294967296 (4 GiB) [FakeCUDA Device 0] \
             (the ceiling from {file}, 256 MiB: --limit=\"50%\" asks more, 2 GiB)"
        )
    );

    // The file's 50% (2 GiB here) against GPUCAP_LIMIT=1Gi: the environment's holds.
    let dir = scratch("check-ceiling-fraction");
    let (lib, file) = library_with(&dir, "GPUCAP_LIMIT=50%\n");
    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_LIMIT", "1Gi")],
        &["check"],
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "GPU 0: "),
        format!(
            "GPU 0: cap 1073741824 bytes (1 GiB) of 4294967296 (4 GiB) [FakeCUDA Device 0] \
             (from GPUCAP_LIMIT=\"1Gi\", under the ceiling of {file}, 2 GiB)"
        )
    );

    // Two ceilings, the file's and HAMi's grant: the grant is called a ceiling too, and
    // the smaller (the grant's 100 MiB) holds.
    let dir = scratch("check-ceiling-grant");
    let (lib, file) = library_with(&dir, "GPUCAP_LIMIT=256Mi\n");
    let vars = [("CUDA_DEVICE_MEMORY_LIMIT", "100m")];
    let o = run(&mut gpucap(&dir, &lib, &vars, &["check"]));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        line(&o, &out, "asked: ").starts_with(
            "asked: CUDA_DEVICE_MEMORY_LIMIT=\"100m\" (HAMi device plugin) (a driver's \
             hand-over, a ceiling too; "
        ),
        "{}",
        dump(&o)
    );
    assert!(
        line(&o, &out, "GPU 0: ").ends_with(&format!(
            "(from CUDA_DEVICE_MEMORY_LIMIT=\"100m\" (HAMi device plugin), under the ceiling \
             of {file}, 256 MiB)"
        )),
        "{}",
        dump(&o)
    );

    // run at info: what was asked is the flag typed.
    let script = compile_c("script", "", &["-lcuda"]);
    let dir = scratch("run-ceiling-flag");
    let (lib, file) = library_with(&dir, "GPUCAP_LIMIT=256Mi\n");
    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_LOG", "info")],
        &["run", "--limit", "4Gi", "--", script.to_str().unwrap()],
    ));
    assert_ok(&o);
    let err = stderr(&o);
    for want in [
        format!("gpucap: ceiling: every GPU: 256 MiB (268435456 bytes) (from {file}"),
        "gpucap: asked: --limit=\"4Gi\" (the environment's;".to_string(),
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(&want)),
            "missing {want:?}\n{}",
            dump(&o)
        );
    }
}

/// `check --write-env` (what the container entrypoint runs) writes no `gpucap.env` that
/// would lift `/etc/gpucap/gpucap.env`'s cap: a file beside the library is read in its
/// place, so an environment asking 2 GiB above the image's 1 GiB is refused with a line
/// and nothing is written; asking less is written. Before, the 2 GiB file was written and
/// every process without variables ran at 2 GiB. `/etc` is an overlay in a mount
/// namespace of the test's own.
#[test]
fn write_env_never_lifts_the_ceiling_of_etc() {
    if !unshare_works() {
        return;
    }
    let dir = scratch("check-write-env-etc");
    let etc_file = dir.join("etc-gpucap.env");
    std::fs::write(&etc_file, "GPUCAP_LIMIT=1Gi\n").unwrap();
    let tmp = dir.join("etc-overlay");
    std::fs::create_dir_all(&tmp).unwrap();
    for (asked, written) in [("2Gi", false), ("512Mi", true)] {
        let out = dir.join(format!("gpucap-{asked}.env"));
        let mut c = fake_cmd("unshare", &dir.join("s.json"));
        c.args(["-rm", "sh", "-c"])
            .arg(
                "set -e; t=$1; f=$2; shift 2; \
                 mount -t tmpfs none \"$t\"; mkdir -p \"$t/u/gpucap\" \"$t/w\"; \
                 cp \"$f\" \"$t/u/gpucap/gpucap.env\"; \
                 mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$t/u\",workdir=\"$t/w\" /etc; \
                 exec \"$@\"",
            )
            .arg("sh")
            .arg(&tmp)
            .arg(&etc_file)
            .arg(cli())
            .args(["check", "--write-env"])
            .arg(&out)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_LIB", shim())
            .env("GPUCAP_LIMIT", asked);
        let o = run(&mut c);
        if written {
            assert_ok(&o);
            assert!(
                std::fs::read_to_string(&out)
                    .unwrap()
                    .contains("GPUCAP_LIMIT=512Mi\n")
            );
        } else {
            assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
            assert!(
                stderr(&o).contains(
                    "GPUCAP_LIMIT=\"2Gi\" asks more than the ceiling of GPU 0, 1 GiB (from \
                     /etc/gpucap/gpucap.env); not written"
                ),
                "{}",
                dump(&o)
            );
            assert!(!out.exists(), "a file was written");
        }
    }
}

/// A `gpucap.env` that sets `GPUCAP_LIMIT=none`: `check` names the file's `none` as no cap
/// asked, and `run` does not call the program unintentionally uncapped; beside a variable
/// of the environment, the file is no ceiling and `check` says so, not that the environment
/// has no variable (before: "from FILE (the environment has no GPUCAP_* variable)" beside
/// GPUCAP_LOG=info, "GPUCAP_LIMIT unset" and run's "no cap is set" for the file's `none`).
/// An explicit GPUCAP_WAIT=0 in a pool is named as the wait's source.
#[test]
fn a_files_limit_none_and_the_environment_beside_a_file_without_a_cap_are_named() {
    let dir = scratch("check-file-none");
    let (lib, file) = library_with(&dir, "GPUCAP_LIMIT=none\n");
    // Without GPUCAP_LIB (gpucap's own), the environment has no GPUCAP_* variable: a
    // copy of gpucap finds the library beside it.
    let copy = lib.with_file_name("gpucap");
    std::fs::copy(cli(), &copy).unwrap();
    let mut c = fake_cmd(&copy, &dir.join("s.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi").arg("check");
    let o = run(&mut c);
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "configuration: "),
        format!("configuration: from {file} (the environment has no GPUCAP_* variable)")
    );
    assert_eq!(
        line(&o, &out, "limit: "),
        format!(
            "limit: none (no cap asked, GPUCAP_LIMIT=none in {file}: allocations are counted, \
             not capped)"
        )
    );
    let o = run(&mut gpucap(&dir, &lib, &[], &["run", "true"]));
    assert_ok(&o);
    assert!(!stderr(&o).contains("no cap is set"), "{}", dump(&o));

    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_LOG", "info")],
        &["check"],
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "configuration: "),
        format!(
            "configuration: the environment's, with {file} (it sets no cap, so no ceiling; it \
             fills what the environment leaves unset)"
        )
    );
    assert_eq!(
        line(&o, &out, "limit: "),
        format!(
            "limit: none (no cap asked, GPUCAP_LIMIT=none in {file}: allocations are counted, \
             not capped)"
        )
    );
    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_LIMIT", "none")],
        &["check"],
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "limit: "),
        "limit: none (no cap asked, GPUCAP_LIMIT=none: allocations are counted, not capped)"
    );

    let pool = [
        ("GPUCAP_POOL", "p"),
        ("GPUCAP_POOL_DIR", dir.to_str().unwrap()),
        ("GPUCAP_WAIT", "0"),
    ];
    let o = run(&mut gpucap(&dir, &lib, &pool, &["check", "--limit", "1Gi"]));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "wait: "),
        "wait: none (from GPUCAP_WAIT: an allocation the pool cannot take now is refused at once)"
    );
}

/// A wait set in the `gpucap.env` is named with the file, as its cap is: the file alone
/// (no GPUCAP_* variable), and beside the environment's variables (the file's pool binds,
/// and its wait with it); the environment's own GPUCAP_WAIT is named as the variable
/// (before: "from GPUCAP_WAIT" for the file's wait, which no variable had set).
#[test]
fn a_files_wait_is_named_with_the_file() {
    let dir = scratch("check-file-wait");
    let (lib, file) = library_with(
        &dir,
        &format!(
            "GPUCAP_LIMIT=1Gi\nGPUCAP_POOL=p\nGPUCAP_POOL_DIR={}\nGPUCAP_WAIT=30s\n",
            dir.display()
        ),
    );
    let from_file = format!(
        "wait: 30 s (from GPUCAP_WAIT in {file}: an allocation the pool cannot take now \
         waits up to 30 s for its members to free memory)"
    );
    // The file alone: a copy of gpucap finds the library beside it (GPUCAP_LIB would be
    // a variable of the environment).
    let copy = lib.with_file_name("gpucap");
    std::fs::copy(cli(), &copy).unwrap();
    let mut c = fake_cmd(&copy, &dir.join("s.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi").arg("check");
    let o = run(&mut c);
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(line(&o, &out, "wait: "), from_file);
    // Beside a variable of the environment.
    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_LOG", "info")],
        &["check"],
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(line(&o, &out, "wait: "), from_file);
    // The environment's own wait (in the file's pool) is its variable's.
    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_POOL", "p"), ("GPUCAP_WAIT", "1500ms")],
        &["check"],
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "wait: "),
        "wait: 1500 ms (from GPUCAP_WAIT: an allocation the pool cannot take now waits up \
         to 1500 ms for its members to free memory)"
    );
}

/// A wait of none set in the `gpucap.env` is named with the file too (before: the
/// default's line, "--wait or GPUCAP_WAIT sets a wait", as if nothing had set it).
#[test]
fn a_files_wait_of_none_is_named_with_the_file() {
    let dir = scratch("check-file-no-wait");
    let (lib, file) = library_with(
        &dir,
        &format!(
            "GPUCAP_LIMIT=1Gi\nGPUCAP_POOL=p\nGPUCAP_POOL_DIR={}\nGPUCAP_WAIT=0\n",
            dir.display()
        ),
    );
    let o = run(&mut gpucap(
        &dir,
        &lib,
        &[("GPUCAP_LOG", "info")],
        &["check"],
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert_eq!(
        line(&o, &out, "wait: "),
        format!(
            "wait: none (from GPUCAP_WAIT in {file}: an allocation the pool cannot take now \
             is refused at once)"
        )
    );
}
