//! Every process-wide static of the shim, in one place: `SHIM` (configuration, read
//! once on the first CUDA call; the ledger; turning a device's limit into a cap in
//! bytes; the report at exit) and the books of pools, VMM handles, arrays, contexts
//! and NVML's view of the devices.
//! Safe Rust; the hooks ask it questions and tell it what the driver did.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock, TryLockError};

use gpucap_core::config::{self, Config, LogLevel, MAX_DEVICES};
use gpucap_core::contexts::ContextBook;
use gpucap_core::ledger::LiveMap;
use gpucap_core::ledger::{Ledger, NO_CAP, Refusal, Reservation};
use gpucap_core::pools::PoolBook;
use gpucap_core::refusal_lines::RefusalLines;
use gpucap_core::report::{self, DeviceReport, ProcessReport};
use gpucap_core::size::format_bytes;
use gpucap_core::vmm::VmmBook;

use crate::log::log;

pub struct Shim {
    pub ledger: Ledger,
    config: OnceLock<Result<Config, String>>,
    cap_resolved: [AtomicBool; MAX_DEVICES],
}

pub static SHIM: Shim = Shim {
    ledger: Ledger::new(),
    config: OnceLock::new(),
    cap_resolved: [const { AtomicBool::new(false) }; MAX_DEVICES],
};

// ---- the books of the hooks -----------------------------------------------------------

/// The pools the program allocated from or created, with what each reserves.
pub static POOLS: PoolBook = PoolBook::new();

pub static VMM: VmmBook = VmmBook::new();

/// Live CUDA arrays and mipmapped arrays, by handle.
pub static ARRAYS: LiveMap = LiveMap::new();
pub static MIPMAPS: LiveMap = LiveMap::new();

pub fn array_map(mipmapped: bool) -> &'static LiveMap {
    if mipmapped { &MIPMAPS } else { &ARRAYS }
}

pub static CONTEXTS: ContextBook = ContextBook::new();

/// Loaded modules and what each was charged.
pub static MODULES: gpucap_core::modules::ModuleBook = gpucap_core::modules::ModuleBook::new();

/// The functions launched (or loaded) once in a context: by `kernels::launch_key` (a
/// function handle), `context_key` (a kernel handle in a context) or `name_key`.
pub static LAUNCHED: gpucap_core::kernels::SeenSet = gpucap_core::kernels::SeenSet::new();

/// The handles found to be kernel handles (`cuLibraryGetKernel`'s, one for every
/// context), by `kernels::launch_key(handle, 0)`: looked up per context.
pub static KERNEL_HANDLES: gpucap_core::kernels::SeenSet = gpucap_core::kernels::SeenSet::new();

/// What the first uses of each library's or module's functions took, to reserve
/// before the next one.
pub static ESTIMATES: gpucap_core::kernels::LoadEstimates =
    gpucap_core::kernels::LoadEstimates::new();

/// What the kernels loaded at first launches took, by context and function.
pub static KERNELS: gpucap_core::kernels::KernelBook = gpucap_core::kernels::KernelBook::new();

/// The memory contexts' limits took (`cuCtxSetLimit`), by context and limit.
pub static LIMITS: gpucap_core::limits::LimitBook = gpucap_core::limits::LimitBook::new();

/// The executable graphs with memory nodes, and each device's graph memory charge.
pub static GRAPHS: gpucap_core::graphs::GraphBook = gpucap_core::graphs::GraphBook::new();

/// What CUDA would see in this process, worked out from NVML (read once).
pub static NVML_VIEW: std::sync::OnceLock<Vec<[u8; 16]>> = std::sync::OnceLock::new();

/// Whether the limit's keys match what CUDA would see, checked once; the message is
/// printed once, and while they do not, every NVML call fails closed.
pub static NVML_KEYS: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();

/// Why the shim refuses to forward a call at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Misconfigured;

impl Shim {
    /// The configuration, read from the environment on first use. An invalid one is
    /// reported once and makes every later call fail closed. Marks the process as one
    /// that called into CUDA (it writes a report and a summary at exit).
    pub fn config(&self) -> Result<&Config, Misconfigured> {
        if ACTIVE_PID.load(Relaxed) == 0 {
            let _ = ACTIVE_PID.compare_exchange(0, std::process::id(), Relaxed, Relaxed);
        }
        self.config_quiet()
    }

    /// The configuration, as [`config`](Self::config), for a call that is not a CUDA
    /// call (NVML): the process is not marked as a CUDA user by it.
    pub fn config_quiet(&self) -> Result<&Config, Misconfigured> {
        let loaded = self.config.get_or_init(|| {
            let result = load_config();
            match &result {
                Ok((c, from)) => {
                    crate::log::LEVEL.store(c.log as u8, Relaxed);
                    // HAMi-core variables gpucap does not act on (a shared cache, SM
                    // limits): said at warn level, so never silently ignored.
                    for note in &c.notes {
                        log!(Warn, "{note}");
                    }
                    if let Some(file) = from {
                        log!(
                            Debug,
                            "configuration (or its pool) read from {}",
                            file.display()
                        );
                    }
                }
                // The error is always shown, whatever GPUCAP_LOG says: it may be the
                // very variable that is wrong, and the program is being stopped.
                Err(e) => eprintln!("{e}"),
            }
            result.map(|(c, _)| c)
        });
        loaded.as_ref().map_err(|_| Misconfigured)
    }

    /// Makes sure `device`'s cap is known, computing a fraction from the device's
    /// physical total (asked of the driver through `physical_total` only once).
    /// A fraction that cannot be resolved caps the device at zero: never uncapped.
    pub fn resolve_cap(&self, device: usize, physical_total: impl FnOnce() -> Option<u64>) {
        let Some(flag) = self.cap_resolved.get(device) else {
            return;
        };
        if flag.load(Acquire) {
            return;
        }
        let Ok(config) = self.config() else {
            return;
        };
        let limit_of = |spec: &config::LimitSpec| {
            gpucap_core::identity::limit_for(spec, device, visible_uuids)
        };
        // The driver is asked the GPU's total once, whichever limit needs it.
        let mut physical_total = Some(physical_total);
        let mut total_read: Option<Option<u64>> = None;
        let mut total =
            || *total_read.get_or_insert_with(|| physical_total.take().and_then(|f| f()));
        let asked = match &config.bound {
            Some(b) if b.asked_none => None,
            _ => config.limit.as_ref().and_then(limit_of),
        };
        let cap = match &config.bound {
            None => {
                let cap = resolve_limit(device, asked, &mut total);
                if cap.is_some() {
                    handed_down(config, device); // a driver's hand-over, if it is one
                }
                cap
            }
            // Under a file's ceiling: the smaller of the two, in bytes.
            Some(bound) => {
                let ceiling = limit_of(&bound.spec);
                let fraction =
                    |l: Option<config::Limit>| matches!(l, Some(config::Limit::Fraction(_)));
                let known = if fraction(asked) || fraction(ceiling) {
                    let t = total();
                    if t.is_none() {
                        log!(
                            Error,
                            "cannot read the physical memory of GPU {device} to resolve its cap: allocations on it are refused"
                        );
                    }
                    t
                } else {
                    None
                };
                let capped = config::cap_under(asked, ceiling, known);
                // At the ceiling (held there, or asked just as much), not lowered below it.
                if capped.cap.is_some() && capped.cap == config::cap_under(None, ceiling, known).cap
                {
                    handed_down(config, device);
                }
                if capped.held
                    && bound.asked.is_some()
                    && let Some(c) = capped.cap
                {
                    let line = config::held_line(bound, device, c);
                    log!(Warn, "{}", line.trim_start_matches("gpucap: "));
                }
                // In bytes now: said once if above the GPU's memory, as any cap.
                resolve_limit(device, capped.cap.map(config::Limit::Bytes), &mut total)
            }
        };
        self.ledger.set_cap(device, cap);
        flag.store(true, Release);
    }

    /// Whether `device`'s cap was resolved (one load: for the allocation short path).
    #[inline]
    pub fn cap_known(&self, device: usize) -> bool {
        self.cap_resolved
            .get(device)
            .is_some_and(|f| f.load(Acquire))
    }

    /// Reserves `bytes` on `device` for `api`, or logs the refusal line.
    pub fn reserve(&self, api: &str, device: usize, bytes: u64) -> Option<Reservation<'_>> {
        self.reserve_for(api, device, bytes, bytes)
    }

    /// Reserves `bytes` on `device` to serve a request of `requested` bytes (more
    /// when rounded up to pages, fewer when partly served from retained memory);
    /// a refusal names the request as the program made it.
    pub fn reserve_for(
        &self,
        api: &str,
        device: usize,
        requested: u64,
        bytes: u64,
    ) -> Option<Reservation<'_>> {
        self.reserve_kept(api, device, requested, bytes, 0)
    }

    /// [`reserve_for`](Self::reserve_for) in growth mode, where `in_hand` bytes of
    /// pages kept for reuse were taken to serve the request already: a refusal line
    /// says them (and what else is kept) apart from the memory in use.
    pub fn reserve_kept(
        &self,
        api: &str,
        device: usize,
        requested: u64,
        bytes: u64,
        in_hand: u64,
    ) -> Option<Reservation<'_>> {
        match self.ledger.reserve_asked(device, bytes, requested) {
            Ok(r) => Some(r),
            Err(refusal) => {
                self.refused_kept(api, device, requested, refusal, in_hand);
                None
            }
        }
    }

    /// The devices this process has used (their cap was resolved on first use).
    pub fn touched_devices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_DEVICES).filter(|&d| self.cap_resolved[d].load(Acquire))
    }

    /// Whether the process called into CUDA (NVML calls alone do not count).
    pub fn active(&self) -> bool {
        ACTIVE_PID.load(Relaxed) != 0 && self.config.get().is_some()
    }

    /// `(free, total)` as the program should see them, given the driver's figures
    /// and the bytes the process retains unused in growth mode (free to it, though
    /// the driver counts them as used).
    pub fn mem_info(&self, device: usize, free: u64, total: u64, retained: u64) -> (u64, u64) {
        // In a pool, the pool's figures: what every member holds counts against the cap.
        // A member with a guarantee or a ceiling: what it could reserve now, of its ceiling.
        let pooled = crate::membership::current().and_then(|m| m.room(device));
        let (free, total) = match (pooled, self.ledger.usage(device)) {
            (Some((room, Some(cap))), _) => (free.min(room), total.min(cap)),
            (None, Some(u)) if u.cap != NO_CAP => (free.min(u.headroom()), total.min(u.cap)),
            _ => (free, total),
        };
        (free.saturating_add(retained).min(total), total)
    }

    /// The total memory the program should see for `device`.
    pub fn total_mem(&self, device: usize, total: u64) -> u64 {
        self.mem_info(device, total, total, 0).1
    }
}

/// GPU `device`'s cap is a ceiling handed down to this process (a configuration file's or
/// a driver's; nothing where its cap is its environment's own): its pool slot or its
/// visible file says so, for `gpucap status`.
fn handed_down(config: &Config, device: usize) {
    if let Some(h) = config::HandedDown::of(config) {
        crate::membership::note_at_ceiling(device);
        crate::lone::mark_handed_down(h.word(), device);
    }
}

/// A GPU's limit in bytes: bytes as given (said once when above the GPU's memory: it
/// never binds), a fraction of the GPU's total; a fraction whose total cannot be read
/// caps the GPU at zero (never uncapped).
fn resolve_limit(
    device: usize,
    limit: Option<config::Limit>,
    total: &mut dyn FnMut() -> Option<u64>,
) -> Option<u64> {
    match limit {
        None => None,
        // A cap above the GPU's memory never binds: said once, when the device is
        // first used (the driver is asked its total once, as for a fraction).
        Some(config::Limit::Bytes(b)) => {
            if let Some(t) = total()
                && b > t
            {
                log!(
                    Warn,
                    "the cap of GPU {device}, {}, is more than the GPU has ({}): it never binds",
                    format_bytes(b),
                    format_bytes(t)
                );
            }
            Some(b)
        }
        Some(limit) => match total() {
            Some(t) => Some(limit.resolve(t)),
            None => {
                log!(
                    Error,
                    "cannot read the physical memory of GPU {device} to resolve the limit {limit}: allocations on it are refused"
                );
                Some(0)
            }
        },
    }
}

// ---- configuration file ----------------------------------------------------------------

/// The configuration: from the environment, or, when it has no `GPUCAP_*` variable
/// at all (`ssh`, `su -`, `sudo`, `env -i` empty it), from `gpucap.env` beside this
/// library or `/etc/gpucap/gpucap.env` (the container entrypoint writes them). Where
/// both are there, the environment's choices hold under the file's ceiling
/// (`config::under_file`): its cap and its pool bind. Also returns the file used. A
/// file that exists but cannot be read or is invalid is an error (fail closed): it is
/// there to keep such processes capped.
fn load_config() -> Result<(Config, Option<PathBuf>), String> {
    let env = config_vars();
    let file = config::from_env_files(own_dir().as_deref())?;
    if !config::has_gpucap_vars(env.iter().map(|(k, v)| (k, v))) {
        return Ok(match file {
            Some((c, path)) => (config::from_file_alone(c, &path), Some(path)),
            None => (Config::default(), None),
        });
    }
    let c = config::from_vars(env.iter().map(|(k, v)| (k, v))).map_err(|e| e.to_string())?;
    Ok(match file {
        Some((file, path)) => {
            let raw = |name: &str| {
                env.iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.to_string_lossy().into_owned())
            };
            (config::under_file(c, &raw, file, &path), Some(path))
        }
        None => (c, None),
    })
}

/// Lists the visible devices' UUIDs with the real driver.
#[cfg(not(test))]
fn visible_uuids() -> Option<Vec<[u8; 16]>> {
    crate::driver::queries::visible_uuids()
}

/// Unit tests run without a driver: no devices.
#[cfg(test)]
fn visible_uuids() -> Option<Vec<[u8; 16]>> {
    None
}

/// The environment variables the configuration reads (copied at the FFI edge).
#[cfg(not(test))]
fn config_vars() -> Vec<(OsString, OsString)> {
    crate::environ::config_vars()
}

/// Unit tests: the same variables, through `std`.
#[cfg(test)]
fn config_vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| config::looked_at(k.as_encoded_bytes()))
        .collect()
}

/// The directory libgpucap.so was loaded from (asked of the loader at the FFI edge).
#[cfg(not(test))]
fn own_dir() -> Option<PathBuf> {
    crate::resolve::own_dir()
}

/// Unit tests run without the library: no directory of its own.
#[cfg(test)]
fn own_dir() -> Option<PathBuf> {
    None
}

// ---- reports and the exit summary ------------------------------------------------------

/// The pid that first called into CUDA (0: none yet): a forked child (another pid)
/// inherits the figures of its parent, so it writes no report and no summary of its
/// own. A child of a process that never called into CUDA marks itself when it does.
static ACTIVE_PID: AtomicU32 = AtomicU32::new(0);

/// Serialises this process's report writes (the exit hook and refusals).
static WRITING: Mutex<()> = Mutex::new(());

/// When a refusal last refreshed the report (ms since the Unix epoch), and the largest
/// refused request it showed: refusals in a tight loop rewrite the file at most every
/// 100 ms, unless a larger request was refused.
static REFUSAL_WRITTEN_MS: AtomicU64 = AtomicU64::new(0);
static REFUSAL_WRITTEN_LARGEST: AtomicU64 = AtomicU64::new(0);
const REFUSAL_WRITE_INTERVAL_MS: u64 = 100;

/// The last refusal line printed, so that the same refusal again at once prints none.
static REFUSAL_LINES: RefusalLines = RefusalLines::new();

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shim {
    /// This process's figures for each device it used.
    pub fn device_reports(&self) -> Vec<DeviceReport> {
        self.touched_devices()
            .filter_map(|d| {
                let u = self.ledger.usage(d)?;
                // In growth mode the cap is charged for retained memory too, which the
                // program freed: in use is the rest (0 once every block was freed).
                let retained = retained_bytes(d);
                Some(DeviceReport {
                    ordinal: d as u32,
                    cap: (u.cap != NO_CAP).then_some(u.cap),
                    peak: u.peak,
                    in_use: u.used.saturating_sub(retained),
                    retained,
                    allocations: u.allocs,
                    refusals: u.refusals,
                    largest_refused: u.largest_refused,
                })
            })
            .collect()
    }

    /// Is this the process that read the configuration (not a forked child of it)?
    fn own_process(&self) -> bool {
        self.active() && ACTIVE_PID.load(Relaxed) == std::process::id()
    }

    /// At exit (from the library's destructor): the `GPUCAP_LOG=info` summary and the
    /// `GPUCAP_REPORT` file. Nothing for a process that never called into CUDA.
    pub fn at_exit(&self) {
        // The pool gets this process's whole share back now, not when a member notices.
        crate::membership::leave();
        crate::lone::remove();
        if !self.own_process() {
            return;
        }
        let Ok(config) = self.config() else {
            return;
        };
        let devices = self.device_reports();
        if crate::log::LEVEL.load(Relaxed) >= LogLevel::Info as u8 {
            if devices.is_empty() {
                log!(Info, "no GPU memory was allocated");
            }
            for d in &devices {
                log!(Info, "{}", report::summary_line(d, config.growth));
            }
        }
        if let Some(path) = &config.report {
            let guard = WRITING.lock().unwrap_or_else(|p| p.into_inner());
            self.write_report(path, config.growth, devices, true);
            drop(guard);
        }
    }

    /// After a refused request: refresh the report, so that a program that then dies
    /// without `exit()` (the usual crash after an out-of-memory error, a fatal signal)
    /// still leaves one, marked `"state":"running"`. No signal handler is installed.
    /// Reports a refused request: the one stderr line, and a refreshed report.
    /// The same request refused again at once (a program retrying after freeing its
    /// cache, as CuPy does) prints no second line: see `gpucap_core::refusal_lines`.
    pub fn refused(&self, api: &str, device: usize, bytes: u64, refusal: Refusal) {
        self.refused_kept(api, device, bytes, refusal, 0);
    }

    /// [`refused`](Self::refused), with `in_hand` bytes kept for reuse that the request
    /// had taken already (growth mode).
    fn refused_kept(&self, api: &str, device: usize, bytes: u64, refusal: Refusal, in_hand: u64) {
        let level = crate::log::LEVEL.load(Relaxed);
        if level >= LogLevel::Debug as u8
            || REFUSAL_LINES.should_print(api, device, bytes, now_ms())
        {
            // In growth mode the cap is charged for the pages kept for reuse too: the
            // line says them apart from the memory in use.
            let growth = self.config().is_ok_and(|c| c.growth);
            let kept = if growth {
                retained_bytes(device).saturating_add(in_hand)
            } else {
                0
            };
            log!(Warn, "{}", refusal_line(api, device, bytes, refusal, kept));
        }
        self.after_refusal();
    }

    fn after_refusal(&self) {
        if !self.own_process() {
            return;
        }
        let Ok(config) = self.config() else {
            return;
        };
        let Some(path) = &config.report else {
            return;
        };
        let devices = self.device_reports();
        let largest = devices.iter().map(|d| d.largest_refused).max().unwrap_or(0);
        let now = now_ms();
        let last = REFUSAL_WRITTEN_MS.load(Relaxed);
        if last != 0
            && now.saturating_sub(last) < REFUSAL_WRITE_INTERVAL_MS
            && largest <= REFUSAL_WRITTEN_LARGEST.load(Relaxed)
        {
            return;
        }
        // Another thread writing now: its figures are as fresh; never wait in a hook.
        let guard = match WRITING.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        REFUSAL_WRITTEN_MS.store(now.max(1), Relaxed);
        REFUSAL_WRITTEN_LARGEST.fetch_max(largest, Relaxed);
        self.write_report(path, config.growth, devices, false);
        drop(guard);
    }

    /// Writes this process's entry (the caller holds `WRITING`).
    fn write_report(
        &self,
        template: &Path,
        growth: bool,
        devices: Vec<DeviceReport>,
        exited: bool,
    ) {
        let pid = std::process::id();
        let (file, per_process) = report::expand_path(template, pid);
        let entry = ProcessReport {
            id: match report::own_start_time() {
                Some(t) => format!("{pid}-{t}"),
                None => pid.to_string(),
            },
            pid,
            cmdline: report::own_cmdline(),
            exited,
            time: report::now_secs(),
            growth,
            devices,
        };
        match report::write_entry(&file, per_process, &entry) {
            Ok(written) => log!(Debug, "report written to {}", written.display()),
            Err(e) => log!(Error, "no report written: {e}"),
        }
    }
}

#[cfg(not(test))]
fn retained_bytes(device: usize) -> u64 {
    gpucap_core::growth::retained_bytes(device)
}

#[cfg(test)]
fn retained_bytes(_device: usize) -> u64 {
    0
}

/// The one line a refused request prints. `kept`: bytes charged to the cap that the
/// process keeps for reuse (growth mode; 0 otherwise), said apart from those in use.
pub fn refusal_line(api: &str, device: usize, bytes: u64, refusal: Refusal, kept: u64) -> String {
    let asked = asked(bytes, refusal);
    match refusal {
        Refusal::OverCap { used, cap, .. } if kept > 0 => format!(
            "refused {api} of {asked} on GPU {device}: {} in use and {} kept for reuse of the {} cap",
            format_bytes(used.saturating_sub(kept)),
            format_bytes(kept.min(used)),
            format_bytes(cap)
        ),
        Refusal::OverCap { used, cap, .. } => format!(
            "refused {api} of {asked} on GPU {device}: {} of the {} cap in use",
            format_bytes(used),
            format_bytes(cap)
        ),
        Refusal::Pool(p) if p.left => format!(
            "refused {api} of {asked} on GPU {device}: the process already left its pool (it is exiting)"
        ),
        Refusal::Pool(p) if p.ceiling.is_some() => format!(
            "refused {api} of {asked} on GPU {device}: {} of this process's {} ceiling in use \
             (GPUCAP_CEILING; the pool {} has {} of {} in use)",
            format_bytes(p.own),
            format_bytes(p.ceiling.unwrap_or_default()),
            crate::membership::path().map_or("?".into(), |p| p.display().to_string()),
            format_bytes(p.used),
            format_bytes(p.cap),
        ),
        Refusal::Pool(p) => format!(
            "refused {api} of {asked} on GPU {device}: {} of the pool's {} cap in use, {} of it by this process{} (pool {}){}",
            format_bytes(p.used),
            format_bytes(p.cap),
            format_bytes(p.own),
            if kept > 0 {
                format!(
                    ", of which {} kept for reuse",
                    format_bytes(kept.min(p.own))
                )
            } else {
                String::new()
            },
            crate::membership::path().map_or("?".into(), |p| p.display().to_string()),
            if p.waited_ms > 0 {
                format!(
                    ", after waiting {:.1} s for members to free memory",
                    p.waited_ms as f64 / 1000.0
                )
            } else {
                String::new()
            }
        ),
        Refusal::NoSuchDevice { .. } => format!(
            "refused {api} of {asked} on GPU {device}: gpucap tracks GPUs 0 to {}",
            MAX_DEVICES - 1
        ),
    }
}

/// The request as a refusal names it: the bytes the program asked for, and, where gpucap
/// charged more for them (a linear allocation in the driver's whole 2 MiB pages, a pool's
/// growth), the exact bytes and that charge.
fn asked(bytes: u64, refusal: Refusal) -> String {
    let charged = match refusal {
        Refusal::OverCap { requested, .. } => requested,
        Refusal::Pool(p) => p.requested,
        Refusal::NoSuchDevice { .. } => bytes,
    };
    if charged > bytes {
        format!(
            "{} ({bytes} B, charged {})",
            format_bytes(bytes),
            format_bytes(charged)
        )
    } else {
        format_bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_line_reads_like_the_issue() {
        let r = Refusal::OverCap {
            requested: 600 << 20,
            used: 512 << 20,
            cap: 1 << 30,
        };
        assert_eq!(
            refusal_line("cuMemAlloc", 0, 600 << 20, r, 0),
            "refused cuMemAlloc of 600 MiB on GPU 0: 512 MiB of the 1 GiB cap in use"
        );
    }

    #[test]
    fn growth_says_kept_for_reuse_apart_from_in_use() {
        let r = Refusal::OverCap {
            requested: 200 << 20,
            used: 900 << 20,
            cap: 1 << 30,
        };
        assert_eq!(
            refusal_line("cuMemAlloc", 0, 1100 << 20, r, 900 << 20),
            "refused cuMemAlloc of 1.07 GiB on GPU 0: 0 B in use and 900 MiB kept for reuse of the 1 GiB cap"
        );
    }

    #[test]
    fn a_refusal_charged_more_than_asked_says_both() {
        let r = Refusal::OverCap {
            requested: 4 << 20,
            used: 254 << 20,
            cap: 256 << 20,
        };
        assert_eq!(
            refusal_line("cuMemAlloc", 0, (2 << 20) + 4096, r, 0),
            "refused cuMemAlloc of 2 MiB (2101248 B, charged 4 MiB) on GPU 0: 254 MiB of the 256 MiB cap in use"
        );
    }

    #[test]
    fn mem_info_is_capped_and_saturating() {
        let s = Shim {
            ledger: Ledger::new(),
            config: OnceLock::new(),
            cap_resolved: [const { AtomicBool::new(false) }; MAX_DEVICES],
        };
        assert_eq!(
            s.mem_info(0, 70, 80, 0),
            (70, 80),
            "no cap: the driver's figures"
        );
        s.ledger.set_cap(0, Some(50));
        s.ledger.reserve(0, 20).unwrap().commit(1);
        assert_eq!(s.mem_info(0, 70, 80, 0), (30, 50));
        assert_eq!(s.mem_info(0, 10, 80, 0), (10, 50), "physical free is lower");
        assert_eq!(
            s.mem_info(0, 10, 80, 15),
            (25, 50),
            "retained bytes are free to the process"
        );
        s.ledger.set_cap(0, Some(10)); // used (20) above the cap: free saturates at 0
        assert_eq!(s.mem_info(0, 70, 80, 0), (0, 10));
        assert_eq!(
            s.mem_info(0, 70, 80, 40),
            (10, 10),
            "never more free than total"
        );
        assert_eq!(
            s.total_mem(0, 8),
            8,
            "a cap above the physical total shows the physical total"
        );
    }
}
