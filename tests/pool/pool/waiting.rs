//! Waiting for memory (GPUCAP_WAIT): served when a member frees, in arrival order, refused
//! after the timeout, nothing left behind by a killed waiter or holder.

use super::*;

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

/// A member's own threads free memory as other members do: with GPUCAP_WAIT, a request
/// the pool has no room for beside what another thread of the same process holds waits
/// for that thread's free (and a request past the process's own starting cap is the
/// pool's to decide). Before, the process's own cap refused it at once, with a line that
/// named no pool and said no wait.
#[test]
fn a_request_waits_for_a_free_by_another_thread_of_the_same_member() {
    let p = Pool::new("wait-own-thread");
    let mut c = p.cmd(
        compile_c("own_wait", "", &["-lcuda", "-lpthread"]),
        "o.json",
    );
    c.env("GPUCAP_WAIT", "60s").args(["800Mi", "400Mi", "300"]);
    let o = run(&mut c);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains("A alloc 0\n") && out.contains("B alloc 0\n"),
        "{}",
        dump(&o)
    );
    assert!(
        stderr(&o).contains("waiting for 400 MiB on GPU 0: the pool has no room now"),
        "{}",
        dump(&o)
    );
}

/// A waiter stopped at the head of the queue (SIGSTOP, a debugger, a frozen container)
/// holds up no one behind it: once it has not looked at the queue for a second, a later
/// waiter is served from the memory that is free, and the stopped one takes its turn
/// again when it runs. Before, the later waiter was refused at its deadline with the pool
/// empty ("0 B of the pool's 1 GiB cap in use ... after waiting 10.0 s").
#[test]
fn a_stopped_waiter_at_the_head_of_the_queue_holds_up_no_one() {
    let p = Pool::new("wait-stopped-head");
    let h = holder(&p);
    let w1 = p.waiter("1.json", &["alloc:500Mi"]);
    p.wait_waiters(1);
    // SAFETY: a child of this test, not yet waited for.
    assert_eq!(unsafe { libc::kill(w1.id() as i32, libc::SIGSTOP) }, 0);
    p.touch("go");
    assert_ok(&finish(h));
    let mut c = p.script("2.json", &["alloc:100Mi"]);
    c.env("GPUCAP_WAIT", "10s");
    let w2 = run(&mut c);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(w1.id() as i32, libc::SIGCONT) }, 0);
    assert!(has(&w2, &format!("alloc {} 0", 100 * MIB)), "{}", dump(&w2));
    let w1 = finish(w1);
    assert!(has(&w1, &format!("alloc {} 0", 500 * MIB)), "{}", dump(&w1));
    assert_eq!(p.waiters(), 0);
}
