//! Kernels loaded lazily: under CUDA's lazy loading (the default since CUDA 11.7) a
//! kernel's code, and the module or library it comes from, are loaded into a context
//! only when the kernel is first used there, inside the launch: memory no allocation
//! call shows. On an H200 with driver 580, PyTorch's first kernel made the driver take
//! 92 MiB (docs/gpu-runs/2026-11-26-h100/torch-lazy-loading.txt). The hooks measure the
//! first launch of each function on each device, as a module load is measured, and
//! charge what it took to the launching context (a launch cannot be refused once made:
//! the charge may stand past the cap, and every request is refused until memory is given
//! back, `Ledger::charge_past_cap`); the unload of its library or module, or the context's end,
//! credits it. Later launches of the same function there pay one lookup in the map of
//! functions seen.

use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use crate::contexts::Ctx;
use crate::residents::ResidentCharges;

/// What the first launches loaded, by (context, function, owner): the owner is the
/// library or module the function comes from (0: the driver did not say), whose unload
/// frees what its functions loaded.
pub type KernelBook = ResidentCharges<(Ctx, u64, u64)>;

/// The functions seen on each device, by [`launch_key`]: a fixed table of `SLOTS` keys
/// (a power of two; open addressing, a few probes), so that a launch after the first
/// costs a multiply, a load or two and a compare. Keys are only added, and all of them
/// forgotten at once (a context's end, an unload: the next launch of each is measured
/// again). A key with no room within its probes is never recorded: each launch of it
/// then is a first one, measured again (and nothing more charged: what it loaded is there
/// already), which costs the driver's figure each time; [`FunctionsSeen`] has room for
/// the tens of thousands of functions a framework's runtime may ask for.
pub struct SeenSet<const SLOTS: usize> {
    slots: [AtomicU64; SLOTS],
    /// Whether a key may be recorded since the last clear: a clear of a set that holds
    /// none touches no slot (a program unloading thousands of libraries at its exit).
    used: AtomicBool,
}

/// The kernel handles seen (`cuLibraryGetKernel`'s, far fewer than functions): 128 KiB.
pub type HandlesSeen = SeenSet<{ 1 << 14 }>;

/// The functions and kernels seen at their first use: a near table of 16,384 slots that a
/// launch looks in, and a far one of 262,144 (2 MiB, zero until used: a page is touched
/// only where a key lands) for the keys the near one has no room for, looked in only
/// where a key's near neighbourhood is full. Under CUDA's eager loading
/// (`CUDA_MODULE_LOADING=EAGER`) CUDA's runtime asks for every function it registers
/// (TensorFlow 2.21's: 49,086 in a Keras `fit`), each a first use: with the near table
/// alone most were never recorded, and each of their launches was measured again. A
/// launch found in the near table costs what it did (the far table, 2^18 slots alone,
/// made a training step's 532 lookups 1,532 instructions dearer).
pub struct FunctionsSeen {
    near: SeenSet<{ 1 << 14 }>,
    far: SeenSet<{ 1 << 18 }>,
}

impl Default for FunctionsSeen {
    fn default() -> Self {
        Self::new()
    }
}

impl FunctionsSeen {
    pub const fn new() -> Self {
        FunctionsSeen {
            near: SeenSet::new(),
            far: SeenSet::new(),
        }
    }

    /// Whether `key` (never 0) was recorded.
    #[inline(always)]
    pub fn contains(&self, key: u64) -> bool {
        match self.near.probe(key) {
            Probe::Found => true,
            Probe::Empty => false,
            Probe::Full => self.far.contains(key),
        }
    }

    /// Records `key` (never 0); false if neither table had room for it.
    pub fn insert(&self, key: u64) -> bool {
        self.near.insert(key) || self.far.insert(key)
    }

    /// Forgets every key (see [`SeenSet::clear`]).
    pub fn clear(&self) {
        self.near.clear();
        self.far.clear();
    }

    /// Forgets the keys `forget` picks in each table (see [`SeenSet::forget`]): a key
    /// kept may be measured again.
    pub fn forget(&self, forget: impl Fn(u64) -> bool) {
        self.near.forget(&forget);
        self.far.forget(&forget);
    }
}

/// What a look for a key in a [`SeenSet`] found.
enum Probe {
    Found,
    /// An empty slot before it: not recorded.
    Empty,
    /// Every slot it may take holds another key: not recorded there.
    Full,
}

/// Slots a key may take from its home on.
const SEEN_PROBES: usize = 16;

impl<const SLOTS: usize> Default for SeenSet<SLOTS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const SLOTS: usize> SeenSet<SLOTS> {
    pub const fn new() -> Self {
        assert!(SLOTS.is_power_of_two() && SLOTS >= SEEN_PROBES);
        SeenSet {
            slots: [const { AtomicU64::new(0) }; SLOTS],
            used: AtomicBool::new(false),
        }
    }

    #[inline(always)]
    fn home(key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SLOTS.trailing_zeros())) as usize
    }

    /// Whether `key` (never 0) was recorded.
    #[inline(always)]
    pub fn contains(&self, key: u64) -> bool {
        matches!(self.probe(key), Probe::Found)
    }

    #[inline(always)]
    fn probe(&self, key: u64) -> Probe {
        let home = Self::home(key);
        for i in 0..SEEN_PROBES {
            match self.slots[(home + i) % SLOTS].load(Acquire) {
                k if k == key => return Probe::Found,
                0 => return Probe::Empty,
                _ => {}
            }
        }
        Probe::Full
    }

    /// Records `key` (never 0); false if there was no room for it.
    pub fn insert(&self, key: u64) -> bool {
        if !self.used.load(Relaxed) {
            self.used.store(true, Release);
        }
        let home = Self::home(key);
        for i in 0..SEEN_PROBES {
            match self.slots[(home + i) % SLOTS].compare_exchange(0, key, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(k) if k == key => return true,
                Err(_) => {}
            }
        }
        false
    }

    /// Forgets every key. Writes only the slots that hold one; nothing when none was
    /// recorded since the last clear (a key another thread records meanwhile may be
    /// forgotten too, and is measured again).
    pub fn clear(&self) {
        if !self.used.swap(false, AcqRel) {
            return;
        }
        for s in &self.slots {
            if s.load(Relaxed) != 0 {
                s.store(0, Release);
            }
        }
    }

    /// Forgets the keys `forget` picks (those of one device: a context there ended),
    /// keeping the others. The table is rebuilt (open addressing leaves no hole): a key
    /// another thread records meanwhile may be forgotten too, and its next use is then
    /// measured again, which finds nothing more loaded.
    pub fn forget(&self, forget: impl Fn(u64) -> bool) {
        if !self.used.load(Acquire) {
            return;
        }
        let mut kept = Vec::new();
        for s in &self.slots {
            match s.load(Acquire) {
                0 => {}
                k if forget(k) => {}
                k => kept.push(k),
            }
        }
        self.clear();
        for k in kept {
            self.insert(k);
        }
    }
}

/// Bits of a handle (or of a hash) kept in a key: user-space addresses (x86-64,
/// AArch64) fit in 48; the device goes above them, then the key's kind.
const HANDLE_BITS: u32 = 48;
const PAYLOAD: u64 = (1 << HANDLE_BITS) - 1;
/// The kind bits of the three kinds of key (never 0: the [`SeenSet`]'s empty slot).
const KIND_LAUNCH: u64 = 1 << 54;
const KIND_NAME: u64 = 1 << 55;
const KIND_CONTEXT: u64 = 1 << 56;

#[inline(always)]
fn key(payload: u64, device: usize, kind: u64) -> u64 {
    (payload & PAYLOAD) | ((device as u64 & 0x3f) << HANDLE_BITS) | kind
}

/// The device a key of [`launch_key`], [`name_key`] or [`context_key`] was made for.
pub fn key_device(key: u64) -> usize {
    ((key >> HANDLE_BITS) & 0x3f) as usize
}

/// The key of function `f` launched on `device` in the [`SeenSet`] (never 0). A
/// function handle (`CUfunction`) belongs to one context, so that one key per device
/// is one per context. Two handles equal in their low 48 bits would share a key, and
/// the second's first launch go unmeasured; driver handles are addresses, which differ
/// there.
#[inline(always)]
pub fn launch_key(f: u64, device: usize) -> u64 {
    key(f, device, KIND_LAUNCH)
}

/// The key of a *kernel* handle (`CUkernel`, `cuLibraryGetKernel`: one handle for every
/// context) used in context `ctx` on `device`: the driver loads the kernel into each
/// context where it is used, so each (kernel, context) is a first use of its own. A
/// hash of the two, 48 bits kept.
pub fn context_key(kernel: u64, ctx: u64, device: usize) -> u64 {
    let h = (kernel ^ ctx.rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    key(h >> 16, device, KIND_CONTEXT)
}

/// The key of the function `name` of module `module` asked for on `device`
/// (`cuModuleGetFunction`, where CUDA's lazy loading loads a module's kernel) in the
/// [`SeenSet`]: a hash of the three, apart from every [`launch_key`]. A module lives in
/// one context, so that this key is one per context too. Two names of one module that
/// hash alike would share a key, and the second's lookup go unmeasured (its first
/// launch is measured all the same).
pub fn name_key(module: u64, name: &[u8], device: usize) -> u64 {
    // FNV-1a over the name, then the module mixed in.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= module.rotate_left(17);
    h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    key(h >> 16, device, KIND_NAME)
}

/// What the first uses of an owner's (a library's or a module's) functions took, to
/// expect before the next one: a first use that can still be refused (a launch, a
/// `cuKernelGetFunction` or `cuModuleGetFunction` before the driver loads) reserves it
/// first, and is refused if the cap, the pool or another member's guarantee cannot take
/// it. `first`: the most a first use took where the owner had nothing loaded in that
/// context yet (its code, its globals: a library in each new context); `more`: the most
/// a further function of it took in a context that held it already. An owner never seen
/// is expected to take nothing: measured, then charged (past the cap only by what the
/// measurement found beyond the reservation).
pub struct LoadEstimates {
    seen: std::sync::Mutex<Vec<(u64, Estimate)>>,
}

/// [`LoadEstimates`]' figures of one owner.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Estimate {
    pub first: u64,
    pub more: u64,
}

/// Owners remembered: the oldest are forgotten past it (expected to take nothing again).
const ESTIMATED_OWNERS: usize = 4096;

impl Default for LoadEstimates {
    fn default() -> Self {
        Self::new()
    }
}

impl LoadEstimates {
    pub const fn new() -> Self {
        LoadEstimates {
            seen: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Estimate)>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a first use of a function of `owner` is expected to take in a context where
    /// the owner already has something loaded (`loaded_there`) or not. 0 for owner 0
    /// (the driver did not say) and for owners never measured.
    pub fn expected(&self, owner: u64, loaded_there: bool) -> u64 {
        if owner == 0 {
            return 0;
        }
        self.list()
            .iter()
            .find(|(o, _)| *o == owner)
            .map_or(0, |(_, e)| if loaded_there { e.more } else { e.first })
    }

    /// Records that a first use of `owner`'s function took `bytes` (see [`expected`]).
    ///
    /// [`expected`]: Self::expected
    pub fn learn(&self, owner: u64, loaded_there: bool, bytes: u64) {
        if owner == 0 {
            return;
        }
        let mut l = self.list();
        let i = match l.iter().position(|(o, _)| *o == owner) {
            Some(i) => i,
            None => {
                if l.len() >= ESTIMATED_OWNERS {
                    l.remove(0);
                }
                l.push((owner, Estimate::default()));
                l.len() - 1
            }
        };
        let e = &mut l[i].1;
        let figure = if loaded_there {
            &mut e.more
        } else {
            &mut e.first
        };
        *figure = (*figure).max(bytes);
    }

    /// Forgets `owner` (unloaded: the driver may hand its handle to another).
    pub fn forget(&self, owner: u64) {
        self.list().retain(|(o, _)| *o != owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seen_set_holds_what_it_recorded_until_cleared() {
        let s = Box::new(HandlesSeen::new());
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
        let s = Box::new(HandlesSeen::new());
        // keys that share a home, more than the probes allow
        let home = HandlesSeen::home(launch_key(0x1000, 0));
        let same: Vec<u64> = (0..2_000_000u64)
            .map(|i| launch_key(0x1000 + i * 16, 0))
            .filter(|&k| HandlesSeen::home(k) == home)
            .take(SEEN_PROBES + 1)
            .collect();
        assert_eq!(same.len(), SEEN_PROBES + 1);
        assert!(same[..SEEN_PROBES].iter().all(|&k| s.insert(k)));
        assert!(!s.insert(same[SEEN_PROBES]));
        assert!(!s.contains(same[SEEN_PROBES]));
    }

    /// A framework's runtime asks for tens of thousands of functions (TensorFlow's:
    /// 49,086 in a Keras `fit`): every one is recorded, so that no launch after the
    /// first is measured again. The near table alone (16,384 slots) holds under a third.
    #[test]
    fn the_functions_seen_hold_a_frameworks_tens_of_thousands() {
        // A static, as the shim's (2 MiB: not built on a test thread's stack).
        static S: FunctionsSeen = FunctionsSeen::new();
        static NEAR: HandlesSeen = HandlesSeen::new();
        let s = &S;
        let keys: Vec<u64> = (0..60_000u64)
            .map(|i| launch_key(0x2000_0000_0000 + i * 32, 0))
            .collect();
        assert!(keys.iter().all(|&k| s.insert(k)), "room for 60,000");
        assert!(keys.iter().all(|&k| s.contains(k)));
        let held = keys.iter().filter(|&&k| NEAR.insert(k)).count();
        assert!(held <= 16_384, "the near table alone: {held} of 60,000");
        s.clear();
        assert!(keys.iter().all(|&k| !s.contains(k)));
        s.clear(); // nothing recorded since: touches no slot
        assert!(s.insert(keys[7]) && s.contains(keys[7]));
    }

    #[test]
    fn a_name_has_one_key_per_module_and_device_apart_from_launch_keys() {
        let k = name_key(0x7f00_0000_1000, b"fusion_3", 0);
        assert_eq!(k, name_key(0x7f00_0000_1000, b"fusion_3", 0));
        assert_ne!(k, name_key(0x7f00_0000_1000, b"fusion_4", 0));
        assert_ne!(k, name_key(0x7f00_0000_2000, b"fusion_3", 0));
        assert_ne!(k, name_key(0x7f00_0000_1000, b"fusion_3", 1));
        for (key, d) in [
            (k, 0),
            (name_key(0, b"", 0), 0),
            (name_key(u64::MAX, b"x", 63), 63),
        ] {
            assert_eq!(
                key & (KIND_LAUNCH | KIND_NAME | KIND_CONTEXT),
                KIND_NAME,
                "{key:#x}"
            );
            assert_eq!(key_device(key), d);
        }
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

    #[test]
    fn a_kernel_has_one_key_per_context_apart_from_function_keys() {
        let (k, c1, c2) = (
            0x7f00_0000_4000u64,
            0x5555_0000_1000u64,
            0x5555_0000_2000u64,
        );
        assert_ne!(context_key(k, c1, 0), context_key(k, c2, 0), "two contexts");
        assert_ne!(
            context_key(k, c1, 0),
            context_key(k + 64, c1, 0),
            "two kernels"
        );
        assert_ne!(context_key(k, c1, 0), launch_key(k, 0));
        assert_eq!(context_key(k, c1, 0), context_key(k, c1, 0));
        for d in [0, 1, 7, 63] {
            for key in [
                context_key(k, c1, d),
                launch_key(k, d),
                name_key(k, b"f", d),
            ] {
                assert_eq!(key_device(key), d, "{key:#x}");
                assert_ne!(key, 0);
            }
        }
    }

    #[test]
    fn forgetting_one_devices_keys_keeps_the_others() {
        let s = Box::new(HandlesSeen::new());
        let on = |d: usize| -> Vec<u64> {
            (0..500u64)
                .map(|i| launch_key(0x7f00_0000_0000 + i * 64, d))
                .chain((0..500u64).map(|i| context_key(0x6000 + i, 0x9000, d)))
                .collect()
        };
        let (zero, one) = (on(0), on(1));
        assert!(zero.iter().chain(&one).all(|&k| s.insert(k)));
        s.forget(|k| key_device(k) == 1);
        assert!(zero.iter().all(|&k| s.contains(k)), "device 0's kept");
        assert!(one.iter().all(|&k| !s.contains(k)), "device 1's forgotten");
    }

    #[test]
    fn an_owner_is_expected_to_take_what_it_took_in_another_context() {
        let e = LoadEstimates::new();
        assert_eq!(e.expected(7, false), 0, "never seen: nothing expected");
        e.learn(7, false, 200 << 20);
        e.learn(7, true, 2 << 20);
        e.learn(7, false, 100 << 20);
        assert_eq!(
            e.expected(7, false),
            200 << 20,
            "the most a new context took"
        );
        assert_eq!(
            e.expected(7, true),
            2 << 20,
            "a further kernel where it is loaded"
        );
        assert_eq!(e.expected(8, false), 0);
        e.learn(0, false, 1 << 30);
        assert_eq!(e.expected(0, false), 0, "an owner the driver did not name");
        e.forget(7);
        assert_eq!(e.expected(7, false), 0, "unloaded: forgotten");
        for o in 1..=(ESTIMATED_OWNERS as u64 + 1) {
            e.learn(o, false, o);
        }
        assert_eq!(
            e.expected(1, false),
            0,
            "the oldest forgotten past the bound"
        );
        assert_eq!(
            e.expected(ESTIMATED_OWNERS as u64 + 1, false),
            ESTIMATED_OWNERS as u64 + 1
        );
    }
}
