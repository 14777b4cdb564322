//! The shim's process-wide state: configuration (read once, on the first CUDA call),
//! the log level, the ledger, and turning a device's limit into a cap in bytes.
//! Safe Rust; the hooks ask it questions and tell it what the driver did.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::*};

use crate::config::{self, Config, LogLevel, MAX_DEVICES};
use crate::ledger::{Ledger, NO_CAP, Refusal, Reservation};
use crate::size::format_bytes;

pub struct Shim {
    pub ledger: Ledger,
    config: OnceLock<Result<Config, String>>,
    log: AtomicU8,
    cap_resolved: [AtomicBool; MAX_DEVICES],
}

pub static SHIM: Shim = Shim {
    ledger: Ledger::new(),
    config: OnceLock::new(),
    log: AtomicU8::new(LogLevel::Warn as u8),
    cap_resolved: [const { AtomicBool::new(false) }; MAX_DEVICES],
};

/// Writes one `gpucap: …` line to stderr if `level` is enabled.
pub fn write_log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if level as u8 <= SHIM.log.load(Relaxed) && level != LogLevel::Off {
        eprintln!("gpucap: {msg}");
    }
}

macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        $crate::shim::write_log($crate::config::LogLevel::$level, format_args!($($arg)*))
    };
}
pub(crate) use log;

/// Why the shim refuses to forward a call at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Misconfigured;

impl Shim {
    /// The configuration, read from the environment on first use. An invalid one is
    /// reported once and makes every later call fail closed.
    pub fn config(&self) -> Result<&Config, Misconfigured> {
        let loaded = self.config.get_or_init(|| {
            let result = config::from_env().map_err(|e| e.to_string());
            match &result {
                Ok(c) => self.log.store(c.log as u8, Relaxed),
                // The error is always shown, whatever GPUCAP_LOG says: it may be the
                // very variable that is wrong, and the program is being stopped.
                Err(e) => eprintln!("{e}"),
            }
            result
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
        let limit = match self.config() {
            Ok(c) => c.limit.as_ref().and_then(|l| l.for_ordinal(device as u32)),
            Err(_) => return,
        };
        let cap = match limit {
            None => None,
            Some(config::Limit::Bytes(b)) => Some(b),
            Some(limit) => match physical_total() {
                Some(total) => Some(limit.resolve(total)),
                None => {
                    log!(
                        Error,
                        "cannot read the physical memory of GPU {device} to resolve the limit {limit}: allocations on it are refused"
                    );
                    Some(0)
                }
            },
        };
        self.ledger.set_cap(device, cap);
        flag.store(true, Release);
    }

    /// Reserves `bytes` on `device` for `api`, or logs the refusal line.
    pub fn reserve(&self, api: &str, device: usize, bytes: u64) -> Option<Reservation<'_>> {
        self.reserve_for(api, device, bytes, bytes)
    }

    /// Reserves `bytes` on `device` to serve a request of `requested` bytes (more
    /// when rounded up to pages, fewer when partly served from retained memory);
    /// a refusal names the request as the program made it.
    pub fn reserve_for(&self, api: &str, device: usize, requested: u64, bytes: u64) -> Option<Reservation<'_>> {
        match self.ledger.reserve(device, bytes) {
            Ok(r) => Some(r),
            Err(refusal) => {
                log!(Warn, "{}", refusal_line(api, device, requested, refusal));
                None
            }
        }
    }

    /// The devices this process has used (their cap was resolved on first use).
    pub fn touched_devices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_DEVICES).filter(|&d| self.cap_resolved[d].load(Acquire))
    }

    /// Whether the configuration was read, i.e. the process called into CUDA.
    pub fn active(&self) -> bool {
        self.config.get().is_some()
    }

    /// `(free, total)` as the program should see them, given the driver's figures
    /// and the bytes the process retains unused in growth mode (free to it, though
    /// the driver counts them as used).
    pub fn mem_info(&self, device: usize, free: u64, total: u64, retained: u64) -> (u64, u64) {
        let (free, total) = match self.ledger.usage(device) {
            Some(u) if u.cap != NO_CAP => (free.min(u.headroom()), total.min(u.cap)),
            _ => (free, total),
        };
        (free.saturating_add(retained).min(total), total)
    }

    /// The total memory the program should see for `device`.
    pub fn total_mem(&self, device: usize, total: u64) -> u64 {
        self.mem_info(device, total, total, 0).1
    }
}

/// The one line a refused request prints.
pub fn refusal_line(api: &str, device: usize, bytes: u64, refusal: Refusal) -> String {
    match refusal {
        Refusal::OverCap { used, cap, .. } => format!(
            "refused {api} of {} on GPU {device}: {} of the {} cap in use",
            format_bytes(bytes),
            format_bytes(used),
            format_bytes(cap)
        ),
        Refusal::NoSuchDevice { .. } => format!(
            "refused {api} of {} on GPU {device}: gpucap tracks GPUs 0 to {}",
            format_bytes(bytes),
            MAX_DEVICES - 1
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_line_reads_like_the_issue() {
        let r = Refusal::OverCap { requested: 600 << 20, used: 512 << 20, cap: 1 << 30 };
        assert_eq!(
            refusal_line("cuMemAlloc", 0, 600 << 20, r),
            "refused cuMemAlloc of 600 MiB on GPU 0: 512 MiB of the 1 GiB cap in use"
        );
    }

    #[test]
    fn mem_info_is_capped_and_saturating() {
        let s = Shim {
            ledger: Ledger::new(),
            config: OnceLock::new(),
            log: AtomicU8::new(0),
            cap_resolved: [const { AtomicBool::new(false) }; MAX_DEVICES],
        };
        assert_eq!(s.mem_info(0, 70, 80, 0), (70, 80), "no cap: the driver's figures");
        s.ledger.set_cap(0, Some(50));
        s.ledger.reserve(0, 20).unwrap().commit(crate::ledger::Kind::Pointer, 1);
        assert_eq!(s.mem_info(0, 70, 80, 0), (30, 50));
        assert_eq!(s.mem_info(0, 10, 80, 0), (10, 50), "physical free is lower");
        assert_eq!(s.mem_info(0, 10, 80, 15), (25, 50), "retained bytes are free to the process");
        s.ledger.set_cap(0, Some(10)); // used (20) above the cap: free saturates at 0
        assert_eq!(s.mem_info(0, 70, 80, 0), (0, 10));
        assert_eq!(s.mem_info(0, 70, 80, 40), (10, 10), "never more free than total");
        assert_eq!(s.total_mem(0, 8), 8, "a cap above the physical total shows the physical total");
    }
}
