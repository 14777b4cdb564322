//! Frees announced before the driver call (`traffic`): the words each step leaves, and a
//! member killed or stopped at any step of an announced free.

use super::*;
use crate::budget::layout::{
    G_USED, H_SLOTS_SEEN, M_PENDING, M_USED, T_FREED, T_FREEING, T_MADE, T_STARTED, T_UNMADE,
    used_bytes, used_word,
};

/// What member slot `s` announced on GPU entry 0: (`freeing`, `freed`).
fn announced(pool: Pool<'static>, s: usize) -> (u64, u64) {
    let w = pool.w;
    (
        w.mark(s, 0, T_FREEING).load(SeqCst),
        w.mark(s, 0, T_FREED).load(SeqCst),
    )
}

/// The bytes `m`'s view of the pool adds back for frees announced and not completed.
fn in_flight(m: &Member<'static>) -> u64 {
    let t = m.traffic(0).unwrap();
    t.given_back_since(&t.freed_before())
}

#[test]
fn an_announced_free_is_credited_when_completed_and_stays_counted_when_withdrawn() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    a.reserve(0, 600).unwrap();
    let t = b.traffic(0).unwrap();
    let before = t.freed_before();
    assert!(a.announce_free(0, 200));
    // Announced: still held (in `used` and in A's own use) until the driver freed it.
    assert_eq!(a.usage(0), Some((600, Some(1000), 600)));
    assert_eq!(announced(pool, a.slot()), (200, 200));
    assert_eq!(in_flight(&b), 200);
    a.complete_free(0, 200);
    assert_eq!(a.usage(0), Some((400, Some(1000), 400)));
    assert_eq!(announced(pool, a.slot()), (0, 200));
    assert_eq!(in_flight(&b), 0);
    // The driver refused: nothing credited, `freed` keeps it (counted more, never less).
    assert!(a.announce_free(0, 100));
    a.withdraw_free(0, 100);
    assert_eq!(a.usage(0), Some((400, Some(1000), 400)));
    assert_eq!(announced(pool, a.slot()), (0, 300));
    assert_eq!(t.given_back_since(&before), 300);
    // A slot's `freed` that went down (another process wrote it): all of it counts.
    let after = t.freed_before();
    pool.w.mark(a.slot(), 0, T_FREED).store(50, SeqCst);
    assert_eq!(t.given_back_since(&after), 50);
    // Nothing to announce: a device not the pool's, no bytes, a member that left.
    assert!(!a.announce_free(1, 100));
    assert!(!a.announce_free(0, 0));
    // Leaving (at exit) announces what it still holds: the driver frees it later.
    let before = t.freed_before();
    a.leave();
    assert_eq!(t.given_back_since(&before), 400);
    assert!(!a.announce_free(0, 100));
    assert_eq!(b.usage(0), Some((0, Some(1000), 0)));
}

/// The steps of an announced free (see `traffic` and `used`), in order: announce
/// (`freeing`, `freed`), the credit (`pending`, own use, `used`, `pending`), and the
/// end of the announcement (`freeing`).
const FREE_STEPS: usize = 7;

/// Plays member `m` freeing `bytes` on GPU entry 0: its steps `from..to`.
fn play_free(pool: Pool<'static>, m: &Member<'static>, bytes: u64, steps: std::ops::Range<usize>) {
    let w = pool.w;
    let word = |i| w.member_gpu(m.slot(), 0, i);
    let mark = |i| w.mark(m.slot(), 0, i);
    let used = w.gpu(0, G_USED);
    for step in steps {
        match step {
            0 => drop(mark(T_FREEING).fetch_add(bytes, SeqCst)),
            1 => drop(mark(T_FREED).fetch_add(bytes, SeqCst)),
            2 => drop(word(M_PENDING).fetch_add(bytes, SeqCst)),
            3 => drop(word(M_USED).fetch_sub(bytes, SeqCst)),
            4 => {
                let now = used.load(SeqCst);
                used.store(used_word(now, used_bytes(now) - bytes), SeqCst);
            }
            5 => drop(word(M_PENDING).fetch_sub(bytes, SeqCst)),
            _ => drop(mark(T_FREEING).fetch_sub(bytes, SeqCst)),
        }
    }
}

#[test]
fn a_member_killed_at_any_point_of_an_announced_free_leaves_the_pool_consistent() {
    for steps in 0..=FREE_STEPS {
        let (pool, k) = setup();
        let a = member(pool, proc(k, 1), Some(1000));
        let b = member(pool, proc(k, 2), Some(1000));
        a.reserve(0, 300).unwrap();
        b.reserve(0, 100).unwrap();
        play_free(pool, &a, 200, 0..steps);
        let slot = a.slot();
        k.kill(1);
        // A dead member's announcement is not added back (nothing of it is in flight).
        assert_eq!(in_flight(&b), 0, "after {steps} steps");
        within_10s("reserving beside a killed member", move || {
            b.reserve(0, 900).unwrap();
            assert_eq!(b.usage(0), Some((1000, Some(1000), 1000)), "{steps}");
            assert_eq!(announced(pool, slot).0, 0, "{steps}: its `freeing` cleared");
            b.credit(0, 1000);
            assert_eq!(b.usage(0), Some((0, Some(1000), 0)));
        });
    }
}

#[test]
fn a_member_stopped_at_any_point_of_an_announced_free_is_never_undercounted() {
    for steps in 0..=FREE_STEPS {
        let (pool, k) = setup();
        let a = member(pool, proc(k, 1), Some(1000));
        let b = member(pool, proc(k, 2), Some(1000));
        a.reserve(0, 300).unwrap();
        play_free(pool, &a, 200, 0..steps);
        // What `used` holds for A: its 300 until the credit's swap.
        let a_in_used = if steps >= 5 { 100 } else { 300 };
        assert_eq!(pool.w.used(0), a_in_used, "{steps}");
        // Announced and not ended: a measurement adds it back.
        let counted = if (1..FREE_STEPS).contains(&steps) {
            200
        } else {
            0
        };
        assert_eq!(in_flight(&b), counted, "{steps}");
        // A recount while A is stopped never counts less than `used` holds for it.
        b.recount(0);
        assert!(pool.w.used(0) >= a_in_used, "{steps}");
        play_free(pool, &a, 200, steps..FREE_STEPS);
        b.recount(0);
        assert_eq!(pool.w.used(0), 100, "{steps}");
        assert_eq!(announced(pool, a.slot()), (0, 200), "{steps}");
    }
}

/// What slot `s` has in flight on GPU entry 0: `started - made - unmade`.
fn allocating(pool: Pool<'static>, s: usize) -> u64 {
    let word = |i| pool.w.mark(s, 0, i).load(SeqCst);
    word(T_STARTED) - word(T_MADE) - word(T_UNMADE)
}

#[test]
fn a_member_killed_inside_an_allocation_leaves_nothing_in_flight() {
    for made in [false, true] {
        let (pool, k) = setup();
        let a = member(pool, proc(k, 1), Some(1000));
        let b = member(pool, proc(k, 2), Some(1000));
        a.reserve(0, 300).unwrap();
        assert!(a.alloc_started(0, 300));
        if made {
            a.alloc_ended(0, 300, true);
        }
        assert_eq!(allocating(pool, a.slot()), if made { 0 } else { 300 });
        let slot = a.slot();
        k.kill(1);
        within_10s("reserving beside a killed member", move || {
            b.reserve(0, 1000).unwrap();
            assert_eq!(allocating(pool, slot), 0, "closed when taken back");
            b.credit(0, 1000);
        });
        // Its slot's next owner starts with nothing in flight.
        let c = member(pool, proc(k, 3), Some(1000));
        assert_eq!(c.slot(), slot);
        assert_eq!(allocating(pool, slot), 0);
    }
}

/// A measurement reads only the slots ever taken (`H_SLOTS_SEEN`): a member that takes a
/// slot for the first time inside the window is counted from zero, its frees added back
/// and its allocations taken off.
#[test]
fn a_member_that_joins_inside_the_window_is_counted_from_zero() {
    let (pool, k) = setup();
    let b = member(pool, proc(k, 1), Some(1000));
    assert_eq!(pool.w.header(H_SLOTS_SEEN).load(SeqCst), 1);
    let t = b.traffic(0).unwrap();
    let (before, first) = (t.freed_before(), t.made_inside());
    let c = member(pool, proc(k, 2), Some(1000));
    assert_eq!(pool.w.header(H_SLOTS_SEEN).load(SeqCst), 2);
    c.reserve(0, 300).unwrap();
    assert!(c.alloc_started(0, 300));
    c.alloc_ended(0, 300, true);
    assert!(c.announce_free(0, 100));
    c.complete_free(0, 100);
    assert_eq!(t.given_back_since(&before), 100, "C's free added back");
    assert_eq!(t.taken_since(&first), 300, "C's allocation taken off");
    // A slot given back keeps the count: the next member there reads what it left.
    c.leave();
    let d = member(pool, proc(k, 3), Some(1000));
    assert_eq!(d.slot(), c.slot());
    assert_eq!(pool.w.header(H_SLOTS_SEEN).load(SeqCst), 2);
}

/// What a measurement may have counted of the others' traffic that fell outside its
/// window (`window::Edges::unsure`): an allocation in flight when it opened and made
/// since (left in), one in flight now (its driver call may be done, not yet marked made),
/// frees still announced, and announcements withdrawn (`unsure`); the measuring member's own
/// reservation for its call is none of them.
#[test]
fn what_a_window_may_hold_of_the_others_traffic_is_counted_as_its_doubt() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(4000));
    let b = member(pool, proc(k, 2), Some(4000));
    // B has 100 in flight when A's window opens; A holds 50 for its own call.
    b.reserve(0, 100).unwrap();
    assert!(b.alloc_started(0, 100));
    a.reserve(0, 50).unwrap();
    assert!(a.alloc_started(0, 50));
    let t = a.traffic(0).unwrap().holding(50);
    let (before, first) = (t.freed_before(), t.made_inside());
    assert_eq!((t.left_in_since(&first), t.in_flight()), (0, 100));
    // Made inside the window: left in (its driver call may have come before it).
    b.alloc_ended(0, 100, true);
    assert_eq!(t.taken_since(&first), 0);
    assert_eq!((t.left_in_since(&first), t.in_flight()), (100, 0));
    // Started inside it and not made yet: in flight at its end.
    b.reserve(0, 200).unwrap();
    assert!(b.alloc_started(0, 200));
    assert_eq!((t.left_in_since(&first), t.in_flight()), (100, 200));
    // Two frees announced: both added back, both still announced (their driver calls may
    // come after the window).
    assert!(b.announce_free(0, 300));
    assert!(b.announce_free(0, 40));
    assert_eq!(t.given_back_since(&before), 340, "both added back");
    assert_eq!((t.freeing_now(), t.overstated_since(&before)), (340, 0));
    // One completed is sure; one withdrawn (refused, or an upper bound ended) is unsure.
    b.complete_free(0, 40);
    b.withdraw_free(0, 300);
    assert_eq!(t.given_back_since(&before), 340, "`freed` keeps both");
    assert_eq!(
        (t.freeing_now(), t.overstated_since(&before)),
        (0, 300),
        "only the withdrawn one is unsure"
    );
    // A's own reservation is not in flight for A's window; B's window sees it.
    let tb = b.traffic(0).unwrap();
    assert_eq!(
        tb.in_flight(),
        50 + 200,
        "A's 50, and B's own 200 (held for no call)"
    );
    assert_eq!(tb.holding(200).in_flight(), 50);
}
