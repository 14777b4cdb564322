//! Impossible guarantee and ceiling words (a holder bit of an empty slot, a guarantee
//! above the cap, live guarantees that sum above it, a ceiling above it): the next
//! joiner or refusal repairs them with a note, a member inside its own guarantee is
//! served, the pool never holds more than its cap and the view never shows more.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use proptest::prelude::*;

use super::*;
use crate::budget::layout::{M_USED, SH_CEILING, SH_GUARANTEE, USED_BYTES};
use crate::budget::shares::{Share, check};

const CAP: u64 = 1000;

fn share(guarantee: u64, ceiling: Option<u64>) -> Share {
    check(Some(CAP), guarantee, ceiling).unwrap()
}

/// Whether `r` repaired a guarantee, a ceiling or a holder bit (by its line).
fn is_share_repair(r: &Repair) -> bool {
    let line = r.to_string();
    line.contains("guarantee") || line.contains("ceiling")
}

static EMPTY_SLOT_REPAIRS: AtomicU64 = AtomicU64::new(0);
fn count_empty_slot_repairs(r: &Repair) {
    if is_share_repair(r) {
        EMPTY_SLOT_REPAIRS.fetch_add(1, SeqCst);
    }
}

/// Claims a guarantee as a member does at `cuInit`, within 10 s.
fn claim_within_10s(m: &'static Member<'static>, s: Share) -> Result<Claimed, ClaimRefusal> {
    within_10s("claiming a guarantee", move || m.claim(0, s))
}

fn reserve_within_10s(m: &'static Member<'static>, bytes: u64) -> Result<(), PoolRefusal> {
    within_10s("reserving", move || m.reserve(0, bytes))
}

/// No figure of the view passes the cap: the pool's use and guarantees, each member's.
fn assert_view_within_cap(pool: Pool<'static>, k: &'static Kernel, cap: u64) {
    let v = pool.view(proc(k, 99));
    for g in &v.gpus {
        assert!(g.used <= cap, "view: used {} in a {cap} pool", g.used);
        assert!(
            g.guaranteed <= cap,
            "view: guaranteed {} in a {cap} pool",
            g.guaranteed
        );
    }
    for m in &v.members {
        for g in &m.gpus {
            assert!(
                g.guarantee <= cap,
                "view: slot {} guarantee {}",
                m.slot,
                g.guarantee
            );
            assert!(
                g.ceiling.is_none_or(|c| c <= cap),
                "view: slot {} {g:?}",
                m.slot
            );
            assert!(g.borrowed <= cap, "view: slot {} {g:?}", m.slot);
        }
    }
}

#[test]
fn an_empty_slots_guarantee_bit_stops_no_joiner_and_no_borrower() {
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(CAP)).on_repair(count_empty_slot_repairs));
    // Slot 1 (the next joiner's) and slot 7 are empty, yet the file says each holds a
    // guarantee of the whole cap.
    for s in [1, 7] {
        pool.w.share_bits(0, 0).fetch_or(1 << s, SeqCst);
        pool.w.share(s, 0, SH_GUARANTEE).store(CAP, SeqCst);
    }
    // A joiner asks for 900 of an empty pool: admitted.
    let b = leak(member(pool, proc(k, 2), Some(CAP)).on_repair(count_empty_slot_repairs));
    assert_eq!(b.slot(), 1);
    claim_within_10s(b, share(900, None)).unwrap();
    // A, without a guarantee, borrows what is not kept for B.
    reserve_within_10s(a, 100).unwrap();
    assert!(reserve_within_10s(a, 1).is_err(), "B's 900 are kept");
    reserve_within_10s(b, 900).unwrap();
    assert_eq!(a.usage(0), Some((CAP, Some(CAP), 100)));
    assert!(EMPTY_SLOT_REPAIRS.load(SeqCst) >= 1, "the repair is told");
    let v = pool.view(proc(k, 99));
    assert_eq!(v.gpus[0].guaranteed, 900);
    assert_view_within_cap(pool, k, CAP);
    // Nothing is left of the forged words.
    assert_eq!(pool.w.share_bits(0, 0).load(SeqCst), 1 << 1);
    assert_eq!(pool.w.share(7, 0, SH_GUARANTEE).load(SeqCst), 0);
}

#[test]
fn an_empty_slots_guarantee_bit_is_repaired_by_a_borrowers_refusal() {
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(CAP)));
    pool.w.share_bits(0, 0).fetch_or(1 << 9, SeqCst);
    pool.w.share(9, 0, SH_GUARANTEE).store(CAP, SeqCst);
    // 900 with 0 B in use: served, not refused forever.
    reserve_within_10s(a, 900).unwrap();
    assert_view_within_cap(pool, k, CAP);
}

static HUGE_REPAIRS: AtomicU64 = AtomicU64::new(0);
fn count_huge_repairs(r: &Repair) {
    if is_share_repair(r) {
        HUGE_REPAIRS.fetch_add(1, SeqCst);
    }
}

#[test]
fn a_live_members_guarantee_word_above_the_cap_stops_nobody() {
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(CAP)));
    claim_within_10s(a, share(300, None)).unwrap();
    let b = leak(member(pool, proc(k, 2), Some(CAP)).on_repair(count_huge_repairs));
    pool.w
        .share(a.slot(), 0, SH_GUARANTEE)
        .store(u64::MAX, SeqCst);
    // What `gpucap status` shows: never 15.99 EiB guaranteed in a 1000-byte pool.
    assert_view_within_cap(pool, k, CAP);
    // B borrows: served (the word is repaired by its refusal), not blocked.
    reserve_within_10s(b, 500).unwrap();
    assert!(HUGE_REPAIRS.load(SeqCst) >= 1, "the repair is told");
    // A's own guarantee is served: A holds it in its own memory.
    reserve_within_10s(a, 300).unwrap();
    assert!(reserve_within_10s(b, 201).is_err(), "over the cap");
    // A's next refusal writes its own words back.
    assert!(reserve_within_10s(a, CAP).is_err());
    let v = pool.view(proc(k, 99));
    let ga = v.members.iter().find(|m| m.pid == 1).unwrap().gpus[0].guarantee;
    assert_eq!(ga, 300, "A's guarantee written back from its own memory");
    assert_eq!(v.gpus[0].used, 800);
    assert_view_within_cap(pool, k, CAP);
}

#[test]
fn live_guarantees_summing_above_the_cap_keep_the_first_admitted() {
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(CAP)));
    claim_within_10s(a, share(400, None)).unwrap();
    let b = leak(member(pool, proc(k, 2), Some(CAP)));
    claim_within_10s(b, share(300, None)).unwrap();
    let c = leak(member(pool, proc(k, 3), Some(CAP)));
    // B's word raised under the cap, but above what could have been admitted after A.
    pool.w.share(b.slot(), 0, SH_GUARANTEE).store(900, SeqCst);
    assert_view_within_cap(pool, k, CAP);
    // C borrows 200: 400 kept for A, B's impossible 900 not kept.
    reserve_within_10s(c, 200).unwrap();
    // Both guarantees are served, each from its owner's memory.
    reserve_within_10s(b, 300).unwrap();
    reserve_within_10s(a, 400).unwrap();
    assert_eq!(a.usage(0).unwrap().0, 900);
    assert_view_within_cap(pool, k, CAP);
}

#[test]
fn a_ceiling_word_changed_in_the_file_neither_lifts_nor_lowers_the_members_ceiling() {
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(CAP)));
    claim_within_10s(a, share(0, Some(300))).unwrap();
    pool.w
        .share(a.slot(), 0, SH_CEILING)
        .store(u64::MAX - 1, SeqCst);
    assert_view_within_cap(pool, k, CAP);
    let r = reserve_within_10s(a, 301).unwrap_err();
    assert_eq!(r.ceiling, Some(300), "its own ceiling, not the file's");
    // Written back by that refusal.
    assert_eq!(pool.w.share(a.slot(), 0, SH_CEILING).load(SeqCst), 300);
    // Lowered: the member's own ceiling still holds.
    pool.w.share(a.slot(), 0, SH_CEILING).store(1, SeqCst);
    reserve_within_10s(a, 300).unwrap();
    assert_view_within_cap(pool, k, CAP);
}

/// Which word of a slot's share a corruption writes.
#[derive(Debug, Clone, Copy)]
enum Word {
    Bit(bool),
    Guarantee,
    Ceiling,
}

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        0u64..2 * CAP,
        any::<u64>(),
        Just(CAP),
        Just(USED_BYTES),
    ]
}

fn corruption() -> impl Strategy<Value = (usize, Word, u64)> {
    (
        0usize..8,
        prop_oneof![
            any::<bool>().prop_map(Word::Bit),
            Just(Word::Guarantee),
            Just(Word::Ceiling)
        ],
        value(),
    )
}

/// One case: members admitted with `guarantees` (guarantee, and what they hold of it
/// in quarters; some refused), one of them killed if `kill`, the words corrupted; then
/// a joiner, the members asking for the rest of their guarantees, each asking what it
/// could reserve (`cuMemGetInfo`), and the joiner borrowing what is left.
fn corrupted_pool(
    guarantees: Vec<(u64, u64)>,
    kill: Option<usize>,
    corruptions: Vec<(usize, Word, u64)>,
) {
    let (pool, k) = setup();
    let mut members: Vec<(&'static Member<'static>, u64)> = Vec::new();
    for (i, &(g, quarters)) in guarantees.iter().enumerate() {
        let m = leak(member(pool, proc(k, i as u32 + 1), Some(CAP)));
        let g = if m.claim(0, share(g, None)).is_ok() {
            g
        } else {
            0
        };
        // A member without a guarantee holds some bytes too (borrowed).
        let hold = if g == 0 {
            quarters * 40
        } else {
            g * quarters / 4
        };
        let _ = m.reserve(0, hold);
        members.push((m, g));
    }
    if let Some(d) = kill.filter(|&d| d < members.len()) {
        k.kill(d as u32 + 1);
        members.remove(d);
    }
    for &(s, word, v) in &corruptions {
        let (wd, bit) = (pool.w.share_bits(0, s / 64), 1u64 << (s % 64));
        match word {
            Word::Bit(true) => {
                wd.fetch_or(bit, SeqCst);
            }
            Word::Bit(false) => {
                wd.fetch_and(!bit, SeqCst);
            }
            Word::Guarantee => pool.w.share(s, 0, SH_GUARANTEE).store(v, SeqCst),
            Word::Ceiling => pool.w.share(s, 0, SH_CEILING).store(v, SeqCst),
        }
    }
    // (3) the view shows nothing above the cap, before any repair too.
    assert_view_within_cap(pool, k, CAP);
    let joiner = leak(member(pool, proc(k, 50), Some(CAP)));
    // (1) every member inside its own guarantee is served, in a few tries at most.
    for &(m, g) in &members {
        let held = m.usage(0).unwrap().2;
        let rest = g.saturating_sub(held);
        if rest > 0 {
            let served = (0..3).any(|_| reserve_within_10s(m, rest).is_ok());
            assert!(
                served,
                "a member holding {held} of its {g} guarantee was refused {rest}"
            );
        }
    }
    assert_view_within_cap(pool, k, CAP);
    // Each member writes its own words back when it asks what it could reserve.
    for &(m, _) in &members {
        within_10s("asking for room", move || m.room(0));
    }
    // The pool does not stop: with every guarantee taken, the joiner borrows the rest.
    let used = pool.w.used(0);
    if used < CAP {
        reserve_within_10s(joiner, CAP - used).unwrap();
    }
    // (2) the members never hold more than the cap.
    let held: u64 = (0..pool.slots())
        .map(|s| pool.w.member_gpu(s, 0, M_USED).load(SeqCst))
        .sum();
    assert!(held <= CAP, "the members hold {held} of a {CAP} pool");
    assert_eq!(pool.w.used(0), CAP);
    assert_view_within_cap(pool, k, CAP);
    let v = pool.view(proc(k, 99));
    assert!(!v.gpus[0].share_drift, "repaired: {:?}", v.gpus[0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever is written into the guarantee, ceiling and holder-bit words of any
    /// slots (live, dead, empty, the next joiner's), a member inside its guarantee is
    /// served, the pool holds at most its cap, and the view shows at most the cap.
    #[test]
    fn any_corruption_of_the_share_words_is_repaired(
        guarantees in proptest::collection::vec((0u64..400, 0u64..4), 0..5),
        kill in proptest::option::of(0usize..5),
        corruptions in proptest::collection::vec(corruption(), 1..8),
    ) {
        corrupted_pool(guarantees, kill, corruptions);
    }
}
