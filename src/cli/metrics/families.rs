//! The metric families of the exposition: name, type and HELP text, in the order they
//! are printed, and their indices.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

/// One metric family: name, type, HELP text.
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
    }
}

// The families, in the order they are printed. Indices into FAMILIES below.
pub const UP: usize = 0;
pub const INFO: usize = 1;
pub const MEMBERS: usize = 2;
/// Then used, peak, refusals, largest refused (4 to 7: `Samples::add_figures`).
pub const CAP: usize = 3;
pub const HELD_BY_DEAD: usize = 8;
pub const MEMBER_ALIVE: usize = 9;
pub const MEMBER_USED: usize = 10;
pub const MEMBER_PEAK: usize = 11;
pub const WAITERS: usize = 12;
pub const WAITS: usize = 13;
pub const WAIT_SECONDS: usize = 14;
pub const DRIFT: usize = 15;
pub const GUARANTEED: usize = 16;
pub const MEMBER_GUARANTEE: usize = 17;
pub const MEMBER_CEILING: usize = 18;
pub const MEMBER_BORROWED: usize = 19;
/// Then used, peak, refusals, largest refused (21 to 24: `Samples::add_figures`).
pub const PROCESS_CAP: usize = 20;
/// A pool member's or a lone process's cap that is a ceiling handed down to it.
pub const HANDED_DOWN: usize = 25;
/// With `--all`: a user's files named like pool files that are not pools, counted.
pub const UNREADABLE_FILES: usize = 26;
/// HAMi's monitor names (`--hami`, hami.rs): used and limit.
pub const HAMI_USED: usize = 27;
pub const HAMI_LIMIT: usize = 28;

pub const FAMILIES: [Family; 29] = [
    gauge(
        "gpucap_pool_up",
        "1 if the pool's file was read, 0 if not (no process has joined the pool yet, or \
         a file this gpucap cannot read).",
    ),
    gauge(
        "gpucap_pool_info",
        "Always 1: the pool's file (path) and its layout version.",
    ),
    gauge(
        "gpucap_pool_members",
        "Member slots in use, by state: alive, or dead (the process died and its share \
         was not taken back yet).",
    ),
    gauge(
        "gpucap_pool_cap_bytes",
        "The pool's cap on this GPU in bytes, shared by all its members (no sample: no cap).",
    ),
    gauge(
        "gpucap_pool_used_bytes",
        "Bytes the pool's members hold on this GPU now, dead members' included.",
    ),
    gauge(
        "gpucap_pool_peak_bytes",
        "The highest used bytes the pool has recorded on this GPU.",
    ),
    Family {
        name: "gpucap_pool_refusals_total",
        kind: Kind::Counter,
        help: "Allocations refused to the pool's members on this GPU: by the pool's cap, or by a member's own cap.",
    },
    gauge(
        "gpucap_pool_largest_refused_bytes",
        "The largest allocation the pool refused on this GPU, in bytes (0: none).",
    ),
    gauge(
        "gpucap_pool_held_by_dead_bytes",
        "Bytes of the used bytes held by dead members (the next allocation that needs \
         them takes them back).",
    ),
    gauge(
        "gpucap_member_alive",
        "1 if the member process lives, 0 if it died without leaving (its share is still \
         counted).",
    ),
    gauge(
        "gpucap_member_used_bytes",
        "Bytes the member holds on this GPU now.",
    ),
    gauge(
        "gpucap_member_peak_bytes",
        "The most bytes the member held on this GPU at once.",
    ),
    gauge(
        "gpucap_pool_waiters",
        "Allocations waiting for memory on this GPU now (GPUCAP_WAIT).",
    ),
    Family {
        name: "gpucap_pool_waits_total",
        kind: Kind::Counter,
        help: "Waits for memory on this GPU that ended, served or timed out (GPUCAP_WAIT).",
    },
    Family {
        name: "gpucap_pool_wait_seconds_total",
        kind: Kind::Counter,
        help: "Seconds spent in those waits, summed.",
    },
    gauge(
        "gpucap_pool_drift_bytes",
        "The pool file's used bytes on this GPU minus what its members' slots hold: 0 \
         unless another process wrote the file (the next refusal recounts it).",
    ),
    gauge(
        "gpucap_pool_guaranteed_bytes",
        "Bytes of the cap guaranteed to live members on this GPU (GPUCAP_GUARANTEE), in all.",
    ),
    gauge(
        "gpucap_member_guarantee_bytes",
        "Bytes the pool keeps for the member on this GPU (GPUCAP_GUARANTEE; 0: none).",
    ),
    gauge(
        "gpucap_member_ceiling_bytes",
        "The most the member may hold on this GPU (GPUCAP_CEILING; no sample: the pool's cap).",
    ),
    gauge(
        "gpucap_member_borrowed_bytes",
        "Bytes the member holds above its guarantee on this GPU: lent by the pool.",
    ),
    gauge(
        "gpucap_process_cap_bytes",
        "The cap of a process capped on its own (no pool) on this GPU (no sample: no cap).",
    ),
    gauge(
        "gpucap_process_used_bytes",
        "Bytes a process capped on its own holds on this GPU now.",
    ),
    gauge(
        "gpucap_process_peak_bytes",
        "The most bytes a process capped on its own held on this GPU at once.",
    ),
    Family {
        name: "gpucap_process_refusals_total",
        kind: Kind::Counter,
        help: "Allocations refused to a process capped on its own on this GPU.",
    },
    gauge(
        "gpucap_process_largest_refused_bytes",
        "The largest allocation refused to a process capped on its own on this GPU (0: none).",
    ),
    gauge(
        "gpucap_ceiling_handed_down_bytes",
        "The most a process may hold on this GPU when that is a ceiling handed down to it (a \
         gpucap.env file's or a driver's hand-over, label from), which its environment cannot \
         raise; no sample: its cap is its environment's own (or its pool's).",
    ),
    gauge(
        "gpucap_pool_files_unreadable",
        "Files of the user's pool directory named like pool files (NAME.pool) that are not \
         gpucap pool files (no pool file's header, or a name no pool has): counted, each \
         without a gpucap_pool_up series of its own (no sample: none).",
    ),
    gauge(
        "hami_vgpu_memory_used_bytes",
        "HAMi's name (gpucap --hami): bytes a container's capped processes hold on this GPU, \
         those of one gpucap pool (label pool) or one process capped alone (label pid).",
    ),
    gauge(
        "hami_vgpu_memory_limit_bytes",
        "HAMi's name (gpucap --hami): the cap those processes share on this GPU (the pool's, \
         or the process's own).",
    ),
];
