//! Guarantees and ceilings (`shares`, `share_words`) in the pool's protocol, with
//! processes played by lock owners as in the parent module.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use super::*;
use crate::budget::shares::{Admission, Share, check};

const CAP: u64 = 1000;

fn share(guarantee: u64, ceiling: Option<u64>) -> Share {
    check(Some(CAP), guarantee, ceiling).unwrap()
}

#[test]
fn a_guarantee_holds_when_a_neighbour_tries_to_take_everything_first() {
    let (pool, k) = setup();
    let notebook = member(pool, proc(k, 1), Some(CAP));
    notebook.claim(0, share(400, None)).unwrap();
    let trainer = member(pool, proc(k, 2), Some(CAP));
    // The trainer asks for everything, then for as much as it can get.
    let r = trainer.reserve(0, CAP).unwrap_err();
    assert_eq!((r.used, r.cap, r.ceiling), (0, CAP, None));
    trainer.reserve(0, 600).unwrap();
    assert!(trainer.reserve(0, 1).is_err(), "the 400 kept are not lent");
    // The notebook gets its guarantee, in pieces.
    notebook.reserve(0, 250).unwrap();
    notebook.reserve(0, 150).unwrap();
    assert_eq!(notebook.usage(0), Some((CAP, Some(CAP), 400)));
    // What each sees as free: nothing left for anyone.
    assert_eq!(notebook.room(0), Some((0, Some(CAP))));
    assert_eq!(trainer.room(0), Some((0, Some(CAP))));
}

#[test]
fn unused_guarantees_are_kept_and_borrowed_bytes_return_as_the_borrower_frees() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(300, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    // A uses 100 of its 300: 200 are still kept for it; B borrows the rest.
    a.reserve(0, 100).unwrap();
    assert_eq!(b.room(0), Some((700, Some(CAP))));
    b.reserve(0, 700).unwrap();
    // A goes past its guarantee: it borrows too, from what is left (nothing).
    assert_eq!(a.room(0), Some((200, Some(CAP))));
    assert!(a.reserve(0, 201).is_err());
    a.reserve(0, 200).unwrap();
    let v = pool.view(proc(k, 99));
    let held = |pid: u32| {
        let m = v.members.iter().find(|m| m.pid == pid).unwrap();
        (m.gpus[0].used, m.gpus[0].guarantee, m.gpus[0].borrowed)
    };
    assert_eq!(held(1), (300, 300, 0));
    assert_eq!(held(2), (700, 0, 700));
    assert_eq!(v.gpus[0].guaranteed, 300);
    // B frees 250: A may borrow them now.
    b.credit(0, 250);
    assert_eq!(a.room(0), Some((250, Some(CAP))));
    a.reserve(0, 250).unwrap();
    let v = pool.view(proc(k, 99));
    let m1 = v.members.iter().find(|m| m.pid == 1).unwrap();
    assert_eq!((m1.gpus[0].used, m1.gpus[0].borrowed), (550, 250));
    // A frees below its guarantee again: those bytes are kept for A, not lent to B.
    a.credit(0, 450);
    assert_eq!(b.room(0), Some((CAP - 100 - 450 - 200, Some(CAP))));
}

#[test]
fn a_ceiling_refuses_past_it_with_its_own_refusal() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(0, Some(300))).unwrap();
    assert_eq!(a.room(0), Some((300, Some(300))), "total is the ceiling");
    a.reserve(0, 200).unwrap();
    let r = a.reserve(0, 101).unwrap_err();
    assert_eq!((r.ceiling, r.own, r.requested), (Some(300), 200, 101));
    a.reserve(0, 100).unwrap();
    // The pool still has room: another member is not held to A's ceiling.
    let b = member(pool, proc(k, 2), Some(CAP));
    b.reserve(0, 700).unwrap();
    assert_eq!(b.usage(0), Some((CAP, Some(CAP), 700)));
}

#[test]
fn admission_refuses_a_guarantee_that_does_not_fit_and_names_who_holds_them() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(600, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    let e = b.claim(0, share(500, None)).unwrap_err();
    assert_eq!(
        e.why,
        Admission::Promised {
            given: 600,
            cap: CAP
        }
    );
    assert_eq!(e.holders.len(), 1);
    assert_eq!((e.holders[0].pid, e.holders[0].guarantee), (1, 600));
    let line = e.to_string();
    assert!(line.contains("proc 1") && line.contains("600 B"), "{line}");
    b.claim(0, share(400, None)).unwrap();
    // Guarantees fit, but a member without one borrowed the memory: not free now.
    let (pool, k) = setup();
    let c = member(pool, proc(k, 3), Some(CAP));
    c.reserve(0, 800).unwrap();
    let d = member(pool, proc(k, 4), Some(CAP));
    let e = d.claim(0, share(300, None)).unwrap_err();
    assert!(
        matches!(e.why, Admission::Borrowed { used: 800, .. }),
        "{e:?}"
    );
    c.credit(0, 100);
    d.claim(0, share(300, None)).unwrap();
}

#[test]
fn a_refused_guarantee_waits_for_a_member_to_leave_with_gpucap_wait() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(700, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP)).waiting(Duration::from_secs(10), quiet);
    let leaver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        a.leave();
    });
    b.claim(0, share(500, None)).unwrap();
    leaver.join().unwrap();
    // Without a member leaving, the wait ends with the refusal and how long it waited.
    let c = member(pool, proc(k, 3), Some(CAP)).waiting(Duration::from_millis(150), quiet);
    let e = c.claim(0, share(600, None)).unwrap_err();
    assert!(e.waited >= Duration::from_millis(150), "{e:?}");
    assert!(e.to_string().contains("after waiting"), "{e}");
}

#[test]
fn a_killed_members_guarantee_comes_back_with_its_bytes() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(600, None)).unwrap();
    a.reserve(0, 100).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    assert_eq!(b.room(0), Some((400, Some(CAP))));
    k.kill(1);
    // The next claim that needs it takes the dead member's share back.
    b.claim(0, share(900, None)).unwrap();
    assert_eq!(b.usage(0), Some((0, Some(CAP), 0)));
    let v = pool.view(proc(k, 99));
    assert_eq!(v.gpus[0].guaranteed, 900);
    assert_eq!(v.members.len(), 1);
    // And a reservation that needs a dead member's guarantee takes it back too.
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(600, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    k.kill(1);
    b.reserve(0, CAP).unwrap();
}

/// Members in threads with random guarantees and ceilings reserve and free at random:
/// the pool never holds more than its cap (its `used`, read after every reservation),
/// a reservation inside a member's guarantee
/// is never refused, and no member passes its ceiling.
#[test]
fn random_guarantees_never_over_commit_and_are_never_broken() {
    const MEMBERS: u32 = 6;
    const CAP: u64 = 10_000;
    let (pool, k) = setup();
    let all_claimed: &'static std::sync::Barrier =
        Box::leak(Box::new(std::sync::Barrier::new(MEMBERS as usize)));
    let max_seen: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    let threads: Vec<_> = (0..MEMBERS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (u64::from(i + 1) * 0x1234_5678);
                let mut rand = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                let m = member(pool, proc(k, i + 1), Some(CAP));
                // Guarantees of up to a sixth each: their sum fits, and they are all
                // claimed before anyone allocates.
                let guarantee = rand(CAP / u64::from(MEMBERS));
                let ceiling = guarantee + rand(CAP - guarantee) + 1;
                m.claim(0, check(Some(CAP), guarantee, Some(ceiling)).unwrap())
                    .unwrap();
                all_claimed.wait();
                let mut held = 0u64;
                for _ in 0..3000 {
                    if rand(3) > 0 {
                        // A third of the requests inside what is left of the guarantee.
                        let bytes = if held < guarantee && rand(3) == 0 {
                            1 + rand(guarantee - held)
                        } else {
                            1 + rand(CAP / 4)
                        };
                        match m.reserve(0, bytes) {
                            Ok(()) => {
                                held += bytes;
                                max_seen.fetch_max(m.usage(0).unwrap().0, SeqCst);
                            }
                            Err(r) => {
                                assert!(
                                    held + bytes > guarantee,
                                    "member {i}: {bytes} refused holding {held} of a \
                                     {guarantee} guarantee: {r:?}"
                                );
                            }
                        }
                        assert!(held <= ceiling, "member {i} past its ceiling");
                    } else if held > 0 {
                        let bytes = 1 + rand(held);
                        m.credit(0, bytes);
                        held -= bytes;
                    }
                }
                m.credit(0, held);
                m.leave();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(max_seen.load(SeqCst) <= CAP, "{}", max_seen.load(SeqCst));
    assert!(max_seen.load(SeqCst) > CAP / 2, "the members competed");
    let v = pool.view(proc(k, 99));
    assert_eq!((v.gpus[0].used, v.gpus[0].guaranteed), (0, 0));
}

/// The same rules with the members' steps interleaved at random by one thread (every
/// order is reached, not only those the scheduler happens to make): a reservation
/// inside a member's guarantee is never refused, whatever the others took before.
#[test]
fn interleaved_members_never_break_a_guarantee() {
    const CAP: u64 = 10_000;
    let (pool, k) = setup();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut members: Vec<(Box<Member<'static>>, u64, u64, u64)> = Vec::new();
    for i in 0..6u32 {
        let m = member(pool, proc(k, i + 1), Some(CAP));
        let guarantee = rand(CAP / 6);
        let ceiling = guarantee + rand(CAP - guarantee) + 1;
        m.claim(0, check(Some(CAP), guarantee, Some(ceiling)).unwrap())
            .unwrap();
        members.push((m, guarantee, ceiling, 0));
    }
    let (mut kept, mut inside) = (0, 0);
    for _ in 0..20_000 {
        let i = rand(6) as usize;
        let (m, guarantee, ceiling, held) = &mut members[i];
        if rand(3) > 0 {
            let within = *held < *guarantee && rand(3) == 0;
            let bytes = if within {
                1 + rand(*guarantee - *held)
            } else {
                1 + rand(CAP / 4)
            };
            let free = m.room(0).unwrap().0;
            match m.reserve(0, bytes) {
                Ok(()) => {
                    *held += bytes;
                    assert!(bytes <= free, "took {bytes} with {free} free");
                    inside += u64::from(within);
                }
                Err(r) => {
                    assert!(
                        !within,
                        "member {i}: {bytes} refused inside its guarantee: {r:?}"
                    );
                    assert!(bytes > free, "refused {bytes} with {free} free");
                    kept += 1;
                }
            }
            assert!(*held <= *ceiling);
            assert!(m.usage(0).unwrap().0 <= CAP);
        } else if *held > 0 {
            let bytes = 1 + rand(*held);
            m.credit(0, bytes);
            *held -= bytes;
        }
    }
    assert!(
        kept > 100 && inside > 100,
        "the test was not tight: {kept} refusals, {inside} inside"
    );
}

/// A request inside a member's guarantee is served while a guaranteed neighbour is
/// stopped inside a credit (its own use taken down, the pool's `used` not yet): the
/// neighbour then shows more unused guarantee than it has, which must not refuse it.
#[test]
fn a_guarantee_holds_beside_a_neighbour_stopped_inside_a_credit() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(400, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    b.claim(0, share(400, None)).unwrap();
    let c = member(pool, proc(k, 3), Some(CAP));
    a.reserve(0, 400).unwrap();
    c.reserve(0, 100).unwrap();
    // A frees 300 and stops after taking its own use down, before it swaps `used`.
    play(pool, &a, false, 300, 0..2);
    // B's 400 fit before A's credit (500 used, nothing else kept) and after it.
    b.reserve(0, 400).unwrap();
    assert_eq!(pool.w.used(0), 900);
    // Past its guarantee B borrows only what the others' guarantees leave: A's credit
    // is still in flight, so its 300 are kept for it.
    assert!(b.reserve(0, 1).is_err());
    play(pool, &a, false, 300, 2..4);
    assert_eq!(pool.w.used(0), 600);
    // Now A's unused 300 are exact: B borrows the 100 left, not one byte more.
    assert!(b.reserve(0, 101).is_err());
    b.reserve(0, 100).unwrap();
}

/// Two threads of one member cannot both take the rest of its guarantee unchecked: with
/// one thread stopped inside a reservation (`used` swapped, its own use not raised yet),
/// the other's request past the guarantee weighs the others' unused guarantees.
#[test]
fn a_member_s_change_in_flight_counts_against_its_own_guarantee() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(500, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    b.claim(0, share(400, None)).unwrap();
    // One of A's threads reserves 400 (inside its 500) and stops after the swap.
    play(pool, &a, true, 400, 0..2);
    assert_eq!(pool.w.used(0), 400);
    // Another asks for 400 more: 800 is past A's guarantee, and B's 400 are kept.
    assert!(a.reserve(0, 400).is_err());
    b.reserve(0, 400).unwrap();
    play(pool, &a, true, 400, 2..4);
    assert_eq!(a.usage(0), Some((800, Some(CAP), 400)));
}
