//! This process's membership of its pool (`GPUCAP_POOL`): joined once CUDA is up,
//! given back at exit, dropped in a forked child, which joins as its own member at its
//! first driver call, `cuInit` or not (see [`orphaned`]). Over `gpucap-pool-file`; no
//! driver calls (the caller passes each visible GPU's UUID and cap).

use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::{Mutex, Once, OnceLock};

use gpucap_core::budget::shares::{self, UnderCeiling};
use gpucap_core::budget::{CapMismatch, Claimed, Member, MemberInfo, Repair, WaitNote};
use gpucap_core::config::{Config, PoolSpec};
use gpucap_core::size::format_bytes;
use gpucap_pool_file::PoolFile;

struct Joined {
    file: &'static PoolFile,
    member: Box<Member<'static>>,
}

/// One membership per generation of forks that used CUDA (a child cannot reuse its
/// parent's: the parent still holds that slot); the ledger keeps as many.
const GENERATIONS: usize = gpucap_core::ledger::POOL_GENERATIONS;
static MEMBERS: [OnceLock<Joined>; GENERATIONS] = [const { OnceLock::new() }; GENERATIONS];
/// The index (+1) in `MEMBERS` of this process's membership; 0: none.
static CURRENT: AtomicUsize = AtomicUsize::new(0);
/// Set when joining failed: the message, and every later CUDA call fails closed.
static FAILED: OnceLock<String> = OnceLock::new();
static JOINING: Mutex<()> = Mutex::new(());
/// Set in a forked child of a member (its parent's membership dropped), until the child
/// joined as its own member or failed to.
static ORPHANED: AtomicBool = AtomicBool::new(false);
static AT_FORK: Once = Once::new();

/// The pool this process charges, if it joined one.
#[inline]
pub fn current() -> Option<&'static Member<'static>> {
    match CURRENT.load(Acquire) {
        0 => None,
        i => MEMBERS.get(i - 1)?.get().map(|j| &*j.member),
    }
}

/// How long a member that knows no context figure for a GPU waits for the member
/// measuring the pool's first context there (see [`first_context_window`]): a real
/// context takes 100 to 500 ms to make.
const FIRST_CONTEXT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Before this process makes a context on `device` while its pool knows no figure for a
/// context on that GPU: the pool's first-context window there (None outside a pool, or
/// on a GPU the pool does not hold), so that the first figure is measured alone. Waiting
/// ends as soon as another member's figure is known.
pub fn first_context_window(device: usize) -> Option<gpucap_pool_file::ContextWindow<'static>> {
    let i = CURRENT.load(Acquire).checked_sub(1)?;
    let joined = MEMBERS.get(i)?.get()?;
    let entry = joined.member.gpu_entry(device)?;
    let known = || joined.member.context_figure(device).is_some();
    Some(
        joined
            .file
            .locks
            .first_context_window(entry, FIRST_CONTEXT_PATIENCE, &known),
    )
}

/// The pool's file, if this process joined one.
pub fn path() -> Option<&'static std::path::Path> {
    match CURRENT.load(Acquire) {
        0 => None,
        i => MEMBERS.get(i - 1)?.get().map(|j| j.file.path.as_path()),
    }
}

/// Why joining failed, if it did.
pub fn failed() -> Option<&'static str> {
    FAILED.get().map(String::as_str)
}

/// Whether this process is a forked child of a pool member that has not joined the
/// pool itself yet: its next driver call must join (or fail closed) first, whether or
/// not it calls `cuInit` (the driver may let a child use the context it inherited), so
/// that nothing it allocates is counted outside the pool. One load.
#[inline]
pub fn orphaned() -> bool {
    ORPHANED.load(Acquire)
}

/// Joining cannot even be tried (the driver would not say which GPUs there are):
/// kept as [`join`]'s errors are, so every later CUDA call fails closed.
pub fn fail(message: String) -> &'static str {
    let _ = FAILED.set(message);
    ORPHANED.store(false, Release);
    failed().unwrap_or_default()
}

/// What one visible GPU is held to.
pub struct Gpu {
    pub uuid: [u8; 16],
    pub cap: Option<u64>,
}

/// The CUDA ordinals (one bit each) whose cap is a ceiling handed down to this process
/// (a configuration file's or a driver's), not lowered by its environment: told by the
/// shim as it works each cap out, before joining, and recorded in the slot at join.
static AT_CEILING: AtomicU64 = AtomicU64::new(0);

/// GPU `device`'s cap is a ceiling handed down to this process (see [`AT_CEILING`]).
pub fn note_at_ceiling(device: usize) {
    if device < 64 {
        AT_CEILING.fetch_or(1 << device, Relaxed);
    }
}

/// Joins the configured pool (nothing without `GPUCAP_POOL`) and registers every
/// visible GPU with its cap. An error is kept: every later CUDA call fails closed.
pub fn join(config: &Config, gpus: &[Gpu]) -> Result<(), &'static str> {
    let Some(spec) = &config.pool else {
        return Ok(());
    };
    if let Some(e) = failed() {
        return Err(e);
    }
    let _guard = JOINING.lock().unwrap_or_else(|p| p.into_inner());
    if current().is_some() {
        return Ok(());
    }
    match join_now(spec, config, gpus) {
        Ok(()) => Ok(()),
        Err(e) => {
            let e = gpucap_pool_file::without_file_name(&e, &spec.to_string());
            Err(fail(format!("gpucap: cannot join the pool {spec}: {e}")))
        }
    }
}

fn join_now(spec: &PoolSpec, config: &Config, gpus: &[Gpu]) -> Result<(), String> {
    let index = MEMBERS
        .iter()
        .position(|m| m.get().is_none())
        .ok_or_else(|| format!("{GENERATIONS} nested forks joined pools already"))?;
    // The container's pool is its directory's (every user of the container shares it).
    let spec = &gpucap_pool_file::resolve_pool(spec, config.pool_dir.as_deref(), true)?;
    let path = gpucap_pool_file::locate(spec, config.pool_dir.as_deref(), true)?;
    // A `gpucap pool clean` removing the file between its open and the slot taken is
    // noticed, and the path opened again (see gpucap_pool_file's `removal`).
    let info = own_info();
    // A dead member in another PID namespace: its bytes come back when the driver shows
    // them released (`budget::reclaim`). (The unit tests have no driver.)
    #[cfg(not(test))]
    gpucap_core::budget::show_driver(crate::driver::nvml_direct::driver_shows);
    let members = config
        .pool_members
        .unwrap_or(gpucap_core::budget::DEFAULT_SLOTS);
    let (file, member) = gpucap_pool_file::join_linked(
        &path,
        gpucap_pool_file::Sharing::of(spec),
        members,
        |f| {
            Member::join_waiting(f.mapped()?, &f.locks, &info, config.wait).map_err(|e| {
                match f.locks.refused() {
                    // Every slot looked held because none can be locked there.
                    Some(why) => format!("the pool file {}: {why}", path.display()),
                    None => format!("{}: {e}", path.display()),
                }
            })
        },
        |m| m.leave(),
    )?;
    // A claim's file marks the slot taken until this member leaves at its exit: a member
    // killed with children holding its memory keeps joiners out (`live::decide`).
    file.mark_in_file(member.slot(), true);
    let leave = |member: &Member<'static>| {
        member.leave();
        file.mark_in_file(member.slot(), false);
    };
    if let Some(through) = file.joined_through {
        let (by, advice) = match gpucap_pool_file::Sharing::of(spec) {
            gpucap_pool_file::Sharing::Claim => ("by a process of the claim or a cleanup", ""),
            _ => (
                "a logout's cleanup: logind removes a user's files in /dev/shm when the last \
                 session ends; or by hand",
                "; set GPUCAP_POOL_DIR to a directory nothing cleans",
            ),
        };
        let how = match through {
            gpucap_pool_file::Through::Process(pid) => format!("process {pid}'s descriptor"),
            gpucap_pool_file::Through::Socket => {
                "the file's descriptor a member handed over on the claim's socket (none \
                 announces itself where this process can open its descriptor: another network \
                 namespace, or another user's process)"
                    .to_string()
            }
        };
        crate::log::log!(
            Warn,
            "the pool file {} was removed while its members run ({by}): this process joins \
             them through {how}, under their one budget (gpucap status reads it the same \
             way){advice}",
            path.display()
        );
    }
    let member = member
        .waiting(config.wait, wait_note)
        .on_repair(repair_note);
    // Per GPU: the cap the pool holds it to, and what this process may hold of it where
    // that is less (its ceiling handed down).
    let mut registered = Vec::with_capacity(gpus.len());
    for (ordinal, gpu) in gpus.iter().enumerate() {
        match register(&member, spec, config, ordinal, gpu) {
            Ok(r) => registered.push(r),
            Err(e) => {
                leave(&member);
                return Err(e);
            }
        }
    }
    let uuids: Vec<[u8; 16]> = gpus.iter().map(|g| g.uuid).collect();
    for (ordinal, &(cap, held)) in registered.iter().enumerate() {
        if let Err(e) = claim_share(&member, config, ordinal, &uuids, cap, held) {
            leave(&member);
            return Err(format!("{}: GPU {ordinal}: {e}", path.display()));
        }
    }
    // What `gpucap status` shows: the GPUs on which this process is held at a ceiling
    // handed down to it, and where that came from.
    if let Some(handed) = gpucap_core::config::HandedDown::of(config) {
        // Not where the pool's smaller cap holds instead.
        let at_ceiling = AT_CEILING.load(Relaxed);
        let at: Vec<usize> = gpus
            .iter()
            .zip(&registered)
            .enumerate()
            .filter(|(d, (g, (cap, held)))| {
                at_ceiling & 1 << d != 0 && (held.is_some() || *cap == g.cap)
            })
            .map(|(d, _)| d)
            .collect();
        member.mark_handed_down(handed.word(), &at);
    }
    if MEMBERS[index].set(Joined { file, member }).is_err() {
        return Err("joined twice".into());
    }
    // SAFETY: registers a plain extern "C" function taking nothing, run in fork children.
    AT_FORK.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(forget_in_child));
    });
    CURRENT.store(index + 1, Release);
    ORPHANED.store(false, Release);
    Ok(())
}

/// Registers visible GPU `ordinal` with its cap. Every member of a pool must hold a GPU
/// to the same cap, except one whose cap there is a ceiling handed down to it (a
/// configuration file's): it joins a pool with a larger cap (or none) held at its own,
/// said in one line, and one with a smaller cap at the pool's, which holds. Returns the
/// cap registered and, where less, what this process may hold (None: all of it).
fn register(
    member: &Member<'_>,
    spec: &PoolSpec,
    config: &Config,
    ordinal: usize,
    gpu: &Gpu,
) -> Result<(Option<u64>, Option<u64>), String> {
    let mismatch = |e: CapMismatch| e.text(ordinal);
    let mut cap = gpu.cap;
    // A resize between two tries changes the pool's cap again: tried a few times.
    for _ in 0..4 {
        let e = match member.register_gpu(ordinal, &gpu.uuid, cap) {
            Ok(()) => {
                // The cap it holds the GPU to (a pool resized meanwhile keeps its own).
                let pool = member.usage(ordinal).map_or(cap, |(_, c, _)| c);
                let Some(bound) = config.bound.as_ref().filter(|_| pool != gpu.cap) else {
                    return Ok((cap, None));
                };
                let Some(UnderCeiling::Held(held)) = shares::under_ceiling(gpu.cap, pool) else {
                    return Ok((pool, None));
                };
                let line = gpucap_core::config::pool_held_line(
                    bound,
                    &spec.to_string(),
                    ordinal,
                    pool,
                    held,
                );
                crate::log::log!(Warn, "{}", line.trim_start_matches("gpucap: "));
                return Ok((pool, Some(held)));
            }
            Err(e) => e,
        };
        match e {
            CapMismatch::Differs { pool, .. }
                if config.bound.is_some() && shares::under_ceiling(gpu.cap, pool).is_some() =>
            {
                cap = pool;
            }
            e => return Err(mismatch(e)),
        }
    }
    Err(mismatch(CapMismatch::Differs {
        ours: gpu.cap,
        pool: cap,
    }))
}

/// Claims this process's guarantee and ceiling (`GPUCAP_GUARANTEE`, `GPUCAP_CEILING`)
/// on GPU `ordinal` of the pool, if it has either or is `held` below the pool's `cap`:
/// checked against the pool's `cap`, then admitted (or waited for, with `GPUCAP_WAIT`)
/// among the live members'. A share `gpucap pool set` gave this process meanwhile (its
/// GPU registered, its own share not yet claimed) stays in force, said in one line.
fn claim_share(
    member: &Member<'_>,
    config: &Config,
    ordinal: usize,
    uuids: &[[u8; 16]],
    cap: Option<u64>,
    held: Option<u64>,
) -> Result<(), String> {
    let share = shares::for_gpu(config, ordinal, uuids, cap)?;
    let share = match held {
        Some(h) => Some(shares::held_share(share, cap, h).map_err(|e| e.to_string())?),
        None => share,
    };
    let Some(share) = share else {
        return Ok(());
    };
    match member.claim(ordinal, share).map_err(|e| e.to_string())? {
        Claimed::Own => {}
        Claimed::Set { guarantee, ceiling } => {
            let ceiling_of = |c: Option<u64>| {
                c.filter(|&c| c != u64::MAX)
                    .map_or("none of its own".to_string(), format_bytes)
            };
            crate::log::log!(
                Warn,
                "GPU {ordinal}: `gpucap pool set` changed this process's share while it \
                 started (guarantee {}, ceiling {}): kept in place of the one it asked for \
                 (guarantee {}, ceiling {})",
                format_bytes(guarantee),
                ceiling_of(ceiling),
                format_bytes(share.guarantee),
                ceiling_of(Some(share.ceiling))
            );
        }
    }
    Ok(())
}

/// What the other members and `gpucap status` see of this process.
fn own_info() -> MemberInfo {
    let command = gpucap_core::budget::member_command(&gpucap_pool_file::own_cmdline());
    let pid_namespace = gpucap_pool_file::own_pid_namespace();
    MemberInfo {
        pid: std::process::id(),
        uid: gpucap_pool_file::own_uid(),
        pid_namespace,
        start_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        command,
    }
}

/// In a forked child: the parent's membership is the parent's. The child drops its
/// copy of the file's descriptor (the mapping is not inherited: `MADV_DONTFORK`), so
/// the parent's death still frees its slot, and joins on its own at its first driver
/// call ([`orphaned`]). It holds the parent's device files though, and with them the
/// parent's memory: it says so on a lock of its own first (`SlotLocks::hold_in_child`),
/// so a dead parent's bytes come back only once its children let the memory go.
/// Nothing reads the parent's membership in the child: `current()` is None.
extern "C" fn forget_in_child() {
    // A claim's live words and their listening socket: the child serves nobody.
    gpucap_pool_file::forget_claims_in_child();
    // Its announcement as a member: the parent's.
    gpucap_pool_file::forget_beacon_in_child();
    let i = CURRENT.swap(0, AcqRel);
    if i > 0 {
        ORPHANED.store(true, Release);
        if let Some(j) = MEMBERS.get(i - 1).and_then(OnceLock::get) {
            j.file.locks.hold_in_child(j.member.slot());
            j.file.locks.forget_in_child();
        }
    }
}

/// At exit: gives the whole share back to the pool (a claim's file marks the slot left).
pub fn leave() {
    let i = CURRENT.load(Acquire);
    if let Some(j) = i
        .checked_sub(1)
        .and_then(|i| MEMBERS.get(i))
        .and_then(OnceLock::get)
    {
        j.member.leave();
        j.file.mark_in_file(j.member.slot(), false);
    }
}

/// An impossible word of the pool file, found and repaired: one line at warn level.
fn repair_note(r: &Repair) {
    use crate::log::log;
    log!(Warn, "{r}");
}

/// A wait for memory (`GPUCAP_WAIT`), said at warn level: when it starts and how it ended.
fn wait_note(n: &WaitNote) {
    use crate::log::log;
    match *n {
        WaitNote::Started {
            device,
            bytes,
            ahead,
        } => log!(
            Warn,
            "waiting for {} on GPU {device}: the pool has no room now ({ahead} waiting before this request)",
            format_bytes(bytes)
        ),
        WaitNote::AtCeiling {
            device,
            bytes,
            ceiling,
        } => log!(
            Warn,
            "waiting for {} on GPU {device}: past this process's {} ceiling (GPUCAP_CEILING); \
             its own frees or a raise (gpucap pool set) serve it",
            format_bytes(bytes),
            format_bytes(ceiling)
        ),
        WaitNote::Served {
            device,
            bytes,
            waited,
        } => log!(
            Warn,
            "got {} on GPU {device} after waiting {:.3} s",
            format_bytes(bytes),
            waited.as_secs_f64()
        ),
        WaitNote::TimedOut { .. } => {} // the refusal line says it waited
    }
}
