//! The map of live allocations: device pointer (or handle) → [`Charge`], for any number
//! of entries, without a lock or an allocation on the path of an insert or a remove.
//!
//! **The front** (`front.rs`): a fixed table of 1,024 slots, one per hash value, part of
//! the map itself (no table to find, no bounds check). An entry whose slot is free lives
//! there, inserted and removed with one compare-and-swap each: with the few live
//! allocations programs hold, nearly every entry. The rest go to the levels below, and
//! an insert or remove there pays one load and one comparison more for the front.
//!
//! **The levels.** Entries live in a table of buckets, each bucket one cache line of
//! keys (and a spill count) and one of packed charges. A key's home bucket comes from
//! its hash; when the home is full the entry goes to the next bucket with room, and
//! every bucket it passed counts one more spilled entry, so a search stops at the first
//! bucket whose spill count is zero. A removed entry's slot becomes empty again (no
//! tombstones), and its spill counts are taken back: a table's occupancy is its live
//! entries, however many keys came and went. The common case there (one table, the
//! entry in its home bucket) is a hash, a few loads and one compare-and-swap, inlined
//! into the caller; an entry spilled past its home bucket is the rest of the same probe,
//! out of line; only a table being moved or missing, and what the table cannot hold,
//! take the slow path.
//!
//! One file per job: `entry.rs` (the words of a slot: keys, packed charges, the hash),
//! `front.rs` (the direct-mapped front), `table.rs` (one level's lock-free table),
//! `overflow.rs` (the locked map for the rest), this one (the levels: growth, moving,
//! and the map's operations).
//!
//! **Growth.** Tables come in levels, level `i` holding `BASE_BUCKETS << i` buckets,
//! allocated once when needed and never freed (a reader may still hold an old one; each
//! is half the size of the next, so all of them together take less than twice the
//! newest). When too many entries of the newest table are crowded (past the first
//! ways of their home bucket, or outside it: about 58 % full), the next level is
//! allocated and becomes the newest: inserts go there, and every insert and remove
//! first moves a couple of buckets of the previous level into it, so the old table
//! empties while the program runs; nobody waits for a whole copy. Only two levels are
//! ever in use: the next growth waits until the previous move is done. The only
//! allocation is the new table's, once per doubling.
//!
//! **Moving one entry** keeps it findable: the mover marks the old slot's key with
//! `MOVING` (readers still match it and read its charge there), inserts it in the new
//! table, then seals the old slot (`MOVED`). Searches look in the old table first and
//! then in the new one, so an entry moved meanwhile is found in the new table. A
//! remove that meets its key while it is being moved waits for those few instructions.
//! Empty slots of a table being moved are sealed too, so a late insert there notices
//! and goes to the newest table.
//!
//! A key is unique in the map (in the front or in one level): the hooks take an
//! allocation out before the driver frees it, so the driver cannot hand its address to
//! another allocation while the entry is here. Keys the table cannot represent (0, 1
//! and the top half) and charges that do not pack into 64 bits go to a small locked
//! map; so do entries that find no room when growth is impossible (out of memory or
//! levels), and an entry whose neighbourhood is full while another thread's growth or
//! move stays under way longer than a short wait (a thread preempted halfway).

mod entry;
mod front;
mod overflow;
mod table;

use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicBool, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

pub use entry::Charge;
use entry::{BUSY, EMPTY, MOVING, fits_table, pack, unpack};
use front::Front;
use overflow::Overflow;
use table::{FAST_WAYS, Inserted, Table, Take, WAYS, backoff};

/// Buckets of the first table (8 KiB).
const BASE_BUCKETS: usize = 64;
/// Table levels: the last would hold `64 << 25` buckets (256 GiB), never reached.
const LEVELS: usize = 26;
/// Buckets of the old table that each insert or remove moves while a growth runs.
const MOVE_STEP: usize = 2;
/// Turns an insert whose neighbourhood is full waits for a growth under way before it
/// goes to the locked map (`backoff`: 64 spins, then yields of the CPU).
const FULL_WAIT_TURNS: u32 = 128;
/// Grow once more than 1/GROW_AT of the newest table's slots hold crowded entries
/// (about 58 % full with randomly spread keys, 75 % with evenly spread ones).
const GROW_AT: usize = 16;

/// Live allocations by key; see the [module documentation](self).
pub struct LiveMap {
    /// Where an entry goes first (see `front.rs`).
    front: Front,
    /// Level `l` at index `l + 1`; index 0 and those with [`MOVE_RUNS`] set stay empty,
    /// so `state` itself indexes the newest table when no move runs, and nothing
    /// otherwise: one masked load and one check, no bounds check.
    tables: [OnceLock<Table>; 2 * MOVE_RUNS],
    /// The number of levels allocated (the newest is `levels - 1`), plus [`MOVE_RUNS`]
    /// while the level before the newest is being moved: 0 before the first insert.
    state: AtomicUsize,
    /// Held by the one thread allocating the next level.
    growing: AtomicBool,
    overflow: Overflow,
}

/// In [`LiveMap::state`]: the level before the newest still has entries to move.
const MOVE_RUNS: usize = 32;
/// In [`LiveMap::state`]: the number of levels.
const LEVELS_MASK: usize = MOVE_RUNS - 1;
const _: () = assert!(LEVELS <= LEVELS_MASK);

impl Default for LiveMap {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveMap {
    pub const fn new() -> Self {
        LiveMap {
            front: Front::new(),
            tables: [const { OnceLock::new() }; 2 * MOVE_RUNS],
            state: AtomicUsize::new(0),
            growing: AtomicBool::new(false),
            overflow: Overflow::new(),
        }
    }

    #[inline(always)]
    fn table(&self, level: usize) -> Option<&Table> {
        self.tables.get(level.checked_add(1)?)?.get()
    }

    /// The newest table in `state`, when no move runs (the common case: one table).
    #[inline(always)]
    fn only_table(&self, state: usize) -> Option<&Table> {
        self.tables[state & (2 * MOVE_RUNS - 1)].get()
    }

    /// The first level a search must look at, oldest first: the previous level while
    /// its entries are being moved, else the newest.
    fn first_level(&self, levels: usize) -> usize {
        let newest = levels - 1;
        match newest.checked_sub(1).and_then(|l| self.table(l)) {
            Some(old) if !old.done() => newest - 1,
            _ => newest,
        }
    }

    /// Moves a few buckets of the previous level, if one is still being moved.
    #[inline(never)]
    fn help_move(&self, state: usize) {
        let Some(old_level) = (state & LEVELS_MASK).checked_sub(2) else {
            return;
        };
        let (Some(old), Some(new)) = (self.table(old_level), self.table(old_level + 1)) else {
            return;
        };
        let len = old.buckets.len();
        if old.next_move.load(Relaxed) >= len {
            return;
        }
        let first = old.next_move.fetch_add(MOVE_STEP, Relaxed);
        if first >= len {
            return;
        }
        let last = (first + MOVE_STEP).min(len);
        for i in first..last {
            old.move_bucket(i, new, &self.overflow);
        }
        if old.moved.fetch_add(last - first, AcqRel) + (last - first) == len {
            // The last bucket moved: searches need the newest level only. (A newer
            // growth may have changed the state already; then it is not ours to clear.)
            let moving = (old_level + 2) | MOVE_RUNS;
            let _ = self
                .state
                .compare_exchange(moving, moving & !MOVE_RUNS, AcqRel, Relaxed);
        }
    }

    /// Allocates level `level` unless another thread is doing it, it exists, or the
    /// level before the newest is still being moved. True when `level` exists afterwards.
    #[cold]
    fn grow(&self, level: usize) -> bool {
        if level >= LEVELS {
            return false;
        }
        if self.table(level).is_some() {
            return true;
        }
        if let Some(older) = level.checked_sub(2).and_then(|l| self.table(l))
            && !older.done()
        {
            return false;
        }
        if self
            .growing
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_err()
        {
            return false;
        }
        let mut made = self.table(level).is_some();
        if !made && let Some(t) = Table::try_new(BASE_BUCKETS << level) {
            made = self.tables[level + 1].set(t).is_ok();
            if made {
                // From here inserts go to the new level, and the previous one moves.
                let moving = if level > 0 { MOVE_RUNS } else { 0 };
                self.state.store((level + 1) | moving, Release);
            }
        }
        self.growing.store(false, Release);
        made
    }

    /// Inserts `key`, which must not be in the map (the hooks take an entry out before
    /// the driver can hand its address out again).
    #[inline(always)]
    pub fn insert(&self, key: u64, charge: Charge) {
        // The common case, in few instructions: the key's front slot is free. Then, in
        // the levels: one table, no move running, a free slot in the home bucket or the
        // next one. A fuller neighbourhood probes on (out of line, but still one table's
        // probe); only a missing, sealed or full table and a key or charge the table
        // cannot hold take the slow path.
        let (true, Some(packed)) = (fits_table(key), pack(charge)) else {
            return self.insert_slow(key, charge);
        };
        if self.front.insert(key, packed) {
            return;
        }
        let state = self.state.load(Acquire);
        if let Some(t) = self.only_table(state) {
            let (b, next) = t.home_and_next(key);
            for way in 0..WAYS {
                let slot = &b.keys[way];
                if slot.load(Relaxed) == EMPTY
                    && slot.compare_exchange(EMPTY, BUSY, Acquire, Relaxed).is_ok()
                {
                    b.charges[way].store(packed, Release);
                    slot.store(key, Release);
                    if way >= FAST_WAYS {
                        t.crowded.fetch_add(1, Relaxed);
                        self.crowded(t, state & LEVELS_MASK);
                    }
                    return;
                }
            }
            // Spilled one bucket on: the home bucket counts it first, so that a search
            // that misses it there goes on to `next`.
            b.spill.fetch_add(1, Release);
            for way in 0..WAYS {
                let slot = &next.keys[way];
                if slot.load(Relaxed) == EMPTY
                    && slot.compare_exchange(EMPTY, BUSY, Acquire, Relaxed).is_ok()
                {
                    next.charges[way].store(packed, Release);
                    slot.store(key, Release);
                    t.crowded.fetch_add(1, Relaxed);
                    self.crowded(t, state & LEVELS_MASK);
                    return;
                }
            }
            b.spill.fetch_sub(1, Release);
            return self.insert_beyond_home(t, state, key, packed, charge);
        }
        self.insert_slow(key, charge)
    }

    /// An insert whose home bucket is full: the rest of the one table's probe.
    #[inline(never)]
    fn insert_beyond_home(&self, t: &Table, state: usize, key: u64, packed: u64, charge: Charge) {
        if let Inserted::Done { .. } = t.insert_spilled(key, packed) {
            self.crowded(t, state & LEVELS_MASK);
            return;
        }
        self.insert_slow(key, charge)
    }

    /// After a crowded insert into `t`, the newest of `levels`: grow if the table is
    /// getting full.
    #[inline]
    fn crowded(&self, t: &Table, levels: usize) {
        if t.crowded.load(Relaxed) * GROW_AT > t.slots() {
            self.grow(levels);
        }
    }

    /// Any insert: into a table being moved or sealed, past a full first slot, of a key
    /// or charge the table cannot hold.
    #[cold]
    #[inline(never)]
    fn insert_slow(&self, key: u64, charge: Charge) {
        #[cfg(test)]
        tests::SLOW.with(|n| n.set(n.get() + 1));
        let (true, Some(packed)) = (fits_table(key), pack(charge)) else {
            return self.overflow.insert(key, charge);
        };
        let mut spins = 0;
        loop {
            let state = self.state.load(Acquire);
            let levels = state & LEVELS_MASK;
            let Some(t) = levels.checked_sub(1).and_then(|l| self.table(l)) else {
                // No table yet: make the first (another thread may be making it).
                if !self.grow(0) {
                    if self.growing.load(Acquire) {
                        backoff(&mut spins);
                    } else if self.table(0).is_none() {
                        // No memory for even the first table.
                        return self.overflow.insert(key, charge);
                    }
                }
                continue;
            };
            if state & MOVE_RUNS != 0 {
                self.help_move(state);
            }
            match t.insert(key, packed) {
                Inserted::Done { crowded } => {
                    if crowded {
                        self.crowded(t, levels);
                    }
                    return;
                }
                Inserted::Sealed => continue,
                Inserted::Full => {
                    if self.grow(levels) || (self.state.load(Acquire) & LEVELS_MASK) != levels {
                        continue;
                    }
                    // Another thread allocating the next level, or the last move not
                    // done (one growth at a time): a thread preempted halfway through
                    // either holds it back. Waited for a while, helping the move at each
                    // turn; then the locked map (bounded: never a wait on a thread that
                    // may not run again soon).
                    if spins < FULL_WAIT_TURNS
                        && (self.growing.load(Acquire) || self.state.load(Acquire) & MOVE_RUNS != 0)
                    {
                        #[cfg(test)]
                        tests::WHILE_FULL.with(|f| f.take().map(|f| f(self)));
                        backoff(&mut spins);
                        continue;
                    }
                    return self.overflow.insert(key, charge);
                }
            }
        }
    }

    #[inline(always)]
    pub fn remove(&self, key: u64) -> Option<Charge> {
        match self.remove_quick(key) {
            Some(c) => Some(c),
            None => self.remove_rest(key),
        }
    }

    /// [`remove`](Self::remove)'s common case alone, in few instructions: the entry if
    /// it lies in the front, or in its home bucket of the one table (no move running), or
    /// in the next one. None means only "not there": [`remove`](Self::remove) looks
    /// further. (A caller that branches on this keeps the charge in registers; the full
    /// remove returns it through memory.)
    #[inline(always)]
    pub fn remove_quick(&self, key: u64) -> Option<Charge> {
        if !fits_table(key) {
            return None;
        }
        if let Some(v) = self.front.take(key) {
            return Some(unpack(v));
        }
        let t = self.only_table(self.state.load(Acquire))?;
        let (b, next) = t.home_and_next(key);
        for way in 0..WAYS {
            let slot = &b.keys[way];
            if slot.load(Relaxed) == key {
                slot.compare_exchange(key, BUSY, Acquire, Relaxed).ok()?;
                let v = b.charges[way].load(Relaxed);
                slot.store(EMPTY, Release);
                if way >= FAST_WAYS {
                    t.crowded.fetch_sub(1, Relaxed);
                }
                return Some(unpack(v));
            }
        }
        if b.spill.load(Acquire) == 0 {
            return None;
        }
        for way in 0..WAYS {
            let slot = &next.keys[way];
            if slot.load(Relaxed) == key {
                slot.compare_exchange(key, BUSY, Acquire, Relaxed).ok()?;
                let v = next.charges[way].load(Acquire);
                slot.store(EMPTY, Release);
                // It spilled one bucket: the home bucket's count is taken back.
                b.spill.fetch_sub(1, Release);
                t.crowded.fetch_sub(1, Relaxed);
                return Some(unpack(v));
            }
        }
        None
    }

    /// The rest of a [`remove`](Self::remove) after [`remove_quick`](Self::remove_quick)
    /// found nothing (so the key is not in the front): the rest of the one table's probe
    /// if the entry spilled past its home bucket, else the slow way (a key absent from
    /// the table, being moved, in the locked map, or a table being moved).
    #[inline(never)]
    pub fn remove_rest(&self, key: u64) -> Option<Charge> {
        if fits_table(key)
            && let Some(t) = self.only_table(self.state.load(Acquire))
            && let Some(c) = t.take_spilled(key)
        {
            return Some(c);
        }
        self.remove_slow(key)
    }

    #[cold]
    #[inline(never)]
    fn remove_slow(&self, key: u64) -> Option<Charge> {
        #[cfg(test)]
        tests::SLOW.with(|n| n.set(n.get() + 1));
        if !fits_table(key) {
            return self.overflow.remove(key);
        }
        'search: loop {
            let state = self.state.load(Acquire);
            let mut levels = state & LEVELS_MASK;
            if levels == 0 {
                return self.overflow.remove(key);
            }
            if state & MOVE_RUNS != 0 {
                self.help_move(state);
            }
            let mut level = self.first_level(levels);
            while let Some(t) = self.table(level) {
                match t.take(key) {
                    Take::Taken(c) => return Some(c),
                    Take::Retry(word) => {
                        if word != key {
                            // Being moved to the next level: wait for it to land there.
                            let b = t.find(key);
                            let mut spins = 0;
                            while let Some(f) = &b
                                && t.buckets[f.bucket].keys[f.way].load(Acquire) == word
                            {
                                backoff(&mut spins);
                            }
                        }
                        continue 'search;
                    }
                    Take::Absent => {}
                }
                if level + 1 >= levels {
                    // A newer level may have appeared while this one was searched.
                    levels = self.state.load(Acquire) & LEVELS_MASK;
                    if level + 1 >= levels {
                        break;
                    }
                }
                level += 1;
            }
            return self.overflow.remove(key);
        }
    }

    pub fn get(&self, key: u64) -> Option<Charge> {
        if !fits_table(key) {
            return self.overflow.get(key);
        }
        if let Some(c) = self.front.get(key) {
            return Some(c);
        }
        let mut levels = self.state.load(Acquire) & LEVELS_MASK;
        if levels > 0 {
            let mut level = self.first_level(levels);
            while let Some(t) = self.table(level) {
                if let Some(c) = t.get(key) {
                    return Some(c);
                }
                if level + 1 >= levels {
                    levels = self.state.load(Acquire) & LEVELS_MASK;
                    if level + 1 >= levels {
                        break;
                    }
                }
                level += 1;
            }
        }
        self.overflow.get(key)
    }

    /// A snapshot of the entries whose charge satisfies `keep` (entries added or
    /// removed meanwhile may or may not appear; the others appear once each).
    pub fn matching(&self, keep: impl Fn(&Charge) -> bool) -> Vec<(u64, Charge)> {
        let mut out = Vec::new();
        self.front.matching(&keep, &mut out);
        let levels = self.state.load(Acquire) & LEVELS_MASK;
        if levels > 0 {
            let mut level = self.first_level(levels);
            while let Some(t) = self.table(level) {
                for b in t.buckets.iter() {
                    for way in 0..WAYS {
                        let k = b.keys[way].load(Acquire) & !MOVING;
                        if !fits_table(k) {
                            continue;
                        }
                        let v = b.charges[way].load(Acquire);
                        if b.keys[way].load(Relaxed) & !MOVING == k {
                            let c = unpack(v);
                            if keep(&c) {
                                out.push((k, c));
                            }
                        }
                    }
                }
                level += 1;
                if level >= (self.state.load(Acquire) & LEVELS_MASK) {
                    break;
                }
            }
        }
        // An entry seen in the old level and again once moved counts once (and one
        // taken from the front and put in a level meanwhile).
        out.sort_unstable_by_key(|&(k, _)| k);
        out.dedup_by_key(|&mut (k, _)| k);
        self.overflow.matching(&keep, &mut out);
        out
    }
}

#[cfg(test)]
mod tests;
