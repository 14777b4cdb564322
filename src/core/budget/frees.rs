//! A member's frees, announced to the pool before the driver frees the memory, so that
//! another member measuring what its new context took (the device's free memory
//! before minus after, see `contexts`) can add back what the members gave back inside
//! that window: memory freed there would otherwise be taken off the context's charge,
//! and a context charged short lets the pool hold more than its cap.
//!
//! Per GPU entry, each member has two words that only its own threads write:
//! `freeing` (bytes announced, not yet credited or withdrawn) and `freed` (every byte
//! ever announced in the slot: it only goes up, and is never cleared). A free:
//!
//! ```text
//! announce:  freeing += bytes;  freed += bytes         before the driver call
//! complete:  the credit (see `used`);  freeing -= bytes   the driver freed them
//! withdraw:  freeing -= bytes                          the driver refused
//! ```
//!
//! A measurement reads each slot's `freed`, then its `freeing`, before its window (before
//! the device-wide "before" read), and every `freed` again after it (after the "after"
//! read); it adds back the growth of each slot's `freed` and the `freeing` it read first.
//! A free whose driver call falls inside the window is in one of the two: its `freed`
//! went up after the first read of that slot (and before the driver call, so before the
//! second read), or before it, and then its `freeing` went up before the read of
//! `freeing` that follows and comes down only after the driver call, inside the window.
//! Frees announced around the window but made outside it are added back too: the
//! context is charged more, never less. Neither word depends on `used`, so a member's
//! reservation inside the window (in `used` at once, in the driver's figure only later)
//! cannot hide another's free, as a net change of `used` would.
//!
//! The announced bytes stay in the member's own use until the credit, so a recount of
//! `used` is untouched by them. A member killed after announcing leaves `freeing` set,
//! cleared with its other words when its share is taken back; a measurement counts only
//! the `freeing` of slots a live process holds. Left over: a member that dies inside
//! another's window (the driver frees its memory, nothing announced it), and processes
//! outside the pool.

use std::sync::atomic::Ordering::*;

use super::hot::Hot;
use super::layout::*;
use super::member::Member;

/// Takes `bytes` off the member's `freeing` (never below zero: a word another process
/// cleared is not wrapped round).
#[inline]
fn end_announcement(h: &Hot<'_>, bytes: u64) {
    let freeing = &h.mine[M_FREEING];
    let before = freeing.fetch_sub(bytes, SeqCst);
    if before < bytes {
        freeing.fetch_add(bytes - before, SeqCst);
    }
}

/// What the members of a pool had announced of their frees on one GPU, read at one
/// moment ([`Member::free_marks`]): one before a measurement's window, one after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeMarks {
    /// Each slot's `freed`.
    freed: Vec<u64>,
    /// The `freeing` of the slots a live process holds.
    freeing: u64,
}

impl FreeMarks {
    /// The bytes the members may have given back to the driver between `self` (read
    /// before a window) and `after` (read after it): each slot's `freed` growth (all of
    /// `after`'s where the word went down: rewritten by another process), and the bytes
    /// announced before the window and not yet credited.
    pub fn given_back_until(&self, after: &FreeMarks) -> u64 {
        let grown = self
            .freed
            .iter()
            .zip(&after.freed)
            .map(|(&b, &a)| if a >= b { a - b } else { a })
            .fold(0u64, u64::saturating_add);
        grown.saturating_add(self.freeing)
    }
}

impl Member<'_> {
    /// Before the driver frees `bytes` this member holds on `device`: announces them
    /// (see the module's text). True if announced: the caller then calls
    /// [`complete_free`](Self::complete_free) once the driver freed them, or
    /// [`withdraw_free`](Self::withdraw_free) if it refused. False (nothing to do
    /// later): the device is not the pool's, or the member left.
    pub fn announce_free(&self, device: usize, bytes: u64) -> bool {
        let Some(h) = self.entry_of(device).and_then(|g| self.hot(g)) else {
            return false;
        };
        if bytes == 0 || self.left.load(Acquire) {
            return false;
        }
        // `freeing` first: a measurement reads `freed`, then `freeing` (module text).
        h.mine[M_FREEING].fetch_add(bytes, SeqCst);
        h.mine[M_FREED].fetch_add(bytes, SeqCst);
        true
    }

    /// The driver freed the `bytes` announced on `device`: credited to the pool (as
    /// [`credit`](Self::credit)), then the announcement ends.
    pub fn complete_free(&self, device: usize, bytes: u64) {
        let Some(g) = self.entry_of(device) else {
            return;
        };
        // After leaving, the slot is no longer this member's: whoever takes it clears it.
        if self.left.load(Acquire) {
            return;
        }
        let Some(h) = self.hot(g) else {
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
        if self.left.load(Acquire) {
            return;
        }
        if let Some(h) = self.entry_of(device).and_then(|g| self.hot(g)) {
            end_announcement(h, bytes);
        }
    }

    /// What the pool's members had announced of their frees on `device`, now (None:
    /// the device is not the pool's). See the module's text.
    pub fn free_marks(&self, device: usize) -> Option<FreeMarks> {
        let g = self.entry_of(device)?;
        let mut marks = FreeMarks {
            freed: Vec::with_capacity(MAX_SLOTS),
            freeing: 0,
        };
        for s in 0..MAX_SLOTS {
            let freed = self.w.member_gpu(s, g, M_FREED).load(SeqCst);
            let freeing = self.w.member_gpu(s, g, M_FREEING).load(SeqCst);
            marks.freed.push(freed);
            if freeing != 0 && self.locks.held(s) {
                marks.freeing = marks.freeing.saturating_add(freeing);
            }
        }
        Some(marks)
    }
}
