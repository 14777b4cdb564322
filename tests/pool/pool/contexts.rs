//! Memory the driver takes on its own in a pool: contexts made at once, slow or stopped,
//! libraries' kernels in every context, a lowered stack limit.

use super::sharing::{Duet, Part, alloc, duet, run_table};
use super::*;

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

// ---- Two members' memory beside each other's ----------------------------------------

/// Two members whose contexts hold memory the driver takes on its own: what the pool
/// charges while both hold it.
fn two_members() -> Vec<Duet> {
    vec![
        // A library's kernel loaded into several contexts of two members: each
        // context's copy is charged to the pool, so that a 1 GiB pool of two members
        // launching it in three contexts each (6 x 200 MiB) refuses the copies past its
        // cap before the driver loads them, and the fake driver never holds more than
        // the cap (a pool counting one copy per process would charge 400 MiB while the
        // driver holds 1,200). B starts once A's copies are loaded: a context is
        // measured device-wide, so B's own context made while A's kernels load would be
        // charged A's loads too (counted in, never less: counting.md).
        Duet {
            name: "a_librarys_kernels_in_every_context_of_every_member_are_charged_to_the_pool",
            a: Part {
                steps: &["contexts:3", "touch:a-done", "wait:end"],
                env: &[("FAKECUDA_LIBRARY_MEM", "200Mi")],
                ..Part::default()
            },
            b: Part {
                steps: &["contexts:3", "touch:b-done", "wait:end"],
                env: &[("FAKECUDA_LIBRARY_MEM", "200Mi")],
                says: vec![(
                    format!("contexts 3 {OOM}"),
                    "refused with the driver's out-of-memory",
                )],
                ..Part::default()
            },
            used_while: Some((
                "b-done",
                1000 * MIB,
                "five copies of 200 MiB charged to the pool",
            )),
            peak_at_most: Some(1024 * MIB),
            then: Some(|_, a, b| {
                let served = |o: &Output| {
                    (1..=3)
                        .filter(|c| has(o, &format!("contexts {c} 0")))
                        .count()
                };
                assert_eq!(served(a), 3, "{}", dump(a));
                assert_eq!(
                    served(b),
                    2,
                    "B's third copy (past 1 GiB) must be refused\n{}",
                    dump(b)
                );
            }),
            ..Duet::default()
        },
        // A raised stack the pool cannot take is refused before the driver takes it: A
        // holds 768 MiB of the 1 GiB pool, B raises its stack by 396 MiB (3 x 132 MiB on
        // the fake). Measured after the call and only then refused, the driver held
        // 1,164 MiB until gpucap set the stack back (members churning at the cap beside
        // stack raises took the fake to 1,420 MiB under a 1 GiB cap, 8 runs of 8).
        Duet {
            name: "a_raised_stack_the_pool_cannot_take_is_refused_before_the_driver_takes_it",
            a: Part {
                steps: &["alloc:768Mi", "touch:a1", "wait:end"],
                says: vec![(alloc(768, "0"), "")],
                ..Part::default()
            },
            b: Part {
                steps: &["stack:3", "stack:1", "touch:b1", "wait:end"],
                says: vec![
                    (
                        format!("stack 3 {OOM}"),
                        "396 MiB beside A's 768 MiB must be refused",
                    ),
                    ("stack 1 0".to_string(), "132 MiB fits beside A's 768 MiB"),
                ],
                err_has: &["gpucap: refused cuCtxSetLimit of 396 MiB on GPU 0"],
                ..Part::default()
            },
            used_while: Some(("b1", 900 * MIB, "A's 768 MiB and B's 132 MiB stack")),
            peak_at_most: Some(1024 * MIB),
            ..Duet::default()
        },
        // A lowered stack limit gives back, to the pool, what the driver gave back: A's
        // stack takes 660 MiB of the 1 GiB pool (5 x 132 MiB on the fake), so B's
        // 512 MiB is refused; A lowers it to 264 MiB, measured with the pool's marks
        // (A's own announcement of the free taken out again), and B is then served
        // exactly the rest: 760 MiB, and not 2 MiB more. A lowered limit left charged
        // refuses B's 760 MiB; one credited twice (the announcement counted as given
        // back too) serves the 2 MiB.
        Duet {
            name: "a_lowered_stack_limit_gives_its_bytes_to_another_member",
            a: Part {
                steps: &[
                    "stack:5", "touch:a1", "wait:b1", "stack:2", "touch:a2", "wait:end",
                ],
                says: vec![("stack 5 0".to_string(), ""), ("stack 2 0".to_string(), "")],
                ..Part::default()
            },
            b: Part {
                steps: &[
                    "wait:a1",
                    "alloc:512Mi",
                    "touch:b1",
                    "wait:a2",
                    "alloc:760Mi",
                    "alloc:2Mi",
                    "touch:b2",
                    "wait:end",
                ],
                says: vec![
                    (
                        alloc(512, OOM),
                        "B's 512 MiB beside A's 660 MiB stack must be refused",
                    ),
                    (
                        alloc(760, "0"),
                        "the 396 MiB the lowered stack gave back must serve B",
                    ),
                    (alloc(2, OOM), "A's 264 MiB stack must still be charged"),
                ],
                ..Part::default()
            },
            used_while: Some(("b2", 1024 * MIB, "A's 264 MiB stack and B's 760 MiB")),
            peak_at_most: Some(1024 * MIB),
            ..Duet::default()
        },
        // Graph memory the driver gives back inside another member's measurement is
        // announced first, as any free: A trims 256 MiB of graph memory while B lowers its
        // stack from 660 to 264 MiB (the fake's cuCtxSetLimit takes 1.5 s, giving the
        // memory back halfway, where it makes a file A waits for). Unannounced, B's window saw 652 MiB given back and its
        // stack was credited that much: charged 8 MiB while the driver held 264 MiB.
        Duet {
            name: "graph_memory_trimmed_inside_a_stacks_measurement_is_not_credited_to_the_stack",
            a: Part {
                steps: &[
                    "graph:256Mi",
                    "touch:a1",
                    "wait:b-half.2",
                    "trim",
                    "touch:a2",
                    "wait:end",
                ],
                says: vec![
                    (format!("graph {} 0", 256 * MIB), ""),
                    ("trim 0".to_string(), ""),
                ],
                ..Part::default()
            },
            b: lowering_its_stack(),
            used_while: Some((
                "b1",
                264 * MIB,
                "B's 264 MiB stack (A's graph memory trimmed, credited to A alone)",
            )),
            peak_at_most: Some(1024 * MIB),
            ..Duet::default()
        },
        // A stream-ordered pool's cached memory released by a trim is announced first too:
        // A trims 256 MiB its default pool caches while B lowers its stack from 660 to
        // 264 MiB. Unannounced, B's stack was credited the 256 MiB as well: charged
        // 8 MiB while the driver held 264 MiB.
        Duet {
            name: "pool_memory_trimmed_inside_a_stacks_measurement_is_not_credited_to_the_stack",
            a: Part {
                steps: &[
                    "cache:256Mi",
                    "touch:a1",
                    "wait:b-half.2",
                    "pooltrim",
                    "touch:a2",
                    "wait:end",
                ],
                says: vec![
                    (format!("cache {} 0", 256 * MIB), ""),
                    ("pooltrim 0".to_string(), ""),
                ],
                ..Part::default()
            },
            b: lowering_its_stack(),
            used_while: Some((
                "b1",
                264 * MIB,
                "B's 264 MiB stack (A's pool memory trimmed, credited to A alone)",
            )),
            peak_at_most: Some(1024 * MIB),
            ..Duet::default()
        },
        // What a stream-ordered pool caches and releases at a synchronisation is
        // announced first too: A frees 256 MiB to its default pool (release threshold 0)
        // and synchronises while B lowers its stack from 660 to 264 MiB. Unannounced, B's
        // stack was credited the 256 MiB the synchronisation released as well: charged
        // 8 MiB while the driver held 264 MiB.
        Duet {
            name: "pool_memory_released_at_a_sync_inside_a_stacks_measurement_is_not_credited_to_the_stack",
            a: Part {
                steps: &[
                    "cachefree:256Mi",
                    "touch:a1",
                    "wait:b-half.2",
                    "sync",
                    "touch:a2",
                    "wait:end",
                ],
                says: vec![
                    (format!("cachefree {} 0", 256 * MIB), ""),
                    ("sync 0".to_string(), ""),
                ],
                ..Part::default()
            },
            b: lowering_its_stack(),
            used_while: Some((
                "b1",
                264 * MIB,
                "B's 264 MiB stack (A's pool memory released at its sync, credited to A alone)",
            )),
            peak_at_most: Some(1024 * MIB),
            ..Duet::default()
        },
        // A raised stack is charged at least what the driver takes for it: A, a process
        // outside the pool (nothing of it announced), frees 256 MiB while B raises its
        // stack by 396 MiB (1.5 s, taken halfway, where A is let go). Measured device-wide alone, the stack
        // was charged 140 MiB.
        Duet {
            name: "memory_freed_outside_the_pool_inside_a_stack_raise_is_not_taken_off_the_stack",
            a: Part {
                steps: &[
                    "alloc:256Mi",
                    "touch:a1",
                    "wait:b-half.1",
                    "free",
                    "touch:a2",
                    "wait:end",
                ],
                env_remove: &["GPUCAP_POOL"],
                says: vec![(alloc(256, "0"), ""), ("free 0".to_string(), "")],
                ..Part::default()
            },
            b: Part {
                steps: &["stack:3", "wait:a2", "touch:b1", "wait:end"],
                env: &[
                    ("FAKECUDA_LIMIT_DELAY_MS", "1500"),
                    ("FAKECUDA_LIMIT_HALFWAY", "{dir}/b-half"),
                ],
                says: vec![("stack 3 0".to_string(), "")],
                ..Part::default()
            },
            used_while: Some(("b1", 396 * MIB, "B's 396 MiB stack, all of it")),
            ..Duet::default()
        },
        // A raised stack measured beside another member's raise in flight is set back and
        // made again, not charged the other's: A raises its stack by 396 MiB and its call
        // (the fake's) stays open until B has raised its own inside it; B's reservation is
        // in flight until A is done. A's window saw both stacks (792 MiB) and nothing
        // marked to take B's off: A was charged 792 MiB under the 2 GiB cap (1,188 MiB
        // charged for 792 held; under 1 GiB, A refused). Now the excess over A's expected
        // 396 MiB is within what the pool had in flight: set back (announced as a free, B's
        // window holding it), made again, each charged its own. Both made their contexts
        // before (`a0`, `b0`): a context measured inside A's window is not this case.
        Duet {
            name: "a_stack_raised_beside_another_members_raise_is_charged_its_own",
            a: Part {
                steps: &["touch:a0", "wait:b0", "stack:3", "touch:a1", "wait:end"],
                env: &[
                    ("GPUCAP_LIMIT", "2Gi"),
                    ("FAKECUDA_LIMIT_HALFWAY", "{dir}/a-half"),
                    ("FAKECUDA_LIMIT_UNTIL", "{dir}/b-half.1"),
                ],
                says: vec![("stack 3 0".to_string(), "A's 396 MiB stack fits")],
                ..Part::default()
            },
            b: Part {
                steps: &[
                    "touch:b0",
                    "wait:a-half.1",
                    "stack:3",
                    "touch:b1",
                    "wait:end",
                ],
                env: &[
                    ("GPUCAP_LIMIT", "2Gi"),
                    ("FAKECUDA_LIMIT_HALFWAY", "{dir}/b-half"),
                    ("FAKECUDA_LIMIT_UNTIL", "{dir}/a1"),
                ],
                says: vec![(
                    "stack 3 0".to_string(),
                    "B's 396 MiB beside A's 396 MiB fits the 2 GiB pool",
                )],
                ..Part::default()
            },
            used_while: Some(("b1", 792 * MIB, "A's and B's 396 MiB stacks, each once")),
            peak_at_most: Some(1188 * MIB),
            ..Duet::default()
        },
        // A raised stack whose figure memory allocated outside the pool inflated past the
        // cap is set back and made again, not refused: A, a process outside the pool (no
        // mark of it), allocates 700 MiB while B raises its stack by 396 MiB (the fake's call
        // takes it, lets A go, and returns once A allocated). B's window saw 1,096 MiB, past the 1 GiB cap, though
        // its expected 396 MiB fit: refused before; now made again (A's 700 MiB held
        // before the next window), charged 396 MiB, and no refusal counted.
        Duet {
            name: "memory_allocated_outside_the_pool_inside_a_stack_raise_does_not_refuse_it",
            a: allocating_outside_the_pool(),
            b: Part {
                steps: &["stack:3", "wait:a2", "touch:b1", "wait:end"],
                env: &[
                    ("FAKECUDA_LIMIT_HALFWAY", "{dir}/b-half"),
                    ("FAKECUDA_LIMIT_UNTIL", "{dir}/a2"),
                    ("GPUCAP_LOG", "info"),
                ],
                says: vec![(
                    "stack 3 0".to_string(),
                    "B's 396 MiB fits the 1 GiB pool whatever A holds outside it",
                )],
                // The attempt undone counted no refusal (its exit line).
                err_has: &["none refused"],
                ..Part::default()
            },
            used_while: Some(("b1", 396 * MIB, "B's 396 MiB stack, once")),
            ..Duet::default()
        },
        // A module whose figure memory allocated outside the pool inflated past the cap
        // is unloaded and loaded again, not refused: A, a process outside the pool (no
        // mark of it), allocates 700 MiB while B loads a module whose global takes
        // 396 MiB (the fake's load takes it, lets A go, and returns once A allocated). B's
        // window saw 1,096 MiB, past the 1 GiB cap: refused before; now loaded again (A's
        // 700 MiB held before the next window), charged 396 MiB, and no refusal counted.
        Duet {
            name: "memory_allocated_outside_the_pool_inside_a_module_load_does_not_refuse_it",
            a: allocating_outside_the_pool(),
            b: Part {
                steps: &["module:396Mi", "wait:a2", "touch:b1", "wait:end"],
                env: &[
                    ("FAKECUDA_LOAD_HALFWAY", "{dir}/b-half"),
                    ("FAKECUDA_LOAD_UNTIL", "{dir}/a2"),
                    ("GPUCAP_LOG", "info"),
                ],
                says: vec![(
                    format!("module {} 0", 396 * MIB),
                    "B's 396 MiB module fits the 1 GiB pool whatever A holds outside it",
                )],
                // The attempt undone counted no refusal (its exit line).
                err_has: &["none refused"],
                ..Part::default()
            },
            used_while: Some(("b1", 396 * MIB, "B's 396 MiB module, once")),
            ..Duet::default()
        },
        // The same for a library loaded eagerly (into every context at its load): B's
        // library takes 396 MiB in its context while A, outside the pool, allocates
        // 700 MiB inside the load; refused before, now loaded again and charged 396 MiB.
        Duet {
            name: "memory_allocated_outside_the_pool_inside_an_eager_library_load_does_not_refuse_it",
            a: allocating_outside_the_pool(),
            b: Part {
                steps: &["kernel", "wait:a2", "touch:b1", "wait:end"],
                env: &[
                    ("CUDA_MODULE_LOADING", "EAGER"),
                    ("FAKECUDA_LIBRARY_MEM", "396Mi"),
                    ("FAKECUDA_LOAD_HALFWAY", "{dir}/b-half"),
                    ("FAKECUDA_LOAD_UNTIL", "{dir}/a2"),
                    ("GPUCAP_LOG", "info"),
                ],
                says: vec![(
                    "kernel 0".to_string(),
                    "B's 396 MiB library fits the 1 GiB pool whatever A holds outside it",
                )],
                err_has: &["none refused"],
                ..Part::default()
            },
            used_while: Some(("b1", 396 * MIB, "B's 396 MiB library, once")),
            ..Duet::default()
        },
        // A module gpucap unloads gives its memory back inside another member's window,
        // announced first as a free: A's 1,200 MiB module (past the 1 GiB cap) is loaded,
        // and held open until B's 300 MiB module has loaded inside B's window; A's unloads
        // (its first attempt, loaded again, then its refusal) fall inside B's window.
        // Unannounced, B's window saw 900 MiB given back and B's module was charged
        // nothing while the driver held its 300 MiB (its figure 0 or less: nothing to
        // make again either). Announced, B's figure holds them as possibly given back, high
        // and unsure, and B's next attempt measures its own 300 MiB.
        Duet {
            name: "a_module_unloaded_at_its_refusal_is_not_taken_off_another_members_load",
            a: Part {
                steps: &["touch:a0", "module:1200Mi", "touch:a1", "wait:end"],
                env: &[
                    ("FAKECUDA_LOAD_HALFWAY", "{dir}/a-half"),
                    ("FAKECUDA_LOAD_UNTIL", "{dir}/b-half.1"),
                ],
                says: vec![(
                    format!("module {} {OOM}", 1200 * MIB),
                    "a 1,200 MiB module past the 1 GiB cap is refused",
                )],
                err_has: &["gpucap: refused cuModuleLoadData of "],
                ..Part::default()
            },
            b: Part {
                steps: &[
                    "wait:a-half.1",
                    "module:300Mi",
                    "wait:a1",
                    "touch:b1",
                    "wait:end",
                ],
                env: &[
                    ("FAKECUDA_LOAD_HALFWAY", "{dir}/b-half"),
                    ("FAKECUDA_LOAD_UNTIL", "{dir}/a1"),
                ],
                says: vec![(format!("module {} 0", 300 * MIB), "")],
                ..Part::default()
            },
            used_while: Some(("b1", 300 * MIB, "B's 300 MiB module, all of it")),
            ..Duet::default()
        },
    ]
}

/// A of a case where memory allocated outside the pool inflates B's measurement: a
/// process outside the pool (no mark of it) that allocates 700 MiB once B's call made
/// `b-half.1` (its memory taken), then makes `a2`, which B's call waits for.
fn allocating_outside_the_pool() -> Part {
    Part {
        steps: &[
            "touch:a1",
            "wait:b-half.1",
            "alloc:700Mi",
            "touch:a2",
            "wait:end",
        ],
        env_remove: &["GPUCAP_POOL"],
        env: &[("GPUCAP_LIMIT", "8Gi")],
        says: vec![(alloc(700, "0"), "")],
        ..Part::default()
    }
}

/// B of a trim's case: raises its stack to 660 MiB, then lowers it to 264 MiB in a
/// `cuCtxSetLimit` of 1.5 s that gives the memory back halfway (where the fake makes
/// `b-half.2`, which A waits for to trim).
fn lowering_its_stack() -> Part {
    Part {
        steps: &["stack:5", "stack:2", "wait:a2", "touch:b1", "wait:end"],
        env: &[
            ("FAKECUDA_LIMIT_DELAY_MS", "1500"),
            ("FAKECUDA_LIMIT_HALFWAY", "{dir}/b-half"),
        ],
        says: vec![("stack 5 0".to_string(), ""), ("stack 2 0".to_string(), "")],
        ..Part::default()
    }
}

#[test]
fn memory_the_driver_takes_for_one_member_is_charged_beside_the_others() {
    run_table(&two_members(), |c| c.name, duet);
}

// ---- Contexts made at the same moment ----------------------------------------------------

/// `members` members of pool `t` make a 100 MiB context at once, each taking `delay_ms` to
/// make (the fake's `FAKECUDA_CONTEXT_DELAY_MS`: a context takes its memory halfway
/// through, as a real driver takes a while), nobody's figure known yet; `in_pidns`: each
/// as PID 1 of a PID namespace of its own, where NVML's figure for a process is not
/// provably its own, so the first context is measured alone and the others beside each
/// other. Each must be charged its own context, never less, and each context's charge
/// must come back as its member leaves.
struct Rush {
    name: &'static str,
    members: u64,
    delay_ms: u64,
    in_pidns: bool,
}

const RUSHES: &[Rush] = &[
    // The pool's context window serialises the two measurements. Without it, each
    // measurement (device-wide) saw the other member's context too, and the first charge
    // made inside the other's window was taken off it as the pool's traffic: one member
    // charged 200 MiB and the other 0 B (when the first left, the pool counted nothing
    // for a context of 100 MiB still held), or both 200 MiB.
    Rush {
        name: "members_making_contexts_at_once_are_charged_their_own",
        members: 2,
        delay_ms: 2000,
        in_pidns: false,
    },
    // Measured by NVML's figure for each process on the host.
    Rush {
        name: "sixteen_members_making_slow_contexts_at_once_are_each_charged_their_context",
        members: 16,
        delay_ms: 600,
        in_pidns: false,
    },
    Rush {
        name: "sixteen_members_in_pid_namespaces_making_slow_contexts_at_once_are_each_charged_their_context",
        members: 16,
        delay_ms: 600,
        in_pidns: true,
    },
];

fn rush(case: &Rush) {
    if case.in_pidns && !unshare_works() {
        return;
    }
    let holder = if case.in_pidns {
        context_holder_in_pidns
    } else {
        context_holder
    };
    let n = case.members;
    let p = Pool::new(case.name);
    let procs: Vec<Child> = (0..n)
        .map(|i| spawn(&mut holder(&p, &format!("m{i}"), "100Mi", case.delay_ms)))
        .collect();
    for i in 0..n {
        p.wait_file(&format!("m{i}"));
    }
    assert_eq!(
        p.used_peak().0 / MIB,
        n * 100,
        "MiB the pool charged while {n} members held a 100 MiB context each"
    );
    for (i, c) in (1..).zip(procs) {
        p.touch(&format!("m{}-go", i - 1));
        assert_ok(&finish(c));
        assert_eq!(
            p.used_peak().0 / MIB,
            (n - i) * 100,
            "MiB the pool charged once {i} of the {n} members left"
        );
    }
}

#[test]
fn members_making_contexts_at_once_are_each_charged_their_own() {
    run_table(RUSHES, |c| c.name, rush);
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
