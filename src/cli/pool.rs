//! `gpucap status --pool` (one pool in detail) and the pool lines of `gpucap check`: where a pool's
//! file is, opening it read-only, and the snapshot as a table or as JSON.
//!
//! Reading never changes a pool: the file is opened with `open_reader` (read-only
//! descriptor, its words read with `pread`, never mapped) and `Pool::view` only loads
//! words and asks the kernel which members' locks are held.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use gpucap_core::budget::{GpuView, MemberView, PoolView};
use gpucap_core::config::PoolSpec;
use gpucap_core::size::format_bytes;
use gpucap_pool_file::{PoolFile, Sharing};

use crate::handed_down;

/// Exit status when the pool's file does not exist (yet).
pub const EXIT_NO_POOL_FILE: i32 = 1;

/// Where a pool's file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// The file's path (it may or may not exist; its directory passed the checks).
    File(PathBuf),
    /// The path it will have: its per-user directory does not exist yet (the first
    /// member makes it).
    NotYet(PathBuf),
}

/// Finds the file of `spec` without creating anything: `gpucap_pool_file::locate`
/// with `create = false`, except that a per-user directory that does not exist yet is
/// not an error (no process has joined a pool there). A directory others could write
/// in, or a `GPUCAP_POOL_DIR` that is missing or not a directory, is.
pub fn locate(spec: &PoolSpec, pool_dir: Option<&Path>) -> Result<Located, String> {
    // A user's directory, and the container's pool's, are made by the first member.
    let made_by_member = spec.is_container_pool() || matches!(spec, PoolSpec::Name(_));
    let spec = &gpucap_pool_file::resolve_pool(spec, pool_dir, false)?;
    match gpucap_pool_file::locate(spec, pool_dir, false) {
        Ok(p) => Ok(Located::File(p)),
        Err(e) => match gpucap_pool_file::path_of(spec, pool_dir) {
            Ok(file) if made_by_member && file.parent().is_some_and(missing) => {
                Ok(Located::NotYet(file))
            }
            _ => Err(e),
        },
    }
}

fn missing(p: &Path) -> bool {
    matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == io::ErrorKind::NotFound)
}

/// Opens the pool's file read-only. Errors: the exit status and the line to print
/// (1: no file yet; 2: an unusable directory or a file that is not a readable pool).
pub fn open(spec: &PoolSpec, pool_dir: Option<&Path>) -> Result<PoolFile, (i32, String)> {
    // No file (nor directory) there: the one that was, removed while its members run, is
    // read through a member's descriptor where one announces it (`open_reader`).
    let path = match locate(spec, pool_dir).map_err(|e| (2, format!("gpucap: {e}")))? {
        Located::NotYet(p) | Located::File(p) => p,
    };
    gpucap_pool_file::open_reader(&path, Sharing::of(spec)).map_err(|e| {
        // Only where nothing was found: a file removed under members that could not be
        // reached says why.
        if missing(&path) && e.ends_with(NO_SUCH_FILE) {
            (EXIT_NO_POOL_FILE, no_file(&path))
        } else {
            (2, format!("gpucap: {e}"))
        }
    })
}

/// How the error of opening a file that is not there ends (`std::io::Error`'s text).
pub const NO_SUCH_FILE: &str = "No such file or directory (os error 2)";

fn no_file(path: &Path) -> String {
    format!(
        "gpucap: no pool file at {} (no process has joined it yet)",
        path.display()
    )
}

/// The `pool:` line of `gpucap check`, or the error that makes check fail.
pub fn check_line(
    spec: Option<&PoolSpec>,
    pool_dir: Option<&Path>,
    members: usize,
) -> Result<String, String> {
    let Some(spec) = spec else {
        return Ok("pool: none (each process is capped alone)".to_string());
    };
    let cannot = |e: String| {
        let e = gpucap_pool_file::without_file_name(&e, &spec.to_string());
        format!("gpucap: pool {spec}: {e}")
    };
    let p = match locate(spec, pool_dir).map_err(cannot)? {
        Located::NotYet(p) | Located::File(p) => p,
    };
    let file = match gpucap_pool_file::open_reader(&p, Sharing::of(spec)) {
        Ok(f) => f,
        // Not made yet: whether it can be (a full /dev/shm refuses the first member).
        Err(_) if missing(&p) => {
            return gpucap_pool_file::can_make(&p, members)
                .map(|()| not_made(spec, &p))
                .map_err(|e| format!("gpucap: pool {spec}: {e}"));
        }
        Err(e) => return Err(cannot(e)),
    };
    let view = file.view().map_err(cannot)?;
    let alive = view.members.iter().filter(|m| m.alive).count();
    let dead = view.members.len() - alive;
    let removed = match file.joined_through {
        Some(t) => format!(", removed while its members run: read through {}", t.via()),
        None => String::new(),
    };
    Ok(format!(
        "pool: {spec} (file {}{removed}: {alive} member{} alive, {dead} dead; processes that \
         name it share one budget per GPU)",
        p.display(),
        if alive == 1 { "" } else { "s" }
    ))
}

/// Where live members of the pool `config` names hold a GPU to another cap than
/// `config` gives it: the line the library would refuse the process with at `cuInit`
/// (without a ceiling handed down, every member of a pool sets the same cap), which
/// `gpucap check` and `gpucap run` say before anything starts. `devices` (the visible
/// GPUs, None where the driver could not list them) is asked only when the pool has live
/// members. None: no pool, a ceiling handed down (the process joins held at its own,
/// said at `cuInit`), no live member, no such GPU in the pool, the same caps, or the
/// pool cannot be read (said elsewhere).
pub fn live_cap_mismatch(
    config: &gpucap_core::config::Config,
    devices: impl FnOnce() -> Option<Vec<crate::driver::Device>>,
) -> Option<String> {
    let spec = config.pool.as_ref()?;
    if config.bound.is_some() {
        return None;
    }
    let Ok(Located::File(path)) = locate(spec, config.pool_dir.as_deref()) else {
        return None;
    };
    let view = gpucap_pool_file::open_reader(&path, Sharing::of(spec))
        .ok()?
        .view()
        .ok()?;
    // The GPUs a live member holds, as the library compares them (another member's cap
    // on a GPU only it left is not compared); resized: a joiner takes the pool's cap,
    // whatever its own.
    let held: Vec<_> = view
        .gpus
        .iter()
        .filter(|g| {
            !g.resized
                && view
                    .members
                    .iter()
                    .any(|m| m.alive && m.gpus.iter().any(|mg| mg.uuid == g.uuid))
        })
        .collect();
    if held.is_empty() {
        return None; // the next member sets the pool's cap
    }
    // A cap of the same bytes on every GPU (or none) is compared without the driver: no
    // `cuInit` in `gpucap run` where the caps agree.
    if let Some(same) = same_on_every_gpu(config)
        && held.iter().all(|g| g.cap == same)
    {
        return None;
    }
    devices()?.iter().find_map(|d| {
        let uuid = d.uuid?;
        let gpu = held
            .iter()
            .find(|g| gpucap_core::identity::parse_uuid(&g.uuid) == Some(uuid))?;
        let ours = d.cap(config).cap;
        (ours != gpu.cap).then(|| {
            let e = gpucap_core::budget::CapMismatch::Differs {
                ours,
                pool: gpu.cap,
            };
            format!(
                "gpucap: cannot join the pool {spec}: {}",
                e.text(d.ordinal as usize)
            )
        })
    })
}

/// The cap `config` gives every GPU alike, where it needs no GPU's figures (bytes, or
/// none): Some(None) for no cap; None where it differs by GPU or is a share of one.
fn same_on_every_gpu(config: &gpucap_core::config::Config) -> Option<Option<u64>> {
    match &config.limit {
        None => Some(None),
        Some(spec) if spec.devices.is_empty() => match spec.default {
            None => Some(None),
            Some(gpucap_core::config::Limit::Bytes(b)) => Some(Some(b)),
            Some(_) => None,
        },
        Some(_) => None,
    }
}

fn not_made(spec: &PoolSpec, path: &Path) -> String {
    format!(
        "pool: {spec} (file {}: not made yet, the first process that uses CUDA makes it; \
         processes that name it share one budget per GPU)",
        path.display()
    )
}

/// `gpucap status --json`: the view and the file's path, one object on one line.
#[derive(Serialize)]
struct StatusJson<'a> {
    path: String,
    #[serde(flatten)]
    view: &'a PoolView,
}

pub fn json(view: &PoolView, path: &Path) -> String {
    let doc = StatusJson {
        path: path.to_string_lossy().into_owned(),
        view,
    };
    let mut s = serde_json::to_string(&doc).unwrap_or_else(|e| format!("{{\"error\":{e:?}}}"));
    s.push('\n');
    s
}

/// The inode of this process's PID namespace (0: unknown).
pub fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The calendar date of day `days` since 1970-01-01 (proleptic Gregorian): the
/// era/day-of-era decomposition, 400-year eras of 146097 days starting on March 1st.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// A command as stored by its member, safe to print: control characters (a terminal's
/// escape sequences) become `?`.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn bytes(b: u64) -> String {
    format_bytes(b)
}

/// A member's bytes on all GPUs.
fn total(m: &MemberView) -> u64 {
    m.gpus.iter().map(|g| g.used).sum()
}

/// The members, the largest users first (then by slot, which is stable).
pub fn sorted_members(view: &PoolView) -> Vec<&MemberView> {
    let mut members: Vec<&MemberView> = view.members.iter().collect();
    members.sort_by(|a, b| total(b).cmp(&total(a)).then(a.slot.cmp(&b.slot)));
    members
}

/// The snapshot as tables: the pool, its GPUs, its members (largest first).
/// `own_pidns` marks the pids that are from another PID namespace.
pub fn render(view: &PoolView, path: &Path, own_pidns: u64) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "pool {} (version {}, {} member slots, created {} UTC)\n",
        path.display(),
        view.version,
        view.slots,
        utc(view.created.saturating_mul(1000))
    ));
    if view.gpus.is_empty() {
        out.push_str("GPUs: none yet (a member registers its GPUs when it initialises CUDA)\n");
    } else {
        out.push_str(&format!(
            "{:<40}  {:>10}  {:>10}  {:>10}  {:>8}  {:>12}  {:>10}\n",
            "GPU", "CAP", "USED", "PEAK", "REFUSALS", "HELD BY DEAD", "GUARANTEED"
        ));
        for g in &view.gpus {
            out.push_str(&format!(
                "{:<40}  {:>10}  {:>10}  {:>10}  {:>8}  {:>12}  {:>10}\n",
                g.uuid,
                g.cap.map_or("none".to_string(), bytes),
                bytes(g.used),
                bytes(g.peak),
                g.refusals,
                bytes(g.held_by_dead),
                bytes(g.guaranteed)
            ));
        }
        for g in &view.gpus {
            out.push_str(&gpu_notes(g));
        }
    }
    out.push('\n');
    let alive = view.members.iter().filter(|m| m.alive).count();
    if view.members.is_empty() {
        out.push_str("members: none\n");
        return out;
    }
    out.push_str(&format!(
        "members: {} ({alive} alive, {} dead)\n",
        view.members.len(),
        view.members.len() - alive
    ));
    // Guarantees and ceilings (GPUCAP_GUARANTEE, GPUCAP_CEILING, or a ceiling handed
    // down): columns of their own, shown when a member has one.
    let shared = view
        .members
        .iter()
        .flat_map(|m| &m.gpus)
        .any(|g| g.guarantee > 0 || g.ceiling.is_some() || g.ceiling_from.is_some());
    // A claim's or the container's pool may have members of several users: a USER
    // column then, each member's own (a user's pool is its owner's alone).
    let mut uids: Vec<u32> = view.members.iter().filter_map(|m| m.uid).collect();
    uids.sort_unstable();
    uids.dedup();
    let users = uids.len() > 1;
    // As wide as the widest name (a uid without one is its number).
    let width = uids
        .iter()
        .map(|&u| crate::text_width::width(&crate::users::user_name(u)))
        .max()
        .unwrap_or(0)
        .max(4);
    let user_of = |m: &gpucap_core::budget::MemberView| match (users, m.uid) {
        (false, _) => String::new(),
        (true, Some(u)) => pad(&crate::users::user_name(u), width),
        (true, None) => pad("-", width),
    };
    out.push_str(&format!(
        "{:>8}  {:<5}{}  {:<40}  {:>10}  {:>10}{}  {:<19}  COMMAND\n",
        "PID",
        "STATE",
        if users {
            pad("USER", width)
        } else {
            String::new()
        },
        "GPU",
        "BYTES",
        "PEAK",
        if shared {
            format!(
                "  {:>10}  {:>10}  {:>10}",
                "GUARANTEE", "CEILING", "BORROWED"
            )
        } else {
            String::new()
        },
        "STARTED (UTC)"
    ));
    let mut foreign = false;
    let mut children = false;
    for m in sorted_members(view) {
        let other_ns = own_pidns != 0 && m.pid_namespace != 0 && m.pid_namespace != own_pidns;
        foreign |= other_ns;
        children |= m.held_by_children;
        let pid = format!("{}{}", m.pid, if other_ns { "*" } else { "" });
        let state = match (m.alive, m.held_by_children) {
            (true, _) => "alive",
            (false, true) => "dead+",
            (false, false) => "dead",
        };
        let command = printable(&m.command);
        let started = utc(m.start_ms);
        let user = user_of(m);
        let rows: Vec<(String, u64, u64, String)> = if m.gpus.is_empty() {
            vec![("-".to_string(), 0, 0, String::new())]
        } else {
            m.gpus
                .iter()
                .map(|g| (g.uuid.clone(), g.used, g.peak, share_columns(shared, g)))
                .collect()
        };
        for (uuid, used, peak, share) in rows {
            out.push_str(&format!(
                "{pid:>8}  {state:<5}{user}  {uuid:<40}  {:>10}  {:>10}{share}  {started:<19}  {command}\n",
                bytes(used),
                bytes(peak)
            ));
        }
    }
    // Where each ceiling marked as handed down came from, as `gpucap status` says it.
    let handed = sorted_members(view).into_iter().flat_map(|m| {
        m.gpus
            .iter()
            .filter_map(move |g| Some((g.ceiling_from.as_deref()?, m.pid)))
    });
    for line in handed_down::notes(handed) {
        out.push_str(&line);
        out.push('\n');
    }
    if foreign {
        out.push_str(
            "* a pid in another PID namespace (another container, or a docker exec shell)\n",
        );
    }
    if children {
        out.push_str(
            "dead+ dead, but processes it forked still hold its device files: the driver keeps \
             its memory, and the pool its bytes, until they exit or exec\n",
        );
    }
    out
}

/// `text` after two spaces, padded to `width` columns.
fn pad(text: &str, width: usize) -> String {
    let fill = width.saturating_sub(crate::text_width::width(text));
    format!("  {text}{}", " ".repeat(fill))
}

/// A member's guarantee, ceiling and borrowed bytes on one GPU, as columns (none when
/// no member of the pool has a guarantee or a ceiling). A ceiling handed down to the
/// member (its own, or the pool's cap it is held at) is marked `^`.
fn share_columns(shared: bool, g: &gpucap_core::budget::MemberGpuView) -> String {
    if !shared {
        return String::new();
    }
    let mut ceiling = g.ceiling.map_or("cap".to_string(), bytes);
    if g.ceiling_from.is_some() {
        ceiling.push(handed_down::MARK);
    }
    format!(
        "  {:>10}  {:>10}  {:>10}",
        if g.guarantee > 0 {
            bytes(g.guarantee)
        } else {
            "-".to_string()
        },
        ceiling,
        bytes(g.borrowed)
    )
}

/// The lines under the GPU table that say something is wrong with one GPU: a held word
/// lock (who, since when members wait for it), a `used` or cap word that differs from
/// what the members hold.
fn gpu_notes(g: &GpuView) -> String {
    let mut out = String::new();
    if let Some(l) = &g.lock {
        out.push_str(&format!(
            "word lock of {}: held by pid {} (slot {}), {}\n",
            g.uuid,
            l.pid,
            l.slot,
            l.since_ms
                .map_or("no member waiting for it".to_string(), |ms| format!(
                    "members waiting for it since {} UTC",
                    utc(ms)
                ))
        ));
    }
    if g.drift != 0 {
        out.push_str(&format!(
            "drift on {}: the pool file counts {} in use, its members hold {} (another \
             process wrote the file?); the next refusal recounts it\n",
            g.uuid,
            bytes(g.members_hold.saturating_add_signed(g.drift)),
            bytes(g.members_hold)
        ));
    }
    if g.share_drift {
        out.push_str(&format!(
            "drift on {}: the pool file holds guarantee or ceiling words no member could \
             have been given (shown at most the cap); the next joiner or refusal repairs \
             them\n",
            g.uuid
        ));
    }
    if g.cap_drift {
        out.push_str(&format!(
            "drift on {}: the pool file's cap is not the one its live members hold it to \
             (another process wrote the file?); they keep their own, the next refusal \
             writes it back\n",
            g.uuid
        ));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpucap_core::budget::{
        MAX_SLOTS, Member, MemberInfo, MemberLocks, POOL_VERSION, POOL_WORDS, Pool, shares,
    };
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

    const MIB: u64 = 1 << 20;
    const UUID: [u8; 16] = [0x11; 16];

    /// Slot locks in memory: "killing" a member drops its lock, as the kernel would.
    struct Locks([AtomicBool; MAX_SLOTS]);

    impl MemberLocks for Locks {
        fn try_take(&self, s: usize) -> bool {
            !self.0[s].swap(true, AcqRel)
        }
        fn give_back(&self, s: usize) {
            self.0[s].store(false, Release);
        }
        fn held(&self, s: usize) -> bool {
            self.0[s].load(Acquire)
        }
    }

    /// A pool made through the pool's own protocol: a 1 GiB cap on one GPU, members
    /// pid 10 (100 MiB, alive, 64 MiB guaranteed, a 512 MiB ceiling), 11 (200 MiB, killed), 12 (400 MiB, alive, in PID
    /// namespace 9; the others in 7), and one refused request of 600 MiB.
    pub(crate) fn view() -> PoolView {
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        let locks: &'static Locks = Box::leak(Box::new(Locks(
            [const { AtomicBool::new(false) }; MAX_SLOTS],
        )));
        let pool = Pool::create(words, 1_700_000_000, 0).unwrap();
        let mut members = Vec::new();
        for (pid, mib, ns) in [(10, 100, 7), (11, 200, 7), (12, 400, 9)] {
            let info = MemberInfo {
                pid,
                uid: 1000,
                pid_namespace: ns,
                start_ms: 1_700_000_000_123,
                command: format!("prog-{pid} --x"),
            };
            let m = Member::join(pool, locks, &info).unwrap();
            m.register_gpu(0, &UUID, Some(1 << 30)).unwrap();
            if pid == 10 {
                // A guarantee and a ceiling (GPUCAP_GUARANTEE, GPUCAP_CEILING).
                let share = shares::check(Some(1 << 30), 64 * MIB, Some(512 * MIB)).unwrap();
                m.claim(0, share).unwrap();
            }
            m.reserve(0, (mib + 1) * MIB).unwrap();
            m.credit(0, MIB);
            members.push(m);
        }
        assert!(members[2].reserve(0, 600 * MIB).is_err());
        locks.give_back(members[1].slot()); // pid 11 is killed: its share stays
        pool.view(locks)
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20");
        // Leap days, and a century's turn that is not a leap year (2100).
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_709_251_199_000), "2024-02-29 23:59:59");
        assert_eq!(utc(4_107_542_400_000), "2100-03-01 00:00:00");
    }

    #[test]
    fn guarantees_ceilings_and_borrowed_bytes_are_shown() {
        let v = view();
        assert_eq!(v.gpus[0].guaranteed, 64 * MIB);
        let m10 = v.members.iter().find(|m| m.pid == 10).unwrap();
        let g = &m10.gpus[0];
        assert_eq!((g.guarantee, g.ceiling), (64 * MIB, Some(512 * MIB)));
        assert_eq!(g.borrowed, 36 * MIB, "100 MiB held, 64 of them guaranteed");
        let m12 = v.members.iter().find(|m| m.pid == 12).unwrap();
        assert_eq!(
            (m12.gpus[0].guarantee, m12.gpus[0].borrowed),
            (0, 400 * MIB)
        );
        let text = render(&v, Path::new("/p/t.pool"), 7);
        assert!(text.contains("GUARANTEED"), "{text}");
        assert!(text.contains("GUARANTEE     CEILING    BORROWED"), "{text}");
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("10 "))
            .unwrap();
        assert!(row.contains("64 MiB     512 MiB      36 MiB"), "{row}");
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("12* "))
            .unwrap();
        assert!(row.contains("-         cap     400 MiB"), "{row}");
        let doc: serde_json::Value = serde_json::from_str(&json(&v, Path::new("/p"))).unwrap();
        assert_eq!(doc["gpus"][0]["guaranteed"], 64 * MIB);
        let j10 = doc["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["pid"] == 10)
            .unwrap();
        assert_eq!(j10["gpus"][0]["ceiling"], 512 * MIB);
        assert_eq!(j10["gpus"][0]["borrowed"], 36 * MIB);
    }

    #[test]
    fn a_ceiling_handed_down_is_marked_with_where_it_came_from() {
        let mut v = view();
        for m in v.members.iter_mut().filter(|m| m.pid != 11) {
            m.gpus[0].ceiling_from = Some("gpucap.env beside the library".into());
        }
        let text = render(&v, Path::new("/p/t.pool"), 7);
        let row = |pid: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(pid))
                .unwrap_or_else(|| panic!("no {pid}\n{text}"))
        };
        // pid 10's own ceiling, pid 12 held at the pool's cap; pid 11 not marked.
        assert!(row("10 ").contains("  512 MiB^  "), "{text}");
        assert!(row("12* ").contains("  cap^  "), "{text}");
        assert!(!row("11 ").contains('^'), "{text}");
        let notes: Vec<&str> = text.lines().filter(|l| l.starts_with("^ ")).collect();
        assert_eq!(
            notes,
            ["^ the cap is a ceiling from gpucap.env beside the library (pid 10, 12)"],
            "{text}"
        );
        // Without a guarantee or a ceiling of their own, the columns are shown for it.
        let mut v = view();
        for m in v.members.iter_mut() {
            m.gpus[0].guarantee = 0;
            m.gpus[0].ceiling = None;
        }
        assert!(!render(&v, Path::new("/p"), 7).contains("CEILING"));
        v.members[0].gpus[0].ceiling_from = Some("/etc/gpucap/gpucap.env".into());
        let text = render(&v, Path::new("/p"), 7);
        assert!(text.contains("CEILING") && text.contains("cap^"), "{text}");
        assert!(!render(&view(), Path::new("/p"), 7).contains('^'));
    }

    #[test]
    fn members_largest_first() {
        let v = view();
        let pids: Vec<u32> = sorted_members(&v).iter().map(|m| m.pid).collect();
        assert_eq!(pids, [12, 11, 10]);
    }

    /// Members of two users (a claim's or the container's pool): a USER column, each
    /// member's own; members of one user: none.
    #[test]
    fn a_pools_members_of_two_users_show_a_user_column() {
        let mut v = view();
        let header = |text: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with("PID"))
                .unwrap()
                .to_string()
        };
        assert!(!header(&render(&v, Path::new("/p/x.pool"), 7)).contains("USER"));
        v.members.iter_mut().find(|m| m.pid == 12).unwrap().uid = Some(0);
        let text = render(&v, Path::new("/p/x.pool"), 7);
        assert!(header(&text).contains("STATE  USER"), "{text}");
        let row = |pid: &str| {
            text.lines()
                .find(|l| l.trim_start().starts_with(pid))
                .unwrap()
                .to_string()
        };
        let (root, alice) = (crate::users::user_name(0), crate::users::user_name(1000));
        let w = root.len().max(alice.len()).max(4);
        assert!(
            row("12*").contains(&format!("alive  {root:<w$}  GPU-")),
            "{text}"
        );
        assert!(
            row("10 ").contains(&format!("alive  {alice:<w$}  GPU-")),
            "{text}"
        );
        // A uid without a name is its number, the column as wide as it: every row's GPU
        // column under the header's.
        v.members.iter_mut().find(|m| m.pid == 11).unwrap().uid = Some(4_000_000_123);
        let text = render(&v, Path::new("/p/x.pool"), 7);
        let header = text
            .lines()
            .find(|l| l.trim_start().starts_with("PID"))
            .unwrap();
        let at = header.find("GPU").unwrap();
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("  GPU-1")).collect();
        assert!(
            rows.len() == 3 && rows.iter().all(|l| l.find("GPU-1") == Some(at)),
            "{text}"
        );
    }

    #[test]
    fn table_shows_gpus_members_and_the_dead() {
        let text = render(&view(), Path::new("/p/x.pool"), 7);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!(
                "pool /p/x.pool (version {POOL_VERSION}, 256 member slots, created 2023-11-14 22:13:20 UTC)"
            )
        );
        let gpu = lines[2];
        for part in [
            "GPU-11111111-1111-1111-1111-111111111111",
            "1 GiB",
            "700 MiB",
            "701 MiB", // 100 + 200 + 401 before the last credit
            " 1 ",
            "200 MiB",
        ] {
            assert!(gpu.contains(part), "{part:?} in {gpu:?}");
        }
        assert!(text.contains("members: 3 (2 alive, 1 dead)\n"), "{text}");
        let rows: Vec<&str> = lines
            .iter()
            .copied()
            .skip_while(|l| !l.trim_start().starts_with("PID"))
            .skip(1)
            .collect();
        assert!(rows[0].trim_start().starts_with("12*  alive"), "{text}");
        assert!(rows[1].trim_start().starts_with("11  dead"), "{text}");
        assert!(
            rows[1].contains("200 MiB") && rows[1].contains("201 MiB"),
            "{text}"
        );
        assert!(
            rows[1].contains("2023-11-14 22:13:20  prog-11 --x"),
            "{text}"
        );
        assert!(rows[2].trim_start().starts_with("10  alive"), "{text}");
        assert!(
            rows[3].starts_with("* a pid in another PID namespace"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_pool_and_a_hostile_command() {
        let mut v = view();
        v.gpus.clear();
        v.members.clear();
        let text = render(&v, Path::new("/p"), 0);
        assert!(text.contains("GPUs: none yet"));
        assert!(text.ends_with("members: none\n"));
        let mut v = view();
        v.members[0].command = "evil\x1b[2Jname\n".into();
        let text = render(&v, Path::new("/p"), 0);
        assert!(text.contains("evil?[2Jname?"), "{text}");
        assert!(!text.contains('\x1b'));
        assert!(!text.contains('*'), "pid namespaces unknown: no mark");
    }

    #[test]
    fn json_is_the_view_and_the_path() {
        let v = view();
        let text = json(&v, Path::new("/p/x.pool"));
        assert!(text.ends_with("}\n") && text.lines().count() == 1);
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["path"], "/p/x.pool");
        assert_eq!(doc["version"], POOL_VERSION);
        assert_eq!(doc["created"], 1_700_000_000u64);
        let gpu = &doc["gpus"][0];
        assert_eq!(gpu["uuid"], "GPU-11111111-1111-1111-1111-111111111111");
        assert_eq!(gpu["held_by_dead"], 200 * MIB);
        assert_eq!(gpu["cap"], 1u64 << 30);
        assert_eq!(gpu["used"], 700 * MIB);
        assert_eq!(gpu["refusals"], 1);
        assert_eq!(gpu["largest_refused"], 600 * MIB);
        let m = &doc["members"][1];
        assert_eq!(m["alive"], false);
        assert_eq!(m["pid"], 11);
        assert_eq!(m["slot"], 1);
        assert_eq!(m["pid_namespace"], 7);
        assert_eq!(m["start_ms"], 1_700_000_000_123u64);
        assert_eq!(m["gpus"][0]["used"], 200 * MIB);
        assert!(gpu.get("raw_uuid").is_none());
    }
}
