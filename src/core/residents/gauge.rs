//! The one measurement interface of residents: what the shim reads from the driver for
//! the core ([`Gauge`]), and the measurement of a first use built on it
//! ([`measure_loaded`]). The device-wide figure (the free memory before and after, the
//! pool's traffic taken out) is `contexts::DeviceLock::measure` over the same trait.

use crate::budget::PoolTraffic;
use crate::contexts::{Ctx, CtxDriver, DeviceLock};

/// What the driver says of the memory it takes on its own. The device's free memory
/// (with a context, or NVML's without one) comes with [`CtxDriver`].
pub trait Gauge: CtxDriver {
    /// The driver's figure for this process on `device` (NVML's per-process used
    /// memory), only where the pid NVML lists it under is provably its own: Ok(None)
    /// where NVML does not list it (it holds nothing there), Err(why) where it cannot be
    /// read so. Never "not listed" read as 0 by mistake: the callers tell the two apart.
    fn own_used(&self, device: usize) -> Result<Option<u64>, String>;
    /// The graph memory the driver holds reserved on `device`
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`), None where it does not say.
    fn graph_reserved(&self, device: usize) -> Option<u64>;
}

/// How [`measure_loaded`] measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// The driver's figure for this process (other processes' traffic does not move it).
    Own,
    /// The device's free memory in the context, the pool's traffic taken out.
    Free,
}

impl By {
    /// How it was measured, for a debug line.
    pub fn says(self) -> &'static str {
        match self {
            By::Own => "by the driver's figure for this process",
            By::Free => "by the device's free memory",
        }
    }
}

/// Runs `call`, which loads code and data into context `ctx` on `lock`'s device (a
/// kernel's first use), and measures what it loaded: by the driver's figure for this
/// process where `gauge` gives it (less what this process's other threads were charged
/// meanwhile, `charged` being the process's charge on the device), else by the free
/// memory in `ctx` with the pool's `traffic` taken out (as a module load). Where the
/// process is not listed before the call, both are read: one listed after it held
/// nothing before (NVML lists those that hold memory). Returns the driver's answer, the
/// bytes or why they could not be measured, and how.
pub fn measure_loaded(
    lock: &DeviceLock<'_>,
    gauge: &impl Gauge,
    ctx: Ctx,
    traffic: Option<PoolTraffic<'_, '_>>,
    charged: impl Fn() -> u64,
    mut call: impl FnMut() -> u32,
) -> (u32, Result<u64, String>, By) {
    let d = lock.device();
    let charged_before = charged();
    match gauge.own_used(d) {
        Ok(Some(before)) => {
            let rc = call();
            let after = gauge
                .own_used(d)
                .and_then(|a| a.ok_or_else(|| "NVML no longer lists this process".to_string()));
            let bytes = after.map(|a| loaded(before, a, charged_before, charged()));
            (rc, bytes, By::Own)
        }
        listed => {
            let mut after = None;
            let (rc, m, _) = lock.measure(gauge, Some(ctx), traffic, || {
                let rc = call();
                after = Some(gauge.own_used(d));
                rc
            });
            match (listed, after) {
                (Ok(None), Some(Ok(Some(a)))) => {
                    (rc, Ok(loaded(0, a, charged_before, charged())), By::Own)
                }
                _ => (
                    rc,
                    m.map(super::taken).map_err(|why| why.to_string()),
                    By::Free,
                ),
            }
        }
    }
}

/// What a call loaded (a first use, a context), from the driver's figure for this process before and after
/// it (`before`, `after`) and the process's own charges then (`own_before`,
/// `own_after`): what the figure moved by, less what the process's other threads'
/// charges moved by meanwhile (their allocations and frees show in the figure too).
pub fn loaded(before: u64, after: u64, own_before: u64, own_after: u64) -> u64 {
    let figure = i128::from(after) - i128::from(before);
    let own = i128::from(own_after) - i128::from(own_before);
    u64::try_from((figure - own).max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contexts::ContextCharges;
    use std::cell::{Cell, RefCell};

    const MIB: u64 = 1 << 20;

    /// A driver whose call takes `loads` bytes for this process, while the device's free
    /// memory also moves by `noise` (another process); NVML's answers in order.
    struct Fake {
        free: Cell<u64>,
        own: RefCell<Vec<Result<Option<u64>, String>>>,
    }

    impl Fake {
        fn new(own: Vec<Result<Option<u64>, String>>) -> Fake {
            Fake {
                free: Cell::new(1 << 40),
                own: RefCell::new(own),
            }
        }
    }

    impl CtxDriver for Fake {
        fn free_with(&self, _: Ctx) -> Result<u64, u32> {
            Ok(self.free.get())
        }
        fn free_without_context(&self, _: usize) -> Result<u64, String> {
            Ok(self.free.get())
        }
        fn create_floating(&self, _: usize) -> Result<Ctx, u32> {
            Err(999)
        }
        fn destroy(&self, _: Ctx) {}
        fn primary_active(&self, _: usize) -> Option<bool> {
            Some(true)
        }
        fn id(&self, ctx: Ctx) -> Option<u64> {
            Some(ctx)
        }
        fn exists(&self, _: Ctx, _: Option<u64>) -> Option<bool> {
            Some(true)
        }
    }

    impl Gauge for Fake {
        fn own_used(&self, _: usize) -> Result<Option<u64>, String> {
            self.own.borrow_mut().remove(0)
        }
        fn graph_reserved(&self, _: usize) -> Option<u64> {
            None
        }
    }

    /// Measures a call that takes 92 MiB for this process while another process on the
    /// device frees 50 MiB, and this process's other threads are charged 4 MiB.
    fn load(drv: &Fake) -> (u32, Result<u64, String>, By) {
        let book = ContextCharges::new();
        let lock = book.lock(0).unwrap();
        let charged = Cell::new(10 * MIB);
        measure_loaded(
            &lock,
            drv,
            7,
            None,
            || charged.get(),
            || {
                drv.free.set(drv.free.get() - 92 * MIB + 50 * MIB);
                charged.set(charged.get() + 4 * MIB);
                0
            },
        )
    }

    #[test]
    fn what_a_first_use_loaded_leaves_out_the_other_threads_allocations() {
        const MIB: u64 = 1 << 20;
        assert_eq!(loaded(534 * MIB, 626 * MIB, 539 * MIB, 539 * MIB), 92 * MIB);
        assert_eq!(loaded(534 * MIB, 626 * MIB, 539 * MIB, 559 * MIB), 72 * MIB);
        // another thread's free meanwhile lowered the figure: added back
        assert_eq!(loaded(534 * MIB, 500 * MIB, 539 * MIB, 443 * MIB), 62 * MIB);
        assert_eq!(loaded(534 * MIB, 534 * MIB, 0, 64 * MIB), 0);
        assert_eq!(loaded(534 * MIB, 500 * MIB, 539 * MIB, 539 * MIB), 0);
    }

    #[test]
    fn listed_before_the_processs_own_figure_measures_it_less_its_other_threads() {
        // NVML's figure moves by the load and the other threads' 4 MiB.
        let drv = Fake::new(vec![Ok(Some(100 * MIB)), Ok(Some(196 * MIB))]);
        assert_eq!(load(&drv), (0, Ok(92 * MIB), By::Own));
    }

    #[test]
    fn listed_only_after_the_process_held_nothing_before() {
        let drv = Fake::new(vec![Ok(None), Ok(Some(96 * MIB))]);
        assert_eq!(load(&drv), (0, Ok(92 * MIB), By::Own));
    }

    #[test]
    fn without_the_processs_figure_the_device_wide_one_measures_it() {
        // Another process's free counts out: the device-wide figure is all there is.
        let drv = Fake::new(vec![Err("no NVML".into()), Err("no NVML".into())]);
        assert_eq!(load(&drv), (0, Ok(42 * MIB), By::Free));
    }

    #[test]
    fn a_process_nvml_stops_listing_is_unmeasured_never_zero() {
        let drv = Fake::new(vec![Ok(Some(100 * MIB)), Ok(None)]);
        let (rc, bytes, by) = load(&drv);
        assert_eq!((rc, by), (0, By::Own));
        assert!(bytes.is_err(), "{bytes:?}");
    }
}
