//! Many members in one pool: a pool made with `GPUCAP_POOL_MEMBERS`
//! holds that many processes started at once, each holding a block; a joiner past the
//! count waits for a slot under `GPUCAP_WAIT` and is served when a member leaves, and
//! without it is refused with the count and how to raise it.
//!
//! `GPUCAP_MANY_MEMBERS` sets the count of the first test (default 600). The most a
//! pool file holds, 4,096 members, started at once all join and hold a block too: a
//! joiner makes a few kernel lock calls, not one per member (see `budget::join`).

use super::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pool_scratch::*;
use common::*;

/// A process of pool `many` on the fake GPU (1 GiB cap for the pool), the pool's file
/// made with `members` slots, running the script with `steps`.
fn member_cmd(s: &Scratch, members: usize, steps: &[String]) -> Command {
    let mut c = fake_cmd(script(), &s.dir.join("stats.json"));
    preload(&mut c)
        .args(steps)
        .env("FAKECUDA_TOTAL_MEM", "64Gi")
        .env("GPUCAP_LIMIT", "16Gi")
        .env("GPUCAP_POOL", "many")
        .env("GPUCAP_POOL_DIR", &s.pools)
        .env("GPUCAP_POOL_MEMBERS", members.to_string())
        .current_dir(&s.dir);
    c
}

/// Steps: take 1 MiB, say so in `ready/TAG`, hold it until `go` exists.
fn hold_steps(s: &Scratch, tag: &str, go: &Path) -> Vec<String> {
    vec![
        "alloc:1Mi".into(),
        format!("touch:{}", s.dir.join("ready").join(tag).display()),
        format!("wait:{}", go.display()),
    ]
}

fn ready_count(s: &Scratch) -> usize {
    std::fs::read_dir(s.dir.join("ready")).map_or(0, |d| d.count())
}

fn wait_ready(s: &Scratch, n: usize, children: &mut [Child], limit: Duration) {
    let start = Instant::now();
    while ready_count(s) < n {
        for c in children.iter_mut() {
            if let Some(st) = c.try_wait().unwrap() {
                panic!("a member exited ({st}) before all {n} were ready");
            }
        }
        assert!(
            start.elapsed() < limit,
            "{} of {n} members ready after {limit:?}",
            ready_count(s)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status(s: &Scratch) -> serde_json::Value {
    let o = run(s
        .gpucap(&["status", "--pool", "many", "--json"])
        .env_remove("GPUCAP_POOL_MEMBERS"));
    assert_ok(&o);
    serde_json::from_str(&stdout(&o)).unwrap()
}

#[test]
fn a_pool_made_for_1000_members_takes_1000_started_at_once() {
    let n: usize = std::env::var("GPUCAP_MANY_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let s = Scratch::new("pool-many");
    std::fs::create_dir_all(s.dir.join("ready")).unwrap();
    let go = s.dir.join("go");
    let start = Instant::now();
    let mut children: Vec<Child> = (0..n)
        .map(|i| {
            member_cmd(&s, n + 24, &hold_steps(&s, &i.to_string(), &go))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_ready(&s, n, &mut children, Duration::from_secs(300));
    eprintln!(
        "{n} members joined and hold 1 MiB each in {:?}",
        start.elapsed()
    );
    let doc = status(&s);
    assert_eq!(doc["slots"], n + 24);
    let members = doc["members"].as_array().unwrap();
    assert_eq!(members.len(), n, "every member in its slot");
    assert!(members.iter().all(|m| m["alive"] == true));
    assert_eq!(doc["gpus"][0]["used"], n as u64 * (1 << 20));
    std::fs::write(&go, b"").unwrap();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
}

#[test]
fn a_pool_of_4096_members_takes_4096_started_at_once() {
    use std::io::{BufRead, Write};
    const N: usize = 4096;
    let s = Scratch::new("pool-4096");
    // tests/c/bench_start.c: forks the members, each takes 1 MiB and says so on a pipe,
    // then blocks (no polling: 4,096 members polling would starve the joiners).
    let mut c = fake_cmd(
        compile_c("bench_start", "", &["-lcuda"]),
        &s.dir.join("stats.json"),
    );
    let mut launcher = c
        .args([N.to_string(), shim().display().to_string()])
        .env("BENCH_START_HOLD", "1")
        .env("FAKECUDA_TOTAL_MEM", "64Gi")
        .env("GPUCAP_LIMIT", "16Gi")
        .env("GPUCAP_POOL", "many")
        .env("GPUCAP_POOL_DIR", &s.pools)
        .env("GPUCAP_POOL_MEMBERS", N.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = launcher.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    // A guard against a hang only (this is no timing test; see scripts/bench/bench-start.sh):
    // a joiner that tried a lock per member took over ten minutes for all to hold.
    let Ok(line) = rx.recv_timeout(Duration::from_secs(600)) else {
        let _ = launcher.kill(); // its members see the end of their pipe and exit
        let _ = launcher.wait();
        panic!("{N} members started at once did not all hold a block within 600 s");
    };
    eprintln!("{}", line.trim());
    assert!(line.contains(" failed=0"), "{line}");
    let doc = status(&s);
    assert_eq!(doc["slots"], N);
    let members = doc["members"].as_array().unwrap();
    assert_eq!(members.len(), N, "every member in its slot");
    assert!(members.iter().all(|m| m["alive"] == true));
    assert_eq!(doc["gpus"][0]["used"], N as u64 * (1 << 20));
    launcher.stdin.take().unwrap().write_all(b"\n").unwrap();
    assert!(launcher.wait().unwrap().success());
}

#[test]
fn a_joiner_past_the_count_waits_for_a_slot_or_is_told_how_to_raise_it() {
    let s = Scratch::new("pool-many-wait");
    std::fs::create_dir_all(s.dir.join("ready")).unwrap();
    let (go_a, go_b) = (s.dir.join("go-a"), s.dir.join("go-b"));
    let mut held: Vec<Child> = [("a", &go_a), ("b", &go_b)]
        .iter()
        .map(|(tag, go)| {
            member_cmd(&s, 2, &hold_steps(&s, tag, go))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    wait_ready(&s, 2, &mut held, Duration::from_secs(60));
    assert_eq!(status(&s)["slots"], 2);

    // Without GPUCAP_WAIT: refused at once, the count and the variable named.
    let o = run(&mut member_cmd(&s, 2, &["alloc:1Mi".into()]));
    let err = stderr(&o);
    assert!(
        err.contains("the pool has 2 live members already") && err.contains("GPUCAP_POOL_MEMBERS"),
        "{}",
        dump(&o)
    );

    // With it: waits, and is served once a member leaves.
    let mut c = member_cmd(&s, 2, &hold_steps(&s, "c", &go_a));
    let waiter = c
        .env("GPUCAP_WAIT", "60s")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ready_count(&s), 2, "the third member waits for a slot");
    let mut a = held.remove(0);
    std::fs::write(&go_a, b"").unwrap();
    assert!(a.wait().unwrap().success());
    let mut all = vec![waiter];
    wait_ready(&s, 3, &mut all, Duration::from_secs(30));
    std::fs::write(&go_b, b"").unwrap();
    for mut c in all.into_iter().chain(held) {
        assert!(c.wait().unwrap().success());
    }
}
