//! A pool's member count, chosen when its file is made (`GPUCAP_POOL_MEMBERS`): every
//! slot of a file of more than 256 members can be joined and holds a guarantee the
//! others see, a joiner past the count is refused naming it, or waits for a slot
//! (`GPUCAP_WAIT`); a file of another version is refused.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use super::*;
use crate::budget::layout::H_VERSION;
use crate::budget::shares::check;

fn words_of(slots: usize) -> &'static [AtomicU64] {
    let v: Vec<AtomicU64> = (0..pool_words(slots)).map(|_| AtomicU64::new(0)).collect();
    Box::leak(v.into_boxed_slice())
}

fn pool_of(slots: usize) -> (Pool<'static>, &'static Kernel) {
    let w = words_of(slots);
    Pool::create_with(w, slots, 1, 1000).unwrap();
    (Pool::open(w).unwrap(), Kernel::new())
}

#[test]
fn a_pool_of_1000_members_takes_1000_and_names_its_count_past_them() {
    let (pool, k) = pool_of(1000);
    assert_eq!(pool.slots(), 1000);
    assert_eq!(pool.version(), POOL_VERSION);
    let members: Vec<Box<Member<'static>>> = (1..=1000)
        .map(|id| member(pool, proc(k, id), Some(1 << 20)))
        .collect();
    assert_eq!(members.last().unwrap().slot(), 999);
    for m in &members {
        m.reserve(0, 1000).unwrap();
    }
    assert_eq!(pool.w.used(0), 1000 * 1000);
    let e = Member::join(pool, proc(k, 2000), &MemberInfo::default())
        .err()
        .unwrap();
    let text = e.to_string();
    assert!(
        text.contains("the pool has 1000 live members already"),
        "{text}"
    );
    assert!(
        text.contains("GPUCAP_POOL_MEMBERS") && text.contains("GPUCAP_WAIT"),
        "{text}"
    );
    // One dies: its slot (past 256) is taken back and taken.
    k.kill(700);
    let m = member(pool, proc(k, 2001), Some(1 << 20));
    assert_eq!(m.slot(), 699);
    assert_eq!(pool.w.used(0), 999 * 1000);
    assert_eq!(pool.view(proc(k, 1)).slots, 1000);
}

#[test]
fn a_guarantee_held_past_slot_256_is_kept_from_the_others() {
    let (pool, k) = pool_of(600);
    let ms: Vec<Box<Member<'static>>> = (1..=600)
        .map(|id| member(pool, proc(k, id), Some(1000)))
        .collect();
    let last = &ms[599];
    last.claim(0, check(Some(1000), 400, None).unwrap())
        .unwrap();
    assert!(pool.w.share_bits(0, 599 / 64).load(SeqCst) & 1 << (599 % 64) != 0);
    // The others may take 600 at most: the short path sees the bit and says so.
    assert_eq!(ms[0].try_reserve(0, 601), None);
    assert!(ms[0].reserve(0, 601).is_err());
    assert!(ms[0].reserve(0, 600).is_ok());
    assert!(last.reserve(0, 400).is_ok(), "its guarantee was kept");
}

#[test]
fn a_joiner_past_the_count_waits_for_a_slot_and_is_served_when_one_leaves() {
    let (pool, k) = pool_of(3);
    let ms: Vec<Box<Member<'static>>> = (1..=3).map(|id| member(pool, proc(k, id), None)).collect();
    let start = Instant::now();
    let e = Member::join_waiting(
        pool,
        proc(k, 9),
        &MemberInfo::default(),
        Duration::from_millis(120),
    )
    .err()
    .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(120));
    assert!(e.to_string().contains("no slot freed within"), "{e}");
    std::thread::scope(|t| {
        let waiter = t.spawn(|| {
            Member::join_waiting(
                pool,
                proc(k, 10),
                &MemberInfo::default(),
                Duration::from_secs(20),
            )
            .map(|m| m.slot())
        });
        std::thread::sleep(Duration::from_millis(100));
        ms[1].leave();
        assert_eq!(waiter.join().unwrap(), Ok(1));
    });
}

#[test]
fn a_file_of_the_version_before_is_refused_naming_both_versions() {
    let w = words_of(256);
    Pool::create(w, 1, 0).unwrap();
    w[H_VERSION].store(POOL_VERSION - 1, SeqCst);
    let e = Pool::open(w).err().unwrap();
    assert_eq!(
        e,
        LayoutError::Version {
            found: POOL_VERSION - 1
        }
    );
    let said = e.to_string();
    assert!(
        said.contains(&format!("version {} pool file", POOL_VERSION - 1))
            && said.contains(&format!("reads version {POOL_VERSION}")),
        "{said}"
    );
    // A length that is not the header's count's.
    let w = words_of(300);
    Pool::create_with(w, 300, 1, 0).unwrap();
    assert!(matches!(
        Pool::open(&w[..pool_words(299)]),
        Err(LayoutError::Size { .. })
    ));
    assert_eq!(pool_file_bytes(DEFAULT_SLOTS), POOL_FILE_BYTES);
}
