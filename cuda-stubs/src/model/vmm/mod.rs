//! Virtual memory management (cuMemCreate / cuMemAddressReserve / cuMemMap ...) and
//! shareable handles (cuMemExportToShareableHandle / cuMemImportFromShareableHandle).
//!
//! A physical allocation is a range of a per-device "arena" memfd (sparse, so no RAM until
//! touched): the arena grows by bumping its end and a released range is punched out, so
//! thousands of handles cost one fd. A handle created with
//! `requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` gets a memfd of its own
//! instead, so that it can be exported as an fd. cuMemMap maps the range MAP_SHARED|MAP_FIXED
//! into a PROT_NONE reservation, so several mappings alias the same bytes. Mappings stay
//! PROT_NONE until cuMemSetAccess, as on a real GPU.
//!
//! Files: `physical.rs` (handles and their memory), `ranges.rs` (reservations and
//! mappings), `sharing.rs` (export and import of handles), `multicast_memory.rs` (a
//! multicast object's handle, devices and bindings), `array_tiles.rs` (memory mapped into
//! sparse and deferred-mapping arrays).

mod array_tiles;
mod multicast_memory;
mod physical;
mod ranges;
mod sharing;

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};

use libc::c_int;

use super::HashMap;

pub use array_tiles::{Place, TileOp, drop_array_tiles, map_array};
pub(super) use multicast_memory::{MulticastBinding, MulticastDevices, create_multicast};
pub use physical::{create, properties, release, retain};
pub use ranges::{
    address_free, check_range, map, mapping_at, reservation_at, reserve, set_access, unmap_range,
};
pub use sharing::{export_fd, import};

use physical::{Arena, Phys};

pub const GRANULARITY: usize = 2 << 20;

/// A mapping of (part of) a handle into a reservation.
#[derive(Debug, Clone, Copy)]
pub struct Mapping {
    pub size: usize,
    pub handle: u64,
    pub dev: usize,
    /// CUmemAccess_flags: 0 none, 1 read, 3 read-write.
    pub access: c_int,
}

#[derive(Default)]
pub(super) struct Vmm {
    pub(super) phys: HashMap<u64, Phys>,
    /// Arena of each device ordinal.
    arenas: HashMap<usize, Arena>,
    next_handle: u64,
    /// Reserved ranges: start -> size.
    reserved: BTreeMap<usize, usize>,
    mappings: BTreeMap<usize, Mapping>,
    /// Multicast bindings: (object, device, offset in the object) -> what is bound.
    pub(super) bindings: BTreeMap<(u64, usize, usize), MulticastBinding>,
    /// Each multicast object's devices: how many it was made for, and those added.
    pub(super) multicast_devices: HashMap<u64, MulticastDevices>,
    /// Handles mapped into sparse and deferred-mapping arrays (`array_tiles`).
    array_tiles: Vec<array_tiles::Tile>,
}

static VMM: LazyLock<Mutex<Vmm>> = LazyLock::new(Default::default);

pub(super) fn vmm() -> std::sync::MutexGuard<'static, Vmm> {
    VMM.lock().unwrap_or_else(|e| e.into_inner())
}

impl Vmm {
    pub(super) fn mapping_at(&self, ptr: usize) -> Option<(usize, Mapping)> {
        let (&base, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr < base + m.size).then_some((base, *m))
    }

    /// The reservation containing [ptr, ptr+size).
    pub(super) fn reservation_of(&self, ptr: usize, size: usize) -> Option<(usize, usize)> {
        let (&b, &len) = self.reserved.range(..=ptr).next_back()?;
        (ptr.checked_add(size)? <= b + len).then_some((b, len))
    }

    /// Mappings fully inside [ptr, ptr+size), and whether they cover it without gaps.
    pub(super) fn mappings_in(&self, ptr: usize, size: usize) -> (Vec<usize>, bool) {
        let end = ptr + size;
        let mut starts = Vec::new();
        let mut at = ptr;
        let mut contiguous = true;
        for (&b, m) in self.mappings.range(ptr..end) {
            if b != at {
                contiguous = false;
            }
            if b + m.size > end {
                contiguous = false;
                break;
            }
            starts.push(b);
            at = b + m.size;
        }
        (starts, contiguous && at == end)
    }
}
