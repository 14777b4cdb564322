//! The pool's protocol with processes played by lock owners: a "kill" drops every
//! kernel lock of one owner, as the kernel does when a process dies.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use super::*;
use crate::budget::layout::{
    G_CAP, G_LOCK, G_TICKET, G_USED, G_WAITERS, G_WAITS, H_MAGIC, H_SLOTS_SEEN, H_VERSION,
    LOCK_WAITING, M_PENDING, M_USED, M_WAIT, SHARES_AT, STATE_EMPTY, STATE_LIVE, USED_BITS,
    check_slots, encode_cap, used_bytes, used_word,
};

mod context_flight;
mod join_hints;
mod join_pages;
mod marks;
mod member_count;
mod repair_shares;
mod resize;
mod share_set;
mod shares_in_pool;
mod short_path;
mod torn_reads;

/// Kernel locks of the slots, shared by all the "processes" of a test.
struct Kernel {
    owner: Mutex<[u32; MAX_SLOTS]>,
    /// Slots whose member's forked children still hold its device files.
    children: Mutex<Vec<usize>>,
}

impl Kernel {
    fn new() -> &'static Kernel {
        Box::leak(Box::new(Kernel {
            owner: Mutex::new([0; MAX_SLOTS]),
            children: Mutex::new(Vec::new()),
        }))
    }
    /// The process `id` dies: the kernel drops its locks.
    fn kill(&self, id: u32) {
        for o in self.owner.lock().unwrap().iter_mut() {
            if *o == id {
                *o = 0;
            }
        }
    }
}

/// One process's view of the kernel locks.
struct Proc {
    kernel: &'static Kernel,
    id: u32,
}

impl MemberLocks for Proc {
    fn try_take(&self, s: usize) -> bool {
        let mut o = self.kernel.owner.lock().unwrap();
        if o[s] == 0 {
            o[s] = self.id;
            true
        } else {
            false
        }
    }
    fn give_back(&self, s: usize) {
        let mut o = self.kernel.owner.lock().unwrap();
        if o[s] == self.id {
            o[s] = 0;
        }
    }
    fn held(&self, s: usize) -> bool {
        self.kernel.owner.lock().unwrap()[s] != 0
    }
    fn descendants_hold(&self, s: usize) -> bool {
        self.kernel.children.lock().unwrap().contains(&s)
    }
}

fn words() -> &'static [AtomicU64] {
    let v: Vec<AtomicU64> = (0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect();
    Box::leak(v.into_boxed_slice())
}

const GPU0: [u8; 16] = [7; 16];
const GPU1: [u8; 16] = [9; 16];

fn proc(kernel: &'static Kernel, id: u32) -> &'static Proc {
    Box::leak(Box::new(Proc { kernel, id }))
}

fn member(pool: Pool<'static>, p: &'static Proc, cap: Option<u64>) -> Box<Member<'static>> {
    let m = Member::join(
        pool,
        p,
        &MemberInfo {
            pid: p.id,
            command: format!("proc {}", p.id),
            ..Default::default()
        },
    )
    .unwrap();
    m.register_gpu(0, &GPU0, cap).unwrap();
    m
}

fn setup() -> (Pool<'static>, &'static Kernel) {
    (Pool::create(words(), 1, 1000).unwrap(), Kernel::new())
}

#[test]
fn members_share_one_cap() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    a.reserve(0, 600).unwrap();
    let r = b.reserve(0, 500).unwrap_err();
    assert_eq!((r.used, r.cap, r.own, r.requested), (600, 1000, 0, 500));
    b.reserve(0, 400).unwrap();
    assert_eq!(a.usage(0), Some((1000, Some(1000), 600)));
    assert_eq!(b.usage(0), Some((1000, Some(1000), 400)));
    a.credit(0, 600);
    b.reserve(0, 500).unwrap();
    assert_eq!(b.usage(0), Some((900, Some(1000), 900)));
    let v = pool.view(proc(k, 99));
    assert_eq!(v.gpus[0].used, 900);
    assert_eq!(v.gpus[0].peak, 1000);
    assert_eq!(v.gpus[0].refusals, 1);
    assert_eq!(v.members.len(), 2);
}

/// Each member's uid is kept beside its pid (a claim's or a container's pool has members
/// of several users, its file one owner), the pid read back whole whatever the uid, and
/// a dead member's pid still names it to the sweep.
#[test]
fn the_view_shows_each_members_own_uid_beside_its_pid() {
    let (pool, k) = setup();
    let join = |id: u32, uid: u32| {
        let info = MemberInfo {
            pid: id,
            uid,
            ..Default::default()
        };
        Member::join(pool, proc(k, id), &info).unwrap()
    };
    let (_a, _b, _c) = (join(4_194_303, 0), join(2, 65534), join(3, u32::MAX));
    let v = pool.view(proc(k, 99));
    let mut seen: Vec<(u32, Option<u32>)> = v.members.iter().map(|m| (m.pid, m.uid)).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (2, Some(65534)),
            (3, Some(u32::MAX - 1)),
            (4_194_303, Some(0))
        ]
    );
    assert_eq!(
        crate::budget::layout::word_uid(7),
        None,
        "a word without a uid says none"
    );
    assert_eq!(
        crate::budget::layout::word_pid(crate::budget::layout::pid_word(7, 1000)),
        7
    );
}

/// A member killed while its forked children hold its device files: the driver keeps
/// its memory until they are gone, so the pool does too, and a request it would serve
/// is refused meanwhile (not kept waiting: children may live for ever).
#[test]
fn a_dead_members_bytes_stay_while_its_children_hold_its_device_files() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    a.reserve(0, 600).unwrap();
    k.children.lock().unwrap().push(a.slot());
    k.kill(1);
    let start = std::time::Instant::now();
    let r = b.reserve(0, 500).unwrap_err();
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!((r.used, r.cap), (600, 1000));
    b.reserve(0, 400).unwrap();
    b.credit(0, 400);
    // The last child is gone (or exec'd): the bytes come back to the next request.
    k.children.lock().unwrap().clear();
    b.reserve(0, 900).unwrap();
    assert_eq!(b.usage(0), Some((900, Some(1000), 900)));
}

#[test]
fn a_device_not_registered_is_not_charged_to_the_pool() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(10));
    a.reserve(3, 1 << 40).unwrap();
    assert_eq!(a.usage(3), None);
}

#[test]
fn the_recent_least_context_measured_on_a_gpu_is_known_to_every_member() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    assert_eq!(b.context_bytes(0), 0, "none measured yet");
    a.note_context_bytes(0, 16, false);
    assert_eq!(b.context_bytes(0), 16);
    b.note_context_bytes(0, 40, false);
    assert_eq!(
        a.context_bytes(0),
        16,
        "an unsettled higher figure does not replace it"
    );
    b.note_context_bytes(0, 0, false);
    assert_eq!(a.context_bytes(0), 0, "0 is a figure, not 'none yet'");
    b.note_context_bytes(0, 40, true);
    assert_eq!(
        a.context_bytes(0),
        40,
        "a settled figure replaces it: a low one does not stay for good"
    );
    assert_eq!(a.context_bytes(1), 0, "a GPU the pool does not hold");
}

#[test]
fn every_gpu_has_its_own_budget() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(100));
    a.register_gpu(1, &GPU1, Some(50)).unwrap();
    // Another process sees the two GPUs in the other order (CUDA_VISIBLE_DEVICES=1,0).
    let b = Member::join(pool, proc(k, 2), &MemberInfo::default()).unwrap();
    b.register_gpu(0, &GPU1, Some(50)).unwrap();
    b.register_gpu(1, &GPU0, Some(100)).unwrap();
    a.reserve(1, 40).unwrap();
    assert!(b.reserve(0, 20).is_err(), "GPU1 has 10 bytes left");
    b.reserve(1, 100).unwrap();
    assert!(a.reserve(0, 1).is_err());
}

#[test]
fn members_must_agree_on_the_cap_while_any_lives() {
    let (pool, k) = setup();
    let pa = proc(k, 1);
    let a = member(pool, pa, Some(1000));
    let b = Member::join(pool, proc(k, 2), &MemberInfo::default()).unwrap();
    assert_eq!(
        b.register_gpu(0, &GPU0, Some(2000)),
        Err(CapMismatch::Differs {
            ours: Some(2000),
            pool: Some(1000)
        })
    );
    assert_eq!(
        b.register_gpu(0, &GPU0, None),
        Err(CapMismatch::Differs {
            ours: None,
            pool: Some(1000)
        })
    );
    // A refused registration charges nothing to the pool.
    b.reserve(0, 5000).unwrap();
    b.register_gpu(0, &GPU0, Some(1000)).unwrap();
    // Once no live member holds the old cap, a new one replaces it.
    a.leave();
    b.leave();
    let c = member(pool, proc(k, 3), Some(2000));
    assert_eq!(c.usage(0), Some((0, Some(2000), 0)));
    // Same when the last holder died instead of leaving.
    let pd = proc(k, 4);
    let _d = member(pool, pd, Some(2000));
    c.leave();
    k.kill(4);
    let e = member(pool, proc(k, 5), Some(3000));
    assert_eq!(e.usage(0).map(|u| u.1), Some(Some(3000)));
}

#[test]
fn a_dead_members_share_is_taken_back_by_the_next_allocation_that_needs_it() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    a.reserve(0, 800).unwrap();
    assert!(b.reserve(0, 500).is_err(), "A is alive: its 800 stay");
    k.kill(1);
    let v = pool.view(proc(k, 99));
    assert_eq!(v.gpus[0].held_by_dead, 800);
    assert!(!v.members.iter().find(|m| m.pid == 1).unwrap().alive);
    b.reserve(0, 500).unwrap();
    assert_eq!(b.usage(0), Some((500, Some(1000), 500)));
    let v = pool.view(proc(k, 99));
    assert_eq!(v.members.len(), 1, "the dead member's slot is empty again");
    assert_eq!(
        a.usage(0).map(|u| u.0),
        Some(500),
        "A's copy of the words sees B's use"
    );
}

#[test]
fn a_joiner_takes_back_dead_members() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    a.reserve(0, 700).unwrap();
    k.kill(1);
    // The new member reuses the dead one's slot (the first free lock) and sweeps.
    let b = member(pool, proc(k, 2), Some(1000));
    assert_eq!(b.slot(), a.slot());
    assert_eq!(b.usage(0), Some((0, Some(1000), 0)));
}

/// The steps of one change of a member's use (see `used`), in order: a reservation
/// adds to `pending`, swaps `used`, adds to its own use and takes `pending` back; a
/// credit adds to `pending`, takes its own use down, swaps `used` and takes `pending`
/// back.
const STEPS: usize = 4;

/// Plays member `m` changing its use on GPU entry 0 by `bytes` (a reservation if
/// `add`, else a credit): its steps `from..to`, as `Member::add` and `Member::sub` do.
fn play(
    pool: Pool<'static>,
    m: &Member<'static>,
    add: bool,
    bytes: u64,
    steps: std::ops::Range<usize>,
) {
    let w = pool.w;
    let g = m.entry_of(0).unwrap();
    let pending = w.member_gpu(m.slot(), g, M_PENDING);
    let own = w.member_gpu(m.slot(), g, M_USED);
    let used = w.gpu(g, G_USED);
    let swap = |delta: i64| {
        let word = used.load(SeqCst);
        let bytes = used_bytes(word).saturating_add_signed(delta);
        used.store(used_word(word, bytes), SeqCst);
    };
    for step in steps {
        match (add, step) {
            (_, 0) => drop(pending.fetch_add(bytes, SeqCst)),
            (true, 1) => swap(bytes as i64),
            (true, 2) => drop(own.fetch_add(bytes, SeqCst)),
            (false, 1) => drop(own.fetch_sub(bytes, SeqCst)),
            (false, 2) => swap(-(bytes as i64)),
            _ => drop(pending.fetch_sub(bytes, SeqCst)),
        }
    }
}

#[test]
fn a_member_killed_at_any_point_of_a_change_leaves_the_pool_consistent() {
    for add in [true, false] {
        for steps in 0..=STEPS {
            let (pool, k) = setup();
            let a = member(pool, proc(k, 1), Some(1000));
            let b = member(pool, proc(k, 2), Some(1000));
            a.reserve(0, 300).unwrap();
            b.reserve(0, 100).unwrap();
            play(pool, &a, add, 200, 0..steps);
            k.kill(1);
            // B is blocked by nothing, and gets all of A's share back.
            within_10s("reserving beside a killed member", move || {
                b.reserve(0, 900).unwrap();
                assert_eq!(
                    b.usage(0),
                    Some((1000, Some(1000), 1000)),
                    "after {steps} steps of a {}",
                    if add { "reservation" } else { "credit" }
                );
                b.credit(0, 1000);
                assert_eq!(b.usage(0), Some((0, Some(1000), 0)));
            });
        }
    }
}

#[test]
fn a_member_stopped_at_any_point_of_a_change_blocks_nobody_and_is_never_undercounted() {
    for add in [true, false] {
        for steps in 0..=STEPS {
            let (pool, k) = setup();
            let a = member(pool, proc(k, 1), Some(1000));
            let b = leak(member(pool, proc(k, 2), Some(1000)));
            a.reserve(0, 300).unwrap();
            // A is stopped inside a change of 200, alive, and holds the word lock too
            // (as if stopped in a recount).
            play(pool, &a, add, 200, 0..steps);
            let swapped = steps >= if add { 2 } else { 3 };
            let a_in_used = match (add, swapped) {
                (true, true) => 500,
                (true, false) | (false, false) => 300,
                (false, true) => 100,
            };
            assert_eq!(pool.w.used(0), a_in_used);
            // B's allocations take no lock: they go on while A is stopped.
            let lock = pool.w.gpu(0, G_LOCK);
            lock.store(a.slot() as u64 + 1, SeqCst);
            let room = 1000 - a_in_used;
            within_10s("reserving beside a stopped member", move || {
                b.reserve(0, room).unwrap();
                b.credit(0, room);
                b.reserve(0, room).unwrap();
            });
            lock.store(0, SeqCst);
            // A refusal recounts: never below what A's change left in `used`.
            assert!(b.reserve(0, 1).is_err(), "{add} {steps}");
            assert!(pool.w.used(0) >= a_in_used + room, "{add} {steps}");
            assert!(pool.w.used(0) <= 1000, "{add} {steps}");
            b.credit(0, room);
            // A goes on: its change completes, and then nothing is left in flight.
            let left = if add { 500 } else { 100 };
            play(pool, &a, add, 200, steps..STEPS);
            assert_eq!(a.usage(0).map(|u| u.2), Some(left));
            b.recount(0);
            assert_eq!(pool.w.used(0), left, "{add} {steps}");
        }
    }
}

#[test]
fn a_stopped_word_lock_holder_does_not_block_allocations_the_pool_can_take() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = leak(member(pool, proc(k, 2), Some(1000)));
    a.reserve(0, 100).unwrap();
    pool.w.gpu(0, G_LOCK).store(a.slot() as u64 + 1, SeqCst);
    within_10s(
        "allocating while another member holds the word lock",
        move || {
            for _ in 0..1000 {
                b.reserve(0, 900).unwrap();
                b.credit(0, 900);
            }
        },
    );
    assert_eq!(b.usage(0), Some((100, Some(1000), 0)));
}

#[test]
fn leaving_gives_everything_back_and_ignores_later_frees() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    a.reserve(0, 400).unwrap();
    b.reserve(0, 100).unwrap();
    a.leave();
    a.credit(0, 400); // an exit handler's free after the library's destructor
    assert_eq!(b.usage(0), Some((100, Some(1000), 100)));
    assert!(a.reserve(0, 1).unwrap_err().left);
}

#[test]
fn a_full_pool_refuses_to_join() {
    let (pool, k) = setup();
    for i in 0..DEFAULT_SLOTS {
        let _live = member(pool, proc(k, i as u32 + 1), None);
    }
    let extra = Member::join(pool, proc(k, 10_000), &MemberInfo::default());
    assert_eq!(
        extra.err(),
        Some(JoinError::Full {
            slots: DEFAULT_SLOTS,
            waited: std::time::Duration::ZERO
        })
    );
}

#[test]
fn threads_of_many_members_never_take_the_pool_over_its_cap() {
    let (pool, k) = setup();
    const CAP: u64 = 10_000;
    let members: Vec<Box<Member<'static>>> = (1..=6)
        .map(|i| member(pool, proc(k, i), Some(CAP)))
        .collect();
    let members: &'static [Box<Member<'static>>] = Box::leak(members.into_boxed_slice());
    let max_seen = &*Box::leak(Box::new(AtomicU64::new(0)));
    let mut threads = Vec::new();
    for (i, m) in members.iter().enumerate() {
        for t in 0..3u64 {
            threads.push(std::thread::spawn(move || {
                let mut seed = (i as u64 + 1) * 7919 + t;
                let mut held = Vec::new();
                for _ in 0..3000 {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if seed >> 62 != 0 || held.is_empty() {
                        let bytes = 1 + (seed >> 33) % 900;
                        if m.reserve(0, bytes).is_ok() {
                            held.push(bytes);
                            let (used, _, _) = m.usage(0).unwrap();
                            max_seen.fetch_max(used, SeqCst);
                        }
                    } else {
                        let b = held.swap_remove((seed >> 20) as usize % held.len());
                        m.credit(0, b);
                    }
                }
                for b in held {
                    m.credit(0, b);
                }
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(max_seen.load(SeqCst) <= CAP);
    assert!(
        max_seen.load(SeqCst) > CAP / 2,
        "the test made the members compete"
    );
    assert_eq!(members[0].usage(0).unwrap().0, 0, "every byte came back");
    let v = pool.view(proc(k, 99));
    assert!(v.members.iter().all(|m| m.gpus[0].used == 0));
    assert!(v.gpus[0].peak <= CAP);
}

#[test]
fn files_of_another_kind_are_clear_errors() {
    let w = words();
    w[H_MAGIC].store(u64::from_le_bytes(*b"\x01\x02HAMI\0\0"), SeqCst);
    let e = Pool::open(w).err().unwrap();
    assert!(matches!(e, LayoutError::Magic { .. }));
    assert!(e.to_string().contains("not a gpucap pool file"), "{e}");

    let w = words();
    Pool::create(w, 1, 0).unwrap();
    w[H_VERSION].store(POOL_VERSION + 1, SeqCst);
    let e = Pool::open(w).err().unwrap();
    assert_eq!(
        e,
        LayoutError::Version {
            found: POOL_VERSION + 1
        }
    );
    let named = format!("version {} pool file", POOL_VERSION + 1);
    assert!(e.to_string().contains(&named), "{e}");
    // A shorter file of another version is named as one, not as a short file.
    let e = Pool::open(&w[..SHARES_AT]).err().unwrap();
    assert_eq!(
        e,
        LayoutError::Version {
            found: POOL_VERSION + 1
        }
    );

    let w = words();
    Pool::create(w, 1, 0).unwrap();
    assert!(matches!(
        Pool::open(&w[..100]),
        Err(LayoutError::Size { bytes: 800, .. })
    ));

    let w = words();
    let pool = Pool::create(w, 1, 0).unwrap();
    pool.w.state(3).store(77, SeqCst);
    let e = Pool::open(w).err().unwrap();
    assert!(e.to_string().contains("member slot 3 has state 77"), "{e}");

    // A live member past the count of slots ever taken (the marks would skip it).
    let w = words();
    let pool = Pool::create(w, 1, 0).unwrap();
    pool.w.state(2).store(STATE_LIVE, SeqCst);
    pool.w.header(H_SLOTS_SEEN).store(2, SeqCst);
    let e = Pool::open(w).err().unwrap();
    assert!(
        e.to_string()
            .contains("member slot 2 is live but only 2 slots were ever taken"),
        "{e}"
    );
    pool.w.header(H_SLOTS_SEEN).store(3, SeqCst);
    assert!(Pool::open(w).is_ok());
    // A member that joined while the slots were read: the count was read (2) before it
    // took slot 2, raised the count and was marked live. Not a corrupted count: read
    // again, it says 3. (Read once, a process joining beside others would refuse to join.)
    assert!(check_slots(pool.w, 2).is_ok());
    pool.w.header(H_SLOTS_SEEN).store(2, SeqCst);
    let e = check_slots(pool.w, 2).unwrap_err();
    assert!(
        e.to_string()
            .contains("member slot 2 is live but only 2 slots were ever taken"),
        "{e}"
    );

    let w = words();
    let pool = Pool::create(w, 1, 0).unwrap();
    pool.w.gpu(0, G_USED).store(5, SeqCst);
    assert!(matches!(Pool::open(w), Err(LayoutError::Corrupt { .. })));

    let w = words();
    Pool::create(w, 1, 0).unwrap();
    assert!(Pool::open(w).is_ok());
    let zero = words();
    assert!(
        matches!(Pool::open(zero), Err(LayoutError::Magic { .. })),
        "an all-zero file"
    );
}

fn quiet(_: &WaitNote) {}

fn leak(m: Box<Member<'static>>) -> &'static Member<'static> {
    Box::leak(m)
}

#[test]
fn a_waiter_gets_the_memory_a_member_frees() {
    use std::time::{Duration, Instant};
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = leak(member(pool, proc(k, 2), Some(1000)).waiting(Duration::from_secs(10), quiet));
    a.reserve(0, 800).unwrap();
    let start = Instant::now();
    let t = std::thread::spawn(move || b.reserve(0, 500));
    // Freed once B waits (a loaded machine may start its thread late).
    while pool.w.gpu(0, G_WAITERS).load(SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "B never waited");
        std::thread::yield_now();
    }
    assert_eq!(b.usage(0).unwrap().2, 0, "still waiting");
    a.credit(0, 800);
    t.join().unwrap().unwrap();
    assert_eq!(b.usage(0), Some((500, Some(1000), 500)));
    let v = pool.view(proc(k, 99));
    assert_eq!(v.gpus[0].refusals, 0);
    assert_eq!(pool.w.gpu(0, G_WAITERS).load(SeqCst), 0);
    assert_eq!(pool.w.gpu(0, G_WAITS).load(SeqCst), 1);
}

#[test]
fn waiters_are_served_in_arrival_order() {
    use std::time::Duration;
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let big = leak(member(pool, proc(k, 2), Some(1000)).waiting(Duration::from_secs(10), quiet));
    let small = leak(member(pool, proc(k, 3), Some(1000)).waiting(Duration::from_secs(10), quiet));
    a.reserve(0, 800).unwrap();
    let waiters = |n| {
        let start = std::time::Instant::now();
        while pool.w.gpu(0, G_WAITERS).load(SeqCst) < n {
            assert!(start.elapsed() < Duration::from_secs(10), "not {n} waiting");
            std::thread::yield_now();
        }
    };
    let t1 = std::thread::spawn(move || big.reserve(0, 900));
    waiters(1);
    // 100 would fit now (800 + 100), but the big request came first: the small one
    // waits behind it.
    let t2 = std::thread::spawn(move || small.reserve(0, 100));
    waiters(2);
    assert_eq!(small.usage(0).unwrap().2, 0, "the small one queued");
    // Room for the big one alone (100 + 900): served first, the small one would have
    // left it short (100 + 100, then 900 more past the cap) until its wait ran out.
    a.credit(0, 700);
    t1.join()
        .unwrap()
        .expect("the big one, first in line, served");
    assert_eq!(small.usage(0).unwrap().2, 0, "the small one still waits");
    a.credit(0, 100);
    t2.join().unwrap().expect("the small one served next");
    assert_eq!(a.usage(0).unwrap().0, 1000);
}

#[test]
fn a_wait_times_out_with_nothing_left_behind() {
    use std::time::Duration;
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000)).waiting(Duration::from_millis(60), quiet);
    a.reserve(0, 800).unwrap();
    let r = b.reserve(0, 500).unwrap_err();
    assert!(r.waited_ms >= 60, "{r:?}");
    assert_eq!(pool.w.gpu(0, G_WAITERS).load(SeqCst), 0);
    assert_eq!(pool.w.member_gpu(b.slot(), 0, M_WAIT).load(SeqCst), 0);
    // More than the cap never waits.
    assert_eq!(b.reserve(0, 2000).unwrap_err().waited_ms, 0);
}

#[test]
fn a_killed_waiter_does_not_hold_up_the_queue() {
    use std::time::Duration;
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let dead = member(pool, proc(k, 2), Some(1000));
    let c = member(pool, proc(k, 3), Some(1000)).waiting(Duration::from_secs(10), quiet);
    a.reserve(0, 800).unwrap();
    // The dead member had taken ticket 1 when it was killed.
    pool.w.gpu(0, G_TICKET).store(1, SeqCst);
    pool.w.gpu(0, G_WAITERS).store(1, SeqCst);
    pool.w.member_gpu(dead.slot(), 0, M_WAIT).store(1, SeqCst);
    k.kill(2);
    // Nothing asked: never queued.
    c.reserve(0, 0).unwrap();
    assert_eq!(pool.w.gpu(0, G_WAITERS).load(SeqCst), 1);
    // C queues (a waiter exists) though 100 fits, finds the one ahead dead, and goes.
    c.reserve(0, 100).unwrap();
    assert_eq!(
        pool.w.gpu(0, G_WAITERS).load(SeqCst),
        0,
        "the dead ticket was taken back"
    );
    assert_eq!(c.usage(0).unwrap().0, 900);
}

/// Runs `f` on a thread and fails the test if it has not returned within 10 s (a spin
/// forever would otherwise hang the test run).
fn within_10s<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} did not return within 10 s"))
}

#[test]
fn a_word_lock_naming_an_empty_slot_is_freed_by_the_slots_next_owner() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    a.leave();
    // The file says slot 0 holds GPU entry 0's word lock (with someone asleep on it),
    // and has bytes in flight, though slot 0 is empty: no member can have left that.
    pool.w.gpu(0, G_LOCK).store(1 | LOCK_WAITING, SeqCst);
    pool.w.member_gpu(0, 0, M_PENDING).store(777, SeqCst);
    let b = within_10s("joining slot 0 and reserving", move || {
        let b = member(pool, proc(k, 2), Some(1000));
        b.reserve(0, 300).unwrap();
        b.recount(0);
        b
    });
    assert_eq!(b.slot(), 0, "the new member took the slot the word named");
    assert_eq!(
        b.usage(0),
        Some((300, Some(1000), 300)),
        "the bytes in flight were not counted"
    );
    assert_eq!(pool.w.gpu(0, G_LOCK).load(SeqCst), 0);
}

static LOCK_REPAIRS: AtomicU64 = AtomicU64::new(0);
fn count_lock_repairs(r: &Repair) {
    if matches!(r, Repair::Lock { .. }) {
        LOCK_REPAIRS.fetch_add(1, SeqCst);
    }
}

#[test]
fn a_word_lock_no_live_member_can_hold_is_freed_after_joining_too() {
    let (pool, k) = setup();
    let a: &'static Member<'static> =
        leak(member(pool, proc(k, 1), Some(1000)).on_repair(count_lock_repairs));
    a.reserve(0, 100).unwrap();
    // Written by another process while A is a member: A's own slot (A has no change in
    // flight), a slot past the last, and bits no lock word has. Found by the next
    // refusal (its recount takes the lock; a reservation that fits takes none).
    for word in [a.slot() as u64 + 1, MAX_SLOTS as u64 + 5, 1 << 40 | 2] {
        pool.w.gpu(0, G_LOCK).store(word, SeqCst);
        within_10s("reserving", move || a.reserve(0, 100).unwrap());
        within_10s("being refused", move || a.reserve(0, 5000).unwrap_err());
        assert_eq!(pool.w.gpu(0, G_LOCK).load(SeqCst), 0);
    }
    assert_eq!(a.usage(0), Some((400, Some(1000), 400)));
    assert_eq!(LOCK_REPAIRS.load(SeqCst), 3, "each repair is told");
}

/// Where a waiter can die inside its ticket step (`wait_for`, under the word lock).
#[derive(Clone, Copy, Debug)]
enum TicketCrash {
    LockTaken,
    Counted,
    TicketTaken,
    TicketWritten,
}

#[test]
fn a_waiter_killed_at_any_point_of_its_ticket_step_leaves_no_waiter_behind() {
    for crash in [
        TicketCrash::LockTaken,
        TicketCrash::Counted,
        TicketCrash::TicketTaken,
        TicketCrash::TicketWritten,
    ] {
        let (pool, k) = setup();
        let a = member(pool, proc(k, 1), Some(1000));
        let d = member(pool, proc(k, 2), Some(1000));
        let b = member(pool, proc(k, 3), Some(1000));
        a.reserve(0, 800).unwrap();
        // D plays wait_for's ticket step up to `crash`, then is killed.
        let (w, s) = (pool.w, d.slot());
        w.gpu(0, G_LOCK).store(s as u64 + 1, SeqCst);
        if crash as usize >= 1 {
            w.gpu(0, G_WAITERS).fetch_add(1, SeqCst);
        }
        if crash as usize >= 2 {
            w.gpu(0, G_TICKET).fetch_add(1, SeqCst);
        }
        if crash as usize >= 3 {
            w.member_gpu(s, 0, M_WAIT).store(1, SeqCst);
        }
        k.kill(2);
        // A reservation that fits takes no lock; the next one the pool cannot take
        // sweeps the dead holder first, which frees the lock and counts again.
        b.reserve(0, 100).unwrap();
        b.reserve(0, 300).unwrap_err();
        assert_eq!(w.gpu(0, G_LOCK).load(SeqCst), 0, "{crash:?}");
        let waiters = w.gpu(0, G_WAITERS).load(SeqCst);
        let tickets = (0..DEFAULT_SLOTS)
            .filter(|&s| w.state(s).load(SeqCst) == STATE_LIVE)
            .filter(|&s| w.member_gpu(s, 0, M_WAIT).load(SeqCst) != 0)
            .count() as u64;
        assert_eq!(
            waiters, tickets,
            "the count is the live slots' tickets, {crash:?}"
        );
        // Once D's slot is taken back, nobody waits.
        b.sweep();
        assert_eq!(w.gpu(0, G_WAITERS).load(SeqCst), 0, "{crash:?}");
        // A count no slot explains is also counted again by the next joiner.
        w.gpu(0, G_WAITERS).store(5, SeqCst);
        let _e = member(pool, proc(k, 4), Some(1000));
        assert_eq!(w.gpu(0, G_WAITERS).load(SeqCst), 0, "{crash:?}");
    }
}

static DRIFT_REPAIRS: AtomicU64 = AtomicU64::new(0);
fn count_drift_repairs(r: &Repair) {
    if matches!(r, Repair::Used { .. } | Repair::Cap { .. }) {
        DRIFT_REPAIRS.fetch_add(1, SeqCst);
    }
}

#[test]
fn a_used_word_another_process_zeroed_is_seen_and_recounted() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000)).on_repair(count_drift_repairs);
    a.reserve(0, 600).unwrap();
    b.reserve(0, 300).unwrap();
    assert_eq!(pool.view(proc(k, 99)).gpus[0].drift, 0);
    // Another process of the same user zeroes the pool's count.
    pool.w.gpu(0, G_USED).store(0, SeqCst);
    let v = pool.view(proc(k, 99));
    assert_eq!((v.gpus[0].members_hold, v.gpus[0].drift), (900, -900));
    // B's next request finds the count below its own share, recounts, and is refused:
    // 900 + 200 is over the cap.
    let r = b.reserve(0, 200).unwrap_err();
    assert_eq!((r.used, r.cap), (900, 1000));
    assert_eq!(DRIFT_REPAIRS.load(SeqCst), 1, "the recount is told once");
    assert_eq!(pool.view(proc(k, 99)).gpus[0].drift, 0);
    // Raised instead: the next refusal finds room after recounting.
    pool.w.gpu(0, G_USED).store(1000, SeqCst);
    assert_eq!(pool.view(proc(k, 99)).gpus[0].drift, 100);
    b.reserve(0, 100).unwrap();
    assert_eq!(b.usage(0), Some((1000, Some(1000), 400)));
    assert_eq!(DRIFT_REPAIRS.load(SeqCst), 2);
}

/// A credit takes its bytes off `used` in one add: off a word another process set below
/// what the member holds, the bytes stop at zero (never wrapped round to a huge use that
/// would refuse everybody) and the change is counted once, as a swap would.
#[test]
fn a_credit_off_a_used_word_set_too_low_stops_at_zero() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    a.reserve(0, 600).unwrap();
    let used = pool.w.gpu(0, G_USED);
    let count = |w: u64| w >> USED_BITS;
    // Another process writes 100 bytes, keeping the change count.
    let before = used.load(SeqCst);
    used.store(used_word(before, 100) - (1 << USED_BITS), SeqCst);
    let written = used.load(SeqCst);
    assert_eq!((used_bytes(written), count(written)), (100, count(before)));
    a.credit(0, 400);
    let after = used.load(SeqCst);
    assert_eq!(used_bytes(after), 0, "stopped at zero, not wrapped");
    assert_eq!(count(after), count(written) + 1, "one change");
    assert_eq!(a.usage(0), Some((0, Some(1000), 200)));
    // The usual credit: bytes down, one change.
    a.reserve(0, 300).unwrap();
    let before = used.load(SeqCst);
    a.credit(0, 100);
    let after = used.load(SeqCst);
    assert_eq!(
        (used_bytes(after), count(after)),
        (used_bytes(before) - 100, count(before) + 1)
    );
}

#[test]
fn a_cap_word_another_process_zeroed_uncaps_nobody() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    a.reserve(0, 600).unwrap();
    pool.w.gpu(0, G_CAP).store(0, SeqCst); // "not set yet"
    assert!(pool.view(proc(k, 99)).gpus[0].cap_drift);
    assert!(a.reserve(0, 500).is_err(), "the member keeps its own cap");
    assert_eq!(
        pool.w.gpu(0, G_CAP).load(SeqCst),
        encode_cap(Some(1000)),
        "the refusal wrote it back"
    );
    assert!(!pool.view(proc(k, 99)).gpus[0].cap_drift);
    // A joiner with another cap is refused though the word said "not set".
    pool.w.gpu(0, G_CAP).store(0, SeqCst);
    let b = Member::join(pool, proc(k, 2), &MemberInfo::default()).unwrap();
    assert_eq!(
        b.register_gpu(0, &GPU0, None),
        Err(CapMismatch::Differs {
            ours: None,
            pool: Some(1000)
        })
    );
}

#[test]
fn the_view_shows_who_holds_a_word_lock_and_since_when_others_wait() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = leak(member(pool, proc(k, 2), Some(1000)));
    assert_eq!(pool.view(proc(k, 99)).gpus[0].lock, None);
    // A holds the word lock (as if stopped inside a recount); B's request, which the
    // pool cannot take, recounts before it is refused, and so blocks on it.
    a.reserve(0, 995).unwrap();
    pool.w.gpu(0, G_LOCK).store(a.slot() as u64 + 1, SeqCst);
    let t = std::thread::spawn(move || b.reserve(0, 10));
    let start = std::time::Instant::now();
    let lock = loop {
        let l = pool.view(proc(k, 99)).gpus[0].lock.clone().unwrap();
        if l.since_ms.is_some() || start.elapsed().as_secs() > 10 {
            break l;
        }
        std::thread::yield_now();
    };
    assert_eq!((lock.slot, lock.pid), (a.slot(), 1));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(lock.since_ms.unwrap().abs_diff(now) < 10_000, "{lock:?}");
    assert_ne!(
        pool.w.gpu(0, G_LOCK).load(SeqCst) & LOCK_WAITING,
        0,
        "B sleeps on it"
    );
    // A's release wakes B.
    let word = pool.w.gpu(0, G_LOCK).swap(0, SeqCst);
    assert_ne!(word & LOCK_WAITING, 0);
    t.join().unwrap().unwrap_err();
    assert_eq!(pool.view(proc(k, 99)).gpus[0].lock, None);
}

#[test]
fn a_live_members_bytes_count_though_its_state_word_was_cleared() {
    let (pool, k) = setup();
    let a = member(pool, proc(k, 1), Some(1000));
    let b = member(pool, proc(k, 2), Some(1000));
    a.reserve(0, 600).unwrap();
    // Another process marks A's slot empty and zeroes `used`: the next refusal's
    // recount still counts A's 600 (A holds its slot's kernel lock).
    pool.w.state(a.slot()).store(STATE_EMPTY, SeqCst);
    pool.w.gpu(0, G_USED).store(0, SeqCst);
    assert_eq!(pool.view(proc(k, 99)).gpus[0].drift, -600);
    b.reserve(0, 300).unwrap();
    assert_eq!(b.reserve(0, 800).unwrap_err().used, 900);
    assert_eq!(pool.view(proc(k, 99)).gpus[0].drift, 0);
}
