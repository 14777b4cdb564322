//! gpucap's pool file (`GPUCAP_POOL`): the FFI edge under `gpucap_core::budget`.
//!
//! - `location`: which file a pool name means, and the directory checks that keep other
//!   users from changing or resetting a budget.
//! - `mapping`: creating a file atomically (made whole, then linked into place), opening
//!   and checking an existing one, mapping its words.
//! - `locks`: the per-member open-file-description locks the kernel drops when a
//!   process dies ([`gpucap_core::budget::MemberLocks`]).
//! - `removal`: removing a file no member uses (`gpucap pool clean`), and a joiner's
//!   check that the file it joined was not removed meanwhile.
//! - `live`: a claim's live words, in a sealed memfd its members hand to each other over
//!   a socket (a file any container of the claim may truncate is mapped by none).
//! - `bases`: the directory pools are made in (`GPUCAP_POOL_DIR`, `/dev/shm`, `/tmp`),
//!   and whether this process may make files in a directory.
//! - `container`: the container's pool, one directory every user of the container
//!   shares (a claim's pool of the pool directory's).
//! - `sharing`: who may use a pool file: its creator alone, or (a claim's) whoever may
//!   write the claim's directory; the mode a new one gets and the check an existing one
//!   must pass.
//! - `lone`: the file of a process capped on its own (`gpucap_core::lone`): made and
//!   mapped over the ledger's figures by the shim, read (and removed once its process
//!   died) by the CLI.
//! - `beacon`: each member of a user's pool announces itself (an abstract socket), so
//!   that a pool whose file was removed under live members (a logout's cleanup) is
//!   joined through a member's descriptor, never made a second time.
//! - `removed_file`: how a pool file removed under live members was opened (a member's
//!   descriptor, or one handed over on a claim's socket), and why a process may not join.
//! - `kept`: a descriptor kept while the program runs, acted on only while its number is
//!   still the file kept (the program may close it and reuse the number).
//! - `held_dir`: a user's directory held open while a reader reads it, every name in it
//!   reached through the descriptor (its owner may swap it for a link meanwhile).
//! - `hex`: a value as the 16 hex digits of a name, the same work whatever the value.
//! - `sys`: the C library's file calls, under the names Rust's std imports too (one
//!   symbol lookup fewer each when the shim is loaded).
//!
//! Used by the shim (members) and the CLI (`gpucap status`, `gpucap top`: readers).

mod bases;
mod beacon;
mod container;
mod creation;
mod held_dir;
mod hex;
mod identity;
mod kept;
mod live;
mod location;
mod locks;
mod lone;
mod lone_read;
mod mapping;
mod removal;
mod removed_file;
mod sharing;
mod sys;

pub use bases::disk_file_system;
pub use beacon::{
    forget_in_child as forget_beacon_in_child, linked as announced_pool_files,
    removed as removed_pool_files,
};
pub use container::{container_pools, resolve as resolve_pool};
pub use creation::can_make;
pub use held_dir::HeldDir;
pub use identity::{own_cmdline, own_pid_namespace, own_uid};
pub use live::forget_in_child as forget_claims_in_child;
pub use live::members_live as claim_members_live;
pub use live::new_reading_round;
pub use location::{every_user_dir, locate, locate_existing, path_of, user_dir};
pub use locks::{ContextWindow, SlotLocks, WindowOutcome};
pub use lone::Lone;
pub use lone_read::{LoneReading, read_lone_dir};
pub use mapping::{PoolFile, open_member, open_reader, open_writer, without_file_name};
pub use removal::{Removal, join_linked, remove_unused};
pub use removed_file::Through;
pub use sharing::Sharing;

/// A fresh, empty directory for a unit test of `module` (`gpucap-MODULE-TAG-PID` in the
/// temporary directory).
#[cfg(test)]
pub(crate) fn test_dir(module: &str, tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gpucap-{module}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
