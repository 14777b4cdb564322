//! One cap for every process of a pool: members share it, agree on it, get a killed
//! member's share back; a bad pool file fails closed.

use super::*;

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
            b[8] = 9;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 9 pool file and this gpucap reads version 8",
    );
    // A file left by a gpucap of version 7 (the slots' states and traffic marks in
    // the slots, share words member by member: another length).
    refused_with(
        "pool-version-7",
        |p| {
            let mut b = made(p);
            b.truncate(826_496);
            b[8] = 7;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 7 pool file and this gpucap reads version 8",
    );
    // A file left by a gpucap of version 6 (no record of a ceiling handed down: version
    // 7's length, its slots' last two words left unwritten).
    refused_with(
        "pool-version-6",
        |p| {
            let mut b = made(p);
            b.truncate(826_496);
            b[8] = 6;
            std::fs::write(p.file(), b).unwrap()
        },
        "version 6 pool file and this gpucap reads version 8",
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
        "version 3 pool file and this gpucap reads version 8",
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
        "version 2 pool file and this gpucap reads version 8",
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
        "version 1 pool file and this gpucap reads version 8",
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
        "version 5 pool file and this gpucap reads version 8",
    );
    refused_with(
        "pool-corrupt",
        |p| {
            let mut b = made(p);
            // Slot 0's state: the first word after the header and the GPU entries.
            let state0 = (16 + 32 * 24) * 8;
            b[state0] = 9;
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
