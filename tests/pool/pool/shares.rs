//! Guarantees and ceilings (GPUCAP_GUARANTEE, GPUCAP_CEILING): a member gets its guarantee,
//! is held at its ceiling, borrowed bytes return; impossible words are repaired.

use super::sharing::{Duet, Part, alloc, duet, info, run_table};
use super::*;

// ---------------------------------------------------------------------------
// Guarantees and ceilings inside a pool (GPUCAP_GUARANTEE, GPUCAP_CEILING).

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
    for (i, c) in procs.into_iter().enumerate() {
        let o = finish(c);
        assert_ok(&o);
        let out = stdout(&o);
        let churn = out.lines().find(|l| l.starts_with("churn ")).unwrap();
        refused += churn_field(churn, "refused");
        if shares[i].0 > 0 {
            let line = out.lines().find(|l| l.starts_with("checked=")).unwrap();
            assert_eq!(
                churn_field(line, "broken"),
                0,
                "a live guarantee was broken\n{}",
                dump(&o)
            );
            checked += churn_field(line, "checked");
        }
    }
    assert!(refused > 0, "the processes competed for the cap");
    assert!(checked > 0, "no request inside a guarantee was checked");
    p.assert_churned_within(512 * MIB, (0..shares.len()).map(|i| format!("s{i}.json")));
}

// ---- Two members, one with a guarantee -------------------------------------------------

/// A member with a guarantee (A) and a neighbour without (B): what each is served.
fn guaranteed_and_not() -> Vec<Duet> {
    let forced_past_the_cap = |name, step, var| Duet {
        name,
        a: Part {
            steps: &[
                "touch:a-in",
                "wait:b-loaded",
                "alloc:512Mi",
                "touch:a-tried",
                "wait:b-freed",
                "alloc:512Mi",
                "touch:a-done",
            ],
            env: &[("GPUCAP_GUARANTEE", "512Mi")],
            err_has: &["766 MiB of the pool's 1 GiB cap in use"],
            ..Part::default()
        },
        b: Part {
            steps: step,
            env: var,
            says: vec![(format!("{} 0", step[1]), "")],
            ..Part::default()
        },
        peak_at_most: Some((1024 + 254) * MIB),
        then: Some(refused_past_the_cap_then_served),
        ..Duet::default()
    };
    vec![
        // A notebook with a guarantee of 400 MiB, and a trainer taking all it can.
        Duet {
            name: "a_guaranteed_member_gets_its_guarantee_though_a_neighbour_tried_to_take_everything",
            a: Part {
                steps: &[
                    "touch:n-in",
                    "wait:t-full",
                    "alloc:250Mi",
                    "alloc:150Mi",
                    "info",
                    "touch:n-done",
                ],
                env: &[("GPUCAP_GUARANTEE", "400Mi")],
                ok: true,
                says: vec![
                    (alloc(250, "0"), ""),
                    (alloc(150, "0"), ""),
                    (info(48, 1024), ""),
                ],
                ..Part::default()
            },
            b: Part {
                steps: &[
                    "alloc:1Gi",
                    "fill:64Mi",
                    "info",
                    "touch:t-full",
                    "wait:n-done",
                ],
                // The line says why the pool's room is less than its cap less its use.
                err_has: &[
                    "0 B of the pool's 1 GiB cap in use, 0 B of it by this process, and 400 MiB kept for other members' guarantees",
                ],
                says: vec![
                    (alloc(1024, OOM), ""),
                    (
                        "filled 9".to_string(),
                        "the trainer got 9 x 64 MiB: 1 GiB less the notebook's 400 MiB",
                    ),
                    (
                        info(48, 1024),
                        "the trainer sees 48 MiB free: the 400 MiB kept for the notebook are not",
                    ),
                ],
                ..Part::default()
            },
            peak_at_most: Some(1024 * MIB),
            used_after: Some(0),
            ..Duet::default()
        },
        Duet {
            name: "borrowed_bytes_return_to_the_pool_as_the_borrower_frees",
            a: Part {
                steps: &[
                    "touch:a-in",
                    "wait:b-took",
                    "alloc:600Mi",
                    "alloc:300Mi",
                    "touch:a-full",
                    "wait:b-freed",
                    "alloc:300Mi",
                    "info",
                ],
                env: &[("GPUCAP_GUARANTEE", "600Mi")],
                says: vec![
                    (alloc(600, "0"), ""),
                    (
                        alloc(300, OOM),
                        "B's borrowed 400 MiB are B's while it holds them",
                    ),
                    (alloc(300, "0"), "B freed: A borrows them"),
                    (info(124, 1024), ""),
                ],
                ..Part::default()
            },
            b: Part {
                steps: &[
                    "alloc:400Mi",
                    "alloc:100Mi",
                    "touch:b-took",
                    "wait:a-full",
                    "free",
                    "touch:b-freed",
                ],
                says: vec![
                    (alloc(400, "0"), "B borrows"),
                    (alloc(100, OOM), "but not into A's unused 600 MiB"),
                ],
                ..Part::default()
            },
            ..Duet::default()
        },
        // A neighbour's charge that could not be refused: B holds 510 MiB of the 1 GiB
        // pool, then its first use of a library (a launch) or of a module's function
        // (`cuModuleGetFunction`) makes the driver load 256 MiB that nobody could
        // foresee, charged by force: 254 MiB of it past the cap (A's unused guarantee of
        // 512 MiB is not counted as room). The cap in force wins for every admission:
        // A's 512 MiB, inside its guarantee, is refused while the pool stands past what
        // it can hold ("766 MiB of the pool's 1 GiB cap in use"), and served once B gave
        // its 510 MiB back. The fake driver never holds more than the cap plus what was
        // forced past it (254 MiB), and nothing but the forced charge takes the pool past
        // the cap.
        forced_past_the_cap(
            "a_forced_charge_past_the_cap_by_a_launch_holds_a_guarantee_off_until_memory_is_given_back",
            LAUNCH,
            &[("FAKECUDA_LIBRARY_MEM", "256Mi")],
        ),
        forced_past_the_cap(
            "a_forced_charge_past_the_cap_by_a_function_holds_a_guarantee_off_until_memory_is_given_back",
            GET_FUNCTION,
            &[("FAKECUDA_FUNCTION_MEM", "256Mi")],
        ),
    ]
}

/// B's steps in the forced cases: 510 MiB, then the step that loads 256 MiB.
const LAUNCH: &[&str] = &[
    "alloc:510Mi",
    "kernel",
    "touch:b-loaded",
    "wait:a-tried",
    "free",
    "touch:b-freed",
    "wait:a-done",
];
const GET_FUNCTION: &[&str] = &[
    "alloc:510Mi",
    "getfn",
    "touch:b-loaded",
    "wait:a-tried",
    "free",
    "touch:b-freed",
    "wait:a-done",
];

/// A's two tries of 512 MiB: refused while the pool stood past its cap, then served once
/// B gave back.
fn refused_past_the_cap_then_served(_: &Pool, a: &Output, _: &Output) {
    let tries: Vec<String> = lines(a)
        .into_iter()
        .filter(|l| l.starts_with(&format!("alloc {} ", 512 * MIB)))
        .collect();
    assert_eq!(
        tries,
        [alloc(512, "2"), alloc(512, "0")],
        "refused past the cap, then served once B gave back\n{}",
        dump(a)
    );
}

#[test]
fn a_guarantee_is_kept_for_its_member_and_lent_while_unused() {
    run_table(&guaranteed_and_not(), |c| c.name, duet);
}

/// Where the share words start (src/core/budget/layout.rs: 16 header words, 32 GPU
/// entries of 24, the states of 256 member slots, the slots of 16 + 32 x 5), GPU entry
/// 0's first word of holder bits, and slot `s`'s guarantee word on GPU entry 0 (32 GPUs'
/// holder bits of 4 words, then GPU entry 0's guarantee and ceiling of every slot).
const SHARES_AT: usize = 16 + 32 * 24 + 256 + 256 * (16 + 32 * 5);

const G0_HOLDER_BITS: usize = SHARES_AT;

fn g0_guarantee_word(s: usize) -> usize {
    SHARES_AT + 32 * 4 + s * 2
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
