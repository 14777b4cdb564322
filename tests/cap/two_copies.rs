//! Two copies of the library in one process: the operator's in `/etc/ld.so.preload` (a
//! container's) and the user's in `LD_PRELOAD` (a pip-installed `gpucap run`), or two
//! paths in `LD_PRELOAD`. The first copy the loader lists caps, once; the others stay
//! idle; a configuration file beside any copy is read, so one the operator wrote stays
//! a ceiling whichever copy comes first; files that differ refuse the program with a
//! line naming both. Before, each copy took the other's `dlvsym` for glibc's and the
//! program died of a stack overflow at its first CUDA call (exit 134 or 139).

use super::common;

use super::ceilings::{alloc_rc, library_in};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

const SMALL: u64 = 200 * MIB;

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// The script (200 MiB, then 1 GiB) on a 4 GiB fake GPU, `LD_PRELOAD` set to `preload`.
fn allocate(dir: &Path, preload: &str, vars: &[(&str, &str)]) -> Output {
    let mut c = fake_cmd(script(), &dir.join("stats.json"));
    c.env("LD_PRELOAD", preload)
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
        .args([format!("alloc:{SMALL}"), format!("alloc:{GIB}")]);
    for (k, v) in vars {
        c.env(k, v);
    }
    run(&mut c)
}

/// Ran to its end, 200 MiB served, the 1 GiB refused; at debug level (`GPUCAP_LOG`), one
/// exit summary: one copy capped.
fn capped_once(o: &Output, what: &str, debug: bool) {
    assert!(
        o.status.success(),
        "{what}: the program did not run to its end\n{}",
        dump(o)
    );
    assert_eq!(
        alloc_rc(o, SMALL).as_deref(),
        Some("0"),
        "{what}\n{}",
        dump(o)
    );
    assert_eq!(
        alloc_rc(o, GIB).as_deref(),
        Some("2"),
        "{what}: 1 GiB served\n{}",
        dump(o)
    );
    let summaries = stderr(o).lines().filter(|l| l.contains(": peak ")).count();
    assert_eq!(
        summaries,
        usize::from(debug),
        "{what}: one copy sums up at exit\n{}",
        dump(o)
    );
}

#[test]
fn two_copies_in_ld_preload_cap_once_in_either_order() {
    let dir = scratch("two-copies");
    let a = library_in(&dir.join("a"), None);
    let b = library_in(&dir.join("b"), None);
    for (first, second) in [(&a, &b), (&b, &a)] {
        let preload = format!("{}:{}", first.display(), second.display());
        let o = allocate(
            &dir,
            &preload,
            &[("GPUCAP_LIMIT", "1Gi"), ("GPUCAP_LOG", "debug")],
        );
        capped_once(&o, &preload, true);
        let idle = format!(
            "another copy of libgpucap.so is loaded (from {}): the one from {} caps",
            second.parent().unwrap().display(),
            first.parent().unwrap().display()
        );
        assert!(
            stderr(&o).contains(&idle),
            "{preload}: no line says which copy caps\n{}",
            dump(&o)
        );
    }
}

#[test]
fn a_file_beside_the_second_copy_is_the_ceiling_the_first_copy_holds() {
    let dir = scratch("two-copies-file");
    let users = library_in(&dir.join("user"), None);
    let operators = library_in(&dir.join("operator"), Some("GPUCAP_LIMIT=256Mi\n"));
    let preload = format!("{}:{}", users.display(), operators.display());
    // The environment asks more: held at the file's 256 MiB, said.
    let o = allocate(
        &dir,
        &preload,
        &[("GPUCAP_LIMIT", "4Gi"), ("GPUCAP_LOG", "debug")],
    );
    capped_once(&o, "GPUCAP_LIMIT=4Gi", true);
    let file = dir.join("operator/gpucap.env");
    assert!(
        stderr(&o).contains(&format!("256 MiB (from {})", file.display())),
        "the ceiling's line names the operator's file\n{}",
        dump(&o)
    );
    // No variable at all: the file beside the second copy is the configuration.
    let o = allocate(&dir, &preload, &[]);
    capped_once(&o, "no variable", false);
    // A file beside the first copy too, saying otherwise: refused at cuInit, both named.
    std::fs::write(dir.join("user/gpucap.env"), "GPUCAP_LIMIT=8Gi\n").unwrap();
    let o = allocate(&dir, &preload, &[]);
    assert_eq!(alloc_rc(&o, SMALL), None, "nothing served\n{}", dump(&o));
    let line = format!(
        "two copies of libgpucap.so are loaded, and the configuration files beside them differ ({} and {})",
        dir.join("user/gpucap.env").display(),
        file.display()
    );
    assert!(stderr(&o).contains(&line), "{}", dump(&o));
    // The same file beside both: it holds.
    std::fs::write(dir.join("user/gpucap.env"), "GPUCAP_LIMIT=256Mi\n").unwrap();
    capped_once(
        &allocate(&dir, &preload, &[]),
        "the same file beside both",
        false,
    );
}

#[test]
fn the_users_copy_before_the_operators_in_etc_ld_so_preload_keeps_the_operators_cap() {
    let dir = scratch("two-copies-etc");
    if !etc_overlay_works(&dir) {
        return;
    }
    let users = library_in(&dir.join("user"), None);
    let operators = library_in(&dir.join("operator"), Some("GPUCAP_LIMIT=256Mi\n"));
    let tmp = dir.join("etc-overlay");
    std::fs::create_dir_all(&tmp).unwrap();
    // /etc/ld.so.preload names the operator's copy in a mount namespace of the test's own;
    // the program's LD_PRELOAD names the user's, which the loader puts first.
    let mut c = fake_cmd("unshare", &dir.join("stats.json"));
    c.args(["-rm", "sh", "-c"])
        .arg(
            "set -e; t=$1; op=$2; shift 2; \
             mount -t tmpfs none \"$t\"; mkdir -p \"$t/u\" \"$t/w\"; \
             echo \"$op\" > \"$t/u/ld.so.preload\"; \
             mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$t/u\",workdir=\"$t/w\" /etc; \
             exec \"$@\"",
        )
        .arg("sh")
        .arg(&tmp)
        .arg(&operators)
        .arg(script())
        .args([format!("alloc:{SMALL}"), format!("alloc:{GIB}")])
        .env("LD_PRELOAD", &users)
        .env("GPUCAP_LIMIT", "4Gi")
        .env("GPUCAP_LOG", "debug")
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"));
    let o = run(&mut c);
    capped_once(
        &o,
        "the user's LD_PRELOAD beside the operator's /etc/ld.so.preload",
        true,
    );
    let idle = format!(
        "another copy of libgpucap.so is loaded (from {})",
        dir.join("operator").display()
    );
    assert!(
        stderr(&o).contains(&idle),
        "the operator's copy stays idle, said\n{}",
        dump(&o)
    );
    assert!(
        stderr(&o).contains("runs at the ceiling"),
        "the 4 GiB asked is held at the operator's 256 MiB, said\n{}",
        dump(&o)
    );
}
