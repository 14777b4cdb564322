//! The map of live allocations: device pointer (or handle) → [`Charge`], for any number
//! of entries, without a lock or an allocation on the path of an insert or a remove.
//!
//! Entries live in a table of buckets, each bucket one cache line of keys (and a spill
//! count) and one of packed charges. A key's home bucket comes from its hash; when the
//! home is full the entry goes to the next bucket with room, and every bucket it passed
//! counts one more spilled entry, so a search stops at the first bucket whose spill count
//! is zero. A removed entry's slot becomes empty again (no tombstones), and its spill
//! counts are taken back: a table's occupancy is its live entries, however many keys
//! came and went. The common case (one table, the entry among the first [`FAST_WAYS`]
//! slots of its home bucket) is a hash, a few loads and one compare-and-swap, inlined
//! into the caller; everything else takes an out-of-line path.
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
//! [`MOVING`] (readers still match it and read its charge there), inserts it in the new
//! table, then seals the old slot ([`MOVED`]). Searches look in the old table first and
//! then in the new one, so an entry moved meanwhile is found in the new table. A
//! remove that meets its key while it is being moved waits for those few instructions.
//! Empty slots of a table being moved are sealed too, so a late insert there notices
//! and goes to the newest table.
//!
//! A key is unique in the map: the hooks take an allocation out before the driver
//! frees it, so the driver cannot hand its address to another allocation while the
//! entry is here. Keys the table cannot represent (0, 1 and the top half) and
//! charges that do not pack into 64 bits go to a small locked map; so do entries that
//! find no room when growth is impossible (out of memory or levels).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// What a live allocation is charged with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub device: usize,
    pub bytes: u64,
}

/// Slots per bucket: seven keys and the spill count fill one 64-byte line.
const WAYS: usize = 7;
/// Buckets of the first table (8 KiB).
const BASE_BUCKETS: usize = 64;
/// Table levels: the last would hold `64 << 25` buckets (256 GiB), never reached.
const LEVELS: usize = 26;
/// Buckets of the old table that each insert or remove moves while a growth runs.
const MOVE_STEP: usize = 2;
/// The first ways of a bucket, which inserts and removes try in few instructions; an
/// entry beyond them (or outside its home bucket) is "crowded".
const FAST_WAYS: usize = 5;
/// Grow once more than 1/GROW_AT of the newest table's slots hold crowded entries
/// (about 58 % full with randomly spread keys, 75 % with evenly spread ones).
const GROW_AT: usize = 16;

/// A slot never used or emptied by a remove.
const EMPTY: u64 = 0;
/// A slot of a table whose entries moved to the next level: nothing goes there again.
const MOVED: u64 = 1;
/// Set on a key while its entry is being copied to the next level.
const MOVING: u64 = 1 << 63;
/// A slot claimed by one thread: an insert writing it, or a remove reading it. (Key 0
/// being moved, were 0 a key.)
const BUSY: u64 = MOVING;
// Keys the table holds are 2..2^63 (`fits_table`): with or without MOVING they never
// equal EMPTY, MOVED or BUSY.

const BYTES_BITS: u32 = 56;

#[inline(always)]
fn pack(c: Charge) -> Option<u64> {
    (c.device < 256 && c.bytes < 1 << BYTES_BITS)
        .then_some((c.device as u64) << BYTES_BITS | c.bytes)
}

#[inline(always)]
fn unpack(v: u64) -> Charge {
    Charge {
        device: (v >> BYTES_BITS) as usize,
        bytes: v & ((1 << BYTES_BITS) - 1),
    }
}

#[inline(always)]
fn fits_table(key: u64) -> bool {
    // 2..2^63 in one comparison.
    key as i64 > 1
}

/// Spreads all the key's bits over the top ones, which pick the bucket. Pointers are
/// aligned and often evenly spaced: one multiply would leave keys 4 KiB apart in a
/// tenth of the buckets, so the product's high half is folded back and mixed again
/// (keys 8 B to 2 MiB apart then fill buckets like random ones).
#[inline(always)]
fn hash(key: u64) -> u64 {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h ^ (h >> 32)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Waits for another thread's few instructions on a slot (it may have been preempted).
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[repr(C, align(64))]
struct Bucket {
    keys: [AtomicU64; WAYS],
    /// Entries that passed this bucket full and live further on.
    spill: AtomicU64,
    charges: [AtomicU64; WAYS],
}

impl Bucket {
    fn new() -> Self {
        Bucket {
            keys: [const { AtomicU64::new(EMPTY) }; WAYS],
            spill: AtomicU64::new(0),
            charges: [const { AtomicU64::new(0) }; WAYS],
        }
    }
}

/// Where an entry was found: bucket index (from its home) and way.
struct Found {
    bucket: usize,
    distance: usize,
    way: usize,
    key: u64,
}

enum Take {
    Taken(Charge),
    Absent,
    /// Seen with this key word but not taken (being moved, or a racing remove).
    Retry(u64),
}

enum Inserted {
    Done {
        crowded: bool,
    },
    /// The table is being moved to the next level: insert there.
    Sealed,
    /// No room anywhere in the table.
    Full,
}

struct Table {
    buckets: Box<[Bucket]>,
    /// 64 - log2(buckets): the hash's top bits pick the home bucket.
    shift: u32,
    /// Crowded entries (beyond [`FAST_WAYS`] or outside their home bucket): the load
    /// that triggers growth.
    crowded: AtomicUsize,
    /// The next bucket to move to the next level.
    next_move: AtomicUsize,
    /// Buckets moved: all of them once the next level holds every entry.
    moved: AtomicUsize,
}

impl Table {
    /// A table of `buckets` buckets, or None when the memory is not there.
    fn try_new(buckets: usize) -> Option<Table> {
        let mut v = Vec::new();
        v.try_reserve_exact(buckets).ok()?;
        v.extend((0..buckets).map(|_| Bucket::new()));
        Some(Table {
            shift: 64 - buckets.trailing_zeros(),
            buckets: v.into_boxed_slice(),
            crowded: AtomicUsize::new(0),
            next_move: AtomicUsize::new(0),
            moved: AtomicUsize::new(0),
        })
    }

    #[inline(always)]
    fn home_bucket(&self, key: u64) -> &Bucket {
        &self.buckets[self.home(key)]
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the top bits of the product.
        (hash(key) >> self.shift) as usize
    }

    fn slots(&self) -> usize {
        self.buckets.len() * WAYS
    }

    fn done(&self) -> bool {
        self.moved.load(Acquire) == self.buckets.len()
    }

    #[inline(always)]
    fn insert(&self, key: u64, packed: u64) -> Inserted {
        let mask = self.buckets.len() - 1;
        let home = self.home(key);
        for distance in 0..self.buckets.len() {
            let b = &self.buckets[(home + distance) & mask];
            for way in 0..WAYS {
                // Acquire: a sealed slot seen here means the newer level is visible.
                match b.keys[way].load(Acquire) {
                    EMPTY => {
                        if b.keys[way]
                            .compare_exchange(EMPTY, BUSY, Acquire, Relaxed)
                            .is_ok()
                        {
                            b.charges[way].store(packed, Release);
                            b.keys[way].store(key, Release);
                            let crowded = distance > 0 || way >= FAST_WAYS;
                            if crowded {
                                self.crowded.fetch_add(1, Relaxed);
                            }
                            return Inserted::Done { crowded };
                        }
                        // Taken meanwhile (or sealed): look at it again.
                        if b.keys[way].load(Acquire) == MOVED {
                            self.unspill(home, distance);
                            return Inserted::Sealed;
                        }
                    }
                    MOVED => {
                        self.unspill(home, distance);
                        return Inserted::Sealed;
                    }
                    _ => {}
                }
            }
            b.spill.fetch_add(1, Release);
        }
        self.unspill(home, self.buckets.len());
        Inserted::Full
    }

    /// Takes back the spill counts of an entry that lives `distance` buckets from `home`.
    fn unspill(&self, home: usize, distance: usize) {
        let mask = self.buckets.len() - 1;
        for d in 0..distance {
            self.buckets[(home + d) & mask].spill.fetch_sub(1, Release);
        }
    }

    /// Takes `key` out of this table.
    #[inline(always)]
    fn take(&self, key: u64) -> Take {
        let Some(f) = self.find(key) else {
            return Take::Absent;
        };
        let b = &self.buckets[f.bucket];
        let slot = &b.keys[f.way];
        if f.key != key || slot.compare_exchange(key, BUSY, AcqRel, Relaxed).is_err() {
            // Being moved to the next level, or taken by a racing remove of the same key.
            return Take::Retry(f.key);
        }
        let v = b.charges[f.way].load(Acquire);
        slot.store(EMPTY, Release);
        if f.distance > 0 {
            self.unspill(self.home(key), f.distance);
        }
        if f.distance > 0 || f.way >= FAST_WAYS {
            self.crowded.fetch_sub(1, Relaxed);
        }
        Take::Taken(unpack(v))
    }

    /// The slot holding `key` (or `key | MOVING`), if any.
    #[inline(always)]
    fn find(&self, key: u64) -> Option<Found> {
        let mask = self.buckets.len() - 1;
        let home = self.home(key);
        for distance in 0..self.buckets.len() {
            let bucket = (home + distance) & mask;
            let b = &self.buckets[bucket];
            for way in 0..WAYS {
                let k = b.keys[way].load(Acquire);
                if k & !MOVING == key {
                    return Some(Found {
                        bucket,
                        distance,
                        way,
                        key: k,
                    });
                }
            }
            if b.spill.load(Acquire) == 0 {
                return None;
            }
        }
        None
    }

    #[inline]
    fn get(&self, key: u64) -> Option<Charge> {
        let f = self.find(key)?;
        let b = &self.buckets[f.bucket];
        let v = b.charges[f.way].load(Acquire);
        // The slot may have been emptied and reused meanwhile: the charge counts only if
        // the key is still there.
        (b.keys[f.way].load(Relaxed) & !MOVING == key).then(|| unpack(v))
    }

    /// Moves bucket `i` to `next`, slot by slot.
    fn move_bucket(&self, i: usize, next: &Table, overflow: &Overflow) {
        let b = &self.buckets[i];
        for way in 0..WAYS {
            let mut spins = 0;
            loop {
                let k = b.keys[way].load(Acquire);
                match k {
                    EMPTY => {
                        if b.keys[way]
                            .compare_exchange(EMPTY, MOVED, AcqRel, Relaxed)
                            .is_ok()
                        {
                            break;
                        }
                    }
                    MOVED => break,
                    BUSY => backoff(&mut spins),
                    _ => {
                        if b.keys[way]
                            .compare_exchange(k, k | MOVING, AcqRel, Relaxed)
                            .is_ok()
                        {
                            let v = b.charges[way].load(Acquire);
                            match next.insert(k, v) {
                                Inserted::Done { .. } => {}
                                // Only two levels are in use at a time, so `next` is not
                                // being moved; and it is twice this table's size.
                                Inserted::Sealed | Inserted::Full => {
                                    overflow.insert(k, unpack(v));
                                }
                            }
                            b.keys[way].store(MOVED, Release);
                            break;
                        }
                    }
                }
            }
        }
    }
}

/// Multiplicative hash for the locked map's keys.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = hash(k);
    }
}

type Shard = Mutex<HashMap<u64, Charge, BuildHasherDefault<KeyHasher>>>;
const SHARDS: usize = 16;

/// What the tables cannot hold: a sharded map of mutexes, skipped while empty.
struct Overflow {
    /// Entries in `shards`: zero lets a miss skip its locks.
    count: AtomicU64,
    shards: [Shard; SHARDS],
}

impl Overflow {
    const fn new() -> Self {
        Overflow {
            count: AtomicU64::new(0),
            shards: [const { Mutex::new(HashMap::with_hasher(BuildHasherDefault::new())) }; SHARDS],
        }
    }

    fn shard(
        &self,
        key: u64,
    ) -> MutexGuard<'_, HashMap<u64, Charge, BuildHasherDefault<KeyHasher>>> {
        let i = (hash(key) >> 60) as usize % SHARDS;
        // A poisoned shard only means a panic elsewhere while it was held; the map
        // itself is still consistent (every operation is a single insert/remove).
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, key: u64, charge: Charge) {
        self.count.fetch_add(1, AcqRel);
        self.shard(key).insert(key, charge);
    }

    fn remove(&self, key: u64) -> Option<Charge> {
        if self.count.load(Acquire) == 0 {
            return None;
        }
        let removed = self.shard(key).remove(&key);
        if removed.is_some() {
            self.count.fetch_sub(1, AcqRel);
        }
        removed
    }

    fn get(&self, key: u64) -> Option<Charge> {
        if self.count.load(Acquire) == 0 {
            return None;
        }
        self.shard(key).get(&key).copied()
    }
}

/// Live allocations by key; see the [module documentation](self).
pub struct LiveMap {
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
        // The common case, in few instructions: one table, no move running, a free slot
        // in the home bucket. A home bucket that is full probes on (out of line, but
        // still one table's probe); only a missing, sealed or full table and a key or
        // charge the table cannot hold take the slow path.
        let state = self.state.load(Acquire);
        if fits_table(key)
            && let Some(packed) = pack(charge)
            && let Some(t) = self.only_table(state)
        {
            let b = t.home_bucket(key);
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
            return self.insert_beyond_home(t, state, key, packed, charge);
        }
        self.insert_slow(key, charge)
    }

    /// An insert whose home bucket is full: the rest of the one table's probe.
    #[inline(never)]
    fn insert_beyond_home(&self, t: &Table, state: usize, key: u64, packed: u64, charge: Charge) {
        if let Inserted::Done { crowded } = t.insert(key, packed) {
            if crowded {
                self.crowded(t, state & LEVELS_MASK);
            }
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
                    if !self.grow(levels) && (self.state.load(Acquire) & LEVELS_MASK) == levels {
                        return self.overflow.insert(key, charge);
                    }
                }
            }
        }
    }

    #[inline(always)]
    pub fn remove(&self, key: u64) -> Option<Charge> {
        // The common case, in few instructions: one table, no move running, the entry
        // in its home bucket. One that spilled further is taken by the rest of the
        // probe (out of line); a key absent from the table, or being moved, is searched
        // for the slow way.
        let state = self.state.load(Acquire);
        if fits_table(key)
            && let Some(t) = self.only_table(state)
        {
            let b = t.home_bucket(key);
            for way in 0..WAYS {
                let slot = &b.keys[way];
                if slot.load(Relaxed) == key {
                    if slot.compare_exchange(key, BUSY, Acquire, Relaxed).is_ok() {
                        let v = b.charges[way].load(Relaxed);
                        slot.store(EMPTY, Release);
                        if way >= FAST_WAYS {
                            t.crowded.fetch_sub(1, Relaxed);
                        }
                        return Some(unpack(v));
                    }
                    break;
                }
            }
            if b.spill.load(Acquire) != 0 {
                return self.remove_beyond_home(t, key);
            }
        }
        self.remove_slow(key)
    }

    /// A remove whose entry is not in its home bucket: the rest of the one table's probe.
    #[inline(never)]
    fn remove_beyond_home(&self, t: &Table, key: u64) -> Option<Charge> {
        match t.take(key) {
            Take::Taken(c) => Some(c),
            _ => self.remove_slow(key),
        }
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
            // An entry seen in the old level and again once moved counts once.
            out.sort_unstable_by_key(|&(k, _)| k);
            out.dedup_by_key(|&mut (k, _)| k);
        }
        if self.overflow.count.load(Acquire) > 0 {
            for shard in &self.overflow.shards {
                let m = shard.lock().unwrap_or_else(|p| p.into_inner());
                out.extend(m.iter().filter(|(_, c)| keep(c)).map(|(&k, &c)| (k, c)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::HashSet;

    thread_local! {
        /// Calls of this thread into `insert_slow` or `remove_slow`.
        pub(super) static SLOW: Cell<usize> = const { Cell::new(0) };
    }

    #[test]
    fn no_slow_path_by_count_or_spacing() {
        // Blocks 4 KiB, 1 MiB and 2 MiB apart, 10,000 and 100,000 of them live: freeing
        // and allocating any one again (where the driver hands the same address back)
        // stays on the one-table path, wherever its entry lies in the table (first or
        // last ways of its home bucket, or spilled past it).
        for (spacing, live) in [
            (12, 10_000u64),
            (20, 10_000),
            (21, 10_000),
            (12, 100_000),
            (20, 100_000),
        ] {
            let m = LiveMap::new();
            let key = |i: u64| 0x7f00_0000_0000 + (i << spacing);
            for i in 0..live {
                m.insert(key(i), c(0, 1 << spacing));
            }
            let churn = || {
                for i in 0..live {
                    assert_eq!(m.remove(key(i)), Some(c(0, 1 << spacing)), "key {i}");
                    m.insert(key(i), c(0, 1 << spacing));
                }
            };
            // Once: any move to a new level the last inserts began is finished.
            churn();
            assert_eq!(m.state.load(Acquire) & MOVE_RUNS, 0);
            let (sizes, overflowed) = shape(&m);
            let slow = SLOW.with(Cell::get);
            churn();
            assert_eq!(
                SLOW.with(Cell::get) - slow,
                0,
                "{live} live, {spacing}-bit spacing"
            );
            assert_eq!(shape(&m), (sizes, overflowed), "no growth from churn");
            let t = m.table(m.state.load(Acquire) - 1).unwrap();
            let spilled = (0..live)
                .filter(|&i| t.find(key(i)).is_some_and(|f| f.distance > 0))
                .count();
            let far_ways = (0..live)
                .filter(|&i| t.find(key(i)).is_some_and(|f| f.way >= FAST_WAYS))
                .count();
            assert!(
                spilled > 0 && far_ways > 0,
                "the test covers spilled entries ({spilled}) and far ways ({far_ways})"
            );
        }
    }

    fn c(device: usize, bytes: u64) -> Charge {
        Charge { device, bytes }
    }

    /// A device-pointer-like key: aligned, in the range drivers hand out.
    fn ptr(i: u64) -> u64 {
        0x7f00_0000_0000 + (i << 9)
    }

    /// Buckets of all tables the map allocated, and whether the locked map is empty.
    fn shape(m: &LiveMap) -> (Vec<usize>, u64) {
        let tops = m.state.load(Acquire) & LEVELS_MASK;
        let sizes = (0..tops)
            .map(|l| m.table(l).unwrap().buckets.len())
            .collect();
        (sizes, m.overflow.count.load(Acquire))
    }

    #[test]
    fn insert_get_remove_and_reinsert() {
        let m = LiveMap::new();
        assert_eq!(m.get(ptr(1)), None);
        assert_eq!(m.remove(ptr(1)), None);
        m.insert(ptr(1), c(0, 4096));
        m.insert(ptr(2), c(3, 0));
        assert_eq!(m.get(ptr(1)), Some(c(0, 4096)));
        assert_eq!(m.get(ptr(2)), Some(c(3, 0)));
        assert_eq!(m.remove(ptr(1)), Some(c(0, 4096)));
        assert_eq!(m.remove(ptr(1)), None, "removed once");
        assert_eq!(m.get(ptr(1)), None);
        // The driver reuses addresses: the same key again, with another charge.
        m.insert(ptr(1), c(1, 8192));
        assert_eq!(m.get(ptr(1)), Some(c(1, 8192)));
        let mut all = m.matching(|_| true);
        all.sort_unstable_by_key(|e| e.0);
        assert_eq!(all, vec![(ptr(1), c(1, 8192)), (ptr(2), c(3, 0))]);
        assert_eq!(m.matching(|ch| ch.device == 3), vec![(ptr(2), c(3, 0))]);
        assert_eq!(shape(&m), (vec![BASE_BUCKETS], 0), "one table, no lock");
    }

    #[test]
    fn keys_and_charges_the_table_cannot_hold_go_to_the_locked_map() {
        let m = LiveMap::new();
        let huge = c(0, u64::MAX - 1);
        let far = c(300, 5);
        for (k, ch) in [
            (EMPTY, far),
            (MOVED, far),
            (BUSY, far),
            (u64::MAX, far),
            (MOVING | 0x1000, far),
            (0x1000, huge),
        ] {
            m.insert(k, ch);
            assert_eq!(m.get(k), Some(ch));
            assert_eq!(m.matching(|_| true), vec![(k, ch)]);
            assert_eq!(m.remove(k), Some(ch));
            assert_eq!(m.remove(k), None);
        }
        assert_eq!(m.overflow.count.load(Acquire), 0);
    }

    #[test]
    fn keys_sharing_a_home_bucket_spill_and_are_all_found() {
        let m = LiveMap::new();
        m.insert(ptr(0), c(0, 1));
        let t = m.table(0).unwrap();
        let home = t.home(ptr(0));
        // 20 keys with the same home bucket: nearly three buckets' worth.
        let keys: Vec<u64> = (0..)
            .map(ptr)
            .filter(|&k| t.home(k) == home)
            .take(20)
            .collect();
        assert_eq!(m.remove(ptr(0)), Some(c(0, 1)));
        for (i, &k) in keys.iter().enumerate() {
            m.insert(k, c(1, i as u64));
        }
        assert_eq!(t.crowded.load(Acquire), 20 - FAST_WAYS);
        assert!(t.buckets[home].spill.load(Acquire) > 0);
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(m.get(k), Some(c(1, i as u64)));
        }
        // Removing the home bucket's entries leaves the spilled ones findable.
        for (i, &k) in keys.iter().enumerate().take(WAYS) {
            assert_eq!(m.remove(k), Some(c(1, i as u64)));
        }
        for (i, &k) in keys.iter().enumerate().skip(WAYS) {
            assert_eq!(m.get(k), Some(c(1, i as u64)));
        }
        for (i, &k) in keys.iter().enumerate().skip(WAYS) {
            assert_eq!(m.remove(k), Some(c(1, i as u64)));
            assert_eq!(m.remove(k), None);
        }
        // Every spill count and crowded entry was taken back: nothing is left over.
        assert!(t.buckets.iter().all(|b| b.spill.load(Acquire) == 0));
        assert_eq!(t.crowded.load(Acquire), 0);
        assert!(m.matching(|_| true).is_empty());
    }

    #[test]
    fn two_million_keys_grow_the_table_without_the_locked_map() {
        const N: u64 = 2_000_000;
        let m = LiveMap::new();
        for i in 0..N {
            m.insert(ptr(i), c((i % 4) as usize, i));
        }
        let (sizes, overflowed) = shape(&m);
        assert_eq!(overflowed, 0, "every entry in a lock-free table");
        // Each level doubles the last; the newest is at least a quarter full.
        let newest = *sizes.last().unwrap();
        assert!(sizes.windows(2).all(|w| w[1] == 2 * w[0]), "{sizes:?}");
        assert!(newest * WAYS <= 4 * N as usize, "{sizes:?}");
        for i in 0..N {
            assert_eq!(m.get(ptr(i)), Some(c((i % 4) as usize, i)), "key {i}");
        }
        assert_eq!(m.matching(|_| true).len(), N as usize);
        assert_eq!(m.matching(|ch| ch.device == 1).len(), N as usize / 4);
        for i in 0..N {
            assert_eq!(m.remove(ptr(i)), Some(c((i % 4) as usize, i)), "key {i}");
        }
        assert!(m.matching(|_| true).is_empty());
        assert_eq!(m.get(ptr(7)), None);
        // Churn of new addresses leaves no debris: the table does not grow again.
        for i in N..N + 4 * N {
            m.insert(ptr(i), c(0, 1));
            assert_eq!(m.remove(ptr(i)), Some(c(0, 1)));
        }
        assert_eq!(shape(&m), (sizes, 0));
    }

    #[test]
    fn concurrent_inserts_and_removes_while_the_table_grows() {
        const THREADS: u64 = 4;
        const KEYS: u64 = 150_000;
        let m = LiveMap::new();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let m = &m;
                s.spawn(move || {
                    let key = |i: u64| ptr((t << 32) | i);
                    let mut live = Vec::new();
                    for i in 0..KEYS {
                        m.insert(key(i), c(t as usize, i));
                        live.push(i);
                        // Every third step frees an older allocation; every fifth, the
                        // driver hands the freed address out again at once.
                        if i % 3 == 2 {
                            let j = live.swap_remove((i as usize * 7919) % live.len());
                            assert_eq!(m.remove(key(j)), Some(c(t as usize, j)), "key {j}");
                            assert_eq!(m.get(key(j)), None);
                            if i % 5 == 0 {
                                m.insert(key(j), c(t as usize, j + 1));
                                assert_eq!(m.remove(key(j)), Some(c(t as usize, j + 1)));
                            }
                        }
                        if i % 1000 == 0 {
                            for &j in &live {
                                assert_eq!(m.get(key(j)), Some(c(t as usize, j)), "key {j}");
                            }
                        }
                    }
                    for &j in &live {
                        assert_eq!(m.get(key(j)), Some(c(t as usize, j)), "key {j}");
                    }
                    live
                });
            }
        });
        let (sizes, overflowed) = shape(&m);
        assert!(sizes.len() > 5, "the table grew while the threads ran");
        assert_eq!(overflowed, 0);
        let all = m.matching(|_| true);
        let per_thread = KEYS - KEYS / 3;
        assert_eq!(all.len() as u64, THREADS * per_thread);
        for t in 0..THREADS {
            let mine = m.matching(|ch| ch.device == t as usize);
            assert_eq!(mine.len() as u64, per_thread);
            for (k, ch) in mine {
                assert_eq!(m.remove(k), Some(ch));
            }
        }
        assert!(m.matching(|_| true).is_empty());
    }

    #[test]
    fn matching_sees_each_entry_once_while_others_grow_the_table() {
        const STABLE: u64 = 3000;
        let m = LiveMap::new();
        for i in 0..STABLE {
            m.insert(ptr(i), c(1, i));
        }
        let stable: HashSet<u64> = (0..STABLE).map(ptr).collect();
        let done = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 1..=2u64 {
                let (m, done) = (&m, &done);
                s.spawn(move || {
                    for i in 0..200_000u64 {
                        m.insert(ptr((t << 32) | i), c(0, i));
                        if i % 2 == 1 {
                            let j = i - 1;
                            assert_eq!(m.remove(ptr((t << 32) | j)), Some(c(0, j)));
                        }
                    }
                    done.fetch_add(1, Release);
                });
            }
            let mut rounds = 0;
            while done.load(Acquire) < 2 || rounds < 3 {
                let seen = m.matching(|ch| ch.device == 1);
                assert_eq!(seen.len() as u64, STABLE, "round {rounds}");
                assert_eq!(seen.iter().map(|e| e.0).collect::<HashSet<_>>(), stable);
                assert!(seen.iter().all(|&(k, ch)| k == ptr(ch.bytes)));
                rounds += 1;
            }
        });
        assert!(shape(&m).0.len() > 4, "the table grew meanwhile");
    }

    #[test]
    fn racing_removes_of_one_key_take_it_once() {
        let m = LiveMap::new();
        let taken = AtomicUsize::new(0);
        for round in 0..2000u64 {
            m.insert(ptr(round), c(0, round));
            std::thread::scope(|s| {
                for w in 0..2u64 {
                    let (m, taken) = (&m, &taken);
                    s.spawn(move || {
                        if m.remove(ptr(round)).is_some() {
                            taken.fetch_add(1, Relaxed);
                        }
                        // Each thread keeps allocating meanwhile, so tables grow and move.
                        m.insert(ptr((1 << 32) + round * 2 + w), c(1, 0));
                    });
                }
            });
        }
        assert_eq!(taken.load(Relaxed), 2000);
        assert_eq!(m.matching(|_| true).len(), 4000);
    }
}
