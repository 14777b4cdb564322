//! A GPU's `used` word without a lock: every change of a member's use is one atomic
//! change of the word (a compare-and-swap for a reservation, which the rule checks; an
//! add for a credit), bracketed by the member's own `pending` word, and a recount puts
//! the word right after a member dies (or another process wrote it).
//!
//! The word holds the bytes (low 48 bits) and a count of its changes (the 16 bits
//! above), which every change raises: a compare-and-swap fails after any change since
//! its read, even one that left the bytes as they were, so a stale writer never undoes
//! another's change.
//!
//! A member (only its own threads write its slot's words) changes its use of `bytes`:
//!
//! ```text
//! reserve:  pending += bytes;  CAS used += bytes (if the rule allows);  own += bytes;  pending -= bytes
//! credit:   pending += bytes;  own -= bytes;  used -= bytes (one add);               pending -= bytes
//! ```
//!
//! so its `own` is never more than what `used` holds for it: readers that weigh the
//! others' use against their guarantees err on the safe side. A recount (`recount_used`)
//! reads `used`, then each counted slot's `pending`, `own` and `pending` again, and
//! swaps in `own + both pendings` only if `used` did not change meanwhile. For each
//! member that is at least what `used` holds for it: a change whose swap came before
//! the read of `used` left either `own` updated or its bytes in the first `pending`
//! (reserve) or the second (credit, which takes them off `own` first); a change whose
//! swap came later makes the recount's swap fail. So a recount never counts less than
//! the members hold (never an over-commit), at most the bytes in flight more; it runs
//! with nothing in flight when it can (a few looks), and a member killed at any
//! instruction leaves at most its own words wrong, which the member that takes its
//! slot back clears before it recounts. No journal is needed: nothing is ever
//! redone, only counted again.
//!
//! A free is announced before its driver call (`traffic`) in words of its own,
//! `freeing` and `freed`, not in `pending`: its bytes stay in `own` until the credit
//! above, so the recount's argument is untouched by it, and `pending` stays a few
//! instructions long (a driver's free can take milliseconds: a `pending` held across
//! it would make recounts give up, and a guarantee's holder would count the bytes it
//! frees twice, see `fits_under`). An allocation's marks (`started`, `made`, `unmade`)
//! leave `own` and `pending` alone too.
//!
//! A reservation decides on two reads that are not one instant: `used`, then the
//! member's own use (and, beside a guarantee, the others' own words). A change made
//! between them (another thread of the member taking bytes: `own` already raised, the
//! `used` read without them; another member's credit: its `own` lowered, the `used`
//! read with its bytes) makes the figures disagree, and a rule deciding on them could
//! refuse with room under the cap. Such a refusal stands only if `used` still holds
//! the word it was decided on (its change count unchanged): every change since moves
//! the count, so a decision on an unchanged word saw between its reads no change that
//! `used` holds: it weighed the figures of one instant, but for changes still in
//! flight (between their own word and `used`), which err on the safe side as above and
//! only near the cap. Otherwise the rule decides again on the new word, as a lost swap
//! does.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, SeqCst},
};

use super::gpu_words::GpuWords;
use super::layout::{
    G_PEAK, G_USED, M_PEAK, M_PENDING, M_USED, STATE_LIVE, USED_BITS, USED_BYTES, Words,
    used_bytes, used_word,
};
use super::member::{Member, MemberLocks};

/// How often a recount looks again while changes are in flight or `used` keeps
/// changing under it.
const RECOUNT_TURNS: u32 = 64;

/// Takes `taken` (1..=`USED_BYTES`) off a `used` word and counts the change, in one
/// atomic add rather than a compare-and-swap loop: a credit needs no check, and the add
/// is one change of the word as a swap is (a recount's swap after it fails). `used`
/// holds at least what the crediting member holds, so the bytes do not go below zero; a
/// word another process wrote wrong could, and then the borrow is given back at once
/// (the bytes end at zero and the count one up, as a saturating swap would have left
/// them; meanwhile others read a `used` too high, never too low).
#[inline(always)]
fn take_off_used(used: &AtomicU64, taken: u64) {
    // (1 << USED_BITS) - taken: the count one up, the bytes `taken` down.
    let before = used.fetch_add((1 << USED_BITS) - taken, SeqCst);
    let had = used_bytes(before);
    if had < taken {
        used.fetch_add(taken - had, SeqCst);
    }
}

/// What the counted slots hold on GPU entry `g`: (the sum of their `own`, the sum of
/// their `pending` read before and after each `own`). A live slot counts (its owner dead
/// or not: its share is in `used` until taken back), and so does a slot marked empty
/// whose kernel lock a live process holds (a state word another process cleared: its
/// owner's bytes are real).
pub(super) fn members_count(w: Words<'_>, locks: &dyn MemberLocks, g: usize) -> (u64, u64) {
    let (mut own, mut pending) = (0u64, 0u64);
    for s in 0..w.slots() {
        let p = w.member_gpu(s, g, M_PENDING);
        let first = p.load(SeqCst);
        let used = w.member_gpu(s, g, M_USED).load(SeqCst);
        let second = p.load(SeqCst);
        if (used | first | second) != 0 && (w.state(s).load(Acquire) == STATE_LIVE || locks.held(s))
        {
            own = own.saturating_add(used);
            pending = pending.saturating_add(first).saturating_add(second);
        }
    }
    (own, pending)
}

/// What a change of a member's use may make of the pool's use: `apply(pool's use, own
/// use)` gives the pool's new use, or None to refuse. A closure is one; the short path's
/// rule (`account`) is a type of its own whose `apply` is inlined into the change's loop
/// (a closure that large is left out of line: a frame per reservation).
pub(super) trait Rule {
    fn apply(&self, pool: u64, own: u64) -> Option<u64>;
}

impl<F: Fn(u64, u64) -> Option<u64>> Rule for F {
    #[inline(always)]
    fn apply(&self, pool: u64, own: u64) -> Option<u64> {
        self(pool, own)
    }
}

impl Member<'_> {
    /// Adds `bytes` to this member's use on GPU entry `g` if `rule(pool's use, own use)`
    /// gives the pool's new use (checked and added in one compare-and-swap). True if added.
    #[inline]
    pub(super) fn add(&self, g: usize, bytes: u64, rule: impl Fn(u64, u64) -> Option<u64>) -> bool {
        self.hot(g)
            .is_some_and(|h| self.add_at(h, bytes, &rule).is_ok())
    }

    /// [`add`](Self::add) on the words `h` of one GPU entry: Err with the pool's use the
    /// rule refused on (a refusal names that figure: the pool's use read again later may
    /// be lower, and would not explain it). Inlined: a reservation's short path then
    /// keeps `rule`'s captures in registers and pays no second frame.
    #[inline(always)]
    pub(super) fn add_at(&self, h: &GpuWords<'_>, bytes: u64, rule: &impl Rule) -> Result<(), u64> {
        let (pending, own, used) = (&h.mine[M_PENDING], &h.mine[M_USED], &h.gpu[G_USED]);
        pending.fetch_add(bytes, SeqCst);
        let mut word = used.load(SeqCst);
        let new = loop {
            #[cfg(test)]
            between_reads::run();
            let Some(new) = rule
                .apply(used_bytes(word), own.load(SeqCst))
                .filter(|&n| n <= USED_BYTES)
            else {
                // Decided on figures of two moments: it stands only on the same word.
                let now = used.load(SeqCst);
                if now != word {
                    word = now;
                    continue;
                }
                pending.fetch_sub(bytes, SeqCst);
                return Err(used_bytes(word));
            };
            #[cfg(test)]
            between_reads::run_before_swap();
            match used.compare_exchange_weak(word, used_word(word, new), SeqCst, SeqCst) {
                Ok(_) => break new,
                Err(now) => word = now,
            }
        };
        self.added(h, bytes, new);
        Ok(())
    }

    /// One try of [`add_at`](Self::add_at), without its loop: Some(true) if added,
    /// Some(false) if `rule` refused on a `used` that did not change meanwhile, None if
    /// another change of `used` came between its read and its swap (or its refusal).
    /// Nothing is changed unless it says Some(true). A straight line: no loop keeps
    /// constants in registers that the caller must save.
    #[inline(always)]
    pub(super) fn add_once(&self, h: &GpuWords<'_>, bytes: u64, rule: &impl Rule) -> Option<bool> {
        let (pending, own, used) = (&h.mine[M_PENDING], &h.mine[M_USED], &h.gpu[G_USED]);
        pending.fetch_add(bytes, SeqCst);
        let word = used.load(SeqCst);
        #[cfg(test)]
        between_reads::run();
        let Some(new) = rule
            .apply(used_bytes(word), own.load(SeqCst))
            .filter(|&n| n <= USED_BYTES)
        else {
            // As in `add_at`: a refusal stands only on the word it was decided on.
            let same = used.load(SeqCst) == word;
            pending.fetch_sub(bytes, SeqCst);
            return same.then_some(false);
        };
        #[cfg(test)]
        between_reads::run_before_swap();
        if used
            .compare_exchange(word, used_word(word, new), SeqCst, SeqCst)
            .is_err()
        {
            pending.fetch_sub(bytes, SeqCst);
            return None;
        }
        self.added(h, bytes, new);
        Some(true)
    }

    /// The rest of a change that added `bytes` to the pool's use (now `new`) on the words
    /// `h`: this member's own use, then its `pending` taken back, then the peaks.
    #[inline(always)]
    fn added(&self, h: &GpuWords<'_>, bytes: u64, new: u64) {
        let (pending, own) = (&h.mine[M_PENDING], &h.mine[M_USED]);
        // No overflow: the pool's `used` (at most `USED_BYTES`) holds both.
        let held_now = own.fetch_add(bytes, SeqCst).wrapping_add(bytes);
        pending.fetch_sub(bytes, SeqCst);
        let peak = &h.gpu[G_PEAK];
        if new > peak.load(Relaxed) {
            peak.fetch_max(new, Relaxed);
        }
        let own_peak = &h.mine[M_PEAK];
        if held_now > own_peak.load(Relaxed) {
            own_peak.fetch_max(held_now, Relaxed);
        }
    }

    /// Runs the next step a test queued on this thread (`between_reads`), where
    /// `register_gpu` has read the pool's cap and not yet its cap word.
    #[cfg(test)]
    pub(super) fn queued_step(&self) {
        between_reads::run();
    }

    /// Takes up to `bytes` off this member's use on GPU entry `g` and the pool's: never
    /// more than the member holds (a forked child freeing memory its parent allocated
    /// must not take it off the pool's count). Returns the bytes taken off.
    #[inline]
    pub(super) fn sub(&self, g: usize, bytes: u64) -> u64 {
        self.hot(g).map_or(0, |h| self.sub_at(h, bytes))
    }

    /// [`sub`](Self::sub) on the words `h` of one GPU entry.
    #[inline]
    pub(super) fn sub_at(&self, h: &GpuWords<'_>, bytes: u64) -> u64 {
        let (pending, own, gpu) = (&h.mine[M_PENDING], &h.mine[M_USED], h.gpu);
        pending.fetch_add(bytes, SeqCst);
        let held = own
            .fetch_update(SeqCst, SeqCst, |o| Some(o - bytes.min(o)))
            .unwrap_or(0);
        let taken = bytes.min(held);
        if taken > 0 {
            take_off_used(&gpu[G_USED], taken);
        }
        pending.fetch_sub(bytes, SeqCst);
        taken
    }

    /// Sets GPU entry `g`'s `used` to what the members hold (see the module's text), if
    /// it says otherwise. Returns (what it said, what it says now) if it changed it.
    /// With changes in flight at every look (a member stopped inside one), only a `used`
    /// below what the members' own words hold is raised: the bytes in flight are counted
    /// then, so it errs on the safe side.
    pub(super) fn recount_used(&self, g: usize) -> Option<(u64, u64)> {
        let used = self.w.gpu(g, G_USED);
        for turn in 0..RECOUNT_TURNS {
            let word = used.load(SeqCst);
            let (own, pending) = members_count(self.w, self.locks, g);
            let held = own.saturating_add(pending).min(USED_BYTES);
            let found = used_bytes(word);
            if pending != 0 {
                if turn + 1 < RECOUNT_TURNS {
                    std::thread::yield_now();
                    continue;
                }
                if found >= own {
                    return None; // nothing it can tell from the changes in flight
                }
            }
            if found == held {
                return None;
            }
            if used
                .compare_exchange(word, used_word(word, held), SeqCst, SeqCst)
                .is_ok()
            {
                return Some((found, held));
            }
        }
        None
    }
}

/// Tests put a change of another thread (or member) between a change's read of `used`
/// and its read of the member's own use, where a preempted thread or a contended
/// cache line puts it at random: each change runs the next step queued on its thread
/// there (`queue`), if any; so does a member registering a GPU, between its read of
/// the pool's cap and its look at the cap word (`register_gpu`). Steps queued with
/// `queue_before_swap` run between a change's rule and its swap of `used` instead, and
/// those queued with `queue_in_force` in a resize, once its new cap is in force. A
/// step's own changes read straight through. Built in tests only.
#[cfg(test)]
pub(super) mod between_reads {
    use std::cell::{Cell, RefCell};
    use std::collections::VecDeque;

    type Step = Box<dyn FnOnce()>;

    /// Where a step runs.
    #[derive(Clone, Copy)]
    enum At {
        Read,
        Swap,
        InForce,
        Refused,
    }

    thread_local! {
        static STEPS: [RefCell<VecDeque<Step>>; 4] =
            const { [const { RefCell::new(VecDeque::new()) }; 4] };
        static RUNNING: Cell<bool> = const { Cell::new(false) };
    }

    fn push(at: At, step: impl FnOnce() + 'static) {
        STEPS.with(|s| s[at as usize].borrow_mut().push_back(Box::new(step)));
    }

    /// Queues `step` for the next change on this thread that reads `used`.
    pub fn queue(step: impl FnOnce() + 'static) {
        push(At::Read, step);
    }

    /// Queues `step` for the next change on this thread that swaps `used`, after its rule.
    pub fn queue_before_swap(step: impl FnOnce() + 'static) {
        push(At::Swap, step);
    }

    /// Queues `step` for the next resize on this thread, once its new cap is in force.
    pub fn queue_in_force(step: impl FnOnce() + 'static) {
        push(At::InForce, step);
    }

    /// Queues `step` for the next reservation on this thread refused once decided,
    /// before its refusal is written.
    pub fn queue_refused(step: impl FnOnce() + 'static) {
        push(At::Refused, step);
    }

    /// How many queued steps have not run yet (and forgets them).
    pub fn clear() -> usize {
        STEPS.with(|s| {
            s.iter()
                .map(|q| std::mem::take(&mut *q.borrow_mut()).len())
                .sum()
        })
    }

    fn run_at(at: At) {
        if RUNNING.get() {
            return;
        }
        let Some(step) = STEPS.with(|s| s[at as usize].borrow_mut().pop_front()) else {
            return;
        };
        RUNNING.set(true);
        step();
        RUNNING.set(false);
    }

    /// Runs the next step queued for a read of `used`, unless a step is running (its
    /// changes read through).
    pub(in crate::budget) fn run() {
        run_at(At::Read);
    }

    /// Runs the next step queued for a swap of `used`.
    pub(in crate::budget) fn run_before_swap() {
        run_at(At::Swap);
    }

    /// Runs the next step queued for a resize's new cap in force.
    pub(in crate::budget) fn run_in_force() {
        run_at(At::InForce);
    }

    /// Runs the next step queued for a refused reservation.
    pub(in crate::budget) fn run_refused() {
        run_at(At::Refused);
    }
}
