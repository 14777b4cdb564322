//! What a pool holds, read without changing it: for `gpucap status`, `gpucap top`, the
//! pool's view in `cuMemGetInfo` and NVML's list of processes.

use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};

use serde::Serialize;

use super::layout;
use super::member::{MemberLocks, Pool};
use super::used::members_count;
use crate::config::format_uuid;

/// One GPU of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuView {
    /// The GPU's UUID, `GPU-…`.
    pub uuid: String,
    /// The cap in bytes; None: no cap.
    pub cap: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub refusals: u64,
    pub largest_refused: u64,
    /// Bytes held by members whose process died and that nobody took back yet (the
    /// next allocation that needs them does).
    pub held_by_dead: u64,
    /// Requests waiting for memory now (`GPUCAP_WAIT`).
    pub waiters: u64,
    /// Waits that ended (served or timed out), and their total time in milliseconds.
    pub waits: u64,
    pub wait_ms: u64,
    /// What the members' slots hold on this GPU (live and dead not taken back yet).
    pub members_hold: u64,
    /// `used` minus `members_hold`, seen with no change in flight: 0 unless another
    /// process wrote the file (or a bug). The next refusal recounts it.
    pub drift: i64,
    /// True when a live member holds this GPU to another cap than the cap word says
    /// (another process wrote it; the members keep enforcing their own).
    pub cap_drift: bool,
    /// The member holding this GPU's word lock when read (None: free).
    pub lock: Option<LockView>,
    #[serde(skip)]
    pub raw_uuid: [u8; 16],
    /// Bytes guaranteed to live members (`GPUCAP_GUARANTEE`), in all: what the pool
    /// keeps for them, each guarantee and the sum at most the cap (see `share_drift`).
    pub guaranteed: u64,
    /// True when share words could not be (a guarantee's holder bit on a slot no member
    /// holds, a guarantee or ceiling above the cap, guarantees summing above it): shown
    /// clamped to the cap; the next joiner or refusal repairs them (`repair`).
    pub share_drift: bool,
    /// The pool's cap was set by `gpucap pool resize` (or `set`): a member started with
    /// another `GPUCAP_LIMIT` takes it while members hold the pool (`cap_to_register`).
    #[serde(skip)]
    pub resized: bool,
}

/// Who holds a GPU's word lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockView {
    pub slot: usize,
    /// The holder's pid (in its PID namespace), from its slot.
    pub pid: u32,
    /// Since when it has kept another member waiting, in ms since the Unix epoch (None:
    /// nobody has waited for it).
    pub since_ms: Option<u64>,
}

/// One member of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberView {
    pub slot: usize,
    /// The pid as the member sees itself (in its own PID namespace).
    pub pid: u32,
    /// Its effective uid (None: a member that did not say).
    pub uid: Option<u32>,
    /// The inode of its PID namespace (`/proc/PID/ns/pid`).
    pub pid_namespace: u64,
    pub command: String,
    /// When it joined, in ms since the Unix epoch.
    pub start_ms: u64,
    /// False: the process died and its share was not taken back yet.
    pub alive: bool,
    /// Dead, and processes it forked still hold its device files: the driver keeps its
    /// memory, and the pool its bytes, until they are gone (`reclaim`).
    pub held_by_children: bool,
    pub gpus: Vec<MemberGpuView>,
}

/// A member's use of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberGpuView {
    pub uuid: String,
    pub used: u64,
    pub peak: u64,
    #[serde(skip)]
    pub raw_uuid: [u8; 16],
    /// Bytes the pool keeps for the member (`GPUCAP_GUARANTEE`; 0: none).
    pub guarantee: u64,
    /// The most it may hold (`GPUCAP_CEILING`); None: the pool's cap.
    pub ceiling: Option<u64>,
    /// What it holds above its guarantee: lent by the pool.
    pub borrowed: u64,
    /// Where the ceiling it is held at on this GPU came from, when handed down to it
    /// (`/etc/gpucap/gpucap.env`, a driver's hand-over); its ceiling is then `ceiling`,
    /// or the pool's cap. None: not held at a ceiling handed down.
    pub ceiling_from: Option<String>,
}

/// The whole pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolView {
    pub version: u64,
    /// The most members it holds: the count it was made with (`GPUCAP_POOL_MEMBERS`).
    pub slots: usize,
    /// When the file was made, in seconds since the Unix epoch.
    pub created: u64,
    pub gpus: Vec<GpuView>,
    pub members: Vec<MemberView>,
}

impl Pool<'_> {
    /// Reads the pool. `locks` answers which members live; nothing is written.
    pub fn view(&self, locks: &dyn MemberLocks) -> PoolView {
        let w = self.w;
        let mut gpus: Vec<(usize, GpuView)> = Vec::new();
        for g in 0..layout::MAX_POOL_GPUS {
            if !w.has_gpu(g) {
                continue;
            }
            let raw = w.uuid(g);
            gpus.push((
                g,
                GpuView {
                    uuid: format_uuid(false, &raw),
                    cap: layout::decode_cap(w.gpu(g, layout::G_CAP).load(Relaxed)).flatten(),
                    used: w.used(g),
                    peak: w.gpu(g, layout::G_PEAK).load(Relaxed),
                    refusals: w.gpu(g, layout::G_REFUSALS).load(Relaxed),
                    largest_refused: w.gpu(g, layout::G_LARGEST_REFUSED).load(Relaxed),
                    held_by_dead: 0,
                    waiters: w.gpu(g, layout::G_WAITERS).load(Relaxed),
                    waits: w.gpu(g, layout::G_WAITS).load(Relaxed),
                    wait_ms: w.gpu(g, layout::G_WAIT_MS).load(Relaxed),
                    members_hold: 0,
                    drift: 0,
                    cap_drift: false,
                    lock: lock_view(w, g),
                    raw_uuid: raw,
                    guaranteed: 0,
                    share_drift: false,
                    resized: w.gpu(g, layout::G_CAP_GEN).load(Relaxed) != 0,
                },
            ));
        }
        // Per GPU, the most any figure of the pool's may show: the cap the live members
        // hold it to (their own words; the cap word if none lives), at most what `used`
        // can count.
        let mut limits = [layout::USED_BYTES; layout::MAX_POOL_GPUS];
        for (g, gpu) in gpus.iter_mut() {
            (gpu.members_hold, gpu.drift) = drift(w, locks, *g);
            let cap = w.gpu(*g, layout::G_CAP).load(Relaxed);
            let live_cap = (0..w.slots()).find_map(|s| {
                let theirs = w.member_gpu(s, *g, layout::M_CAP).load(Relaxed);
                (theirs != 0 && w.state(s).load(Acquire) == layout::STATE_LIVE && locks.held(s))
                    .then_some(theirs)
            });
            gpu.cap_drift = (0..w.slots()).any(|s| {
                let theirs = w.member_gpu(s, *g, layout::M_CAP).load(Relaxed);
                theirs != 0
                    && theirs != cap
                    && w.state(s).load(Acquire) == layout::STATE_LIVE
                    && locks.held(s)
            });
            let limit = layout::decode_cap(live_cap.unwrap_or(cap))
                .flatten()
                .map_or(layout::USED_BYTES, |c| c.min(layout::USED_BYTES));
            limits[*g] = limit;
            // A `used` word above the cap shows as the cap, unless the members do hold
            // more (charges the driver made without asking: `Member::charge_past_cap`).
            gpu.used = gpu.used.min(limit.max(gpu.members_hold));
            gpu.share_drift = share_drift(w, locks, *g, limit);
        }
        let mut members = Vec::new();
        for s in 0..w.slots() {
            if w.state(s).load(Acquire) != layout::STATE_LIVE {
                continue;
            }
            let alive = locks.held(s);
            let handed_word = w.slot(s, layout::S_HANDED).load(Relaxed);
            let handed = crate::config::HandedDown::from_word(handed_word >> 32);
            let handed_gpus = handed_word & 0xffff_ffff;
            let mut mine = Vec::new();
            for (g, gpu) in gpus.iter_mut() {
                let used = w.member_gpu(s, *g, layout::M_USED).load(Relaxed);
                let peak = w.member_gpu(s, *g, layout::M_PEAK).load(Relaxed);
                let cap = w.member_gpu(s, *g, layout::M_CAP).load(Relaxed);
                if used == 0 && peak == 0 && cap == 0 {
                    continue;
                }
                let limit = limits[*g];
                // What the pool keeps for it: a guarantee its bit says, at most the cap.
                let guarantee = if holds_guarantee(w, s, *g) {
                    w.share(s, *g, layout::SH_GUARANTEE)
                        .load(Relaxed)
                        .min(limit)
                } else {
                    0
                };
                if alive {
                    gpu.guaranteed = gpu.guaranteed.saturating_add(guarantee).min(limit);
                }
                if !alive {
                    gpu.held_by_dead += used;
                }
                mine.push(MemberGpuView {
                    uuid: gpu.uuid.clone(),
                    used,
                    peak,
                    raw_uuid: gpu.raw_uuid,
                    guarantee,
                    ceiling: match w.share(s, *g, layout::SH_CEILING).load(Relaxed) {
                        0 | u64::MAX => None,
                        c => Some(c.min(limit)),
                    },
                    borrowed: super::shares::borrowed(guarantee, used),
                    ceiling_from: handed
                        .filter(|_| handed_gpus & 1 << *g != 0)
                        .map(|h| h.text()),
                });
            }
            members.push(MemberView {
                slot: s,
                pid: layout::word_pid(w.slot(s, layout::S_PID).load(Relaxed)),
                uid: layout::word_uid(w.slot(s, layout::S_PID).load(Relaxed)),
                pid_namespace: w.slot(s, layout::S_PIDNS).load(Relaxed),
                command: w.command(s),
                start_ms: w.slot(s, layout::S_START_MS).load(Relaxed),
                alive,
                held_by_children: !alive && locks.descendants_hold(s),
                gpus: mine,
            });
        }
        PoolView {
            version: w.header(layout::H_VERSION).load(Relaxed),
            slots: w.slots(),
            created: w.header(layout::H_CREATED).load(Relaxed),
            gpus: gpus.into_iter().map(|(_, g)| g).collect(),
            members,
        }
    }
}

/// What the members' slots hold on GPU entry `g`, and `used` minus that. Read with
/// nothing in flight (no member's `pending`) and `used` unchanged around it (its change
/// count included); a difference counts only if no one of three readings shows none (a
/// change between two loads is not drift).
fn drift(w: layout::Words<'_>, locks: &dyn MemberLocks, g: usize) -> (u64, i64) {
    let mut last = (0, 0);
    for _ in 0..3 {
        let word = w.gpu(g, layout::G_USED).load(SeqCst);
        let (members, pending) = members_count(w, locks, g);
        let again = w.gpu(g, layout::G_USED).load(SeqCst);
        let diff = layout::used_bytes(word).wrapping_sub(members) as i64;
        if diff == 0 {
            return (members, 0);
        }
        if pending == 0 && again == word {
            last = (members, diff);
        }
    }
    last
}

/// Whether slot `s`'s holder bit on GPU entry `g` is set.
fn holds_guarantee(w: layout::Words<'_>, s: usize, g: usize) -> bool {
    w.share_bits(g, s / 64).load(Acquire) & 1 << (s % 64) != 0
}

/// Whether GPU entry `g`'s share words hold one that could not be, under the cap
/// `limit` (the rules of `repair`, read only): a holder bit of an empty slot nobody
/// holds, a bit and a guarantee that disagree, a guarantee or ceiling above the cap or
/// a guarantee above its ceiling, live guarantees summing above the cap.
fn share_drift(w: layout::Words<'_>, locks: &dyn MemberLocks, g: usize, limit: u64) -> bool {
    let mut given = 0u64;
    for s in 0..w.slots() {
        let bit = holds_guarantee(w, s, g);
        let guarantee = w.share(s, g, layout::SH_GUARANTEE).load(Relaxed);
        let ceiling = w.share(s, g, layout::SH_CEILING).load(Relaxed);
        if w.state(s).load(Acquire) != layout::STATE_LIVE {
            if bit && !locks.held(s) {
                return true;
            }
            continue;
        }
        if bit != (guarantee != 0)
            || guarantee > limit
            || ceiling > limit
            || (ceiling != 0 && guarantee > ceiling)
        {
            return true;
        }
        given = given.saturating_add(guarantee);
    }
    given > limit
}

/// Who holds GPU entry `g`'s word lock now, and since when others wait for it.
fn lock_view(w: layout::Words<'_>, g: usize) -> Option<LockView> {
    let holder = w.gpu(g, layout::G_LOCK).load(Acquire) & layout::LOCK_HOLDER;
    if holder == 0 || holder > w.slots() as u64 {
        return None;
    }
    let slot = holder as usize - 1;
    let since = w.gpu(g, layout::G_LOCK_SINCE).load(Relaxed);
    Some(LockView {
        slot,
        pid: layout::word_pid(w.slot(slot, layout::S_PID).load(Relaxed)),
        since_ms: (since != 0 && since & layout::LOCK_HOLDER == holder).then_some(since >> 16),
    })
}
