//! A change made between a reservation's read of `used` and its reads of the members'
//! own words (`used::between_reads` puts it there, where a preempted thread or a
//! contended cache line puts it at random): the reservation decides again, and is never
//! refused while the cap has room; a refusal names the figures it was decided on.

use proptest::prelude::*;

use super::*;
use crate::budget::layout::{M_PENDING, M_USED};
use crate::budget::shares::{Share, check};
use crate::budget::used::between_reads;

const MIB: u64 = 1 << 20;

fn share(cap: u64, guarantee: u64) -> Share {
    check(Some(cap), guarantee, None).unwrap()
}

/// A reservation the shim's way: the short path, then the full one where it says so.
fn take(m: &Member<'_>, bytes: u64) -> bool {
    match m.try_reserve(0, bytes) {
        Some(_) => true,
        None => m.reserve(0, bytes).is_ok(),
    }
}

/// Member `m`'s own use on GPU entry 0, and its bytes in flight.
fn own(pool: Pool<'static>, m: &Member<'_>) -> (u64, u64) {
    let w = |i| pool.w.member_gpu(m.slot(), 0, i).load(SeqCst);
    (w(M_USED), w(M_PENDING))
}

#[test]
fn another_threads_allocation_between_the_reads_is_no_refusal() {
    // The pair loop's state: a context of 256 MiB held, the other thread's block just
    // freed; far below a 150 GiB cap.
    let (pool, k) = setup();
    let cap = 150 << 30;
    let a = leak(member(pool, proc(k, 1), Some(cap)));
    a.charge_past_cap(0, 256 * MIB);
    // The other thread takes its next block between this thread's read of `used` (no
    // block in it) and of its own use (the block in it): on the short path's try, then
    // again on the full path's.
    for _ in 0..2 {
        between_reads::queue(move || a.reserve(0, MIB).unwrap());
    }
    let taken = take(a, MIB);
    assert_eq!(between_reads::clear(), 0, "both tries met the other thread");
    assert!(
        taken,
        "refused 1 MiB with {} MiB of {} MiB in use",
        pool.w.used(0) / MIB,
        cap / MIB
    );
    assert_eq!(pool.w.used(0), 259 * MIB);
    assert_eq!(own(pool, a), (259 * MIB, 0));
}

#[test]
fn a_guarantee_holders_free_between_the_reads_is_no_refusal() {
    // Cap 1000: A holds all of its 500 guarantee, B 400; B's 100 more fit exactly.
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(1000)));
    a.claim(0, share(1000, 500)).unwrap();
    a.reserve(0, 500).unwrap();
    let b = member(pool, proc(k, 2), Some(1000));
    b.reserve(0, 400).unwrap();
    // A frees 100 between B's read of `used` (900: A's 100 in it) and of A's own use
    // (400: 100 of its guarantee unused): the figures count the 100 twice.
    between_reads::queue(move || a.credit(0, 100));
    let taken = b.reserve(0, 100);
    assert_eq!(between_reads::clear(), 0);
    assert!(taken.is_ok(), "refused with room: {taken:?}");
    assert_eq!(pool.w.used(0), 900);
    // A refusal on figures that did not move stands: A's 100 are kept for it.
    assert!(b.reserve(0, 1).is_err());
}

#[test]
fn a_refusal_names_the_use_it_was_refused_on() {
    // B holds 900 of 1000: A's 200 are refused. B frees its 900 after A's refusal was
    // decided: the refusal still says 900 in use (it said 0: "200 B refused, the pool
    // uses 0 B of 1000 B", a line that explains nothing).
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = leak(member(pool, proc(k, 2), Some(1000)));
    b.reserve(0, 900).unwrap();
    between_reads::queue_refused(move || b.credit(0, 900));
    let e = a.reserve(0, 200).unwrap_err();
    assert_eq!(between_reads::clear(), 0, "the step ran");
    assert_eq!((e.requested, e.used, e.cap), (200, 900, 1000), "{e:?}");
    assert_eq!(pool.w.used(0), 0);
}

/// A change of one member's use, made between the reads.
#[derive(Debug, Clone, Copy)]
struct Change {
    /// 0: the reserving member's other thread, 1: a member with a guarantee, 2: one
    /// without.
    who: usize,
    take: bool,
    bytes: u64,
}

fn change() -> impl Strategy<Value = Change> {
    (0usize..3, any::<bool>(), 1u64..=64).prop_map(|(who, take, bytes)| Change { who, take, bytes })
}

/// One reservation of `bytes` by the member, the short path first (or the full path
/// alone, as `cuMemAllocManaged` takes), with `steps` queued between its reads.
#[derive(Debug, Clone)]
struct Request {
    bytes: u64,
    short: bool,
    steps: Vec<Vec<Change>>,
}

fn request() -> impl Strategy<Value = Request> {
    (
        1u64..=64,
        any::<bool>(),
        proptest::collection::vec(proptest::collection::vec(change(), 0..6), 0..4),
    )
        .prop_map(|(bytes, short, steps)| Request {
            bytes,
            short,
            steps,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the changes between a reservation's reads, a request the cap has room
    /// for (every member's use stays far below it) is taken, and `used` is what the
    /// members hold.
    #[test]
    fn changes_between_the_reads_never_refuse_below_the_cap(
        requests in proptest::collection::vec(request(), 1..6),
    ) {
        const CAP: u64 = 100_000;
        let (pool, k) = setup();
        let a = leak(member(pool, proc(k, 1), Some(CAP)));
        let g = leak(member(pool, proc(k, 2), Some(CAP)));
        g.claim(0, share(CAP, 1000)).unwrap();
        let c = leak(member(pool, proc(k, 3), Some(CAP)));
        a.charge_past_cap(0, 2560);
        let members = [a, g, c];
        for r in requests {
            for step in r.steps {
                between_reads::queue(move || {
                    for ch in step {
                        let m = members[ch.who];
                        if ch.take {
                            m.reserve(0, ch.bytes).unwrap();
                        } else {
                            m.credit(0, ch.bytes);
                        }
                    }
                });
            }
            let taken = if r.short { take(a, r.bytes) } else { a.reserve(0, r.bytes).is_ok() };
            between_reads::clear();
            prop_assert!(taken, "refused {} with {} of {} in use", r.bytes, pool.w.used(0), CAP);
        }
        let held: u64 = members.iter().map(|m| own(pool, m).0).sum();
        prop_assert_eq!(pool.w.used(0), held);
        for m in members {
            prop_assert_eq!(own(pool, m).1, 0, "bytes left in flight");
        }
    }
}
