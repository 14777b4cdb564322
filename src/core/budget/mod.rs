//! The budget a pool's processes share (`GPUCAP_POOL`): one cap per GPU for every
//! process that names the same pool file, kept in words of a shared memory-mapped file.
//!
//! This module is the protocol over those words, safe Rust over `&[AtomicU64]`; the
//! file itself (where it lives, its permissions, the mapping, the per-member locks the
//! kernel drops when a process dies) is `gpucap-pool-file`'s business, behind
//! [`MemberLocks`].
//!
//! - `layout`: the file's words (magic, version, GPU entries, member slots);
//!   `layout_error`: the checks that turn another version or corrupted content into a
//!   clear error.
//! - `member`: a member (a slot held by a kernel lock) and agreeing on each GPU's cap;
//!   `command`: the command it shows there.
//! - `join`: joining, leaving, and taking back the share of a member that died, in work
//!   that does not grow with the member count per joiner; `reclaim`: when a dead
//!   member's bytes may come back (the driver released them).
//! - `gpu_words`: the words one member's changes on one GPU touch, found once at join.
//! - `account`: reserving and crediting bytes: one compare-and-swap on the GPU's `used`
//!   word, no lock on the way of an allocation the pool can take; `used`: the word and
//!   its recount, so a member killed at any instruction leaves nothing held.
//! - `short_path`: a reservation in one try of the cap, marked started on the same
//!   words (the way of nearly every allocation).
//! - `context_flight`: the contexts members are making on a GPU now, so that a
//!   context's measurement knows whether another member's context is in it.
//! - `marks`: the members' frees and allocations marked around their driver calls,
//!   so that a context's memory is measured without the others' traffic in it.
//! - `wait`: waiting for members to free memory (`GPUCAP_WAIT`), in arrival order.
//! - `notes`: what a member tells the shim for its log as it happens: a wait's progress,
//!   a word found wrong and repaired.
//! - `shares`: guarantees and ceilings inside a pool (`GPUCAP_GUARANTEE`,
//!   `GPUCAP_CEILING`): the policy, pure functions over plain numbers.
//!   `share_words` keeps them in the pool file's words.
//! - `share_set`: a live member's guarantee and ceiling changed (`gpucap pool set`),
//!   and how the member tells the change from damage.
//! - `repair`: share words that cannot be (a guarantee of an empty slot, above the cap,
//!   guarantees summing above it), repaired by the next joiner or refusal.
//! - `resize`: a GPU's cap changed while members hold it (`gpucap pool resize`),
//!   and how each member learns it.
//! - `view`: a snapshot for `gpucap status`, `gpucap top` and NVML's process list.

mod account;
mod command;
mod context_flight;
mod gpu_words;
mod join;
mod layout;
mod layout_error;
mod marks;
mod member;
mod notes;
mod reclaim;
mod repair;
mod resize;
mod share_set;
mod share_words;
pub mod shares;
mod short_path;
mod used;
mod view;
mod wait;

pub use account::PoolRefusal;
pub use command::member_command;
pub use context_flight::{ContextFlight, Overlap};
pub use join::{JOIN_SWEEP_ALL, JOIN_SWEEP_EVERY_MS};
pub use layout::{
    COMMAND_BYTES, DEFAULT_SLOTS, H_BYTES, H_FILE_DEV, H_FILE_INO, H_GEOMETRY, H_SLOTS_SEEN,
    HEADER_WORDS, LayoutError, MAGIC, MAX_POOL_GPUS, MAX_SLOTS, POOL_FILE_BYTES, POOL_VERSION,
    POOL_WORDS, STATE_EMPTY, STATE_LIVE, STATES_AT, geometry_slots, pool_file_bytes, pool_words,
};
pub use marks::{FreedBefore, MadeInside, PoolTraffic};
pub use member::{
    CapMismatch, JoinError, Member, MemberInfo, MemberLocks, Pool, RESIZE_TAKEOVER, TURN_WAIT,
    TurnLock,
};
pub use notes::{Repair, ShareFault, ShareRepair, WaitNote};
pub use reclaim::{DriverShows, DriverView, EXIT_GRACE, EXIT_MAX, Exit, show_driver};
pub use resize::{ResizeRefusal, Resized};
pub use share_set::{ShareChange, ShareRefusal, ShareSet};
pub use share_words::{ClaimRefusal, Claimed, Holder};
pub use view::{GpuView, LockView, MemberGpuView, MemberView, PoolView};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod touched;
