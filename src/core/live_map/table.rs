//! One level of the live map: a table of buckets probed from a key's home bucket, with
//! its spill counts, its crowded entries (the load that triggers growth) and the moving
//! of its buckets to the next level.

use std::sync::atomic::{
    AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use super::entry::{BUSY, Charge, EMPTY, MOVED, MOVING, hash, unpack};
use super::overflow::Overflow;

/// Slots per bucket: seven keys and the spill count fill one 64-byte line.
pub(super) const WAYS: usize = 7;
/// The first ways of a bucket, which inserts and removes try in few instructions; an
/// entry beyond them (or outside its home bucket) is "crowded".
pub(super) const FAST_WAYS: usize = 5;

/// Waits for another thread's few instructions on a slot (it may have been preempted).
pub(super) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[repr(C, align(64))]
pub(super) struct Bucket {
    pub(super) keys: [AtomicU64; WAYS],
    /// Entries that passed this bucket full and live further on.
    pub(super) spill: AtomicU64,
    pub(super) charges: [AtomicU64; WAYS],
}

impl Bucket {
    pub(super) fn new() -> Self {
        Bucket {
            keys: [const { AtomicU64::new(EMPTY) }; WAYS],
            spill: AtomicU64::new(0),
            charges: [const { AtomicU64::new(0) }; WAYS],
        }
    }
}

/// Where an entry was found: bucket index (from its home) and way.
pub(super) struct Found {
    pub(super) bucket: usize,
    pub(super) distance: usize,
    pub(super) way: usize,
    pub(super) key: u64,
}

pub(super) enum Take {
    Taken(Charge),
    Absent,
    /// Seen with this key word but not taken (being moved, or a racing remove).
    Retry(u64),
}

pub(super) enum Inserted {
    Done {
        crowded: bool,
    },
    /// The table is being moved to the next level: insert there.
    Sealed,
    /// No room anywhere in the table.
    Full,
}

pub(super) struct Table {
    pub(super) buckets: Box<[Bucket]>,
    /// 64 - log2(buckets): the hash's top bits pick the home bucket.
    pub(super) shift: u32,
    /// Crowded entries (beyond [`FAST_WAYS`] or outside their home bucket): the load
    /// that triggers growth.
    pub(super) crowded: AtomicUsize,
    /// The next bucket to move to the next level.
    pub(super) next_move: AtomicUsize,
    /// Buckets moved: all of them once the next level holds every entry.
    pub(super) moved: AtomicUsize,
}

impl Table {
    /// A table of `buckets` buckets, or None when the memory is not there.
    pub(super) fn try_new(buckets: usize) -> Option<Table> {
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

    /// The key's home bucket and the one after it (where nearly every entry that
    /// spills lives).
    #[inline(always)]
    pub(super) fn home_and_next(&self, key: u64) -> (&Bucket, &Bucket) {
        let home = self.home(key);
        let next = (home + 1) & (self.buckets.len() - 1);
        (&self.buckets[home], &self.buckets[next])
    }

    #[inline(always)]
    pub(super) fn home(&self, key: u64) -> usize {
        // Fibonacci hashing: the top bits of the product.
        (hash(key) >> self.shift) as usize
    }

    pub(super) fn slots(&self) -> usize {
        self.buckets.len() * WAYS
    }

    pub(super) fn done(&self) -> bool {
        self.moved.load(Acquire) == self.buckets.len()
    }

    #[inline(always)]
    pub(super) fn insert(&self, key: u64, packed: u64) -> Inserted {
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

    /// Inserts `key` past its home bucket, which the caller saw full: [`insert`](Self::insert)
    /// from the next bucket on, without scanning the home bucket again (an entry may
    /// live past a bucket with room: the spill counts cover it).
    #[inline]
    pub(super) fn insert_spilled(&self, key: u64, packed: u64) -> Inserted {
        let len = self.buckets.len();
        let home = self.home(key);
        let mut at = home;
        for distance in 1..len {
            self.buckets[at].spill.fetch_add(1, Release);
            at = (at + 1) & (len - 1);
            let b = &self.buckets[at];
            for way in 0..WAYS {
                let slot = &b.keys[way];
                // Acquire: a sealed slot seen here means the newer level is visible.
                let k = slot.load(Acquire);
                if k == EMPTY && slot.compare_exchange(EMPTY, BUSY, Acquire, Relaxed).is_ok() {
                    b.charges[way].store(packed, Release);
                    slot.store(key, Release);
                    self.crowded.fetch_add(1, Relaxed);
                    return Inserted::Done { crowded: true };
                }
                if k == MOVED || (k == EMPTY && slot.load(Acquire) == MOVED) {
                    self.unspill(home, distance);
                    return Inserted::Sealed;
                }
            }
        }
        self.unspill(home, len - 1);
        Inserted::Full
    }

    /// Takes `key` from past its home bucket, which the caller saw without it. None: not
    /// taken here (absent, being moved, or taken meanwhile): the caller searches the
    /// slow way, which tells these apart.
    #[inline]
    pub(super) fn take_spilled(&self, key: u64) -> Option<Charge> {
        let len = self.buckets.len();
        let home = self.home(key);
        let mut at = home;
        for distance in 1..len {
            if self.buckets[at].spill.load(Acquire) == 0 {
                return None;
            }
            at = (at + 1) & (len - 1);
            let b = &self.buckets[at];
            for way in 0..WAYS {
                let slot = &b.keys[way];
                if slot.load(Relaxed) == key {
                    slot.compare_exchange(key, BUSY, Acquire, Relaxed).ok()?;
                    let v = b.charges[way].load(Acquire);
                    slot.store(EMPTY, Release);
                    self.unspill(home, distance);
                    self.crowded.fetch_sub(1, Relaxed);
                    return Some(unpack(v));
                }
            }
        }
        None
    }

    /// Takes back the spill counts of an entry that lives `distance` buckets from `home`.
    pub(super) fn unspill(&self, home: usize, distance: usize) {
        let mask = self.buckets.len() - 1;
        for d in 0..distance {
            self.buckets[(home + d) & mask].spill.fetch_sub(1, Release);
        }
    }

    /// Takes `key` out of this table.
    #[inline(always)]
    pub(super) fn take(&self, key: u64) -> Take {
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
    pub(super) fn find(&self, key: u64) -> Option<Found> {
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
    pub(super) fn get(&self, key: u64) -> Option<Charge> {
        let f = self.find(key)?;
        let b = &self.buckets[f.bucket];
        let v = b.charges[f.way].load(Acquire);
        // The slot may have been emptied and reused meanwhile: the charge counts only if
        // the key is still there.
        (b.keys[f.way].load(Relaxed) & !MOVING == key).then(|| unpack(v))
    }

    /// Moves bucket `i` to `next`, slot by slot.
    pub(super) fn move_bucket(&self, i: usize, next: &Table, overflow: &Overflow) {
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
