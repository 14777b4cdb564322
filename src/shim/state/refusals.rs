//! A refused request: the one stderr line (not said again for a retry or a back-off
//! at once), and the report refreshed.

use std::sync::atomic::Ordering::Relaxed;

use gpucap_core::config::{LogLevel, MAX_DEVICES};
use gpucap_core::ledger::Refusal;
use gpucap_core::refusal_lines::{Holding, RefusalLines};
use gpucap_core::size::format_bytes;

use crate::log::log;

use super::{Shim, now_ms, retained_bytes};

/// The last refusal line printed, so that a retry or a back-off at once prints none.
static REFUSAL_LINES: RefusalLines = RefusalLines::new();

impl Shim {
    /// Reports a refused request: the one stderr line, and a refreshed report.
    /// The same request refused again at once (a program retrying after freeing its
    /// cache, as CuPy does) or a smaller one while the process holds the same memory (an
    /// allocator backing off, as TensorFlow's does) prints no second line: see
    /// `gpucap_core::refusal_lines`.
    pub fn refused(&self, api: &str, device: usize, bytes: u64, refusal: Refusal) {
        self.refused_kept(api, device, bytes, refusal, 0);
    }

    /// [`refused`](Self::refused), with `in_hand` bytes kept for reuse that the request
    /// had taken already (growth mode).
    pub(super) fn refused_kept(
        &self,
        api: &str,
        device: usize,
        bytes: u64,
        refusal: Refusal,
        in_hand: u64,
    ) {
        let level = crate::log::LEVEL.load(Relaxed);
        if level >= LogLevel::Debug as u8
            || REFUSAL_LINES.should_print(
                api,
                device,
                bytes,
                self.holding(device, refusal),
                now_ms(),
            )
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

    /// This process's memory on GPU `device` at `refusal`: what the refusal says it holds
    /// (a pool member: its own share), and how many allocations it was served there.
    fn holding(&self, device: usize, refusal: Refusal) -> Holding {
        let bytes = match refusal {
            Refusal::OverCap { used, .. } => used,
            Refusal::Pool(p) => p.own,
            Refusal::NoSuchDevice { .. } => 0,
        };
        let served = self.ledger.usage(device).map_or(0, |u| u.allocs);
        Holding { bytes, served }
    }
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
            "refused {api} of {asked} on GPU {device}: {} of the pool's {} cap in use, {} of it by this process{}{} (pool {}){}",
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
            if p.kept_for_others > 0 {
                format!(
                    ", and {} kept for other members' guarantees",
                    format_bytes(p.kept_for_others)
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
}
