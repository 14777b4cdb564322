//! Joining a pool, leaving it, and taking back what dead members held, in work that does
//! not grow with the member count for each joiner.
//!
//! Every kernel lock call (`MemberLocks::try_take`) walks the file's list of locks, one
//! per member, so a joiner that tried every slot's lock in turn, and then every live
//! slot's to find the dead, made a start of n members together cost about n³. Instead:
//!
//! - A joiner first takes a slot handed out by the pool's counter of slots never handed
//!   out ([`layout::H_JOIN_NEXT`], one `fetch_add`): members started together each try a slot of
//!   their own, and the first try is taken.
//! - Slots emptied since (a member left, a dead member's slot taken back) are counted
//!   ([`layout::H_JOIN_FREED`]): while the count is not 0, a joiner looks among the slots already
//!   handed out for one whose state word says empty (reads of memory, no lock call), from
//!   a point that moves on with each joiner ([`layout::H_JOIN_CURSOR`]), before taking a new one.
//! - In a pool of at most [`JOIN_SWEEP_ALL`] slots handed out, a dead member's slot is
//!   taken before a new one (a few lock calls), so that the members stay in the lowest
//!   slots.
//! - Only when the counter has passed the last slot (the pool looks full) does a joiner
//!   try every empty slot, then every live slot's lock: the slot of a member that died is
//!   taken back there, as before.
//!
//! These words are hints. Whatever they say, a slot is taken only with its kernel lock
//! (so never a live member's), and a joiner refused by every hint tries every slot before
//! it says the pool is full (so a free slot is never passed over for good): a wrong word
//! costs failed tries, each of which moves a counter on, so at most one per slot.
//!
//! A joiner then sweeps the pool for dead members (their bytes, their guarantees, their
//! slots): always in a pool of at most [`JOIN_SWEEP_ALL`] slots ever taken, and in a larger
//! one only when no joiner swept in the last [`JOIN_SWEEP_EVERY_MS`] ([`layout::H_JOIN_SWEPT_MS`]),
//! since a sweep tries the lock of every live slot. A request the pool would refuse still
//! sweeps first (`account`, `share_words`, `wait`): the dead's bytes are never left held
//! from a member that needs them.

use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};

use super::gpu_words::GpuWords;
use super::layout;
use super::member::{JoinError, Member, MemberInfo, MemberLocks, Pool};
use super::notes::Repair;
use crate::config::MAX_DEVICES;

/// In a pool of at most this many slots ever taken, every joiner sweeps for dead members.
pub const JOIN_SWEEP_ALL: u64 = 64;

/// In a larger pool, joiners sweep at most once in this long (ms), pool-wide.
pub const JOIN_SWEEP_EVERY_MS: u64 = 1000;

/// Which slots a search of the pool tries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Those whose state word says empty (a read of memory each: no lock call).
    Empty,
    /// Those whose state word says live: a lock taken there is a dead member's.
    Live,
}

impl<'a> Member<'a> {
    /// Joins `pool`: takes a free slot (see the module's text for which), finishing and
    /// taking back what a dead owner left in it, then takes back other dead members'
    /// shares (every joiner of a small pool; about once a second in a large one).
    pub fn join(
        pool: Pool<'a>,
        locks: &'a dyn MemberLocks,
        info: &MemberInfo,
    ) -> Result<Box<Self>, JoinError> {
        let w = pool.w;
        let m = Self::find_slot(w, locks, info).ok_or(JoinError::Full {
            slots: w.slots(),
            waited: std::time::Duration::ZERO,
        })?;
        m.join_sweep();
        // Tickets of members killed inside the ticket step leave a count no slot
        // explains (always too high: the count goes up before a ticket is written
        // and down after it is cleared): counted again from the live slots'
        // tickets. Under the word lock, so only where there is a count: a stopped
        // lock holder must not block a joiner where nobody waits.
        for g in 0..layout::MAX_POOL_GPUS {
            if w.has_gpu(g) && w.gpu(g, layout::G_WAITERS).load(Acquire) != 0 {
                m.recount_waiters(g);
            }
        }
        Ok(m)
    }

    /// The slot this joiner takes, set up as its own (None: every slot is held).
    fn find_slot(
        w: layout::Words<'a>,
        locks: &'a dyn MemberLocks,
        info: &MemberInfo,
    ) -> Option<Box<Self>> {
        let slots = w.slots();
        let next = w.header(layout::H_JOIN_NEXT);
        let handed = || usize::try_from(next.load(Acquire)).map_or(slots, |n| n.min(slots));
        // A slot emptied since: among those handed out, for density (the pool's readers
        // of every member's marks stop at the highest slot ever taken).
        let freed = w.header(layout::H_JOIN_FREED);
        if freed
            .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1))
            .is_ok()
            && let Some(m) = Self::search(w, locks, info, handed(), Kind::Empty)
        {
            return Some(m);
        }
        // In a small pool, a dead member's slot before a new one, as the sweep would
        // empty it anyway: few lock calls, and the members stay in the lowest slots.
        let small = handed();
        if small as u64 <= JOIN_SWEEP_ALL
            && let Some(m) = Self::search(w, locks, info, small, Kind::Live)
        {
            return Some(m);
        }
        // A slot never handed out. Each value is tried once, whoever gets it: a slot
        // held all the same (a forged counter, a joiner of the full search below) costs
        // one failed try, ever.
        while next.load(Acquire) < slots as u64 {
            let s = next.fetch_add(1, AcqRel);
            if s >= slots as u64 {
                break;
            }
            if let Some(m) = Self::take_slot(w, locks, info, s as usize) {
                return Some(m);
            }
        }
        // The pool looks full: every slot, empty ones first, then dead members'.
        Self::search(w, locks, info, slots, Kind::Empty)
            .or_else(|| Self::search(w, locks, info, slots, Kind::Live))
    }

    /// Tries the slots below `limit` whose state is `kind`, from where the pool's cursor
    /// points (joiners searching at once start apart), until one is taken.
    fn search(
        w: layout::Words<'a>,
        locks: &'a dyn MemberLocks,
        info: &MemberInfo,
        limit: usize,
        kind: Kind,
    ) -> Option<Box<Self>> {
        if limit == 0 {
            return None;
        }
        let start = (w.header(layout::H_JOIN_CURSOR).fetch_add(1, Relaxed) % limit as u64) as usize;
        (0..limit).find_map(|i| {
            let s = (start + i) % limit;
            let live = w.state(s).load(Acquire) == layout::STATE_LIVE;
            if live != (kind == Kind::Live) {
                return None;
            }
            Self::take_slot(w, locks, info, s)
        })
    }

    /// Takes slot `s` if its lock is free, finishing and taking back what a dead owner
    /// left in it, and marks it this member's (None: its lock is held, or its dead
    /// owner's bytes wait for the driver: `reclaim`).
    fn take_slot(
        w: layout::Words<'a>,
        locks: &'a dyn MemberLocks,
        info: &MemberInfo,
        s: usize,
    ) -> Option<Box<Self>> {
        if !locks.try_take(s) {
            return None;
        }
        // Before anything of this member's can be marked in the slot (`traffic`).
        w.header(layout::H_SLOTS_SEEN)
            .fetch_max(s as u64 + 1, SeqCst);
        // Boxed where it is made: a member is 4.5 KiB, and each caller up to the shim's
        // join would otherwise hold a copy on the stack (32 KiB of stack pages a start
        // touches for nothing).
        let m = Box::new(Member {
            w,
            slot: s,
            hot: std::array::from_fn(|g| GpuWords::of(w, s, g)),
            not_me: std::array::from_fn(|k| {
                if k == s / 64 {
                    !(1u64 << (s % 64))
                } else {
                    u64::MAX
                }
            }),
            locks,
            entry_of: [const { AtomicU32::new(0) }; MAX_DEVICES],
            route: [const { AtomicU32::new(0) }; MAX_DEVICES],
            left: AtomicBool::new(false),
            wait: None,
            wait_turn: [const { std::sync::Mutex::new(()) }; layout::MAX_POOL_GPUS],
            gate: [const { AtomicU64::new(0) }; layout::MAX_POOL_GPUS],
            caps: [const { AtomicU64::new(0) }; layout::MAX_POOL_GPUS],
            limit: [const { AtomicU64::new(0) }; layout::MAX_POOL_GPUS],
            cap_gen: [const { AtomicU64::new(0) }; layout::MAX_POOL_GPUS],
            note: None,
            early: std::sync::Mutex::new(Vec::new()),
            own: [const { [const { AtomicU64::new(0) }; layout::SHARE_WORDS] };
                layout::MAX_POOL_GPUS],
            share_seen: [const { AtomicU64::new(0) }; layout::MAX_POOL_GPUS],
        });
        if w.state(s).load(Acquire) == layout::STATE_LIVE {
            if !super::reclaim::released(w, s, locks.descendants_hold(s), |p, n, t| {
                locks.exiting(p, n, t)
            }) {
                // Its owner is dead but the driver may still hold its memory.
                locks.give_back(s);
                return None;
            }
            m.take_back(s);
        } else {
            // An empty slot holds nothing: a word lock naming it, or bytes in it,
            // are left by no member (a forged or corrupted file).
            let holder = s as u64 + 1;
            for g in 0..layout::MAX_POOL_GPUS {
                let word = w.gpu(g, layout::G_LOCK).load(Acquire);
                if word & layout::LOCK_HOLDER == holder && m.release_from(g, word) {
                    m.report_repair(&Repair::Lock { gpu: g, word });
                }
                w.member_gpu(s, g, layout::M_PENDING).store(0, SeqCst);
                w.member_gpu(s, g, layout::M_USED).store(0, SeqCst);
                m.close_traffic(s, g);
            }
            // Nor a guarantee or a ceiling: this member claims its own later.
            m.clear_new_slot_shares();
            // Its bits of contexts in flight are left by no member: cleared, the counts
            // left as they are (too high errs on the safe side).
            w.slot(s, layout::S_CONTEXTS).store(0, SeqCst);
        }
        w.slot(s, layout::S_PID)
            .store(layout::pid_word(info.pid, info.uid), Relaxed);
        w.slot(s, layout::S_PIDNS)
            .store(info.pid_namespace, Relaxed);
        w.slot(s, layout::S_START_MS).store(info.start_ms, Relaxed);
        w.set_command(s, &info.command);
        w.slot(s, layout::S_GENERATION).fetch_add(1, Relaxed);
        w.slot(s, layout::S_SHARE_GEN).store(0, Relaxed);
        w.slot(s, layout::S_HANDED).store(0, Relaxed);
        for g in 0..layout::MAX_POOL_GPUS {
            w.member_gpu(s, g, layout::M_PEAK).store(0, Relaxed);
            w.member_gpu(s, g, layout::M_CAP).store(0, Relaxed);
            w.member_gpu(s, g, layout::M_WAIT).store(0, Relaxed);
        }
        w.state(s).store(layout::STATE_LIVE, Release);
        Some(m)
    }

    /// A new member's sweep for dead members: always in a small pool, at most once per
    /// [`JOIN_SWEEP_EVERY_MS`] pool-wide in a large one (the first joiner past that
    /// long since the last sweep, as the sweep word says, sweeps; a word set in the
    /// future counts as long ago).
    fn join_sweep(&self) {
        if self.w.header(layout::H_SLOTS_SEEN).load(Acquire) <= JOIN_SWEEP_ALL {
            self.sweep();
            return;
        }
        let now = layout::now_ms();
        let word = self.w.header(layout::H_JOIN_SWEPT_MS);
        let last = word.load(Acquire);
        if now.abs_diff(last) >= JOIN_SWEEP_EVERY_MS
            && word.compare_exchange(last, now, AcqRel, Acquire).is_ok()
        {
            self.sweep();
        }
    }

    /// [`join`](Self::join), waiting up to `max` (`GPUCAP_WAIT`) for a slot while every
    /// one is held: woken when a member leaves, and trying again at least every 50 ms
    /// (a member that dies wakes nobody; its slot is taken back by the next try).
    pub fn join_waiting(
        pool: Pool<'a>,
        locks: &'a dyn MemberLocks,
        info: &MemberInfo,
        max: std::time::Duration,
    ) -> Result<Box<Self>, JoinError> {
        let start = std::time::Instant::now();
        let freed = pool.w.header(layout::H_SLOT_FREED);
        loop {
            let seen = freed.load(Acquire);
            match Self::join(pool, locks, info) {
                Err(JoinError::Full { slots, .. }) => {
                    let waited = start.elapsed();
                    if waited >= max || locks.refusing() {
                        return Err(JoinError::Full {
                            slots,
                            waited: if max.is_zero() { max } else { waited },
                        });
                    }
                    let nap = (max - waited).min(std::time::Duration::from_millis(50));
                    locks.sleep_on(freed, seen, nap);
                }
                joined => return joined,
            }
        }
    }

    /// Takes back the share of every member whose process died. Returns how many.
    pub fn sweep(&self) -> usize {
        self.sweep_counting().0
    }

    /// [`sweep`](Self::sweep), then again every few ms while dead members' bytes are held
    /// back for their teardown (`reclaim`: bounded; not while their forked children
    /// hold them, which has no bound) and nothing was taken back: a request
    /// the dead members' bytes would serve waits for the driver to release them rather
    /// than being refused meanwhile.
    pub(super) fn sweep_waiting(&self) -> usize {
        loop {
            let (taken, held) = self.sweep_counting();
            if taken > 0 || held == 0 {
                return taken;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// [`sweep`](Self::sweep): (slots taken back, slots whose bytes are held back).
    fn sweep_counting(&self) -> (usize, usize) {
        let mut held = 0;
        let mut taken = 0;
        for s in 0..self.w.slots() {
            if s != self.slot
                && self.w.state(s).load(Acquire) == layout::STATE_LIVE
                && self.locks.try_take(s)
            {
                // Its owner died (or had just emptied it): we hold its lock now. Its
                // bytes come back once the driver released them (`reclaim`).
                if self.w.state(s).load(Acquire) == layout::STATE_LIVE {
                    let children = self.locks.descendants_hold(s);
                    if super::reclaim::released(self.w, s, children, |p, n, t| {
                        self.locks.exiting(p, n, t)
                    }) {
                        self.take_back(s);
                        self.empty(s);
                        self.w.header(layout::H_JOIN_FREED).fetch_add(1, Release);
                        taken += 1;
                    } else {
                        // Its bytes wait; its word locks and tickets block nobody.
                        self.unblock(s);
                        // Not for a wait: its forked children hold them for as long as
                        // they live (a request is refused meanwhile, never kept waiting).
                        if !children {
                            held += 1;
                        }
                    }
                }
                self.locks.give_back(s);
                self.slot_freed();
            }
        }
        (taken, held)
    }

    /// Called holding dead slot `d`'s lock while its bytes are held back (`reclaim`):
    /// frees each GPU's word lock `d` held and takes its waiting ticket out of the queue.
    fn unblock(&self, d: usize) {
        let holder = d as u64 + 1;
        for g in 0..layout::MAX_POOL_GPUS {
            let word = self.w.gpu(g, layout::G_LOCK).load(Acquire);
            if word & layout::LOCK_HOLDER == holder {
                self.release_from(g, word);
            }
            if self.w.member_gpu(d, g, layout::M_WAIT).swap(0, AcqRel) != 0 {
                self.recount_waiters(g);
                self.wake_waiters(g);
            }
        }
    }

    /// Called holding dead slot `d`'s lock (or `d` is this member, adopting it): frees
    /// each GPU's word lock `d` held, then returns what `d` holds to the pool: its words
    /// cleared first (its bytes then stay in `used`, too many, never too few), then
    /// `used` counted again from the others' (see `used`).
    pub(super) fn take_back(&self, d: usize) {
        let holder = d as u64 + 1;
        for g in 0..layout::MAX_POOL_GPUS {
            let word = self.w.gpu(g, layout::G_LOCK).load(Acquire);
            if word & layout::LOCK_HOLDER == holder {
                self.release_from(g, word);
            }
        }
        for g in 0..layout::MAX_POOL_GPUS {
            let own = self.w.member_gpu(d, g, layout::M_USED).swap(0, SeqCst);
            let pending = self.w.member_gpu(d, g, layout::M_PENDING).swap(0, SeqCst);
            // Frees and allocations it had in flight: its memory is the driver's now.
            self.close_traffic(d, g);
            if own | pending != 0 {
                self.locked(g, || self.recount_used(g));
            }
            let ticket = self.w.member_gpu(d, g, layout::M_WAIT).swap(0, AcqRel);
            if ticket != 0 || self.w.gpu(g, layout::G_WAITERS).load(Acquire) != 0 {
                // It died waiting, or inside the ticket step (the count up, its ticket
                // not written yet): the count comes from the live tickets again, and
                // the others may be next.
                self.recount_waiters(g);
                self.wake_waiters(g);
            }
        }
        self.forget_shares(d); // its guarantee returns with its bytes
        self.close_context_flights(d); // the driver ends its contexts with it
    }

    /// Clears dead slot `d` (its share already taken back).
    pub(super) fn empty(&self, d: usize) {
        for g in 0..layout::MAX_POOL_GPUS {
            self.w.member_gpu(d, g, layout::M_CAP).store(0, Relaxed);
            self.w.member_gpu(d, g, layout::M_PEAK).store(0, Relaxed);
            self.w.member_gpu(d, g, layout::M_WAIT).store(0, Relaxed);
        }
        self.forget_shares(d);
        self.w.state(d).store(layout::STATE_EMPTY, Release);
    }

    /// Tells joiners waiting for a slot (`join_waiting`) that one may be free.
    fn slot_freed(&self) {
        let freed = self.w.header(layout::H_SLOT_FREED);
        freed.fetch_add(1, Release);
        self.locks.wake(freed);
    }

    /// At exit: gives this member's whole share back and empties its slot. Later
    /// changes (frees made by other libraries' exit handlers) are ignored, later
    /// reservations refused.
    pub fn leave(&self) {
        if self.left.swap(true, AcqRel) {
            return;
        }
        for e in &self.route {
            e.store(0, SeqCst);
        }
        for g in 0..layout::MAX_POOL_GPUS {
            let own = self.w.member_gpu(self.slot, g, layout::M_USED).load(SeqCst);
            if own != 0 {
                // The driver frees it when the process ends, after this credit: announced,
                // so that a member measuring a context meanwhile adds it back (`traffic`;
                // `freeing` is left to the slot's next owner to clear).
                self.w
                    .mark(self.slot, g, layout::T_FREEING)
                    .fetch_add(own, SeqCst);
                self.w
                    .mark(self.slot, g, layout::T_FREED)
                    .fetch_add(own, SeqCst);
                self.sub(g, own);
            }
        }
        self.empty(self.slot);
        self.locks.give_back(self.slot);
        self.w.header(layout::H_JOIN_FREED).fetch_add(1, Release);
        self.slot_freed();
    }
}
