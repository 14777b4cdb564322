//! What the members give back and take around their driver calls, marked in words of
//! their own, so that a member measuring what its new context took (the device's free
//! memory before minus after, see `contexts`) can take the others' traffic out of the
//! measurement: memory freed inside that window would be taken off the context's charge
//! (and a context charged short lets the pool hold more than its cap); memory allocated
//! inside it would be added to it.
//!
//! Per GPU entry, each member has these words, which only its own threads write:
//! `freeing` (bytes of frees announced, not yet credited or withdrawn), and five that
//! only go up and are never cleared (a slot's next owner counts on): `freed` (every byte
//! announced), `started` (every byte reserved for an allocation, before its driver
//! call), `made` (of those, every byte the driver allocated, after its call), `unmade`
//! (every byte it did not: refused, rolled back, or memory the driver backs later, such
//! as managed memory) and `unsure` (of `freed`, the bytes of announcements withdrawn:
//! the driver refused, or an upper bound ended, that it may not have given back):
//!
//! ```text
//! free:   freeing += b;  freed += b;  driver;  credit (see `used`);  freeing -= b
//!         (withdrawn: unsure += b; freeing -= b, `freed` keeps it)
//! alloc:  reserve;  started += b;  driver;  made += b   (or unmade += b)
//! ```
//!
//! `unsure` only says how far a measurement may be high (`contexts::window`'s doubt,
//! which decides whether a call that can be undone is made again), never what it
//! charges.
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
//! off: the context is charged more, never less. Traffic that falls inside a device read
//! itself is counted so too, and under a churning pool that is far more than the call
//! took: a read the traffic moved during (`activity`) is made again (`contexts::window`). The marks leave `own` and `pending`
//! alone, so a recount of `used` is untouched by them. A member killed inside a free
//! leaves `freeing` set and inside an allocation `started` ahead: whoever takes its
//! share back clears the one and closes the other (`unmade`); a measurement counts the
//! `freeing` of live slots only. A member leaving at exit announces what it still holds
//! (the driver frees it when the process ends; counted if the exit falls in the window).
//! Left over: a member killed inside another's window (the driver frees its memory,
//! nothing announced it), memory the pool is credited for when it reads it again (a
//! stream-ordered pool that released memory at a synchronisation or a trim), and
//! processes outside the pool.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, SeqCst};

use super::gpu_words::GpuWords;
use super::layout::{
    G_WAITERS, H_SLOTS_SEEN, MARK_WORDS, T_FREED, T_FREEING, T_MADE, T_STARTED, T_UNMADE, T_UNSURE,
};
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

/// A pool's traffic marks on one GPU, as a measurement of what the driver took on its
/// own reads them around its window ([`Member::traffic`]; see the module's text). Each
/// read keeps only what a later read is weighed against: what a start keeps beside
/// 1,000 members is a few pages, not one copy of every member's words per read.
#[derive(Clone, Copy)]
pub struct PoolTraffic<'m, 'w> {
    member: &'m Member<'w>,
    /// The pool's GPU entry.
    g: usize,
    /// What the measuring member reserved for the call before it (a context's or a
    /// stack's expected bytes: [`holding`](Self::holding)), marked started in its own slot
    /// and not its traffic.
    own_held: u64,
}

/// What a measurement keeps of its read right before the window
/// ([`PoolTraffic::freed_before`]): each slot's `freed`, and the `freeing` of the slots
/// a live process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreedBefore {
    freed: Vec<u64>,
    freeing: u64,
    /// Each slot's `unsure`, read before its `freed`.
    unsure: Vec<u64>,
}

/// What a measurement keeps of its read right inside the window
/// ([`PoolTraffic::made_inside`]): per slot, `made` and what was in flight (`started -
/// made - unmade`; None where the words cannot be: `started` behind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeInside {
    slots: Vec<(u64, Option<u64>)>,
}

impl<'w> PoolTraffic<'_, 'w> {
    /// The marks of the slots ever taken (a pool of a few members reads a few, not all
    /// 256), on this GPU; one taken after a read counts from zero (see
    /// `given_back_since`, `taken_since`).
    fn marks(&self) -> &'w [[AtomicU64; MARK_WORDS]] {
        let w = &self.member.w;
        let seen = usize::try_from(w.header(H_SLOTS_SEEN).load(SeqCst)).unwrap_or(usize::MAX);
        w.marks_of(self.g, seen)
    }

    /// Read right before the window's "before" read: each slot's `freed`, then its
    /// `freeing` (in that order: see the module's text).
    pub fn freed_before(&self) -> FreedBefore {
        let marks = self.marks();
        let mut before = FreedBefore {
            freed: Vec::with_capacity(marks.len()),
            freeing: 0,
            unsure: Vec::with_capacity(marks.len()),
        };
        for (s, m) in marks.iter().enumerate() {
            before.unsure.push(m[T_UNSURE].load(SeqCst));
            before.freed.push(m[T_FREED].load(SeqCst));
            let freeing = m[T_FREEING].load(SeqCst);
            if freeing != 0 && self.member.locks.held(s) {
                before.freeing = before.freeing.saturating_add(freeing);
            }
        }
        before
    }

    /// Read right after the window's "after" read: the bytes the members may have given
    /// back to the driver since `before` — each slot's `freed` growth (all of it where the
    /// word went down: rewritten by another process) and the bytes announced before the
    /// window and not yet credited. A slot `before` did not read counts from zero:
    /// nothing was marked in it before.
    pub fn given_back_since(&self, before: &FreedBefore) -> u64 {
        self.grown_since(T_FREED, &before.freed)
            .saturating_add(before.freeing)
    }

    /// The growth of every slot's word `word` since `before` (that word of each slot, in
    /// order): all of it where the word went down (rewritten by another process); a slot
    /// `before` did not read counts from zero.
    fn grown_since(&self, word: usize, before: &[u64]) -> u64 {
        self.marks()
            .iter()
            .enumerate()
            .map(|(s, m)| {
                let (a, b) = (m[word].load(SeqCst), before.get(s).copied().unwrap_or(0));
                if a >= b { a - b } else { a }
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The sum of every slot's words that only go up (`freed`, `started`, `made`,
    /// `unmade`): read before and after a device read, an unchanged sum says no member's
    /// free or allocation fell inside it (`contexts::window` makes such a read again).
    pub fn activity(&self) -> u64 {
        self.marks()
            .iter()
            .map(|m| {
                m[T_FREED]
                    .load(SeqCst)
                    .wrapping_add(m[T_STARTED].load(SeqCst))
                    .wrapping_add(m[T_MADE].load(SeqCst))
                    .wrapping_add(m[T_UNMADE].load(SeqCst))
            })
            .fold(0u64, u64::wrapping_add)
    }

    /// The same marks, the measuring member having reserved `bytes` for the call before
    /// the window (marked started in its own slot, ended only once the call is charged):
    /// that reservation is not an allocation in flight. Counted as one, it cancelled as
    /// much of the member's own threads' allocations inside the window, and the call was
    /// charged them (a 396 MiB stack reserved first, then measured beside the member's
    /// own churn, was charged up to 516 MiB; four raised at once under a 2 GiB cap that
    /// held them: refused in 4 runs of 10).
    pub fn holding(self, bytes: u64) -> Self {
        PoolTraffic {
            own_held: bytes,
            ..self
        }
    }

    /// Read right after the window's "before" read: each slot's `made`, `unmade`, then
    /// `started` (in that order: see the module's text). The measuring member's own
    /// reservation for the call ([`holding`](Self::holding)) is taken out of its slot's
    /// allocations in flight.
    pub fn made_inside(&self) -> MadeInside {
        let own = self.member.slot;
        let slots = self
            .marks()
            .iter()
            .enumerate()
            .map(|(s, m)| {
                let made = m[T_MADE].load(SeqCst);
                let unmade = m[T_UNMADE].load(SeqCst);
                let started = m[T_STARTED].load(SeqCst);
                let in_flight = started
                    .checked_sub(made)
                    .and_then(|f| f.checked_sub(unmade))
                    .map(|f| match s == own {
                        true => f.saturating_sub(self.own_held),
                        false => f,
                    });
                (made, in_flight)
            })
            .collect();
        MadeInside { slots }
    }

    /// Read right before the window's "after" read: the bytes the members surely had
    /// the driver allocate since `first` — per slot, the growth of `made` less what was in
    /// flight at `first`. A slot `first` did not read had nothing in flight then: its
    /// first allocation started after `first`.
    pub fn taken_since(&self, first: &MadeInside) -> u64 {
        self.made_since(first, |grown, in_flight| {
            in_flight.map_or(0, |f| grown.saturating_sub(f))
        })
    }

    /// Per slot, `part` of the growth of `made` since `first` and what was in flight at
    /// `first` (None: its words were behind), summed; a slot whose `made` went down counts
    /// none, and one `first` did not read had nothing in flight then.
    fn made_since(&self, first: &MadeInside, part: impl Fn(u64, Option<u64>) -> u64) -> u64 {
        self.marks()
            .iter()
            .enumerate()
            .map(|(s, m)| {
                let a = m[T_MADE].load(SeqCst);
                match first.slots.get(s).copied().unwrap_or((0, Some(0))) {
                    (b, in_flight) if a >= b => part(a - b, in_flight),
                    _ => 0,
                }
            })
            .fold(0u64, u64::saturating_add)
    }
}

impl FreedBefore {
    /// The bytes announced before the window and not yet credited: added back, though
    /// their driver call may have come before the window's "before" read.
    pub fn announced(&self) -> u64 {
        self.freeing
    }
}

impl PoolTraffic<'_, '_> {
    /// Read with [`given_back_since`](Self::given_back_since): of the bytes it adds back,
    /// those withdrawn since `before` (each slot's `unsure` growth): the driver may not
    /// have given them back, and the measurement may be this much above what its call
    /// took (one still announced is counted by [`freeing_now`](Self::freeing_now)).
    pub fn overstated_since(&self, before: &FreedBefore) -> u64 {
        self.grown_since(T_UNSURE, &before.unsure)
    }

    /// Read with [`taken_since`](Self::taken_since): the bytes the members had the driver
    /// allocate since `first` that were in flight at `first` — left in the measurement
    /// (their driver call may have come before the window), so that it may be this much
    /// above what the call took. A slot whose words were behind at `first` counts all
    /// its growth.
    pub fn left_in_since(&self, first: &MadeInside) -> u64 {
        self.made_since(first, |grown, in_flight| {
            in_flight.map_or(grown, |f| grown.min(f))
        })
    }

    /// The bytes of frees the live members announced and have not finished now: added
    /// back (announced inside the window), their driver call may come after it, so the
    /// measurement may be this much above what its call took.
    pub fn freeing_now(&self) -> u64 {
        self.marks()
            .iter()
            .enumerate()
            .filter(|&(s, m)| m[T_FREEING].load(SeqCst) != 0 && self.member.locks.held(s))
            .map(|(_, m)| m[T_FREEING].load(SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// The bytes the members have in flight now (started, neither made nor unmade; the
    /// measuring member's own reservation for the call left out): their driver call may
    /// have come inside the window and not be marked made yet (a resident's reservation
    /// stays in flight until its own measurement is charged), so the measurement may be
    /// this much above what the call took. A slot whose words are behind counts none.
    pub fn in_flight(&self) -> u64 {
        let own = self.member.slot;
        self.marks()
            .iter()
            .enumerate()
            .filter_map(|(s, m)| {
                let (made, unmade) = (m[T_MADE].load(SeqCst), m[T_UNMADE].load(SeqCst));
                let f = m[T_STARTED]
                    .load(SeqCst)
                    .checked_sub(made)?
                    .checked_sub(unmade)?;
                Some(match s == own {
                    true => f.saturating_sub(self.own_held),
                    false => f,
                })
            })
            .fold(0u64, u64::saturating_add)
    }
}

impl<'a> Member<'a> {
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

    /// The announcement of the `bytes` on `device` ends with nothing credited: the driver
    /// refused, or they were an upper bound whose caller settles what was given back
    /// (`freed` keeps them: a measurement counts more, never less; `unsure` says so, for a
    /// measurement that added them back to know its figure may be that much high).
    pub fn withdraw_free(&self, device: usize, bytes: u64) {
        if let Some((_, h)) = self.routed(device) {
            h.marks[T_UNSURE].fetch_add(bytes, SeqCst);
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

    /// The pool's traffic marks on `device`, for a measurement to read (None: the device
    /// is not the pool's). See the module's text.
    pub fn traffic(&self, device: usize) -> Option<PoolTraffic<'_, 'a>> {
        Some(PoolTraffic {
            member: self,
            g: self.entry_of(device)?,
            own_held: 0,
        })
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
