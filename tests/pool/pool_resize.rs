//! `gpucap pool resize` on a live pool, with members on the fake GPU: a raise serves a
//! waiting member, a member started later with the old GPUCAP_LIMIT joins, a lower
//! refuses the next allocation with the pool's line and takes nothing back, and the
//! fake GPU's shared peak never passes the highest cap in force, guaranteed members'
//! requests included.

use super::common;

use std::process::{Child, Command, Output, Stdio};

use common::pool_scratch::*;
use common::*;

const MIB: u64 = 1 << 20;

fn on_shared_gpu(s: &Scratch, mut c: Command) -> Command {
    c.env("FAKECUDA_SHARED", s.dir.join("fake-gpu"))
        .current_dir(&s.dir);
    c
}

/// A member of pool `t` (GPUCAP_LIMIT 1 GiB) running the script's `steps`, then holding
/// its memory until killed; `wait` is its GPUCAP_WAIT.
fn member(s: &Scratch, tag: &str, wait: &str, steps: &[&str]) -> Child {
    let script = script();
    let done = s.dir.join(format!("{tag}.done"));
    let never = s.dir.join("never");
    let mut args: Vec<String> = ["run", "--limit", "1Gi", "--pool", "t", "--"]
        .map(String::from)
        .to_vec();
    args.push(script.to_str().unwrap().into());
    args.extend(steps.iter().map(|s| s.to_string()));
    args.push(format!("touch:{}", done.display()));
    args.push(format!("wait:{}", never.display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = on_shared_gpu(s, s.gpucap(&args));
    c.env("GPUCAP_WAIT", wait)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// A process of pool `t` (GPUCAP_LIMIT 1 GiB) that runs `steps` and exits.
fn once(s: &Scratch, steps: &[&str]) -> Output {
    let script = script();
    let mut args = vec!["run", "--limit", "1Gi", "--pool", "t", "--"];
    args.push(script.to_str().unwrap());
    args.extend(steps);
    run(&mut on_shared_gpu(s, s.gpucap(&args)))
}

fn status(s: &Scratch) -> serde_json::Value {
    let o = run(&mut s.gpucap(&["status", "--pool", "t", "--json"]));
    assert_ok(&o);
    serde_json::from_str(&stdout(&o)).unwrap()
}

fn kill(mut c: Child) -> Output {
    let _ = c.kill();
    c.wait_with_output().unwrap()
}

#[test]
fn a_live_pool_is_resized_up_and_down() {
    let s = Scratch::new("pool-resize");
    let mut a = member(&s, "a", "0", &["alloc:900Mi"]);
    wait_ready(&mut a, &s.dir.join("a.done"), "the member a");
    // b waits for memory: 300 MiB do not fit beside a's 900 under 1 GiB.
    let mut b = member(&s, "b", "60s", &["alloc:300Mi"]);
    while status(&s)["gpus"][0]["waiters"] != 1 {
        assert!(
            b.try_wait().unwrap().is_none(),
            "b ended instead of waiting"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }

    let o = run(&mut s.gpucap(&["pool", "resize", "t", "1536Mi"]));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(": cap 1 GiB -> 1.5 GiB, 900 MiB in use"),
        "{}",
        dump(&o)
    );
    wait_ready(
        &mut b,
        &s.dir.join("b.done"),
        "the waiter b, served by the raise",
    );
    assert_eq!(status(&s)["gpus"][0]["cap"], 1536 * MIB);

    // Started with the old GPUCAP_LIMIT: joins, under the pool's cap.
    let c = once(&s, &["alloc:100Mi"]);
    assert!(
        stdout(&c).contains(&format!("alloc {} 0", 100 * MIB)),
        "{}",
        dump(&c)
    );

    // Lower than the 1.2 GiB in use: nothing taken back, the next allocation refused.
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "1Gi"]));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(": cap 1.5 GiB -> 1 GiB, 1.17 GiB in use; above the new cap"),
        "{}",
        dump(&o)
    );
    let d = once(&s, &["alloc:1Mi"]);
    assert!(
        !stdout(&d).contains(&format!("alloc {MIB} 0")),
        "{}",
        dump(&d)
    );
    assert!(
        dump(&d).contains("of the pool's 1 GiB cap in use"),
        "the pool's line\n{}",
        dump(&d)
    );
    let g = &status(&s)["gpus"][0];
    assert_eq!(
        (g["cap"].as_u64(), g["used"].as_u64()),
        (Some(1 << 30), Some(1200 * MIB))
    );

    // A cap above the GPU's memory never binds: said, as check says it of a --limit
    // (before, a unit's typo uncapped the pool without a word).
    // (its own stats file: the fake's figures below are the members'.)
    let mut c = s.gpucap(&["pool", "resize", "t", "100Ti"]);
    let o = run(c.env("FAKECUDA_STATS", s.dir.join("resize-stats.json")));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(": cap 1 GiB -> 100 TiB")
            && stderr(&o)
                .contains("gpucap: pool t: the cap of GPU 0, 100 TiB, is more than the GPU has"),
        "{}",
        dump(&o)
    );

    // Where the library is loaded into gpucap itself (a capped container's), the
    // driver's figure is the cap's: no such line (a review saw "more than the GPU has
    // (1 GiB)" for a 2 GiB cap on a 4 GiB GPU).
    let mut c = s.gpucap(&["pool", "resize", "t", "2Gi"]);
    let o = run(c
        .env("FAKECUDA_STATS", s.dir.join("resize-stats.json"))
        .env("LD_PRELOAD", shim())
        .env("GPUCAP_LIMIT", "1Gi"));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(": cap 100 TiB -> 2 GiB") && !stderr(&o).contains("never binds"),
        "{}",
        dump(&o)
    );

    let (oa, ob) = (kill(a), kill(b));
    assert!(
        stdout(&ob).contains(&format!("alloc {} 0", 300 * MIB)),
        "{}",
        dump(&ob)
    );
    // The fake GPU's highest total use by the pool's processes, as the last one saw it.
    let text = std::fs::read_to_string(s.dir.join("stats.json")).expect("stats");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let peak = v["devices"][0]["shared_peak_used"].as_u64().unwrap();
    assert!(
        (1200 * MIB..=1536 * MIB).contains(&peak),
        "shared peak {peak}\n{}",
        dump(&oa)
    );
}

/// A raise is the cap of every member, whatever `GPUCAP_LIMIT` it started with: a live
/// member holds more than its starting limit, and so does one that joins after the raise
/// with the old limit. Before, each process's own cap (set once at its start) refused
/// them at the old limit ("100 MiB of the 1 GiB cap in use") while `cuMemGetInfo` showed
/// the raised cap.
#[test]
fn a_raise_lets_every_member_hold_more_than_the_limit_it_started_with() {
    let s = Scratch::new("pool-raise");
    let go = s.dir.join("go").display().to_string();
    let held = s.dir.join("held");
    let mut a = member(
        &s,
        "a",
        "0",
        &[
            "alloc:100Mi",
            &format!("touch:{}", held.display()),
            &format!("wait:{go}"),
            "alloc:1200Mi",
            "info",
        ],
    );
    wait_ready(&mut a, &held, "the member a's first block");
    assert_ok(&run(&mut s.gpucap(&["pool", "resize", "t", "2Gi"])));

    // Started with the old GPUCAP_LIMIT, after the raise.
    let c = once(&s, &["alloc:1200Mi"]);
    assert!(
        stdout(&c).contains(&format!("alloc {} 0", 1200 * MIB)),
        "{}",
        dump(&c)
    );

    std::fs::write(&go, b"").unwrap();
    wait_ready(&mut a, &s.dir.join("a.done"), "the member a");
    let oa = kill(a);
    assert!(
        stdout(&oa).contains(&format!(
            "alloc {} 0\ninfo {} {}",
            1200 * MIB,
            748 * MIB,
            2048 * MIB
        )),
        "{}",
        dump(&oa)
    );
}

/// `gpucap check` says what the library would refuse at `cuInit`: a cap other than the
/// live members' of the pool named (before: "configuration OK", and the program then
/// refused at `cuInit`); the same cap, or a pool whose members are gone, is fine.
#[test]
fn check_refuses_a_cap_other_than_the_live_members() {
    let s = Scratch::new("pool-check-cap");
    let held = s.dir.join("held");
    let mut a = member(&s, "a", "0", &[&format!("touch:{}", held.display())]);
    wait_ready(&mut a, &held, "the member a");
    let check = |limit: &str| {
        run(&mut on_shared_gpu(
            &s,
            s.gpucap(&["check", "--limit", limit, "--pool", "t"]),
        ))
    };
    let o = check("2Gi");
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains(
            "cannot join the pool t: this process caps GPU 0 at 2 GiB, the pool's live members at 1 GiB"
        ),
        "{}",
        dump(&o)
    );
    assert_ok(&check("1Gi"));
    // Resized: a joiner takes the pool's cap whatever its own, as the library does.
    assert_ok(&run(&mut s.gpucap(&["pool", "resize", "t", "1536Mi"])));
    assert_ok(&check("2Gi"));
    kill(a);
    assert_ok(&check("2Gi"));
}

#[test]
fn a_resize_errors_name_what_is_wrong() {
    let s = Scratch::new("pool-resize-errors");
    let o = run(&mut s.gpucap(&["pool", "resize", "nosuch", "1Gi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(dump(&o).contains("gpucap: no pool file at"), "{}", dump(&o));
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "8X"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(dump(&o).contains("invalid size \"8X\""), "{}", dump(&o));
    // A name near one there is: the nearest named, as `pool clean` names it.
    assert_ok(&once(&s, &["alloc:1Mi"]));
    let o = run(&mut s.gpucap(&["pool", "resize", "u", "1Gi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(stderr(&o).contains("; did you mean t?"), "{}", dump(&o));
    // A directory given by --dir is named as typed (before: GPUCAP_POOL_DIR=..., a
    // variable nobody set; a user-journey review).
    let missing = s.dir.join("no-such-dir");
    let o = run(s
        .gpucap(&["pool", "resize", "t", "1Gi", "--dir"])
        .arg(&missing));
    assert!(
        o.status.code() == Some(2)
            && stderr(&o).contains(&format!("gpucap: --dir {}: ", missing.display())),
        "{}",
        dump(&o)
    );
}

/// A pool whose members have all exited is not resized: its next first member sets the
/// cap from its own `GPUCAP_LIMIT`, so a resize would print a cap no process is held to.
/// Before, it printed "cap 1 GiB -> 2 GiB" and exited 0, and the next member with
/// `--limit 1Gi` was held to 1 GiB.
#[test]
fn a_pool_with_no_live_member_is_not_resized() {
    let s = Scratch::new("pool-resize-dead");
    let o = once(&s, &["alloc:100Mi"]);
    assert_ok(&o);
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "2Gi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stderr(&o).contains("gpucap: pool t: not resized: no member of the pool is alive")
            && !stdout(&o).contains("->"),
        "{}",
        dump(&o)
    );
}

/// `gpucap run` of a member of pool `t` (GPUCAP_LIMIT 1 GiB) with `flags` (its
/// guarantee or ceiling) running `steps`, then holding its memory until killed.
fn member_cmd(s: &Scratch, flags: &[&str], steps: &[String]) -> Command {
    let script = script();
    let mut args: Vec<String> = ["run", "--limit", "1Gi", "--pool", "t"]
        .map(String::from)
        .to_vec();
    args.extend(flags.iter().map(|f| f.to_string()));
    args.push("--".into());
    args.push(script.to_str().unwrap().into());
    args.extend(steps.iter().cloned());
    args.push(format!("wait:{}", s.dir.join("never").display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    on_shared_gpu(s, s.gpucap(&args))
}

/// [`member_cmd`] started with GPUCAP_WAIT 60 s; its stderr goes to `TAG.err`.
fn member_with(s: &Scratch, tag: &str, flags: &[&str], steps: &[String]) -> Child {
    let err = std::fs::File::create(s.dir.join(format!("{tag}.err"))).unwrap();
    member_cmd(s, flags, steps)
        .env("GPUCAP_WAIT", "60s")
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .unwrap()
}

/// The JSON of member `pid`'s first GPU in `gpucap status --pool t --json`.
fn member_gpu(s: &Scratch, pid: u64) -> serde_json::Value {
    let v = status(s);
    let m = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["pid"] == pid)
        .cloned()
        .unwrap_or_else(|| panic!("no member {pid}: {v}"));
    m["gpus"][0].clone()
}

#[test]
fn a_live_members_ceiling_and_guarantee_are_changed() {
    let s = Scratch::new("pool-set");
    let file = |n: &str| s.dir.join(n).display().to_string();
    // a: at its 300 MiB ceiling, then asks 100 MiB more: it waits (GPUCAP_WAIT).
    let mut a = member_with(
        &s,
        "a",
        &["--ceiling", "300Mi"],
        &[
            "alloc:300Mi".into(),
            format!("touch:{}", file("a.first")),
            "alloc:100Mi".into(),
            format!("touch:{}", file("a.done")),
        ],
    );
    wait_ready(&mut a, &s.dir.join("a.first"), "the member a");
    let a_err = s.dir.join("a.err");
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&a_err)
        .unwrap_or_default()
        .contains("past this process's 300 MiB ceiling")
    {
        assert!(
            a.try_wait().unwrap().is_none(),
            "a ended instead of waiting"
        );
        assert!(
            start.elapsed().as_secs() < 60,
            "a never waited at its ceiling"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let pid = status(&s)["members"][0]["pid"].as_u64().unwrap();
    assert_eq!(member_gpu(&s, pid)["ceiling"], 300 * MIB);

    // The raise serves it at once.
    let o = run(&mut s.gpucap(&["pool", "set", "t", &pid.to_string(), "--ceiling", "600Mi"]));
    assert_ok(&o);
    assert!(
        stdout(&o).contains(&format!("pid {pid} (script alloc:300Mi touch:"))
            && stdout(&o)
                .contains("guarantee 0 B -> 0 B, ceiling 300 MiB -> 600 MiB, 300 MiB held"),
        "{}",
        dump(&o)
    );
    wait_ready(
        &mut a,
        &s.dir.join("a.done"),
        "the member a, served by the raise",
    );
    let g = member_gpu(&s, pid);
    assert_eq!(
        (g["ceiling"].as_u64(), g["used"].as_u64()),
        (Some(600 * MIB), Some(400 * MIB))
    );

    // b holds a guarantee of 600 MiB: 500 MiB more for a do not fit the 1 GiB cap.
    let mut b = member_with(
        &s,
        "b",
        &["--guarantee", "600Mi"],
        &[format!("touch:{}", file("b.done"))],
    );
    wait_ready(&mut b, &s.dir.join("b.done"), "the member b");
    let o = run(&mut s.gpucap(&["pool", "set", "t", &pid.to_string(), "--guarantee", "500Mi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stderr(&o).contains("gpucap: pool t GPU-")
            && stderr(&o).contains(&format!(
            ": pid {pid} not changed: the guarantee 500 MiB does not fit: 600 MiB of the pool's \
             1 GiB cap is guaranteed to the other members already"
        )),
        "{}",
        dump(&o)
    );
    assert_eq!(member_gpu(&s, pid)["guarantee"], 0, "nothing changed");
    // 400 MiB fit beside b's 600 MiB; status shows them.
    let o = run(&mut s.gpucap(&["pool", "set", "t", &pid.to_string(), "--guarantee", "400Mi"]));
    assert_ok(&o);
    assert_eq!(member_gpu(&s, pid)["guarantee"], 400 * MIB);
    assert_eq!(status(&s)["gpus"][0]["guaranteed"], 1000 * MIB);
    let o = run(&mut s.gpucap(&["pool", "set", "t", "1", "--guarantee", "1Mi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        dump(&o).contains("has no live member with pid 1"),
        "{}",
        dump(&o)
    );
    kill(a);
    kill(b);
}

/// A process of pool `t` (GPUCAP_LIMIT 1 GiB, no GPUCAP_WAIT) with a guarantee of
/// `guarantee`, running `steps`, then holding its memory until killed.
fn guaranteed(s: &Scratch, guarantee: &str, steps: &[String]) -> Child {
    member_cmd(s, &["--guarantee", guarantee], steps)
        .env("GPUCAP_WAIT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The cap lowered below the pool's commitment (in use plus the guarantees kept), then
/// moved between two lower sizes while guaranteed members ask inside their guarantees,
/// a borrower gives its bytes back and two processes of two threads churn: no
/// admission, inside a guarantee or not, takes the pool past the cap in force. The
/// pool used 384 MiB when the first lower cap (640 MiB) landed, so the fake GPU's
/// shared peak (every process's bytes, as the driver counted them) stays at most
/// 640 MiB; the guaranteed members' four requests of 128 MiB (512 MiB, all inside
/// their guarantees) find at most 256 MiB under the cap, and at least two are refused.
#[test]
fn guaranteed_requests_never_take_the_pool_past_a_lowered_cap() {
    const LOW: u64 = 640 * MIB;
    const LOWER: &str = "576Mi"; // still above the 512 MiB guaranteed
    let s = Scratch::new("pool-resize-guarantees");
    let file = |n: &str| s.dir.join(n).display().to_string();
    let mut b = member(
        &s,
        "b",
        "0",
        &[
            "alloc:384Mi",
            &format!("touch:{}", file("b.in")),
            &format!("wait:{}", file("g1.done")),
            &format!("wait:{}", file("g2.done")),
            "free",
        ],
    );
    wait_ready(&mut b, &s.dir.join("b.in"), "the borrower b");
    let mut gs: Vec<Child> = ["g1", "g2"]
        .iter()
        .map(|g| {
            let mut c = guaranteed(
                &s,
                "256Mi",
                &[
                    format!("touch:{}", file(&format!("{g}.in"))),
                    format!("wait:{}", file("go")),
                    "alloc:128Mi".into(),
                    "alloc:128Mi".into(),
                    format!("touch:{}", file(&format!("{g}.done"))),
                ],
            );
            wait_ready(&mut c, &s.dir.join(format!("{g}.in")), g);
            c
        })
        .collect();
    let churn = compile_c("pool_churn", "", &["-lcuda"]);
    let churners: Vec<Child> = (0..2)
        .map(|i| {
            let ready = file(&format!("c{i}.ready"));
            let mut c = on_shared_gpu(
                &s,
                s.gpucap(&[
                    "run",
                    "--limit",
                    "1Gi",
                    "--pool",
                    "t",
                    "--",
                    churn.to_str().unwrap(),
                    "2",
                    "20000",
                    "8Mi",
                    &ready,
                    &file("go"),
                ]),
            );
            // (a refusal line each time: more than a pipe holds)
            c.env("GPUCAP_WAIT", "0")
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            let mut c = c.spawn().unwrap();
            wait_ready(&mut c, std::path::Path::new(&ready), "a churner");
            c
        })
        .collect();
    // 384 MiB in use, 512 MiB guaranteed: 896 committed. The guarantees fit 640 MiB.
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "640Mi"]));
    assert_ok(&o);
    std::fs::write(s.dir.join("go"), b"").unwrap();
    // Resizes while the others run, until the borrower gave back and the churners end.
    let mut resizes = 0;
    let mut churners: Vec<Option<Child>> = churners.into_iter().map(Some).collect();
    let mut churned = Vec::new();
    let start = std::time::Instant::now();
    while !churners.iter().all(Option::is_none) || !s.dir.join("b.done").exists() {
        assert!(
            start.elapsed().as_secs() < 120,
            "the churners or the borrower never ended"
        );
        for cap in [LOWER, "640Mi"] {
            assert_ok(&run(&mut s.gpucap(&["pool", "resize", "t", cap])));
            resizes += 1;
        }
        for c in churners.iter_mut() {
            if c.as_mut().is_some_and(|c| c.try_wait().unwrap().is_some()) {
                churned.push(c.take().unwrap().wait_with_output().unwrap());
            }
        }
    }
    for o in &churned {
        assert!(
            o.status.success() && stdout(o).contains("churn ok="),
            "{}",
            dump(o)
        );
    }
    let outs: Vec<Output> = gs.drain(..).map(kill).collect();
    kill(b);
    let served: usize = outs
        .iter()
        .map(|o| {
            stdout(o)
                .lines()
                .filter(|l| *l == format!("alloc {} 0", 128 * MIB))
                .count()
        })
        .sum();
    let peak = super::pool_storm::shared_peak(&s.dir);
    let churn: Vec<String> = churned
        .iter()
        .map(|o| stdout(o).trim().to_string())
        .collect();
    eprintln!(
        "{resizes} resizes, {served} of 4 guaranteed requests served, shared peak {} MiB, \
         {churn:?}",
        peak / MIB
    );
    assert!(
        peak <= LOW,
        "the fake GPU held {} MiB under a cap of at most 640 MiB ({resizes} resizes; \
         {served} of the 4 guaranteed requests served)\n{}\n{}",
        peak / MIB,
        dump(&outs[0]),
        dump(&outs[1])
    );
    assert!(
        served <= 2,
        "{served} of the 4 guaranteed requests served: at most 256 MiB fit under 640 MiB"
    );
}

/// GPU entry 0's cap generation word (src/core/budget/layout.rs: the header's 16 words,
/// then the entry's `G_CAP_GEN`), odd while a resize or `pool set` is under way.
const G0_CAP_GEN: u64 = 16 + 17;

/// GPU entry 0's turn byte, locked by the process whose resize or `pool set` is under way
/// (src/pool-file/locks.rs: past 4,096 slot bytes, 32 window bytes, 4,096 children's).
const G0_TURN_BYTE: i64 = (1 << 40) + 4096 + 32 + 4096;

/// Takes (`F_WRLCK`) or gives back (`F_UNLCK`) the turn byte through `f`'s open file.
fn turn_lock(f: &std::fs::File, kind: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock is plain data; all-zero is valid (l_pid must be 0 for OFD locks).
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as _;
    l.l_whence = libc::SEEK_SET as _;
    l.l_start = G0_TURN_BYTE;
    l.l_len = 1;
    // SAFETY: our file's descriptor and a valid flock.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut l as *mut libc::flock) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

/// A resize (or `pool set`) under way in a live process, one stopped half-way (its turn
/// taken: the GPU's turn byte locked, the cap generation odd), is waited for and never
/// taken over; once its process is gone (the lock dropped, the generation left odd) the
/// next resize finishes the turn at once. Before, a resizer stopped for a second was taken
/// over while it lived: both finished the same generation, and a member that had read the
/// second's cap (2 GiB) kept it as its own while the first's (512 MiB) stood in the pool's
/// word, and grew to 1.56 GiB under it (seen with gdb stopping `gpucap pool resize`).
#[test]
fn a_resize_stopped_half_way_is_waited_for_never_taken_over_while_its_process_lives() {
    use std::os::unix::fs::FileExt;
    let s = Scratch::new("pool-resize-turn");
    let mut a = member(&s, "a", "0", &["alloc:100Mi"]);
    wait_ready(&mut a, &s.dir.join("a.done"), "the member a");
    // The stopped resizer: its turn's lock, and the generation it made odd.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(s.pool_file("t"))
        .unwrap();
    turn_lock(&file, libc::F_WRLCK);
    let mut word = [0u8; 8];
    file.read_exact_at(&mut word, G0_CAP_GEN * 8).unwrap();
    let generation = u64::from_le_bytes(word);
    assert_eq!(generation & 1, 0, "no resize under way yet");
    file.write_all_at(&(generation + 1).to_le_bytes(), G0_CAP_GEN * 8)
        .unwrap();

    let start = std::time::Instant::now();
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "2Gi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stderr(&o).contains("not resized: another `gpucap pool resize` or `gpucap pool set`")
            && stderr(&o).contains("nothing was changed"),
        "{}",
        dump(&o)
    );
    assert!(
        start.elapsed() >= std::time::Duration::from_secs(9),
        "{}",
        dump(&o)
    );
    assert_eq!(status(&s)["gpus"][0]["cap"], 1 << 30);

    // The resizer's process ends half-way (its lock dropped, 2 s into the next resize):
    // that resize waited for it, then finishes the turn.
    let released = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        turn_lock(&file, libc::F_UNLCK);
        std::time::Instant::now()
    });
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "2Gi"]));
    let done = std::time::Instant::now();
    let released = released.join().unwrap();
    assert_ok(&o);
    assert!(
        stdout(&o).contains(": cap 1 GiB -> 2 GiB, 100 MiB in use"),
        "{}",
        dump(&o)
    );
    assert!(
        done >= released,
        "finished before the turn was given back\n{}",
        dump(&o)
    );
    let g = &status(&s)["gpus"][0];
    assert_eq!(g["cap"], 2u64 << 30);
    assert_eq!(g["cap_drift"], false, "{g}");
    // The generation is even again: the 2 GiB cap is in force for every member.
    let c = once(&s, &["alloc:1500Mi"]);
    assert!(
        stdout(&c).contains(&format!("alloc {} 0", 1500 * MIB)),
        "{}",
        dump(&c)
    );
    kill(a);
}

/// A copy of the library in `home` with `gpucap.env` saying `GPUCAP_LIMIT=256Mi`: a
/// ceiling handed down to the processes that load it.
fn library_under_ceiling(home: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(home).unwrap();
    let lib = home.join("libgpucap.so");
    std::fs::copy(shim(), &lib).unwrap();
    std::fs::write(home.join("gpucap.env"), "GPUCAP_LIMIT=256Mi\n").unwrap();
    lib
}

/// A process of pool `t` under that ceiling (`gpucap run` with `GPUCAP_LIB`, `limit`
/// asked by `--limit` where given), running `steps`, then holding its memory until
/// killed; its stderr goes to `TAG.err`.
fn under_ceiling(s: &Scratch, tag: &str, limit: Option<&str>, steps: &[String]) -> Child {
    let lib = library_under_ceiling(&s.dir.join("home"));
    let mut args: Vec<String> = vec!["run".into()];
    if let Some(l) = limit {
        args.extend(["--limit".into(), l.into()]);
    }
    args.extend(["--pool".into(), "t".into(), "--".into()]);
    args.push(script().to_str().unwrap().into());
    args.extend(steps.iter().cloned());
    args.push(format!("wait:{}", s.dir.join("never").display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = std::fs::File::create(s.dir.join(format!("{tag}.err"))).unwrap();
    on_shared_gpu(s, s.gpucap(&args))
        .env("GPUCAP_LIB", &lib)
        .env("GPUCAP_WAIT", "0")
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .unwrap()
}

/// What a member under a 256 MiB ceiling says once its pool's words let it past: its
/// 1,200 MiB allocation refused with the ceiling's line, and `cuMemGetInfo` showing no
/// more than the ceiling.
fn assert_held_at_the_ceiling(s: &Scratch, out: &Output, tag: &str) {
    let err = std::fs::read_to_string(s.dir.join(format!("{tag}.err"))).unwrap_or_default();
    let text = stdout(out);
    assert!(
        text.contains(&format!("alloc {} 2", 1200 * MIB)),
        "1,200 MiB served past the 256 MiB ceiling\n{text}\n{err}"
    );
    assert!(
        err.contains("of the 256 MiB cap in use"),
        "the ceiling's line\n{text}\n{err}"
    );
    let info = text
        .lines()
        .find(|l| l.starts_with("info "))
        .unwrap_or_else(|| panic!("no info line\n{text}\n{err}"));
    let total: u64 = info.split(' ').nth(2).unwrap().parse().unwrap();
    assert!(
        total <= 256 * MIB,
        "{info}: more than the ceiling shown\n{err}"
    );
}

/// A pool resized above the ceiling handed down to a member (a file beside the library
/// it loads) lets every other member hold more, never that one: it holds its own
/// ceiling in its own memory. Before, the member took the pool's raised cap (1,200 MiB
/// served under a 256 MiB ceiling), since inside a pool its own cap gave way to the
/// pool's words.
#[test]
fn a_pool_resized_above_a_members_ceiling_never_takes_it_past_that_ceiling() {
    let s = Scratch::new("pool-resize-ceiling");
    let (held, go) = (s.dir.join("held"), s.dir.join("go"));
    let mut a = under_ceiling(
        &s,
        "a",
        None,
        &[
            "alloc:100Mi".into(),
            format!("touch:{}", held.display()),
            format!("wait:{}", go.display()),
            "alloc:1200Mi".into(),
            "info".into(),
            format!("touch:{}", s.dir.join("a.done").display()),
        ],
    );
    wait_ready(&mut a, &held, "the member a's first block");
    assert_eq!(status(&s)["gpus"][0]["cap"], 256 * MIB);
    assert_ok(&run(&mut s.gpucap(&["pool", "resize", "t", "2Gi"])));
    // A member with no ceiling is served past 256 MiB after the raise.
    let c = once(&s, &["alloc:1200Mi"]);
    assert!(
        stdout(&c).contains(&format!("alloc {} 0", 1200 * MIB)),
        "{}",
        dump(&c)
    );
    std::fs::write(&go, b"").unwrap();
    wait_ready(&mut a, &s.dir.join("a.done"), "the member a");
    let oa = kill(a);
    assert_held_at_the_ceiling(&s, &oa, "a");
}

/// `gpucap pool set --ceiling none` on a member under a ceiling handed down that asked
/// for less than it (so `status` shows no mark of the ceiling) lets it hold no more than
/// that ceiling. Before, it was served the pool's 4 GiB.
#[test]
fn a_member_ceiling_lifted_by_pool_set_never_takes_a_member_past_its_handed_down_ceiling() {
    let s = Scratch::new("pool-set-ceiling");
    // The pool's maker, with no file: 4 GiB.
    let maker_done = s.dir.join("maker.done");
    let mut maker = on_shared_gpu(
        &s,
        s.gpucap(&[
            "run",
            "--limit",
            "4Gi",
            "--pool",
            "t",
            "--",
            script().to_str().unwrap(),
            &format!("touch:{}", maker_done.display()),
            &format!("wait:{}", s.dir.join("never").display()),
        ]),
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    wait_ready(&mut maker, &maker_done, "the pool's maker");
    let (held, go) = (s.dir.join("held"), s.dir.join("go"));
    let mut b = under_ceiling(
        &s,
        "b",
        Some("255Mi"),
        &[
            format!("touch:{}", held.display()),
            format!("wait:{}", go.display()),
            "alloc:1200Mi".into(),
            "info".into(),
            format!("touch:{}", s.dir.join("b.done").display()),
        ],
    );
    wait_ready(&mut b, &held, "the member b");
    let maker_pid = u64::from(maker.id());
    let v = status(&s);
    let b_pid = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_u64().unwrap())
        .find(|&p| p != maker_pid)
        .unwrap_or_else(|| panic!("no member but the maker: {v}"))
        .to_string();
    let o = run(&mut s.gpucap(&["pool", "set", "t", &b_pid, "--ceiling", "none"]));
    assert_ok(&o);
    std::fs::write(&go, b"").unwrap();
    wait_ready(&mut b, &s.dir.join("b.done"), "the member b");
    let ob = kill(b);
    kill(maker);
    assert_held_at_the_ceiling(&s, &ob, "b");
}
