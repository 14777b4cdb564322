//! Resizing a live pool (`resize`): members learn the new cap, a raise serves the
//! waiters, a lower takes nothing back, guarantees that no longer fit refuse it.

use std::sync::atomic::{
    AtomicBool,
    Ordering::{Relaxed, SeqCst},
};
use std::time::Duration;

use super::*;
use crate::budget::layout::{G_CAP, G_CAP_GEN, G_USED, encode_cap};
use crate::budget::shares::{Share, check};

fn quiet(_: &WaitNote) {}

/// Reserves `bytes` on GPU 0 for `m`: by the short path first where `short` (the full
/// one if it declines), else by the full path. True if taken.
fn reserve_by(m: &Member<'_>, short: bool, bytes: u64) -> bool {
    if !short {
        return m.reserve(0, bytes).is_ok();
    }
    match m.try_reserve(0, bytes) {
        Some(true) => {
            m.alloc_ended(0, bytes, true);
            true
        }
        _ => m.reserve(0, bytes).is_ok(),
    }
}

fn cap_of(pool: Pool<'static>, k: &'static Kernel) -> Option<u64> {
    pool.view(proc(k, 99)).gpus[0].cap
}

#[test]
fn a_raise_serves_a_waiting_member() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    a.reserve(0, 900).unwrap();
    let b = member(pool, proc(k, 2), Some(1000)).waiting(Duration::from_secs(60), quiet);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.reserve(0, 300));
        while pool.view(proc(k, 99)).gpus[0].waiters == 0 {
            std::thread::yield_now();
        }
        let r = pool.resize(&GPU0, Some(1500), proc(k, 99)).unwrap();
        assert_eq!((r.old, r.new, r.used), (Some(1000), Some(1500), 900));
        waiter.join().unwrap().expect("served by the raise");
    });
    assert_eq!(b.usage(0), Some((1200, Some(1500), 300)));
    // A member that held the old cap: its first reservation since goes the full way
    // and takes the new cap, its short path then holds it too.
    assert_eq!(a.try_reserve(0, 100), None, "a resize since: the full way");
    a.reserve(0, 200).unwrap();
    assert_eq!(a.try_reserve(0, 100), Some(true));
    a.alloc_ended(0, 100, true);
    assert_eq!(a.try_reserve(0, 1), None, "at the new cap");
    assert_eq!(cap_of(pool, k), Some(1500));
    assert!(
        !pool.view(proc(k, 99)).gpus[0].cap_drift,
        "a resize is no drift"
    );
}

#[test]
fn a_lower_refuses_new_growth_and_takes_nothing_back() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    a.reserve(0, 800).unwrap();
    let r = pool.resize(&GPU0, Some(500), proc(k, 99)).unwrap();
    assert_eq!((r.old, r.new, r.used), (Some(1000), Some(500), 800));
    let v = pool.view(proc(k, 99));
    assert_eq!((v.gpus[0].cap, v.gpus[0].cap_drift), (Some(500), false));
    assert_eq!(
        a.try_reserve(0, 1),
        None,
        "the short path refuses past the new cap"
    );
    let e = a.reserve(0, 1).unwrap_err();
    assert_eq!(
        (e.used, e.cap, e.own),
        (800, 500, 800),
        "nothing taken back"
    );
    // A member started later with the old GPUCAP_LIMIT joins, and holds the new cap.
    let b = member(pool, proc(k, 2), Some(1000));
    assert_eq!(b.usage(0), Some((800, Some(500), 0)));
    assert!(b.reserve(0, 1).is_err());
    a.credit(0, 400);
    b.reserve(0, 100).unwrap();
    assert!(b.reserve(0, 1).is_err(), "500 in use: the new cap");
    // A recount does not write the old cap back.
    a.recount(0);
    assert_eq!(cap_of(pool, k), Some(500));
}

#[test]
fn a_guarantee_that_no_longer_fits_refuses_the_resize() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let share = |g| -> Share { check(Some(1000), g, None).unwrap() };
    a.claim(0, share(600)).unwrap();
    let e = pool.resize(&GPU0, Some(500), proc(k, 99)).unwrap_err();
    match &e {
        ResizeRefusal::Guarantees {
            cap,
            guaranteed,
            holders,
        } => {
            assert_eq!((*cap, *guaranteed), (500, 600));
            assert_eq!((holders[0].pid, holders[0].guarantee), (1, 600));
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("pid 1 proc 1 guarantees"), "{e}");
    assert_eq!(cap_of(pool, k), Some(1000), "the cap was not changed");
    a.reserve(0, 1000).unwrap();
    pool.resize(&GPU0, Some(600), proc(k, 99)).unwrap();
    assert_eq!(a.usage(0), Some((1000, Some(600), 1000)));
}

/// A cap lowered below what the pool holds: a request inside a member's own guarantee
/// is refused like any other until the pool's use falls under the new cap, then served
/// up to it, never past it. The guarantee still holds against the others: while it is
/// kept, no other member borrows it.
#[test]
fn a_guarantee_is_served_under_a_lowered_cap_only_once_use_falls_under_it() {
    let (pool, k) = setup();
    let share = |g| -> Share { check(Some(1000), g, None).unwrap() };
    let a = member(pool, proc(k, 1), Some(1000));
    a.claim(0, share(400)).unwrap();
    a.reserve(0, 100).unwrap();
    let b = member(pool, proc(k, 2), Some(1000));
    b.reserve(0, 600).unwrap(); // all but the 300 kept for A
    // 400 guaranteed fit the new cap; 700 in use do not.
    pool.resize(&GPU0, Some(500), proc(k, 99)).unwrap();
    // 100 more for A: inside its guarantee (200 of 400), not under the cap in force.
    assert_eq!(a.try_reserve(0, 100), None, "the short path");
    let e = a.reserve(0, 100).unwrap_err();
    assert_eq!(
        (e.used, e.cap, e.own),
        (700, 500, 100),
        "nothing taken back"
    );
    b.credit(0, 200);
    assert!(a.reserve(0, 1).is_err(), "500 in use: at the new cap");
    b.credit(0, 100);
    a.reserve(0, 100).unwrap();
    assert_eq!(a.usage(0), Some((500, Some(500), 200)));
    assert!(
        a.reserve(0, 1).is_err(),
        "at the cap in force, though inside the guarantee"
    );
    // B gives the rest back: A takes the rest of its guarantee; B may not borrow it.
    b.credit(0, 300);
    assert!(b.reserve(0, 101).is_err(), "A's 200 unused are kept");
    a.reserve(0, 200).unwrap();
    assert_eq!(a.usage(0), Some((400, Some(500), 400)));
    b.reserve(0, 100).unwrap();
    assert!(b.reserve(0, 1).is_err() && a.reserve(0, 1).is_err());
    assert_eq!(pool.w.used(0), 500);
}

/// A member with a guarantee and no ceiling of its own (`shares::check` gives it the
/// cap) follows the cap a resize sets: after a raise it may hold the new cap, and after
/// a lower its share words are not above the cap (nothing for the others to repair).
#[test]
fn a_guaranteed_member_without_a_ceiling_follows_the_cap() {
    let (pool, k) = setup();
    let share = |g| -> Share { check(Some(1000), g, None).unwrap() };
    let a = member(pool, proc(k, 1), Some(1000));
    a.claim(0, share(400)).unwrap();
    pool.resize(&GPU0, Some(2000), proc(k, 99)).unwrap();
    assert_eq!(a.room(0), Some((2000, Some(2000))), "the raised cap");
    a.reserve(0, 1500).unwrap();
    a.credit(0, 1500);
    pool.resize(&GPU0, Some(500), proc(k, 99)).unwrap();
    let v = pool.view(proc(k, 99));
    assert!(!v.gpus[0].share_drift, "share words above the cap");
    assert_eq!(v.members[0].gpus[0].ceiling, None);
    assert_eq!(a.room(0), Some((500, Some(500))));
}

#[test]
fn a_gpu_no_member_used_cannot_be_resized() {
    let (pool, k) = setup();
    let _a = member(pool, proc(k, 1), Some(1000));
    assert_eq!(
        pool.resize(&GPU1, Some(5), proc(k, 99)),
        Err(ResizeRefusal::NoGpu)
    );
}

/// Members reserving and freeing, others joining and leaving with the pool's first
/// cap, while the cap goes down and up: in each low phase the cap word is the low cap,
/// and `used` does not pass the low cap or what was held when it came into force.
///
/// Without another process writing the file, `used` is the bytes admitted and not yet
/// freed: a reservation adds its bytes with its swap, a free takes them off with its
/// add, and a recount changes nothing (it counts the bytes in flight only where `used`
/// says less than the members hold, which only damage makes so: see
/// `an_admission_never_passes_the_cap_in_force_whatever_runs_inside_a_reservation`).
/// Every admission that weighed the old cap swapped `used` before the resize did, and
/// is in the figure the resize returned; every later one weighed the low cap (the two
/// tests below drive each case by hand).
#[test]
fn resizes_racing_joins_and_reservations_keep_used_under_the_cap_in_force() {
    const HIGH: u64 = 1 << 20;
    const LOW: u64 = 1 << 16;
    const CHUNK: u64 = 4096;
    let (pool, k) = setup();
    let first = member(pool, proc(k, 1), Some(HIGH));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for id in 2..6 {
            let stop = &stop;
            s.spawn(move || {
                let m = member(pool, proc(k, id), Some(HIGH));
                let mut held = 0u64;
                while !stop.load(Relaxed) {
                    let taken = match m.try_reserve(0, CHUNK) {
                        Some(true) => {
                            m.alloc_ended(0, CHUNK, true);
                            true
                        }
                        _ => m.reserve(0, CHUNK).is_ok(),
                    };
                    if taken {
                        held += CHUNK;
                    }
                    if !taken || held >= 8 * CHUNK {
                        m.credit(0, held);
                        held = 0;
                    }
                }
                m.credit(0, held);
            });
        }
        for id in 10..12 {
            let stop = &stop;
            s.spawn(move || {
                let mut n = 0;
                while !stop.load(Relaxed) {
                    // Joiners with the first GPUCAP_LIMIT: never refused for it.
                    let m = member(pool, proc(k, id * 1000 + n), Some(HIGH));
                    if m.reserve(0, CHUNK).is_ok() {
                        m.credit(0, CHUNK);
                    }
                    m.leave();
                    n += 1;
                }
            });
        }
        // Stops the others however this thread ends (a failed assertion included).
        struct Stop<'s>(&'s AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stop = Stop(&stop);
        let resizer = proc(k, 99);
        for _ in 0..200 {
            let low = pool.resize(&GPU0, Some(LOW), resizer).unwrap();
            let bound = low.used.max(LOW);
            for _ in 0..200 {
                let g = &pool.view(resizer).gpus[0];
                assert_eq!(g.cap, Some(LOW), "the cap word in a low phase");
                assert!(
                    g.used <= bound,
                    "{} in use past {bound} in a low phase",
                    g.used
                );
            }
            pool.resize(&GPU0, Some(HIGH), resizer).unwrap();
            std::thread::yield_now();
        }
    });
    assert_eq!(first.usage(0), Some((0, Some(HIGH), 0)));
}

/// A reservation's steps driven by hand: its `pending` written and `used` read, then,
/// before its swap, another member's recount (after another process zeroed `used`, so
/// that the recount counts the reservation's bytes in flight) and a resize to a lower
/// cap, in each order. The reservation is admitted exactly when its bytes fit under the
/// lower cap beside what the members hold, and the bytes admitted never pass it: a
/// recount that counted them in flight makes `used` err high (the reservation's swap
/// fails, and it decides again on the recounted word), never low.
#[test]
fn an_admission_never_passes_the_cap_in_force_whatever_runs_inside_a_reservation() {
    use crate::budget::used::between_reads;
    #[derive(Debug, Clone, Copy)]
    enum Step {
        Recount,
        Resize,
    }
    const HIGH: u64 = 1000;
    const LOW: u64 = 400;
    let orders: [&[Step]; 4] = [
        &[Step::Recount, Step::Resize],
        &[Step::Resize, Step::Recount],
        &[Step::Resize],
        &[Step::Recount],
    ];
    for order in orders {
        for held in [100u64, 150, 300] {
            for short in [false, true] {
                let (pool, k) = setup();
                let a = member(pool, proc(k, 1), Some(HIGH));
                a.reserve(0, held).unwrap();
                let b = member(pool, proc(k, 2), Some(HIGH));
                let c = leak(member(pool, proc(k, 3), Some(HIGH)));
                let steps = order.to_vec();
                between_reads::queue(move || {
                    for step in steps {
                        match step {
                            Step::Recount => {
                                c.pool().w.gpu(0, G_USED).store(0, SeqCst);
                                c.recount(0);
                            }
                            Step::Resize => {
                                c.pool().resize(&GPU0, Some(LOW), proc(k, 99)).unwrap();
                            }
                        }
                    }
                });
                let taken = reserve_by(&b, short, 250);
                let case = format!("{order:?}, A holding {held}, short path {short}");
                assert_eq!(between_reads::clear(), 0, "{case}: the steps ran");
                let resized = order.iter().any(|s| matches!(s, Step::Resize));
                let cap = if resized { LOW } else { HIGH };
                assert_eq!(taken, held + 250 <= cap, "{case}");
                let admitted = a.usage(0).unwrap().2 + b.usage(0).unwrap().2;
                assert!(admitted <= cap, "{case}: {admitted} admitted under {cap}");
                assert!(pool.w.used(0) >= admitted, "{case}: used never below");
            }
        }
    }
}

/// A resizer between its two steps (the cap word written, the live members' own cap
/// words not yet): a member joining then with the old GPUCAP_LIMIT reads the new cap
/// word, finds no live member holding it yet, and must not write its own cap over it:
/// the resize would end with the old cap in force.
#[test]
fn a_joiner_never_writes_its_cap_over_a_resize_under_way() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    pool.resize(&GPU0, Some(1000), proc(k, 99)).unwrap();
    // The resizer's first step, by hand, once the joiner read the pool's cap: its turn
    // taken, the cap word written.
    let generation = pool.w.gpu(0, G_CAP_GEN);
    let odd = generation.load(SeqCst) + 1;
    crate::budget::used::between_reads::queue(move || {
        pool.w.gpu(0, G_CAP_GEN).store(odd, SeqCst);
        pool.w.gpu(0, G_CAP).store(encode_cap(Some(500)), SeqCst);
    });
    let b = member(pool, proc(k, 2), Some(1000));
    assert_eq!(
        crate::budget::used::between_reads::clear(),
        0,
        "the step ran"
    );
    assert_eq!(
        cap_of(pool, k),
        Some(500),
        "the joiner wrote its cap over the resize's"
    );
    // The resizer ends its turn: every member holds the new cap.
    generation.store(odd + 1, SeqCst);
    a.reserve(0, 500).unwrap();
    assert!(b.reserve(0, 1).is_err(), "the new cap");
    assert_eq!(b.usage(0).unwrap().1, Some(500));
}

/// The same, the joiner having read the pool's cap while the resize was under way (its
/// turn taken, the cap word not yet written): it must wait for the resize, not write
/// the cap it read over the new one.
#[test]
fn a_joiner_that_read_the_cap_during_a_resize_never_writes_it_back() {
    use crate::budget::used::between_reads;
    let (pool, k) = setup();
    let _a = member(pool, proc(k, 1), Some(1000));
    pool.resize(&GPU0, Some(1000), proc(k, 99)).unwrap();
    let generation = pool.w.gpu(0, G_CAP_GEN);
    let odd = generation.load(SeqCst) + 1;
    generation.store(odd, SeqCst); // the resizer's turn
    // Once the joiner read the old cap: the resizer writes the new cap word; at the
    // joiner's next look, it ends its turn.
    between_reads::queue(move || pool.w.gpu(0, G_CAP).store(encode_cap(Some(500)), SeqCst));
    between_reads::queue(move || pool.w.gpu(0, G_CAP_GEN).store(odd + 1, SeqCst));
    let b = member(pool, proc(k, 2), Some(1000));
    between_reads::clear();
    assert_eq!(
        cap_of(pool, k),
        Some(500),
        "the joiner wrote the cap it read over the resize's"
    );
    assert_eq!(b.usage(0).unwrap().1, Some(500));
}

#[test]
fn concurrent_resizes_leave_one_cap_every_member_holds() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    std::thread::scope(|s| {
        for cap in [2000, 3000] {
            s.spawn(move || {
                for _ in 0..500 {
                    pool.resize(&GPU0, Some(cap), proc(k, 99)).unwrap();
                }
            });
        }
    });
    let cap = cap_of(pool, k).unwrap();
    assert!(cap == 2000 || cap == 3000);
    a.reserve(0, 1).unwrap();
    assert_eq!(a.usage(0), Some((1, Some(cap), 1)));
    let b = member(pool, proc(k, 2), Some(1000));
    assert_eq!(b.usage(0).unwrap().1, Some(cap));
}

/// A reservation that weighed the old cap and swaps `used` once a lower one is in force
/// (a thread preempted between its rule and its swap while a resize ran): its swap
/// fails, and it decides again under the new cap. The resizer is held once its cap is
/// in force (before the members' cap words and the waiters), the reservation swapping
/// meanwhile; by the full path and by the short path.
#[test]
fn a_reservation_that_weighed_the_old_cap_never_swaps_once_a_lower_one_is_in_force() {
    use crate::budget::used::between_reads;
    use std::sync::mpsc;
    const HIGH: u64 = 1000;
    const LOW: u64 = 400;
    const WAIT: Duration = Duration::from_secs(30);
    for short in [false, true] {
        let (pool, k) = setup();
        let a = member(pool, proc(k, 1), Some(HIGH));
        a.reserve(0, 300).unwrap();
        let b = member(pool, proc(k, 2), Some(HIGH));
        let (in_force_tx, in_force_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (resizer_tx, resizer_rx) = mpsc::channel();
        between_reads::queue_before_swap(move || {
            let resizer = std::thread::spawn(move || {
                between_reads::queue_in_force(move || {
                    in_force_tx.send(()).unwrap();
                    go_rx
                        .recv_timeout(WAIT)
                        .expect("the test lets the resizer go on");
                });
                pool.resize(&GPU0, Some(LOW), proc(k, 99))
            });
            in_force_rx
                .recv_timeout(WAIT)
                .expect("the resize put its cap in force");
            resizer_tx.send(resizer).unwrap();
        });
        let taken = reserve_by(&b, short, 200);
        go_tx.send(()).unwrap();
        let resized = resizer_rx
            .recv_timeout(WAIT)
            .expect("the step ran")
            .join()
            .unwrap()
            .unwrap();
        let case = format!("short path {short}");
        assert_eq!(between_reads::clear(), 0, "{case}: the steps ran");
        assert_eq!(resized.new, Some(LOW), "{case}");
        assert!(
            !taken,
            "{case}: 200 admitted beside 300 under a cap of {LOW} in force"
        );
        assert_eq!(pool.w.used(0), 300, "{case}");
        assert_eq!(b.usage(0).unwrap().2, 0, "{case}");
    }
}

/// While a resize is under way (its turn taken, the lower cap word written, the
/// generation odd), a reservation weighs the lower of the two caps: its swap may land
/// once the lower cap is in force (here: the resizer ends its turn between the rule
/// and the swap).
#[test]
fn a_reservation_during_a_resize_weighs_the_lower_cap() {
    use crate::budget::used::between_reads;
    for short in [false, true] {
        let (pool, k) = setup();
        let a = member(pool, proc(k, 1), Some(1000));
        a.reserve(0, 300).unwrap();
        let b = member(pool, proc(k, 2), Some(1000));
        let generation = pool.w.gpu(0, G_CAP_GEN);
        let odd = generation.load(SeqCst) + 1;
        generation.store(odd, SeqCst);
        pool.w.gpu(0, G_CAP).store(encode_cap(Some(400)), SeqCst);
        between_reads::queue_before_swap(move || pool.w.gpu(0, G_CAP_GEN).store(odd + 1, SeqCst));
        let taken = reserve_by(&b, short, 200);
        between_reads::clear();
        assert!(
            !taken,
            "short path {short}: 200 admitted beside 300 under 400"
        );
        assert_eq!(pool.w.used(0), 300);
        // Served under the lower cap as it fits.
        generation.store(odd + 1, SeqCst);
        b.reserve(0, 100).unwrap();
        assert_eq!(b.usage(0).unwrap().1, Some(400));
    }
}
