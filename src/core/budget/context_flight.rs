//! Contexts in flight: which members are making a context on a GPU at this moment.
//!
//! A context's memory is measured device-wide (the driver's free memory before and after
//! the call, see `contexts`), so a measurement holds what every other member's context
//! made at the same moment took. Rather than queueing the members (a pool's members
//! start together by the hundred, and a real context takes 100–500 ms to make), each
//! member says when its context starts and ends in the GPU entry's `contexts` word: the
//! count in flight (low 32 bits) and how many ever started (the bits above). One
//! `fetch_add` at the start and one `fetch_sub` at the end give, without a lock:
//!
//! - the contexts in flight when this one started (they may take their memory inside
//!   this one's window), and
//! - the contexts started while this one was in flight (the start count moved by more
//!   than this one's own).
//!
//! Their sum is [`Overlap::others`]: 0 means the measurement is this context's alone.
//! Each member also sets its slot's bit of the GPU entry (`S_CONTEXTS`) while its
//! context is in flight, so that whoever takes a dead member's slot back takes its
//! count out of the word ([`Member::close_context_flights`]). The count goes up before
//! the bit is set and down after it is cleared: a member killed between the two leaves
//! the count one too high (later measurements look overlapped: charged by the
//! expectation, never less), never one too low.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};

use super::layout::{
    CONTEXT_STARTED, CONTEXTS_IN_FLIGHT, G_CONTEXT_BYTES, G_CONTEXTS, MAX_POOL_GPUS, S_CONTEXTS,
};
use super::member::Member;

/// A context this member is making on a GPU of its pool ([`Member::context_started`]).
#[derive(Debug)]
#[must_use = "end the flight with Member::context_ended once the driver answered"]
pub struct ContextFlight {
    entry: usize,
    /// The `contexts` word before this start.
    before: u64,
}

/// What [`Member::context_ended`] found of the other members' contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    /// Contexts of other members in flight at some moment of this one's flight.
    pub others: u64,
}

impl Overlap {
    /// Whether no other member made a context on the GPU while this one was made.
    pub fn alone(&self) -> bool {
        self.others == 0
    }
}

/// The started-count part of a `contexts` word.
fn started(word: u64) -> u64 {
    word >> 32
}

impl Member<'_> {
    /// The pool's GPU entry of CUDA ordinal `device` (the GPU, whatever ordinal each
    /// member's `CUDA_VISIBLE_DEVICES` gives it), if registered.
    pub fn gpu_entry(&self, device: usize) -> Option<usize> {
        self.entry_of(device)
    }

    /// What a context on `device` took when a member measured one alone there (None:
    /// none has yet; see `note_context_bytes`).
    pub fn context_figure(&self, device: usize) -> Option<u64> {
        let g = self.entry_of(device)?;
        match self.w.gpu(g, G_CONTEXT_BYTES).load(Relaxed) {
            0 => None,
            least => Some(!least),
        }
    }

    /// Before the driver makes a context on CUDA ordinal `device`: counts it in flight on
    /// the pool's GPU entry (None: the device is not the pool's).
    pub fn context_started(&self, device: usize) -> Option<ContextFlight> {
        let g = self.entry_of(device)?;
        let before = self.w.gpu(g, G_CONTEXTS).fetch_add(CONTEXT_STARTED, SeqCst);
        self.w.slot(self.slot, S_CONTEXTS).fetch_or(1 << g, SeqCst);
        Some(ContextFlight { entry: g, before })
    }

    /// After the driver answered (and the context was measured): ends the flight, and
    /// says how many other members' contexts were in flight meanwhile.
    pub fn context_ended(&self, flight: ContextFlight) -> Overlap {
        let g = flight.entry;
        self.w
            .slot(self.slot, S_CONTEXTS)
            .fetch_and(!(1 << g), SeqCst);
        let now = take_one(self.w.gpu(g, G_CONTEXTS));
        let in_flight_before = flight.before & CONTEXTS_IN_FLIGHT;
        let started_since = started(now)
            .wrapping_sub(started(flight.before))
            .wrapping_sub(1)
            & CONTEXTS_IN_FLIGHT;
        // A forged word cannot make more overlapping contexts than a pool has slots.
        let others = (in_flight_before + started_since).min(self.w.slots() as u64);
        Overlap { others }
    }

    /// Called holding dead slot `d`'s lock: takes the contexts it was making out of the
    /// GPU entries' counts in flight.
    pub(super) fn close_context_flights(&self, d: usize) {
        let bits = self.w.slot(d, S_CONTEXTS).swap(0, SeqCst);
        for g in 0..MAX_POOL_GPUS {
            if bits & (1 << g) != 0 {
                take_one(self.w.gpu(g, G_CONTEXTS));
            }
        }
    }
}

/// Takes one context out of a `contexts` word's count in flight, never below zero (a
/// word another process cleared is not wrapped into the start count); returns the word
/// before.
fn take_one(word: &std::sync::atomic::AtomicU64) -> u64 {
    let mut seen = word.load(SeqCst);
    loop {
        if seen & CONTEXTS_IN_FLIGHT == 0 {
            return seen;
        }
        match word.compare_exchange_weak(seen, seen - 1, SeqCst, SeqCst) {
            Ok(w) => return w,
            Err(w) => seen = w,
        }
    }
}
