//! CUDA graph memory: what the memory nodes of graphs (`cuGraphAddMemAllocNode`, or
//! `cuMemAllocAsync` captured into a graph) take. The driver reserves physical memory for
//! an executable graph's allocations in the device's graph memory pool when it is
//! instantiated (or uploaded, or launched after a trim), keeps it for reuse, and gives back
//! what no graph holds at `cuDeviceGraphMemTrim`. It publishes the figure
//! (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`): the device carries one charge for its graph
//! memory, settled to that figure after every call that may move it ([`GraphCharges::settle`]).
//! Before a call that can still fail (instantiate, upload, launch), what the exec may need
//! ([`GraphCharges::expected`]: the sizes of its alloc nodes in whole 2 MiB granules, unless
//! it holds its memory already) is reserved against the cap, so the device never holds
//! more than the cap, and a call the cap cannot take is refused with
//! `CUDA_ERROR_OUT_OF_MEMORY`, as the driver refuses a launch it finds no memory for.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{
    AtomicUsize,
    Ordering::{AcqRel, Acquire},
};

use crate::config::MAX_DEVICES;

/// The granularity of graph memory (the VMM granularity).
pub const GRANULE: u64 = 2 << 20;

/// What alloc nodes of (device, bytes) need on each device: each in whole granules
/// (saturating), summed per device, devices in the order first named.
pub fn footprint(allocs: impl IntoIterator<Item = (usize, u64)>) -> Vec<(usize, u64)> {
    let mut out: Vec<(usize, u64)> = Vec::new();
    for (dev, bytes) in allocs {
        let g = bytes.checked_next_multiple_of(GRANULE).unwrap_or(u64::MAX);
        match out.iter_mut().find(|(d, _)| *d == dev) {
            Some((_, b)) => *b = b.saturating_add(g),
            None => out.push((dev, g)),
        }
    }
    out
}

/// How a device's graph charge moves to the driver's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The figure rose: charge this much more.
    Charge(u64),
    /// The figure fell: credit this much.
    Credit(u64),
    Same,
}

/// The change from what is `charged` to the driver's `figure`.
pub fn settle(charged: u64, figure: u64) -> Settle {
    match figure.cmp(&charged) {
        std::cmp::Ordering::Greater => Settle::Charge(figure - charged),
        std::cmp::Ordering::Less => Settle::Credit(charged - figure),
        std::cmp::Ordering::Equal => Settle::Same,
    }
}

/// What an exec whose memory needs `footprint` bytes on a device may make the driver
/// reserve there: what the driver's idle graph memory cannot serve. The driver reserves
/// `reserved` bytes, of which live graph allocations use `used`; every other exec with
/// memory there (`others`: their footprints, held or not) may hold its own. What is left
/// is surely idle (kept for reuse after an exec went), so only the rest is expected.
pub fn expected_growth(footprint: u64, reserved: u64, used: u64, others: u64) -> u64 {
    let idle = reserved.saturating_sub(used.saturating_add(others));
    footprint.saturating_sub(idle)
}

#[derive(Debug, Clone)]
struct Exec {
    footprint: Vec<(usize, u64)>,
    /// Whether the driver holds its memory (since instantiate, upload or launch; until a
    /// trim of one of its devices).
    held: bool,
}

#[derive(Debug)]
struct Inner {
    execs: BTreeMap<u64, Exec>,
    /// The graph charge of each device: the driver's figure when last read.
    charged: [u64; MAX_DEVICES],
}

/// The executable graphs with memory nodes, and each device's graph charge.
pub struct GraphCharges {
    inner: Mutex<Inner>,
    /// How many execs with memory nodes live (one load for a launch of any other graph).
    with_memory: AtomicUsize,
}

impl Default for GraphCharges {
    fn default() -> Self {
        Self::new()
    }
}

impl GraphCharges {
    pub const fn new() -> Self {
        GraphCharges {
            inner: Mutex::new(Inner {
                execs: BTreeMap::new(),
                charged: [0; MAX_DEVICES],
            }),
            with_memory: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any exec with memory nodes lives (cheap).
    pub fn any(&self) -> bool {
        self.with_memory.load(Acquire) != 0
    }

    /// A new exec whose alloc nodes need `footprint`; the driver holds its memory now.
    /// Execs without memory nodes are not kept.
    pub fn instantiated(&self, exec: u64, footprint: Vec<(usize, u64)>) {
        if footprint.iter().all(|&(_, b)| b == 0) {
            return;
        }
        let exec_entry = Exec {
            footprint,
            held: true,
        };
        if self.lock().execs.insert(exec, exec_entry).is_none() {
            self.with_memory.fetch_add(1, AcqRel);
        }
    }

    /// A new exec whose memory nodes could not be listed, on `devices` (every device the
    /// process sees): what it needs is not known, so nothing is expected of it before a
    /// call, but it is kept so that its launches and its end settle those devices'
    /// figures.
    pub fn instantiated_unlisted(&self, exec: u64, devices: &[usize]) {
        let exec_entry = Exec {
            footprint: devices.iter().map(|&d| (d, 0)).collect(),
            held: true,
        };
        if self.lock().execs.insert(exec, exec_entry).is_none() {
            self.with_memory.fetch_add(1, AcqRel);
        }
    }

    /// The devices of `exec`'s memory (none: not an exec with memory nodes).
    pub fn devices(&self, exec: u64) -> Vec<usize> {
        self.lock()
            .execs
            .get(&exec)
            .map(|e| e.footprint.iter().map(|&(d, _)| d).collect())
            .unwrap_or_default()
    }

    /// The footprint of `exec`'s memory on `device` (0: none there, an exec whose nodes
    /// could not be listed, or not an exec with memory nodes).
    pub fn footprint_of(&self, exec: u64, device: usize) -> u64 {
        self.lock().execs.get(&exec).map_or(0, |e| {
            e.footprint
                .iter()
                .filter(|&&(d, _)| d == device)
                .fold(0u64, |a, &(_, b)| a.saturating_add(b))
        })
    }

    /// What `exec` may make the driver reserve now: its footprint unless it holds its
    /// memory.
    pub fn expected(&self, exec: u64) -> Vec<(usize, u64)> {
        match self.lock().execs.get(&exec) {
            Some(e) if !e.held => e.footprint.clone(),
            _ => Vec::new(),
        }
    }

    /// The footprints on `device` of every exec with memory there, but `except`
    /// (saturating).
    pub fn footprint_on(&self, device: usize, except: Option<u64>) -> u64 {
        self.lock()
            .execs
            .iter()
            .filter(|(k, _)| Some(**k) != except)
            .flat_map(|(_, e)| e.footprint.iter())
            .filter(|&&(d, _)| d == device)
            .fold(0u64, |a, &(_, b)| a.saturating_add(b))
    }

    /// After a successful upload or launch: the driver holds `exec`'s memory.
    pub fn held(&self, exec: u64) {
        if let Some(e) = self.lock().execs.get_mut(&exec) {
            e.held = true;
        }
    }

    /// After `cuDeviceGraphMemTrim` of `device`: every exec with memory there may have lost
    /// it (the driver gives back what no running graph or live allocation holds).
    pub fn trimmed(&self, device: usize) {
        for e in self.lock().execs.values_mut() {
            if e.footprint.iter().any(|&(d, _)| d == device) {
                e.held = false;
            }
        }
    }

    /// After `cuGraphExecDestroy`: its devices (whose figures may move), if it had memory.
    pub fn destroyed(&self, exec: u64) -> Vec<usize> {
        match self.lock().execs.remove(&exec) {
            Some(e) => {
                self.with_memory.fetch_sub(1, AcqRel);
                e.footprint.iter().map(|&(d, _)| d).collect()
            }
            None => Vec::new(),
        }
    }

    /// Reads the driver's figure for `device` with `figure` (None: it does not answer) and
    /// moves the device's charge to it, in one step per device so that settles of
    /// concurrent calls apply in the order their figures were read. `apply` does the
    /// ledger's part; the charge stays where it was when the figure cannot be read.
    pub fn settle(
        &self,
        device: usize,
        figure: impl FnOnce() -> Option<u64>,
        apply: impl FnOnce(Settle),
    ) {
        let Some(slot) = Some(device).filter(|&d| d < MAX_DEVICES) else {
            return;
        };
        let mut inner = self.lock();
        let Some(f) = figure() else {
            return;
        };
        let change = settle(inner.charged[slot], f);
        inner.charged[slot] = f;
        apply(change);
    }

    /// The graph charge of `device`.
    pub fn charged(&self, device: usize) -> u64 {
        self.lock().charged.get(device).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_footprint_is_whole_granules_per_device() {
        assert_eq!(
            footprint([(0, 300 * MIB), (1, 1), (0, 3 * MIB)]),
            vec![(0, 304 * MIB), (1, 2 * MIB)]
        );
        assert_eq!(footprint([(0, u64::MAX), (0, 1)]), vec![(0, u64::MAX)]);
        assert!(footprint([]).is_empty());
    }

    #[test]
    fn the_charge_follows_the_drivers_figure() {
        assert_eq!(settle(0, 600 * MIB), Settle::Charge(600 * MIB));
        assert_eq!(settle(600 * MIB, 0), Settle::Credit(600 * MIB));
        assert_eq!(settle(5, 5), Settle::Same);
    }

    #[test]
    fn only_graph_memory_surely_idle_is_counted_on_for_reuse() {
        // Another exec holds 600 MiB: all of it may be its own.
        assert_eq!(
            expected_growth(600 * MIB, 600 * MIB, 0, 600 * MIB),
            600 * MIB
        );
        // That exec went: its 600 MiB are idle, kept for reuse.
        assert_eq!(expected_growth(600 * MIB, 600 * MIB, 0, 0), 0);
        assert_eq!(expected_growth(700 * MIB, 600 * MIB, 0, 0), 100 * MIB);
        // A live allocation left by a launch is not idle.
        assert_eq!(expected_growth(600 * MIB, 600 * MIB, 4 * MIB, 0), 4 * MIB);
        // Figures that do not add up expect it all.
        assert_eq!(expected_growth(8, 0, u64::MAX, u64::MAX), 8);
    }

    #[test]
    fn an_exec_is_expected_to_reserve_only_while_it_does_not_hold_its_memory() {
        let b = GraphCharges::new();
        assert!(!b.any());
        b.instantiated(7, vec![]);
        assert!(!b.any(), "no memory nodes: not kept");
        b.instantiated(1, footprint([(0, 600 * MIB)]));
        b.instantiated(2, footprint([(1, 10 * MIB)]));
        assert!(b.any());
        assert_eq!(b.footprint_on(0, None), 600 * MIB);
        assert_eq!(b.footprint_on(0, Some(1)), 0);
        assert_eq!((b.footprint_of(1, 0), b.footprint_of(1, 1)), (600 * MIB, 0));
        assert_eq!(b.footprint_of(99, 0), 0, "unknown exec");
        assert!(b.expected(1).is_empty(), "held since instantiation");
        b.trimmed(0);
        assert_eq!(b.expected(1), vec![(0, 600 * MIB)]);
        assert!(b.expected(2).is_empty(), "another device's trim");
        b.held(1);
        assert!(b.expected(1).is_empty());
        assert_eq!(b.destroyed(1), vec![0]);
        assert!(b.destroyed(1).is_empty(), "once");
        assert!(b.expected(99).is_empty(), "unknown exec");
        assert_eq!(b.destroyed(2), vec![1]);
        assert!(!b.any());
    }

    #[test]
    fn an_exec_whose_nodes_cannot_be_listed_is_kept_for_its_devices_figures() {
        let b = GraphCharges::new();
        b.instantiated_unlisted(5, &[0, 1]);
        assert!(b.any(), "kept: its launches and its end settle the figures");
        assert_eq!(b.devices(5), vec![0, 1]);
        assert_eq!(b.footprint_on(0, None), 0, "its needs are not known");
        b.trimmed(0);
        assert!(
            b.expected(5).iter().all(|&(_, bytes)| bytes == 0),
            "nothing to reserve before a launch: settled after it"
        );
        assert_eq!(b.destroyed(5), vec![0, 1]);
        assert!(!b.any());
    }

    #[test]
    fn settles_apply_the_change_and_keep_the_figure() {
        let b = GraphCharges::new();
        let mut seen = Vec::new();
        b.settle(0, || Some(600 * MIB), |s| seen.push(s));
        b.settle(0, || None, |s| seen.push(s));
        b.settle(0, || Some(100 * MIB), |s| seen.push(s));
        b.settle(MAX_DEVICES, || Some(1), |s| seen.push(s));
        assert_eq!(
            seen,
            vec![Settle::Charge(600 * MIB), Settle::Credit(500 * MIB)]
        );
        assert_eq!(b.charged(0), 100 * MIB);
    }
}
