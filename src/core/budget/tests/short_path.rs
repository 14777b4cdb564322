//! The short path of a reservation (`Member::try_reserve`): a member without a
//! guarantee or a ceiling of its own takes its own way there (one try of the pool's cap
//! alone, while nobody holds a guarantee); whatever it answers, the full path
//! (`Member::reserve`) would have taken the same bytes, and a false changes nothing.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use super::*;
use crate::budget::layout::{
    G_PEAK, G_USED, G_WAITERS, M_PEAK, M_PENDING, M_USED, T_STARTED, USED_BYTES, used_bytes,
    used_word,
};
use crate::budget::shares::{Share, check};

const CAP: u64 = 1000;

fn share(guarantee: u64, ceiling: Option<u64>) -> Share {
    check(Some(CAP), guarantee, ceiling).unwrap()
}

/// The words a try may change on GPU entry 0, for member `m`: the pool's use and peak,
/// the member's own use, peak, bytes in flight and allocations marked started.
fn words_of(pool: Pool<'static>, m: &Member<'_>) -> [u64; 6] {
    let mine = |i| pool.w.member_gpu(m.slot(), 0, i).load(SeqCst);
    [
        pool.w.gpu(0, G_USED).load(SeqCst),
        pool.w.gpu(0, G_PEAK).load(SeqCst),
        mine(M_USED),
        mine(M_PEAK),
        mine(M_PENDING),
        pool.w.mark(m.slot(), 0, T_STARTED).load(SeqCst),
    ]
}

/// Asserts that `m.try_reserve(0, bytes)` says no and changes (and marks) nothing.
fn refused(pool: Pool<'static>, m: &Member<'_>, bytes: u64, why: &str) {
    let before = words_of(pool, m);
    assert_eq!(m.try_reserve(0, bytes), None, "{why}: taken");
    assert_eq!(words_of(pool, m), before, "{why}: changed");
}

#[test]
fn a_plain_member_takes_what_the_cap_allows_and_nothing_past_it() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    let b = member(pool, proc(k, 2), Some(CAP));
    b.reserve(0, 300).unwrap();
    assert_eq!(
        a.try_reserve(0, 600),
        Some(true),
        "taken and marked started"
    );
    assert_eq!(a.usage(0), Some((900, Some(CAP), 600)));
    let [used, peak, own, own_peak, pending, started] = words_of(pool, &a);
    assert_eq!(
        (used_bytes(used), peak, own, own_peak, pending, started),
        (900, 900, 600, 600, 0, 600)
    );
    refused(pool, &a, 101, "over the cap");
    refused(pool, &a, u64::MAX, "a size that wraps");
    assert!(a.try_reserve(0, 100).is_some(), "up to the cap");
    assert_eq!(a.usage(0), Some((CAP, Some(CAP), 700)));
    refused(pool, &a, 1, "the cap is full");
    // Not registered with the pool: not charged to it (taken, nothing counted or marked).
    let before = words_of(pool, &a);
    assert_eq!(a.try_reserve(3, 1 << 40), Some(false));
    assert_eq!(words_of(pool, &a), before);
    assert_eq!(a.usage(3), None);
}

#[test]
fn with_no_cap_a_size_that_would_wrap_is_not_taken() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), None);
    assert!(a.try_reserve(0, 100).is_some());
    refused(pool, &a, u64::MAX - 10, "wraps past zero");
    refused(pool, &a, USED_BYTES, "past what the pool's word holds");
    assert!(a.try_reserve(0, USED_BYTES - 100).is_some(), "up to it");
    assert_eq!(a.usage(0), Some((USED_BYTES, None, USED_BYTES)));
}

#[test]
fn a_plain_member_keeps_the_others_unused_guarantees() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(400, None)).unwrap();
    let b = member(pool, proc(k, 2), Some(CAP));
    a.reserve(0, 100).unwrap();
    // 300 of A's guarantee unused: B (no share of its own) may take 600, not more.
    refused(pool, &b, 601, "into another member's unused guarantee");
    assert!(b.try_reserve(0, 600).is_some());
    assert_eq!(b.usage(0), Some((700, Some(CAP), 600)));
    // A takes its guarantee's rest on its own short path (the whole rule).
    assert!(a.try_reserve(0, 300).is_some());
    refused(pool, &a, 1, "the cap is full");
    // Once A gave its guarantee back (left), B may take all the room again.
    b.credit(0, 600);
    a.leave();
    assert!(b.try_reserve(0, CAP).is_some());
    assert_eq!(b.usage(0), Some((CAP, Some(CAP), CAP)));
}

#[test]
fn a_member_with_a_ceiling_is_held_to_it_on_the_short_path() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP));
    a.claim(0, share(0, Some(300))).unwrap();
    assert!(a.try_reserve(0, 200).is_some());
    refused(pool, &a, 101, "past its ceiling");
    assert!(a.try_reserve(0, 100).is_some());
    assert_eq!(a.usage(0), Some((300, Some(CAP), 300)));
}

#[test]
fn the_short_path_leaves_to_the_full_one_what_it_must_decide() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(CAP)).waiting(Duration::from_secs(10), quiet);
    a.reserve(0, 100).unwrap();
    // Another member waits for memory: it is served first, in order.
    pool.w.gpu(0, G_WAITERS).store(1, SeqCst);
    refused(pool, &a, 1, "a waiter first");
    pool.w.gpu(0, G_WAITERS).store(0, SeqCst);
    assert!(a.try_reserve(0, 1).is_some());
    // A `used` below the member's own use cannot be (another process wrote it): the
    // full path recounts it.
    let used = pool.w.gpu(0, G_USED);
    let word = used.load(SeqCst);
    used.store(used_word(word, 50), SeqCst);
    refused(pool, &a, 1, "a used below its own");
    used.store(used_word(word, 101), SeqCst);
    // After it left: refused (the full path says why).
    a.leave();
    refused(pool, &a, 1, "left");
}

#[test]
fn short_path_reservations_from_many_threads_never_pass_the_cap_and_add_up() {
    let (pool, k) = setup();
    let a = leak(member(pool, proc(k, 1), Some(CAP)));
    let b = leak(member(pool, proc(k, 2), Some(CAP)));
    let over = std::sync::Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for (i, m) in [a, a, b, b].into_iter().enumerate() {
            let over = over.clone();
            s.spawn(move || {
                let bytes = 100 + 50 * i as u64;
                for _ in 0..20_000 {
                    if m.try_reserve(0, bytes).is_some() {
                        let used = pool.w.used(0);
                        if used > CAP {
                            over.fetch_max(used, SeqCst);
                        }
                        m.credit(0, bytes);
                    }
                }
            });
        }
    });
    assert_eq!(over.load(SeqCst), 0, "the pool's use passed its cap");
    assert_eq!(a.usage(0), Some((0, Some(CAP), 0)));
    assert_eq!(b.usage(0), Some((0, Some(CAP), 0)));
    assert!(pool.w.gpu(0, G_PEAK).load(SeqCst) <= CAP);
    let pending = |m: &Member<'_>| pool.w.member_gpu(m.slot(), 0, M_PENDING).load(SeqCst);
    assert_eq!((pending(a), pending(b)), (0, 0));
}
