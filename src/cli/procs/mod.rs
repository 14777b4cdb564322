//! Every capped process of this user (root: of the machine), as rows like
//! `nvidia-smi`'s process table: the members of every pool and the processes capped
//! on their own (their `.lone` files, `gpucap_core::lone`). What `gpucap status` (no
//! pool named), `gpucap top` and `status --json` show.
//!
//! - `sources.rs`: which directories, the pool files kept open between readings, the
//!   lone files read (a dead process's removed).
//! - `names.rs`: GPU indexes by UUID (users' names: `crate::users`).
//! - this file: the rows, worked out from what was read (pure).

mod names;
mod sources;

use serde::Serialize;

use gpucap_core::budget::{PoolView, shares};
use gpucap_core::lone::LoneView;

pub use crate::users::{unknown_user, user_name};
pub use names::Gpus;
pub use sources::{Sources, Unread, pool_name, raise_open_files_limit};

/// One pool, as read.
#[derive(Debug, Clone, Serialize)]
pub struct PoolReading {
    /// The file name without `.pool`.
    pub name: String,
    pub path: String,
    /// The file's path alone (`path` may say more: removed, read through a member).
    #[serde(skip)]
    pub file: std::path::PathBuf,
    /// The file's owner (a user's pool: every member runs as it; a claim's or the
    /// container's: its first member's, each member's own in its row).
    pub uid: u32,
    pub user: String,
    /// A claim's or the container's pool: its members may be several users'.
    #[serde(skip)]
    pub shared: bool,
    #[serde(flatten)]
    pub view: PoolView,
}

/// The uid member `m` of pool `p` runs as: in a claim's or the container's pool the one
/// it wrote beside its pid (where it wrote one), else the file's owner (a user's pool is
/// its owner's alone, mode 0600: a slot saying another user is a copy's or damage).
pub fn member_uid(p: &PoolReading, m: &gpucap_core::budget::MemberView) -> u32 {
    match m.uid {
        Some(u) if p.shared => u,
        _ => p.uid,
    }
}

/// One lone process, as read.
#[derive(Debug, Clone, Serialize)]
pub struct LoneReading {
    pub path: String,
    pub user: String,
    #[serde(flatten)]
    pub view: LoneView,
}

/// One process on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The GPU's index as this `gpucap` sees it (CUDA's ordinal), if the driver named it.
    pub gpu: Option<u32>,
    pub gpu_uuid: String,
    pub pid: u32,
    pub pid_namespace: u64,
    /// The pid is from another PID namespace than this `gpucap`'s (another container).
    pub other_namespace: bool,
    pub uid: u32,
    pub user: String,
    /// The pool (None: capped on its own).
    pub pool: Option<String>,
    /// Its pool's file, as the pool's `path` shows it: which pool, where several users'
    /// pools have one name.
    #[serde(skip)]
    pub pool_path: Option<String>,
    /// False: a pool member that died without leaving (its bytes still counted).
    pub alive: bool,
    pub command: String,
    /// The most it may hold: its own cap, or its pool's (its ceiling when lower). None:
    /// no cap.
    pub cap: Option<u64>,
    pub used: u64,
    pub peak: u64,
    /// What it could still take now: its cap less its use (in a pool, less what the
    /// other members hold). None: no cap.
    pub free: Option<u64>,
    /// `used` as a share of `cap`, in per cent.
    pub use_percent: Option<f64>,
    /// Requests refused: its own (None for a pool member: its pool counts them, see the
    /// pool's figures).
    pub refusals: Option<u64>,
    pub start_ms: u64,
    /// Where `cap` came from when it is a ceiling handed down to the process (a
    /// configuration file, `/etc/gpucap/gpucap.env`, or a driver's hand-over), which its
    /// environment cannot raise. None: its cap is its own environment's (or its pool's).
    pub ceiling_from: Option<String>,
}

/// What one reading found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    pub processes: Vec<Row>,
    pub pools: Vec<PoolReading>,
    pub lone: Vec<LoneReading>,
    /// Files that could not be read, each with why.
    pub errors: Vec<String>,
    /// What was read all the same though it should not be as it is, each with why (root's
    /// own pool directory writable by others).
    pub warnings: Vec<String>,
    /// GPU indexes by UUID.
    #[serde(skip)]
    pub gpus: Gpus,
}

/// `free` at most what the GPU (of `total` bytes, where known) has beside `used`: a cap
/// above the GPU leaves no more than the GPU.
fn within_gpu(free: Option<u64>, total: Option<u64>, used: u64) -> Option<u64> {
    match (free, total) {
        (Some(f), Some(t)) => Some(f.min(t.saturating_sub(used))),
        (f, _) => f,
    }
}

fn percent(used: u64, cap: Option<u64>) -> Option<f64> {
    cap.map(|c| {
        if c == 0 {
            if used == 0 { 0.0 } else { 100.0 }
        } else {
            used as f64 * 100.0 / c as f64
        }
    })
}

/// The rows of `pools` and `lone` (`own_pidns`: this process's PID namespace; `gpus`
/// names indexes), the largest users first.
pub fn rows(pools: &[PoolReading], lone: &[LoneReading], own_pidns: u64, gpus: &Gpus) -> Vec<Row> {
    let other = |ns: u64| own_pidns != 0 && ns != 0 && ns != own_pidns;
    let mut out = Vec::new();
    for p in pools {
        // Per GPU of the pool, the live members' unused guarantees, summed once (a sum
        // per member and GPU over every member was (members x GPUs) squared: minutes of
        // CPU for a pool file of 4,096 members on 32 GPUs).
        let mut unused_on: Vec<(&_, u64)> = Vec::new();
        for o in p.view.members.iter().filter(|o| o.alive) {
            for og in &o.gpus {
                let add = shares::unused(og.guarantee, og.used);
                match unused_on.iter_mut().find(|(u, _)| **u == og.raw_uuid) {
                    Some((_, sum)) => *sum = sum.saturating_add(add),
                    None => unused_on.push((&og.raw_uuid, add)),
                }
            }
        }
        for m in &p.view.members {
            for g in &m.gpus {
                let pool_gpu = p.view.gpus.iter().find(|x| x.raw_uuid == g.raw_uuid);
                let pool_cap = pool_gpu.and_then(|x| x.cap);
                let cap = match (pool_cap, g.ceiling) {
                    (Some(c), Some(ceil)) => Some(c.min(ceil)),
                    (c, None) => c,
                    (None, Some(ceil)) => Some(ceil),
                };
                // The pool's room keeps the other live members' unused guarantees for
                // them, as the pool's rule does (`shares::free`).
                let all_unused = unused_on
                    .iter()
                    .find(|(u, _)| **u == g.raw_uuid)
                    .map_or(0, |(_, sum)| *sum);
                let own_unused = if m.alive {
                    shares::unused(g.guarantee, g.used)
                } else {
                    0
                };
                let others_unused = all_unused.saturating_sub(own_unused);
                let pool_room = pool_cap
                    .zip(pool_gpu)
                    .map(|(c, x)| c.saturating_sub(x.used).saturating_sub(others_unused));
                let own_room = cap.map(|c| c.saturating_sub(g.used));
                let free = match (pool_room, own_room) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let free = within_gpu(free, gpus.total(&g.raw_uuid), g.used);
                out.push(Row {
                    gpu: gpus.index(&g.raw_uuid),
                    gpu_uuid: g.uuid.clone(),
                    pid: m.pid,
                    pid_namespace: m.pid_namespace,
                    other_namespace: other(m.pid_namespace),
                    uid: member_uid(p, m),
                    user: match member_uid(p, m) {
                        u if u == p.uid => p.user.clone(),
                        u => user_name(u),
                    },
                    pool: Some(p.name.clone()),
                    pool_path: Some(p.path.clone()),
                    alive: m.alive,
                    command: m.command.clone(),
                    cap,
                    used: g.used,
                    peak: g.peak,
                    free,
                    use_percent: percent(g.used, cap),
                    refusals: None,
                    start_ms: m.start_ms,
                    ceiling_from: g.ceiling_from.clone(),
                });
            }
        }
    }
    for l in lone {
        let v = &l.view;
        // The GPUs it used or was refused on; at least its first, so that it shows.
        let mut shown: Vec<_> = v
            .gpus
            .iter()
            .filter(|g| g.peak > 0 || g.refusals > 0)
            .collect();
        if shown.is_empty() {
            shown.extend(v.gpus.first());
        }
        for g in shown {
            out.push(Row {
                gpu: gpus.index(&g.raw_uuid),
                gpu_uuid: g.uuid.clone(),
                pid: v.pid,
                pid_namespace: v.pid_namespace,
                other_namespace: other(v.pid_namespace),
                uid: v.uid,
                user: l.user.clone(),
                pool: None,
                pool_path: None,
                alive: true,
                command: v.command.clone(),
                cap: g.cap,
                used: g.used,
                peak: g.peak,
                free: within_gpu(
                    g.cap.map(|c| c.saturating_sub(g.used)),
                    gpus.total(&g.raw_uuid),
                    g.used,
                ),
                use_percent: percent(g.used, g.cap),
                refusals: Some(g.refusals),
                start_ms: v.start_ms,
                ceiling_from: g.ceiling_from.clone(),
            });
        }
    }
    out.sort_by(|a, b| {
        b.used
            .cmp(&a.used)
            .then(a.pid.cmp(&b.pid))
            .then(a.gpu.cmp(&b.gpu))
    });
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpucap_core::lone::{LoneGpuView, LoneView};

    const MIB: u64 = 1 << 20;

    pub(crate) fn lone(pid: u32, used: u64, cap: Option<u64>) -> LoneReading {
        LoneReading {
            path: format!("/p/{pid}-7.lone"),
            user: "alice".into(),
            view: LoneView {
                pid,
                pid_namespace: 7,
                start_ms: 1_700_000_000_000,
                uid: 1000,
                growth: false,
                command: format!("prog-{pid} --lone"),
                gpus: vec![LoneGpuView {
                    ordinal: 0,
                    uuid: "GPU-11111111-1111-1111-1111-111111111111".into(),
                    raw_uuid: [0x11; 16],
                    cap,
                    used,
                    peak: used + MIB,
                    refusals: 2,
                    largest_refused: 600 * MIB,
                    allocs: 3,
                    ceiling_from: None,
                }],
            },
        }
    }

    pub(crate) fn pool() -> PoolReading {
        PoolReading {
            name: "train".into(),
            path: "/p/train.pool".into(),
            file: "/p/train.pool".into(),
            uid: 1000,
            user: "alice".into(),
            shared: false,
            view: crate::pool::tests::view(),
        }
    }

    #[test]
    fn members_and_lone_processes_are_rows() {
        let gpus = Gpus::from_uuids(vec![[0x11; 16]]);
        let r = rows(&[pool()], &[lone(99, 300 * MIB, Some(1 << 30))], 7, &gpus);
        let pids: Vec<u32> = r.iter().map(|r| r.pid).collect();
        assert_eq!(pids, [12, 99, 11, 10], "largest first");
        let l = &r[1];
        assert_eq!((l.gpu, l.pool.as_deref()), (Some(0), None));
        assert_eq!(l.free, Some((1 << 30) - 300 * MIB));
        assert_eq!(l.refusals, Some(2));
        assert!((l.use_percent.unwrap() - 29.296875).abs() < 1e-9);
        // Member 10: a 512 MiB ceiling under the 1 GiB cap; the pool holds 700 MiB.
        let m = r.iter().find(|r| r.pid == 10).unwrap();
        assert_eq!(m.cap, Some(512 * MIB));
        assert_eq!(m.free, Some(324 * MIB), "the pool's room, below its own");
        assert_eq!(m.refusals, None);
        assert!(r.iter().find(|r| r.pid == 12).unwrap().other_namespace);
        assert!(!r.iter().find(|r| r.pid == 11).unwrap().alive);
    }

    /// A claim's or the container's pool has members of several users: each row shows
    /// the member's own uid, the file's owner only where the member said none.
    #[test]
    fn a_members_row_shows_its_own_user_not_the_files_owner() {
        let gpus = Gpus::from_uuids(vec![[0x11; 16]]);
        let mut p = pool();
        let slot_says = p.clone();
        p.shared = true;
        p.view.members.iter_mut().find(|m| m.pid == 12).unwrap().uid = Some(0);
        p.view.members.iter_mut().find(|m| m.pid == 10).unwrap().uid = Some(1000);
        p.view.members.iter_mut().find(|m| m.pid == 11).unwrap().uid = None;
        let r = rows(&[p], &[], 7, &gpus);
        let user = |pid: u32| {
            let row = r.iter().find(|r| r.pid == pid).unwrap();
            (row.uid, row.user.clone())
        };
        assert_eq!(user(12), (0, user_name(0)));
        assert_eq!(user(10), (1000, "alice".to_string()));
        assert_eq!(
            user(11),
            (1000, "alice".to_string()),
            "none said: the owner"
        );
        // A user's pool is its owner's alone: a slot saying another user (a copy of
        // another's file) is not shown.
        let mut copy = slot_says;
        copy.view.members.iter_mut().for_each(|m| m.uid = Some(0));
        let r = rows(&[copy], &[], 7, &gpus);
        assert!(
            r.iter()
                .all(|r| (r.uid, r.user.as_str()) == (1000, "alice"))
        );
    }

    #[test]
    fn a_members_free_keeps_the_other_live_members_unused_guarantees() {
        let gpus = Gpus::from_uuids(vec![[0x11; 16]]);
        let mut p = pool();
        // Member 12 (alive) is guaranteed 300 MiB more than it holds; member 11 (dead)
        // too, which keeps nothing.
        for pid in [12, 11] {
            let m = p.view.members.iter_mut().find(|m| m.pid == pid).unwrap();
            m.gpus[0].guarantee = m.gpus[0].used + 300 * MIB;
        }
        let r = rows(&[p], &[], 7, &gpus);
        let m = r.iter().find(|r| r.pid == 10).unwrap();
        assert_eq!(
            m.free,
            Some(24 * MIB),
            "324 MiB of room, 300 of it kept for 12"
        );
        // 12's own guarantee is not kept from it.
        let g = r.iter().find(|r| r.pid == 12).unwrap();
        assert_eq!(g.free, Some((1 << 30) - 700 * MIB));
    }

    #[test]
    fn free_is_never_more_than_the_gpu_has() {
        // A 1 GiB cap on a GPU of 512 MiB: 300 MiB used leaves 212 MiB, not 724.
        let gpus = Gpus::from_totals(vec![([0x11; 16], 512 * MIB)]);
        let r = rows(&[], &[lone(99, 300 * MIB, Some(1 << 30))], 7, &gpus);
        assert_eq!(r[0].free, Some(212 * MIB));
        let r = rows(&[pool()], &[], 7, &gpus);
        let m = r.iter().find(|r| r.pid == 12).unwrap();
        assert_eq!(m.free, Some(112 * MIB), "400 MiB used of 512");
    }

    #[test]
    fn a_lone_process_with_nothing_used_still_shows() {
        let mut l = lone(5, 0, None);
        l.view.gpus[0].peak = 0;
        l.view.gpus[0].refusals = 0;
        let r = rows(&[], &[l], 0, &Gpus::default());
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].gpu, r[0].cap, r[0].free, r[0].use_percent),
            (None, None, None, None)
        );
    }
}
