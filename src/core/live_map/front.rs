//! The live map's front: a small direct-mapped table in front of the growing levels,
//! one slot (a key and its packed charge) per value of the hash's top bits. A program
//! holds few allocations at a time (a framework's caching allocator keeps a few large
//! blocks, not thousands of small ones), so nearly every entry finds its one slot free
//! and is inserted and removed there: a hash, one compare-and-swap each way, no table
//! to find, no bounds check (the index is below the array's length by construction),
//! no spill counts and no moves. An entry whose slot is taken goes to the levels; once
//! many entries are live the front is full and costs an insert or a remove one load
//! and one comparison more.
//!
//! A slot is claimed by an insert (empty to [`BUSY`], the charge, then the key) and by
//! the remove of its key (key to [`BUSY`], the charge read, then empty): one
//! compare-and-swap each. A key is in the front or in the levels, never both: the hooks
//! insert a key once, and remove it only after its insert returned.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use super::entry::{BUSY, Charge, EMPTY, fits_table, hash, unpack};

/// The front holds `1 << FRONT_BITS` slots (16 KiB).
const FRONT_BITS: u32 = 10;
const FRONT_SLOTS: usize = 1 << FRONT_BITS;

/// A key (or [`EMPTY`], or [`BUSY`] while an insert writes the charge or a remove reads
/// it) and its charge, side by side: aligned to their size, one cache line holds both.
#[repr(C, align(16))]
struct Slot {
    key: AtomicU64,
    charge: AtomicU64,
}

pub(super) struct Front {
    slots: [Slot; FRONT_SLOTS],
}

impl Front {
    pub(super) const fn new() -> Self {
        Front {
            slots: [const {
                Slot {
                    key: AtomicU64::new(EMPTY),
                    charge: AtomicU64::new(0),
                }
            }; FRONT_SLOTS],
        }
    }

    /// The one slot `key` may live in.
    #[inline(always)]
    fn slot(&self, key: u64) -> &Slot {
        // The top FRONT_BITS bits of the hash: below FRONT_SLOTS, no bounds check.
        &self.slots[(hash(key) >> (64 - FRONT_BITS)) as usize]
    }

    /// Inserts `key` (which [`fits_table`]) with its `packed` charge if its slot is
    /// free; false, with nothing changed, if it is not.
    #[inline(always)]
    pub(super) fn insert(&self, key: u64, packed: u64) -> bool {
        let s = self.slot(key);
        if s.key.load(Relaxed) != EMPTY
            || s.key
                .compare_exchange(EMPTY, BUSY, Acquire, Relaxed)
                .is_err()
        {
            return false;
        }
        s.charge.store(packed, Relaxed);
        // Release: whoever sees the key sees its charge.
        s.key.store(key, Release);
        true
    }

    /// Takes `key` out of the front: its packed charge, or None if it is not here.
    #[inline(always)]
    pub(super) fn take(&self, key: u64) -> Option<u64> {
        let s = self.slot(key);
        if s.key.load(Relaxed) != key {
            return None;
        }
        // Claimed first, the charge read under the claim: a racing remove of the same key
        // (a program freeing a pointer twice at once) loses the swap and finds the key
        // nowhere, and one that won after the address was handed out again reads the
        // new entry's charge, never a stale one. Acquire: the charge written before the
        // key is the one read.
        s.key.compare_exchange(key, BUSY, Acquire, Relaxed).ok()?;
        let v = s.charge.load(Relaxed);
        // Release: the charge was read before an insert can claim the slot again.
        s.key.store(EMPTY, Release);
        Some(v)
    }

    /// The charge of `key`, if it is in the front.
    pub(super) fn get(&self, key: u64) -> Option<Charge> {
        let s = self.slot(key);
        if s.key.load(Acquire) != key {
            return None;
        }
        let v = s.charge.load(Acquire);
        // The slot may have been emptied and reused meanwhile: the charge counts only if
        // the key is still there.
        (s.key.load(Acquire) == key).then(|| unpack(v))
    }

    /// Appends to `out` the front's entries whose charge satisfies `keep`.
    pub(super) fn matching(&self, keep: &impl Fn(&Charge) -> bool, out: &mut Vec<(u64, Charge)>) {
        for s in &self.slots {
            let k = s.key.load(Acquire);
            if !fits_table(k) {
                continue;
            }
            let v = s.charge.load(Acquire);
            if s.key.load(Acquire) == k {
                let c = unpack(v);
                if keep(&c) {
                    out.push((k, c));
                }
            }
        }
    }

    /// Whether every slot holds an entry (tests fill it to reach the levels).
    #[cfg(test)]
    pub(super) fn is_full(&self) -> bool {
        self.slots.iter().all(|s| fits_table(s.key.load(Acquire)))
    }

    /// Whether `key`'s slot is free (tests pick keys that go to the front).
    #[cfg(test)]
    pub(super) fn has_room_for(&self, key: u64) -> bool {
        self.slot(key).key.load(Acquire) == EMPTY
    }
}
