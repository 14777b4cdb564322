//! What a pool holds, read without changing it: for `gpucap status`, `gpucap top`, the
//! pool's view in `cuMemGetInfo` and NVML's list of processes.

use std::sync::atomic::Ordering::*;

use serde::Serialize;

use super::layout::*;
use super::member::{MemberLocks, Pool};
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
    #[serde(skip)]
    pub raw_uuid: [u8; 16],
    /// Bytes guaranteed to live members (`GPUCAP_GUARANTEE`), in all.
    pub guaranteed: u64,
}

/// One member of the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberView {
    pub slot: usize,
    /// The pid as the member sees itself (in its own PID namespace).
    pub pid: u32,
    /// The inode of its PID namespace (`/proc/PID/ns/pid`).
    pub pid_namespace: u64,
    pub command: String,
    /// When it joined, in ms since the Unix epoch.
    pub start_ms: u64,
    /// False: the process died and its share was not taken back yet.
    pub alive: bool,
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
}

/// The whole pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolView {
    pub version: u64,
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
        for g in 0..MAX_POOL_GPUS {
            if w.gpu(g, G_KEY).load(Acquire) == 0 {
                continue;
            }
            let raw = w.uuid(g);
            gpus.push((
                g,
                GpuView {
                    uuid: format_uuid(false, &raw),
                    cap: decode_cap(w.gpu(g, G_CAP).load(Relaxed)).flatten(),
                    used: w.gpu(g, G_USED).load(Relaxed),
                    peak: w.gpu(g, G_PEAK).load(Relaxed),
                    refusals: w.gpu(g, G_REFUSALS).load(Relaxed),
                    largest_refused: w.gpu(g, G_LARGEST_REFUSED).load(Relaxed),
                    held_by_dead: 0,
                    waiters: w.gpu(g, G_WAITERS).load(Relaxed),
                    waits: w.gpu(g, G_WAITS).load(Relaxed),
                    wait_ms: w.gpu(g, G_WAIT_MS).load(Relaxed),
                    raw_uuid: raw,
                    guaranteed: 0,
                },
            ));
        }
        let mut members = Vec::new();
        for s in 0..MAX_SLOTS {
            if w.slot(s, S_STATE).load(Acquire) != STATE_LIVE {
                continue;
            }
            let alive = locks.held(s);
            let mut mine = Vec::new();
            for (g, gpu) in gpus.iter_mut() {
                let used = w.member_gpu(s, *g, M_USED).load(Relaxed);
                let peak = w.member_gpu(s, *g, M_PEAK).load(Relaxed);
                let cap = w.member_gpu(s, *g, M_CAP).load(Relaxed);
                if used == 0 && peak == 0 && cap == 0 {
                    continue;
                }
                let guarantee = w.share(s, *g, SH_GUARANTEE).load(Relaxed);
                if alive {
                    gpu.guaranteed += guarantee;
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
                    ceiling: match w.share(s, *g, SH_CEILING).load(Relaxed) {
                        0 | u64::MAX => None,
                        c => Some(c),
                    },
                    borrowed: super::shares::borrowed(guarantee, used),
                });
            }
            members.push(MemberView {
                slot: s,
                pid: w.slot(s, S_PID).load(Relaxed) as u32,
                pid_namespace: w.slot(s, S_PIDNS).load(Relaxed),
                command: w.command(s),
                start_ms: w.slot(s, S_START_MS).load(Relaxed),
                alive,
                gpus: mine,
            });
        }
        PoolView {
            version: w.header(H_VERSION).load(Relaxed),
            created: w.header(H_CREATED).load(Relaxed),
            gpus: gpus.into_iter().map(|(_, g)| g).collect(),
            members,
        }
    }
}
