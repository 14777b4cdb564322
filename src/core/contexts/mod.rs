//! Context overhead: a CUDA context takes device memory that no allocation call shows
//! (about 0.5 GiB on an H100: the context's own structures, its local memory, printf
//! and malloc heaps). The shim charges what each context really took, measured as the
//! driver's free memory on that device just before and just after the driver created
//! it, and credits it when the context goes away.
//!
//! Where the process already has a context on the device (its primary context, or a
//! context it created), that context is the "vantage": pushed, `cuMemGetInfo_v2`
//! asked, popped again. For the first context on a device there is none, and the free
//! memory is read without a context: NVML's device-wide figure
//! (`nvmlDeviceGetMemoryInfo`), before and after (one source for both reads: NVML and
//! `cuMemGetInfo_v2` do not count reserved memory alike, a difference of the two would
//! not be the context). Only when NVML cannot be used (no library, no GPU with the
//! device's UUID, a MIG instance, an error; the reason goes to a debug line) is a
//! temporary context created, kept floating (not current) while the new context is
//! made, and destroyed afterwards: one context creation more, once per device.
//!
//! Accuracy: both figures are device-wide, so memory that anything else takes or
//! gives back on the device between the two reads (another process, or another thread
//! of this one allocating at that moment) is counted in, or out of, the context's
//! charge. Context operations are serialised per device, so two contexts created at
//! once are not mixed up; allocations are not held up. The driver also takes device
//! memory later for a context (modules loaded lazily, a grown malloc heap): that is
//! not measured.
//!
//! When the measurement fails (the driver would not answer, NVML answered before the
//! call and not after it, or there was no room for the temporary context), the context
//! cannot be charged: under a cap it is undone and
//! the call refused; without a cap it is allowed, not counted, with an error line
//! (see [`Unmeasured`]). Never silently.
//!
//! A context ends with `cuCtxDestroy`, `cuCtxDetach` of its last reference, the last
//! `cuDevicePrimaryCtxRelease` or `cuDevicePrimaryCtxReset`; the driver frees its
//! memory with it. Whether it really ended is asked of the driver after the call (the
//! context's id, the primary's state), never counted here: the program can attach and
//! detach behind any count the shim would keep.
//!
//! This module is safe Rust over a [`CtxDriver`]; the hooks pass the real driver.

use std::sync::{Mutex, MutexGuard};

use crate::budget::PoolTraffic;
use crate::config::MAX_DEVICES;
use crate::ledger::{Charge, LiveMap};

mod settle;
mod unmeasured;
mod window;
pub use settle::{Settled, settle, settle_own};
pub use unmeasured::{MeasuredBy, Step, Unmeasured, Verdict, verdict};
use window::Edges;

/// A `CUcontext`, as an integer.
pub type Ctx = u64;

/// `CUDA_SUCCESS`, `CUDA_ERROR_OUT_OF_MEMORY`, `CUDA_ERROR_UNKNOWN` (the FFI edge's
/// constants are not compiled into the unit tests).
const SUCCESS: u32 = 0;
const OUT_OF_MEMORY: u32 = 2;
const UNKNOWN: u32 = 999;

/// What measuring needs from the driver. Failures carry the driver's error code.
pub trait CtxDriver {
    /// The driver's free memory on `ctx`'s device, asked with `ctx` pushed current.
    fn free_with(&self, ctx: Ctx) -> Result<u64, u32>;
    /// The free memory of `device` read without any context of the process (NVML's
    /// device-wide figure), or why it cannot be read so (for a debug line).
    fn free_without_context(&self, device: usize) -> Result<u64, String>;
    /// Creates a context on `device` and leaves it not current (a temporary vantage).
    fn create_floating(&self, device: usize) -> Result<Ctx, u32>;
    /// Destroys a context made by `create_floating`.
    fn destroy(&self, ctx: Ctx);
    /// Whether `device`'s primary context is active (retained at least once).
    fn primary_active(&self, device: usize) -> Option<bool>;
    /// The driver's unique id of a live context (`cuCtxGetId`), if it gives one.
    fn id(&self, ctx: Ctx) -> Option<u64>;
    /// Whether `ctx` still exists: Some(false) when the driver says it does not, or
    /// that the handle is now another context (its id is not `id`); None when the
    /// driver cannot say.
    fn exists(&self, ctx: Ctx, id: Option<u64>) -> Option<bool>;
}

/// What a call that may have ended a context found, asked of the driver afterwards.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The context is gone: credit its charge (None if it had none here) and the
    /// allocations the driver freed with it.
    Gone(Option<Charge>),
    /// Still alive (another reference holds it): nothing to credit.
    Alive,
    /// The driver cannot say: its charge is kept (never less than it may hold).
    Unknown,
}

#[derive(Debug, Default, Clone, Copy)]
struct DevState {
    /// The primary context's handle and the bytes charged for it, while active.
    primary: Option<(Ctx, u64)>,
    /// What the last [`RECENT`] contexts measured on this device took (None: an empty
    /// entry), the oldest replaced first (`next`).
    recent: [Option<u64>; RECENT],
    next: usize,
    /// How many created contexts of this device the book holds: none, and a context
    /// is measured without looking through the book for one to measure with.
    created: usize,
}

/// How many measurements of contexts the next context's expectation is the least of.
/// A measurement errs both ways (memory others freed inside its window counts in, what
/// others outside the pool allocated there counts out): the least of the recent ones
/// is near what a context takes, and one that erred low is forgotten after this many
/// more, never a floor for good.
pub const RECENT: usize = 8;

/// The contexts the process made through the shim, with what each was charged.
pub struct ContextCharges {
    /// Per device: serialises context operations, holds the primary's charge.
    devices: [Mutex<DevState>; MAX_DEVICES],
    /// Created (non-primary) contexts: handle -> device and bytes charged.
    created: LiveMap,
}

impl Default for ContextCharges {
    fn default() -> Self {
        Self::new()
    }
}

/// A device's context operations, held for the whole measure-call-record sequence.
pub struct DeviceLock<'a> {
    book: &'a ContextCharges,
    device: usize,
    state: MutexGuard<'a, DevState>,
}

impl ContextCharges {
    pub const fn new() -> Self {
        ContextCharges {
            devices: [const {
                Mutex::new(DevState {
                    primary: None,
                    recent: [None; RECENT],
                    next: 0,
                    created: 0,
                })
            }; MAX_DEVICES],
            created: LiveMap::new(),
        }
    }

    /// Serialises context operations on `device` (None beyond the devices tracked).
    pub fn lock(&self, device: usize) -> Option<DeviceLock<'_>> {
        let m = self.devices.get(device)?;
        Some(DeviceLock {
            book: self,
            device,
            state: m.lock().unwrap_or_else(|p| p.into_inner()),
        })
    }

    /// The device a created context was made on, if it was made through the shim.
    pub fn created_device(&self, ctx: Ctx) -> Option<usize> {
        self.created.get(ctx).map(|c| c.device)
    }
}

// Used by the hooks (not compiled into the unit tests).
#[cfg_attr(test, allow(dead_code))]
impl DeviceLock<'_> {
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device's primary context, while the process holds it.
    pub fn primary(&self) -> Option<Ctx> {
        self.state.primary.map(|(ctx, _)| ctx)
    }

    /// The process's contexts on this device: the primary first, while held, then the
    /// created ones (an eagerly loaded library is loaded into each).
    pub fn contexts(&self) -> Vec<Ctx> {
        let created = match self.state.created {
            0 => Vec::new(),
            _ => self.book.created.matching(|c| c.device == self.device),
        };
        self.primary()
            .into_iter()
            .chain(created.into_iter().map(|(ctx, _)| ctx))
            .collect()
    }

    /// A context of the process on this device to measure with, if any.
    fn vantage(&self) -> Option<Ctx> {
        self.state.primary.map(|(ctx, _)| ctx).or_else(|| {
            if self.state.created == 0 {
                return None;
            }
            self.book
                .created
                .matching(|c| c.device == self.device)
                .first()
                .map(|&(ctx, _)| ctx)
        })
    }

    /// Runs `call` (which makes the driver take memory on this device: a context, a
    /// module, a limit's memory, a kernel's lazy load) and returns its result with the
    /// change in the device's free memory it made, in bytes (free before minus free
    /// after: negative when more was given back meanwhile; [`taken`] makes it a
    /// charge), or why it could not be measured (meaningless when the call failed); and
    /// how it was measured. This is the one device-wide measurement every kind of
    /// resident shares.
    ///
    /// `on`: the context the call is made in, when it stays there (a module loaded in
    /// it): the free memory is read with it pushed current. None (a context being made):
    /// with a context of the process on the device, if any; else without one (NVML); only
    /// if that cannot be done, with a temporary context. If the call runs out of memory
    /// while a temporary context is held for the measurement, the temporary context is
    /// destroyed and the call made again without it: gpucap must not make a context fail
    /// that the device has room for.
    ///
    /// `traffic`: what the members of this process's pool mark of their traffic on this
    /// device (None outside a pool; see `budget::marks`). The driver's free figure
    /// is device-wide, so memory the members gave back while the call ran would be taken
    /// off its bytes (and a resident charged short lets the pool over-commit), and memory
    /// they allocated meanwhile added to them. Every member marks a free before its driver
    /// call and an allocation around it: the frees that may fall inside the window (read
    /// before and after it) are added back, the allocations that surely fall inside it
    /// (read just inside it) are taken off. Whatever is unsure stays in: the call is
    /// charged more, never less (given back is never overstated); a device read that
    /// the members' traffic moved during is made again (`window`), so that what is
    /// unsure is what was in flight at a read, not what a preempted read let pass.
    /// Memory of processes outside the pool still shows; none of it can be told apart
    /// from the call's.
    pub fn measure(
        &self,
        drv: &impl CtxDriver,
        on: Option<Ctx>,
        traffic: Option<PoolTraffic<'_, '_>>,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<i128, Unmeasured>, MeasuredBy) {
        let (rc, taken, how, _) = self.measure_marked(drv, on, traffic, call, false);
        (rc, taken, how)
    }

    /// [`measure`](Self::measure), and how far its figure may be above what the call
    /// took: the pool's traffic left in it that may have fallen outside the window
    /// (`window::Edges::unsure`; 0 outside a pool). Beside the pool alone, the call
    /// took between the figure less this and the figure.
    pub fn measure_with_doubt(
        &self,
        drv: &impl CtxDriver,
        on: Option<Ctx>,
        traffic: Option<PoolTraffic<'_, '_>>,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<i128, Unmeasured>, MeasuredBy, u64) {
        self.measure_marked(drv, on, traffic, call, true)
    }

    /// [`measure`](Self::measure) with the pool's marks read right around each device
    /// read, and a read the members' traffic moved during made again (`window`); the
    /// window's doubt read only where `doubt` asks it (its extra reads of the marks).
    fn measure_marked(
        &self,
        drv: &impl CtxDriver,
        on: Option<Ctx>,
        traffic: Option<PoolTraffic<'_, '_>>,
        call: impl FnMut() -> u32,
        doubt: bool,
    ) -> (u32, Result<i128, Unmeasured>, MeasuredBy, u64) {
        let Some(t) = traffic else {
            let (rc, taken, how) = self.measure_device_wide(drv, on, call, &mut window::Bare);
            return (rc, taken, how, 0);
        };
        let mut edges = window::Marked::new(t, doubt);
        let (rc, taken, how) = self.measure_device_wide(drv, on, call, &mut edges);
        (rc, taken, how, edges.unsure())
    }

    /// The driver's free memory before the call minus after it (negative when more was
    /// given back meanwhile than the context took), read with `vantage` pushed, else a
    /// context of the process on this device; `edges` read around each read, and what
    /// they make of the window added.
    fn measure_device_wide(
        &self,
        drv: &impl CtxDriver,
        vantage: Option<Ctx>,
        call: impl FnMut() -> u32,
        edges: &mut dyn Edges,
    ) -> (u32, Result<i128, Unmeasured>, MeasuredBy) {
        if let Some(v) = vantage.or_else(|| self.vantage()) {
            let (rc, taken) = with_vantage(drv, Ok(v), None, call, edges);
            return (rc, taken, MeasuredBy::Context);
        }
        match drv.free_without_context(self.device) {
            Ok(first) => {
                // The first read may have loaded NVML (milliseconds): with marks to
                // read, the window starts with a second read, right after it.
                let before = match edges.marked() {
                    true => window::read_before(edges, || drv.free_without_context(self.device))
                        .map_err(|_| Unmeasured::new(Step::DeviceFreeBefore, UNKNOWN)),
                    false => Ok(first),
                };
                let (rc, taken) = without_context(drv, self.device, before, call, edges);
                (rc, taken, MeasuredBy::Nvml)
            }
            Err(why) => {
                let (vantage, temporary) = match drv.create_floating(self.device) {
                    Ok(t) => (Ok(t), Some(t)),
                    Err(rc) => (Err(Unmeasured::new(Step::Temporary, rc)), None),
                };
                let (rc, taken) = with_vantage(drv, vantage, temporary, call, edges);
                (rc, taken, MeasuredBy::Temporary(why))
            }
        }
    }

    /// The bytes the next context on this device is expected to take: the least of what
    /// the last [`RECENT`] contexts measured here took (0 before the first). The hooks
    /// reserve it before the driver makes the context, so that one the cap cannot take
    /// is refused without being made (while contexts take what one took before, the
    /// driver never holds more than the cap, even for a moment); the reservation is then
    /// set to what the context really took.
    pub fn expected(&self) -> u64 {
        self.state
            .recent
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(0)
    }

    /// Whether any context on this device was measured alone yet (before the first,
    /// [`expected`](Self::expected) is 0 for want of a figure, not a figure of 0).
    pub fn expectation_known(&self) -> bool {
        self.state.recent.iter().any(Option::is_some)
    }

    /// Whether the last [`RECENT`] contexts on this device were all measured: then their
    /// least may replace the pool's figure, not only lower it
    /// (`Member::note_context_bytes`).
    pub fn expectation_settled(&self) -> bool {
        self.state.recent.iter().all(Option::is_some)
    }

    /// What the next context on this device reserves before the driver makes it: the
    /// least of this process's recent measurements ([`expected`](Self::expected)) and the
    /// pool's figure (`pool`, 0 if none or outside a pool), whichever is less: a first
    /// measurement of this process inflated by the other members' frees must not
    /// outweigh theirs.
    pub fn expected_beside(&self, pool: u64) -> u64 {
        match (self.expected(), pool) {
            (own, 0) | (0, own) => own,
            (own, pool) => own.min(pool),
        }
    }

    /// A context on this device took `bytes` (measured). Kept among the last
    /// [`RECENT`]: one measurement inflated by a burst of frees (a 300 MiB context
    /// measured at 2.35 GiB beside three churning members) must not become what every
    /// later context reserves first (over the cap, none could be made again), and one
    /// that erred low (others outside the pool allocated inside its window; 0 included)
    /// must not lower the expectation for good: forgotten after [`RECENT`] more. A
    /// context that takes more than expected still cannot pass the cap: the driver makes
    /// it, and it is undone when its measured bytes do not fit.
    pub fn learn(&mut self, bytes: u64) {
        let i = self.state.next % RECENT;
        self.state.recent[i] = Some(bytes);
        self.state.next = (i + 1) % RECENT;
    }

    /// Whether the primary context is already active, so a retain creates nothing.
    pub fn primary_active(&self, drv: &impl CtxDriver) -> bool {
        self.state.primary.is_some() || drv.primary_active(self.device) == Some(true)
    }

    /// Records the primary context's charge (its bytes already kept in the ledger).
    pub fn set_primary(&mut self, ctx: Ctx, bytes: u64) {
        self.state.primary = Some((ctx, bytes));
    }

    /// The primary context went away: its charge, to credit.
    pub fn take_primary(&mut self) -> Option<Charge> {
        self.state.primary.take().map(|(_, bytes)| Charge {
            device: self.device,
            bytes,
        })
    }

    /// The charge of `ctx` (the primary context or a created one), if it has one here:
    /// what a call that may end it announces to the pool before the driver frees it.
    pub fn charge_of(&self, ctx: Ctx) -> Option<Charge> {
        match self.state.primary {
            Some((p, _)) if p == ctx => self.primary_charge(),
            _ => self.book.created.get(ctx),
        }
    }

    /// The primary context's charge, while it is active.
    pub fn primary_charge(&self) -> Option<Charge> {
        self.state.primary.map(|(_, bytes)| Charge {
            device: self.device,
            bytes,
        })
    }

    /// Records a created context's charge (its bytes already kept in the ledger).
    pub fn add_created(&mut self, ctx: Ctx, bytes: u64) {
        self.restore_created(
            ctx,
            Charge {
                device: self.device,
                bytes,
            },
        );
    }

    /// A created context is being destroyed: its charge (put it back with
    /// [`restore_created`](Self::restore_created) if the driver refuses).
    pub fn take_created(&mut self, ctx: Ctx) -> Option<Charge> {
        let taken = self.book.created.remove(ctx);
        if taken.is_some_and(|c| c.device == self.device) {
            self.state.created = self.state.created.saturating_sub(1);
        }
        taken
    }

    pub fn restore_created(&mut self, ctx: Ctx, charge: Charge) {
        self.book.created.insert(ctx, charge);
        self.state.created += 1;
    }

    /// After the driver accepted a call that ends `ctx` only with its last reference
    /// (`cuCtxDetach`; `id` is the context's id read before the call): asks the driver
    /// whether the context is gone, and if so takes its charge.
    pub fn after_release(&mut self, drv: &impl CtxDriver, ctx: Ctx, id: Option<u64>) -> Ending {
        let is_primary = self.state.primary.is_some_and(|(p, _)| p == ctx);
        let exists = if is_primary {
            drv.primary_active(self.device)
        } else {
            drv.exists(ctx, id)
        };
        match exists {
            Some(true) => Ending::Alive,
            None => Ending::Unknown,
            Some(false) if is_primary => Ending::Gone(self.take_primary()),
            Some(false) => Ending::Gone(self.take_created(ctx)),
        }
    }
}

/// Measures `call` from NVML's free memory of `device` (`before`, read already).
fn without_context(
    drv: &impl CtxDriver,
    device: usize,
    before: Result<u64, Unmeasured>,
    mut call: impl FnMut() -> u32,
    edges: &mut dyn Edges,
) -> (u32, Result<i128, Unmeasured>) {
    let rc = call();
    if rc != SUCCESS {
        return (rc, Ok(0));
    }
    let after = window::read_after(edges, || drv.free_without_context(device));
    let taken = before.and_then(|b| {
        after
            .map(|(a, correction)| i128::from(b) - i128::from(a) + correction)
            .map_err(|_| Unmeasured::new(Step::DeviceFreeAfter, UNKNOWN))
    });
    (rc, taken)
}

/// Measures `call` with `cuMemGetInfo_v2` asked of `vantage` (a context of the process,
/// or `temporary`, destroyed afterwards); `edges` as in `measure_device_wide`.
fn with_vantage(
    drv: &impl CtxDriver,
    vantage: Result<Ctx, Unmeasured>,
    mut temporary: Option<Ctx>,
    mut call: impl FnMut() -> u32,
    edges: &mut dyn Edges,
) -> (u32, Result<i128, Unmeasured>) {
    let mut before = vantage.and_then(|v| {
        window::read_before(edges, || drv.free_with(v))
            .map(|free| (v, free))
            .map_err(|rc| Unmeasured::new(Step::FreeBefore, rc))
    });
    let mut rc = call();
    if rc == OUT_OF_MEMORY
        && let Some(t) = temporary.take()
    {
        drv.destroy(t);
        rc = call();
        before = Err(Unmeasured::new(Step::NoRoom, OUT_OF_MEMORY));
    }
    let taken = before.and_then(|(v, b)| {
        if rc != SUCCESS {
            return Ok(0);
        }
        window::read_after(edges, || drv.free_with(v))
            .map(|(a, correction)| i128::from(b) - i128::from(a) + correction)
            .map_err(|rc| Unmeasured::new(Step::FreeAfter, rc))
    });
    if let Some(t) = temporary {
        drv.destroy(t);
    }
    (rc, taken)
}

/// A measured change of the device's free memory (bytes taken; negative: given back)
/// as a charge: memory given back meanwhile never makes it negative.
pub fn taken(change: i128) -> u64 {
    u64::try_from(change.max(0)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
