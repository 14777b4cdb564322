//! A claim's pool file truncated under its members (docs/src/threat-model.md): any
//! container of the claim may write the file, so its members' words are a sealed memfd
//! they hand to each other (`src/pool-file/live/`), never a mapping of the file. Its
//! members go on under the claim's cap, sharing one budget, after the file is truncated;
//! a process joining the damaged file is refused.

use super::common;

use common::pool_scratch::*;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A claim's directory in `s` (mode 0777: every container's user may write it), named
/// `name`.
fn claim_dir(s: &Scratch, name: &str) -> PathBuf {
    let claim = s.dir.join(name);
    std::fs::create_dir_all(&claim).unwrap();
    std::fs::set_permissions(&claim, std::fs::Permissions::from_mode(0o777)).unwrap();
    claim
}

/// `program` preloading the shim as a process of the claim in `claim`, capped at 1 GiB,
/// its fake GPU's figures in `<tag>.json`.
fn in_claim(s: &Scratch, claim: &Path, program: PathBuf, tag: &str) -> Command {
    let mut c = fake_cmd(program, &s.dir.join(format!("{tag}.json")));
    c.env("LD_PRELOAD", shim())
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_CLAIM_DIR", claim)
        .env("GPUCAP_POOL_DIR", &s.pools)
        .current_dir(&s.dir);
    c
}

/// The script with `steps` as a member of the claim in `claim`; it ends holding its
/// memory until `never` exists.
fn member(s: &Scratch, claim: &Path, tag: &str, steps: &[String]) -> Child {
    in_claim(s, claim, script(), tag)
        .args(steps)
        .arg(format!("wait:{}", s.dir.join("never").display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A member of the claim that allocates `before` (MiB each), creates `<tag>-holds` and is
/// waited for there, then waits for `go`, allocates `after` and creates `<tag>-done`.
fn staged(s: &Scratch, claim: &Path, tag: &str, before: &[u64], after: &[u64]) -> Child {
    let mark = |n: &str| format!("{}", s.dir.join(format!("{tag}-{n}")).display());
    let alloc = |mib: &u64| format!("alloc:{}", mib * MIB);
    let steps: Vec<String> = (before.iter().map(alloc))
        .chain([format!("touch:{}", mark("holds"))])
        .chain([format!("wait:{}", s.dir.join("go").display())])
        .chain(after.iter().map(alloc))
        .chain([format!("touch:{}", mark("done"))])
        .collect();
    let mut m = member(s, claim, tag, &steps);
    until(&s.dir.join(format!("{tag}-holds")), &mut m, tag);
    m
}

/// The member `a` of the claim in `claim`, holding `mib` MiB (waited for).
fn holding(s: &Scratch, claim: &Path, mib: u64) -> Child {
    let holds = s.dir.join("a-holds");
    let mut a = member(
        s,
        claim,
        "a",
        &[
            format!("alloc:{}", mib * MIB),
            format!("touch:{}", holds.display()),
        ],
    );
    until(&holds, &mut a, "the member");
    a
}

/// A member of the claim in `claim` (600 MiB held) whose forked child never uses CUDA and
/// sleeps (`pool_fork sleep`), waited for until it forked: the child's pid is its
/// `child pid N` line.
fn forking_member(s: &Scratch, claim: &Path) -> Child {
    let ready = s.dir.join("ready");
    let mut c = in_claim(s, claim, compile_c("pool_fork", "", &["-lcuda"]), "a");
    c.arg("sleep")
        .arg(&ready)
        .arg(s.dir.join("never"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut a = c.spawn().unwrap();
    until(&ready, &mut a, "the member");
    a
}

/// Waits (60 s at most: a harness limit) until process `pid`, killed, is gone.
fn until_gone(pid: i32) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a finished program wrote, its standard output then its standard error.
fn both(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Waits (60 s at most: a harness limit) until `path` exists, or fails with what `child`
/// said if it exited first.
fn until(path: &Path, child: &mut Child, what: &str) {
    let give_up = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            let out = std::mem::replace(child, std::process::Command::new("true").spawn().unwrap())
                .wait_with_output()
                .unwrap();
            panic!(
                "{what} exited ({st}) before {}: {}",
                path.display(),
                both(&out)
            );
        }
        assert!(
            Instant::now() < give_up,
            "{what}: no {} after 60 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn said(child: Child) -> String {
    let mut child = child;
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    both(&out)
}

/// Waits (60 s at most: a harness limit) until every thread of `pid` is stopped: a
/// signal is delivered when each thread next runs.
fn stopped_all(pid: u32) {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
        let states: Vec<String> = tasks
            .flatten()
            .map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
            .map(|st| {
                st.rsplit_once(") ")
                    .map_or(String::new(), |(_, r)| r[..1].to_string())
            })
            .collect();
        if states.iter().all(|s| s == "T") {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{pid} not stopped after 60 s: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn members_go_on_under_the_claims_cap_after_its_pool_file_is_truncated() {
    truncated_under_members(0o777);
}

/// A directory of one user's own (mode 0700) named as a claim's: the user's processes
/// share a claim's pool (its file and socket 0600), whose members map the memfd, so a
/// truncation of its file by a process of the same user (root in containers that share
/// `/dev/shm`, say) kills none of them, as it would a named pool's (threat-model.md).
#[test]
fn a_private_directory_named_as_a_claims_keeps_its_members_through_a_truncation() {
    truncated_under_members(0o700);
}

/// Two members of a claim whose directory has `mode` hold 400 and 500 MiB of its 1 GiB
/// cap; its file is truncated to 0 bytes; a joiner is refused with a line, and the
/// members go on under one budget (the next 100 MiB served, the 100 after it refused).
fn truncated_under_members(mode: u32) {
    let s = Scratch::new(&format!("claim-truncated-{mode:o}"));
    let claim = claim_dir(&s, "claim");
    std::fs::set_permissions(&claim, std::fs::Permissions::from_mode(mode)).unwrap();
    let file = claim.join("gpucap.pool");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let mut a = staged(&s, &claim, "a", &[400], &[100, 100]);
    let mut b = staged(&s, &claim, "b", &[500], &[200]);
    // What a reader shows is the members' words, not the file's (which hold none).
    let check = run(s
        .gpucap(&["check"])
        .env("GPUCAP_CLAIM_DIR", &claim)
        .env("GPUCAP_LIMIT", "1Gi"));
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(shown.contains("2 members alive, 0 dead"), "{shown}");
    // Another container of the claim truncates the file.
    assert!(file.exists(), "no pool file at {}", file.display());
    // Made for whoever may write the directory: its user alone where it is private.
    let file_mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        file_mode,
        mode & 0o666,
        "the pool file's mode in a {mode:o} directory"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(0)
        .unwrap();
    // A process joining now is refused, never run uncapped: the file says nothing.
    let joiner = run(in_claim(&s, &claim, script(), "c").arg(alloc(1)));
    let text = String::from_utf8_lossy(&joiner.stderr);
    assert!(
        !joiner.status.success()
            && text.contains("cannot join the pool")
            && text.contains("0 bytes long"),
        "{text}"
    );
    // The members go on, sharing one budget: 900 MiB in use of the 1 GiB cap.
    std::fs::write(s.dir.join("go"), "").unwrap();
    until(
        &s.dir.join("a-done"),
        &mut a,
        "the first member, after the truncation",
    );
    until(
        &s.dir.join("b-done"),
        &mut b,
        "the second member, after the truncation",
    );
    let (a, b) = (said(a), said(b));
    let served = |mib: u64| format!("alloc {} 0\n", mib * MIB);
    let refused = |mib: u64| format!("alloc {} 2\n", mib * MIB);
    assert!(b.contains(&served(500)) && b.contains(&refused(200)), "{b}");
    let after = a.split_once(&served(400)).map_or("", |(_, rest)| rest);
    assert!(
        after.starts_with(&format!("{}{}", served(100), refused(100))),
        "the first member: {a}"
    );
}

/// Every member stopped (a debugger, a job scheduler's suspend): nobody hands the words
/// over, and a joiner is refused after the patience with a line, never given a budget of
/// its own beside theirs (two budgets: the claim's cap taken twice).
#[test]
fn a_joiner_whom_no_member_answers_is_refused_never_given_a_budget_of_its_own() {
    let s = Scratch::new("claim-stopped");
    // A path longer than a socket's address holds (108 bytes): the socket is reached
    // through its directory's descriptor.
    let claim = claim_dir(&s, &format!("claim-{}", "d".repeat(110)));
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let a = holding(&s, &claim, 700);
    let joiner = || run(in_claim(&s, &claim, script(), "j").arg(alloc(700)));
    // SAFETY: signals to the member this test started.
    assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) }, 0);
    stopped_all(a.id());
    let stopped = joiner();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGCONT) }, 0);
    let text = both(&stopped);
    assert!(
        !stopped.status.success()
            && text.contains("none handed it over within 5 s")
            && !text.contains(&format!("alloc {} 0", 700 * MIB)),
        "{text}"
    );
    let line = text.lines().find(|l| l.contains("none handed it over"));
    assert_eq!(
        line.map(|l| l.matches("gpucap.pool").count()),
        Some(1),
        "one line naming the pool once: {text}"
    );
    // Once the member goes on, a joiner shares its budget: 700 + 700 MiB do not fit.
    let after = joiner();
    let text = String::from_utf8_lossy(&after.stdout);
    assert!(text.contains(&format!("alloc {} 2", 700 * MIB)), "{text}");
    said(a);
}

/// A claim's socket removed or replaced while its members run (a cleanup, a co-tenant who
/// may write the directory): the members bind one there again (the same memfd: one
/// budget), and a joiner shares their budget. Before, no process could join until every
/// member had exited. Where they cannot (every member stopped), a joiner is refused after
/// 5 s with a line that says what is at the socket's path, and is never given a budget of
/// its own; `status`, `check` and `pool resize` say the same, never showing or changing
/// the file's words at rest as if they were the members' ("GPUs: none yet"). Once the
/// members have exited, the next process makes the claim's words again.
#[test]
fn a_claims_socket_removed_or_replaced_is_bound_again_by_its_members() {
    let s = Scratch::new("claim-socket-gone");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    // Each case: its tag, what it leaves at the socket's path, what the line says.
    type Case = (&'static str, fn(&Path), &'static str);
    let cases: [Case; 3] = [
        ("removed", |_| {}, "was not there (removed while they run?)"),
        (
            "a-file",
            |p| std::fs::write(p, b"").unwrap(),
            "was not a socket (replaced while they run?)",
        ),
        (
            "dead-socket",
            |p| drop(std::os::unix::net::UnixListener::bind(p).unwrap()),
            "nobody listened on its socket",
        ),
    ];
    let mut held = Vec::new();
    for (tag, replace, _) in &cases {
        let claim = claim_dir(&s, tag);
        let holds = s.dir.join(format!("{tag}-holds"));
        let mut a = member(
            &s,
            &claim,
            tag,
            &[alloc(700), format!("touch:{}", holds.display())],
        );
        until(&holds, &mut a, tag);
        // Stopped first: its thread cannot bind the socket again.
        // SAFETY: a signal to the member this test started.
        assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) }, 0);
        stopped_all(a.id());
        let sock = claim.join("gpucap.pool.sock");
        std::fs::remove_file(&sock).unwrap();
        replace(&sock);
        held.push((claim, a));
    }
    // The three joiners wait out their 5 s together.
    let joiners: Vec<Child> = held
        .iter()
        .zip(&cases)
        .map(|((claim, _), (tag, _, _))| {
            in_claim(&s, claim, script(), &format!("{tag}-j"))
                .arg(alloc(700))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for ((j, (tag, _, want)), (claim, a)) in joiners.into_iter().zip(&cases).zip(held) {
        let o = j.wait_with_output().unwrap();
        let text = both(&o);
        let sock = claim.join("gpucap.pool.sock");
        assert!(
            !o.status.success()
                && text.contains(want)
                && text.contains(&sock.display().to_string())
                && text.contains("its members bind one there again within a second unless")
                && !text.contains(&format!("alloc {} 0", 700 * MIB)),
            "{tag}: {text}"
        );
        let dir = claim.to_str().unwrap();
        for args in [
            &["status"][..],
            &["check"],
            &["pool", "resize", "--claim", dir, "512Mi"],
        ] {
            let o = run(s.gpucap(args).env("GPUCAP_CLAIM_DIR", &claim));
            let text = both(&o);
            assert!(
                !o.status.success()
                    && text.contains("its members hold its words, and none handed them over")
                    && text.contains(want)
                    && !text.contains("none yet")
                    && !text.contains("cap 1 GiB ->"),
                "{tag}: gpucap {args:?}: {text}"
            );
        }
        // Going on, the member binds a socket there again: a joiner shares its budget
        // (200 MiB beside its 700 fits the claim's 1 GiB, 700 more does not).
        // SAFETY: a signal to the member this test started.
        assert_eq!(unsafe { libc::kill(a.id() as i32, libc::SIGCONT) }, 0);
        let b =
            run(in_claim(&s, &claim, script(), &format!("{tag}-b")).args([alloc(200), alloc(700)]));
        let text = both(&b);
        assert!(
            text.contains(&format!("alloc {} 0", 200 * MIB))
                && text.contains(&format!("alloc {} 2", 700 * MIB)),
            "{tag}: the joiner after the member went on: {text}"
        );
        let kind = std::fs::symlink_metadata(&sock).map(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        });
        assert!(
            matches!(kind, Ok(true)),
            "{tag}: {kind:?} at the socket's path"
        );
        said(a);
        // The members gone, the next process of the claim makes its words again (and a
        // socket in place of what is at the path).
        let after = run(in_claim(&s, &claim, script(), &format!("{tag}-after")).arg(alloc(700)));
        let out = String::from_utf8_lossy(&after.stdout);
        assert!(
            out.contains(&format!("alloc {} 0", 700 * MIB)),
            "{tag}: {}",
            both(&after)
        );
    }
}

/// A claim's file removed while its members run (any container of the claim may write
/// its directory, and a cleanup may empty it): the next process joins the members'
/// budget through a member's descriptor and asks their socket, as ever; with the socket
/// removed too, it asks the socket the member binds again. Before, it made a file and a
/// memfd of its own: 700 MiB served beside the member's 700 MiB under the claim's 1 GiB
/// cap. Once the members exit, the next process makes the file again.
#[test]
fn a_claims_file_removed_while_its_members_run_is_joined_not_made_again() {
    let s = Scratch::new("claim-file-gone");
    let claim = claim_dir(&s, "claim");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let a = holding(&s, &claim, 700);
    std::fs::remove_file(claim.join("gpucap.pool")).unwrap();
    let b = run(in_claim(&s, &claim, script(), "b").args([alloc(700), alloc(200)]));
    let text = both(&b);
    assert!(
        text.contains(&format!("alloc {} 2", 700 * MIB))
            && text.contains(&format!("alloc {} 0", 200 * MIB))
            && text.contains("was removed while its members run (by a process of the claim")
            && text.contains(&format!("through process {}'s descriptor", a.id())),
        "the joiner of the removed file: {text}"
    );
    assert!(
        !claim.join("gpucap.pool").exists(),
        "a second file was made"
    );
    std::fs::remove_file(claim.join("gpucap.pool.sock")).unwrap();
    let c = run(in_claim(&s, &claim, script(), "c").args([alloc(700), alloc(200)]));
    let text = both(&c);
    assert!(
        text.contains(&format!("alloc {} 2", 700 * MIB))
            && text.contains(&format!("alloc {} 0", 200 * MIB)),
        "the joiner without file or socket (the member binds the socket again): {text}"
    );
    said(a);
    let after = run(in_claim(&s, &claim, script(), "after").arg(alloc(700)));
    assert!(
        String::from_utf8_lossy(&after.stdout).contains(&format!("alloc {} 0", 700 * MIB)),
        "{}",
        both(&after)
    );
}

/// The same where the members are another user's (a container's pool, whose processes may
/// run as several users; a claim's members in containers of other users): their
/// announcements are seen, but their descriptors (`/proc/PID/fd/N`) may not be opened by
/// this process, so it asks the claim's socket for the file and joins their one budget;
/// `gpucap status` as that user reads it the same way. Before: refused ("none of them
/// could be reached to join them") until every member exited.
#[test]
fn a_claims_file_removed_under_another_users_members_is_joined_through_its_socket() {
    if !as_root("a member of root and a joiner of another user") {
        return;
    }
    let s = Scratch::new("claim-file-gone-user");
    for d in [&s.dir, &s.pools] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let claim = claim_dir(&s, "claim");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let a = holding(&s, &claim, 700);
    std::fs::remove_file(claim.join("gpucap.pool")).unwrap();
    let mut b = as_user(65534, &in_claim(&s, &claim, script(), "b"));
    b.args([alloc(700), alloc(200)]);
    let text = both(&run(&mut b));
    assert!(
        text.contains(&format!("alloc {} 2", 700 * MIB))
            && text.contains(&format!("alloc {} 0", 200 * MIB))
            && text.contains("was removed while its members run (by a process of the claim")
            && text.contains("a member handed over on the claim's socket"),
        "the joiner of another user: {text}"
    );
    assert!(
        !claim.join("gpucap.pool").exists(),
        "a second file was made"
    );
    // `gpucap status` of the claim as that user reads the pool the same way.
    let mut c = fake_cmd(cli(), &s.dir.join("stats.json"));
    c.arg("status")
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_POOL_DIR", &s.pools)
        .env("GPUCAP_CLAIM_DIR", &claim);
    let status = run(&mut as_user(65534, &c));
    let out = both(&status);
    assert!(
        status.status.success()
            && out.lines().next().is_some_and(|l| {
                l.contains("removed while its members run: read through the claim's socket")
            })
            && out.contains(&a.id().to_string()),
        "status as another user: {out}"
    );
    said(a);
}

/// How a joiner is run apart from the member (another network namespace, another user).
type Wrapper = Box<dyn Fn(Command) -> Command>;

/// A claim's file and its socket both removed while a member holds 700 MiB (a cleanup
/// of the directory, `rm` of both), then a joiner that cannot reach the member through an
/// announcement: in another network namespace (a pod of its own), or another user's
/// process. Nothing at the path said members live: the first made a file and words of
/// its own (700 MiB served beside the member's 700 under the 1 GiB cap), the second was
/// refused at once. Every holder of the claim's words read-locks the claim's directory
/// (`live::presence`): the joiner waits for the member to bind its socket again (within
/// about a second) and joins its one budget through it.
#[test]
fn a_claims_file_and_socket_removed_under_its_member_are_never_a_second_budget() {
    let net = unshare_net_works();
    let root = as_root("a joiner of another user");
    let s = Scratch::new("claim-both-gone");
    for d in [&s.dir, &s.pools] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let mut ways: Vec<(&str, Wrapper)> = Vec::new();
    if net {
        ways.push((
            "another network namespace",
            Box::new(|c: Command| {
                let mut w = Command::new("unshare");
                w.arg("--net");
                wrap(w, &c)
            }),
        ));
    }
    if root {
        ways.push(("another user", Box::new(|c: Command| as_user(65534, &c))));
    }
    for (i, (way, wrapped)) in ways.iter().enumerate() {
        let claim = claim_dir(&s, &format!("claim-{i}"));
        let a = holding(&s, &claim, 700);
        std::fs::rename(s.dir.join("a-holds"), s.dir.join(format!("a-holds-{i}"))).unwrap();
        std::fs::remove_file(claim.join("gpucap.pool")).unwrap();
        std::fs::remove_file(claim.join("gpucap.pool.sock")).unwrap();
        // `gpucap status` of the claim at once: read through the member, once it bound
        // its socket again (before: "no pool file … (no process has joined it yet)").
        let mut status = s.gpucap(&["status"]);
        status.env("GPUCAP_CLAIM_DIR", &claim);
        let status = run(&mut status);
        assert!(
            status.status.success()
                && stdout(&status)
                    .lines()
                    .next()
                    .is_some_and(|l| l.contains("removed while its members run")),
            "{way}: status: {}",
            dump(&status)
        );
        let mut b = wrapped(in_claim(&s, &claim, script(), "b"));
        b.args([alloc(700), alloc(200)]);
        let text = both(&run(&mut b));
        assert!(
            text.contains(&format!("alloc {} 2", 700 * MIB))
                && text.contains(&format!("alloc {} 0", 200 * MIB))
                && text.contains("a member handed over on the claim's socket"),
            "{way}: the joiner joins the member's budget: {text}"
        );
        assert!(
            !claim.join("gpucap.pool").exists(),
            "{way}: a second file was made"
        );
        said(a);
    }
}

/// A claim's directory removed with everything in it and made again under its members
/// (`rm -rf DIR; mkdir DIR`: a co-tenant who may write the directory's parent, a
/// cleanup). A joiner of the same network namespace sees the members' announcement and
/// joins their one budget through a member's descriptor; once a member bound its socket
/// at the path again (its serving thread looks every second), a joiner of another network
/// namespace joins it through the socket. Neither makes a file of its own in the new
/// directory. (What remains, docs/src/threat-model.md: a joiner of another network
/// namespace within that second makes one.)
#[test]
fn a_claims_directory_removed_and_made_again_is_joined_through_its_members() {
    let net = unshare_net_works();
    let s = Scratch::new("claim-dir-again");
    let claim = claim_dir(&s, "claim");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let a = holding(&s, &claim, 700);
    std::fs::remove_dir_all(&claim).unwrap();
    let claim = claim_dir(&s, "claim");
    let one_budget = |text: &str| {
        text.contains(&format!("alloc {} 2", 700 * MIB))
            && text.contains(&format!("alloc {} 0", 200 * MIB))
    };
    let b = both(&run(
        in_claim(&s, &claim, script(), "b").args([alloc(700), alloc(200)])
    ));
    assert!(
        one_budget(&b) && b.contains(&format!("through process {}'s descriptor", a.id())),
        "the joiner of the same network namespace: {b}"
    );
    if net {
        let sock = claim.join("gpucap.pool.sock");
        let give_up = Instant::now() + Duration::from_secs(60);
        while !sock.exists() {
            assert!(Instant::now() < give_up, "no socket bound again after 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut c = Command::new("unshare");
        c.arg("--net");
        let mut c = wrap(c, &in_claim(&s, &claim, script(), "c"));
        let c = both(&run(c.args([alloc(700), alloc(200)])));
        assert!(
            one_budget(&c) && c.contains("a member handed over on the claim's socket"),
            "the joiner of another network namespace: {c}"
        );
    }
    assert!(
        !claim.join("gpucap.pool").exists(),
        "a second file was made in the new directory"
    );
    said(a);
}

/// The same where the claim's file was removed (with its socket) or replaced by a copy
/// before the member was killed: the child's lock on the pool file went with that file,
/// so a joiner of the new one saw nothing and made words of its own (1,300 MiB held under
/// the 1 GiB cap, found by review). The child also read-locks the claim's directory
/// (`live::presence`): the joiner is refused while it lives, and served once it is gone.
#[test]
fn a_claims_member_killed_after_its_file_was_removed_keeps_joiners_out_while_its_child_lives() {
    let s = Scratch::new("claim-fork-removed");
    for (i, replace) in [false, true].into_iter().enumerate() {
        let claim = claim_dir(&s, &format!("claim-{i}"));
        let _ = std::fs::remove_file(s.dir.join("ready"));
        let mut a = forking_member(&s, &claim);
        let child = child_pid_line(&mut a);
        let file = claim.join("gpucap.pool");
        if replace {
            let copy = claim.join(".copy");
            std::fs::copy(&file, &copy).unwrap();
            std::fs::rename(&copy, &file).unwrap();
        } else {
            std::fs::remove_file(&file).unwrap();
            std::fs::remove_file(claim.join("gpucap.pool.sock")).unwrap();
        }
        let _ = a.kill();
        let _ = a.wait();
        let text = join_700(&s, &claim);
        // SAFETY: a signal to the child this test's member forked.
        unsafe { libc::kill(child, libc::SIGKILL) };
        assert!(
            !text.contains(&format!("alloc {} 0", 700 * MIB)) && text.contains("cuInit 800"),
            "replaced {replace}: while the child lives: {text}"
        );
        served_once_gone(&s, &claim, child, &format!("replaced {replace}"));
    }
}

/// What a joiner of `claim` asking for 700 MiB said (stdout and stderr).
fn join_700(s: &Scratch, claim: &Path) -> String {
    both(&run(
        in_claim(s, claim, script(), "b").arg(format!("alloc:{}", 700 * MIB))
    ))
}

/// Once the (killed) process `child` is gone, a joiner of `claim` asking for 700 MiB is
/// served (`what` names the case).
fn served_once_gone(s: &Scratch, claim: &Path, child: i32, what: &str) {
    until_gone(child);
    let after = join_700(s, claim);
    assert!(
        after.contains(&format!("alloc {} 0", 700 * MIB)),
        "{what}: once the child is gone: {after}"
    );
}

/// A claim's only member that exits normally while a child it forked (no exec) runs gave
/// its share back at its exit, as a member of any pool does: the next joiner is served
/// (a first fix of the killed member's case below refused every joiner until the child
/// exited, found by review).
#[test]
fn a_claims_last_member_leaving_at_its_exit_with_a_live_child_keeps_nobody_out() {
    let s = Scratch::new("claim-fork-left");
    let claim = claim_dir(&s, "claim");
    let mut a = forking_member(&s, &claim);
    let child = child_pid_line(&mut a);
    std::fs::write(s.dir.join("never"), "").unwrap();
    let left = a.wait().unwrap();
    let b = run(in_claim(&s, &claim, script(), "b").arg(format!("alloc:{}", 700 * MIB)));
    // SAFETY: a signal to the child this test's member forked.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(left.success(), "the member's exit: {left}");
    assert!(
        stdout(&b).contains(&format!("alloc {} 0", 700 * MIB)),
        "the joiner: {}",
        dump(&b)
    );
}

/// A claim's only member killed while a child it forked (that never used CUDA) runs: the
/// driver keeps the member's 600 MiB for the child, which holds its device files, but
/// the claim's words died with the member, and a joiner made new ones from the file's,
/// which never held those bytes (700 MiB served beside them under the 1 GiB cap; a named
/// pool counts them until the child exits). A joiner is refused with a line while the
/// child lives, and served once it is gone.
#[test]
fn a_claims_killed_last_member_with_a_live_child_keeps_joiners_out_until_the_child_exits() {
    let s = Scratch::new("claim-fork-killed");
    let claim = claim_dir(&s, "claim");
    let mut a = forking_member(&s, &claim);
    let child = child_pid_line(&mut a);
    let _ = a.kill();
    let _ = a.wait();
    let text = join_700(&s, &claim);
    // The claim's file at rest, read while the child lives: its member's slot marked
    // taken (a file the marks made look corrupted, "member slot 0 is live but only 0
    // slots were ever taken", would be a bug of the marks).
    let mut status = s.gpucap(&["status"]);
    status.env("GPUCAP_CLAIM_DIR", &claim);
    let status = run(&mut status);
    // SAFETY: a signal to the child this test's member forked.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(
        !text.contains(&format!("alloc {} 0", 700 * MIB))
            && text.contains("cuInit 800")
            && text.contains("processes it forked still hold its GPU memory"),
        "while the child lives: {text}"
    );
    assert!(
        status.status.success() && stdout(&status).contains("dead+"),
        "status of the claim at rest: {}",
        dump(&status)
    );
    served_once_gone(&s, &claim, child, "the last member killed");
}

/// A claim's file replaced while a member holds 700 MiB (a co-tenant who may write the
/// directory renames a file over it: a copy of the claim's own file, or of another
/// claim's): the members' liveness locks are on the file they hold, so a joiner through
/// the new one would find them all dead and take their bytes back. It is refused after
/// its patience with a line saying the file was replaced, never given their bytes or a
/// budget of its own, also where the socket was removed with it (`live::presence`).
/// Before: 700 MiB served beside the member's 700 MiB under the 1 GiB cap.
#[test]
fn a_claims_file_replaced_under_its_members_gives_no_joiner_their_bytes() {
    let s = Scratch::new("claim-file-replaced");
    let other = claim_dir(&s, "other");
    let made = run(in_claim(&s, &other, script(), "other").arg(format!("alloc:{MIB}")));
    assert!(
        String::from_utf8_lossy(&made.stdout).contains(&format!("alloc {MIB} 0")),
        "{}",
        both(&made)
    );
    let claim = claim_dir(&s, "claim");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    let a = holding(&s, &claim, 700);
    for (what, from, socket_too) in [
        ("a copy of its own file", claim.join("gpucap.pool"), false),
        ("another claim's file", other.join("gpucap.pool"), false),
        // The copy's lock bytes are free and nobody answered: the joiner made words of
        // its own from it (700 MiB beside the member's 700, found by review). The claim's
        // directory says the member lives: asked once it binds its socket again.
        (
            "a copy, the socket removed too",
            other.join("gpucap.pool"),
            true,
        ),
    ] {
        let copy = claim.join(".copy");
        std::fs::copy(&from, &copy).unwrap();
        std::fs::rename(&copy, claim.join("gpucap.pool")).unwrap();
        if socket_too {
            std::fs::remove_file(claim.join("gpucap.pool.sock")).unwrap();
        }
        let b = run(in_claim(&s, &claim, script(), "b").arg(alloc(700)));
        let text = both(&b);
        assert!(
            !text.contains(&format!("alloc {} 0", 700 * MIB)),
            "{what}: a budget beside the member's: {text}"
        );
        assert!(
            text.contains("cuInit 800")
                && (text.contains("was replaced while they run")
                    || text.contains("is another pool's words")),
            "{what}: the joiner is refused with a line: {text}"
        );
    }
    said(a);
}

/// The same in another network namespace (each Kubernetes pod sharing a claim has one),
/// where the members' announcements (abstract sockets) are not seen: the joiner finds
/// no file and no announcement, but the claim's socket beside the file, which members
/// listen on, says they live; it asks them for the file (`live::removed_file`) and joins
/// their one budget through the descriptor a member hands over, never making a file of
/// its own; `gpucap status` there reads the pool the same way. Before: first a second
/// file (700 MiB served beside the member's 700 MiB under the 1 GiB cap), then a refusal
/// with a line where joining was possible. Once the member exits, a process there makes
/// the file again.
#[test]
fn a_claims_file_removed_under_members_of_another_network_namespace_is_joined_not_made_again() {
    if !unshare_net_works() {
        return;
    }
    let s = Scratch::new("claim-file-gone-netns");
    let claim = claim_dir(&s, "claim");
    let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
    // The script as a process of the claim in a network namespace of its own.
    let in_pod = |tag: &str, steps: &[String]| {
        let mut c = in_claim(&s, &claim, "unshare".into(), tag);
        c.arg("--net").arg(script()).args(steps);
        run(&mut c)
    };
    let a = holding(&s, &claim, 700);
    std::fs::remove_file(claim.join("gpucap.pool")).unwrap();
    let b = in_pod("b", &[alloc(700), alloc(200)]);
    let text = both(&b);
    assert!(
        text.contains(&format!("alloc {} 2", 700 * MIB))
            && text.contains(&format!("alloc {} 0", 200 * MIB))
            && text.contains("was removed while its members run (by a process of the claim")
            && text.contains("a member handed over on the claim's socket")
            && text.contains("another network namespace"),
        "the joiner in a network namespace of its own: {text}"
    );
    assert!(
        !claim.join("gpucap.pool").exists(),
        "a second file was made"
    );
    // `gpucap status` of the claim there, as `Scratch::gpucap` runs it.
    let mut c = fake_cmd("unshare", &s.dir.join("stats.json"));
    c.arg("--net")
        .arg(cli())
        .arg("status")
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_POOL_DIR", &s.pools)
        .env("GPUCAP_CLAIM_DIR", &claim);
    let status = run(&mut c);
    let out = both(&status);
    assert!(
        status.status.success()
            && out.lines().next().is_some_and(|l| {
                l.contains("removed while its members run: read through the claim's socket")
            })
            && out.contains(&a.id().to_string()),
        "status in a network namespace of its own: {out}"
    );
    said(a);
    let after = in_pod("after", &[alloc(700)]);
    assert!(
        String::from_utf8_lossy(&after.stdout).contains(&format!("alloc {} 0", 700 * MIB)),
        "{}",
        both(&after)
    );
}

/// A member reads its own claim's words (its memfd), never asking the socket: with the
/// socket removed while it runs, its NVML figures are still the claim's (total the cap,
/// its use counted), where reading through the socket refused them (NVML error 4).
#[test]
fn a_member_reads_its_claims_words_after_its_socket_is_removed() {
    fake_nvml();
    let s = Scratch::new("claim-own-words");
    let claim = claim_dir(&s, "claim");
    let mark = |n: &str| format!("{}", s.dir.join(n).display());
    let steps = [
        format!("alloc:{}", 100 * MIB),
        format!("touch:{}", mark("a-holds")),
        format!("wait:{}", mark("go")),
        "nvml".to_string(),
        format!("touch:{}", mark("a-done")),
    ];
    let mut a = member(&s, &claim, "a", &steps);
    until(&s.dir.join("a-holds"), &mut a, "the member");
    std::fs::remove_file(claim.join("gpucap.pool.sock")).unwrap();
    std::fs::write(s.dir.join("go"), "").unwrap();
    until(&s.dir.join("a-done"), &mut a, "the member, reading NVML");
    let text = said(a);
    let nvml = text.lines().find(|l| l.starts_with("nvml ")).unwrap_or("");
    let f: Vec<u64> = nvml
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        f.len() == 3 && f[0] == 0 && f[1] == 1 << 30 && f[2] >= 100 * MIB && f[2] < 1 << 30,
        "the member's NVML figures (rc, total, used): {text}"
    );
}

/// A member whose program closes every descriptor it did not open (`close_range`, as a
/// daemon does at its start) keeps its locks on the claim's file: a joiner is refused
/// (nobody serves the words any more) instead of making a memfd of its own, a second
/// budget (700 MiB served beside the member's 700 MiB under a 1 GiB cap, before).
#[test]
fn a_member_that_closes_every_descriptor_keeps_the_claim_to_one_budget() {
    let s = Scratch::new("claim-closefds");
    let claim = claim_dir(&s, "claim");
    let holds = s.dir.join("a-holds");
    let mut a = member(
        &s,
        &claim,
        "a",
        &[
            format!("alloc:{}", 700 * MIB),
            "closefds".to_string(),
            format!("touch:{}", holds.display()),
        ],
    );
    until(&holds, &mut a, "the member closing its descriptors");
    let j = run(in_claim(&s, &claim, script(), "j").arg(format!("alloc:{}", 700 * MIB)));
    let joined = both(&j);
    let said_a = said(a);
    assert!(
        said_a.contains("closefds 0"),
        "the member did not close its descriptors: {said_a}"
    );
    assert!(
        !joined.contains(&format!("alloc {} 0", 700 * MIB))
            && joined.contains("its members hold its words"),
        "the joiner: {joined}"
    );
}

/// A member's serving thread takes no heap of its own: the C library sets one up (an
/// arena: a 128 MiB reservation trimmed and made writable, four system calls and a page
/// fault) for a thread's first `free`, and the thread freed the box it was handed, at
/// every member's start (2 arenas, before). The maker's thread has run once a joiner is
/// in: it alone could serve it.
#[test]
fn a_members_serving_thread_takes_no_heap_of_its_own() {
    let s = Scratch::new("claim-arenas");
    let claim = claim_dir(&s, "claim");
    let (holds, joined, counted) = (
        s.dir.join("a-holds"),
        s.dir.join("b-in"),
        s.dir.join("a-counted"),
    );
    let mut a = member(
        &s,
        &claim,
        "a",
        &[
            format!("alloc:{MIB}"),
            format!("touch:{}", holds.display()),
            format!("wait:{}", joined.display()),
            "arenas".to_string(),
            format!("touch:{}", counted.display()),
        ],
    );
    until(&holds, &mut a, "the maker");
    let b = run(in_claim(&s, &claim, script(), "b").args([
        format!("alloc:{MIB}"),
        format!("touch:{}", joined.display()),
    ]));
    assert!(
        both(&b).contains(&format!("alloc {MIB} 0")),
        "the joiner: {}",
        both(&b)
    );
    until(&counted, &mut a, "the maker counting its arenas");
    let said_a = said(a);
    assert!(said_a.contains("arenas 1\n"), "the maker: {said_a}");
}

/// The fds of `pid` that are the claim's memfd or a socket.
fn claim_fds(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| l.display().to_string())
        .filter(|l| l.starts_with("socket:") || l.contains("memfd:gpucap-pool"))
        .collect()
}

/// A forked child that never uses CUDA (a DataLoader worker) keeps no copy of the claim's
/// memfd, listening socket or announcement: held by a process with no thread serving it,
/// the socket would keep joiners waiting for an answer after the member's death (and the
/// announcement would name a member that is gone).
#[test]
fn a_members_forked_child_keeps_neither_the_claims_words_nor_its_socket() {
    let s = Scratch::new("claim-fork");
    let claim = claim_dir(&s, "claim");
    let mut a = forking_member(&s, &claim);
    let child = child_pid_line(&mut a) as u32;
    let (parent, theirs) = (claim_fds(a.id()), claim_fds(child));
    // The claim's directory, read-locked by every holder of its words (`live::presence`):
    // its open files' numbers in a process.
    let dir_fds = |pid: u32| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == claim))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let (parent_dir, their_dir) = (dir_fds(a.id()), dir_fds(child));
    // SAFETY: a signal to the child this test's member forked.
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    said(a);
    // The member's open file of the directory (its presence lock), closed in the child;
    // the child's own, opened again in its fork handler for the children byte.
    assert!(
        parent_dir.len() == 1 && their_dir.len() == 1 && parent_dir != their_dir,
        "the claim's directory: the member's open file, closed in the child, and the \
         child's own: {parent_dir:?} {their_dir:?}"
    );
    assert_eq!(
        parent.len(),
        3,
        "the member holds the memfd, the listening socket and its announcement (a bound \
         socket, `src/pool-file/beacon.rs`): {parent:?}"
    );
    assert!(theirs.is_empty(), "its forked child: {theirs:?}");
}

/// A member that execs another program (a launcher, a shell's `exec`): the old image's
/// membership ends with it (its descriptors close on exec, its serving thread is gone) and
/// the new image joins afresh under the same pid. The claim keeps one budget with the old
/// image's share back, whether the new image is then the claim's only process (it makes
/// the memfd again, from the file) or another member holds the claim's words meanwhile.
#[test]
fn a_member_that_execs_rejoins_the_claim_with_its_old_images_share_back() {
    for beside in [false, true] {
        let s = Scratch::new(if beside {
            "claim-exec-beside"
        } else {
            "claim-exec"
        });
        let claim = claim_dir(&s, "claim");
        let b = beside.then(|| staged(&s, &claim, "b", &[100], &[]));
        let next = s.dir.join("next.sh");
        let alloc = |mib: u64| format!("alloc:{}", mib * MIB);
        std::fs::write(
            &next,
            format!(
                "#!/bin/sh\nexec {} {} {} {}\n",
                script().display(),
                alloc(600),
                alloc(300),
                alloc(200)
            ),
        )
        .unwrap();
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o755)).unwrap();
        let o = run(
            in_claim(&s, &claim, compile_c("pool_fork", "", &["-lcuda"]), "a").args([
                "exec",
                next.to_str().unwrap(),
                "unused",
            ]),
        );
        let text = both(&o);
        // 600 + 300 MiB (beside B's 100) fit the 1 GiB cap only with the old image's 600
        // back; 200 more do not.
        let rc = |mib: u64, rc: u32| format!("alloc {} {rc}\n", mib * MIB);
        assert!(
            text.contains("parent alloc 0\n")
                && text.contains(&rc(600, 0))
                && text.contains(&rc(300, 0))
                && text.contains(&rc(200, 2)),
            "beside another member: {beside}\n{text}"
        );
        if let Some(b) = b {
            said(b);
        }
    }
}

/// A member's forked child that uses CUDA itself joins the claim as a member of its own:
/// it let go of the parent's memfd and socket at the fork, so it asks for the words like
/// any joiner, and the parent's serving thread hands them over (one budget: the child's
/// 300 MiB beside the parent's 600 fit the 1 GiB cap, 200 more do not).
#[test]
fn a_members_forked_child_that_uses_cuda_joins_the_claim_as_its_own_member() {
    let s = Scratch::new("claim-fork-cuda");
    let claim = claim_dir(&s, "claim");
    let ready = s.dir.join("ready");
    let o = run(
        in_claim(&s, &claim, compile_c("pool_fork", "", &["-lcuda"]), "a")
            .arg("cuda")
            .arg(&ready)
            .arg(&ready),
    );
    let text = both(&o);
    assert!(
        o.status.success()
            && text.contains("parent alloc 0\n")
            && text.contains("child cuInit 0\n")
            && text.contains("child alloc 300 0\n")
            && text.contains("child alloc 200 2\n"),
        "{text}"
    );
}

/// A joiner that cannot start its serving thread (a container's pids limit reached:
/// `tests/c/no_threads.c`) is refused at `cuInit` with a line, never run uncapped or with
/// a budget apart, and keeps neither the claim's memfd nor the socket it was handed (a
/// program going on without the GPU would keep the socket open with nobody answering on
/// it); the next joiner shares the member's budget.
#[test]
fn a_joiner_that_cannot_start_its_serving_thread_is_refused_and_keeps_nothing() {
    let s = Scratch::new("claim-no-thread");
    let claim = claim_dir(&s, "claim");
    let a = staged(&s, &claim, "a", &[700], &[]);
    let ready = s.dir.join("j-ready");
    let mut c = in_claim(&s, &claim, compile_c("no_threads", "", &[]), "j");
    c.arg(compile_c("init_and_stay", "", &["-lcuda"]))
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut j = c.spawn().unwrap();
    until(&ready, &mut j, "the joiner without threads");
    let held = claim_fds(j.id());
    let text = said(j);
    assert!(
        text.contains("cuInit 800\n")
            && text.contains("cannot start the thread that hands the claim's words"),
        "{text}"
    );
    assert!(held.is_empty(), "the refused joiner keeps {held:?}");
    let after = run(in_claim(&s, &claim, script(), "k").arg(format!("alloc:{}", 400 * MIB)));
    let text = String::from_utf8_lossy(&after.stdout);
    assert!(text.contains(&format!("alloc {} 2", 400 * MIB)), "{text}");
    said(a);
}

/// A member that puts a listening socket of its own under the number of the claim's
/// (`tests/c/claim_fd_reuse.c`: a server closing what it did not open, then listening):
/// its serving thread stops at the next joiner instead of accepting the program's
/// connections and handing them the claim's words; the claim's only member, it serves no
/// more, and the joiner is refused, told that nobody listens on the claim's socket (never
/// handed the program's socket as the claim's).
#[test]
fn a_member_whose_socket_number_the_program_reuses_never_serves_the_programs_connections() {
    let s = Scratch::new("claim-fd-reuse");
    let claim = claim_dir(&s, "claim");
    // A short path: a socket's address holds 108 bytes.
    let own = std::env::temp_dir().join(format!("gpucap-own-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&own);
    let ready = s.dir.join("p-ready");
    let mut c = in_claim(
        &s,
        &claim,
        compile_c("claim_fd_reuse", "", &["-lcuda"]),
        "p",
    );
    c.arg(&own)
        .arg(&ready)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut p = c.spawn().unwrap();
    until(&ready, &mut p, "the member replacing its socket");
    let j = run(in_claim(&s, &claim, script(), "j").arg(format!("alloc:{}", MIB)));
    let joined = both(&j);
    // A client of the program's own socket: nobody accepts it (the program never does).
    let mut client = std::os::unix::net::UnixStream::connect(&own).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut byte = [0u8; 1];
    let got = std::io::Read::read(&mut client, &mut byte);
    let _ = std::fs::remove_file(&own);
    let said_p = said(p);
    assert!(
        got.is_err(),
        "the program's client was answered ({got:?}): {said_p}\njoiner: {joined}"
    );
    assert!(
        !j.status.success() && joined.contains("nobody listened on its socket"),
        "{joined}"
    );
}

/// A joiner at its open-file limit cannot take the two descriptors a member hands over
/// (the kernel drops them) or make the socket to ask: it is refused with a line saying so
/// and naming the limit, not told that the members seem stopped.
#[test]
fn a_joiner_at_its_open_file_limit_is_refused_with_the_limit_named() {
    let s = Scratch::new("claim-nofile");
    let claim = claim_dir(&s, "claim");
    let a = staged(&s, &claim, "a", &[100], &[]);
    let mut c = in_claim(&s, &claim, script(), "j");
    c.arg(format!("alloc:{}", MIB));
    with_rlimit(&mut c, libc::RLIMIT_NOFILE, 6, 6);
    let j = run(&mut c);
    let text = String::from_utf8_lossy(&j.stderr);
    assert!(
        !j.status.success()
            && text.contains("this process could not take them")
            && text.contains("its open-file limit is 6")
            && !text.contains("are they stopped"),
        "{text}"
    );
    said(a);
}

/// `gpucap pool resize --claim` (a DRA driver changing a claim's share) changes the cap
/// the members hold to: their words, not the file's (which hold no GPU of theirs).
#[test]
fn a_claims_live_members_are_resized() {
    let s = Scratch::new("claim-resize");
    let claim = claim_dir(&s, "claim");
    let mut a = staged(&s, &claim, "a", &[400], &[200, 100]);
    let resized = run(&mut s.gpucap(&[
        "pool",
        "resize",
        "--claim",
        claim.to_str().unwrap(),
        "512Mi",
    ]));
    let text = String::from_utf8_lossy(&resized.stdout);
    assert!(
        resized.status.success() && text.contains(": cap 1 GiB -> 512 MiB, 400 MiB in use"),
        "{text}{}",
        String::from_utf8_lossy(&resized.stderr)
    );
    std::fs::write(s.dir.join("go"), "").unwrap();
    until(
        &s.dir.join("a-done"),
        &mut a,
        "the member, after the resize",
    );
    let a = said(a);
    let after = a
        .split_once(&format!("alloc {} 0\n", 400 * MIB))
        .map_or("", |(_, r)| r);
    assert!(
        after.starts_with(&format!("alloc {} 2\nalloc {} 0\n", 200 * MIB, 100 * MIB)),
        "the member, held to 512 MiB: {a}"
    );
}

/// A claim's directory on a read-only mount is refused with a line that says so (before:
/// that this uid may not write it, and to run the container in the directory's group,
/// which would not have helped).
/// A claim's file removed while its member runs: `pool resize --claim` changes the
/// member's cap through the member's descriptor (as `status` reads it), where it said
/// "no pool file ... (no process has joined ... yet); the pools there: gpucap"; and a copy
/// renamed over the file: status and resize say the file is not the members', where they
/// The container's pool with its file removed while its member holds 100 MiB: `pool list`
/// in the container's environment lists it as removed under live members, and the pool
/// directory's view (`status`) and `status --prometheus --all` still show it, read through
/// the member. Before, all three lost it ("no pools", "no capped process", no series):
/// its directory said nothing, and the removed file's announcement names no path.
#[test]
fn the_containers_pool_removed_under_its_member_is_still_listed_shown_and_exported() {
    let s = Scratch::new("container-removed");
    let a = s.member("container-mntns", "a", &["alloc:100Mi"]);
    let ns = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let ns = ns.to_string_lossy();
    let ns = ns.trim_start_matches("mnt:[").trim_end_matches(']');
    let dir = format!("gpucap-container-{ns}");
    std::fs::remove_file(s.pools.join(&dir).join("gpucap.pool")).unwrap();
    let mut list = s.gpucap(&["pool", "list"]);
    list.env("GPUCAP_POOL", "container-mntns");
    let list = run(&mut list);
    let status = run(&mut s.gpucap(&["status"]));
    let prom = run(&mut s.gpucap(&["status", "--prometheus", "--all"]));
    let pid = a.id().to_string();
    said(a);
    assert!(
        stdout(&list)
            .lines()
            .any(|l| l.starts_with(&dir) && l.contains("(its file removed while its members run)")),
        "pool list: {}",
        dump(&list)
    );
    assert!(
        stdout(&status)
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(pid.as_str())),
        "status of the pool directory: {}",
        dump(&status)
    );
    assert!(
        stdout(&prom).contains(&format!(
            "gpucap_pool_up{{pool=\"{dir}\",user=\"{}\"}} 1",
            own_user()
        )),
        "status --prometheus --all: {}",
        dump(&prom)
    );
}

/// showed every live member dead and refused ("no member of the pool is alive").
#[test]
fn a_claims_removed_or_replaced_file_is_read_and_resized_through_its_members_or_said_not_theirs() {
    let s = Scratch::new("claim-resize-removed");
    let claim = claim_dir(&s, "claim");
    let a = holding(&s, &claim, 400);
    let resize = |size: &str| {
        run(&mut s.gpucap(&["pool", "resize", "--claim", claim.to_str().unwrap(), size]))
    };
    std::fs::remove_file(claim.join("gpucap.pool")).unwrap();
    let resized = resize("512Mi");
    assert!(
        resized.status.success()
            && stdout(&resized).contains(": cap 1 GiB -> 512 MiB, 400 MiB in use"),
        "the removed file, resized through the member: {}",
        dump(&resized)
    );
    // A copy of another claim's file renamed over the path (the member's own is gone).
    let other = claim_dir(&s, "other");
    let made = run(in_claim(&s, &other, script(), "other").arg(format!("alloc:{MIB}")));
    assert!(
        stdout(&made).contains(&format!("alloc {MIB} 0")),
        "{}",
        dump(&made)
    );
    // Made the same second as the members' own, its header is theirs; a second later, its
    // creation time differs (the members' words are then told apart by their header, which
    // once said only "another pool's words": the line depended on the clock's second).
    for created in [None, Some(1u64)] {
        let mut words = std::fs::read(other.join("gpucap.pool")).unwrap();
        if let Some(t) = created {
            words[32..40].copy_from_slice(&t.to_le_bytes()); // the header's creation time
        }
        let copy = claim.join(".copy");
        std::fs::write(&copy, words).unwrap();
        std::fs::rename(&copy, claim.join("gpucap.pool")).unwrap();
        let mut status = s.gpucap(&["status"]);
        status.env("GPUCAP_CLAIM_DIR", &claim);
        for (what, o) in [("status", run(&mut status)), ("resize", resize("600Mi"))] {
            let text = dump(&o);
            assert!(
                !o.status.success()
                    && text.contains("is not the file the claim's members' words were made from")
                    && !text.contains("0 alive"),
                "{what} through a file that is not the members' ({created:?}): {text}"
            );
        }
    }
    said(a);
}

#[test]
fn a_claims_directory_on_a_read_only_mount_is_said_to_be_one() {
    if !unshare_works() {
        return;
    }
    let s = Scratch::new("claim-read-only");
    let claim = claim_dir(&s, "claim");
    let mut w = std::process::Command::new("unshare");
    w.args(["-rm", "sh", "-c"])
        .arg("set -e; d=$1; shift; mount --bind \"$d\" \"$d\"; mount -o remount,bind,ro \"$d\"; exec \"$@\"")
        .arg("sh")
        .arg(&claim);
    let mut w = wrap(w, &s.gpucap(&["check", "--limit", "1Gi"]));
    w.env("GPUCAP_CLAIM_DIR", &claim);
    let o = run(&mut w);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains(&format!(
            "the claim's directory {} is on a read-only mount",
            claim.display()
        )),
        "{}",
        dump(&o)
    );
}

/// `gpucap top` where the environment names a claim's pool shows its members: a claim's
/// file is every user's (mode 0666) and is read as a claim's, named by its directory.
/// Before, top read it as a user's own file and refused it ("writable by group or
/// others (mode 666) ... chmod 600 it"), showing nothing.
#[test]
fn top_in_a_claims_environment_shows_the_claims_members() {
    let s = Scratch::new("claim-top");
    let claim = claim_dir(&s, "claim-top");
    let mut a = holding(&s, &claim, 100);
    let mut top = s.gpucap(&["top", "--once"]);
    top.env("GPUCAP_CLAIM_DIR", &claim)
        .env("GPUCAP_LIMIT", "1Gi");
    let o = run(&mut top);
    let _ = a.kill();
    let _ = a.wait();
    assert_ok(&o);
    let out = stdout(&o);
    let pid = a.id().to_string();
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(pid.as_str()))
            && out
                .lines()
                .any(|l| l.starts_with("pool claim-top GPU 0: 100Mi/")),
        "the member's row, in the claim's pool\n{}",
        dump(&o)
    );
    assert!(
        !stderr(&o).contains("writable by group or others"),
        "{}",
        dump(&o)
    );
}

/// A claim's members of two users (and so the container's pool): `gpucap top` shows each
/// row's own user, and `--user` keeps that user's rows and the pool's line. Before, every
/// row showed the file's owner (its first member's user): root beside uid 65534's
/// member, and `--user nobody` showed no row.
#[test]
fn top_shows_each_claim_members_own_user() {
    if !as_root("members of two users") {
        return;
    }
    let s = Scratch::new("claim-top-users");
    for d in [&s.dir, &s.pools] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let claim = claim_dir(&s, "claim-users");
    let mut a = holding(&s, &claim, 100);
    let holds = s.dir.join("b-holds");
    let mut b = as_user(65534, &in_claim(&s, &claim, script(), "b"))
        .args([
            format!("alloc:{}", 200 * MIB),
            format!("touch:{}", holds.display()),
            format!("wait:{}", s.dir.join("never").display()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until(&holds, &mut b, "uid 65534's member");
    let top = |extra: &[&str]| {
        let mut args = vec!["top", "--once"];
        args.extend(extra);
        let mut c = s.gpucap(&args);
        c.env("GPUCAP_CLAIM_DIR", &claim);
        run(&mut c)
    };
    let (all, nobody) = (top(&[]), top(&["--user", "65534"]));
    let status = {
        let mut c = s.gpucap(&["status"]);
        c.env("GPUCAP_CLAIM_DIR", &claim);
        run(&mut c)
    };
    // setpriv's pid is the member's: it execs the script.
    let (pa, pb) = (a.id().to_string(), b.id().to_string());
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert_ok(&all);
    let user_of = |out: &str, pid: &str| {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(pid))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
    };
    let out = stdout(&all);
    assert_eq!(user_of(&out, &pa).as_deref(), Some("root"), "{out}");
    let nobody_name = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find(|l| l.split(':').nth(2) == Some("65534"))
        .map_or("65534".to_string(), |l| {
            l.split(':').next().unwrap().to_string()
        });
    assert_eq!(user_of(&out, &pb).as_ref(), Some(&nobody_name), "{out}");
    // `status` of the claim's pool: a USER column, each member's own.
    let out = stdout(&status);
    let status_user = |pid: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(pid))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
    };
    assert!(
        out.contains("STATE  USER")
            && status_user(&pa).as_deref() == Some("root")
            && status_user(&pb).as_deref() == Some(nobody_name.as_str()),
        "status\n{out}"
    );
    let out = stdout(&nobody);
    assert!(
        user_of(&out, &pb).is_some()
            && user_of(&out, &pa).is_none()
            && out
                .lines()
                .any(|l| l.starts_with("pool claim-users GPU 0: 300Mi/")),
        "--user 65534: its member's row and the pool's line\n{out}"
    );
}

/// A claim's directory that is sticky (mode 1777), shared by two users: once the first
/// user's processes have exited, their socket cannot be replaced by the other user's
/// (only its owner may remove it there), and the joiner's line says so and how to mend
/// it (before: "cannot listen on the socket ...: Address already in use").
#[test]
fn a_sticky_claim_directory_says_why_another_users_socket_cannot_be_replaced() {
    if !as_root("two users in one claim") {
        return;
    }
    let s = Scratch::new("claim-sticky");
    for d in [&s.dir, &s.pools] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let claim = claim_dir(&s, "claim-sticky");
    std::fs::set_permissions(&claim, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let run_as = |uid: u32, tag: &str| {
        let mut w = as_user(uid, &in_claim(&s, &claim, script(), tag));
        w.arg("alloc:100Mi");
        run(&mut w)
    };
    let first = run_as(65534, "first");
    assert!(
        stdout(&first).contains(&format!("alloc {} 0", 100 * MIB)),
        "{}",
        dump(&first)
    );
    let other = run_as(1000, "other");
    let err = stderr(&other);
    assert!(
        err.contains("(uid 65534's), left by processes of the pool that have exited")
            && err.contains("the directory is sticky (mode 1777)")
            && err.contains("make the directory 0777"),
        "{}",
        dump(&other)
    );
}

/// `gpucap pool list` where the environment names a claim's pool lists it beside the
/// user's own pools, named by its directory: its file is in no user's directory. Before,
/// `pool list` said "no pools" while the claim's member held 100 MiB.
#[test]
fn pool_list_in_a_claims_environment_lists_the_claims_pool() {
    let s = Scratch::new("claim-list");
    let claim = claim_dir(&s, "claim-list");
    let mut a = holding(&s, &claim, 100);
    let mut list = s.gpucap(&["pool", "list"]);
    list.env("GPUCAP_CLAIM_DIR", &claim)
        .env("GPUCAP_LIMIT", "1Gi");
    let o = run(&mut list);
    let _ = a.kill();
    let _ = a.wait();
    assert_ok(&o);
    assert!(
        stdout(&o).lines().any(|l| l.starts_with("claim-list ")
            && l.contains("1 alive, 0 dead")
            && l.contains("100 MiB")
            && l.contains("the environment's pool, every user's")),
        "{}",
        dump(&o)
    );
}
