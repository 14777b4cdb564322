//! The live map: entries found wherever they lie, growth, moves and races.

use super::entry::MOVED;
use super::*;
use std::cell::Cell;
use std::collections::HashSet;

thread_local! {
    /// Calls of this thread into `insert_slow` or `remove_slow`.
    pub(super) static SLOW: Cell<usize> = const { Cell::new(0) };
    /// Run once by this thread's next insert that finds its neighbourhood full while a
    /// growth is under way, before it waits.
    pub(super) static WHILE_FULL: Cell<Option<fn(&LiveMap)>> = const { Cell::new(None) };
}

#[test]
fn an_insert_finding_its_neighbourhood_full_waits_for_the_growth_under_way() {
    // The first table made, then a growth under way (another thread's: `growing` held)
    // while this thread fills the table: its inserts find their neighbourhoods full. The
    // growth ends at the first one's wait (the step below): that entry and every later
    // one go to the next level, none to the locked map (before: the first full
    // neighbourhood went there at once).
    let m = LiveMap::new();
    let key = |i: u64| 0x7f00_0000_0000 + (i << 12);
    let mut i = 0;
    while m.table(0).is_none() {
        m.insert(key(i), c(0, i));
        i += 1;
    }
    m.growing.store(true, Release);
    WHILE_FULL.with(|f| f.set(Some(|m: &LiveMap| m.growing.store(false, Release))));
    let slots = BASE_BUCKETS * WAYS;
    for _ in 0..4 * slots {
        m.insert(key(i), c(0, i));
        i += 1;
    }
    let (sizes, overflowed) = shape(&m);
    assert_eq!(overflowed, 0, "levels {sizes:?}");
    assert!(
        WHILE_FULL.with(Cell::take).is_none(),
        "no insert found its neighbourhood full"
    );
    assert!(sizes.len() > 1, "the growth went on: {sizes:?}");
    for j in 0..i {
        assert_eq!(m.get(key(j)), Some(c(0, j)), "key {j}");
    }
}

#[test]
fn no_slow_path_by_count_or_spacing() {
    // Blocks 4 KiB, 1 MiB and 2 MiB apart, 10,000 and 100,000 of them live: freeing
    // and allocating any one again (where the driver hands the same address back)
    // stays on the one-table path, wherever its entry lies in the table (first or
    // last ways of its home bucket, or spilled past it).
    for (spacing, live) in [
        (12, 10_000u64),
        (20, 10_000),
        (21, 10_000),
        (12, 100_000),
        (20, 100_000),
    ] {
        let m = LiveMap::new();
        let key = |i: u64| 0x7f00_0000_0000 + (i << spacing);
        for i in 0..live {
            m.insert(key(i), c(0, 1 << spacing));
        }
        let churn = || {
            for i in 0..live {
                assert_eq!(m.remove(key(i)), Some(c(0, 1 << spacing)), "key {i}");
                m.insert(key(i), c(0, 1 << spacing));
            }
        };
        // Once: any move to a new level the last inserts began is finished.
        churn();
        assert_eq!(m.state.load(Acquire) & MOVE_RUNS, 0);
        let (sizes, overflowed) = shape(&m);
        let slow = SLOW.with(Cell::get);
        churn();
        assert_eq!(
            SLOW.with(Cell::get) - slow,
            0,
            "{live} live, {spacing}-bit spacing"
        );
        assert_eq!(shape(&m), (sizes, overflowed), "no growth from churn");
        let t = m.table(m.state.load(Acquire) - 1).unwrap();
        let spilled = (0..live)
            .filter(|&i| t.find(key(i)).is_some_and(|f| f.distance > 0))
            .count();
        let far_ways = (0..live)
            .filter(|&i| t.find(key(i)).is_some_and(|f| f.way >= FAST_WAYS))
            .count();
        assert!(
            spilled > 0 && far_ways > 0,
            "the test covers spilled entries ({spilled}) and far ways ({far_ways})"
        );
    }
}

fn c(device: usize, bytes: u64) -> Charge {
    Charge { device, bytes }
}

/// A device-pointer-like key: aligned, in the range drivers hand out.
fn ptr(i: u64) -> u64 {
    0x7f00_0000_0000 + (i << 9)
}

/// Buckets of all tables the map allocated, and whether the locked map is empty.
fn shape(m: &LiveMap) -> (Vec<usize>, u64) {
    let tops = m.state.load(Acquire) & LEVELS_MASK;
    let sizes = (0..tops)
        .map(|l| m.table(l).unwrap().buckets.len())
        .collect();
    (sizes, m.overflow.count.load(Acquire))
}

#[test]
fn insert_get_remove_and_reinsert() {
    let m = LiveMap::new();
    assert_eq!(m.get(ptr(1)), None);
    assert_eq!(m.remove(ptr(1)), None);
    m.insert(ptr(1), c(0, 4096));
    m.insert(ptr(2), c(3, 0));
    assert_eq!(m.get(ptr(1)), Some(c(0, 4096)));
    assert_eq!(m.get(ptr(2)), Some(c(3, 0)));
    assert_eq!(m.remove(ptr(1)), Some(c(0, 4096)));
    assert_eq!(m.remove(ptr(1)), None, "removed once");
    assert_eq!(m.get(ptr(1)), None);
    // The driver reuses addresses: the same key again, with another charge.
    m.insert(ptr(1), c(1, 8192));
    assert_eq!(m.get(ptr(1)), Some(c(1, 8192)));
    let mut all = m.matching(|_| true);
    all.sort_unstable_by_key(|e| e.0);
    assert_eq!(all, vec![(ptr(1), c(1, 8192)), (ptr(2), c(3, 0))]);
    assert_eq!(m.matching(|ch| ch.device == 3), vec![(ptr(2), c(3, 0))]);
    assert_eq!(shape(&m), (vec![], 0), "in the front: no table, no lock");
}

/// The device of [`fill_front`]'s entries.
const FILLER: usize = 200;

/// Fills every slot of `m`'s front with an entry of device [`FILLER`], so that what is
/// inserted next goes to the levels.
fn fill_front(m: &LiveMap) {
    let mut i = 0u64;
    while !m.front.is_full() {
        let k = 0x7e00_0000_0000 + (i << 9);
        if m.front.has_room_for(k) {
            m.insert(k, c(FILLER, 1));
        }
        i += 1;
    }
    assert_eq!(shape(m), (vec![], 0), "the filler all in the front");
}

#[test]
fn few_entries_live_in_the_front_without_a_table_or_a_slow_path() {
    let m = LiveMap::new();
    let slow = SLOW.with(Cell::get);
    // 500 keys, each with a free front slot when inserted (the others skipped).
    let mut keys = Vec::new();
    for k in (0..).map(ptr) {
        if keys.len() == 500 {
            break;
        }
        if m.front.has_room_for(k) {
            m.insert(k, c(1, k));
            keys.push(k);
        }
    }
    assert_eq!(m.state.load(Acquire), 0, "no table was made");
    for &k in &keys {
        assert_eq!(m.get(k), Some(c(1, k)));
    }
    assert_eq!(m.matching(|_| true).len(), 500);
    for &k in &keys {
        assert_eq!(m.remove(k), Some(c(1, k)));
    }
    assert_eq!(SLOW.with(Cell::get) - slow, 0, "no slow path either way");
    for &k in &keys {
        assert_eq!(m.remove(k), None, "removed once");
    }
    assert!(m.matching(|_| true).is_empty());
    assert_eq!(shape(&m), (vec![], 0));
}

#[test]
fn evenly_spaced_blocks_of_any_size_mostly_find_a_front_slot() {
    // 256 blocks live at once, evenly spaced by any multiple of 512 B up to 2 MiB (a
    // driver's alignment; a caching allocator's block sizes) or by a power of two from
    // 8 B: at least three in four go to the front, as keys spread like random ones
    // would (88 %; the worst spacing here 82 %). Front slots picked by one multiply's
    // top bits (a cheaper hash) would leave fewer than that in the front
    // for 492 of these spacings, 10 of 256 for the worst: a slower path by size.
    let spacings = (1..=4096u64)
        .map(|k| k << 9)
        .chain((3..22).map(|s| 1u64 << s));
    for spacing in spacings {
        let m = LiveMap::new();
        let mut in_front = 0;
        for i in 0..256 {
            let k = 0x7f00_0000_0000 + i * spacing;
            in_front += usize::from(m.front.has_room_for(k));
            m.insert(k, c(0, spacing));
        }
        assert!(
            in_front >= 192,
            "{spacing}-byte spacing: {in_front} of 256 blocks in the front"
        );
    }
}

#[test]
fn keys_sharing_a_front_slot_go_to_the_levels_and_are_all_found() {
    let m = LiveMap::new();
    // Five keys whose front slot is the same: taken by the first, free again once
    // it is removed.
    let keys: Vec<u64> = {
        let probe = LiveMap::new();
        probe.insert(ptr(0), c(0, 0));
        (0..)
            .map(ptr)
            .filter(|&k| !probe.front.has_room_for(k))
            .take(5)
            .collect()
    };
    for (i, &k) in keys.iter().enumerate() {
        m.insert(k, c(0, i as u64));
    }
    assert_eq!(shape(&m), (vec![BASE_BUCKETS], 0), "four in the one table");
    assert_eq!(
        m.front.get(keys[0]),
        Some(c(0, 0)),
        "the first in the front"
    );
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(m.get(k), Some(c(0, i as u64)));
    }
    assert_eq!(m.remove(keys[0]), Some(c(0, 0)));
    // The slot is free again: the next key that hashes there takes it.
    assert_eq!(m.remove(keys[3]), Some(c(0, 3)));
    m.insert(keys[3], c(1, 3));
    assert_eq!(m.front.get(keys[3]), Some(c(1, 3)), "back in the front");
    let mut all = m.matching(|_| true);
    all.sort_unstable_by_key(|e| e.0);
    let mut want = vec![
        (keys[1], c(0, 1)),
        (keys[2], c(0, 2)),
        (keys[3], c(1, 3)),
        (keys[4], c(0, 4)),
    ];
    want.sort_unstable_by_key(|e| e.0);
    assert_eq!(all, want);
    for (k, ch) in want {
        assert_eq!(m.remove(k), Some(ch));
        assert_eq!(m.get(k), None);
    }
    assert!(m.matching(|_| true).is_empty());
}

#[test]
fn racing_inserts_into_one_front_slot_place_each_key_once() {
    // Rounds of two threads inserting two keys with the same front slot at once, then
    // removing each other's: one key lands in the front, the other in a level, and
    // each is found and taken exactly once.
    let probe = LiveMap::new();
    probe.insert(ptr(0), c(0, 0));
    let twins: Vec<u64> = (1..)
        .map(ptr)
        .filter(|&k| !probe.front.has_room_for(k))
        .take(2)
        .collect();
    let m = LiveMap::new();
    for round in 0..2000u64 {
        std::thread::scope(|s| {
            for (w, &k) in twins.iter().enumerate() {
                let m = &m;
                s.spawn(move || m.insert(k, c(w, round)));
            }
        });
        let in_front = twins.iter().filter(|&&k| m.front.get(k).is_some()).count();
        assert_eq!(in_front, 1, "round {round}");
        std::thread::scope(|s| {
            for (w, &k) in twins.iter().enumerate().rev() {
                let m = &m;
                s.spawn(move || assert_eq!(m.remove(k), Some(c(w, round)), "round {round}"));
            }
        });
        assert!(m.matching(|_| true).is_empty(), "round {round}");
    }
}

#[test]
fn keys_and_charges_the_table_cannot_hold_go_to_the_locked_map() {
    let m = LiveMap::new();
    let huge = c(0, u64::MAX - 1);
    let far = c(300, 5);
    for (k, ch) in [
        (EMPTY, far),
        (MOVED, far),
        (BUSY, far),
        (u64::MAX, far),
        (MOVING | 0x1000, far),
        (0x1000, huge),
    ] {
        m.insert(k, ch);
        assert_eq!(m.get(k), Some(ch));
        assert_eq!(m.matching(|_| true), vec![(k, ch)]);
        assert_eq!(m.remove(k), Some(ch));
        assert_eq!(m.remove(k), None);
    }
    assert_eq!(m.overflow.count.load(Acquire), 0);
}

#[test]
fn keys_sharing_a_home_bucket_spill_and_are_all_found() {
    let m = LiveMap::new();
    fill_front(&m);
    m.insert(ptr(0), c(0, 1));
    let t = m.table(0).unwrap();
    let home = t.home(ptr(0));
    // 20 keys with the same home bucket: nearly three buckets' worth.
    let keys: Vec<u64> = (0..)
        .map(ptr)
        .filter(|&k| t.home(k) == home)
        .take(20)
        .collect();
    assert_eq!(m.remove(ptr(0)), Some(c(0, 1)));
    for (i, &k) in keys.iter().enumerate() {
        m.insert(k, c(1, i as u64));
    }
    assert_eq!(t.crowded.load(Acquire), 20 - FAST_WAYS);
    assert!(t.buckets[home].spill.load(Acquire) > 0);
    for (i, &k) in keys.iter().enumerate() {
        assert_eq!(m.get(k), Some(c(1, i as u64)));
    }
    // Removing the home bucket's entries leaves the spilled ones findable.
    for (i, &k) in keys.iter().enumerate().take(WAYS) {
        assert_eq!(m.remove(k), Some(c(1, i as u64)));
    }
    for (i, &k) in keys.iter().enumerate().skip(WAYS) {
        assert_eq!(m.get(k), Some(c(1, i as u64)));
    }
    for (i, &k) in keys.iter().enumerate().skip(WAYS) {
        assert_eq!(m.remove(k), Some(c(1, i as u64)));
        assert_eq!(m.remove(k), None);
    }
    // Every spill count and crowded entry was taken back: nothing is left over.
    assert!(t.buckets.iter().all(|b| b.spill.load(Acquire) == 0));
    assert_eq!(t.crowded.load(Acquire), 0);
    assert!(m.matching(|ch| ch.device != FILLER).is_empty());
}

#[test]
fn two_million_keys_grow_the_table_without_the_locked_map() {
    const N: u64 = 2_000_000;
    let m = LiveMap::new();
    for i in 0..N {
        m.insert(ptr(i), c((i % 4) as usize, i));
    }
    let (sizes, overflowed) = shape(&m);
    assert_eq!(overflowed, 0, "every entry in a lock-free table");
    // Each level doubles the last; the newest is at least a quarter full.
    let newest = *sizes.last().unwrap();
    assert!(sizes.windows(2).all(|w| w[1] == 2 * w[0]), "{sizes:?}");
    assert!(newest * WAYS <= 4 * N as usize, "{sizes:?}");
    for i in 0..N {
        assert_eq!(m.get(ptr(i)), Some(c((i % 4) as usize, i)), "key {i}");
    }
    assert_eq!(m.matching(|_| true).len(), N as usize);
    assert_eq!(m.matching(|ch| ch.device == 1).len(), N as usize / 4);
    for i in 0..N {
        assert_eq!(m.remove(ptr(i)), Some(c((i % 4) as usize, i)), "key {i}");
    }
    assert!(m.matching(|_| true).is_empty());
    assert_eq!(m.get(ptr(7)), None);
    // Churn of new addresses leaves no debris: the table does not grow again.
    for i in N..N + 4 * N {
        m.insert(ptr(i), c(0, 1));
        assert_eq!(m.remove(ptr(i)), Some(c(0, 1)));
    }
    assert_eq!(shape(&m), (sizes, 0));
}

#[test]
fn concurrent_inserts_and_removes_while_the_table_grows() {
    const THREADS: u64 = 4;
    const KEYS: u64 = 150_000;
    let m = LiveMap::new();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let m = &m;
            s.spawn(move || {
                let key = |i: u64| ptr((t << 32) | i);
                let mut live = Vec::new();
                for i in 0..KEYS {
                    m.insert(key(i), c(t as usize, i));
                    live.push(i);
                    // Every third step frees an older allocation; every fifth, the
                    // driver hands the freed address out again at once.
                    if i % 3 == 2 {
                        let j = live.swap_remove((i as usize * 7919) % live.len());
                        assert_eq!(m.remove(key(j)), Some(c(t as usize, j)), "key {j}");
                        assert_eq!(m.get(key(j)), None);
                        if i % 5 == 0 {
                            m.insert(key(j), c(t as usize, j + 1));
                            assert_eq!(m.remove(key(j)), Some(c(t as usize, j + 1)));
                        }
                    }
                    if i % 1000 == 0 {
                        for &j in &live {
                            assert_eq!(m.get(key(j)), Some(c(t as usize, j)), "key {j}");
                        }
                    }
                }
                for &j in &live {
                    assert_eq!(m.get(key(j)), Some(c(t as usize, j)), "key {j}");
                }
                live
            });
        }
    });
    let (sizes, overflowed) = shape(&m);
    assert!(sizes.len() > 5, "the table grew while the threads ran");
    let per_thread = KEYS - KEYS / 3;
    // A thread preempted halfway through moving a bucket holds the next growth back
    // (one move at a time) while the others fill the newest table: an insert that then
    // finds its neighbourhood full waits a while, then goes to the locked map, as
    // designed (4 entries, before that wait, in one of some 300 runs of the suite beside
    // a full test run). A growth that failed would send most of them there.
    assert!(
        overflowed * 100 <= THREADS * per_thread,
        "{overflowed} entries overflowed into the locked map"
    );
    let all = m.matching(|_| true);
    assert_eq!(all.len() as u64, THREADS * per_thread);
    for t in 0..THREADS {
        let mine = m.matching(|ch| ch.device == t as usize);
        assert_eq!(mine.len() as u64, per_thread);
        for (k, ch) in mine {
            assert_eq!(m.remove(k), Some(ch));
        }
    }
    assert!(m.matching(|_| true).is_empty());
}

#[test]
fn matching_sees_each_entry_once_while_others_grow_the_table() {
    const STABLE: u64 = 3000;
    let m = LiveMap::new();
    for i in 0..STABLE {
        m.insert(ptr(i), c(1, i));
    }
    let stable: HashSet<u64> = (0..STABLE).map(ptr).collect();
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 1..=2u64 {
            let (m, done) = (&m, &done);
            s.spawn(move || {
                for i in 0..200_000u64 {
                    m.insert(ptr((t << 32) | i), c(0, i));
                    if i % 2 == 1 {
                        let j = i - 1;
                        assert_eq!(m.remove(ptr((t << 32) | j)), Some(c(0, j)));
                    }
                }
                done.fetch_add(1, Release);
            });
        }
        let mut rounds = 0;
        while done.load(Acquire) < 2 || rounds < 3 {
            let seen = m.matching(|ch| ch.device == 1);
            assert_eq!(seen.len() as u64, STABLE, "round {rounds}");
            assert_eq!(seen.iter().map(|e| e.0).collect::<HashSet<_>>(), stable);
            assert!(seen.iter().all(|&(k, ch)| k == ptr(ch.bytes)));
            rounds += 1;
        }
    });
    assert!(shape(&m).0.len() > 4, "the table grew meanwhile");
}

#[test]
fn racing_removes_of_one_key_take_it_once() {
    let m = LiveMap::new();
    let taken = AtomicUsize::new(0);
    for round in 0..2000u64 {
        m.insert(ptr(round), c(0, round));
        std::thread::scope(|s| {
            for w in 0..2u64 {
                let (m, taken) = (&m, &taken);
                s.spawn(move || {
                    if m.remove(ptr(round)).is_some() {
                        taken.fetch_add(1, Relaxed);
                    }
                    // Each thread keeps allocating meanwhile, so tables grow and move.
                    m.insert(ptr((1 << 32) + round * 2 + w), c(1, 0));
                });
            }
        });
    }
    assert_eq!(taken.load(Relaxed), 2000);
    assert_eq!(m.matching(|_| true).len(), 4000);
}
