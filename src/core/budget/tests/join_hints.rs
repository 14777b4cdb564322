//! Joining by the pool's hints (`join`): a joiner tries O(1) slots on average, slots
//! emptied by leaves and deaths are taken again, a full pool still says so, and no
//! forged hint makes a joiner take a live member's slot or pass a free one by for good.

use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};

use super::*;
use crate::budget::layout::{
    H_JOIN_CURSOR, H_JOIN_FREED, H_JOIN_NEXT, H_JOIN_SWEPT_MS, S_PID, STATE_LIVE, word_pid,
};

fn pool_of(slots: usize) -> (Pool<'static>, &'static Kernel) {
    let v: Vec<AtomicU64> = (0..pool_words(slots)).map(|_| AtomicU64::new(0)).collect();
    let w = Box::leak(v.into_boxed_slice());
    Pool::create_with(w, slots, 1, 1000).unwrap();
    (Pool::open(w).unwrap(), Kernel::new())
}

/// A process whose kernel lock calls are counted.
struct Counted {
    p: &'static Proc,
    tries: &'static AtomicUsize,
}

impl MemberLocks for Counted {
    fn try_take(&self, s: usize) -> bool {
        self.tries.fetch_add(1, Relaxed);
        self.p.try_take(s)
    }
    fn give_back(&self, s: usize) {
        self.p.give_back(s)
    }
    fn held(&self, s: usize) -> bool {
        self.tries.fetch_add(1, Relaxed);
        self.p.held(s)
    }
}

fn joined(pool: Pool<'static>, k: &'static Kernel, id: u32) -> Box<Member<'static>> {
    let info = MemberInfo {
        pid: id,
        ..Default::default()
    };
    Member::join(pool, proc(k, id), &info).unwrap()
}

#[test]
fn four_thousand_members_join_in_lock_calls_that_grow_with_their_count_not_its_square() {
    const N: usize = MAX_SLOTS;
    let (pool, k) = pool_of(N);
    let tries: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
    let members: Vec<Box<Member<'static>>> = (0..N)
        .map(|i| {
            let locks = Box::leak(Box::new(Counted {
                p: proc(k, i as u32 + 1),
                tries,
            }));
            Member::join(pool, locks, &MemberInfo::default()).unwrap()
        })
        .collect();
    let mut slots: Vec<usize> = members.iter().map(|m| m.slot()).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), N, "every member in a slot of its own");
    // Trying every slot from the first, then sweeping every live one, made ~N² calls
    // (16.8 million); a sweep of a large pool runs about once a second, so even a slow
    // run stays far below N²/16.
    let calls = tries.load(Relaxed);
    assert!(calls < N * N / 16, "{calls} lock calls for {N} joins");
    assert!(
        Member::join(pool, proc(k, 100_000), &MemberInfo::default()).is_err(),
        "a full pool says so"
    );
}

#[test]
fn joins_after_leaves_and_deaths_take_the_emptied_slots() {
    let (pool, k) = pool_of(300);
    let mut members: Vec<(u32, Box<Member<'static>>)> =
        (1..=100).map(|id| (id, joined(pool, k, id))).collect();
    let mut next_id = 1000;
    // Round after round, some leave and some die; as many join again. The pool's
    // members never spread past the slots they need (plus those that died since the
    // last sweep, taken back by the next).
    for round in 0..30 {
        for _ in 0..5 {
            let (_, m) = members.remove((round * 7) % members.len());
            m.leave();
        }
        for _ in 0..5 {
            let (id, _) = members.remove((round * 11) % members.len());
            k.kill(id);
        }
        // A sweep (as a refusal would make) takes the dead back; joiners find the
        // slots emptied by both.
        members[0].1.sweep();
        for _ in 0..10 {
            next_id += 1;
            members.push((next_id, joined(pool, k, next_id)));
        }
        let highest = members.iter().map(|(_, m)| m.slot()).max().unwrap();
        assert!(highest < 100, "round {round}: a member in slot {highest}");
    }
    // Without a sweep: a death in a small pool is seen by the next joiner, which takes
    // the dead member's slot.
    let (pool, k) = pool_of(8);
    let a = joined(pool, k, 1);
    let _b = joined(pool, k, 2);
    let slot = a.slot();
    k.kill(1);
    assert_eq!(joined(pool, k, 3).slot(), slot);
}

#[test]
fn a_full_pool_says_full_whatever_its_hints_say() {
    let (pool, k) = pool_of(8);
    let _ms: Vec<Box<Member<'static>>> = (1..=8).map(|id| joined(pool, k, id)).collect();
    for (next, freed, cursor) in [
        (0, 5, 0),
        (8, 0, 3),
        (u64::MAX, u64::MAX, u64::MAX),
        (3, 1, 7),
    ] {
        pool.w.header(H_JOIN_NEXT).store(next, SeqCst);
        pool.w.header(H_JOIN_FREED).store(freed, SeqCst);
        pool.w.header(H_JOIN_CURSOR).store(cursor, SeqCst);
        assert!(matches!(
            Member::join(pool, proc(k, 99), &MemberInfo::default()),
            Err(JoinError::Full { slots: 8, .. })
        ));
    }
}

#[test]
fn forged_hints_never_take_a_live_slot_nor_pass_a_free_one_by() {
    for free in 0..8 {
        for (next, freed, cursor) in [
            (0, 0, 0),
            (8, 0, 0),
            (1 << 40, 1 << 40, 5),
            (u64::MAX, 3, u64::MAX),
            (free as u64 + 1, 0, free as u64),
        ] {
            let (pool, k) = pool_of(8);
            let ms: Vec<Box<Member<'static>>> = (1..=8).map(|id| joined(pool, k, id)).collect();
            let s = ms[free].slot();
            ms[free].leave();
            pool.w.header(H_JOIN_NEXT).store(next, SeqCst);
            pool.w.header(H_JOIN_FREED).store(freed, SeqCst);
            pool.w.header(H_JOIN_CURSOR).store(cursor, SeqCst);
            let m = joined(pool, k, 99);
            assert_eq!(m.slot(), s, "hints {next} {freed} {cursor}");
            // The others are untouched: each still holds its own live slot.
            for (i, o) in ms.iter().enumerate().filter(|&(i, _)| i != free) {
                let pid = word_pid(pool.w.slot(o.slot(), S_PID).load(SeqCst));
                assert_eq!(pid, i as u32 + 1, "member {i}");
                assert_eq!(pool.w.state(o.slot()).load(SeqCst), STATE_LIVE);
            }
        }
    }
}

#[test]
fn a_large_pool_still_sweeps_at_join_though_its_sweep_word_says_the_future() {
    let (pool, k) = pool_of(300);
    let ms: Vec<Box<Member<'static>>> = (1..=100).map(|id| joined(pool, k, id)).collect();
    ms[10].register_gpu(0, &GPU0, Some(1000)).unwrap();
    ms[10].reserve(0, 700).unwrap();
    k.kill(11);
    pool.w.header(H_JOIN_SWEPT_MS).store(u64::MAX - 5, SeqCst);
    let m = member(pool, proc(k, 500), Some(1000));
    assert_eq!(
        m.usage(0),
        Some((0, Some(1000), 0)),
        "the dead member's 700 are back"
    );
}
