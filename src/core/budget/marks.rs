//! What the members give back and take around their driver calls, marked in words of
//! their own, so that a member measuring what its new context took (the device's free
//! memory before minus after, see `contexts`) can take the others' traffic out of the
//! measurement: memory freed inside that window would be taken off the context's charge
//! (and a context charged short lets the pool hold more than its cap); memory allocated
//! inside it would be added to it.
//!
//! Per GPU entry, each member has these words, which only its own threads write:
//! `freeing` (bytes of frees announced, not yet credited or withdrawn), and four that
//! only go up and are never cleared (a slot's next owner counts on): `freed` (every byte
//! announced), `started` (every byte reserved for an allocation, before its driver
//! call), `made` (of those, every byte the driver allocated, after its call) and
//! `unmade` (every byte it did not: refused, rolled back, or memory the driver backs
//! later, such as managed memory):
//!
//! ```text
//! free:   freeing += b;  freed += b;  driver;  credit (see `used`);  freeing -= b
//!         (the driver refused: freeing -= b, `freed` keeps it)
//! alloc:  reserve;  started += b;  driver;  made += b   (or unmade += b)
//! ```
//!
//! A measurement reads every slot's marks before its window (before the device-wide
//! "before" read: `freed`, then `freeing`), right after that read (`made`, `unmade`,
//! then `started`), right before the "after" read (`made`) and after it (`freed`):
//!
//! - Frees: it adds back each slot's growth of `freed` and the `freeing` read first. A
//!   free whose driver call falls inside the window was announced before that call:
//!   either after the first read of `freed` (and so before the last), or before it, and
//!   then its `freeing` rose before the read of `freeing` that follows and falls only
//!   after the driver call, inside the window.
//! - Allocations: it takes off, per slot, the growth of `made` between the two reads
//!   inside the window, less what was in flight at the first (`started - made -
//!   unmade`, read in that order). An allocation marked `made` in between whose
//!   `started` came before that read is in flight then, and cancelled; one whose
//!   `started` came after it had its driver call after the "before" read, and its `made`
//!   before the "after" read: inside the window. So only allocations the device-wide
//!   figure shows are taken off, and a reservation inside the window whose driver call
//!   comes after it (in `used` already) cannot hide a free, as a net change of `used`
//!   would.
//!
//! What is counted around the window but happened outside it is added back, never taken
//! off: the context is charged more, never less. The marks leave `own` and `pending`
//! alone, so a recount of `used` is untouched by them. A member killed inside a free
//! leaves `freeing` set and inside an allocation `started` ahead: whoever takes its
//! share back clears the one and closes the other (`unmade`); a measurement counts the
//! `freeing` of live slots only. A member leaving at exit announces what it still holds
//! (the driver frees it when the process ends; counted if the exit falls in the window).
//! Left over: a member killed inside another's window (the driver frees its memory,
//! nothing announced it), memory the pool is credited for when it reads it again (a
//! stream-ordered pool that released memory at a synchronisation or a trim), and
//! processes outside the pool.

use std::sync::atomic::Ordering::{Acquire, SeqCst};

use super::gpu_words::GpuWords;
use super::layout::{G_WAITERS, H_SLOTS_SEEN, T_FREED, T_FREEING, T_MADE, T_STARTED, T_UNMADE};
use super::member::{Member, OWN_SHARE};

/// Takes `bytes` off the member's `freeing` (never below zero: a word another process
/// cleared is not wrapped round).
#[inline]
fn end_announcement(h: &GpuWords<'_>, bytes: u64) {
    let freeing = &h.marks[T_FREEING];
    let before = freeing.fetch_sub(bytes, SeqCst);
    if before < bytes {
        freeing.fetch_add(bytes - before, SeqCst);
    }
}

/// What the members of a pool had marked of their traffic on one GPU, read at one
/// moment ([`Member::marks`]). See the module's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolMarks {
    /// Per slot: `freed`, `made`, and what was in flight (`started - made - unmade`;
    /// None where the words cannot be: `started` behind).
    freed: Vec<u64>,
    made: Vec<u64>,
    in_flight: Vec<Option<u64>>,
    /// The `freeing` of the slots a live process holds.
    freeing: u64,
}

impl PoolMarks {
    /// The bytes the members may have given back to the driver between `self` (read
    /// before a window) and `after` (read after it): each slot's `freed` growth (all of
    /// `after`'s where the word went down: rewritten by another process), and the bytes
    /// announced before the window and not yet credited.
    /// A slot `self` did not read (taken for the first time after it) counts from zero:
    /// nothing was marked in it before.
    pub fn given_back_until(&self, after: &PoolMarks) -> u64 {
        let grown = after
            .freed
            .iter()
            .enumerate()
            .map(|(s, &a)| {
                let b = self.freed.get(s).copied().unwrap_or(0);
                if a >= b { a - b } else { a }
            })
            .fold(0u64, u64::saturating_add);
        grown.saturating_add(self.freeing)
    }

    /// The bytes the members surely had the driver allocate between `self` (read
    /// inside a window, after its "before" read) and `last` (read before its "after"
    /// read): per slot, the growth of `made` less what was in flight at `self`.
    /// A slot `self` did not read (taken for the first time after it) had nothing in
    /// flight then: its first allocation started after `self`.
    pub fn taken_until(&self, last: &PoolMarks) -> u64 {
        last.made
            .iter()
            .enumerate()
            .map(|(s, &a)| {
                let b = self.made.get(s).copied().unwrap_or(0);
                match self.in_flight.get(s).copied().unwrap_or(Some(0)) {
                    Some(f) if a >= b => (a - b).saturating_sub(f),
                    _ => 0,
                }
            })
            .fold(0u64, u64::saturating_add)
    }
}

impl Member<'_> {
    /// GPU entry and words of CUDA ordinal `device` on the short path's `route`: None
    /// if it is not the pool's, or the member left (which clears its routes first).
    #[inline(always)]
    fn routed(&self, device: usize) -> Option<(usize, &GpuWords<'_>)> {
        let r = self.route.get(device)?.load(Acquire);
        let g = ((r & !OWN_SHARE) as usize).wrapping_sub(1);
        Some((g, self.hot.get(g)?.as_ref()?))
    }

    /// Before the driver frees `bytes` this member holds on `device`: announces them
    /// (see the module's text). True if announced: the caller then calls
    /// [`complete_free`](Self::complete_free) once the driver freed them, or
    /// [`withdraw_free`](Self::withdraw_free) if it refused. False (nothing to do
    /// later): the device is not the pool's, or the member left.
    pub fn announce_free(&self, device: usize, bytes: u64) -> bool {
        let Some((_, h)) = self.routed(device) else {
            return false;
        };
        if bytes == 0 {
            return false;
        }
        // `freeing` first: a measurement reads `freed`, then `freeing` (module text).
        h.marks[T_FREEING].fetch_add(bytes, SeqCst);
        h.marks[T_FREED].fetch_add(bytes, SeqCst);
        true
    }

    /// The driver freed the `bytes` announced on `device`: credited to the pool (as
    /// [`credit`](Self::credit)), then the announcement ends.
    #[inline(always)]
    pub fn complete_free(&self, device: usize, bytes: u64) {
        // After leaving, the slot is no longer this member's: whoever takes it clears it.
        let Some((g, h)) = self.routed(device) else {
            return;
        };
        self.sub_at(h, bytes);
        end_announcement(h, bytes);
        if h.gpu[G_WAITERS].load(Acquire) > 0 {
            self.wake_waiters(g);
        }
    }

    /// The driver refused to free the `bytes` announced on `device`: the announcement
    /// ends, nothing is credited (`freed` keeps them: a measurement counts more, never
    /// less).
    pub fn withdraw_free(&self, device: usize, bytes: u64) {
        if let Some((_, h)) = self.routed(device) {
            end_announcement(h, bytes);
        }
    }

    /// After the pool reserved `bytes` on `device` for an allocation, before the driver
    /// call: marks it started. True if marked: the caller then calls
    /// [`alloc_ended`](Self::alloc_ended) once the driver answered.
    #[inline]
    pub fn alloc_started(&self, device: usize, bytes: u64) -> bool {
        let Some((_, h)) = self.routed(device) else {
            return false;
        };
        h.marks[T_STARTED].fetch_add(bytes, SeqCst);
        true
    }

    /// The driver answered an allocation marked started: `made` if it allocated the
    /// `bytes` on `device` in that call (device memory taken then), else not.
    #[inline]
    pub fn alloc_ended(&self, device: usize, bytes: u64, made: bool) {
        // After leaving, the slot is no longer this member's (its `started` is closed
        // by whoever takes it).
        if let Some((_, h)) = self.routed(device) {
            let word = if made { T_MADE } else { T_UNMADE };
            h.marks[word].fetch_add(bytes, SeqCst);
        }
    }

    /// What the pool's members had marked of their traffic on `device`, now (None: the
    /// device is not the pool's). See the module's text.
    pub fn marks(&self, device: usize) -> Option<PoolMarks> {
        let g = self.entry_of(device)?;
        // The slots ever taken (a pool of a few members reads a few, not all 256); one
        // taken later counts from zero (see `given_back_until`, `taken_until`).
        let seen = usize::try_from(self.w.header(H_SLOTS_SEEN).load(SeqCst))
            .map_or(self.w.slots(), |n| n.min(self.w.slots()));
        let mut marks = PoolMarks {
            freed: Vec::with_capacity(seen),
            made: Vec::with_capacity(seen),
            in_flight: Vec::with_capacity(seen),
            freeing: 0,
        };
        for s in 0..seen {
            let word = |i| self.w.mark(s, g, i).load(SeqCst);
            // In the orders the module's text needs.
            let (freed, freeing) = (word(T_FREED), word(T_FREEING));
            let (made, unmade, started) = (word(T_MADE), word(T_UNMADE), word(T_STARTED));
            marks.freed.push(freed);
            marks.made.push(made);
            let in_flight = started
                .checked_sub(made)
                .and_then(|f| f.checked_sub(unmade));
            marks.in_flight.push(in_flight);
            if freeing != 0 && self.locks.held(s) {
                marks.freeing = marks.freeing.saturating_add(freeing);
            }
        }
        Some(marks)
    }

    /// Called holding dead slot `d`'s lock: ends what it had in flight on GPU entry `g`
    /// (its announced frees, and allocations whose driver call never answered). On an
    /// entry no GPU has yet nothing was marked, and its words are left unread (each GPU's
    /// marks lie apart: a page each); a value a forged file left there only adds to a
    /// context's charge (`freeing`) or, never growing, takes nothing off it.
    pub(super) fn close_traffic(&self, d: usize, g: usize) {
        if !self.w.has_gpu(g) {
            return;
        }
        let word = |i| self.w.mark(d, g, i);
        word(T_FREEING).store(0, SeqCst);
        let open = word(T_STARTED)
            .load(SeqCst)
            .saturating_sub(word(T_MADE).load(SeqCst))
            .saturating_sub(word(T_UNMADE).load(SeqCst));
        word(T_UNMADE).fetch_add(open, SeqCst);
    }
}
