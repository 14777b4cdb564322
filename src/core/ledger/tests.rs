#[cfg(test)]
mod pool_tests {
    //! The ledger with a pool: both charged, both rolled back. (The pool's own protocol
    //! is tested in `budget`.)

    use std::sync::atomic::AtomicU64;
    use std::sync::{Mutex, OnceLock};

    use crate::budget::{MemberInfo, MemberLocks, POOL_WORDS, Pool};
    use crate::ledger::{Charge, Ledger, Member, POOL_GENERATIONS, Refusal};

    /// The kernel's slot locks, shared by the test's "processes" (owner ids).
    static OWNERS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

    struct Proc(u32);

    impl MemberLocks for Proc {
        fn try_take(&self, s: usize) -> bool {
            let mut o = OWNERS.lock().unwrap();
            if o.len() <= s {
                o.resize(s + 1, 0);
            }
            if o[s] == 0 {
                o[s] = self.0;
                true
            } else {
                false
            }
        }
        fn give_back(&self, s: usize) {
            let mut o = OWNERS.lock().unwrap();
            if o.get(s) == Some(&self.0) {
                o[s] = 0;
            }
        }
        fn held(&self, s: usize) -> bool {
            OWNERS.lock().unwrap().get(s).is_some_and(|&o| o != 0)
        }
    }

    static MEMBER: OnceLock<Member<'static>> = OnceLock::new();

    /// A pool of one GPU capped at 1,000 bytes, in words of its own.
    fn pool_of_1000() -> Pool<'static> {
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        Pool::create(words, 1, 0).unwrap()
    }

    /// Member `id` of `pool`, GPU 0 registered at its 1,000-byte cap.
    fn joined(pool: Pool<'static>, id: u32) -> Box<Member<'static>> {
        let locks: &'static Proc = Box::leak(Box::new(Proc(id)));
        let m = Member::join(pool, locks, &MemberInfo::default()).unwrap();
        m.register_gpu(0, &[7; 16], Some(1000)).unwrap();
        m
    }

    static GUARDED: OnceLock<Member<'static>> = OnceLock::new();

    #[test]
    fn the_check_for_a_call_made_again_keeps_another_members_guarantee() {
        let pool = pool_of_1000();
        let join = |id: u32| joined(pool, id);
        let holder = join(1);
        let share = crate::budget::shares::check(Some(1000), 600, None).unwrap();
        holder.claim(0, share).unwrap();
        let _ = GUARDED.set(*join(2));
        let ledger = Ledger::new();
        ledger.set_cap(0, Some(1000));
        assert!(ledger.set_pool(GUARDED.get().unwrap()));
        // The pool's cap alone has room for 500; the holder's unused 600 is kept for it.
        assert!(
            !ledger.would_refuse(0, 500),
            "the plain check leaves guarantees out"
        );
        assert!(
            ledger.would_refuse_here(0, 500),
            "400 left beside the guarantee"
        );
        assert!(!ledger.would_refuse_here(0, 400));
        // As the reservation decides; the checks counted nothing.
        assert_eq!(ledger.usage(0).unwrap().refusals, 0);
        assert!(ledger.reserve(0, 500).is_err());
        ledger.reserve(0, 400).unwrap().commit(1);
        let c = ledger.take(1).unwrap();
        ledger.settle(c);
        // A process whose own cap is below the pool's room (set before a resize raised
        // the pool's): the reservation goes past it, and so does the check.
        ledger.set_cap(0, Some(300));
        assert!(
            ledger.would_refuse(0, 350),
            "the plain check stops at the own cap"
        );
        assert!(!ledger.would_refuse_here(0, 350));
        let r = ledger.reserve(0, 350).unwrap();
        drop(r);
    }

    #[test]
    fn a_ledger_in_a_pool_charges_both_and_rolls_both_back() {
        let pool = pool_of_1000();
        let join = |id: u32| joined(pool, id);
        let other = join(1);
        let _ = MEMBER.set(*join(2));
        let ledger = Ledger::new();
        ledger.set_cap(0, Some(1000));
        other.reserve(0, 300).unwrap();
        // Before the process says it joined, the pool is not asked.
        ledger.reserve(0, 900).unwrap().commit(1);
        assert_eq!(other.usage(0).unwrap().0, 300);
        let c = ledger.take(1).unwrap();
        ledger.settle(c);
        assert!(ledger.set_pool(MEMBER.get().unwrap()));
        // The check without effect sees the pool's room (700), not only the process's
        // own (1000), and counts nothing (the pool's count is checked below).
        assert!(ledger.would_refuse(0, 800), "700 left in the pool");
        assert!(!ledger.would_refuse(0, 700));
        let r = ledger.reserve(0, 800).err().unwrap();
        assert!(
            matches!(r, Refusal::Pool(p) if p.used == 300 && p.cap == 1000),
            "{r:?}"
        );
        assert_eq!(
            ledger.usage(0).unwrap().used,
            0,
            "the process's own figures rolled back"
        );
        let held = ledger.reserve(0, 600).unwrap();
        assert_eq!(other.usage(0).unwrap().0, 900);
        drop(held); // the driver failed: both roll back
        assert_eq!(other.usage(0).unwrap().0, 300);
        ledger.reserve(0, 700).unwrap().commit(2);
        let c = ledger.take(2).unwrap();
        ledger.settle(c);
        assert_eq!(
            (other.usage(0).unwrap().0, ledger.usage(0).unwrap().used),
            (300, 0)
        );
        // A request past the process's own cap is the pool's to decide (a resize may
        // have raised the pool's since this process set its own): refused by the pool
        // here, counted there and here.
        let before = pool.view(&Proc(3)).gpus[0].refusals;
        assert_eq!(before, 1, "the pool's own refusal above");
        let r = ledger.reserve(0, 1500).err().unwrap();
        assert!(matches!(r, Refusal::Pool(_)), "{r:?}");
        assert_eq!(ledger.usage(0).unwrap().used, 0, "rolled back");
        let g = &pool.view(&Proc(3)).gpus[0];
        assert_eq!((g.refusals, g.largest_refused), (2, 1500));
        assert_eq!(ledger.usage(0).unwrap().refusals, 2);

        // A free is announced to the pool before the driver call (a member measuring a
        // context sees it in flight), withdrawn if the driver refused, credited to both
        // once it freed.
        ledger.reserve(0, 400).unwrap().commit(3);
        let t = other.traffic(0).unwrap();
        let start = t.freed_before();
        let c = ledger.take(3).unwrap();
        let f = ledger.announce(c);
        assert_eq!(t.given_back_since(&t.freed_before()), 400, "in flight");
        ledger.withdraw(f);
        ledger.restore(3, c);
        let figures = || (other.usage(0).unwrap().0, ledger.usage(0).unwrap().used);
        assert_eq!(figures(), (700, 400));
        let c = ledger.take(3).unwrap();
        let f = ledger.announce(c);
        ledger.settle_announced(f);
        assert_eq!(figures(), (300, 0));

        // Memory the driver already took (a launch's kernels) is charged to both without
        // a check: the pool stands past its cap, every request is refused until it is
        // given back.
        ledger.charge_past_cap(0, 900);
        assert_eq!(figures(), (1200, 900));
        assert!(other.reserve(0, 1).is_err(), "the pool is past its cap");
        assert!(ledger.reserve(0, 50).is_err());
        assert!(ledger.try_reserve(0, 50).is_none());
        ledger.settle(Charge {
            device: 0,
            bytes: 900,
        });
        assert_eq!(figures(), (300, 0));
        assert_eq!(
            t.given_back_since(&t.freed_before()),
            0,
            "nothing in flight"
        );
        assert_eq!(t.given_back_since(&start), 800, "both announcements");

        // An allocation is marked started when reserved and made when committed (kept
        // too); one rolled back, or shrunk, is not made for what it gave back.
        let taken = |f: &dyn Fn()| {
            let first = t.made_inside();
            f();
            t.taken_since(&first)
        };
        assert_eq!(taken(&|| ledger.reserve(0, 100).unwrap().commit(5)), 100);
        assert_eq!(taken(&|| ledger.try_reserve(0, 50).unwrap().keep()), 50);
        assert_eq!(taken(&|| drop(ledger.reserve(0, 70).unwrap())), 0);
        assert_eq!(
            taken(&|| ledger.reserve(0, 70).unwrap().commit_unbacked(6)),
            0
        );
        assert_eq!(
            taken(&|| {
                let mut r = ledger.reserve(0, 300).unwrap();
                ledger.resize(&mut r, 200).unwrap();
                r.commit(7);
            }),
            200
        );
        // A charge held above what the call was seen taking (a raised stack the driver
        // took 40 of 120 for, charged at its 120): made only for the 40. Kept whole, the
        // other member's window took off 120 the driver never allocated in it.
        assert_eq!(
            taken(&|| ledger.reserve(0, 120).unwrap().keep_backed(40)),
            40
        );
        assert_eq!(
            ledger.usage(0).unwrap().used,
            100 + 50 + 70 + 200 + 120,
            "all charged"
        );
        let first = t.made_inside();
        let r = ledger.reserve(0, 10).unwrap();
        let inside = t.made_inside();
        r.commit(8);
        assert_eq!(t.taken_since(&inside), 0, "in flight");
        assert_eq!(t.taken_since(&first), 10);
    }

    /// A member's words, in a pool of its own.
    fn lone_member(id: u32) -> &'static Member<'static> {
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        let pool = Pool::create(words, 1, 0).unwrap();
        let locks: &'static Proc = Box::leak(Box::new(Proc(id)));
        let m = Member::join(pool, locks, &MemberInfo::default()).unwrap();
        m.register_gpu(0, &[7; 16], Some(1000)).unwrap();
        Box::leak(Box::new(m))
    }

    /// In a pool a member may pass its own cap where the pool's rule allows (a pool
    /// resized since it set its own), but never the ceiling handed down to it.
    #[test]
    fn a_pool_member_passes_its_own_cap_by_the_pools_rule_never_its_ceiling() {
        let pool = lone_member(21);
        let l = Ledger::new();
        l.set_cap(0, Some(200));
        l.set_ceiling(0, Some(300));
        assert_eq!(l.ceiling(0), Some(300));
        assert!(l.set_pool(pool));
        l.reserve(0, 250).unwrap().commit(1);
        match l.reserve(0, 100) {
            Err(Refusal::OverCap {
                requested: 100,
                used: 250,
                cap: 300,
            }) => {}
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("served past the ceiling"),
        }
        assert_eq!(pool.usage(0).unwrap().0, 250, "the pool not charged");
        assert_eq!(l.usage(0).unwrap().used, 250);
        l.reserve(0, 50).unwrap().commit(2);
        // Without a ceiling the pool's rule alone decides.
        let free = lone_member(22);
        let l = Ledger::new();
        l.set_cap(0, Some(200));
        assert_eq!(l.ceiling(0), None);
        assert!(l.set_pool(free));
        l.reserve(0, 600).unwrap().commit(1);
        assert_eq!(free.usage(0).unwrap().0, 600);
    }

    #[test]
    fn a_forked_child_s_ledger_charges_no_pool_until_it_joined_its_own() {
        let parent = lone_member(11);
        let l = Ledger::new();
        l.set_cap(0, Some(1000));
        l.orphan_pool();
        drop(
            l.try_reserve(0, 1)
                .expect("outside a pool: nothing to orphan"),
        );
        assert!(l.set_pool(parent));
        l.try_reserve(0, 100).unwrap().commit(1);
        assert_eq!(parent.usage(0).unwrap().0, 100);
        // Forked: the parent's membership is not the child's.
        l.orphan_pool();
        assert!(
            l.try_reserve(0, 1).is_none(),
            "a pool member without its membership takes the full path"
        );
        assert_eq!(l.usage(0).unwrap().used, 100, "its own figure rolled back");
        l.reserve(0, 50).unwrap().commit(2);
        let c = l.take(1).unwrap();
        l.settle(c);
        assert_eq!(
            parent.usage(0).unwrap().0,
            100,
            "the parent's pool untouched"
        );
        // Joined as its own member: charged there.
        let child = lone_member(12);
        assert!(l.set_pool(child));
        l.try_reserve(0, 200).unwrap().commit(3);
        assert_eq!(child.usage(0).unwrap().0, 200);
        assert_eq!(parent.usage(0).unwrap().0, 100);
        // As many generations as the ledger keeps, then no more.
        for g in 2..POOL_GENERATIONS {
            assert!(l.set_pool(lone_member(11 + g as u32)), "generation {g}");
        }
        assert!(!l.set_pool(lone_member(40)), "one generation too many");
        assert!(l.set_pool(child), "a membership it keeps already");
    }
}

#[cfg(test)]
mod alone {
    //! The ledger of a process capped alone (no pool).
    use crate::config::MAX_DEVICES;
    use crate::ledger::{Charge, Ledger, Refusal};

    fn ledger_with_cap(cap: u64) -> Ledger {
        let l = Ledger::new();
        l.set_cap(0, Some(cap));
        l
    }

    #[test]
    fn a_forced_charge_may_pass_the_cap_and_refuses_everything_until_credited() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 600).unwrap().commit(1);
        l.charge_past_cap(0, 500);
        let u = l.usage(0).unwrap();
        assert_eq!((u.used, u.peak), (1100, 1100));
        assert!(l.reserve(0, 1).is_err() && l.try_reserve(0, 1).is_none());
        l.settle(Charge {
            device: 0,
            bytes: 500,
        });
        l.reserve(0, 400).unwrap().commit(2);
        assert_eq!(l.usage(0).unwrap().used, 1000);
        l.charge_past_cap(9, 1); // no such device: nothing
    }

    #[test]
    fn a_forced_figure_near_the_top_of_u64_saturates_never_wraps_round() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 600).unwrap().commit(1);
        l.charge_past_cap(0, u64::MAX);
        let u = l.usage(0).unwrap();
        assert_eq!(
            (u.used, u.peak),
            (u64::MAX, u64::MAX),
            "wrapped to {}",
            u.used
        );
        assert!(
            l.reserve(0, 1).is_err(),
            "a wrapped figure would have uncapped it"
        );
    }

    #[test]
    fn reserve_within_cap_and_refuse_over_it() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 600).unwrap().commit(1);
        assert!(l.would_refuse(0, 500) && !l.would_refuse(0, 400));
        assert_eq!(
            l.usage(0).unwrap().refusals,
            0,
            "the check counts no refusal"
        );
        let r = l.reserve(0, 500);
        assert_eq!(
            r.err(),
            Some(Refusal::OverCap {
                requested: 500,
                used: 600,
                cap: 1000
            })
        );
        l.reserve(0, 400).unwrap().commit(2);
        let u = l.usage(0).unwrap();
        assert_eq!(
            (u.used, u.peak, u.allocs, u.refusals, u.largest_refused),
            (1000, 1000, 2, 1, 500)
        );
        assert_eq!(u.headroom(), 0);
        assert_eq!(l.headroom(0), 0);
        assert_eq!(Ledger::new().headroom(0), u64::MAX, "no cap: unbounded");
        assert_eq!(l.headroom(MAX_DEVICES), 0, "no such device: nothing");
    }

    #[test]
    fn the_short_path_reserves_like_the_full_one_but_counts_no_refusal() {
        let l = ledger_with_cap(1000);
        l.try_reserve(0, 600).unwrap().commit(1);
        assert!(l.try_reserve(0, 500).is_none(), "over the cap");
        let u = l.usage(0).unwrap();
        assert_eq!((u.used, u.peak, u.allocs, u.refusals), (600, 600, 1, 0));
        drop(l.try_reserve(0, 400).unwrap()); // the driver failed: rolled back
        assert_eq!(l.usage(0).unwrap().used, 600);
        assert!(l.try_reserve(MAX_DEVICES, 1).is_none());
        assert!(
            Ledger::new().try_reserve(0, u64::MAX).is_some(),
            "no cap: anything that does not wrap"
        );
        assert!(ledger_with_cap(10).try_reserve(0, 11).is_none());
    }

    #[test]
    fn allocations_counted_from_many_threads_add_up() {
        let l = Ledger::new();
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        l.count_alloc(3);
                    }
                });
            }
        });
        assert_eq!(l.usage(3).unwrap().allocs, 60_000);
        assert_eq!(l.usage(2).unwrap().allocs, 0);
    }

    #[test]
    fn a_credit_twice_never_goes_below_zero() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 300).unwrap().commit(1);
        let c = l.take(1).unwrap();
        l.settle(c);
        l.settle(c);
        assert_eq!(l.usage(0).unwrap().used, 0);
        l.reserve(0, 1000).unwrap().commit(2);
    }

    #[test]
    fn dropped_reservation_rolls_back() {
        let l = ledger_with_cap(1000);
        {
            let _r = l.reserve(0, 700).unwrap();
            assert_eq!(l.usage(0).unwrap().used, 700);
        }
        assert_eq!(l.usage(0).unwrap().used, 0);
        assert_eq!(l.usage(0).unwrap().allocs, 0);
        // The peak remembers the transient reservation: it did hold the bytes.
        assert_eq!(l.usage(0).unwrap().peak, 700);
    }

    #[test]
    fn outside_a_pool_an_announced_free_is_a_plain_credit() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 300).unwrap().commit(1);
        let c = l.take(1).unwrap();
        l.withdraw(l.announce(c));
        assert_eq!(l.usage(0).unwrap().used, 300, "refused: still charged");
        l.settle_announced(l.announce(c));
        assert_eq!(l.usage(0).unwrap().used, 0);
    }

    #[test]
    fn free_takes_then_settles_or_restores() {
        let l = ledger_with_cap(1000);
        l.reserve(0, 300).unwrap().commit(0xdead);
        let c = l.take(0xdead).unwrap();
        assert_eq!(l.take(0xdead), None, "a second take finds nothing");
        l.restore(0xdead, c);
        assert_eq!(l.usage(0).unwrap().used, 300, "restore keeps the charge");
        let c = l.take(0xdead).unwrap();
        l.settle(c);
        assert_eq!(l.usage(0).unwrap().used, 0);
    }

    #[test]
    fn kept_bytes_stay_charged_without_an_entry() {
        let l = ledger_with_cap(100);
        l.reserve(0, 60).unwrap().keep();
        l.count_alloc(0);
        let u = l.usage(0).unwrap();
        assert_eq!((u.used, u.allocs), (60, 1));
        assert!(l.reserve(0, 50).is_err());
    }

    #[test]
    fn live_on_lists_one_device() {
        let l = Ledger::new();
        l.reserve(0, 10).unwrap().commit(1);
        l.reserve(1, 20).unwrap().commit(2);
        assert_eq!(
            l.live_on(1),
            vec![(
                2,
                Charge {
                    device: 1,
                    bytes: 20
                }
            )]
        );
        assert!(l.live_on(2).is_empty());
    }

    #[test]
    fn no_wrap_near_u64_max() {
        let l = Ledger::new(); // no cap at all
        l.reserve(0, 100).unwrap().commit(1);
        assert!(matches!(
            l.reserve(0, u64::MAX - 50),
            Err(Refusal::OverCap { .. })
        ));
        assert!(matches!(
            l.reserve(0, u64::MAX),
            Err(Refusal::OverCap { .. })
        ));
        assert_eq!(l.usage(0).unwrap().used, 100);
        let capped = ledger_with_cap(1 << 30);
        assert!(capped.reserve(0, u64::MAX - 4095).is_err());
        assert_eq!(capped.usage(0).unwrap().used, 0);
    }

    #[test]
    fn zero_bytes_is_a_valid_reservation() {
        let l = ledger_with_cap(10);
        l.reserve(0, 10).unwrap().commit(1);
        assert!(l.reserve(0, 0).is_ok());
    }

    #[test]
    fn out_of_range_device_is_refused() {
        let l = Ledger::new();
        assert_eq!(
            l.reserve(MAX_DEVICES, 1).err(),
            Some(Refusal::NoSuchDevice {
                device: MAX_DEVICES
            })
        );
        assert!(l.usage(MAX_DEVICES).is_none());
    }

    #[test]
    fn devices_are_independent() {
        let l = Ledger::new();
        l.set_cap(0, Some(100));
        l.set_cap(1, Some(1000));
        assert!(l.reserve(0, 500).is_err());
        l.reserve(1, 500).unwrap().commit(1);
        assert_eq!(l.usage(0).unwrap().used, 0);
        assert_eq!(l.usage(1).unwrap().used, 500);
    }

    #[test]
    fn resize_grows_within_cap_and_shrinks() {
        let l = ledger_with_cap(1000);
        let mut r = l.reserve(0, 400).unwrap();
        l.resize(&mut r, 900).unwrap();
        assert_eq!(l.usage(0).unwrap().used, 900);
        assert!(l.resize(&mut r, 1100).is_err());
        assert_eq!(l.usage(0).unwrap().used, 900);
        l.resize(&mut r, 300).unwrap();
        assert_eq!(l.usage(0).unwrap().used, 300);
        drop(r);
        assert_eq!(l.usage(0).unwrap().used, 0);
    }

    #[test]
    fn concurrent_reservations_never_exceed_cap() {
        let l = ledger_with_cap(10_000);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let l = &l;
                s.spawn(move || {
                    // Each thread holds up to 8 allocations (about 12 000 bytes on
                    // average) before freeing them: over the cap even without
                    // another thread, so refusals happen however the threads run.
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7919 + t * 104_729) % 3000;
                        if let Ok(r) = l.reserve(0, size) {
                            let key = (t << 32) | i;
                            r.commit(key);
                            held.push(key);
                            assert!(l.usage(0).unwrap().used <= 10_000);
                        }
                        if held.len() == 8 || i % 8 == 7 {
                            for key in held.drain(..) {
                                let c = l.take(key).unwrap();
                                l.settle(c);
                            }
                        }
                    }
                    for key in held {
                        let c = l.take(key).unwrap();
                        l.settle(c);
                    }
                });
            }
        });
        let u = l.usage(0).unwrap();
        assert_eq!(u.used, 0);
        assert!(u.peak <= 10_000);
        assert!(u.refusals > 0, "the test must contend for the cap");
    }
}
