//! Kernels loaded lazily: under CUDA's lazy loading (the default since CUDA 11.7) a
//! kernel's code, and the module or library it comes from, are loaded into a context
//! only when the kernel is first used there, inside the launch: memory no allocation
//! call shows. On an H200 with driver 580, PyTorch's first kernel made the driver take
//! 92 MiB (docs/gpu-runs/2026-11-26-h100/torch-lazy-loading.txt). The hooks measure the
//! first launch of each function on each device, as a module load is measured, and
//! charge what it took to the launching context (a launch cannot be refused once made:
//! the charge may stand past the cap, and every request is refused until memory is given
//! back, `Ledger::force`); the unload of its library or module, or the context's end,
//! credits it. Later launches of the same function there pay one lookup in the map of
//! functions seen.

use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::contexts::Ctx;
use crate::residents::ResidentBook;

/// What the first launches loaded, by (context, function, owner): the owner is the
/// library or module the function comes from (0: the driver did not say), whose unload
/// frees what its functions loaded.
pub type KernelBook = ResidentBook<(Ctx, u64, u64)>;

/// The functions seen on each device, by [`launch_key`]: a fixed table of keys (open
/// addressing, a few probes), so that a launch after the first costs a multiply, a
/// load or two and a compare. Keys are only added, and all of them forgotten at once
/// (a context's end, an unload: the next launch of each is measured again). A key with
/// no room within its probes is never recorded: each launch of it then is a first one,
/// measured (and nothing more charged: what it loaded is there already).
pub struct SeenSet {
    slots: [AtomicU64; SEEN_SLOTS],
}

/// Slots of [`SeenSet`] (128 KiB, zero until used): room for thousands of functions.
const SEEN_SLOTS: usize = 1 << 14;
/// Slots a key may take from its home on.
const SEEN_PROBES: usize = 16;

impl Default for SeenSet {
    fn default() -> Self {
        Self::new()
    }
}

impl SeenSet {
    pub const fn new() -> Self {
        SeenSet {
            slots: [const { AtomicU64::new(0) }; SEEN_SLOTS],
        }
    }

    #[inline(always)]
    fn home(key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SEEN_SLOTS.trailing_zeros())) as usize
    }

    /// Whether `key` (never 0) was recorded.
    #[inline(always)]
    pub fn contains(&self, key: u64) -> bool {
        let home = Self::home(key);
        for i in 0..SEEN_PROBES {
            match self.slots[(home + i) % SEEN_SLOTS].load(Acquire) {
                k if k == key => return true,
                0 => return false,
                _ => {}
            }
        }
        false
    }

    /// Records `key` (never 0); false if there was no room for it.
    pub fn insert(&self, key: u64) -> bool {
        let home = Self::home(key);
        for i in 0..SEEN_PROBES {
            match self.slots[(home + i) % SEEN_SLOTS].compare_exchange(0, key, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(k) if k == key => return true,
                Err(_) => {}
            }
        }
        false
    }

    /// Forgets every key.
    pub fn clear(&self) {
        for s in &self.slots {
            s.store(0, Release);
        }
    }
}

/// Bits of a function handle kept in its key: user-space addresses (x86-64, AArch64)
/// fit in 48; the device goes above them.
const HANDLE_BITS: u32 = 48;

/// The key of function `f` launched on `device` in the [`SeenSet`] (never 0). Two
/// handles equal in their low 48 bits would share a key, and the second's first launch
/// go unmeasured; driver handles are addresses, which differ there.
#[inline(always)]
pub fn launch_key(f: u64, device: usize) -> u64 {
    let handle = f & ((1 << HANDLE_BITS) - 1);
    (handle | ((device as u64 & 0x3f) << HANDLE_BITS)) + 2
}

/// The key of the function `name` of module `module` asked for on `device`
/// (`cuModuleGetFunction`, where CUDA's lazy loading loads a module's kernel) in the
/// [`SeenSet`]: a hash of the three, with bit 62 set, apart from every [`launch_key`]
/// (below 2^54). Two names of one module that hash alike would share a key, and the
/// second's lookup go unmeasured (its first launch is measured all the same).
pub fn name_key(module: u64, name: &[u8], device: usize) -> u64 {
    // FNV-1a over the name, then the module and the device mixed in.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= module.rotate_left(17) ^ ((device as u64) << 56);
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 2) | (1 << 62)
}

/// What a first use loaded, from the driver's figure for this process before and after
/// it (`before`, `after`) and the process's own charges then (`own_before`,
/// `own_after`): what the figure moved by, less what the process's other threads'
/// charges moved by meanwhile (their allocations and frees show in the figure too).
pub fn loaded(before: u64, after: u64, own_before: u64, own_after: u64) -> u64 {
    let figure = i128::from(after) - i128::from(before);
    let own = i128::from(own_after) - i128::from(own_before);
    u64::try_from((figure - own).max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_first_use_loaded_leaves_out_the_other_threads_allocations() {
        const MIB: u64 = 1 << 20;
        assert_eq!(loaded(534 * MIB, 626 * MIB, 539 * MIB, 539 * MIB), 92 * MIB);
        assert_eq!(loaded(534 * MIB, 626 * MIB, 539 * MIB, 559 * MIB), 72 * MIB);
        // another thread's free meanwhile lowered the figure: added back
        assert_eq!(loaded(534 * MIB, 500 * MIB, 539 * MIB, 443 * MIB), 62 * MIB);
        assert_eq!(loaded(534 * MIB, 534 * MIB, 0, 64 * MIB), 0);
        assert_eq!(loaded(534 * MIB, 500 * MIB, 539 * MIB, 539 * MIB), 0);
    }

    #[test]
    fn the_seen_set_holds_what_it_recorded_until_cleared() {
        let s = Box::new(SeenSet::new());
        let keys: Vec<u64> = (0..4000u64)
            .map(|i| launch_key(0x7f00_0000_0000 + i * 64, (i % 3) as usize))
            .collect();
        assert!(keys.iter().all(|&k| !s.contains(k)));
        assert!(keys.iter().all(|&k| s.insert(k)), "room for thousands");
        assert!(keys.iter().all(|&k| s.contains(k)));
        assert!(s.insert(keys[0]), "recorded twice: still there");
        assert!(!s.contains(launch_key(0x7f00_0000_0000, 5)));
        s.clear();
        assert!(keys.iter().all(|&k| !s.contains(k)));
    }

    #[test]
    fn a_full_neighbourhood_refuses_a_key_it_then_does_not_claim() {
        let s = Box::new(SeenSet::new());
        // keys that share a home, more than the probes allow
        let home = SeenSet::home(launch_key(0x1000, 0));
        let same: Vec<u64> = (0..2_000_000u64)
            .map(|i| launch_key(0x1000 + i * 16, 0))
            .filter(|&k| SeenSet::home(k) == home)
            .take(SEEN_PROBES + 1)
            .collect();
        assert_eq!(same.len(), SEEN_PROBES + 1);
        assert!(same[..SEEN_PROBES].iter().all(|&k| s.insert(k)));
        assert!(!s.insert(same[SEEN_PROBES]));
        assert!(!s.contains(same[SEEN_PROBES]));
    }

    #[test]
    fn a_name_has_one_key_per_module_and_device_apart_from_launch_keys() {
        let k = name_key(0x7f00_0000_1000, b"fusion_3", 0);
        assert_eq!(k, name_key(0x7f00_0000_1000, b"fusion_3", 0));
        assert_ne!(k, name_key(0x7f00_0000_1000, b"fusion_4", 0));
        assert_ne!(k, name_key(0x7f00_0000_2000, b"fusion_3", 0));
        assert_ne!(k, name_key(0x7f00_0000_1000, b"fusion_3", 1));
        for key in [k, name_key(0, b"", 0), name_key(u64::MAX, b"x", 63)] {
            assert!((1 << 62..1 << 63).contains(&key), "{key:#x}");
        }
        assert!(launch_key(u64::MAX, 63) < 1 << 62);
    }

    #[test]
    fn a_function_has_one_key_per_device_never_one_the_map_reserves() {
        let f = 0x7f12_3456_7890;
        assert_ne!(launch_key(f, 0), launch_key(f, 1));
        assert_ne!(launch_key(f, 0), launch_key(f + 16, 0));
        for (f, d) in [(0, 0), (u64::MAX, 63), (f, 63), (1 << 47, 7)] {
            let k = launch_key(f, d);
            assert!((2..1 << 63).contains(&k), "{f:#x} on {d}: {k:#x}");
        }
    }
}
