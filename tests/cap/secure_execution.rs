//! A set-user-ID program (secure execution: `AT_SECURE`) that the library reaches
//! through `/etc/ld.so.preload`, started by another user: the environment is that
//! user's, the program runs as root. A path the environment names is never used as
//! root: `GPUCAP_REPORT` pointing at a file of root's leaves the file as it was, and
//! the cap still holds. `/etc` is never written: the test runs in a mount namespace of
//! its own (`unshare -m`, as root) where an overlay adds `ld.so.preload`.

use super::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// `dir` and the files the test puts there, readable and runnable by anyone.
fn open_to_all(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_set_user_id_program_writes_no_path_its_environment_names() {
    if !as_root("a set-user-ID program started by another user") || !unshare_works() {
        return;
    }
    let (dir, lib, fake, program) = set_up("secure", "script", &["-lcuda"]);
    let victim = dir.join("victim");
    std::fs::write(&victim, b"root's file\n").unwrap();
    open_to_all(&victim, 0o644);
    let stats = dir.join("stats.json");
    // The C library ignores LD_LIBRARY_PATH and LD_PRELOAD in secure execution: the
    // fake driver comes through ld.so.preload as well, after the shim.
    let mut inner = fake_cmd(&program, &stats);
    inner
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "256Mi")
        .env("GPUCAP_REPORT", &victim)
        .args([
            format!("alloc:{}", 200 * MIB),
            format!("alloc:{}", 1024 * MIB),
        ])
        .current_dir(&dir);
    let o = with_preload_as_nobody(&dir, &lib, &fake, &inner);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("alloc {} 0", 200 * MIB))
            && out.contains(&format!("alloc {} 2", 1024 * MIB)),
        "the cap holds in a set-user-ID program\n{}",
        dump(&o)
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "root's file\n",
        "a file of root's replaced by the report of a user's choosing\n{}",
        dump(&o)
    );
    assert!(
        stderr(&o).contains("GPUCAP_REPORT ignored"),
        "the line\n{}",
        dump(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory under /tmp (every directory on the way may be passed by uid 65534) with a
/// copy of the library, of the fake driver, and of tests/c/`program`.c built with
/// `extra`, made set-user-ID root: (the directory, the library, the fake, the program).
fn set_up(tag: &str, program: &str, extra: &[&str]) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("gpucap-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("overlay")).unwrap();
    open_to_all(&dir, 0o755);
    let lib = dir.join("libgpucap.so");
    std::fs::copy(shim(), &lib).unwrap();
    let fake = dir.join("libcuda.so.1");
    std::fs::copy(fake_lib_dir().join("libcuda.so.1"), &fake).unwrap();
    let copy = dir.join(program);
    std::fs::copy(compile_c(program, "", extra), &copy).unwrap();
    open_to_all(&copy, 0o4755);
    (dir, lib, fake, copy)
}

/// `inner` run as uid 65534 in a mount namespace of its own whose `/etc/ld.so.preload`
/// (an overlay in `dir/overlay`) preloads `lib` and then the fake driver `fake`.
fn with_preload_as_nobody(
    dir: &Path,
    lib: &Path,
    fake: &Path,
    inner: &std::process::Command,
) -> std::process::Output {
    let mut ns = std::process::Command::new("unshare");
    ns.args(["-m", "sh", "-c"])
        .arg(
            "set -e; t=$1; lib=$2; fake=$3; shift 3; \
             mount -t tmpfs none \"$t\"; mkdir -p \"$t/u\" \"$t/w\"; \
             printf '%s\\n%s\\n' \"$lib\" \"$fake\" > \"$t/u/ld.so.preload\"; \
             mount -t overlay overlay -o lowerdir=/etc,upperdir=\"$t/u\",workdir=\"$t/w\" /etc; \
             exec \"$@\"",
        )
        .arg("sh")
        .arg(dir.join("overlay"))
        .arg(lib)
        .arg(fake)
        .args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]);
    run(&mut wrap(ns, inner))
}

/// A set-user-ID program that becomes root and starts a program with an environment of
/// its own making (as `su` and `sudo` do) hands none of the starting user's variables to
/// it (`hand_down.rs`): before, the user's `GPUCAP_REPORT` reached the child, which runs
/// as root and not in secure execution, and root wrote the report where the user named.
#[test]
fn a_set_user_id_program_hands_its_users_variables_to_no_child() {
    if !as_root("a set-user-ID program started by another user") || !unshare_works() {
        return;
    }
    let (dir, lib, fake, program) = set_up("secure-child", "exec_edges", &[]);
    assert_child_has_none_of_the_users_variables(
        &dir,
        &lib,
        &fake,
        &program,
        &["as-root", "/usr/bin/env"],
    );
}

/// The same where the exec happens in a library's constructor, before gpucap's own
/// load-time code has run (whether the process runs in secure execution is asked at each
/// `exec`: a flag set at gpucap's load was still unset there, and the user's variables
/// reached the child, a review found).
#[test]
fn a_set_user_id_programs_library_that_execs_first_hands_down_nothing() {
    if !as_root("a set-user-ID program started by another user") || !unshare_works() {
        return;
    }
    let (dir, lib, fake, _) = set_up("secure-ctor", "exec_edges", &[]);
    let so = dir.join("libctor_exec.so");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&so)
        .arg(root().join("tests/c/libctor_exec.c"))
        .status()
        .unwrap();
    assert!(status.success(), "cc libctor_exec.so");
    open_to_all(&so, 0o755);
    let program = dir.join("ctor_main");
    let main = dir.join("main.c");
    std::fs::write(&main, "int main(void) { return 3; }\n").unwrap();
    let status = std::process::Command::new("cc")
        .arg("-o")
        .arg(&program)
        .arg(&main)
        .arg("-L")
        .arg(&dir)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .args(["-Wl,--no-as-needed", "-lctor_exec"])
        .status()
        .unwrap();
    assert!(status.success(), "cc ctor_main");
    open_to_all(&program, 0o4755);
    assert_child_has_none_of_the_users_variables(&dir, &lib, &fake, &program, &[]);
}

/// `program ARGS` (set-user-ID root in `dir`, whose child is `/usr/bin/env` run as root
/// with PATH alone) run as uid 65534 with the user's `GPUCAP_LIMIT` and `GPUCAP_REPORT`:
/// the child's environment holds PATH and none of them. Removes `dir`.
fn assert_child_has_none_of_the_users_variables(
    dir: &Path,
    lib: &Path,
    fake: &Path,
    program: &Path,
    args: &[&str],
) {
    let stats = dir.join("stats.json");
    let mut inner = fake_cmd(program, &stats);
    inner
        .env("GPUCAP_LIMIT", "256Mi")
        .env("GPUCAP_REPORT", dir.join("victim"))
        .args(args)
        .current_dir(dir);
    let o = with_preload_as_nobody(dir, lib, fake, &inner);
    assert!(o.status.success(), "{}", dump(&o));
    assert!(
        stdout(&o).lines().any(|l| l == "PATH=/usr/bin:/bin"),
        "the child's environment\n{}",
        dump(&o)
    );
    assert!(
        !stdout(&o).contains("GPUCAP_"),
        "the user's variables reached a child of root's\n{}",
        dump(&o)
    );
    let _ = std::fs::remove_dir_all(dir);
}
