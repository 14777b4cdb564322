//! `gpucap pool resize` on a live pool, with members on the fake GPU: a raise serves a
//! waiting member, a member started later with the old GPUCAP_LIMIT joins, a lower
//! refuses the next allocation with the pool's line and takes nothing back, and the
//! fake GPU's shared peak never passes the highest cap in force.

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

#[test]
fn a_resize_errors_name_what_is_wrong() {
    let s = Scratch::new("pool-resize-errors");
    let o = run(&mut s.gpucap(&["pool", "resize", "nosuch", "1Gi"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(dump(&o).contains("gpucap: no pool file at"), "{}", dump(&o));
    let o = run(&mut s.gpucap(&["pool", "resize", "t", "8X"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(dump(&o).contains("invalid size \"8X\""), "{}", dump(&o));
}
