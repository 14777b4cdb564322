//! What a start touches of a large pool's file: its join, its GPU's registration, a
//! reservation, a context's measurement (the members' traffic marks) and its leaving
//! reach its own slot and no other member's, and a few pages of the arrays every look
//! over the slots reads, however many members the file holds and however many live:
//! not a page per member (the O(n) per joiner, O(n^2) per mass start, of a slot state
//! or share word read in every slot).

use super::*;
use crate::budget::layout::{SLOT_WORDS, shares_at, slots_at};
use crate::budget::touched;

const PAGE_WORDS: usize = 4096 / 8;

fn pool_of(slots: usize) -> (Pool<'static>, &'static Kernel) {
    let v: Vec<AtomicU64> = (0..pool_words(slots)).map(|_| AtomicU64::new(0)).collect();
    let w = Box::leak(v.into_boxed_slice());
    Pool::create_with(w, slots, 1, 1000).unwrap();
    (Pool::open(w).unwrap(), Kernel::new())
}

/// One member's start in `pool` as process `id`, noting what it touched: (its slot, the
/// word ranges it reached).
fn start(pool: Pool<'static>, k: &'static Kernel, id: u32) -> (usize, Vec<(usize, usize)>) {
    touched::start();
    let opened = Pool::open(pool.w.words).unwrap();
    let m = member(opened, proc(k, id), Some(1 << 30));
    m.reserve(0, 1000).unwrap();
    let t = m.traffic(0).unwrap();
    let (before, first) = (t.freed_before(), t.made_inside());
    assert_eq!((t.taken_since(&first), t.given_back_since(&before)), (0, 0));
    m.credit(0, 1000);
    m.leave();
    (m.slot(), touched::stop())
}

fn pages(ranges: &[(usize, usize)]) -> std::collections::BTreeSet<usize> {
    ranges
        .iter()
        .flat_map(|&(at, n)| at / PAGE_WORDS..=(at + n.max(1) - 1) / PAGE_WORDS)
        .collect()
}

#[test]
fn a_start_in_a_large_pool_touches_its_own_slot_and_a_few_pages_whatever_the_members() {
    let slots = MAX_SLOTS;
    let (pool, k) = pool_of(slots);
    let file_pages = pool_words(slots).div_ceil(PAGE_WORDS);
    let mut members = Vec::new();
    for live in [0usize, 10, 1000] {
        while members.len() < live {
            let id = members.len() as u32 + 1;
            let m = member(pool, proc(k, id), Some(1 << 30));
            m.reserve(0, 4096).unwrap();
            members.push(m);
        }
        let (own, reached) = start(pool, k, 5000 + live as u32);
        // Of the member slots, its own words only.
        let (first, end) = (slots_at(slots), shares_at(slots));
        let mine = first + own * SLOT_WORDS..first + (own + 1) * SLOT_WORDS;
        for &(at, n) in &reached {
            assert!(
                at + n <= first || at >= end || (mine.contains(&at) && at + n <= mine.end),
                "beside {live} live members, a start in slot {own} reached words {at}..{} \
                 of slot {}",
                at + n,
                (at - first) / SLOT_WORDS
            );
        }
        // The states (8 pages at 4,096 slots), one GPU's share words of the live slots
        // and its marks of the slots ever taken (4 and 10 pages beside 1,000), the
        // header and GPU entries (2), its own slot and words (4).
        let touched = pages(&reached).len();
        assert!(
            touched <= 40,
            "beside {live} live members, a start touched {touched} of the file's \
             {file_pages} pages"
        );
    }
    assert_eq!(pool.w.used(0), 1000 * 4096);
}
