//! Every process-wide static of the shim, in one place: `SHIM` (the ledger, with
//! reservation and the memory figures a program is shown) and the books of pools, VMM
//! handles, arrays, contexts and NVML's view of the devices. Beside it: `configuration`
//! (read once on the first CUDA call; a device's limit turned into a cap in bytes),
//! `refusals` (the one line a refused request prints) and `exit_report` (the summary and
//! the `GPUCAP_REPORT` file).
//! Safe Rust; the hooks ask it questions and tell it what the driver did.

use std::sync::OnceLock;
use std::sync::atomic::{
    AtomicBool, AtomicU32,
    Ordering::{Acquire, Relaxed},
};

use gpucap_core::config::{Config, MAX_DEVICES};
use gpucap_core::contexts::ContextCharges;
use gpucap_core::ledger::LiveMap;
use gpucap_core::ledger::{Ledger, NO_CAP, Reservation};
use gpucap_core::pools::MemPoolCharges;
use gpucap_core::vmm::VmmHandles;

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
pub static POOLS: MemPoolCharges = MemPoolCharges::new();

pub static VMM: VmmHandles = VmmHandles::new();

/// Live CUDA arrays and mipmapped arrays, by handle.
pub static ARRAYS: LiveMap = LiveMap::new();
pub static MIPMAPS: LiveMap = LiveMap::new();

pub fn array_map(mipmapped: bool) -> &'static LiveMap {
    if mipmapped { &MIPMAPS } else { &ARRAYS }
}

pub static CONTEXTS: ContextCharges = ContextCharges::new();

/// Loaded modules and what each was charged.
pub static MODULES: gpucap_core::modules::ModuleBook = gpucap_core::modules::ModuleBook::new();

/// The functions launched (or loaded) once in a context: by `kernels::launch_key` (a
/// function handle), `context_key` (a kernel handle in a context) or `name_key`.
pub static LAUNCHED: gpucap_core::kernels::FunctionsSeen =
    gpucap_core::kernels::FunctionsSeen::new();

/// The handles found to be kernel handles (`cuLibraryGetKernel`'s, one for every
/// context), by `kernels::launch_key(handle, 0)`: looked up per context.
pub static KERNEL_HANDLES: gpucap_core::kernels::HandlesSeen =
    gpucap_core::kernels::HandlesSeen::new();

/// The modules `cuLibraryGetModule` handed out, by `kernels::launch_key(module, 0)`: a
/// global reached through one loads its library into the context (`launches`).
pub static LIBRARY_MODULES: gpucap_core::kernels::HandlesSeen =
    gpucap_core::kernels::HandlesSeen::new();

/// What the first uses of each library's or module's functions took, to reserve
/// before the next one.
pub static ESTIMATES: gpucap_core::kernels::LoadEstimates =
    gpucap_core::kernels::LoadEstimates::new();

/// What the kernels loaded at first launches took, by context and function.
pub static KERNELS: gpucap_core::kernels::KernelBook = gpucap_core::kernels::KernelBook::new();

/// What green contexts took of their own (`cuGreenCtxCreate`), by green context: each
/// lives in its device's primary context, which it retains.
pub static GREENS: gpucap_core::residents::ResidentCharges<u64> =
    gpucap_core::residents::ResidentCharges::new();

/// The memory contexts' limits took (`cuCtxSetLimit`), by context and limit.
pub static LIMITS: gpucap_core::limits::LimitBook = gpucap_core::limits::LimitBook::new();

/// The executable graphs with memory nodes, and each device's graph memory charge.
pub static GRAPHS: gpucap_core::graphs::GraphCharges = gpucap_core::graphs::GraphCharges::new();

/// What CUDA would see in this process, worked out from NVML (read once).
pub static NVML_VIEW: std::sync::OnceLock<Vec<[u8; 16]>> = std::sync::OnceLock::new();

/// Whether the limit's keys match what CUDA would see, checked once; the message is
/// printed once, and while they do not, every NVML call fails closed.
pub static NVML_KEYS: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();

/// Why the shim refuses to forward a call at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Misconfigured;

mod configuration;
mod exit_report;
mod refusals;

/// The pid that first called into CUDA (0: none yet): a forked child (another pid)
/// inherits the figures of its parent, so it writes no report and no summary of its
/// own. A child of a process that never called into CUDA marks itself when it does.
static ACTIVE_PID: AtomicU32 = AtomicU32::new(0);

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shim {
    /// Whether `device`'s cap was resolved (one load: for the allocation short path).
    #[inline]
    pub fn cap_known(&self, device: usize) -> bool {
        self.cap_resolved
            .get(device)
            .is_some_and(|f| f.load(Acquire))
    }

    /// Reserves `bytes` on `device` to serve a request of `requested` bytes (more when
    /// rounded up to pages, fewer when partly served from retained memory), or logs the
    /// refusal line, which names the request as the program made it. `in_hand`: in growth
    /// mode, bytes of pages kept for reuse already taken to serve the request (the line
    /// says them, and what else is kept, apart from the memory in use); 0 otherwise.
    pub fn reserve(
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
        let usage = self.ledger.usage(device);
        let (free, total) = match (pooled, usage) {
            (Some((room, Some(cap))), _) => (free.min(room), total.min(cap)),
            (None, Some(u)) if u.cap != NO_CAP => (free.min(u.headroom()), total.min(u.cap)),
            _ => (free, total),
        };
        // Never more than the ceiling handed down to the process (a pool resized above
        // it lets it hold no more).
        let (free, total) = match (self.ledger.ceiling(device), usage) {
            (Some(c), Some(u)) => (free.min(c.saturating_sub(u.used)), total.min(c)),
            _ => (free, total),
        };
        (free.saturating_add(retained).min(total), total)
    }

    /// The total memory the program should see for `device`.
    pub fn total_mem(&self, device: usize, total: u64) -> u64 {
        self.mem_info(device, total, total, 0).1
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

#[cfg(test)]
mod tests {
    use super::*;

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
