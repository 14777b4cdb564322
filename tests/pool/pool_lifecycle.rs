//! A pool's life: `gpucap pool list` shows every pool of the user's
//! pool directory with its members alive and dead, the bytes held and its last use;
//! `gpucap pool clean` removes the pools no process uses and never one in use; a
//! `--pool` naming no pool suggests the nearest one. The race of a cleaner with a
//! joiner is tested where it is handled (src/pool-file/removal.rs).

use super::common;

use std::process::{Child, Output};

use common::pool_scratch::*;
use common::*;

fn kill(mut child: Child) -> Output {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    child.wait_with_output().unwrap()
}

/// A child killed when dropped.
struct Killed(Option<Child>);

impl Killed {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            kill(c);
        }
    }
}

/// The row of pool `name` in `pool list`'s output.
fn row<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{text}"))
}

#[test]
fn list_shows_each_pool_and_clean_removes_only_those_nobody_uses() {
    let s = Scratch::new("pool-lifecycle");
    // busy: a live member. idle: its only member exited. stale: its member was killed
    // holding 200 MiB.
    let busy = s.member("busy", "a", &["alloc:300Mi"]);
    let o = s.once("idle", &["alloc:100Mi"]);
    assert_ok(&o);
    let killed = s.member("stale", "b", &["alloc:200Mi"]);
    kill(killed);

    let o = run(&mut s.gpucap(&["pool", "list"]));
    assert_ok(&o);
    let text = stdout(&o);
    let b = row(&text, "busy");
    assert!(
        b.contains("1 alive, 0 dead") && b.contains("300 MiB"),
        "{text}"
    );
    let i = row(&text, "idle");
    assert!(
        i.contains("0 alive, 0 dead") && i.contains(" 0 B "),
        "{text}"
    );
    let st = row(&text, "stale");
    assert!(
        st.contains("0 alive, 1 dead") && st.contains("200 MiB"),
        "{text}"
    );
    // The last use is a UTC time.
    assert!(
        b.trim_end().ends_with(|c: char| c.is_ascii_digit()),
        "{text}"
    );

    // status leaves out the pool no process uses (no live member, nothing held), which
    // clean removes; --all shows it.
    let o = run(&mut s.gpucap(&["status"]));
    assert_ok(&o);
    assert!(!stdout(&o).contains("pool idle"), "{}", dump(&o));
    assert!(
        stdout(&o).contains("pool busy") && stdout(&o).contains("pool stale"),
        "{}",
        dump(&o)
    );
    let o = run(&mut s.gpucap(&["status", "--json"]));
    assert!(!stdout(&o).contains("idle.pool"), "{}", dump(&o));
    let o = run(&mut s.gpucap(&["status", "--all"]));
    assert_ok(&o);
    assert!(stdout(&o).contains("pool idle"), "{}", dump(&o));
    // top leaves it out too, unless it is the pool named.
    let o = run(&mut s.gpucap(&["top", "--once"]));
    assert_ok(&o);
    assert!(!stdout(&o).contains("pool idle"), "{}", dump(&o));
    assert!(stdout(&o).contains("pool busy"), "{}", dump(&o));
    let o = run(&mut s.gpucap(&["top", "--once", "--pool", "idle"]));
    assert_ok(&o);
    assert!(stdout(&o).contains("pool idle"), "{}", dump(&o));

    // clean: the idle pool goes; the busy one is in use; the stale one still counts
    // bytes (a dead member's), so it stays unless named.
    let o = run(&mut s.gpucap(&["pool", "clean"]));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("removed idle"), "{}", dump(&o));
    assert!(
        out.contains("kept busy: in use by 1 live member"),
        "{}",
        dump(&o)
    );
    assert!(
        out.contains("kept stale") && out.contains("gpucap pool clean stale"),
        "{}",
        dump(&o)
    );
    assert!(!s.pool_file("idle").exists());
    assert!(s.pool_file("busy").exists() && s.pool_file("stale").exists());

    // Named: the stale pool goes; the busy one is refused (exit 1) and stays.
    let o = run(&mut s.gpucap(&["pool", "clean", "stale"]));
    assert_ok(&o);
    assert!(stdout(&o).contains("removed stale"), "{}", dump(&o));
    assert!(!s.pool_file("stale").exists());
    let o = run(&mut s.gpucap(&["pool", "clean", "busy"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stderr(&o).contains("in use by 1 live member"),
        "{}",
        dump(&o)
    );
    assert!(s.pool_file("busy").exists());
    // The member is unharmed: status still reads its pool.
    let o = run(&mut s.gpucap(&["status", "--pool", "busy"]));
    assert_ok(&o);
    // A name that is no pool: the nearest one.
    let o = run(&mut s.gpucap(&["pool", "clean", "bussy"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(stderr(&o).contains("did you mean busy?"), "{}", dump(&o));

    // Once the member is gone, the pool is idle and clean removes it; a new member
    // then makes a new file under the same name.
    kill(busy);
    let o = run(&mut s.gpucap(&["pool", "clean", "busy"]));
    assert_ok(&o);
    assert!(!s.pool_file("busy").exists());
    assert_ok(&s.once("busy", &["alloc:1Mi"]));
    assert!(s.pool_file("busy").exists());
}

#[test]
fn a_pool_name_that_names_no_pool_gets_the_nearest_one() {
    let s = Scratch::new("pool-didyoumean");
    assert_ok(&s.once("train", &["alloc:1Mi"]));
    assert_ok(&s.once("eval", &["alloc:1Mi"]));
    for args in [
        vec!["status", "--pool", "trian"],
        vec!["top", "--pool", "trian", "--iterations", "1"],
        vec!["status", "--prometheus", "--pool", "trian"],
        vec!["status", "--pool", "Train"],
    ] {
        let o = run(&mut s.gpucap(&args));
        assert_eq!(o.status.code(), Some(1), "{args:?}\n{}", dump(&o));
        let err = stderr(&o);
        assert!(
            err.contains("did you mean train?"),
            "{args:?}\n{}",
            dump(&o)
        );
        assert!(err.contains("eval, train"), "the pools there\n{}", dump(&o));
    }
    // Nothing near: the pools there are listed.
    let o = run(&mut s.gpucap(&["status", "--pool", "inference"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(!stderr(&o).contains("did you mean"), "{}", dump(&o));
    assert!(stderr(&o).contains("eval, train"), "{}", dump(&o));
}

const MIB: u64 = 1 << 20;

/// A pool's file removed while a member runs (logind removes a user's files in /dev/shm
/// when the last session ends; /run/user goes with it): the next process joins the live
/// member's budget through its descriptor instead of making a second one, and says so;
/// `status`, `status --pool`, `check`, `pool list` and `pool clean` read it the same way.
/// Before, a new file was made: 700 MiB served beside the member's 700 MiB under the
/// 1 GiB cap. Once every member exited, the next process makes the file again.
#[test]
fn a_pool_file_removed_while_its_members_run_is_joined_not_made_again() {
    let s = Scratch::new("pool-removed");
    // Killed however the test ends: a live member of a removed file is shown by every
    // status of this user that reads its directory.
    let a = Killed(Some(s.member("p", "a", &[&format!("alloc:{}", 700 * MIB)])));
    let dir = s.pool_file("p").parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    let b = s.once(
        "p",
        &[
            &format!("alloc:{}", 700 * MIB),
            &format!("alloc:{}", 200 * MIB),
        ],
    );
    let said = format!("{}{}", stdout(&b), stderr(&b));
    assert!(
        said.contains(&format!("alloc {} 2", 700 * MIB))
            && said.contains(&format!("alloc {} 0", 200 * MIB)),
        "not the live member's budget: {said}"
    );
    assert!(
        said.contains("was removed while its members run")
            && said.contains(&format!("through process {}'s descriptor", a.id())),
        "{said}"
    );
    assert!(!s.pool_file("p").exists(), "a second file was made");
    // The readers read it through a member's descriptor too: the process table, the
    // pool's own view, check.
    let table = stdout(&run(&mut s.gpucap(&["status"])));
    assert!(
        table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&a.id().to_string().as_str()) && f.get(3) == Some(&"p")
        }),
        "status: {table}"
    );
    // Only the directory read: another pool directory's status does not show it.
    let elsewhere = s.dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let other = stdout(&run(s
        .gpucap(&["status"])
        .env("GPUCAP_POOL_DIR", &elsewhere)));
    assert!(other.starts_with("no capped process"), "{other}");
    let own = stdout(&run(&mut s.gpucap(&["status", "--pool", "p"])));
    assert!(
        own.lines()
            .next()
            .is_some_and(|l| l.contains("removed while its members run"))
            && own.contains(&a.id().to_string()),
        "status --pool: {own}"
    );
    let check = run(s
        .gpucap(&["check"])
        .env("GPUCAP_POOL", "p")
        .env("GPUCAP_LIMIT", "1Gi"));
    assert!(
        stdout(&check).contains("removed while its members run")
            && stdout(&check).contains("1 member alive"),
        "check: {}",
        dump(&check)
    );
    let list = stdout(&run(&mut s.gpucap(&["pool", "list"])));
    assert!(
        row(&list, "p").contains("1 alive") && row(&list, "p").contains("its file removed"),
        "pool list: {list}"
    );
    let clean = run(&mut s.gpucap(&["pool", "clean", "p"]));
    assert!(
        stderr(&clean).contains(&format!("kept p: in use by 1 live member (pid {})", a.id())),
        "pool clean: {}",
        dump(&clean)
    );
    drop(a);
    let c = s.once("p", &[&format!("alloc:{}", 700 * MIB)]);
    assert!(
        stdout(&c).contains(&format!("alloc {} 0", 700 * MIB)),
        "{}",
        dump(&c)
    );
    assert!(s.pool_file("p").exists());
}

/// Without GPUCAP_POOL_DIR a pool's file is where the environment does not decide: a
/// login session sets XDG_RUNTIME_DIR, a cron job, `sudo` or a service does not, and
/// the two processes of one user naming one pool made two files (700 MiB served to
/// each under the 1 GiB cap).
#[test]
fn a_pools_file_does_not_depend_on_xdg_runtime_dir() {
    let s = Scratch::new("pool-xdg");
    let runtime = s.dir.join("run-user");
    std::fs::create_dir_all(&runtime).unwrap();
    let name = format!("gpucap-test-xdg-{}", std::process::id());
    // The default directory is the machine's: the file is removed however the test ends.
    struct Removed(String);
    impl Drop for Removed {
        fn drop(&mut self) {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            for base in ["/dev/shm", "/tmp"] {
                let _ = std::fs::remove_file(format!("{base}/gpucap-{uid}/{}.pool", self.0));
            }
        }
    }
    let _removed = Removed(name.clone());
    let steps = |more: &[String]| -> Vec<String> {
        [format!("alloc:{}", 700 * MIB)]
            .into_iter()
            .chain(more.iter().cloned())
            .collect()
    };
    let ready = s.dir.join("a.ready");
    let mut a = fake_cmd(script(), &s.dir.join("a.json"))
        .env("LD_PRELOAD", shim())
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_POOL", &name)
        .env("XDG_RUNTIME_DIR", &runtime)
        .args(steps(&[
            format!("touch:{}", ready.display()),
            format!("wait:{}", s.dir.join("never").display()),
        ]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut a, &ready, "the member with XDG_RUNTIME_DIR");
    let b = run(fake_cmd(script(), &s.dir.join("b.json"))
        .env("LD_PRELOAD", shim())
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_POOL", &name)
        .env_remove("XDG_RUNTIME_DIR")
        .args(steps(&[])));
    kill(a);
    assert!(
        stdout(&b).contains(&format!("alloc {} 2", 700 * MIB)),
        "two budgets: {}",
        dump(&b)
    );
    assert_eq!(
        std::fs::read_dir(&runtime).unwrap().count(),
        0,
        "a file was made under XDG_RUNTIME_DIR"
    );
}

/// Whether process `pid` has the file at `path` open.
fn has_open(pid: u32, path: &std::path::Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
}

/// A process that starts while `gpucap pool clean` removes its pool (the cleaner holding
/// every slot's lock, the file not yet moved away) waits for the cleaner and joins the
/// pool's new file, as `gpucap pool --help` promises. Before, its join found every slot
/// held and it failed at `cuInit` (800) with "the pool has 256 live members already"
/// (seen twice with gdb stopping `gpucap pool clean` at its `rename`).
#[test]
fn a_member_starting_while_clean_removes_its_pool_joins_the_new_file() {
    use std::os::fd::AsRawFd;
    let s = Scratch::new("pool-clean-joiner");
    assert_ok(&s.once("c", &["alloc:1Mi"]));
    let path = s.pool_file("c");
    // The cleaner (src/pool-file/removal.rs): one write lock over a claim's two bytes, every
    // slot's, every window's and every child's (from 2^40 - 2).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: flock is plain data; all-zero is valid (l_pid must be 0 for OFD locks).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as _;
    l.l_whence = libc::SEEK_SET as _;
    l.l_start = (1 << 40) - 2;
    l.l_len = 2 + 4096 + 32 + 4096;
    // SAFETY: our file's descriptor and a valid flock.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_OFD_SETLK,
            &mut l as *mut libc::flock,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());

    let script = script();
    let mut joiner = s
        .gpucap(&[
            "run",
            "--limit",
            "1Gi",
            "--pool",
            "c",
            "--",
            script.to_str().unwrap(),
            "alloc:100Mi",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once it opened the file it tries its slot: give it time to, then move the file
    // away and remove it, as the cleaner does, and let go.
    let start = std::time::Instant::now();
    while !has_open(joiner.id(), &path) && joiner.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the joiner never opened the pool file"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let moved = path.with_file_name(".c.pool.test.removing");
    std::fs::rename(&path, &moved).unwrap();
    std::fs::remove_file(&moved).unwrap();
    drop(file);

    let o = joiner.wait_with_output().unwrap();
    assert_ok(&o);
    assert!(
        stdout(&o).contains(&format!("alloc {} 0", 100 << 20)),
        "{}",
        dump(&o)
    );
    // It made the pool's new file, which every later member joins.
    assert!(path.exists());
}
