//! No shared file crashes or uncaps a program, and root's readers trust no directory
//! another user made (docs/src/threat-model.md): files allocated whole when made (a full
//! tmpfs is an error at creation, never a SIGBUS), a lone process's cap kept in its own
//! memory (its visible `.lone` file a copy), root's `status` reading only `gpucap-UID`
//! directories owned by UID.

use super::common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::pool_scratch::{Scratch, script};
use common::*;

/// Whether this process may make a mount namespace and mount a tmpfs in it (root):
/// false after a SKIPPED line, or a panic where the test must run (`required_here`).
fn mounts_work() -> bool {
    let why = match Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"])
        .output()
    {
        Ok(o) if o.status.success() => return true,
        Ok(o) => format!(
            "`unshare -m` + `mount -t tmpfs` failed ({}: {}): it needs root (CAP_SYS_ADMIN)",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("no `unshare` ({e}): it is util-linux's"),
    };
    assert!(
        !required_here(),
        "the full-tmpfs tests must run in CI (CI or GPUCAP_TEST_REQUIRE_CLIENTS=1 is set): {why}"
    );
    eprintln!("SKIPPED: {why}");
    false
}

/// `cmd` run in a mount namespace of its own where `dir` is a small tmpfs, every block of
/// it taken by a file before `cmd` starts (its `gpucap-UID` directory made first, as
/// gpucap makes it): what a full `/dev/shm` looks like to a program.
fn on_full_tmpfs(cmd: &Command, dir: &Path) -> Output {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let fill = format!(
        "mount -t tmpfs -o size=256k tmpfs \"$0\" && mkdir -m 700 \"$0/gpucap-{uid}\" && \
         (dd if=/dev/zero of=\"$0/fill\" bs=4k 2>/dev/null; true) && \
         [ \"$(df --output=avail \"$0\" | tail -1 | tr -d ' ')\" = 0 ] && exec \"$@\""
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "sh", "-c", &fill])
        .arg(dir)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    run(&mut c)
}

fn no_signal(o: &Output) {
    assert_eq!(o.status.signal(), None, "killed by a signal\n{}", dump(o));
}

#[test]
fn a_lone_process_on_a_full_tmpfs_runs_capped_without_its_file() {
    if !mounts_work() {
        return;
    }
    let s = Scratch::new("full-lone");
    let cmd = s.gpucap(&[
        "run",
        "--limit",
        "256Mi",
        "--",
        script().to_str().unwrap(),
        "alloc:100Mi",
        "alloc:1Gi",
    ]);
    let o = on_full_tmpfs(&cmd, &s.pools);
    no_signal(&o);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("alloc {} 0", 100 * MIB)),
        "{}",
        dump(&o)
    );
    assert!(
        out.contains(&format!("alloc {} 2", 1 << 30)),
        "1 GiB refused under 256 MiB\n{}",
        dump(&o)
    );
    assert!(
        stderr(&o).contains("will not show in gpucap status"),
        "a line says why it is not shown\n{}",
        dump(&o)
    );
}

#[test]
fn a_pool_member_on_a_full_tmpfs_is_refused_at_cuinit_with_a_line() {
    if !mounts_work() {
        return;
    }
    let s = Scratch::new("full-pool");
    let cmd = s.gpucap(&[
        "run",
        "--limit",
        "256Mi",
        "--pool",
        "train",
        "--",
        script().to_str().unwrap(),
        "alloc:100Mi",
    ]);
    let o = on_full_tmpfs(&cmd, &s.pools);
    no_signal(&o);
    assert!(!o.status.success(), "refused\n{}", dump(&o));
    let err = stderr(&o);
    assert!(
        err.contains("gpucap: cannot join the pool train") && err.contains("cannot allocate"),
        "the line says the file system is full\n{}",
        dump(&o)
    );
    assert!(
        !stdout(&o).contains("alloc "),
        "nothing allocated outside the pool\n{}",
        dump(&o)
    );
}

/// `gpucap check` says a pool's file cannot be made where its file system is full (a
/// named pool, and the container's pool a driver's grant puts a process in), as the
/// first member would be refused at `cuInit`; before, check said the pool was fine
/// ("not made yet, the first process that uses CUDA makes it").
#[test]
fn check_says_a_pool_file_cannot_be_made_on_a_full_tmpfs() {
    if !mounts_work() {
        return;
    }
    for (what, env) in [
        (
            "a named pool",
            vec![("GPUCAP_LIMIT", "256Mi"), ("GPUCAP_POOL", "train")],
        ),
        (
            "the container's pool",
            vec![("GPU_DEVICE_0", "gpu-0"), ("GPU_DEVICE_0_MEMORY", "256Mi")],
        ),
    ] {
        let s = Scratch::new("full-check");
        let mut cmd = s.gpucap(&["check"]);
        cmd.envs(env);
        let o = on_full_tmpfs(&cmd, &s.pools);
        no_signal(&o);
        assert!(!o.status.success(), "{what}: check failed\n{}", dump(&o));
        let err = stderr(&o);
        assert!(
            err.contains("cannot be made") && err.contains("has no room for its"),
            "{what}: the line says the file system is full\n{}",
            dump(&o)
        );
        // With room, check is content and has made nothing.
        let o = run(&mut cmd);
        assert_ok(&o);
        assert!(stdout(&o).contains("not made yet"), "{what}\n{}", dump(&o));
        assert_eq!(
            std::fs::read_dir(&s.pools).unwrap().count(),
            0,
            "{what}: made nothing"
        );
    }
}

/// `program` run alone under a 256 MiB cap (`gpucap run --limit 256Mi --`), its output
/// piped.
fn capped_alone(s: &Scratch, program: &[&str]) -> std::process::Child {
    let mut args = vec!["run", "--limit", "256Mi", "--"];
    args.extend_from_slice(program);
    s.gpucap(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The `.lone` files of `s`'s pool directory.
fn lone_files(s: &Scratch) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for d in std::fs::read_dir(&s.pools).unwrap().filter_map(Result::ok) {
        if let Ok(entries) = std::fs::read_dir(d.path()) {
            found.extend(
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|e| e == "lone")),
            );
        }
    }
    found
}

#[test]
fn a_rewritten_lone_file_changes_nothing_the_shim_decides() {
    use std::os::unix::fs::FileExt;
    let s = Scratch::new("lone-rewritten");
    let (ready, go) = (s.dir.join("ready"), s.dir.join("go"));
    let mut child = capped_alone(
        &s,
        &[
            script().to_str().unwrap(),
            "alloc:200Mi",
            &format!("touch:{}", ready.display()),
            &format!("wait:{}", go.display()),
            "alloc:1Gi",
            "alloc:100Mi",
        ],
    );
    wait_ready(&mut child, &ready, "the lone process");
    let files = lone_files(&s);
    assert_eq!(files.len(), 1, "{files:?}");
    // Another process of the same user: GPU 0's cap word 64 GiB, its use 0.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0])
        .unwrap();
    f.write_all_at(&(64u64 << 30).to_le_bytes(), 0).unwrap();
    f.write_all_at(&0u64.to_le_bytes(), 8).unwrap();
    // `status` shows the process's own figures, not what was written.
    let st = run(&mut s.gpucap(&["status", "--json"]));
    assert_ok(&st);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&st)).unwrap();
    let gpu = &doc["lone"][0]["gpus"][0];
    assert_eq!(
        (gpu["cap"].as_u64(), gpu["used"].as_u64()),
        (Some(256 * MIB), Some(200 * MIB)),
        "{doc}"
    );
    std::fs::write(&go, "").unwrap();
    let o = child.wait_with_output().unwrap();
    no_signal(&o);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("alloc {} 2", 1u64 << 30)),
        "1 GiB refused under 256 MiB whatever the file says\n{}",
        dump(&o)
    );
    assert!(
        out.contains(&format!("alloc {} 2", 100 * MIB)),
        "200 MiB held: 100 MiB more is past 256 MiB although the file says 0 used\n{}",
        dump(&o)
    );
}

#[test]
fn a_stale_temporary_lone_file_of_the_same_pid_is_replaced() {
    // A process that died making its file left its temporary name; a later process
    // with the same pid (here: the shell's, which execs the program) makes its own.
    use std::os::unix::fs::DirBuilderExt;
    let s = Scratch::new("lone-stale-tmp");
    // SAFETY: geteuid has no preconditions.
    let dir = s
        .pools
        .join(format!("gpucap-{}", unsafe { libc::geteuid() }));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    let ns = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
    let (ready, go) = (s.dir.join("ready"), s.dir.join("go"));
    let stale = format!("\"$0/.$$-{ns}.lone.$(printf %x $$).new\"");
    let mut child = capped_alone(
        &s,
        &[
            "sh",
            "-c",
            &format!("echo stale > {stale} && exec \"$@\""),
            dir.to_str().unwrap(),
            script().to_str().unwrap(),
            "alloc:100Mi",
            &format!("touch:{}", ready.display()),
            &format!("wait:{}", go.display()),
        ],
    );
    wait_ready(&mut child, &ready, "the lone process");
    let pid = child.id();
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let st = run(&mut s.gpucap(&["status", "--json"]));
    std::fs::write(&go, "").unwrap();
    let o = child.wait_with_output().unwrap();
    assert_ok(&o);
    assert_eq!(
        names,
        vec![format!("{pid}-{ns}.lone")],
        "the stale temporary name is replaced by the process's file\n{}",
        dump(&o)
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout(&st)).unwrap();
    assert_eq!(doc["lone"][0]["pid"].as_u64(), Some(pid as u64), "{doc}");
}

#[test]
fn roots_status_reads_no_squatted_directory_and_follows_no_link() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !required_here(),
            "the squatted-directory test reads as root: run the tests as root in CI"
        );
        eprintln!("SKIPPED: reading every user's directory is root's");
        return;
    }
    let s = Scratch::new("squatted");
    let mut member = s.member("train", "member", &["alloc:200Mi"]);
    let own = s.pool_file("train");
    // uid 4242 made `gpucap-1000` (not its own uid) and put a pool file there.
    let squat = s.pools.join("gpucap-1000");
    std::fs::create_dir(&squat).unwrap();
    std::fs::copy(&own, squat.join("evil.pool")).unwrap();
    for p in [&squat, &squat.join("evil.pool")] {
        std::os::unix::fs::chown(p, Some(4242), Some(4242)).unwrap();
    }
    // A link in place of a pool file, in root's own directory and in a directory that
    // is itself a link to root's.
    std::os::unix::fs::symlink(&own, own.with_file_name("linked.pool")).unwrap();
    std::os::unix::fs::symlink(own.parent().unwrap(), s.pools.join("gpucap-77")).unwrap();
    // Garbage, a truncated file and a huge sparse one, skipped with a note.
    std::fs::write(own.with_file_name("garbage.pool"), vec![0x5a; 8192]).unwrap();
    std::fs::write(
        own.with_file_name("short.pool"),
        &std::fs::read(&own).unwrap()[..100],
    )
    .unwrap();
    std::fs::File::create(own.with_file_name("huge.pool"))
        .unwrap()
        .set_len(1 << 40)
        .unwrap();

    let o = run(&mut s.gpucap(&["status", "--json"]));
    let _ = member.kill();
    let _ = member.wait();
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names: Vec<&str> = doc["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["train"], "{doc}");
    assert_eq!(
        std::fs::metadata(&own).unwrap().uid(),
        0,
        "the real pool is root's"
    );
    let errors = doc["errors"].to_string();
    for name in ["garbage.pool", "short.pool", "huge.pool"] {
        assert!(errors.contains(name), "{name} skipped with a note\n{doc}");
    }
    let text = doc.to_string();
    assert!(!text.contains("gpucap-1000"), "{doc}");
    assert!(!text.contains("gpucap-77"), "{doc}");
}
