//! The fake device's state, below the exported API: what exists (contexts, streams,
//! allocations, pools, VMM handles, IPC mappings, arrays) and how much memory it takes.
//!
//! Layers, bottom first: a module imports `abi` and modules of the layers above its own
//! in this list, never its own layer's, never `api`.

// The accounting of device memory.
pub mod ledger;

// The devices this process sees; pages and handles from the OS.
pub mod device;
pub mod os;

// Contexts.
pub mod ctx;

// What lives in a context or device and needs no allocation of another kind.
pub mod cls;
pub mod external;
pub mod graph;
pub mod green;
pub mod host;
pub mod ipc;
pub mod limit;
pub mod pool;
pub mod stream;

// Allocations: arrays, linear memory (pool allocations are linear), VMM.
pub mod array;
pub mod linear;
pub mod multicast;
pub mod vmm;

// Modules, libraries and functions (their globals are linear allocations).
pub mod module;

// What the deprecated launches take from earlier calls on a function.
pub mod launch_shape;

// Across kinds: what an address is, and what goes when a context ends.
pub mod address;
pub mod teardown;

/// The model's maps: std's `HashMap` with SipHash's fixed keys instead of a random seed per
/// process, so that the fake's instructions per call do not vary from run to run with the
/// seed (scripts/bench/bench-instructions.sh measures the shim against it: with a random
/// seed, a launch's lookups would move the raw figure from one run to the next).
pub type HashMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<std::hash::DefaultHasher>>;
