//! The context book's measurements, against a fake driver.

use super::taken as taken_bytes;
use super::*;
use crate::budget::{MAX_SLOTS, Member, MemberInfo, MemberLocks, POOL_WORDS, Pool};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

/// A device with `free` bytes; each live context takes `per_ctx` (creating one
/// without room fails with out-of-memory). Contexts live in `live`, by handle, with
/// an id that is never reused.
struct Fake {
    free: Cell<u64>,
    per_ctx: u64,
    next: Cell<Ctx>,
    log: RefCell<Vec<String>>,
    active: Cell<bool>,
    live: RefCell<BTreeMap<Ctx, u64>>,
    /// Error of cuMemGetInfo_v2 from the n-th query on (0: never).
    fail_free_from: Cell<usize>,
    queries: Cell<usize>,
    /// Whether `exists` can tell.
    can_tell: bool,
    /// Whether the free memory can be read without a context (NVML); the n-th
    /// such read from which it fails (0: never).
    nvml: bool,
    fail_nvml_from: Cell<usize>,
    nvml_reads: Cell<usize>,
    /// Runs inside the first NVML read (as NVML loads).
    on_first_nvml: RefCell<Option<Box<dyn FnOnce()>>>,
    /// Run inside the next reads of the free memory, one each (a member's traffic
    /// falling inside a read: the thread preempted there).
    during_reads: RefCell<std::collections::VecDeque<Box<dyn FnOnce()>>>,
    /// Called inside every read of the free memory, before its figure is taken (true)
    /// and after (false); a read whose first call returns true fails.
    around_reads: RefCell<Option<AroundReads>>,
}

/// See `Fake::around_reads`.
type AroundReads = Box<dyn Fn(bool) -> bool>;

impl Fake {
    fn new(free: u64, per_ctx: u64) -> Fake {
        Fake {
            free: Cell::new(free),
            per_ctx,
            next: Cell::new(100),
            log: RefCell::default(),
            active: Cell::new(false),
            live: RefCell::default(),
            fail_free_from: Cell::new(0),
            queries: Cell::new(0),
            can_tell: true,
            nvml: false,
            fail_nvml_from: Cell::new(0),
            nvml_reads: Cell::new(0),
            on_first_nvml: RefCell::default(),
            during_reads: RefCell::default(),
            around_reads: RefCell::default(),
        }
    }
    /// `around_reads` at `before` the figure (true: the read fails).
    fn around(&self, before: bool) -> bool {
        self.around_reads
            .borrow()
            .as_ref()
            .is_some_and(|f| f(before))
    }
    /// Runs the next of `during_reads`, if any.
    fn inside_read(&self) {
        let next = self.during_reads.borrow_mut().pop_front();
        if let Some(f) = next {
            f();
        }
    }
    /// What the program's own create call does: OOM without room.
    fn make(&self) -> Result<Ctx, u32> {
        if self.free.get() < self.per_ctx {
            return Err(OUT_OF_MEMORY);
        }
        self.free.set(self.free.get() - self.per_ctx);
        self.next.set(self.next.get() + 1);
        let c = self.next.get();
        self.live.borrow_mut().insert(c, c * 7);
        Ok(c)
    }
    fn call(&self) -> u32 {
        match self.make() {
            Ok(_) => SUCCESS,
            Err(rc) => rc,
        }
    }
    fn drop_ctx(&self, ctx: Ctx) {
        if self.live.borrow_mut().remove(&ctx).is_some() {
            self.free.set(self.free.get() + self.per_ctx);
        }
    }
}

impl CtxDriver for Fake {
    fn free_with(&self, ctx: Ctx) -> Result<u64, u32> {
        self.log.borrow_mut().push(format!("free@{ctx}"));
        self.queries.set(self.queries.get() + 1);
        self.inside_read();
        let from = self.fail_free_from.get();
        if self.around(true) || from != 0 && self.queries.get() >= from {
            return Err(201);
        }
        let free = self.free.get();
        self.around(false);
        Ok(free)
    }
    fn free_without_context(&self, device: usize) -> Result<u64, String> {
        if !self.nvml {
            return Err("no NVML here".into());
        }
        self.log.borrow_mut().push(format!("nvml@{device}"));
        self.nvml_reads.set(self.nvml_reads.get() + 1);
        let first = self.on_first_nvml.borrow_mut().take();
        match first {
            Some(f) => f(),
            None => self.inside_read(),
        }
        let from = self.fail_nvml_from.get();
        if self.around(true) || from != 0 && self.nvml_reads.get() >= from {
            return Err("NVML failed".into());
        }
        let free = self.free.get();
        self.around(false);
        Ok(free)
    }
    fn create_floating(&self, _device: usize) -> Result<Ctx, u32> {
        let c = self.make()?;
        self.log.borrow_mut().push(format!("temp {c}"));
        Ok(c)
    }
    fn destroy(&self, ctx: Ctx) {
        self.drop_ctx(ctx);
        self.log.borrow_mut().push(format!("destroy {ctx}"));
    }
    fn primary_active(&self, _device: usize) -> Option<bool> {
        Some(self.active.get())
    }
    fn id(&self, ctx: Ctx) -> Option<u64> {
        self.live.borrow().get(&ctx).copied()
    }
    fn exists(&self, ctx: Ctx, id: Option<u64>) -> Option<bool> {
        if !self.can_tell {
            return None;
        }
        Some(
            self.id(ctx)
                .is_some_and(|now| id.is_none_or(|was| was == now)),
        )
    }
}

fn made(drv: &Fake) -> Ctx {
    drv.next.get()
}

#[test]
fn a_call_in_a_given_context_is_measured_there_not_with_nvml_or_a_temporary() {
    // A module loaded in context 55, one the book never saw (made outside the shim):
    // its memory is read with 55 pushed, even where NVML is there.
    let book = ContextCharges::new();
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    let lock = book.lock(0).unwrap();
    let (rc, taken, how) = lock.measure(&drv, Some(55), None, || {
        drv.free.set(drv.free.get() - 2048);
        SUCCESS
    });
    assert_eq!((rc, taken, how), (SUCCESS, Ok(2048), MeasuredBy::Context));
    assert_eq!(*drv.log.borrow(), ["free@55", "free@55"]);
    assert!(drv.live.borrow().is_empty(), "no temporary context");
}

#[test]
fn first_context_is_measured_with_nvml_and_no_other_context() {
    let book = ContextCharges::new();
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    let mut lock = book.lock(2).unwrap();
    let mut calls = 0;
    let (rc, taken, how) = measure(&lock, &drv, || {
        calls += 1;
        drv.call()
    });
    assert_eq!((rc, taken, how), (SUCCESS, Ok(300), MeasuredBy::Nvml));
    assert_eq!(calls, 1);
    assert_eq!(*drv.log.borrow(), ["nvml@2", "nvml@2"]);
    assert_eq!(drv.live.borrow().len(), 1, "no context but the program's");
    // The next one is measured from the first (cuMemGetInfo_v2), not NVML.
    let ctx = made(&drv);
    lock.set_primary(ctx, 300);
    drv.log.borrow_mut().clear();
    let (_, taken, how) = measure(&lock, &drv, || drv.call());
    assert_eq!((taken, how), (Ok(300), MeasuredBy::Context));
    assert_eq!(
        *drv.log.borrow(),
        [format!("free@{ctx}"), format!("free@{ctx}")]
    );
}

#[test]
fn a_created_context_is_measured_with_while_the_book_holds_it_on_its_device() {
    let book = ContextCharges::new();
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    let c = drv.make().unwrap();
    book.lock(1).unwrap().add_created(c, 300);
    // Another device's context is no vantage here: NVML.
    let (_, _, how) = measure(&book.lock(0).unwrap(), &drv, || drv.call());
    assert_eq!(how, MeasuredBy::Nvml);
    let mut lock = book.lock(1).unwrap();
    let (_, taken, how) = measure(&lock, &drv, || drv.call());
    assert_eq!((taken, how), (Ok(300), MeasuredBy::Context));
    // Being destroyed, then the driver refused: the book holds it again, and it is
    // measured with again.
    let charge = lock.take_created(c).unwrap();
    drv.log.borrow_mut().clear();
    let (_, _, how) = measure(&lock, &drv, || drv.call());
    assert_eq!(how, MeasuredBy::Nvml);
    lock.restore_created(c, charge);
    drv.log.borrow_mut().clear();
    let (_, _, how) = measure(&lock, &drv, || drv.call());
    assert_eq!(how, MeasuredBy::Context);
    assert_eq!(
        *drv.log.borrow(),
        [format!("free@{c}"), format!("free@{c}")]
    );
    // Gone for good (a detach of its last reference): none again.
    drv.drop_ctx(c);
    assert!(matches!(
        lock.after_release(&drv, c, None),
        Ending::Gone(Some(_))
    ));
    let (_, _, how) = measure(&lock, &drv, || drv.call());
    assert_eq!(how, MeasuredBy::Nvml);
}

#[test]
fn a_devices_contexts_are_its_primary_first_then_those_created_on_it() {
    let book = ContextCharges::new();
    assert!(book.lock(0).unwrap().contexts().is_empty());
    let mut lock = book.lock(0).unwrap();
    lock.add_created(7, 100);
    lock.set_primary(3, 300);
    drop(lock);
    book.lock(1).unwrap().add_created(9, 100);
    assert_eq!(book.lock(0).unwrap().contexts(), [3, 7]);
    assert_eq!(book.lock(1).unwrap().contexts(), [9]);
    let mut lock = book.lock(0).unwrap();
    lock.take_created(7).unwrap();
    assert_eq!(lock.contexts(), [3]);
}

/// Slot locks for the members of one test's pool (a "process" per id).
struct Locks {
    owner: &'static std::sync::Mutex<Vec<u32>>,
    id: u32,
}

impl MemberLocks for Locks {
    fn try_take(&self, s: usize) -> bool {
        let mut o = self.owner.lock().unwrap();
        (o[s] == 0).then(|| o[s] = self.id).is_some()
    }
    fn give_back(&self, s: usize) {
        let mut o = self.owner.lock().unwrap();
        if o[s] == self.id {
            o[s] = 0;
        }
    }
    fn held(&self, s: usize) -> bool {
        self.owner.lock().unwrap()[s] != 0
    }
}

/// `n` members of a fresh pool, each with GPU 0 registered (cap 1 MB), and the
/// slot owners (zero an owner to kill it).
fn members(
    n: u32,
) -> (
    Vec<Box<Member<'static>>>,
    &'static std::sync::Mutex<Vec<u32>>,
) {
    let words: &'static [AtomicU64] =
        Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
    let pool = Pool::create(words, 1, 0).unwrap();
    let owner = Box::leak(Box::new(std::sync::Mutex::new(vec![0u32; MAX_SLOTS])));
    let all = (1..=n)
        .map(|id| {
            let locks = Box::leak(Box::new(Locks { owner, id }));
            let m = Member::join(pool, locks, &MemberInfo::default()).unwrap();
            m.register_gpu(0, &[7; 16], Some(1_000_000)).unwrap();
            m
        })
        .collect();
    (all, owner)
}

/// A pool member's context is measured by `a`, its window bracketed by the
/// pool's free marks.
fn in_pool(
    a: &Member<'static>,
    drv: &Fake,
    call: impl FnMut() -> u32,
) -> (u32, Result<u64, Unmeasured>, MeasuredBy) {
    let book = ContextCharges::new();
    let lock = book.lock(0).unwrap();
    let (rc, taken, how) = lock.measure(drv, None, a.traffic(0), call);
    (rc, taken.map(taken_bytes), how)
}

/// Another member's free whose driver call falls inside the window and whose credit
/// comes after it: added back (the pool's `used` did not go down in the window).
#[test]
fn a_free_credited_after_the_window_does_not_make_a_context_short() {
    let (m, _) = members(2);
    let (a, b) = (&m[0], &m[1]);
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    b.reserve(0, 500).unwrap();
    let (rc, taken, _) = in_pool(a, &drv, || {
        assert!(b.announce_free(0, 200));
        drv.free.set(drv.free.get() + 200); // B's driver free
        drv.call()
    });
    b.complete_free(0, 200);
    assert_eq!((rc, taken), (SUCCESS, Ok(300)));
    assert_eq!(b.usage(0), Some((300, Some(1_000_000), 300)));

    // Announced before the window, freed by the driver inside it, credited after.
    assert!(b.announce_free(0, 100));
    let (_, taken, _) = in_pool(a, &drv, || {
        drv.free.set(drv.free.get() + 100);
        drv.call()
    });
    b.complete_free(0, 100);
    assert_eq!(taken, Ok(300));
}

/// A reservation inside the window whose driver allocation comes after it does not
/// hide another member's free made inside it (a net change of `used` would: +700
/// - 200 is no decrease). What the other members allocate in the window is left in.
#[test]
fn a_reservation_in_the_window_does_not_hide_another_members_free() {
    let (m, _) = members(3);
    let (a, b, c) = (&m[0], &m[1], &m[2]);
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    b.reserve(0, 500).unwrap();
    let (rc, taken, _) = in_pool(a, &drv, || {
        c.reserve(0, 700).unwrap(); // C's driver allocation comes after the window
        assert!(b.announce_free(0, 200));
        drv.free.set(drv.free.get() + 200);
        b.complete_free(0, 200);
        drv.call()
    });
    assert_eq!((rc, taken), (SUCCESS, Ok(300)));
    // An allocation made inside the window is left in: charged more, never less.
    let (_, taken, _) = in_pool(a, &drv, || {
        c.reserve(0, 50).unwrap();
        drv.free.set(drv.free.get() - 50);
        drv.call()
    });
    assert_eq!(taken, Ok(350));
    // Without a pool the same traffic is counted (nothing can tell it apart).
    let book = ContextCharges::new();
    let (_, taken, _) = measure(&book.lock(1).unwrap(), &drv, || {
        drv.free.set(drv.free.get() + 200);
        drv.call()
    });
    assert_eq!(taken, Ok(100));
}

/// Member `m` allocates `bytes` as the hooks do: reserved, marked started, the
/// driver (the fake's free memory), marked made.
fn allocate(m: &Member<'static>, drv: &Fake, bytes: u64) {
    m.reserve(0, bytes).unwrap();
    assert!(m.alloc_started(0, bytes));
    drv.free.set(drv.free.get() - bytes);
    m.alloc_ended(0, bytes, true);
}

/// ...and frees them: announced, the driver, credited.
fn free(m: &Member<'static>, drv: &Fake, bytes: u64) {
    assert!(m.announce_free(0, bytes));
    drv.free.set(drv.free.get() + bytes);
    m.complete_free(0, bytes);
}

/// A member that frees and allocates again inside the window (a churning
/// allocator) leaves the context's charge as it is: each of its frees is added back,
/// each of its allocations taken off (a charge of the frees alone was seen at 1.67
/// GiB for a 16 MiB context under `pool::thirty_two_members...`).
#[test]
fn a_member_churning_inside_the_window_leaves_the_charge_as_it_is() {
    let (m, _) = members(2);
    let (a, b) = (&m[0], &m[1]);
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    allocate(b, &drv, 800);
    let (rc, taken, _) = in_pool(a, &drv, || {
        for _ in 0..10 {
            free(b, &drv, 800);
            allocate(b, &drv, 800);
        }
        free(b, &drv, 800);
        drv.call()
    });
    assert_eq!((rc, taken), (SUCCESS, Ok(300)));
    assert_eq!(b.usage(0).map(|u| u.2), Some(0));
}

/// What each device read runs inside it, in turn.
type Reads = Vec<Box<dyn FnOnce()>>;

/// A 300-byte context measured by the first of two members of a fresh pool, the second
/// doing what `prepare` does (before, and inside each device read, in turn: its answer),
/// with NVML (its load's read first) and with a context of the process: never charged
/// more or less than 300.
fn context_beside(prepare: fn(&'static Member<'static>, &'static Fake) -> Reads) {
    for nvml in [true, false] {
        let m: &'static [Box<Member<'static>>] = Box::leak(members(2).0.into_boxed_slice());
        let mut fake = Fake::new(10_000, 300);
        fake.nvml = nvml;
        let drv: &'static Fake = Box::leak(Box::new(fake));
        let book = ContextCharges::new();
        let lock = book.lock(0).unwrap();
        let vantage = (!nvml).then(|| drv.make().unwrap());
        let inside = prepare(&m[1], drv);
        let mut reads = drv.during_reads.borrow_mut();
        // With NVML its first read is the load's: a read before the window.
        if nvml {
            reads.push_back(Box::new(|| {}));
        }
        reads.extend(inside);
        drop(reads);
        let (rc, taken, _) = lock.measure(drv, vantage, m[0].traffic(0), || drv.call());
        assert_eq!(
            (rc, taken.map(taken_bytes)),
            (SUCCESS, Ok(300)),
            "nvml {nvml}"
        );
    }
}

/// A member's traffic that falls inside a device read (the measuring thread preempted
/// there: on a loaded machine, milliseconds of a churning pool's allocations and frees)
/// cannot be placed on either side of it: its frees would be added back and its
/// allocations left in. A read the traffic moved during is made again, so each side of the
/// window is a read nothing fell in (before: a 300-byte context beside a member churning
/// 800 bytes at a time was charged 300 + 800 for each read the churn fell in; a 64 MiB
/// context was measured at up to 7.7 GiB beside six churning members, and refused under a
/// 1 GiB cap with 408 MiB in use). With NVML and with a context of the process alike.
#[test]
fn traffic_inside_a_read_is_read_again_never_charged() {
    context_beside(|b, drv| {
        allocate(b, drv, 800);
        let churn = || -> Box<dyn FnOnce()> {
            Box::new(|| {
                free(b, drv, 800);
                allocate(b, drv, 800);
            })
        };
        // The first two "before" reads and the first "after" read.
        vec![churn(), churn(), Box::new(|| {}), churn()]
    });
}

/// The measuring member's own reservation for the call (a context's or a stack's expected
/// bytes, reserved before the window and marked started in its slot until the call is
/// charged) is not an allocation in flight: the member's own threads' allocations made
/// inside the window are taken off as any member's. Counted in flight, it cancelled them
/// up to its bytes, and the call was charged them (a 396 MiB stack reserved first was
/// charged up to 516 MiB beside the member's own churn).
#[test]
fn the_measuring_members_own_reservation_is_not_traffic_in_flight() {
    let (m, _) = members(2);
    let a = &m[0];
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    // The call's expected bytes, reserved and marked started before the window.
    a.reserve(0, 300).unwrap();
    assert!(a.alloc_started(0, 300));
    let book = ContextCharges::new();
    let lock = book.lock(0).unwrap();
    let (rc, taken, _) = lock.measure(&drv, None, a.traffic(0).map(|t| t.holding(300)), || {
        // Another thread of A allocates 200 bytes inside the window.
        allocate(a, &drv, 200);
        drv.call()
    });
    assert_eq!((rc, taken.map(taken_bytes)), (SUCCESS, Ok(300)));
}

/// The window starts after NVML is loaded (its first read, milliseconds on a real
/// GPU): what the members give back while it loads is not added back.
#[test]
fn frees_while_nvml_loads_are_outside_the_window() {
    let m: &'static [Box<Member<'static>>] = Box::leak(members(2).0.into_boxed_slice());
    let mut fake = Fake::new(10_000, 300);
    fake.nvml = true;
    let drv: &'static Fake = Box::leak(Box::new(fake));
    allocate(&m[1], drv, 800);
    *drv.on_first_nvml.borrow_mut() = Some(Box::new(|| free(&m[1], drv, 800)));
    let (rc, taken, how) = in_pool(&m[0], drv, || drv.call());
    assert_eq!((rc, taken, how), (SUCCESS, Ok(300), MeasuredBy::Nvml));
    assert_eq!(drv.nvml_reads.get(), 3, "read again once loaded");
}

/// Only allocations surely made inside the window are taken off: one whose driver
/// call came before it (marked made inside it), one whose driver call comes after it,
/// and one the driver refused are not.
#[test]
fn allocations_not_surely_inside_the_window_are_never_taken_off() {
    let (m, _) = members(3);
    let (a, b, c) = (&m[0], &m[1], &m[2]);
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    // Reserved, started and allocated before the window, marked made inside it.
    b.reserve(0, 200).unwrap();
    assert!(b.alloc_started(0, 200));
    drv.free.set(drv.free.get() - 200);
    let (_, taken, _) = in_pool(a, &drv, || {
        b.alloc_ended(0, 200, true);
        // Started inside, allocated by the driver after the window.
        c.reserve(0, 100).unwrap();
        assert!(c.alloc_started(0, 100));
        // Started and refused inside.
        c.reserve(0, 50).unwrap();
        assert!(c.alloc_started(0, 50));
        c.alloc_ended(0, 50, false);
        drv.call()
    });
    assert_eq!(taken, Ok(300));
    drv.free.set(drv.free.get() - 100);
    c.alloc_ended(0, 100, true);
    // Words that cannot be (`made` ahead of `started`: another process wrote them):
    // nothing of that slot is taken off.
    c.alloc_ended(0, 1_000, true);
    let (_, taken, _) = in_pool(a, &drv, || {
        c.reserve(0, 40).unwrap();
        assert!(c.alloc_started(0, 40));
        drv.free.set(drv.free.get() - 40);
        c.alloc_ended(0, 40, true);
        drv.call()
    });
    assert_eq!(taken, Ok(340));
}

/// A free the driver refused still counts (more, never less); a free announced by a
/// member that then died is not added back to later contexts (its slot is not held),
/// and is cleared when its share is taken back; a failed call charges nothing.
#[test]
fn withdrawn_and_dead_members_announcements() {
    let (m, owner) = members(3);
    let (a, b, c) = (&m[0], &m[1], &m[2]);
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    b.reserve(0, 500).unwrap();
    let (_, taken, _) = in_pool(a, &drv, || {
        assert!(b.announce_free(0, 200));
        b.withdraw_free(0, 200);
        drv.call()
    });
    assert_eq!(taken, Ok(500));
    assert!(b.announce_free(0, 400));
    owner.lock().unwrap()[b.slot()] = 0; // B dies inside its free
    let (_, taken, _) = in_pool(a, &drv, || drv.call());
    assert_eq!(
        taken,
        Ok(300),
        "a dead member's announcement is not counted"
    );
    assert_eq!(c.sweep(), 1);
    assert_eq!(a.usage(0).map(|u| u.0), Some(0), "its share taken back");
    let (rc, taken, _) = in_pool(a, &drv, || {
        assert!(c.announce_free(0, 100));
        999
    });
    assert_eq!((rc, taken), (999, Ok(0)));
}

/// With NVML, a device with room for exactly one context gets it, measured.
#[test]
fn with_nvml_room_for_one_context_is_enough() {
    let book = ContextCharges::new();
    let mut drv = Fake::new(500, 300);
    drv.nvml = true;
    let lock = book.lock(0).unwrap();
    let (rc, taken, how) = measure(&lock, &drv, || drv.call());
    assert_eq!((rc, taken, how), (SUCCESS, Ok(300), MeasuredBy::Nvml));
    // A call that fails reads NVML once and charges nothing.
    drv.log.borrow_mut().clear();
    let (rc, taken, _) = measure(&lock, &drv, || 999);
    assert_eq!((rc, taken), (999, Ok(0)));
    assert_eq!(*drv.log.borrow(), ["nvml@0"]);
}

#[test]
fn nvml_failing_after_the_call_is_never_a_charge_of_zero() {
    let book = ContextCharges::new();
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    drv.fail_nvml_from.set(2);
    let lock = book.lock(0).unwrap();
    let (rc, taken, how) = measure(&lock, &drv, || drv.call());
    assert_eq!((rc, how), (SUCCESS, MeasuredBy::Nvml));
    let why = taken.unwrap_err();
    assert_eq!(
        why,
        Unmeasured {
            step: Step::DeviceFreeAfter,
            rc: UNKNOWN
        }
    );
    assert!(why.to_string().contains("NVML"), "{why}");
    assert_eq!(verdict(taken, true), Verdict::Refuse(UNKNOWN));
}

#[test]
fn without_nvml_the_first_context_is_measured_with_a_temporary_one() {
    let book = ContextCharges::new();
    let drv = Fake::new(10_000, 300);
    let mut lock = book.lock(0).unwrap();
    assert!(!lock.primary_active(&drv));
    let (rc, taken, how) = measure(&lock, &drv, || drv.call());
    assert_eq!(how, MeasuredBy::Temporary("no NVML here".into()));
    let ctx = made(&drv);
    assert_eq!((rc, taken), (SUCCESS, Ok(300)));
    assert_eq!(
        *drv.log.borrow(),
        ["temp 101", "free@101", "free@101", "destroy 101"]
    );
    lock.set_primary(ctx, 300);
    assert!(lock.primary_active(&drv));
    // The next context is measured from the primary: no temporary one.
    drv.log.borrow_mut().clear();
    let (_, taken, _) = measure(&lock, &drv, || drv.call());
    let c2 = made(&drv);
    assert_eq!(taken, Ok(300));
    assert_eq!(
        *drv.log.borrow(),
        [format!("free@{ctx}"), format!("free@{ctx}")]
    );
    lock.add_created(c2, 300);
    assert_eq!(book.created_device(c2), Some(0));
    assert_eq!(
        lock.take_primary(),
        Some(Charge {
            device: 0,
            bytes: 300
        })
    );
    assert_eq!(lock.take_primary(), None);
    // With the primary gone, the created context is the vantage.
    drv.log.borrow_mut().clear();
    let _ = measure(&lock, &drv, || drv.call());
    assert_eq!(drv.log.borrow()[0], format!("free@{c2}"));
    assert_eq!(
        lock.take_created(c2),
        Some(Charge {
            device: 0,
            bytes: 300
        })
    );
    assert_eq!(book.created_device(c2), None);
}

#[test]
fn nvml_failing_before_the_call_falls_back_to_a_temporary_context() {
    let book = ContextCharges::new();
    let mut drv = Fake::new(10_000, 300);
    drv.nvml = true;
    drv.fail_nvml_from.set(1);
    let lock = book.lock(0).unwrap();
    let (rc, taken, how) = measure(&lock, &drv, || drv.call());
    assert_eq!(
        (rc, taken, how),
        (
            SUCCESS,
            Ok(300),
            MeasuredBy::Temporary("NVML failed".into())
        )
    );
    assert_eq!(
        *drv.log.borrow(),
        ["nvml@0", "temp 101", "free@101", "free@101", "destroy 101"]
    );
}

#[test]
fn a_failed_call_leaves_nothing_behind() {
    let book = ContextCharges::new();
    let drv = Fake::new(10_000, 300);
    let lock = book.lock(3).unwrap();
    let (rc, _, _) = measure(&lock, &drv, || 999);
    assert_eq!(rc, 999);
    assert_eq!(
        drv.free.get(),
        10_000,
        "the temporary context was destroyed"
    );
    assert!(book.lock(MAX_DEVICES).is_none());
}

#[test]
fn memory_given_back_meanwhile_never_makes_a_negative_charge() {
    let book = ContextCharges::new();
    let drv = Fake::new(10_000, 0);
    let lock = book.lock(0).unwrap();
    let (_, taken, _) = measure(&lock, &drv, || {
        drv.free.set(20_000);
        SUCCESS
    });
    assert_eq!(taken, Ok(0));
}

#[test]
fn room_for_one_context_only_the_call_is_made_without_the_temporary_one() {
    let book = ContextCharges::new();
    let drv = Fake::new(500, 300);
    let lock = book.lock(0).unwrap();
    let mut calls = 0;
    let (rc, taken, _) = measure(&lock, &drv, || {
        calls += 1;
        drv.call()
    });
    assert_eq!(rc, SUCCESS, "the device has room for the program's context");
    assert_eq!(calls, 2);
    assert_eq!(
        drv.live.borrow().len(),
        1,
        "only the program's context is left"
    );
    let why = taken.unwrap_err();
    assert_eq!(
        why,
        Unmeasured {
            step: Step::NoRoom,
            rc: OUT_OF_MEMORY
        }
    );
    assert!(
        why.to_string()
            .contains("no room for the temporary context"),
        "{why}"
    );
    assert_eq!(verdict(taken, true), Verdict::Refuse(OUT_OF_MEMORY));
    assert_eq!(verdict(taken, false), Verdict::Uncounted);
    assert_eq!(verdict(Ok(300), true), Verdict::Charge(300));

    // No room at all: the temporary context fails, so does the call.
    let drv = Fake::new(100, 300);
    let (rc, taken, _) = measure(&lock, &drv, || drv.call());
    assert_eq!(rc, OUT_OF_MEMORY);
    assert_eq!(taken.unwrap_err().step, Step::Temporary);
}

#[test]
fn a_query_that_fails_is_never_a_charge_of_zero() {
    let book = ContextCharges::new();
    for (from, step) in [(1, Step::FreeBefore), (2, Step::FreeAfter)] {
        let drv = Fake::new(10_000, 300);
        drv.fail_free_from.set(from);
        let lock = book.lock(1).unwrap();
        let (rc, taken, _) = measure(&lock, &drv, || drv.call());
        assert_eq!(rc, SUCCESS);
        assert_eq!(taken, Err(Unmeasured { step, rc: 201 }));
        assert_eq!(verdict(taken, true), Verdict::Refuse(201));
        assert!(taken.unwrap_err().to_string().contains("error 201"));
        assert_eq!(drv.live.borrow().len(), 1, "the temporary context is gone");
    }
}

#[test]
fn a_detach_credits_only_when_the_driver_says_the_context_is_gone() {
    let book = ContextCharges::new();
    let drv = Fake::new(10_000, 300);
    let mut lock = book.lock(0).unwrap();
    let ctx = drv.make().unwrap();
    lock.add_created(ctx, 300);
    let id = drv.id(ctx);
    // Another reference holds it.
    assert_eq!(lock.after_release(&drv, ctx, id), Ending::Alive);
    assert_eq!(book.created_device(ctx), Some(0));
    // The last reference went: the driver no longer knows it.
    drv.drop_ctx(ctx);
    assert_eq!(
        lock.after_release(&drv, ctx, id),
        Ending::Gone(Some(Charge {
            device: 0,
            bytes: 300
        }))
    );
    assert_eq!(book.created_device(ctx), None);
    // A handle the driver gave to a new context is not the old one.
    drv.live.borrow_mut().insert(ctx, 1);
    assert_eq!(lock.after_release(&drv, ctx, id), Ending::Gone(None));

    // The primary context: its state says.
    let p = drv.make().unwrap();
    lock.set_primary(p, 300);
    drv.active.set(true);
    assert_eq!(lock.after_release(&drv, p, drv.id(p)), Ending::Alive);
    drv.active.set(false);
    assert_eq!(
        lock.after_release(&drv, p, drv.id(p)),
        Ending::Gone(Some(Charge {
            device: 0,
            bytes: 300
        }))
    );

    // A driver that cannot say: the charge is kept.
    let mut mute = Fake::new(10_000, 300);
    mute.can_tell = false;
    let c = mute.make().unwrap();
    lock.add_created(c, 300);
    mute.drop_ctx(c);
    assert_eq!(lock.after_release(&mute, c, None), Ending::Unknown);
    assert_eq!(book.created_device(c), Some(0));
}

#[test]
fn the_next_context_is_expected_to_take_the_least_a_context_took_on_its_device() {
    let book = ContextCharges::new();
    assert_eq!(book.lock(1).unwrap().expected(), 0, "nothing measured yet");
    book.lock(1).unwrap().learn(16 << 20);
    assert_eq!(book.lock(1).unwrap().expected(), 16 << 20);
    assert_eq!(book.lock(0).unwrap().expected(), 0, "per device");
    book.lock(1).unwrap().learn(8 << 20);
    assert_eq!(book.lock(1).unwrap().expected(), 8 << 20, "a lower one");
    // One measured high (others' frees counted in) does not become what the next
    // context reserves first.
    book.lock(1).unwrap().learn(2400 << 20);
    assert_eq!(
        book.lock(1).unwrap().expected(),
        8 << 20,
        "the least measured"
    );
    // Beside a pool: the least of this process's and the pool's.
    assert_eq!(book.lock(1).unwrap().expected_beside(0), 8 << 20);
    assert_eq!(book.lock(1).unwrap().expected_beside(6 << 20), 6 << 20);
    assert_eq!(book.lock(1).unwrap().expected_beside(9 << 20), 8 << 20);
    assert_eq!(book.lock(0).unwrap().expected_beside(300 << 20), 300 << 20);
}

#[test]
fn a_measurement_that_erred_low_is_forgotten_zero_included() {
    let book = ContextCharges::new();
    book.lock(0).unwrap().learn(300 << 20);
    assert!(!book.lock(0).unwrap().expectation_settled());
    // Others' allocations outside the pool inside the window: measured at 0.
    book.lock(0).unwrap().learn(0);
    assert_eq!(
        book.lock(0).unwrap().expected(),
        0,
        "a measurement like any"
    );
    for _ in 0..RECENT {
        book.lock(0).unwrap().learn(300 << 20);
    }
    assert_eq!(
        book.lock(0).unwrap().expected(),
        300 << 20,
        "the low one forgotten after {RECENT} more: no floor that only erodes"
    );
    assert!(book.lock(0).unwrap().expectation_settled());
}

#[test]
fn a_first_context_measured_high_does_not_outweigh_the_pools_least() {
    // This process's first context was measured at 2.35 GiB (other members freed
    // inside its window); the pool's members measured 300 MiB: the next reserves 300.
    let book = ContextCharges::new();
    book.lock(0).unwrap().learn(2400 << 20);
    assert_eq!(book.lock(0).unwrap().expected_beside(300 << 20), 300 << 20);
}

/// A call measured outside a pool, in no given context, as a charge.
fn measure(
    lock: &DeviceLock<'_>,
    drv: &impl CtxDriver,
    call: impl FnMut() -> u32,
) -> (u32, Result<u64, Unmeasured>, MeasuredBy) {
    let (rc, taken, how) = lock.measure(drv, None, None, call);
    (rc, taken.map(taken_bytes), how)
}

/// Members' frees and allocations, split into their steps (announce, driver,
/// credit; start, driver, made or unmade), fall at random points inside the device
/// reads (before or after the figure), inside the call (before or after its own
/// take), and reads fail at random: whatever the retries keep, the charge is never
/// below what the call took (300), and never above it by more than its doubt (what the
/// measurement says the pool's traffic may have added: `measure_with_doubt`). Some frees
/// are announced at an upper bound (the driver gives back less, the announcement withdrawn).
#[test]
fn random_traffic_around_retried_reads_never_makes_a_charge_short() {
    use std::rc::Rc;
    #[derive(Clone, Copy)]
    enum S {
        Announce(usize, u64),
        DriverFree(u64),
        Complete(usize, u64),
        Withdraw(usize, u64),
        Start(usize, u64),
        DriverAlloc(u64),
        Ended(usize, u64, bool),
    }
    let mut measured = 0;
    for seed in 1..4000u64 {
        let rng = Rc::new(Cell::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1));
        let next = {
            let rng = rng.clone();
            move |n: u64| {
                let mut x = rng.get();
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                rng.set(x);
                x % n
            }
        };
        let m: &'static [Box<Member<'static>>] = Box::leak(members(4).0.into_boxed_slice());
        let mut fake = Fake::new(1 << 40, 300);
        let mode = next(3);
        fake.nvml = mode == 0;
        let drv: &'static Fake = Box::leak(Box::new(fake));
        // Each member holds some memory to free.
        for member in &m[1..4] {
            allocate(member, drv, 50_000);
        }
        let vantage = (mode == 1).then(|| drv.make().unwrap());
        // Ops: a list of step lists.
        let mut ops: Vec<std::collections::VecDeque<S>> = Vec::new();
        for _ in 0..(1 + next(6)) {
            let s = 1 + next(3) as usize;
            let b = 1 + next(5_000);
            ops.push(match next(5) {
                0 => [S::Announce(s, b), S::DriverFree(b), S::Complete(s, b)].into(),
                4 => {
                    let gives = b - next(b + 1);
                    [S::Announce(s, b), S::DriverFree(gives), S::Withdraw(s, b)].into()
                }
                1 => [S::Announce(s, b), S::Withdraw(s, b)].into(),
                2 => [S::Start(s, b), S::DriverAlloc(b), S::Ended(s, b, true)].into(),
                _ => [S::Start(s, b), S::Ended(s, b, false)].into(),
            });
        }
        let ops = Rc::new(RefCell::new(ops));
        let step = {
            let ops = ops.clone();
            let next = next.clone();
            move || {
                let mut ops = ops.borrow_mut();
                let live: Vec<usize> = (0..ops.len()).filter(|&i| !ops[i].is_empty()).collect();
                if live.is_empty() {
                    return;
                }
                let i = live[next(live.len() as u64) as usize];
                match ops[i].pop_front().unwrap() {
                    S::Announce(s, b) => assert!(m[s].announce_free(0, b)),
                    S::DriverFree(b) => drv.free.set(drv.free.get() + b),
                    S::Complete(s, b) => m[s].complete_free(0, b),
                    S::Withdraw(s, b) => m[s].withdraw_free(0, b),
                    S::Start(s, b) => {
                        m[s].reserve(0, b).unwrap();
                        assert!(m[s].alloc_started(0, b));
                    }
                    S::DriverAlloc(b) => drv.free.set(drv.free.get() - b),
                    S::Ended(s, b, made) => m[s].alloc_ended(0, b, made),
                }
            }
        };
        let step: Rc<dyn Fn()> = Rc::new(step);
        let some_steps = {
            let step = step.clone();
            let next = next.clone();
            move || {
                for _ in 0..next(3) {
                    step();
                }
            }
        };
        // Steps before the measurement starts.
        some_steps();
        let fail_one_in = 1 + next(8);
        {
            let some_steps = some_steps.clone();
            let next = next.clone();
            *drv.around_reads.borrow_mut() = Some(Box::new(move |before| {
                some_steps();
                before && next(fail_one_in * 3) == 0
            }));
        }
        let book = ContextCharges::new();
        let lock = book.lock(0).unwrap();
        let (rc, taken, _, doubt) = lock.measure_with_doubt(drv, vantage, m[0].traffic(0), || {
            some_steps();
            let rc = drv.call();
            some_steps();
            rc
        });
        *drv.around_reads.borrow_mut() = None;
        assert_eq!(rc, SUCCESS);
        if let Ok(t) = taken {
            measured += 1;
            assert!(t >= 300, "seed {seed} mode {mode}: charged {t} for 300");
            assert!(
                t - i128::from(doubt) <= 300,
                "seed {seed} mode {mode}: measured {t} with a doubt of {doubt}, for 300"
            );
        }
    }
    assert!(measured > 1000, "most measurements answer: {measured}");
}
