//! What the live map's tables cannot hold (keys 0, 1 and the top half, charges that do
//! not pack, entries that find no room when growth is impossible): a small sharded map
//! of mutexes, skipped while empty.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire},
};
use std::sync::{Mutex, MutexGuard};

use super::entry::{Charge, hash};

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

type Map = HashMap<u64, Charge, BuildHasherDefault<KeyHasher>>;
/// A shard's map, made at its first insert: an empty `HashMap` points at a static empty
/// table, and every live map is a process-wide static of the shim, so 16 such pointers
/// per map would be relocated (and their pages written) when the library is loaded;
/// `None` is all zero bits.
type Shard = Mutex<Option<Map>>;
const SHARDS: usize = 16;

/// What the tables cannot hold: a sharded map of mutexes, skipped while empty.
pub(super) struct Overflow {
    /// Entries in `shards`: zero lets a miss skip its locks.
    pub(super) count: AtomicU64,
    shards: [Shard; SHARDS],
}

impl Overflow {
    pub(super) const fn new() -> Self {
        Overflow {
            count: AtomicU64::new(0),
            shards: [const { Mutex::new(None) }; SHARDS],
        }
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Option<Map>> {
        let i = (hash(key) >> 60) as usize % SHARDS;
        // A poisoned shard only means a panic elsewhere while it was held; the map
        // itself is still consistent (every operation is a single insert/remove).
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn insert(&self, key: u64, charge: Charge) {
        self.count.fetch_add(1, AcqRel);
        self.shard(key)
            .get_or_insert_with(Map::default)
            .insert(key, charge);
    }

    pub(super) fn remove(&self, key: u64) -> Option<Charge> {
        if self.count.load(Acquire) == 0 {
            return None;
        }
        let removed = self.shard(key).as_mut().and_then(|m| m.remove(&key));
        if removed.is_some() {
            self.count.fetch_sub(1, AcqRel);
        }
        removed
    }

    pub(super) fn get(&self, key: u64) -> Option<Charge> {
        if self.count.load(Acquire) == 0 {
            return None;
        }
        self.shard(key).as_ref().and_then(|m| m.get(&key).copied())
    }

    /// Appends the entries whose charge satisfies `keep` to `out`.
    pub(super) fn matching(&self, keep: &impl Fn(&Charge) -> bool, out: &mut Vec<(u64, Charge)>) {
        if self.count.load(Acquire) == 0 {
            return;
        }
        for shard in &self.shards {
            let m = shard.lock().unwrap_or_else(|p| p.into_inner());
            let entries = m.iter().flat_map(|m| m.iter());
            out.extend(entries.filter(|(_, c)| keep(c)).map(|(&k, &c)| (k, c)));
        }
    }
}
