//! The pool (`GPUCAP_POOL`) in the command line: `gpucap status`, `gpucap top`,
//! `gpucap run --pool`, and the pool in `gpucap check` and `--write-env`.
//!
//! Members are tests/c/script.c processes started with `gpucap run --pool` on the fake
//! GPU; each test keeps its pools in its own scratch directory (GPUCAP_POOL_DIR).

use super::common;

use std::path::PathBuf;
use std::process::{Child, Output, Stdio};

use common::pool_scratch::*;
use common::*;

const MIB: u64 = 1 << 20;

/// SIGKILLs `child` and returns its output.
fn kill(mut child: Child) -> Output {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    child.wait_with_output().unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert_ok(o);
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}\n{}", dump(o)))
}

/// The member of `doc` (a `status --json` object) with pid `pid`.
fn member_of(doc: &serde_json::Value, pid: u32) -> &serde_json::Value {
    doc["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["pid"] == pid)
        .unwrap_or_else(|| panic!("no member with pid {pid} in {doc}"))
}

/// The table row of member `pid` in `gpucap status`'s output.
fn row(text: &str, pid: u32) -> &str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("no row for pid {pid} in\n{text}"))
}

#[test]
fn status_shows_a_dead_member_and_reading_changes_nothing() {
    let s = Scratch::new("pool-status");
    let a = s.member("t", "a", &["alloc:300Mi"]);
    let b = s.member("t", "b", &["alloc:200Mi"]);
    let (pid_a, pid_b) = (a.id(), b.id());
    // gpucap run execs the script: the member's pid is the child's.
    let b_out = kill(b);
    assert!(
        stdout(&b_out).contains(&format!("alloc {} 0", 200 * MIB)),
        "{}",
        dump(&b_out)
    );

    // One member alive, one killed: the table and the JSON say which, and the dead
    // one's bytes are the GPU's held_by_dead.
    let o = run(&mut s.gpucap(&["status", "--pool", "t"]));
    assert_ok(&o);
    let text = stdout(&o);
    assert!(
        text.starts_with(&format!(
            "pool {} (version 11, 256 member slots, ",
            s.pool_file("t").display()
        )),
        "{text}"
    );
    assert!(text.contains("members: 2 (1 alive, 1 dead)"), "{text}");
    let (ra, rb) = (row(&text, pid_a), row(&text, pid_b));
    assert!(ra.contains(" alive ") && ra.contains("300 MiB"), "{text}");
    assert!(rb.contains(" dead ") && rb.contains("200 MiB"), "{text}");
    // The command shows the program's file name, whatever the checkout's path.
    assert!(rb.contains(" script alloc:200Mi "), "the command\n{text}");
    // The GPU row: cap, used, peak, refusals, held by dead, guaranteed.
    let gpu = text.lines().nth(2).unwrap();
    let cols: Vec<&str> = gpu.split("  ").filter(|c| !c.is_empty()).collect();
    assert_eq!(
        cols[1..].iter().map(|c| c.trim()).collect::<Vec<_>>(),
        ["1 GiB", "500 MiB", "500 MiB", "0", "200 MiB", "0 B"],
        "{text}"
    );
    // Sorted by bytes: the 300 MiB member comes first.
    assert!(text.find(ra).unwrap() < text.find(rb).unwrap(), "{text}");

    let doc = json(&run(&mut s.gpucap(&["status", "--pool", "t", "--json"])));
    assert_eq!(doc["path"], s.pool_file("t").to_str().unwrap());
    assert_eq!(doc["version"], 11);
    assert_eq!(doc["slots"], 256);
    let g = &doc["gpus"][0];
    assert_eq!(g["cap"], 1u64 << 30);
    assert_eq!(g["used"], 500 * MIB);
    assert_eq!(g["held_by_dead"], 200 * MIB);
    assert!(g["uuid"].as_str().unwrap().starts_with("GPU-"));
    let (ma, mb) = (member_of(&doc, pid_a), member_of(&doc, pid_b));
    assert_eq!(ma["alive"], true);
    assert_eq!(mb["alive"], false);
    assert_eq!(mb["gpus"][0]["used"], 200 * MIB);
    assert_eq!(mb["gpus"][0]["peak"], 200 * MIB);
    assert_eq!(mb["gpus"][0]["uuid"], g["uuid"]);
    assert!(
        mb["command"]
            .as_str()
            .unwrap()
            .starts_with("script alloc:200Mi touch:"),
        "{mb}"
    );
    assert!(mb["start_ms"].as_u64().unwrap() > 0);

    // Now every member is dead: nobody could take the shares back, so any change to
    // the file would be the readers'. status, status --json, top and check read it;
    // the file is the same bytes afterwards, and still shows the dead shares.
    let _ = kill(a);
    let before = std::fs::read(s.pool_file("t")).unwrap();
    for args in [
        &["status", "--pool", "t"][..],
        &["status", "--pool", "t", "--json"],
        &[
            "top",
            "--pool",
            "t",
            "--iterations",
            "2",
            "--interval",
            "0.2",
        ],
        &["check", "--pool", "t"],
    ] {
        assert_ok(&run(&mut s.gpucap(args)));
    }
    let after = std::fs::read(s.pool_file("t")).unwrap();
    assert!(before == after, "reading the pool changed its file");
    let doc = json(&run(&mut s.gpucap(&["status", "--pool", "t", "--json"])));
    assert_eq!(doc["gpus"][0]["held_by_dead"], 500 * MIB);
    assert!(
        doc["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["alive"] == false),
        "{doc}"
    );
}

#[test]
fn the_pool_comes_from_the_environment_as_for_the_shim() {
    let s = Scratch::new("pool-env");
    let a = s.member("envpool", "a", &["alloc:100Mi"]);
    // GPUCAP_POOL (with GPUCAP_POOL_DIR) names it...
    let o = run(s.gpucap(&["status"]).env("GPUCAP_POOL", "envpool"));
    assert_ok(&o);
    assert!(row(&stdout(&o), a.id()).contains(" alive "), "{}", dump(&o));
    // ...and so does HAMi-core's variable, with the file's path.
    let file = s.pool_file("envpool");
    let o = run(s
        .gpucap(&["status", "--json"])
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &file));
    assert_eq!(json(&o)["path"], file.to_str().unwrap());
    // --pool wins over both.
    let o = run(s
        .gpucap(&["status", "--json", "--pool", file.to_str().unwrap()])
        .env("GPUCAP_POOL", "other")
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/nowhere/x.cache"));
    assert_eq!(member_of(&json(&o), a.id())["alive"], true);
    // A process without any GPUCAP_* variable reads gpucap.env beside the library,
    // as the shim does (a `docker exec` shell in a container the entrypoint started).
    let home = s.dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::copy(cli(), home.join("gpucap")).unwrap();
    std::fs::copy(shim(), home.join("libgpucap.so")).unwrap();
    std::fs::write(
        home.join("gpucap.env"),
        format!(
            "GPUCAP_POOL=envpool\nGPUCAP_POOL_DIR={}\n",
            s.pools.display()
        ),
    )
    .unwrap();
    let o = run(fake_cmd(home.join("gpucap"), &s.dir.join("s.json")).args(["status", "--json"]));
    assert_eq!(json(&o)["path"], file.to_str().unwrap());
    // So does it when other GPUCAP_* variables are set but none names a pool: the
    // container's configured environment, as `docker exec CONTAINER gpucap top` has it.
    let o = run(fake_cmd(home.join("gpucap"), &s.dir.join("s.json"))
        .args(["status", "--json"])
        .env("GPUCAP_LIMIT", "1Gi"));
    assert_eq!(json(&o)["path"], file.to_str().unwrap());
    // But a pool the environment turns off is off: every process is shown instead.
    let o = run(fake_cmd(home.join("gpucap"), &s.dir.join("s.json"))
        .args(["status", "--json"])
        .env("GPUCAP_POOL", "off")
        .env("GPUCAP_POOL_DIR", &s.pools));
    let doc = json(&o);
    assert!(
        doc.get("path").is_none() && doc["processes"].is_array(),
        "{doc}"
    );
    let _ = kill(a);
}

#[test]
fn status_errors_say_what_is_wrong() {
    let s = Scratch::new("pool-errors");
    // No pool configured: every capped process is shown (here none).
    for cmd in [&["status"][..], &["top", "--once"]] {
        let o = run(&mut s.gpucap(cmd));
        assert_ok(&o);
        assert!(
            stdout(&o).contains("no capped process")
                || stdout(&o).contains(" 0 processes, 0 pools"),
            "{}",
            dump(&o)
        );
    }
    // GPUCAP_POOL=off is no pool either.
    let o = run(s.gpucap(&["status"]).env("GPUCAP_POOL", "off"));
    assert_ok(&o);
    assert!(stdout(&o).starts_with("no capped process"), "{}", dump(&o));
    // A pool no process joined: exit 1, whether its directory exists or not.
    for _ in 0..2 {
        let o = run(&mut s.gpucap(&["status", "--pool", "nobody"]));
        assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
        assert_eq!(
            stderr(&o),
            format!(
                "gpucap: no pool file at {} (no process has joined it yet)\n",
                s.pool_file("nobody").display()
            )
        );
        let o = run(&mut s.gpucap(&["top", "--pool", "nobody", "--iterations", "1"]));
        assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
        std::fs::create_dir_all(s.pool_file("nobody").parent().unwrap()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            s.pool_file("nobody").parent().unwrap(),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
    }
    // A bad value of --pool or of the variable: exit 2, named.
    let o = run(&mut s.gpucap(&["status", "--pool", "no good"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).starts_with("gpucap: invalid --pool=\"no good\": not a pool name"),
        "{}",
        dump(&o)
    );
    let o = run(s.gpucap(&["status"]).env("GPUCAP_POOL", "rel/path"));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).starts_with("gpucap: invalid GPUCAP_POOL=\"rel/path\""),
        "{}",
        dump(&o)
    );
}

/// A pool file made by a member, then copied to `name` in the same directory with
/// `edit` applied to its bytes.
fn damaged(s: &Scratch, name: &str, edit: impl Fn(&mut Vec<u8>)) -> PathBuf {
    let good = s.pool_file("good");
    if !good.exists() {
        let _ = kill(s.member("good", "good", &["alloc:1Mi"]));
    }
    let mut bytes = std::fs::read(&good).unwrap();
    edit(&mut bytes);
    let path = good.with_file_name(format!("{name}.pool"));
    std::fs::write(&path, bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[test]
fn a_file_that_is_not_a_readable_pool_is_an_error() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("pool-bad");
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            damaged(&s, "magic", |b| b[..8].copy_from_slice(b"NOTAPOOL")),
            "it is not a gpucap pool file (it starts with \"NOTAPOOL\"",
        ),
        (
            damaged(&s, "version", |b| b[8] = 12),
            "it is a version 12 pool file and this gpucap reads version 11",
        ),
        (
            damaged(&s, "corrupt", |b| b[16] ^= 0xff),
            "it is corrupted (geometry word",
        ),
        (
            damaged(&s, "short", |b| b.truncate(4096)),
            "it is 4096 bytes long",
        ),
    ];
    let open = damaged(&s, "open", |_| {});
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut cases = cases;
    cases.push((open, "it is writable by group or others (mode 666)"));
    for (path, what) in &cases {
        let before = std::fs::read(path).unwrap();
        for args in [
            &["status"][..],
            &["status", "--json"],
            &["top", "--iterations", "1"],
        ] {
            let mut c = s.gpucap(args);
            c.arg("--pool").arg(path);
            let o = run(&mut c);
            assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
            let err = stderr(&o);
            assert!(
                err.starts_with(&format!("gpucap: the pool file {}: {what}", path.display())),
                "{what}\n{}",
                dump(&o)
            );
            assert_eq!(err.lines().count(), 1, "{}", dump(&o));
            assert_eq!(stdout(&o), "");
        }
        // check refuses it as the shim would.
        let o = run(&mut s.gpucap(&["check", "--pool", path.to_str().unwrap()]));
        assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
        assert!(stderr(&o).contains(what), "{}", dump(&o));
        assert!(
            std::fs::read(path).unwrap() == before,
            "a reader changed {}",
            path.display()
        );
    }
}

#[test]
fn check_shows_the_pool_and_refuses_an_unsafe_directory() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("pool-check");
    // Not made yet: fine, and says where it will be.
    let o = run(&mut s.gpucap(&["check", "--pool", "c"]));
    assert_ok(&o);
    assert!(
        stdout(&o).lines().any(|l| l
            == format!(
                "pool: c (file {}: not made yet, the first process that uses CUDA makes it; \
                 processes that name it share one budget per GPU)",
                s.pool_file("c").display()
            )),
        "{}",
        dump(&o)
    );
    // With members: how many are alive.
    let a = s.member("c", "a", &["alloc:10Mi"]);
    let b = s.member("c", "b", &["alloc:10Mi"]);
    let _ = kill(b);
    // (The members' cap: another is refused, as the library refuses it at cuInit.)
    let o = run(s
        .gpucap(&["check"])
        .env("GPUCAP_POOL", "c")
        .env("GPUCAP_LIMIT", "1Gi"));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(&format!(
            "pool: c (file {}: 1 member alive, 1 dead;",
            s.pool_file("c").display()
        )),
        "{}",
        dump(&o)
    );
    let _ = kill(a);
    // No pool: one line says so.
    let o = run(&mut s.gpucap(&["check"]));
    assert_ok(&o);
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l == "pool: none (each process is capped alone)"),
        "{}",
        dump(&o)
    );
    // A per-user directory others can write in: check, run and status refuse it.
    let dir = s.pool_file("c").parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = s.dir.join("ran");
    for args in [
        vec!["check", "--pool", "c"],
        vec!["status", "--pool", "c"],
        vec![
            "run",
            "--pool",
            "c",
            "--",
            "sh",
            "-c",
            "touch \"$0\"",
            marker.to_str().unwrap(),
        ],
    ] {
        let o = run(&mut s.gpucap(&args));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains(&format!(
                "the pool directory {} is writable by group or others (mode 777)",
                dir.display()
            )),
            "{}",
            dump(&o)
        );
    }
    assert!(!marker.exists(), "run started the program");
    // A directory of another user (only root can make one here).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&dir, Some(12345), None).unwrap();
        let o = run(&mut s.gpucap(&["check", "--pool", "c"]));
        assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
        assert!(stderr(&o).contains("belongs to uid 12345"), "{}", dump(&o));
        std::os::unix::fs::chown(&dir, Some(0), None).unwrap();
    }
    // A missing GPUCAP_POOL_DIR: the shim would not make it, so check refuses it.
    let o = run(s
        .gpucap(&["check", "--pool", "c"])
        .env("GPUCAP_POOL_DIR", s.dir.join("missing")));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("GPUCAP_POOL_DIR="), "{}", dump(&o));
}

#[test]
fn run_pool_makes_processes_share_one_cap() {
    let s = Scratch::new("pool-run");
    let script = compile_c("script", "", &["-lcuda"]);
    let script = script.to_str().unwrap();
    // The command sees GPUCAP_POOL.
    let o = run(&mut s.gpucap(&[
        "run",
        "--pool",
        "shared",
        "--",
        "sh",
        "-c",
        "echo $GPUCAP_POOL",
    ]));
    assert_ok(&o);
    assert_eq!(stdout(&o), "shared\n");
    // Two processes under one 1 GiB pool: 600 MiB, then 600 MiB more is refused.
    let a = s.member("shared", "a", &["alloc:600Mi"]);
    let o = run(&mut s.gpucap(&[
        "run",
        "--limit",
        "1Gi",
        "--pool",
        "shared",
        "--",
        script,
        "alloc:600Mi",
        "alloc:400Mi",
    ]));
    assert_ok(&o);
    assert_eq!(
        stdout(&o)
            .lines()
            .filter(|l| l.starts_with("alloc "))
            .collect::<Vec<_>>(),
        [
            format!("alloc {} 2", 600 * MIB), // CUDA_ERROR_OUT_OF_MEMORY
            format!("alloc {} 0", 400 * MIB),
        ],
        "{}",
        dump(&o)
    );
    // Without the pool, the same process has the whole cap to itself.
    let o = run(&mut s.gpucap(&["run", "--limit", "1Gi", "--", script, "alloc:600Mi"]));
    assert!(
        stdout(&o).contains(&format!("alloc {} 0", 600 * MIB)),
        "{}",
        dump(&o)
    );
    let _ = kill(a);
    // A bad --pool never starts the program; --measure runs alone.
    let marker = s.dir.join("ran");
    for args in [
        vec![
            "run",
            "--pool",
            "a b",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
        vec![
            "run",
            "--measure",
            "--pool",
            "x",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    ] {
        let o = run(&mut s.gpucap(&args));
        assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", dump(&o));
    }
    assert!(!marker.exists());
}

#[test]
fn write_env_carries_the_pool() {
    let s = Scratch::new("pool-env-file");
    let file = s.dir.join("gpucap.env");
    let o = run(&mut s.gpucap(&[
        "check",
        "--pool",
        "p1",
        "--write-env",
        file.to_str().unwrap(),
    ]));
    assert_ok(&o);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.lines().any(|l| l == "GPUCAP_POOL=p1"), "{text}");
    assert!(
        text.lines()
            .any(|l| l == format!("GPUCAP_POOL_DIR={}", s.pools.display())),
        "{text}"
    );
    // HAMi-core's variable names the file: it is written as GPUCAP_POOL (the file holds
    // GPUCAP_* variables only), so environment-less processes join the same pool.
    let cache = s.dir.join("hami.cache");
    let o = run(s
        .gpucap(&["check", "--write-env", file.to_str().unwrap()])
        .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache));
    assert_ok(&o);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.lines()
            .any(|l| l == format!("GPUCAP_POOL={}", cache.display())),
        "{text}"
    );
}

#[test]
fn argument_errors_are_one_clear_line_and_status_2() {
    let s = Scratch::new("pool-args");
    for (args, line) in [
        (
            &["status", "--bogus"][..],
            "gpucap: unknown option '--bogus'",
        ),
        (&["top", "--json"], "gpucap: unknown option '--json'"),
        (
            &["top", "--interval", "0.1"],
            "gpucap: invalid --interval \"0.1\": out of range; a number of seconds from 0.2 to 60",
        ),
        (
            &["top", "--interval=soon"],
            "gpucap: invalid --interval \"soon\": a number of seconds from 0.2 to 60",
        ),
        (
            &["top", "--iterations", "0"],
            "gpucap: invalid --iterations \"0\": a whole number of snapshots, at least 1",
        ),
        (
            &["status", "now"],
            "gpucap: unexpected argument 'now' (status takes only options)",
        ),
    ] {
        let o = run(&mut s.gpucap(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        let err = stderr(&o);
        assert!(
            err.lines().next().unwrap_or("").starts_with(line),
            "{args:?}\n{}",
            dump(&o)
        );
        let topic = args[0];
        assert!(
            err.contains(&format!("(see 'gpucap help {topic}')")),
            "{}",
            dump(&o)
        );
        assert_eq!(stdout(&o), "");
    }
    // The help lists the new commands, and each has its own.
    let o = run(&mut s.gpucap(&["--help"]));
    assert_ok(&o);
    for l in [
        "gpucap status [--pool NAME|PATH | --all] [--json] [--uuid]",
        "gpucap top [--pool NAME|PATH] [--user NAME|UID] [--sort KEY] [--uuid]",
        "GPUCAP_POOL ",
        "GPUCAP_POOL_DIR ",
    ] {
        assert!(stdout(&o).contains(l), "{l}\n{}", dump(&o));
    }
    for (topic, first) in [
        (
            "status",
            "usage: gpucap status [--pool NAME|PATH | --all] [--json] [--uuid]",
        ),
        (
            "top",
            "usage: gpucap top [--pool NAME|PATH] [--user NAME|UID] [--sort KEY] [--uuid]",
        ),
    ] {
        for args in [vec!["help", topic], vec![topic, "--help"]] {
            let o = run(&mut s.gpucap(&args));
            assert_ok(&o);
            assert_eq!(stdout(&o).lines().next(), Some(first), "{}", dump(&o));
        }
    }
}

#[test]
fn top_prints_snapshots_separated_by_a_blank_line_when_not_on_a_terminal() {
    let s = Scratch::new("pool-top");
    let a = s.member("t", "a", &["alloc:64Mi"]);
    let o = run(&mut s.gpucap(&[
        "top",
        "--pool",
        "t",
        "--iterations",
        "3",
        "--interval",
        "0.2",
    ]));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        !out.contains('\x1b'),
        "no escape sequences into a pipe\n{out}"
    );
    // Each snapshot is a title line then the table; a blank line before the next.
    let frames: Vec<&str> = out.split("\n\ngpucap top  ").collect();
    let headers = out
        .lines()
        .filter(|l| l.starts_with("gpucap top  "))
        .count();
    assert_eq!(headers, 3, "{out}");
    assert_eq!(frames.len(), 3, "{out}");
    for f in frames {
        let pid = a.id().to_string();
        let r = f
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(pid.as_str()))
            .unwrap_or_else(|| panic!("no row\n{out}"));
        assert!(r.contains(" 64Mi "), "{out}");
        assert!(f.contains("; 1 alive, 0 dead"), "{out}");
    }
    let _ = kill(a);
}

/// A pseudo-terminal: (the master side, the path of the slave side).
fn pty() -> (std::fs::File, PathBuf) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain libc calls on a descriptor we own; ptsname's buffer is copied at once.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(
            master >= 0,
            "posix_openpt: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(master))
            .to_string_lossy()
            .into_owned();
        (std::fs::File::from_raw_fd(master), PathBuf::from(name))
    }
}

#[test]
fn top_redraws_the_screen_on_a_terminal() {
    use std::io::Read;
    let s = Scratch::new("pool-top-tty");
    let a = s.member("t", "a", &["alloc:32Mi"]);
    let (mut master, slave) = pty();
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&slave)
        .unwrap();
    let o = s
        .gpucap(&[
            "top",
            "--pool",
            "t",
            "--iterations",
            "2",
            "--interval",
            "0.2",
        ])
        .stdout(tty)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", dump(&o));
    // Everything it wrote is in the master's buffer (a few KiB); the slave is closed
    // once gpucap exited, so reading ends with EIO after it.
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let out = String::from_utf8_lossy(&out);
    // Each snapshot starts at the top left (the first clears the screen); none is
    // separated by a blank line.
    assert_eq!(out.matches("\x1b[H").count(), 2, "{out:?}");
    assert_eq!(out.matches("\x1b[2J").count(), 1, "{out:?}");
    assert!(out.starts_with("\x1b[H\x1b[2Jgpucap top  "), "{out:?}");
    assert!(out.contains("every 0.2s"), "{out:?}");
    assert!(
        !out.contains("\n\n\x1b") && !out.contains("\r\n\r\n\x1b"),
        "{out:?}"
    );
    assert!(out.contains(" 32Mi "), "{out:?}");
    let _ = kill(a);
}

/// The stable fields of `gpucap status --json`, by object: the schema the documentation
/// promises (the `--json` table of "Watching a pool"). Adding a field means adding it
/// here and to that table.
const STATUS_JSON_FIELDS: &[(&str, &[&str])] = &[
    (
        "",
        &["path", "version", "slots", "created", "gpus", "members"],
    ),
    (
        "gpus[]",
        &[
            "uuid",
            "cap",
            "used",
            "peak",
            "refusals",
            "largest_refused",
            "held_by_dead",
            "waiters",
            "waits",
            "wait_ms",
            "members_hold",
            "drift",
            "cap_drift",
            "lock",
            "guaranteed",
            "share_drift",
        ],
    ),
    (
        "members[]",
        &[
            "slot",
            "pid",
            "uid",
            "pid_namespace",
            "command",
            "start_ms",
            "alive",
            "held_by_children",
            "gpus",
        ],
    ),
    (
        "members[].gpus[]",
        &[
            "uuid",
            "used",
            "peak",
            "guarantee",
            "ceiling",
            "borrowed",
            "ceiling_from",
        ],
    ),
];

/// The keys of a JSON object, sorted.
fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
    k.sort();
    k
}

/// The Markdown files that may hold the `--json` table: the README and the docs book.
fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files
}

/// `status --json` has exactly the documented fields, in every object, and the
/// documentation's table names each of them in its row.
#[test]
fn status_json_fields_are_the_documented_schema() {
    let s = Scratch::new("pool-schema");
    let a = s.member("t", "a", &["alloc:64Mi"]);
    let doc = json(&run(&mut s.gpucap(&["status", "--pool", "t", "--json"])));
    let _ = kill(a);
    let want = |group: &str| {
        let mut f: Vec<String> = STATUS_JSON_FIELDS
            .iter()
            .find(|(g, _)| *g == group)
            .unwrap()
            .1
            .iter()
            .map(|s| s.to_string())
            .collect();
        f.sort();
        f
    };
    assert_eq!(keys(&doc), want(""), "{doc}");
    assert_eq!(keys(&doc["gpus"][0]), want("gpus[]"), "{doc}");
    assert_eq!(keys(&doc["members"][0]), want("members[]"), "{doc}");
    assert_eq!(
        keys(&doc["members"][0]["gpus"][0]),
        want("members[].gpus[]"),
        "{doc}"
    );

    // The table: a row per top-level field, `gpus[]` and `members[]` naming theirs.
    let (file, text) = doc_files()
        .into_iter()
        .filter_map(|f| Some((f.clone(), std::fs::read_to_string(&f).ok()?)))
        .find(|(_, t)| t.lines().any(|l| l.starts_with("| `members[]` |")))
        .expect("a documentation table with a `members[]` row");
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("{}: no row for `{name}`", file.display()))
            .to_string()
    };
    for field in want("") {
        let name = if field == "gpus" || field == "members" {
            format!("{field}[]")
        } else {
            field
        };
        row(&name);
    }
    let members = row("members[]");
    for (row_text, group) in [
        (row("gpus[]"), "gpus[]"),
        (members.clone(), "members[]"),
        (members, "members[].gpus[]"),
    ] {
        for field in want(group) {
            assert!(
                row_text.contains(&format!("`{field}`"))
                    || row_text.contains(&format!("`{field}[]`")),
                "{}: the {group} row does not name `{field}`:\n{row_text}",
                file.display()
            );
        }
    }
}

/// A request larger than the member's own cap is a refusal the program sees like any
/// other: in a pool the pool's rule decides it (the pool's cap may have been raised since
/// the member set its own), with the pool's line, and the pool counts it, in `status`
/// and in `gpucap_pool_refusals_total`.
#[test]
fn a_refusal_by_the_members_own_cap_counts_in_the_pools_refusals() {
    let s = Scratch::new("pool-own-refusal");
    let a = s.member("t", "a", &["alloc:64Mi"]);
    // 1.5 GiB against a 1 GiB cap.
    let o = s.once("t", &["alloc:1536Mi"]);
    assert!(
        stdout(&o).contains(&format!("alloc {} 2", 1536 * MIB)),
        "{}",
        dump(&o)
    );
    assert!(
        stderr(&o).contains(
            "refused cuMemAlloc of 1.5 GiB on GPU 0: 64 MiB of the pool's 1 GiB cap in use, 0 B \
             of it by this process"
        ),
        "{}",
        dump(&o)
    );
    let doc = json(&run(&mut s.gpucap(&["status", "--pool", "t", "--json"])));
    let g = &doc["gpus"][0];
    assert_eq!(g["refusals"], 1, "{doc}");
    assert_eq!(g["largest_refused"], 1536 * MIB, "{doc}");
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--pool", "t"]));
    assert_ok(&o);
    let line = stdout(&o)
        .lines()
        .find(|l| l.starts_with("gpucap_pool_refusals_total{"))
        .map(String::from)
        .unwrap_or_default();
    assert!(line.ends_with(" 1"), "{line}\n{}", dump(&o));
    let _ = kill(a);
}

/// Runs `c` and fails the test if it has not exited within 30 s (it is killed then):
/// proof that it does not hang.
fn run_within_30s(c: &mut std::process::Command) -> Output {
    use std::time::{Duration, Instant};
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let o = kill(child);
            panic!("{c:?} still ran after 30 s: it hangs\n{}", dump(&o));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_fifo_at_the_pools_path_is_refused_by_every_reader_without_waiting() {
    let s = Scratch::new("pool-fifo-cli");
    let path = s.fifo_pool("fifo");
    let what = format!(
        "gpucap: the pool file {}: it is not a regular file",
        path.display()
    );
    for args in [
        &["status", "--pool", "fifo"][..],
        &["status", "--json", "--pool", "fifo"],
        &["top", "--iterations", "1", "--pool", "fifo"],
    ] {
        let o = run_within_30s(&mut s.gpucap(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert_eq!(stderr(&o).trim_end(), what, "{args:?}\n{}", dump(&o));
        assert_eq!(stdout(&o), "");
    }
    let o = run_within_30s(&mut s.gpucap(&["check", "--pool", "fifo"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains("it is not a regular file"),
        "{}",
        dump(&o)
    );
    // The shim refuses it too: CUDA fails closed with one line.
    let script = script();
    let o = run_within_30s(&mut s.gpucap(&[
        "run",
        "--limit",
        "1Gi",
        "--pool",
        "fifo",
        "--",
        script.to_str().unwrap(),
        "alloc:1Mi",
    ]));
    assert!(stdout(&o).contains("cuInit 800"), "{}", dump(&o));
    assert!(
        stderr(&o).contains("it is not a regular file"),
        "{}",
        dump(&o)
    );
}

/// Word `i` of pool file `path` (src/core/budget/layout.rs), written as another
/// process of the same user could.
fn write_word(path: &std::path::Path, i: usize, value: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&value.to_le_bytes(), i as u64 * 8).unwrap();
}

#[test]
fn status_says_when_used_differs_from_what_the_members_hold_and_a_refusal_recounts_it() {
    let s = Scratch::new("pool-drift");
    let a = s.member("t", "a", &["alloc:300Mi"]);
    let status = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--pool", "t"]);
        run(&mut s.gpucap(&all))
    };
    let doc = json(&status(&["status", "--json"]));
    assert_eq!(doc["gpus"][0]["drift"], 0, "{doc}");
    assert_eq!(doc["gpus"][0]["members_hold"], 300 * MIB);
    // Another process of the same user zeroes GPU 0's `used` (word 4 of its entry).
    write_word(&s.pool_file("t"), 16 + 4, 0);
    let o = status(&["status"]);
    assert_ok(&o);
    let uuid = doc["gpus"][0]["uuid"].as_str().unwrap();
    assert!(
        stdout(&o).contains(&format!(
            "drift on {uuid}: the pool file counts 0 B in use, its members hold 300 MiB"
        )),
        "{}",
        dump(&o)
    );
    let doc = json(&status(&["status", "--json"]));
    assert_eq!(doc["gpus"][0]["drift"], -(300 * MIB as i64), "{doc}");
    let o = status(&["status", "--prometheus"]);
    assert!(
        stdout(&o).contains(&format!(
            "gpucap_pool_drift_bytes{{pool=\"t\",user=\"{}\",gpu_uuid=\"{uuid}\"}} -{}",
            own_user(),
            300 * MIB
        )),
        "{}",
        dump(&o)
    );
    // Raised instead: the next refusal recounts it, with one line, and finds room.
    write_word(&s.pool_file("t"), 16 + 4, 1 << 30);
    let doc = json(&status(&["status", "--json"]));
    assert_eq!(
        doc["gpus"][0]["drift"],
        (1 << 30) - 300 * MIB as i64,
        "{doc}"
    );
    let o = s.once("t", &["alloc:100Mi"]);
    assert!(
        stdout(&o).contains(&format!("alloc {} 0", 100 * MIB)),
        "{}",
        dump(&o)
    );
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "the pool file said {} bytes in use on GPU entry 0, its members hold {}: recounted",
            1u64 << 30,
            300 * MIB
        )),
        "{}",
        dump(&o)
    );
    let doc = json(&status(&["status", "--json"]));
    assert_eq!(doc["gpus"][0]["drift"], 0, "{doc}");
    assert_eq!(doc["gpus"][0]["used"], 300 * MIB);
    kill(a);
}
