//! GPUCAP_POOL on the fake GPU, with several processes: one budget per GPU for every
//! process of a pool, atomic across processes, crash-safe (SIGKILL at any point),
//! fork- and PID-namespace-proof, and fail-closed on a bad pool file.

use super::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const OOM: &str = "2";

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// A pool test: a scratch directory for the pool, the shared fake GPU and signals.
struct Pool {
    dir: PathBuf,
}

impl Pool {
    fn new(tag: &str) -> Pool {
        Pool { dir: scratch(tag) }
    }

    /// `program` as a member of the pool `t` with a 1 GiB cap, on a 4 GiB fake GPU
    /// shared by every process of the test.
    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>, stats: &str) -> Command {
        let mut c = fake_cmd(program, &self.dir.join(stats));
        preload(&mut c)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("FAKECUDA_SHARED", self.dir.join("fake-gpu"))
            .env("GPUCAP_LIMIT", "1Gi")
            .env("GPUCAP_POOL", "t")
            .env("GPUCAP_POOL_DIR", &self.dir);
        c
    }

    fn script(&self, stats: &str, steps: &[&str]) -> Command {
        let mut c = self.cmd(script(), stats);
        c.args(steps);
        c
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The pool file of pool `t`.
    fn file(&self) -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        self.dir.join(format!("gpucap-{uid}")).join("t.pool")
    }

    /// (used, peak) of the pool's first GPU entry, read from the file's words.
    fn used_peak(&self) -> (u64, u64) {
        (self.gpu_word(0, 4) & ((1 << 48) - 1), self.gpu_word(0, 5))
    }

    /// Word `i` of GPU entry `g` of the pool file (the layout is
    /// src/core/budget/layout.rs: 16 header words, then 24 per GPU entry; `used`, word 4,
    /// holds bytes in its low 48 bits and a change count above; word 16 counts the
    /// contexts in flight in its low 32 bits).
    fn gpu_word(&self, g: usize, i: usize) -> u64 {
        let bytes = std::fs::read(self.file()).expect("pool file");
        let at = (16 + g * 24 + i) * 8;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    /// Waits until `n` processes hold a member's lock on the pool file (a killed
    /// process's locks go when the kernel has finished it off).
    fn wait_live_members(&self, n: usize) {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(self.file()).unwrap().ino();
        let start = Instant::now();
        loop {
            let locks = std::fs::read_to_string("/proc/locks").unwrap();
            let held = locks
                .lines()
                .filter(|l| l.contains("OFDLCK") && l.contains(&format!(":{ino} ")))
                .count();
            if held == n {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{held} members, not {n}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_file(&self, name: &str) {
        let p = self.dir.join(name);
        let start = Instant::now();
        while !p.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{name} never came"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.dir.join(name), b"").unwrap();
    }

    /// The fake GPU's highest total use by all processes, from a stats file.
    fn shared_peak(&self, stats: &str) -> u64 {
        let text = std::fs::read_to_string(self.dir.join(stats)).expect("stats");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["devices"][0]["shared_peak_used"]
            .as_u64()
            .expect("shared_peak_used")
    }
}

fn spawn(c: &mut Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

fn finish(c: Child) -> Output {
    c.wait_with_output().unwrap()
}

fn lines(o: &Output) -> Vec<String> {
    stdout(o).lines().map(str::to_string).collect()
}

fn has(o: &Output, line: &str) -> bool {
    stdout(o).lines().any(|l| l == line)
}

fn sigkill(c: &mut Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

#[test]
fn processes_of_a_pool_share_one_cap() {
    let p = Pool::new("pool-share");
    let a = spawn(&mut p.script(
        "a.json",
        &[
            "alloc:600Mi",
            &format!("touch:{}", p.path("a")),
            &format!("wait:{}", p.path("b")),
            "free",
        ],
    ));
    p.wait_file("a");
    let b = run(&mut p.script(
        "b.json",
        &[
            "alloc:600Mi",
            "alloc:300Mi",
            "info",
            &format!("touch:{}", p.path("b")),
        ],
    ));
    let a = finish(a);
    assert_ok(&a);
    assert!(
        has(&b, &format!("alloc {} {OOM}", 600 * MIB)),
        "the other member holds 600 MiB\n{}",
        dump(&b)
    );
    assert!(has(&b, &format!("alloc {} 0", 300 * MIB)), "{}", dump(&b));
    assert!(
        has(&b, &format!("info {} {}", (1024 - 900) * MIB, 1024 * MIB)),
        "cuMemGetInfo shows the pool: free = cap - what every member holds\n{}",
        dump(&b)
    );
    let refusal = refusals(&stderr(&b));
    assert_eq!(refusal.len(), 1, "{}", dump(&b));
    assert!(
        refusal[0].contains("600 MiB of the pool's 1 GiB cap in use, 0 B of it by this process"),
        "{}",
        refusal[0]
    );
    assert!(p.shared_peak("a.json").max(p.shared_peak("b.json")) <= 1024 * MIB);
    assert_eq!(p.used_peak(), (0, 900 * MIB), "both left: nothing held");
}

#[test]
fn without_a_pool_each_process_has_the_whole_cap() {
    // The control of the test above: the same two processes without GPUCAP_POOL.
    let p = Pool::new("pool-none");
    let a = spawn(
        p.script(
            "a.json",
            &[
                "alloc:600Mi",
                &format!("touch:{}", p.path("a")),
                &format!("wait:{}", p.path("b")),
            ],
        )
        .env_remove("GPUCAP_POOL"),
    );
    p.wait_file("a");
    let b = run(p
        .script(
            "b.json",
            &["alloc:600Mi", &format!("touch:{}", p.path("b"))],
        )
        .env_remove("GPUCAP_POOL"));
    assert_ok(&finish(a));
    assert!(has(&b, &format!("alloc {} 0", 600 * MIB)), "{}", dump(&b));
    assert!(!p.file().exists());
}

#[test]
fn members_must_agree_on_the_cap() {
    let p = Pool::new("pool-agree");
    let a = spawn(&mut p.script(
        "a.json",
        &[
            "alloc:1Mi",
            &format!("touch:{}", p.path("a")),
            &format!("wait:{}", p.path("b")),
        ],
    ));
    p.wait_file("a");
    let b = run(p
        .script("b.json", &["alloc:1Mi"])
        .env("GPUCAP_LIMIT", "2Gi"));
    p.touch("b");
    assert_ok(&finish(a));
    assert!(has(&b, "cuInit 800"), "refused at cuInit\n{}", dump(&b));
    let err = stderr(&b);
    assert_eq!(err.lines().count(), 1, "one line\n{}", dump(&b));
    assert!(
        err.contains("caps GPU 0 at 2 GiB, the pool's live members at 1 GiB"),
        "names both values\n{}",
        dump(&b)
    );
    // Once no member lives, a new cap replaces the old one.
    let c = run(p
        .script("c.json", &["alloc:1500Mi"])
        .env("GPUCAP_LIMIT", "2Gi"));
    assert!(has(&c, &format!("alloc {} 0", 1500 * MIB)), "{}", dump(&c));
}

#[test]
fn a_killed_members_share_comes_back_to_the_allocation_that_needs_it() {
    let p = Pool::new("pool-kill");
    let mut a = spawn(&mut p.script(
        "a.json",
        &[
            "alloc:800Mi",
            &format!("touch:{}", p.path("a")),
            &format!("wait:{}", p.path("never")),
        ],
    ));
    p.wait_file("a");
    let b = spawn(&mut p.script(
        "b.json",
        &[
            "alloc:600Mi",
            &format!("touch:{}", p.path("b1")),
            &format!("wait:{}", p.path("killed")),
            "alloc:600Mi",
            "info",
        ],
    ));
    p.wait_file("b1");
    sigkill(&mut a);
    assert_eq!(
        p.used_peak().0,
        800 * MIB,
        "nobody took the dead member's share back yet"
    );
    p.touch("killed");
    let b = finish(b);
    assert!(
        has(&b, &format!("alloc {} {OOM}", 600 * MIB)),
        "while A lived\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} 0", 600 * MIB)),
        "the dead member's 800 MiB came back to the allocation that needed them\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("info {} {}", 424 * MIB, 1024 * MIB)),
        "{}",
        dump(&b)
    );
    assert_eq!(p.used_peak().0, 0);
}

/// Runs the script with a pool file prepared by `prepare`; it must fail closed with
/// one line containing `expect`.
fn refused_with(tag: &str, prepare: impl FnOnce(&Pool), expect: &str) {
    let p = Pool::new(tag);
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    prepare(&p);
    let o = run(&mut p.script("s.json", &["alloc:1Mi"]));
    assert!(has(&o, "cuInit 800"), "{tag}: fail closed\n{}", dump(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{tag}: one line\n{}", dump(&o));
    assert!(
        err.contains("cannot join the pool t"),
        "{tag}\n{}",
        dump(&o)
    );
    assert!(err.contains(expect), "{tag}: says {expect:?}\n{}", dump(&o));
}

/// A good pool file, made by a member.
fn made(p: &Pool) -> Vec<u8> {
    assert_ok(&run(&mut p.script("m.json", &["alloc:1Mi"])));
    std::fs::read(p.file()).unwrap()
}

#[test]
fn a_bad_pool_file_fails_closed_with_a_clear_line() {
    refused_with(
        "pool-magic",
        |p| std::fs::write(p.file(), b"\x00\x00HAMI-core shared region ....").unwrap(),
        "not a gpucap pool file",
    );
    refused_with(
        "pool-garbage",
        |p| {
            let n = made(p).len();
            std::fs::write(p.file(), vec![0xA5; n]).unwrap()
        },
        "not a gpucap pool file",
    );
    refused_with(
        "pool-version",
        |p| {
            let mut b = made(p);
            b[8] = 8;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 8 pool file and this gpucap reads version 7",
    );
    // A file left by a gpucap of version 6 (no record of a ceiling handed down: the
    // same length, its slots' last two words left unwritten).
    refused_with(
        "pool-version-6",
        |p| {
            let mut b = made(p);
            b[8] = 6;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 6 pool file and this gpucap reads version 7",
    );
    // A file left by a gpucap of version 3 (no announced frees: shorter).
    refused_with(
        "pool-version-3",
        |p| {
            let mut b = made(p);
            b.truncate(496_768);
            b[8] = 3;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 3 pool file and this gpucap reads version 7",
    );
    // A file left by a gpucap of version 2 (a journal per member and GPU: another length).
    refused_with(
        "pool-version-2",
        |p| {
            let mut b = made(p);
            b.resize(627_840, 0);
            b[8] = 2;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 2 pool file and this gpucap reads version 7",
    );
    // A file left by a gpucap of version 1 (before guarantees: shorter) is one too.
    refused_with(
        "pool-version-1",
        |p| {
            let mut b = made(p);
            b.truncate(495_744);
            b[8] = 1;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 1 pool file and this gpucap reads version 7",
    );
    // A file left by a gpucap of version 5 (16 words per GPU entry: shorter).
    refused_with(
        "pool-version-5",
        |p| {
            let mut b = made(p);
            b.truncate(824_448);
            b[8] = 5;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 5 pool file and this gpucap reads version 7",
    );
    refused_with(
        "pool-corrupt",
        |p| {
            let mut b = made(p);
            let slot0 = (16 + 32 * 24) * 8;
            b[slot0] = 9;
            std::fs::write(p.file(), b).unwrap()
        },
        "corrupted (member slot 0 has state 9)",
    );
    refused_with(
        "pool-truncated",
        |p| {
            let b = made(p);
            std::fs::write(p.file(), &b[..b.len() / 2]).unwrap()
        },
        "truncated",
    );
    refused_with(
        "pool-mode",
        |p| {
            made(p);
            std::fs::set_permissions(p.file(), std::fs::Permissions::from_mode(0o666)).unwrap()
        },
        "writable by group or others (mode 666)",
    );
    refused_with(
        "pool-symlink",
        |p| {
            made(p);
            let real = p.dir.join("elsewhere.pool");
            std::fs::rename(p.file(), &real).unwrap();
            std::os::unix::fs::symlink(&real, p.file()).unwrap()
        },
        "cannot open the pool file",
    );
    refused_with(
        "pool-dir-mode",
        |p| {
            let dir = p.file().parent().unwrap().to_path_buf();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap()
        },
        "writable by group or others (mode 777)",
    );
}

fn pool_fork() -> PathBuf {
    compile_c("pool_fork", "", &["-lcuda"])
}

#[test]
fn a_forked_child_does_not_carry_its_parents_membership_away() {
    // The child exits through exit(): the shim's exit hook runs in it, and must not
    // hand the parent's share back to the pool.
    let p = Pool::new("pool-fork-exit");
    let a = spawn(
        p.cmd(pool_fork(), "a.json")
            .args(["exit", &p.path("ready"), &p.path("go")]),
    );
    p.wait_file("ready");
    let b = run(&mut p.script("b.json", &["alloc:500Mi", "alloc:400Mi"]));
    p.touch("go");
    let a = finish(a);
    assert!(has(&a, "parent alloc 0"), "{}", dump(&a));
    assert!(
        has(&b, &format!("alloc {} {OOM}", 500 * MIB)),
        "the parent's 600 MiB still count\n{}",
        dump(&b)
    );
    assert!(has(&b, &format!("alloc {} 0", 400 * MIB)), "{}", dump(&b));
}

#[test]
fn a_forked_child_that_uses_cuda_is_its_own_member() {
    let p = Pool::new("pool-fork-cuda");
    let a = run(p
        .cmd(pool_fork(), "a.json")
        .args(["cuda", &p.path("ready"), &p.path("ready")]));
    assert!(has(&a, "parent alloc 0"), "{}", dump(&a));
    assert!(has(&a, "child cuInit 0"), "{}", dump(&a));
    assert!(has(&a, "child alloc 300 0"), "{}", dump(&a));
    assert!(
        has(&a, &format!("child alloc 200 {OOM}")),
        "600 + 300 + 200 MiB > 1 GiB\n{}",
        dump(&a)
    );
    assert_eq!(p.used_peak(), (0, 900 * MIB));
}

/// A forked child that allocates without cuInit, in the context it inherited (the fake
/// lets it), joins the pool as its own member at that first call: what it holds counts
/// against the pool, so another member cannot take the pool over its cap.
#[test]
fn a_forked_child_that_allocates_without_cuinit_is_its_own_member() {
    let p = Pool::new("pool-fork-nocuinit");
    let a = spawn(
        p.cmd(pool_fork(), "a.json")
            .args(["nocuinit", &p.path("ready"), &p.path("go")]),
    );
    p.wait_file("ready");
    assert_eq!(
        p.used_peak().0,
        900 * MIB,
        "the parent's 600 MiB and the child's 300"
    );
    let b = run(&mut p.script("b.json", &["alloc:200Mi", "alloc:100Mi"]));
    p.touch("go");
    let a = finish(a);
    assert!(has(&a, "parent alloc 0"), "{}", dump(&a));
    assert!(has(&a, "child alloc 300 0"), "{}", dump(&a));
    assert!(
        has(&b, &format!("alloc {} {OOM}", 200 * MIB)),
        "600 + 300 + 200 MiB > 1 GiB\n{}",
        dump(&b)
    );
    assert!(has(&b, &format!("alloc {} 0", 100 * MIB)), "{}", dump(&b));
    assert!(p.shared_peak("b.json") <= 1024 * MIB);
    assert_eq!(p.used_peak(), (0, 1000 * MIB));
}

/// A forked child that cannot join the pool (here: its directory became writable by
/// others after the parent joined) is refused with the line at its first driver call,
/// never counted outside the pool.
#[test]
fn a_forked_child_that_cannot_join_the_pool_is_refused_with_a_line() {
    let p = Pool::new("pool-fork-nojoin");
    let a = spawn(p.cmd(pool_fork(), "a.json").args([
        "nocuinit_late",
        &p.path("ready"),
        &p.path("go"),
    ]));
    p.wait_file("ready");
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    p.touch("go");
    let a = finish(a);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(has(&a, "parent alloc 0"), "{}", dump(&a));
    assert!(
        has(&a, "child alloc 300 800"),
        "CUDA_ERROR_NOT_PERMITTED\n{}",
        dump(&a)
    );
    let err = String::from_utf8_lossy(&a.stderr);
    assert!(
        err.lines()
            .any(|l| l.starts_with("gpucap: cannot join the pool t: ")
                && l.contains("writable by group or others")),
        "{}",
        dump(&a)
    );
    assert_eq!(p.used_peak(), (0, 600 * MIB), "the child took nothing");
}

#[test]
fn a_dead_parent_releases_its_share_while_its_child_lives() {
    let p = Pool::new("pool-fork-sleep");
    let mut a =
        spawn(
            p.cmd(pool_fork(), "a.json")
                .args(["sleep", &p.path("ready"), &p.path("never")]),
        );
    p.wait_file("ready");
    // Read up to the child's pid line only: the child keeps the pipe open.
    let child: i32 = {
        use std::io::BufRead;
        let mut out = std::io::BufReader::new(a.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "no child pid line");
            if let Some(pid) = line.trim().strip_prefix("child pid ") {
                break pid.parse().unwrap();
            }
        }
    };
    sigkill(&mut a);
    p.wait_live_members(0);
    let b = run(&mut p.script("b.json", &["alloc:900Mi"]));
    // SAFETY: a plain kill of the child this test made.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(
        has(&b, &format!("alloc {} 0", 900 * MIB)),
        "the parent's 600 MiB came back although its child (which holds its open files) lives\n{}",
        dump(&b)
    );
}

#[test]
fn members_in_other_pid_namespaces_share_the_pool_and_do_not_reap_each_other() {
    if !unshare_works() {
        return;
    }
    let p = Pool::new("pool-pidns");
    // Two members, each PID 1 of its own namespace, as the entrypoint of a container is.
    let in_ns = |stats: &str, steps: Vec<String>| {
        let mut c = p.cmd("unshare", stats);
        // --kill-child: the member (PID 1 of the namespace) dies with unshare.
        c.args(["-pf", "--mount-proc", "--kill-child"])
            .arg(script())
            .args(steps);
        spawn(&mut c)
    };
    let a = in_ns(
        "a.json",
        vec![
            "alloc:400Mi".into(),
            format!("touch:{}", p.path("a")),
            format!("wait:{}", p.path("go")),
        ],
    );
    p.wait_file("a");
    let mut b = in_ns(
        "b.json",
        vec![
            "alloc:400Mi".into(),
            format!("touch:{}", p.path("b")),
            format!("wait:{}", p.path("never")),
        ],
    );
    p.wait_file("b");
    // A third, in the test's namespace: both others are alive, whatever their pids.
    let c = run(&mut p.script("c.json", &["alloc:400Mi", "alloc:200Mi"]));
    assert!(
        has(&c, &format!("alloc {} {OOM}", 400 * MIB)),
        "{}",
        dump(&c)
    );
    assert!(has(&c, &format!("alloc {} 0", 200 * MIB)), "{}", dump(&c));
    // B dies (its namespace's PID 1): its share comes back; A's stays.
    sigkill(&mut b);
    p.wait_live_members(1);
    let d = run(&mut p.script("d.json", &["alloc:500Mi", "alloc:200Mi"]));
    p.touch("go");
    assert_ok(&finish(a));
    assert!(has(&d, &format!("alloc {} 0", 500 * MIB)), "{}", dump(&d));
    assert!(
        has(&d, &format!("alloc {} {OOM}", 200 * MIB)),
        "A's 400 MiB still count\n{}",
        dump(&d)
    );
}

fn churn() -> PathBuf {
    compile_c("pool_churn", "", &["-lcuda"])
}

#[test]
fn eight_processes_of_sixteen_threads_never_take_the_pool_over_its_cap() {
    let p = Pool::new("pool-churn");
    let procs: Vec<Child> = (0..8)
        .map(|i| {
            spawn(
                p.cmd(churn(), &format!("s{i}.json"))
                    .env("GPUCAP_LIMIT", "512Mi")
                    .args([
                        "16",
                        "200",
                        "48Mi",
                        &p.path(&format!("ready{i}")),
                        &p.path("go"),
                    ]),
            )
        })
        .collect();
    for i in 0..8 {
        p.wait_file(&format!("ready{i}"));
    }
    p.touch("go");
    let mut refused = 0;
    for (i, c) in procs.into_iter().enumerate() {
        let o = finish(c);
        assert_ok(&o);
        let line = lines(&o)
            .into_iter()
            .find(|l| l.starts_with("churn "))
            .unwrap();
        refused += line
            .split("refused=")
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap();
        let peak = p.shared_peak(&format!("s{i}.json"));
        assert!(
            peak <= 512 * MIB,
            "the fake GPU held {peak} bytes at once, over the 512 MiB cap"
        );
    }
    assert!(refused > 0, "the processes competed for the cap");
    let (used, peak) = p.used_peak();
    assert_eq!(used, 0, "every byte came back to the pool");
    assert!(peak <= 512 * MIB && peak > 256 * MIB, "peak {peak}");
}

/// Contexts are charged to the pool (a primary retain has no current context): 32
/// members of 2 threads each whose contexts take 16 MiB never take the fake GPU over
/// the pool's 384 MiB cap. The first member makes its context alone (the pool then knows
/// what a context takes) and churns; the 31 others make theirs while it churns and hold
/// them until all have tried (READY, then GO). 32 contexts take 512 MiB, more than the
/// cap, so at least 8 must be refused before the driver makes them (pool_churn then
/// exits 3), never let through uncounted as before.
#[test]
fn thirty_two_members_with_sixteen_mib_contexts_never_take_the_gpu_over_the_pool_cap() {
    const CAP_MIB: u64 = 384;
    const MEMBERS: usize = 32;
    let p = Pool::new("pool-churn-ctx");
    let member = |i: usize, ready: &str, go: &str| {
        let mut c = p.cmd(churn(), &format!("s{i}.json"));
        c.env("GPUCAP_LIMIT", format!("{CAP_MIB}Mi"))
            .env("FAKECUDA_CONTEXT_MEM", "16Mi")
            .args(["2", "1000", "8Mi"])
            .args([ready, go]);
        if i == 0 {
            c.env("CHURN_HOLD", p.path("go"));
        }
        spawn(&mut c)
    };
    // The first churns as soon as its context is made (GO is its own READY), so the
    // others' contexts are measured while it allocates and frees; it keeps its context
    // until GO (CHURN_HOLD), so that it counts beside all the others' however soon its
    // churn ends (on a loaded machine it ended before the others' contexts were made,
    // its context went, and one more fitted).
    let mut procs = vec![member(0, &p.path("ready0"), &p.path("ready0"))];
    p.wait_file("ready0");
    procs.extend((1..MEMBERS).map(|i| member(i, &p.path(&format!("ready{i}")), &p.path("go"))));
    // Every other member either holds its context (READY) or was refused (it exited):
    // only then do they churn, so the contexts that were made all live at once.
    let start = Instant::now();
    for (i, c) in procs.iter_mut().enumerate().skip(1) {
        while !p.dir.join(format!("ready{i}")).exists() && c.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(50),
                "member {i} neither made its context nor exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    p.touch("go");
    let (mut churned, mut refused_contexts) = (0, 0);
    let mut said = String::new(); // every member's lines from gpucap, for a failure
    for (i, c) in procs.into_iter().enumerate() {
        let o = finish(c);
        for l in String::from_utf8_lossy(&o.stderr).lines() {
            said += &format!("member {i}: {l}\n");
        }
        if o.status.code() == Some(3) {
            // Its context was refused: with the line, and nothing else went wrong.
            assert!(
                lines(&o).iter().any(
                    |l| l.starts_with("FATAL cuDevicePrimaryCtxRetain(&g_ctx, dev) returned 2")
                ),
                "{}",
                dump(&o)
            );
            assert!(
                // Of 16 MiB, or more when another member allocated while the context's
                // memory was measured (the device's free memory, before and after).
                String::from_utf8_lossy(&o.stderr).lines().any(|l| l
                    .starts_with("gpucap: refused cuDevicePrimaryCtxRetain of ")
                    && l.contains(" MiB on GPU 0: ")),
                "{}",
                dump(&o)
            );
            refused_contexts += 1;
        } else {
            assert_ok(&o);
            churned += 1;
        }
        let peak = p.shared_peak(&format!("s{i}.json"));
        // A context is reserved before it is made at what contexts measured lately; one
        // measured low (another member's free in its window) lets the next be made past
        // the cap for the moment it is measured, then undone and refused (counting.md: a
        // known residual). Never by more than that one context.
        assert!(
            peak <= (CAP_MIB + 16) * MIB,
            "member {i}: the fake GPU held {peak} bytes at once, over the pool's {CAP_MIB} MiB \
             cap by more than one context; the members' lines so far:\n{said}"
        );
    }
    eprintln!("{churned} members churned, {refused_contexts} contexts were refused");
    // 32 x 16 MiB = 512 MiB of contexts, all alive at once before GO: the 384 MiB cap
    // holds 24 of them at most, so 8 at least must have been refused.
    assert!(
        refused_contexts >= MEMBERS - (CAP_MIB / 16) as usize,
        "{refused_contexts} of {MEMBERS} contexts of 16 MiB refused under a {CAP_MIB} MiB pool \
         cap ({churned} members churned): the cap did not bind on contexts"
    );
    assert!(
        churned > 0,
        "{churned} members churned, {refused_contexts} were refused"
    );
    assert_eq!(p.used_peak().0, 0, "every byte came back to the pool");
}

#[test]
fn members_killed_at_random_points_block_nobody_and_leave_nothing_behind() {
    let p = Pool::new("pool-massacre");
    let start = || {
        spawn(
            p.cmd(churn(), "x.json")
                .env("GPUCAP_LIMIT", "256Mi")
                .args(["4", "100000", "16Mi"]),
        )
    };
    // Survivors: a fixed amount of work each, while others die around them. Their
    // contexts are made before the massacre starts: a context made while the pool is
    // full may be refused (its measurement, device-wide, counts what others allocate
    // meanwhile), which is not what this test is about.
    let survivors: Vec<Child> = (0..2)
        .map(|i| {
            spawn(
                p.cmd(churn(), &format!("s{i}.json"))
                    .env("GPUCAP_LIMIT", "256Mi")
                    .args(["4", "1500", "16Mi"])
                    .args([p.path(&format!("ready{i}")), p.path("go")]),
            )
        })
        .collect();
    p.wait_file("ready0");
    p.wait_file("ready1");
    let mut victims: Vec<Child> = (0..3).map(|_| start()).collect();
    std::fs::write(p.path("go"), "").unwrap();
    let mut seed = std::process::id() as u64;
    for _ in 0..40 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(5 + (seed >> 59)));
        let k = (seed >> 33) as usize % victims.len();
        sigkill(&mut victims[k]);
        victims[k] = start();
    }
    for v in &mut victims {
        sigkill(v);
    }
    for (i, s) in survivors.into_iter().enumerate() {
        let o = finish(s);
        assert_ok(&o);
        let peak = p.shared_peak(&format!("s{i}.json"));
        assert!(
            peak <= 256 * MIB,
            "the fake GPU held {peak} bytes at once, over the cap"
        );
    }
    // The dead left their shares behind; the next member takes them all back.
    let o = run(p
        .script("last.json", &["alloc:256Mi"])
        .env("GPUCAP_LIMIT", "256Mi"));
    assert!(has(&o, &format!("alloc {} 0", 256 * MIB)), "{}", dump(&o));
    assert_eq!(p.used_peak().0, 0, "nothing left behind");
}

#[test]
fn hamis_shared_cache_variable_names_the_pool_file() {
    // As HAMi-core's device plugin sets them: the limit in MiB and the cache file.
    let p = Pool::new("pool-hami");
    let file = p.dir.join("cudevshr.cache");
    let hami = |c: &mut Command| {
        c.env_remove("GPUCAP_LIMIT")
            .env_remove("GPUCAP_POOL")
            .env_remove("GPUCAP_POOL_DIR")
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m")
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &file);
    };
    let mut a = p.script(
        "a.json",
        &[
            "alloc:600Mi",
            &format!("touch:{}", p.path("a")),
            &format!("wait:{}", p.path("b")),
        ],
    );
    hami(&mut a);
    let a = spawn(&mut a);
    p.wait_file("a");
    let mut b = p.script(
        "b.json",
        &[
            "alloc:600Mi",
            "alloc:400Mi",
            &format!("touch:{}", p.path("b")),
        ],
    );
    hami(&mut b);
    let b = run(&mut b);
    assert_ok(&finish(a));
    assert!(
        has(&b, &format!("alloc {} {OOM}", 600 * MIB)),
        "{}",
        dump(&b)
    );
    assert!(has(&b, &format!("alloc {} 0", 400 * MIB)), "{}", dump(&b));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the cache file is the pool's, made 0600");
}

#[test]
fn an_exec_chain_starts_a_new_member_and_the_old_images_share_comes_back() {
    // The process allocates 600 MiB, then execs a program that allocates 600 MiB: the
    // old image's membership ended with it (its descriptor is close-on-exec, its
    // mapping gone), so the new image, a new member under the same pid, gets it back.
    let p = Pool::new("pool-exec");
    let wrapper = p.dir.join("next.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} alloc:600Mi alloc:300Mi alloc:200Mi\n",
            script().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = run(p
        .cmd(pool_fork(), "a.json")
        .args(["exec", wrapper.to_str().unwrap(), "unused"]));
    assert!(has(&o, "parent alloc 0"), "{}", dump(&o));
    assert!(has(&o, &format!("alloc {} 0", 600 * MIB)), "{}", dump(&o));
    assert!(has(&o, &format!("alloc {} 0", 300 * MIB)), "{}", dump(&o));
    assert!(
        has(&o, &format!("alloc {} {OOM}", 200 * MIB)),
        "one pool, one cap\n{}",
        dump(&o)
    );
    assert_eq!(p.used_peak().0, 0);
}

// ---- GPUCAP_WAIT: waiting for memory instead of failing ---------------------------------

impl Pool {
    /// How many members wait on the pool's first GPU (the file's `waiters` word).
    fn waiters(&self) -> u64 {
        let bytes = std::fs::read(self.file()).expect("pool file");
        u64::from_le_bytes(bytes[(16 + 9) * 8..(16 + 10) * 8].try_into().unwrap())
    }

    fn wait_waiters(&self, n: u64) {
        let start = Instant::now();
        while self.waiters() != n {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{} waiters, not {n}",
                self.waiters()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn waiter(&self, stats: &str, steps: &[&str]) -> Child {
        spawn(self.script(stats, steps).env("GPUCAP_WAIT", "60s"))
    }
}

/// A member holding 800 MiB of the 1 GiB pool until `go` exists, then freeing it.
fn holder(p: &Pool) -> Child {
    let h = spawn(&mut p.script(
        "h.json",
        &[
            "alloc:800Mi",
            &format!("touch:{}", p.path("held")),
            &format!("wait:{}", p.path("go")),
            "free",
        ],
    ));
    p.wait_file("held");
    h
}

#[test]
fn a_waiter_gets_the_memory_when_a_member_frees_it() {
    let p = Pool::new("wait-served");
    let h = holder(&p);
    let w = p.waiter("w.json", &["alloc:500Mi", "info"]);
    p.wait_waiters(1);
    std::thread::sleep(Duration::from_millis(300));
    p.touch("go");
    assert_ok(&finish(h));
    let w = finish(w);
    assert!(has(&w, &format!("alloc {} 0", 500 * MIB)), "{}", dump(&w));
    let err = stderr(&w);
    assert!(
        err.contains("waiting for 500 MiB on GPU 0: the pool has no room now"),
        "{}",
        dump(&w)
    );
    let waited: f64 = err
        .split("after waiting ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no 'got ... after waiting' line\n{}", dump(&w)));
    assert!(
        waited >= 0.3,
        "it could not get the memory before it was freed: {waited}"
    );
    assert_eq!(p.waiters(), 0);
}

#[test]
fn waiters_are_served_in_arrival_order_and_small_ones_do_not_jump_the_queue() {
    let p = Pool::new("wait-fifo");
    let h = holder(&p);
    let w1 = p.waiter(
        "1.json",
        &[
            "alloc:950Mi",
            &format!("touch:{}", p.path("w1")),
            &format!("wait:{}", p.path("w1free")),
            "free",
        ],
    );
    p.wait_waiters(1);
    let w2 = p.waiter(
        "2.json",
        &["alloc:100Mi", &format!("touch:{}", p.path("w2"))],
    );
    p.wait_waiters(2);
    let w3 = p.waiter(
        "3.json",
        &["alloc:50Mi", &format!("touch:{}", p.path("w3"))],
    );
    p.wait_waiters(3);
    // 100 and 50 MiB fit beside the holder's 800 now, but the 950 MiB request came first.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !p.dir.join("w2").exists() && !p.dir.join("w3").exists(),
        "a later, smaller request jumped the queue"
    );
    p.touch("go");
    p.wait_file("w1");
    // 50 MiB fit beside the 950 now, but the 100 MiB request came first.
    std::thread::sleep(Duration::from_millis(200));
    if p.dir.join("w2").exists() || p.dir.join("w3").exists() {
        p.touch("w1free");
        let outs: Vec<String> = [w2, w3].into_iter().map(|w| dump(&finish(w))).collect();
        panic!(
            "served out of order (w2 {}, w3 {})\n{}",
            p.dir.join("w2").exists(),
            p.dir.join("w3").exists(),
            outs.join("\n")
        );
    }
    p.touch("w1free");
    for w in [w1, w2, w3] {
        let o = finish(w);
        assert_ok(&o);
        assert!(
            stdout(&o)
                .lines()
                .any(|l| l.starts_with("alloc ") && l.ends_with(" 0")),
            "{}",
            dump(&o)
        );
    }
    assert_ok(&finish(h));
    assert_eq!(p.waiters(), 0);
}

#[test]
fn a_wait_that_times_out_is_refused_with_the_usual_line() {
    let p = Pool::new("wait-timeout");
    let h = holder(&p);
    let w = run(p
        .script("w.json", &["alloc:500Mi"])
        .env("GPUCAP_WAIT", "300ms"));
    p.touch("go");
    assert_ok(&finish(h));
    assert!(
        has(&w, &format!("alloc {} {OOM}", 500 * MIB)),
        "{}",
        dump(&w)
    );
    let r = refusals(&stderr(&w));
    assert_eq!(r.len(), 1, "{}", dump(&w));
    assert!(
        r[0].contains("after waiting 0.3 s for members to free memory"),
        "{}",
        r[0]
    );
    assert_eq!(p.waiters(), 0);
}

#[test]
fn a_killed_waiter_leaves_nothing_behind() {
    let p = Pool::new("wait-killed");
    let h = holder(&p);
    let mut w1 = p.waiter("1.json", &["alloc:900Mi"]);
    p.wait_waiters(1);
    sigkill(&mut w1);
    p.wait_live_members(1);
    // 100 MiB fit; the dead waiter's ticket does not hold the request up.
    let w2 = run(p
        .script("2.json", &["alloc:100Mi"])
        .env("GPUCAP_WAIT", "60s"));
    p.touch("go");
    assert_ok(&finish(h));
    assert!(has(&w2, &format!("alloc {} 0", 100 * MIB)), "{}", dump(&w2));
    assert_eq!(p.waiters(), 0, "the dead waiter's ticket was taken back");
}

#[test]
fn a_waiter_whose_holder_is_killed_gets_the_memory() {
    let p = Pool::new("wait-holder-killed");
    let mut h = holder(&p);
    let w = p.waiter("w.json", &["alloc:500Mi"]);
    p.wait_waiters(1);
    sigkill(&mut h);
    let w = finish(w);
    assert!(has(&w, &format!("alloc {} 0", 500 * MIB)), "{}", dump(&w));
    assert!(
        stderr(&w).contains("got 500 MiB on GPU 0 after waiting"),
        "{}",
        dump(&w)
    );
}

// ---------------------------------------------------------------------------
// Guarantees and ceilings inside a pool (GPUCAP_GUARANTEE, GPUCAP_CEILING).

#[test]
fn a_guaranteed_member_gets_its_guarantee_though_a_neighbour_tried_to_take_everything() {
    let p = Pool::new("share-floor");
    let notebook = spawn(
        p.script(
            "n.json",
            &[
                &format!("touch:{}", p.path("n-in")),
                &format!("wait:{}", p.path("t-full")),
                "alloc:250Mi",
                "alloc:150Mi",
                "info",
                &format!("touch:{}", p.path("n-done")),
            ],
        )
        .env("GPUCAP_GUARANTEE", "400Mi"),
    );
    p.wait_file("n-in");
    let trainer = run(&mut p.script(
        "t.json",
        &[
            "alloc:1Gi",
            "fill:64Mi",
            "info",
            &format!("touch:{}", p.path("t-full")),
            &format!("wait:{}", p.path("n-done")),
        ],
    ));
    let notebook = finish(notebook);
    assert_ok(&notebook);
    assert!(
        has(&trainer, &format!("alloc {} {OOM}", 1024 * MIB)),
        "{}",
        dump(&trainer)
    );
    assert!(
        has(&trainer, "filled 9"),
        "the trainer got 9 x 64 MiB: 1 GiB less the notebook's 400 MiB\n{}",
        dump(&trainer)
    );
    assert!(
        has(&trainer, &format!("info {} {}", 48 * MIB, 1024 * MIB)),
        "the trainer sees 48 MiB free: the 400 MiB kept for the notebook are not\n{}",
        dump(&trainer)
    );
    for size in [250, 150] {
        assert!(
            has(&notebook, &format!("alloc {} 0", size * MIB)),
            "{}",
            dump(&notebook)
        );
    }
    assert!(
        has(&notebook, &format!("info {} {}", 48 * MIB, 1024 * MIB)),
        "{}",
        dump(&notebook)
    );
    assert!(p.shared_peak("t.json").max(p.shared_peak("n.json")) <= 1024 * MIB);
    assert_eq!(p.used_peak().0, 0, "both left: nothing held");
}

#[test]
fn a_ceiling_refuses_past_it_with_the_members_own_line() {
    let p = Pool::new("share-ceiling");
    let o = run(p
        .script(
            "c.json",
            &["alloc:200Mi", "alloc:200Mi", "info", "alloc:100Mi"],
        )
        .env("GPUCAP_CEILING", "300Mi"));
    assert_ok(&o);
    assert!(has(&o, &format!("alloc {} 0", 200 * MIB)), "{}", dump(&o));
    assert!(
        has(&o, &format!("alloc {} {OOM}", 200 * MIB)),
        "{}",
        dump(&o)
    );
    assert!(
        has(&o, &format!("info {} {}", 100 * MIB, 300 * MIB)),
        "total is the ceiling, free what is left of it\n{}",
        dump(&o)
    );
    assert!(has(&o, &format!("alloc {} 0", 100 * MIB)), "{}", dump(&o));
    let refusal = refusals(&stderr(&o));
    assert_eq!(refusal.len(), 1, "{}", dump(&o));
    assert!(
        refusal[0].contains("200 MiB of this process's 300 MiB ceiling in use (GPUCAP_CEILING")
            && refusal[0].contains(&p.file().display().to_string()),
        "{}",
        refusal[0]
    );
}

#[test]
fn borrowed_bytes_return_to_the_pool_as_the_borrower_frees() {
    let p = Pool::new("share-borrow");
    let a = spawn(
        p.script(
            "a.json",
            &[
                &format!("touch:{}", p.path("a-in")),
                &format!("wait:{}", p.path("b-took")),
                "alloc:600Mi",
                "alloc:300Mi",
                &format!("touch:{}", p.path("a-full")),
                &format!("wait:{}", p.path("b-freed")),
                "alloc:300Mi",
                "info",
            ],
        )
        .env("GPUCAP_GUARANTEE", "600Mi"),
    );
    p.wait_file("a-in");
    let b = run(&mut p.script(
        "b.json",
        &[
            "alloc:400Mi",
            "alloc:100Mi",
            &format!("touch:{}", p.path("b-took")),
            &format!("wait:{}", p.path("a-full")),
            "free",
            &format!("touch:{}", p.path("b-freed")),
        ],
    ));
    let a = finish(a);
    assert!(
        has(&b, &format!("alloc {} 0", 400 * MIB)),
        "B borrows\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} {OOM}", 100 * MIB)),
        "but not into A's unused 600 MiB\n{}",
        dump(&b)
    );
    assert!(has(&a, &format!("alloc {} 0", 600 * MIB)), "{}", dump(&a));
    assert!(
        has(&a, &format!("alloc {} {OOM}", 300 * MIB)),
        "B's borrowed 400 MiB are B's while it holds them\n{}",
        dump(&a)
    );
    assert!(
        has(&a, &format!("alloc {} 0", 300 * MIB)),
        "B freed: A borrows them\n{}",
        dump(&a)
    );
    assert!(
        has(&a, &format!("info {} {}", 124 * MIB, 1024 * MIB)),
        "{}",
        dump(&a)
    );
}

/// A member holding a guarantee until `release` exists (its own file names it).
fn guaranteed(p: &Pool, stats: &str, guarantee: &str, steps: &[&str], release: &str) -> Child {
    let ready = format!("{stats}.in");
    let mut all: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
    all.push(format!("touch:{}", p.path(&ready)));
    all.push(format!("wait:{}", p.path(release)));
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let c = spawn(p.script(stats, &refs).env("GPUCAP_GUARANTEE", guarantee));
    p.wait_file(&ready);
    c
}

#[test]
fn a_guarantee_that_does_not_fit_is_refused_at_cuinit_naming_who_holds_the_others() {
    let p = Pool::new("share-admit");
    let a = guaranteed(&p, "a.json", "700Mi", &[], "a-go");
    let b = run(p
        .script("b.json", &["alloc:1Mi"])
        .env("GPUCAP_GUARANTEE", "500Mi"));
    assert!(has(&b, "cuInit 800"), "refused at cuInit\n{}", dump(&b));
    let err = stderr(&b);
    assert_eq!(err.lines().count(), 1, "one line\n{}", dump(&b));
    for part in [
        "cannot join the pool t",
        &p.file().display().to_string(),
        "a guarantee of 500 MiB does not fit: 700 MiB of the pool's 1 GiB cap is guaranteed already",
        &format!("700 MiB to pid {}", a.id()),
    ] {
        assert!(err.contains(part), "{part:?} in\n{}", dump(&b));
    }
    // One that fits is admitted beside it.
    let c = run(p
        .script("c.json", &["alloc:300Mi"])
        .env("GPUCAP_GUARANTEE", "300Mi"));
    assert!(has(&c, &format!("alloc {} 0", 300 * MIB)), "{}", dump(&c));
    p.touch("a-go");
    assert_ok(&finish(a));
}

#[test]
fn a_guarantee_that_does_not_fit_waits_for_a_member_to_leave_with_gpucap_wait() {
    let p = Pool::new("share-admit-wait");
    let a = guaranteed(&p, "a.json", "700Mi", &[], "a-go");
    let b = spawn(
        p.script("b.json", &["alloc:500Mi"])
            .env("GPUCAP_GUARANTEE", "500Mi")
            .env("GPUCAP_WAIT", "30s"),
    );
    // B is a member (it holds its slot's lock) waiting to be admitted.
    p.wait_live_members(2);
    let left = Instant::now();
    p.touch("a-go");
    assert_ok(&finish(a));
    let b = finish(b);
    assert!(
        has(&b, "cuInit 0") || !stdout(&b).contains("cuInit"),
        "{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} 0", 500 * MIB)),
        "admitted once A left\n{}",
        dump(&b)
    );
    assert!(left.elapsed() < Duration::from_secs(30));
    // Without anyone leaving, the wait ends with the refusal and says it waited.
    let a = guaranteed(&p, "a2.json", "700Mi", &[], "a2-go");
    let c = run(p
        .script("c.json", &["alloc:1Mi"])
        .env("GPUCAP_GUARANTEE", "500Mi")
        .env("GPUCAP_WAIT", "300ms"));
    assert!(has(&c, "cuInit 800"), "{}", dump(&c));
    assert!(stderr(&c).contains("after waiting"), "{}", dump(&c));
    p.touch("a2-go");
    assert_ok(&finish(a));
}

#[test]
fn a_killed_members_guarantee_and_bytes_come_back() {
    let p = Pool::new("share-kill");
    let mut a = guaranteed(&p, "a.json", "800Mi", &["alloc:100Mi"], "never");
    let b = run(&mut p.script("b.json", &["alloc:300Mi", "info"]));
    assert!(
        has(&b, &format!("alloc {} {OOM}", 300 * MIB)),
        "A's unused 700 MiB are kept for it\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("info {} {}", 224 * MIB, 1024 * MIB)),
        "{}",
        dump(&b)
    );
    sigkill(&mut a);
    let killed = Instant::now();
    // The next member needs both: a 900 MiB guarantee (admitted) and the bytes.
    let c = run(p
        .script("c.json", &["alloc:900Mi", "info"])
        .env("GPUCAP_GUARANTEE", "900Mi"));
    assert!(has(&c, &format!("alloc {} 0", 900 * MIB)), "{}", dump(&c));
    assert!(
        has(&c, &format!("info {} {}", 124 * MIB, 1024 * MIB)),
        "{}",
        dump(&c)
    );
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(p.used_peak().0, 0);
}

#[test]
fn processes_of_sixteen_threads_with_random_guarantees_and_ceilings_never_over_commit() {
    let p = Pool::new("share-churn");
    // Guarantees 0..160 MiB each (five add up to at most the 512 MiB cap... less than
    // it), ceilings between the guarantee and the cap.
    let mut seed = 0x51_7cc1_b727_220au64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let shares: Vec<(u64, u64)> = (0..5)
        .map(|_| {
            let g = rand(100) * MIB;
            (g, g + (1 + rand((512 * MIB - g) / MIB)) * MIB)
        })
        .collect();
    let procs: Vec<Child> = shares
        .iter()
        .enumerate()
        .map(|(i, &(g, c))| {
            let mut cmd = p.cmd(churn(), &format!("s{i}.json"));
            cmd.env("GPUCAP_LIMIT", "512Mi")
                .env("GPUCAP_CEILING", c.to_string())
                .args([
                    "16",
                    "200",
                    "48Mi",
                    &p.path(&format!("ready{i}")),
                    &p.path("go"),
                    &g.to_string(),
                ]);
            if g > 0 {
                cmd.env("GPUCAP_GUARANTEE", g.to_string());
            }
            spawn(&mut cmd)
        })
        .collect();
    for i in 0..shares.len() {
        p.wait_file(&format!("ready{i}"));
    }
    p.touch("go");
    let (mut refused, mut checked) = (0, 0);
    let field = |line: &str, name: &str| -> u64 {
        line.split(&format!("{name}="))
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {line:?}"))
    };
    for (i, c) in procs.into_iter().enumerate() {
        let o = finish(c);
        assert_ok(&o);
        let out = stdout(&o);
        let churn = out.lines().find(|l| l.starts_with("churn ")).unwrap();
        refused += field(churn, "refused");
        if shares[i].0 > 0 {
            let line = out.lines().find(|l| l.starts_with("checked=")).unwrap();
            assert_eq!(
                field(line, "broken"),
                0,
                "a live guarantee was broken\n{}",
                dump(&o)
            );
            checked += field(line, "checked");
        }
        let peak = p.shared_peak(&format!("s{i}.json"));
        assert!(
            peak <= 512 * MIB,
            "the fake GPU held {peak} bytes at once, over the cap"
        );
    }
    assert!(refused > 0, "the processes competed for the cap");
    assert!(checked > 0, "no request inside a guarantee was checked");
    let (used, peak) = p.used_peak();
    assert_eq!(used, 0, "every byte came back to the pool");
    assert!(peak <= 512 * MIB && peak > 256 * MIB, "peak {peak}");
}

// ---- Hostile and unlucky states of the pool file -----------------------------------------

/// Runs `c` and fails the test if it has not exited within `secs` (it is killed then):
/// proof that nothing waits forever.
fn run_within(c: &mut Command, secs: u64) -> Output {
    let mut child = spawn(c);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            sigkill(&mut child);
            panic!("{c:?} still ran after {secs} s: it hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    finish(child)
}

/// Processor time (user + system) of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

impl Pool {
    /// Writes word `i` of the pool file (as another process of the same user could).
    fn write_word(&self, i: usize, value: u64) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.file())
            .unwrap();
        f.write_all_at(&value.to_le_bytes(), i as u64 * 8).unwrap();
    }

    fn word(&self, i: usize) -> u64 {
        let bytes = std::fs::read(self.file()).expect("pool file");
        u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap())
    }
}

/// GPU entry 0's lock word, and its waiting bit (src/core/budget/layout.rs).
const G0_LOCK: usize = 16 + 6;
const LOCK_WAITING: u64 = 1 << 16;

#[test]
fn a_stopped_word_lock_holder_blocks_no_allocation_and_costs_the_blocked_members_no_processor_time()
{
    let p = Pool::new("pool-sigstop");
    // The holder: the pool's first member (slot 0), stopped with its slot in GPU 0's
    // word lock, as if inside a recount (written here: no member stops there of its
    // own accord).
    let mut h = spawn(&mut p.script(
        "h.json",
        &[
            "alloc:100Mi",
            &format!("touch:{}", p.path("held")),
            &format!("wait:{}", p.path("never")),
        ],
    ));
    p.wait_file("held");
    let hpid = h.id() as i32;
    // SAFETY: signals to our own child.
    unsafe { libc::kill(hpid, libc::SIGSTOP) };
    p.write_word(G0_LOCK, 1);
    // An allocation the pool can take takes no lock: it goes on.
    let o = run_within(
        &mut p.script("free.json", &["alloc:100Mi", "free", "alloc:800Mi"]),
        30,
    );
    assert!(has(&o, &format!("alloc {} 0", 800 * MIB)), "{}", dump(&o));
    // One the pool cannot take (100 + 1000 MiB of 1 GiB) is recounted before it is
    // refused, under the lock: it sleeps on it.
    let blocked: Vec<Child> = (0..1)
        .map(|i| spawn(&mut p.script(&format!("b{i}.json"), &["alloc:1000Mi"])))
        .collect();
    // Wait until a blocked member sleeps on the word (it sets the waiting bit; today's
    // spinners never do, so fall back to a second of their spinning).
    let start = Instant::now();
    while p.word(G0_LOCK) & LOCK_WAITING == 0 && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let before: Vec<u64> = blocked.iter().map(|c| cpu_ticks(c.id())).collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let after: Vec<u64> = blocked.iter().map(|c| cpu_ticks(c.id())).collect();
    let wall_ticks = t0.elapsed().as_millis() as u64 / 10; // 100 ticks a second
    for (b, a) in before.iter().zip(&after) {
        eprintln!("a blocked member used {} of {wall_ticks} ticks", a - b);
        assert!(
            (a - b) * 20 <= wall_ticks,
            "a blocked member burnt {} of {wall_ticks} ticks (over 5 %) on a stopped holder",
            a - b
        );
    }
    // `gpucap status` says who holds the lock and since when members wait for it.
    let mut st = fake_cmd(cli(), &p.dir.join("st.json"));
    st.args(["status", "--pool", "t"])
        .env("GPUCAP_POOL_DIR", &p.dir);
    let o = run_within(&mut st, 30);
    assert_ok(&o);
    let text = stdout(&o);
    assert!(
        text.lines().any(|l| l.starts_with("word lock of GPU-")
            && l.contains(&format!(
                ": held by pid {hpid} (slot 0), members waiting for it since "
            ))),
        "{text}"
    );
    let o = run_within(st.arg("--json"), 30);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let lock = &doc["gpus"][0]["lock"];
    assert_eq!(
        (lock["pid"].as_i64(), lock["slot"].as_u64()),
        (Some(hpid as i64), Some(0))
    );
    assert!(lock["since_ms"].as_u64().is_some(), "{doc}");
    // The holder dies: the blocked member notices within its next look, takes the
    // holder's share back and is served.
    sigkill(&mut h);
    for b in blocked {
        let o = finish(b);
        assert!(has(&o, &format!("alloc {} 0", 1000 * MIB)), "{}", dump(&o));
    }
    assert_eq!(p.word(G0_LOCK), 0);
}

#[test]
fn a_fifo_at_the_pools_path_fails_closed_at_once() {
    let p = Pool::new("pool-fifo");
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let c = std::ffi::CString::new(p.file().to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = run_within(&mut p.script("s.json", &["alloc:1Mi"]), 30);
    assert!(has(&o, "cuInit 800"), "fail closed\n{}", dump(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{}", dump(&o));
    assert!(
        err.contains("cannot join the pool t") && err.contains("it is not a regular file"),
        "{}",
        dump(&o)
    );
}

#[test]
fn two_first_joiners_with_one_pid_do_not_remove_each_others_temporary_file() {
    if !unshare_works() {
        return;
    }
    let p = Pool::new("pool-tmpname");
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Another first joiner, PID 1 of its namespace, is making the file: its temporary
    // file has the name today's creator gives its own (the pid alone) and names to come.
    let theirs = [dir.join(".t.pool.1.new")];
    for f in &theirs {
        std::fs::write(f, b"being made").unwrap();
    }
    // Two creators, each PID 1 of its own namespace.
    let in_ns = |stats: &str| {
        let mut c = p.cmd("unshare", stats);
        c.args(["-pf", "--mount-proc", "--kill-child"])
            .arg(script())
            .arg("alloc:1Mi");
        spawn(&mut c)
    };
    let (a, b) = (in_ns("a.json"), in_ns("b.json"));
    for o in [finish(a), finish(b)] {
        assert!(has(&o, &format!("alloc {} 0", MIB)), "{}", dump(&o));
    }
    for f in &theirs {
        assert_eq!(
            std::fs::read(f).ok().as_deref(),
            Some(&b"being made"[..]),
            "{} was removed by a creator in another PID namespace",
            f.display()
        );
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".new") && n != ".t.pool.1.new")
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A neighbour's charge that could not be refused: B holds 510 MiB of a 1 GiB pool, then
/// its first use of a library (a launch) or of a module's function
/// (`cuModuleGetFunction`) makes the driver load 256 MiB that nobody could foresee,
/// charged by force: 254 MiB of it past the cap (A's unused guarantee of 512 MiB is not
/// counted as room). The cap in force wins for every admission: A's 512 MiB, inside its
/// guarantee, is refused while the pool stands past what it can hold ("766 MiB of the
/// pool's 1 GiB cap in use"), and served once B gave its 510 MiB back. The fake driver
/// never holds more than the cap plus what was forced past it (254 MiB), and nothing
/// but the forced charge takes the pool past the cap.
#[test]
fn a_forced_charge_past_the_cap_holds_a_guarantee_off_until_memory_is_given_back() {
    for (step, var) in [
        ("kernel", "FAKECUDA_LIBRARY_MEM"),
        ("getfn", "FAKECUDA_FUNCTION_MEM"),
    ] {
        let p = Pool::new(&format!("forced-guarantee-{step}"));
        let a = spawn(
            p.script(
                "a.json",
                &[
                    &format!("touch:{}", p.path("a-in")),
                    &format!("wait:{}", p.path("b-loaded")),
                    "alloc:512Mi",
                    &format!("touch:{}", p.path("a-tried")),
                    &format!("wait:{}", p.path("b-freed")),
                    "alloc:512Mi",
                    &format!("touch:{}", p.path("a-done")),
                ],
            )
            .env("GPUCAP_GUARANTEE", "512Mi"),
        );
        p.wait_file("a-in");
        let b = run(p
            .script(
                "b.json",
                &[
                    "alloc:510Mi",
                    step,
                    &format!("touch:{}", p.path("b-loaded")),
                    &format!("wait:{}", p.path("a-tried")),
                    "free",
                    &format!("touch:{}", p.path("b-freed")),
                    &format!("wait:{}", p.path("a-done")),
                ],
            )
            .env(var, "256Mi"));
        let a = finish(a);
        assert!(has(&b, &format!("{step} 0")), "{step}: {}", dump(&b));
        let tries: Vec<String> = lines(&a)
            .into_iter()
            .filter(|l| l.starts_with(&format!("alloc {} ", 512 * MIB)))
            .collect();
        assert_eq!(
            tries,
            [
                format!("alloc {} 2", 512 * MIB),
                format!("alloc {} 0", 512 * MIB)
            ],
            "{step}: refused past the cap, then served once B gave back\n{}",
            dump(&a)
        );
        assert!(
            stderr(&a).contains("766 MiB of the pool's 1 GiB cap in use"),
            "{step}: the pool's line\n{}",
            dump(&a)
        );
        let peak = p.shared_peak("b.json").max(p.shared_peak("a.json"));
        assert!(
            peak <= (1024 + 254) * MIB,
            "{step}: the fake driver held {} MiB",
            peak / MIB
        );
    }
}

/// Where the share words start (src/core/budget/layout.rs: 16 header words, 32 GPU
/// entries of 24, 256 member slots of 16 + 32 x 10), GPU entry 0's first word of holder
/// bits, and slot `s`'s guarantee word on GPU entry 0.
const SHARES_AT: usize = 16 + 32 * 24 + 256 * (16 + 32 * 10);
const G0_HOLDER_BITS: usize = SHARES_AT;
fn g0_guarantee_word(s: usize) -> usize {
    SHARES_AT + 32 * 4 + s * 32 * 2
}

/// `gpucap status --pool t --json` of pool `p`, and its text form.
fn status_json(p: &Pool) -> (serde_json::Value, String) {
    let mut st = fake_cmd(cli(), &p.dir.join("st.json"));
    st.args(["status", "--pool", "t"])
        .env("GPUCAP_POOL_DIR", &p.dir);
    let text = stdout(&run_within(&mut st, 30));
    let o = run_within(st.arg("--json"), 30);
    (serde_json::from_str(&stdout(&o)).unwrap(), text)
}

#[test]
fn impossible_guarantee_words_in_the_pool_file_are_repaired_and_stop_nobody() {
    let p = Pool::new("pool-share-repair");
    assert_ok(&run_within(&mut p.script("init.json", &["alloc:1Mi"]), 30));
    // An empty slot's holder bit, with a guarantee of the whole cap.
    p.write_word(G0_HOLDER_BITS, 1 << 7);
    p.write_word(g0_guarantee_word(7), 1 << 30);
    let (doc, text) = status_json(&p);
    assert!(
        doc["gpus"][0]["guaranteed"].as_u64() <= Some(1 << 30),
        "{doc}"
    );
    assert_eq!(doc["gpus"][0]["share_drift"], true, "{doc}");
    assert!(
        text.contains("the next joiner or refusal repairs them"),
        "{text}"
    );
    // A joiner with a 900 MiB guarantee: admitted and served, with one warn line.
    let o = run_within(
        p.script("j.json", &["alloc:900Mi"])
            .env("GPUCAP_GUARANTEE", "900Mi"),
        30,
    );
    assert!(has(&o, &format!("alloc {} 0", 900 * MIB)), "{}", dump(&o));
    assert!(
        stderr(&o).contains("with its holder bit set, but no live member holds the slot"),
        "{}",
        dump(&o)
    );
    assert_eq!(p.word(G0_HOLDER_BITS), 0);
    // A live member's guarantee word set to 2^64 - 1.
    let a = spawn(
        p.script(
            "a.json",
            &[
                &format!("touch:{}", p.path("a-in")),
                &format!("wait:{}", p.path("a-go")),
                "alloc:300Mi",
            ],
        )
        .env("GPUCAP_GUARANTEE", "300Mi"),
    );
    p.wait_file("a-in");
    p.write_word(g0_guarantee_word(0), u64::MAX);
    let (doc, text) = status_json(&p);
    assert!(
        doc["gpus"][0]["guaranteed"].as_u64() <= Some(1 << 30),
        "{doc}"
    );
    assert!(
        doc["members"][0]["gpus"][0]["guarantee"].as_u64() <= Some(1 << 30),
        "{doc}"
    );
    assert!(!text.contains("EiB"), "{text}");
    // A neighbour borrows: served, the word repaired by its refusal, with a warn line.
    let b = spawn(&mut p.script(
        "b.json",
        &[
            "alloc:500Mi",
            &format!("touch:{}", p.path("b-in")),
            &format!("wait:{}", p.path("b-go")),
        ],
    ));
    p.wait_file("b-in");
    // The guaranteed member is served its guarantee beside it.
    p.touch("a-go");
    let a = finish(a);
    assert!(has(&a, &format!("alloc {} 0", 300 * MIB)), "{}", dump(&a));
    p.touch("b-go");
    let b = finish(b);
    assert!(has(&b, &format!("alloc {} 0", 500 * MIB)), "{}", dump(&b));
    assert!(
        stderr(&b).contains("above the pool's 1073741824-byte cap"),
        "{}",
        dump(&b)
    );
    assert!(p.shared_peak("b.json") <= 1 << 30);
}

/// A library's kernel loaded into several contexts of two members: each
/// context's copy is charged to the pool, so that a 1 GiB pool of two members launching
/// it in three contexts each (6 x 200 MiB) refuses the copies past its cap before the
/// driver loads them, and the fake driver never holds more than the cap (before, the
/// pool counted one copy per process: 400 MiB, while the driver held 1,200).
#[test]
fn a_librarys_kernels_in_every_context_of_every_member_are_charged_to_the_pool() {
    let p = Pool::new("pool-kernel-contexts");
    let member = |stats: &str, go: &str, done: &str| {
        spawn(
            p.script(
                stats,
                &[
                    &format!("wait:{}", p.path(go)),
                    "contexts:3",
                    &format!("touch:{}", p.path(done)),
                    &format!("wait:{}", p.path("end")),
                ],
            )
            .env("FAKECUDA_LIBRARY_MEM", "200Mi"),
        )
    };
    // B starts once A's copies are loaded: a context is measured device-wide, so B's own
    // context made while A's kernels load would be charged A's loads too (counted in,
    // never less: counting.md).
    let a = member("a.json", "go-a", "a-done");
    p.touch("go-a");
    p.wait_file("a-done");
    let b = member("b.json", "go-b", "b-done");
    p.touch("go-b");
    p.wait_file("b-done");
    let (used, _) = p.used_peak();
    p.touch("end");
    let (a, b) = (finish(a), finish(b));
    let served = |o: &Output| {
        (1..=3)
            .filter(|c| has(o, &format!("contexts {c} 0")))
            .count()
    };
    assert_eq!(served(&a), 3, "{}", dump(&a));
    assert_eq!(
        served(&b),
        2,
        "B's third copy (past 1 GiB) must be refused\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("contexts 3 {OOM}")),
        "refused with the driver's out-of-memory\n{}",
        dump(&b)
    );
    assert_eq!(
        used,
        1000 * MIB,
        "five copies of 200 MiB charged to the pool"
    );
    let peak = p.shared_peak("a.json").max(p.shared_peak("b.json"));
    assert!(peak <= 1 << 30, "the fake driver held {} MiB", peak / MIB);
}

/// A lowered stack limit gives back, to the pool, what the driver gave back: A's stack takes 660 MiB of the 1 GiB pool (5 x 132 MiB on the fake), so B's
/// 512 MiB is refused; A lowers it to 264 MiB, measured with the pool's marks (A's own
/// announcement of the free taken out again), and B is then served exactly the rest:
/// 760 MiB, and not 2 MiB more. A lowered limit left charged refuses B's 760 MiB; one
/// credited twice (the announcement counted as given back too) serves the 2 MiB.
#[test]
fn a_lowered_stack_limit_gives_its_bytes_to_another_member() {
    let p = Pool::new("pool-stack-lowered");
    let a = spawn(&mut p.script(
        "a.json",
        &[
            "stack:5",
            &format!("touch:{}", p.path("a1")),
            &format!("wait:{}", p.path("b1")),
            "stack:2",
            &format!("touch:{}", p.path("a2")),
            &format!("wait:{}", p.path("end")),
        ],
    ));
    let b = spawn(&mut p.script(
        "b.json",
        &[
            &format!("wait:{}", p.path("a1")),
            "alloc:512Mi",
            &format!("touch:{}", p.path("b1")),
            &format!("wait:{}", p.path("a2")),
            "alloc:760Mi",
            "alloc:2Mi",
            &format!("touch:{}", p.path("b2")),
            &format!("wait:{}", p.path("end")),
        ],
    ));
    p.wait_file("b2");
    let (used, _) = p.used_peak();
    p.touch("end");
    let (a, b) = (finish(a), finish(b));
    assert!(has(&a, "stack 5 0") && has(&a, "stack 2 0"), "{}", dump(&a));
    assert!(
        has(&b, &format!("alloc {} {OOM}", 512 * MIB)),
        "B's 512 MiB beside A's 660 MiB stack must be refused\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} 0", 760 * MIB)),
        "the 396 MiB the lowered stack gave back must serve B\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} {OOM}", 2 * MIB)),
        "A's 264 MiB stack must still be charged\n{}",
        dump(&b)
    );
    assert_eq!(used, 1024 * MIB, "A's 264 MiB stack and B's 760 MiB");
    let peak = p.shared_peak("a.json").max(p.shared_peak("b.json"));
    assert!(peak <= 1 << 30, "the fake driver held {} MiB", peak / MIB);
}

/// Two members whose contexts are made at the same moment (the fake's
/// `FAKECUDA_CONTEXT_DELAY_MS`: a context takes its 100 MiB halfway through 2 s, as a real
/// driver takes a while) are each charged their own context: the pool's context window
/// serialises their measurements. Before it, each measurement (device-wide) saw the other
/// member's context too, and the first charge made inside the other's window was taken off
/// it as the pool's traffic: one member charged 200 MiB and the other 0 B (when the first
/// left, the pool counted nothing for a context of 100 MiB still held), or both 200 MiB.
#[test]
fn members_making_contexts_at_once_are_charged_their_own() {
    let p = Pool::new("pool-ctx-window");
    let member = |tag: &str| {
        let mut c = p.script(
            &format!("{tag}.json"),
            &[
                &format!("touch:{}", p.path(tag)),
                &format!("wait:{}", p.path(&format!("{tag}-go"))),
            ],
        );
        c.env("FAKECUDA_CONTEXT_MEM", "100Mi")
            .env("FAKECUDA_CONTEXT_DELAY_MS", "2000");
        spawn(&mut c)
    };
    let (a, b) = (member("a"), member("b"));
    p.wait_file("a");
    p.wait_file("b");
    let both = p.used_peak().0;
    p.touch("a-go");
    assert_ok(&finish(a));
    let after_a = p.used_peak().0;
    p.touch("b-go");
    assert_ok(&finish(b));
    assert_eq!(
        (both / MIB, after_a / MIB, p.used_peak().0),
        (200, 100, 0),
        "MiB the pool charged: both members holding their 100 MiB context, then the second \
         alone, then none"
    );
}

/// A member of pool `t` that makes its context (`CONTEXT_MEM`, taking `delay_ms` to
/// make), touches `<tag>` and holds it until `<tag>-go` exists.
fn context_holder(p: &Pool, tag: &str, mem: &str, delay_ms: u64) -> Command {
    let mut c = p.cmd(script(), &format!("{tag}.json"));
    context_steps(p, &mut c, tag, mem, delay_ms);
    c
}

/// [`context_holder`] as PID 1 of a PID namespace of its own with its own /proc, as in a
/// container: NVML's pids are not provably its own there, so its context is measured
/// device-wide only.
fn context_holder_in_pidns(p: &Pool, tag: &str, mem: &str, delay_ms: u64) -> Command {
    let mut c = p.cmd("unshare", &format!("{tag}.json"));
    c.args(["-pf", "--mount-proc", "--kill-child"])
        .arg(script());
    context_steps(p, &mut c, tag, mem, delay_ms);
    c
}

fn context_steps(p: &Pool, c: &mut Command, tag: &str, mem: &str, delay_ms: u64) {
    c.arg(format!("touch:{}", p.path(tag)))
        .arg(format!("wait:{}", p.path(&format!("{tag}-go"))))
        .env("FAKECUDA_CONTEXT_MEM", mem)
        .env("FAKECUDA_CONTEXT_DELAY_MS", delay_ms.to_string())
        .env("GPUCAP_LIMIT", "4Gi");
}

#[test]
fn sixteen_members_making_slow_contexts_at_once_are_each_charged_their_context() {
    // Started together, nobody's figure known yet, each charged one context, never less:
    // measured by NVML's figure for each process on the host; in PID namespaces (where
    // that figure is not provably theirs) the first context is measured alone and the
    // others beside each other.
    sixteen_slow_contexts("pool-ctx-sixteen", context_holder);
    if unshare_works() {
        sixteen_slow_contexts("pool-ctx-sixteen-ns", context_holder_in_pidns);
    }
}

fn sixteen_slow_contexts(tag: &str, holder: fn(&Pool, &str, &str, u64) -> Command) {
    const N: usize = 16;
    let p = Pool::new(tag);
    let procs: Vec<Child> = (0..N)
        .map(|i| spawn(&mut holder(&p, &format!("m{i}"), "100Mi", 600)))
        .collect();
    for i in 0..N {
        p.wait_file(&format!("m{i}"));
    }
    let held = p.used_peak().0;
    for i in 0..N {
        p.touch(&format!("m{i}-go"));
    }
    for c in procs {
        assert_ok(&finish(c));
    }
    assert_eq!(
        held,
        N as u64 * 100 * MIB,
        "{tag}: the pool's charge while {N} members held a 100 MiB context each"
    );
    assert_eq!(p.used_peak().0, 0, "every context's charge came back");
}

#[test]
fn a_member_stopped_while_making_its_context_holds_up_no_other_member() {
    let p = Pool::new("pool-ctx-stopped");
    // The pool's figure for a context is known (measured alone by the first member).
    let a = spawn(&mut context_holder(&p, "a", "64Mi", 0));
    p.wait_file("a");
    // S makes a context that takes 6 s, and is stopped in the middle of it.
    let s = spawn(&mut context_holder(&p, "s", "64Mi", 6000));
    let start = Instant::now();
    while p.gpu_word(0, 16) & 0xffff_ffff == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "S never began its context"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: kill has no memory-safety preconditions; S is our child.
    assert_eq!(unsafe { libc::kill(s.id() as i32, libc::SIGSTOP) }, 0);
    // T makes its context while S is stopped: it does not wait for S.
    let t = spawn(&mut context_holder(&p, "t", "64Mi", 0));
    let start = Instant::now();
    while !p.dir.join("t").exists() {
        // A hang guard, far above a context's making (the pool used to hold T 30 s).
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "T waited for the stopped member's context"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // A's and T's contexts, and S's, reserved at the figure before the driver was called.
    assert_eq!(
        p.used_peak().0,
        3 * 64 * MIB,
        "the pool's charge with S stopped"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(s.id() as i32, libc::SIGCONT) }, 0);
    p.wait_file("s");
    for tag in ["a", "s", "t"] {
        p.touch(&format!("{tag}-go"));
    }
    for c in [a, s, t] {
        let o = finish(c);
        assert_ok(&o);
        assert!(
            !stderr(&o).contains("was still being made"),
            "nobody waited for a first context: {}",
            dump(&o)
        );
    }
    assert_eq!(p.used_peak().0, 0);
}

#[test]
fn the_first_context_window_is_the_gpus_whatever_its_ordinal() {
    // X sees the fake's second GPU as its ordinal 0, Y as its ordinal 1, Z sees the
    // first GPU as its ordinal 0: all three make their first context at once, with
    // nothing measured yet. X and Y share a GPU: one is measured alone, the other waits
    // for its figure. Z is on another GPU: it waits for nobody.
    // In PID namespaces, as in containers: NVML's figure for each process is not
    // provably its own there, so the first context is measured alone.
    if !unshare_works() {
        return;
    }
    let p = Pool::new("pool-ctx-ordinals");
    let member = |tag: &str, visible: &str, ordinal: &str| {
        let mut c = context_holder_in_pidns(&p, tag, "100Mi", 2000);
        c.env("FAKECUDA_DEVICES", "2")
            .env("CUDA_VISIBLE_DEVICES", visible)
            .env("SCRIPT_DEVICE", ordinal)
            .env("GPUCAP_LOG", "debug");
        spawn(&mut c)
    };
    let x = member("x", "1", "0");
    let y = member("y", "0,1", "1");
    let z = member("z", "0", "0");
    for tag in ["x", "y", "z"] {
        p.wait_file(tag);
    }
    let held: u64 = (0..2).map(|g| p.gpu_word(g, 4) & ((1 << 48) - 1)).sum();
    for tag in ["x", "y", "z"] {
        p.touch(&format!("{tag}-go"));
    }
    let waited = |c: Child| {
        let o = finish(c);
        assert_ok(&o);
        stderr(&o).contains("for the pool's first context figure")
    };
    let (x, y, z) = (waited(x), waited(y), waited(z));
    assert!(
        x != y,
        "one of the two members on the second GPU waits for the other's figure (x waited: \
         {x}, y waited: {y})"
    );
    assert!(
        !z,
        "the member on the first GPU waited for another GPU's context"
    );
    assert_eq!(
        held,
        300 * MIB,
        "the pool's charge for three 100 MiB contexts on two GPUs"
    );
}
