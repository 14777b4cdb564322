//! Forks, exec chains, threads and PID namespaces: a child is its own member, a dead
//! parent's share comes back, a dead member's bytes wait for its last thread, members in
//! other namespaces share the pool without reaping each other.

use super::*;

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

/// A member killed while its forked child (which never uses CUDA, as a DataLoader
/// worker) lives: the child holds the parent's device files, so the driver keeps the
/// parent's memory (the fake GPU as a real one: NVIDIA/Megatron-LM#3684), and so does the
/// pool until the child is gone. Before, the pool gave the 600 MiB away at the parent's
/// death and the fake GPU held 1,500 MiB under the 1 GiB cap.
#[test]
fn a_dead_parents_share_stays_while_its_child_holds_its_device_files() {
    let p = Pool::new("pool-fork-sleep");
    let mut a =
        spawn(
            p.cmd(pool_fork(), "a.json")
                .args(["sleep", &p.path("ready"), &p.path("never")]),
        );
    p.wait_file("ready");
    let child = child_pid_line(&mut a);
    let parent = a.id();
    sigkill(&mut a);
    // The parent's slot lock is gone; the child's hold on its memory is the one left.
    p.wait_live_members(1);
    let (doc, text) = status_json(&p);
    let dead = doc["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["pid"] == parent)
        .unwrap_or_else(|| panic!("the dead parent is listed: {doc}"));
    assert_eq!(
        (&dead["alive"], &dead["held_by_children"]),
        (&false.into(), &true.into()),
        "{doc}"
    );
    assert!(
        text.contains(" dead+ ")
            && text.contains("processes it forked still hold its device files"),
        "{text}"
    );
    let b = run(&mut p.script("b.json", &["alloc:900Mi", "alloc:400Mi"]));
    assert!(
        has(&b, &format!("alloc {} {OOM}", 900 * MIB)),
        "the dead parent's 600 MiB are still the driver's while its child lives\n{}",
        dump(&b)
    );
    assert!(has(&b, &format!("alloc {} 0", 400 * MIB)), "{}", dump(&b));
    assert!(
        p.shared_peak("b.json") <= 1024 * MIB,
        "the fake GPU held {} MiB",
        p.shared_peak("b.json") / MIB
    );
    // SAFETY: a plain kill of the child this test made.
    unsafe { libc::kill(child, libc::SIGKILL) };
    p.wait_live_members(0);
    let c = run(&mut p.script("c.json", &["alloc:900Mi"]));
    assert!(
        has(&c, &format!("alloc {} 0", 900 * MIB)),
        "the parent's 600 MiB came back once its child was gone\n{}",
        dump(&c)
    );
    assert!(p.shared_peak("c.json") <= 1024 * MIB);
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

/// The state of /proc/PID/stat's `state` and `num_threads` fields.
fn state_and_threads(pid: u32) -> (String, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the member's stat");
    let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    (f[0].to_string(), f[17].parse().unwrap())
}

#[test]
fn a_dead_members_bytes_wait_for_its_last_thread() {
    // A killed member's threads end one by one; its files close only with the last, and
    // the driver frees its memory then. Held still here: the leader a zombie, the pool
    // file closed (the member's lock gone), another thread holding the fake GPU's file.
    let p = Pool::new("pool-last-thread");
    let mut a = spawn(
        p.cmd(compile_c("pool_last_thread", "", &["-lcuda"]), "a.json")
            .arg(p.path("ready")),
    );
    p.wait_file("ready");
    p.wait_live_members(0);
    let (state, threads) = state_and_threads(a.id());
    if (state.as_str(), threads) != ("Z", 2) {
        sigkill(&mut a);
        panic!(
            "the member's leader should be a zombie beside its last thread: state {state}, {threads} threads"
        );
    }
    // The new member's 600 MiB fits only once the dead member's are released: it
    // waits for them (up to `EXIT_MAX`, 10 s), and gets them when its process is gone.
    let b = spawn(&mut p.script("b.json", &["alloc:600Mi"]));
    std::thread::sleep(Duration::from_secs(1));
    sigkill(&mut a);
    let b = finish(b);
    let peak = p.shared_peak("b.json");
    assert!(
        peak <= 1024 * MIB,
        "a member whose last thread still held the driver's files had its 600 MiB handed out \
         again: the fake GPU held {} MiB under the 1 GiB cap\n{}",
        peak / MIB,
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} 0", 600 * MIB)),
        "the member's 600 MiB did not come back once its process was gone\n{}",
        dump(&b)
    );
}
