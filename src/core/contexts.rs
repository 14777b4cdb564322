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

use std::fmt;
use std::sync::{Mutex, MutexGuard};

use crate::budget::PoolMarks;
use crate::config::MAX_DEVICES;
use crate::ledger::{Charge, LiveMap};

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

/// Why a context's memory could not be measured, and the driver's error that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unmeasured {
    pub step: Step,
    /// The driver's error code (never `CUDA_SUCCESS`).
    pub rc: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The temporary context to measure the first context on a device with.
    Temporary,
    /// The call failed for want of room while the temporary context was held; it
    /// succeeded without it, so there was nothing to measure with.
    NoRoom,
    /// `cuMemGetInfo_v2` before or after the call.
    FreeBefore,
    FreeAfter,
    /// NVML's free memory, read before the call, could not be read after it.
    DeviceFreeAfter,
    /// In a pool, NVML's free memory could not be read a second time before the call.
    DeviceFreeBefore,
}

/// How a context was measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vantage {
    /// With a context the process already has on the device (`cuMemGetInfo_v2`).
    Context,
    /// The first context on the device: NVML's free memory before and after, no other
    /// context made.
    Nvml,
    /// The first context on the device, with a temporary context, because NVML could
    /// not be used (why).
    Temporary(String),
}

impl Unmeasured {
    fn new(step: Step, rc: u32) -> Unmeasured {
        let rc = if rc == SUCCESS { OUT_OF_MEMORY } else { rc };
        Unmeasured { step, rc }
    }
}

impl fmt::Display for Unmeasured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rc = self.rc;
        match self.step {
            Step::Temporary => write!(
                f,
                "the temporary context gpucap measures the first context of a GPU with could not be created (error {rc})"
            ),
            Step::NoRoom => write!(
                f,
                "there was no room for the temporary context gpucap measures it with (error {rc} with it, none without)"
            ),
            Step::FreeBefore => write!(f, "cuMemGetInfo_v2 failed before the call (error {rc})"),
            Step::FreeAfter => write!(f, "cuMemGetInfo_v2 failed after the call (error {rc})"),
            Step::DeviceFreeAfter => write!(
                f,
                "NVML's free memory, read before the call, could not be read after it"
            ),
            Step::DeviceFreeBefore => write!(
                f,
                "NVML's free memory, read once before the call, could not be read again"
            ),
        }
    }
}

/// What to do with a context the driver made, given its measurement and whether its
/// device has a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Charge these bytes (refused, like any allocation, if the cap cannot take them).
    Charge(u64),
    /// Undo the context and return this error: a context gpucap cannot charge is not
    /// allowed under a cap.
    Refuse(u32),
    /// No cap on the device: allowed, not counted (an error line says so).
    Uncounted,
}

pub fn verdict(measured: Result<u64, Unmeasured>, capped: bool) -> Verdict {
    match measured {
        Ok(bytes) => Verdict::Charge(bytes),
        Err(why) if capped => Verdict::Refuse(why.rc),
        Err(_) => Verdict::Uncounted,
    }
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
}

/// How many measurements of contexts the next context's expectation is the least of.
/// A measurement errs both ways (memory others freed inside its window counts in, what
/// others outside the pool allocated there counts out): the least of the recent ones
/// is near what a context takes, and one that erred low is forgotten after this many
/// more, never a floor for good.
pub const RECENT: usize = 8;

/// The contexts the process made through the shim, with what each was charged.
pub struct ContextBook {
    /// Per device: serialises context operations, holds the primary's charge.
    devices: [Mutex<DevState>; MAX_DEVICES],
    /// Created (non-primary) contexts: handle -> device and bytes charged.
    created: LiveMap,
}

impl Default for ContextBook {
    fn default() -> Self {
        Self::new()
    }
}

/// A device's context operations, held for the whole measure-call-record sequence.
pub struct DeviceLock<'a> {
    book: &'a ContextBook,
    device: usize,
    state: MutexGuard<'a, DevState>,
}

impl ContextBook {
    pub const fn new() -> Self {
        ContextBook {
            devices: [const {
                Mutex::new(DevState {
                    primary: None,
                    recent: [None; RECENT],
                    next: 0,
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

    /// A context of the process on this device to measure with, if any.
    fn vantage(&self) -> Option<Ctx> {
        self.state.primary.map(|(ctx, _)| ctx).or_else(|| {
            self.book
                .created
                .matching(|c| c.device == self.device)
                .first()
                .map(|&(ctx, _)| ctx)
        })
    }

    /// Runs `call` (which creates a context) and returns its result with the device
    /// memory the context took: free before minus free after, or why it could not be
    /// measured (meaningless when the call failed); and how it was measured. With no
    /// context of the process on the device, the free memory is read without one
    /// (NVML); only if that cannot be done, with a temporary context. If the call runs
    /// out of memory while a temporary context is held for the measurement, the
    /// temporary context is destroyed and the call made again without it: gpucap must
    /// not make a context fail that the device has room for.
    pub fn measure(
        &self,
        drv: &impl CtxDriver,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<u64, Unmeasured>, Vantage) {
        self.measure_in_pool(drv, || None, call)
    }

    /// [`measure`](Self::measure) for a member of a pool: `marks` reads what the pool's
    /// members marked of their traffic on this device (see `budget::traffic`). The
    /// driver's free figure is device-wide, so memory the members gave back while the
    /// context was made would be taken off the context's bytes (and a context charged
    /// short lets the pool over-commit), and memory they allocated meanwhile added to
    /// them. Every member marks a free before its driver call and an allocation around
    /// it: the frees that may fall inside the window (read before and after it) are added
    /// back, the allocations that surely fall inside it (read just inside it) are taken
    /// off. Whatever is unsure stays in: the context is charged more, never less. Memory
    /// of processes outside the pool still shows; none of it can be told apart from the
    /// context's.
    pub fn measure_in_pool(
        &self,
        drv: &impl CtxDriver,
        marks: impl Fn() -> Option<PoolMarks>,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<u64, Unmeasured>, Vantage) {
        let (rc, change, how) = self.measure_marked(drv, None, marks, call);
        (rc, change.map(bytes), how)
    }

    /// [`measure_in_pool`](Self::measure_in_pool) of a call made in context `ctx`, a
    /// context of this device that stays there (a module loaded in it): the free memory
    /// is read with `ctx` pushed current.
    pub fn measure_in(
        &self,
        drv: &impl CtxDriver,
        ctx: Ctx,
        marks: impl Fn() -> Option<PoolMarks>,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<u64, Unmeasured>, Vantage) {
        let (rc, change, how) = self.measure_marked(drv, Some(ctx), marks, call);
        (rc, change.map(bytes), how)
    }

    /// [`measure_in`](Self::measure_in) of a call that may give memory back (a limit
    /// lowered): the change in bytes, negative when the free memory grew. What is
    /// unsure in a pool counts as taken, as there: given back is never overstated.
    pub fn measure_change_in(
        &self,
        drv: &impl CtxDriver,
        ctx: Ctx,
        marks: impl Fn() -> Option<PoolMarks>,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<i128, Unmeasured>, Vantage) {
        self.measure_marked(drv, Some(ctx), marks, call)
    }

    /// The signed change; the callers that charge what a call made take its positive part.
    fn measure_marked(
        &self,
        drv: &impl CtxDriver,
        vantage: Option<Ctx>,
        marks: impl Fn() -> Option<PoolMarks>,
        mut call: impl FnMut() -> u32,
    ) -> (u32, Result<i128, Unmeasured>, Vantage) {
        if marks().is_none() {
            return self.measure_device_wide(drv, vantage, call, None);
        }
        // Read right before the device-wide "before" read and right after the "after"
        // read (`edge`), and right inside them (around the call): the frees counted
        // around the window, the allocations taken off inside it.
        let (mut before, mut after, mut inside) = (None, None, None);
        let mut edge = |first: bool| match first {
            true => before = marks(),
            false => after = marks(),
        };
        let (rc, taken, how) = self.measure_device_wide(
            drv,
            vantage,
            || {
                let first = marks();
                let rc = call();
                inside = first.zip(marks());
                rc
            },
            Some(&mut edge),
        );
        if rc != SUCCESS {
            return (rc, taken, how);
        }
        let given_back = match (before, after) {
            (Some(b), Some(a)) => b.given_back_until(&a),
            (Some(b), None) => b.given_back_until(&b), // cannot be: the device stays the pool's
            _ => 0,
        };
        let allocated = inside.map_or(0, |(first, last)| first.taken_until(&last));
        let taken = taken.map(|t| t + i128::from(given_back) - i128::from(allocated));
        (rc, taken, how)
    }

    /// The driver's free memory before the call minus after it (negative when more was
    /// given back meanwhile than the context took), read with `vantage` pushed, else a
    /// context of the process on this device. `edge`, if any, is called right before the
    /// "before" read (true) and right after the "after" read (false).
    fn measure_device_wide(
        &self,
        drv: &impl CtxDriver,
        vantage: Option<Ctx>,
        call: impl FnMut() -> u32,
        mut edge: Option<&mut dyn FnMut(bool)>,
    ) -> (u32, Result<i128, Unmeasured>, Vantage) {
        if let Some(v) = vantage.or_else(|| self.vantage()) {
            let (rc, taken) = with_vantage(drv, Ok(v), None, call, edge);
            return (rc, taken, Vantage::Context);
        }
        match drv.free_without_context(self.device) {
            Ok(first) => {
                // The first read may have loaded NVML (milliseconds): with an edge to
                // mark, the window starts with a second read, right after it.
                let before = match edge.as_mut() {
                    Some(e) => {
                        e(true);
                        drv.free_without_context(self.device)
                            .map_err(|_| Unmeasured::new(Step::DeviceFreeBefore, UNKNOWN))
                    }
                    None => Ok(first),
                };
                let (rc, taken) = without_context(drv, self.device, before, call, edge);
                (rc, taken, Vantage::Nvml)
            }
            Err(why) => {
                let (vantage, temporary) = match drv.create_floating(self.device) {
                    Ok(t) => (Ok(t), Some(t)),
                    Err(rc) => (Err(Unmeasured::new(Step::Temporary, rc)), None),
                };
                let (rc, taken) = with_vantage(drv, vantage, temporary, call, edge);
                (rc, taken, Vantage::Temporary(why))
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
    pub fn add_created(&self, ctx: Ctx, bytes: u64) {
        self.book.created.insert(
            ctx,
            Charge {
                device: self.device,
                bytes,
            },
        );
    }

    /// A created context is being destroyed: its charge (put it back with
    /// [`restore_created`](Self::restore_created) if the driver refuses).
    pub fn take_created(&self, ctx: Ctx) -> Option<Charge> {
        self.book.created.remove(ctx)
    }

    pub fn restore_created(&self, ctx: Ctx, charge: Charge) {
        self.book.created.insert(ctx, charge);
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

/// A device-wide difference as a charge: memory given back meanwhile never makes it
/// negative.
fn bytes(delta: i128) -> u64 {
    u64::try_from(delta.max(0)).unwrap_or(u64::MAX)
}

/// Measures `call` from NVML's free memory of `device` (`before`, read already).
fn without_context(
    drv: &impl CtxDriver,
    device: usize,
    before: Result<u64, Unmeasured>,
    mut call: impl FnMut() -> u32,
    edge: Option<&mut dyn FnMut(bool)>,
) -> (u32, Result<i128, Unmeasured>) {
    let rc = call();
    if rc != SUCCESS {
        return (rc, Ok(0));
    }
    let after = drv.free_without_context(device);
    if let Some(e) = edge {
        e(false);
    }
    let taken = before.and_then(|b| {
        after
            .map(|a| i128::from(b) - i128::from(a))
            .map_err(|_| Unmeasured::new(Step::DeviceFreeAfter, UNKNOWN))
    });
    (rc, taken)
}

/// Measures `call` with `cuMemGetInfo_v2` asked of `vantage` (a context of the process,
/// or `temporary`, destroyed afterwards); `edge` as in `measure_device_wide`.
fn with_vantage(
    drv: &impl CtxDriver,
    vantage: Result<Ctx, Unmeasured>,
    mut temporary: Option<Ctx>,
    mut call: impl FnMut() -> u32,
    mut edge: Option<&mut dyn FnMut(bool)>,
) -> (u32, Result<i128, Unmeasured>) {
    let mut before = vantage.and_then(|v| {
        if let Some(e) = edge.as_mut() {
            e(true);
        }
        drv.free_with(v)
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
        let after = drv.free_with(v);
        if let Some(e) = edge {
            e(false);
        }
        after
            .map(|a| i128::from(b) - i128::from(a))
            .map_err(|rc| Unmeasured::new(Step::FreeAfter, rc))
    });
    if let Some(t) = temporary {
        drv.destroy(t);
    }
    (rc, taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{MAX_SLOTS, Member, MemberInfo, MemberLocks, POOL_WORDS, Pool};
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicU64;

    /// A device with `free` bytes; each live context takes `per_ctx` (creating one
    /// without room fails with out-of-memory). Contexts live in `live`, by handle, with
    /// an id that is never reused.
    struct Fake {
        free: Cell<u64>,
        per_ctx: u64,
        next: Cell<Ctx>,
        log: RefCell<Vec<String>>,
        active: Cell<bool>,
        live: RefCell<BTreeMap<Ctx, u64>>,
        /// Error of cuMemGetInfo_v2 from the n-th query on (0: never).
        fail_free_from: Cell<usize>,
        queries: Cell<usize>,
        /// Whether `exists` can tell.
        can_tell: bool,
        /// Whether the free memory can be read without a context (NVML); the n-th
        /// such read from which it fails (0: never).
        nvml: bool,
        fail_nvml_from: Cell<usize>,
        nvml_reads: Cell<usize>,
        /// Runs inside the first NVML read (as NVML loads).
        on_first_nvml: RefCell<Option<Box<dyn FnOnce()>>>,
    }

    impl Fake {
        fn new(free: u64, per_ctx: u64) -> Fake {
            Fake {
                free: Cell::new(free),
                per_ctx,
                next: Cell::new(100),
                log: RefCell::default(),
                active: Cell::new(false),
                live: RefCell::default(),
                fail_free_from: Cell::new(0),
                queries: Cell::new(0),
                can_tell: true,
                nvml: false,
                fail_nvml_from: Cell::new(0),
                nvml_reads: Cell::new(0),
                on_first_nvml: RefCell::default(),
            }
        }
        /// What the program's own create call does: OOM without room.
        fn make(&self) -> Result<Ctx, u32> {
            if self.free.get() < self.per_ctx {
                return Err(OUT_OF_MEMORY);
            }
            self.free.set(self.free.get() - self.per_ctx);
            self.next.set(self.next.get() + 1);
            let c = self.next.get();
            self.live.borrow_mut().insert(c, c * 7);
            Ok(c)
        }
        fn call(&self) -> u32 {
            match self.make() {
                Ok(_) => SUCCESS,
                Err(rc) => rc,
            }
        }
        fn drop_ctx(&self, ctx: Ctx) {
            if self.live.borrow_mut().remove(&ctx).is_some() {
                self.free.set(self.free.get() + self.per_ctx);
            }
        }
    }

    impl CtxDriver for Fake {
        fn free_with(&self, ctx: Ctx) -> Result<u64, u32> {
            self.log.borrow_mut().push(format!("free@{ctx}"));
            self.queries.set(self.queries.get() + 1);
            let from = self.fail_free_from.get();
            if from != 0 && self.queries.get() >= from {
                return Err(201);
            }
            Ok(self.free.get())
        }
        fn free_without_context(&self, device: usize) -> Result<u64, String> {
            if !self.nvml {
                return Err("no NVML here".into());
            }
            self.log.borrow_mut().push(format!("nvml@{device}"));
            self.nvml_reads.set(self.nvml_reads.get() + 1);
            if let Some(f) = self.on_first_nvml.borrow_mut().take() {
                f();
            }
            let from = self.fail_nvml_from.get();
            if from != 0 && self.nvml_reads.get() >= from {
                return Err("NVML failed".into());
            }
            Ok(self.free.get())
        }
        fn create_floating(&self, _device: usize) -> Result<Ctx, u32> {
            let c = self.make()?;
            self.log.borrow_mut().push(format!("temp {c}"));
            Ok(c)
        }
        fn destroy(&self, ctx: Ctx) {
            self.drop_ctx(ctx);
            self.log.borrow_mut().push(format!("destroy {ctx}"));
        }
        fn primary_active(&self, _device: usize) -> Option<bool> {
            Some(self.active.get())
        }
        fn id(&self, ctx: Ctx) -> Option<u64> {
            self.live.borrow().get(&ctx).copied()
        }
        fn exists(&self, ctx: Ctx, id: Option<u64>) -> Option<bool> {
            if !self.can_tell {
                return None;
            }
            Some(
                self.id(ctx)
                    .is_some_and(|now| id.is_none_or(|was| was == now)),
            )
        }
    }

    fn made(drv: &Fake) -> Ctx {
        drv.next.get()
    }

    #[test]
    fn a_call_in_a_given_context_is_measured_there_not_with_nvml_or_a_temporary() {
        // A module loaded in context 55, one the book never saw (made outside the shim):
        // its memory is read with 55 pushed, even where NVML is there.
        let book = ContextBook::new();
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        let lock = book.lock(0).unwrap();
        let (rc, taken, how) = lock.measure_in(
            &drv,
            55,
            || None,
            || {
                drv.free.set(drv.free.get() - 2048);
                SUCCESS
            },
        );
        assert_eq!((rc, taken, how), (SUCCESS, Ok(2048), Vantage::Context));
        assert_eq!(*drv.log.borrow(), ["free@55", "free@55"]);
        assert!(drv.live.borrow().is_empty(), "no temporary context");
    }

    #[test]
    fn first_context_is_measured_with_nvml_and_no_other_context() {
        let book = ContextBook::new();
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        let mut lock = book.lock(2).unwrap();
        let mut calls = 0;
        let (rc, taken, how) = lock.measure(&drv, || {
            calls += 1;
            drv.call()
        });
        assert_eq!((rc, taken, how), (SUCCESS, Ok(300), Vantage::Nvml));
        assert_eq!(calls, 1);
        assert_eq!(*drv.log.borrow(), ["nvml@2", "nvml@2"]);
        assert_eq!(drv.live.borrow().len(), 1, "no context but the program's");
        // The next one is measured from the first (cuMemGetInfo_v2), not NVML.
        let ctx = made(&drv);
        lock.set_primary(ctx, 300);
        drv.log.borrow_mut().clear();
        let (_, taken, how) = lock.measure(&drv, || drv.call());
        assert_eq!((taken, how), (Ok(300), Vantage::Context));
        assert_eq!(
            *drv.log.borrow(),
            [format!("free@{ctx}"), format!("free@{ctx}")]
        );
    }

    /// Slot locks for the members of one test's pool (a "process" per id).
    struct Locks {
        owner: &'static std::sync::Mutex<Vec<u32>>,
        id: u32,
    }

    impl MemberLocks for Locks {
        fn try_take(&self, s: usize) -> bool {
            let mut o = self.owner.lock().unwrap();
            (o[s] == 0).then(|| o[s] = self.id).is_some()
        }
        fn give_back(&self, s: usize) {
            let mut o = self.owner.lock().unwrap();
            if o[s] == self.id {
                o[s] = 0;
            }
        }
        fn held(&self, s: usize) -> bool {
            self.owner.lock().unwrap()[s] != 0
        }
    }

    /// `n` members of a fresh pool, each with GPU 0 registered (cap 1 MB), and the
    /// slot owners (zero an owner to kill it).
    fn members(n: u32) -> (Vec<Member<'static>>, &'static std::sync::Mutex<Vec<u32>>) {
        let words: &'static [AtomicU64] =
            Box::leak((0..POOL_WORDS).map(|_| AtomicU64::new(0)).collect());
        let pool = Pool::create(words, 1, 0).unwrap();
        let owner = Box::leak(Box::new(std::sync::Mutex::new(vec![0u32; MAX_SLOTS])));
        let all = (1..=n)
            .map(|id| {
                let locks = Box::leak(Box::new(Locks { owner, id }));
                let m = Member::join(pool, locks, &MemberInfo::default()).unwrap();
                m.register_gpu(0, &[7; 16], Some(1_000_000)).unwrap();
                m
            })
            .collect();
        (all, owner)
    }

    /// A pool member's context is measured by `a`, its window bracketed by the
    /// pool's free marks.
    fn in_pool(
        a: &Member<'static>,
        drv: &Fake,
        call: impl FnMut() -> u32,
    ) -> (u32, Result<u64, Unmeasured>, Vantage) {
        let book = ContextBook::new();
        let lock = book.lock(0).unwrap();
        lock.measure_in_pool(drv, || a.marks(0), call)
    }

    /// Another member's free whose driver call falls inside the window and whose credit
    /// comes after it: added back (the pool's `used` did not go down in the window).
    #[test]
    fn a_free_credited_after_the_window_does_not_make_a_context_short() {
        let (m, _) = members(2);
        let (a, b) = (&m[0], &m[1]);
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        b.reserve(0, 500).unwrap();
        let (rc, taken, _) = in_pool(a, &drv, || {
            assert!(b.announce_free(0, 200));
            drv.free.set(drv.free.get() + 200); // B's driver free
            drv.call()
        });
        b.complete_free(0, 200);
        assert_eq!((rc, taken), (SUCCESS, Ok(300)));
        assert_eq!(b.usage(0), Some((300, Some(1_000_000), 300)));

        // Announced before the window, freed by the driver inside it, credited after.
        assert!(b.announce_free(0, 100));
        let (_, taken, _) = in_pool(a, &drv, || {
            drv.free.set(drv.free.get() + 100);
            drv.call()
        });
        b.complete_free(0, 100);
        assert_eq!(taken, Ok(300));
    }

    /// A reservation inside the window whose driver allocation comes after it does not
    /// hide another member's free made inside it (a net change of `used` would: +700
    /// - 200 is no decrease). What the other members allocate in the window is left in.
    #[test]
    fn a_reservation_in_the_window_does_not_hide_another_members_free() {
        let (m, _) = members(3);
        let (a, b, c) = (&m[0], &m[1], &m[2]);
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        b.reserve(0, 500).unwrap();
        let (rc, taken, _) = in_pool(a, &drv, || {
            c.reserve(0, 700).unwrap(); // C's driver allocation comes after the window
            assert!(b.announce_free(0, 200));
            drv.free.set(drv.free.get() + 200);
            b.complete_free(0, 200);
            drv.call()
        });
        assert_eq!((rc, taken), (SUCCESS, Ok(300)));
        // An allocation made inside the window is left in: charged more, never less.
        let (_, taken, _) = in_pool(a, &drv, || {
            c.reserve(0, 50).unwrap();
            drv.free.set(drv.free.get() - 50);
            drv.call()
        });
        assert_eq!(taken, Ok(350));
        // Without a pool the same traffic is counted (nothing can tell it apart).
        let book = ContextBook::new();
        let (_, taken, _) = book.lock(1).unwrap().measure(&drv, || {
            drv.free.set(drv.free.get() + 200);
            drv.call()
        });
        assert_eq!(taken, Ok(100));
    }

    /// Member `m` allocates `bytes` as the hooks do: reserved, marked started, the
    /// driver (the fake's free memory), marked made.
    fn allocate(m: &Member<'static>, drv: &Fake, bytes: u64) {
        m.reserve(0, bytes).unwrap();
        assert!(m.alloc_started(0, bytes));
        drv.free.set(drv.free.get() - bytes);
        m.alloc_ended(0, bytes, true);
    }

    /// ...and frees them: announced, the driver, credited.
    fn free(m: &Member<'static>, drv: &Fake, bytes: u64) {
        assert!(m.announce_free(0, bytes));
        drv.free.set(drv.free.get() + bytes);
        m.complete_free(0, bytes);
    }

    /// A member that frees and allocates again inside the window (a churning
    /// allocator) leaves the context's charge as it is: each of its frees is added back,
    /// each of its allocations taken off (a charge of the frees alone was seen at 1.67
    /// GiB for a 16 MiB context under `pool::thirty_two_members...`).
    #[test]
    fn a_member_churning_inside_the_window_leaves_the_charge_as_it_is() {
        let (m, _) = members(2);
        let (a, b) = (&m[0], &m[1]);
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        allocate(b, &drv, 800);
        let (rc, taken, _) = in_pool(a, &drv, || {
            for _ in 0..10 {
                free(b, &drv, 800);
                allocate(b, &drv, 800);
            }
            free(b, &drv, 800);
            drv.call()
        });
        assert_eq!((rc, taken), (SUCCESS, Ok(300)));
        assert_eq!(b.usage(0).map(|u| u.2), Some(0));
    }

    /// The window starts after NVML is loaded (its first read, milliseconds on a real
    /// GPU): what the members give back while it loads is not added back.
    #[test]
    fn frees_while_nvml_loads_are_outside_the_window() {
        let m: &'static [Member<'static>] = Box::leak(members(2).0.into_boxed_slice());
        let mut fake = Fake::new(10_000, 300);
        fake.nvml = true;
        let drv: &'static Fake = Box::leak(Box::new(fake));
        allocate(&m[1], drv, 800);
        *drv.on_first_nvml.borrow_mut() = Some(Box::new(|| free(&m[1], drv, 800)));
        let (rc, taken, how) = in_pool(&m[0], drv, || drv.call());
        assert_eq!((rc, taken, how), (SUCCESS, Ok(300), Vantage::Nvml));
        assert_eq!(drv.nvml_reads.get(), 3, "read again once loaded");
    }

    /// Only allocations surely made inside the window are taken off: one whose driver
    /// call came before it (marked made inside it), one whose driver call comes after it,
    /// and one the driver refused are not.
    #[test]
    fn allocations_not_surely_inside_the_window_are_never_taken_off() {
        let (m, _) = members(3);
        let (a, b, c) = (&m[0], &m[1], &m[2]);
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        // Reserved, started and allocated before the window, marked made inside it.
        b.reserve(0, 200).unwrap();
        assert!(b.alloc_started(0, 200));
        drv.free.set(drv.free.get() - 200);
        let (_, taken, _) = in_pool(a, &drv, || {
            b.alloc_ended(0, 200, true);
            // Started inside, allocated by the driver after the window.
            c.reserve(0, 100).unwrap();
            assert!(c.alloc_started(0, 100));
            // Started and refused inside.
            c.reserve(0, 50).unwrap();
            assert!(c.alloc_started(0, 50));
            c.alloc_ended(0, 50, false);
            drv.call()
        });
        assert_eq!(taken, Ok(300));
        drv.free.set(drv.free.get() - 100);
        c.alloc_ended(0, 100, true);
        // Words that cannot be (`made` ahead of `started`: another process wrote them):
        // nothing of that slot is taken off.
        c.alloc_ended(0, 1_000, true);
        let (_, taken, _) = in_pool(a, &drv, || {
            c.reserve(0, 40).unwrap();
            assert!(c.alloc_started(0, 40));
            drv.free.set(drv.free.get() - 40);
            c.alloc_ended(0, 40, true);
            drv.call()
        });
        assert_eq!(taken, Ok(340));
    }

    /// A free the driver refused still counts (more, never less); a free announced by a
    /// member that then died is not added back to later contexts (its slot is not held),
    /// and is cleared when its share is taken back; a failed call charges nothing.
    #[test]
    fn withdrawn_and_dead_members_announcements() {
        let (m, owner) = members(3);
        let (a, b, c) = (&m[0], &m[1], &m[2]);
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        b.reserve(0, 500).unwrap();
        let (_, taken, _) = in_pool(a, &drv, || {
            assert!(b.announce_free(0, 200));
            b.withdraw_free(0, 200);
            drv.call()
        });
        assert_eq!(taken, Ok(500));
        assert!(b.announce_free(0, 400));
        owner.lock().unwrap()[b.slot()] = 0; // B dies inside its free
        let (_, taken, _) = in_pool(a, &drv, || drv.call());
        assert_eq!(
            taken,
            Ok(300),
            "a dead member's announcement is not counted"
        );
        assert_eq!(c.sweep(), 1);
        assert_eq!(a.usage(0).map(|u| u.0), Some(0), "its share taken back");
        let (rc, taken, _) = in_pool(a, &drv, || {
            assert!(c.announce_free(0, 100));
            999
        });
        assert_eq!((rc, taken), (999, Ok(0)));
    }

    /// With NVML, a device with room for exactly one context gets it, measured.
    #[test]
    fn with_nvml_room_for_one_context_is_enough() {
        let book = ContextBook::new();
        let mut drv = Fake::new(500, 300);
        drv.nvml = true;
        let lock = book.lock(0).unwrap();
        let (rc, taken, how) = lock.measure(&drv, || drv.call());
        assert_eq!((rc, taken, how), (SUCCESS, Ok(300), Vantage::Nvml));
        // A call that fails reads NVML once and charges nothing.
        drv.log.borrow_mut().clear();
        let (rc, taken, _) = lock.measure(&drv, || 999);
        assert_eq!((rc, taken), (999, Ok(0)));
        assert_eq!(*drv.log.borrow(), ["nvml@0"]);
    }

    #[test]
    fn nvml_failing_after_the_call_is_never_a_charge_of_zero() {
        let book = ContextBook::new();
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        drv.fail_nvml_from.set(2);
        let lock = book.lock(0).unwrap();
        let (rc, taken, how) = lock.measure(&drv, || drv.call());
        assert_eq!((rc, how), (SUCCESS, Vantage::Nvml));
        let why = taken.unwrap_err();
        assert_eq!(
            why,
            Unmeasured {
                step: Step::DeviceFreeAfter,
                rc: UNKNOWN
            }
        );
        assert!(why.to_string().contains("NVML"), "{why}");
        assert_eq!(verdict(taken, true), Verdict::Refuse(UNKNOWN));
    }

    #[test]
    fn without_nvml_the_first_context_is_measured_with_a_temporary_one() {
        let book = ContextBook::new();
        let drv = Fake::new(10_000, 300);
        let mut lock = book.lock(0).unwrap();
        assert!(!lock.primary_active(&drv));
        let (rc, taken, how) = lock.measure(&drv, || drv.call());
        assert_eq!(how, Vantage::Temporary("no NVML here".into()));
        let ctx = made(&drv);
        assert_eq!((rc, taken), (SUCCESS, Ok(300)));
        assert_eq!(
            *drv.log.borrow(),
            ["temp 101", "free@101", "free@101", "destroy 101"]
        );
        lock.set_primary(ctx, 300);
        assert!(lock.primary_active(&drv));
        // The next context is measured from the primary: no temporary one.
        drv.log.borrow_mut().clear();
        let (_, taken, _) = lock.measure(&drv, || drv.call());
        let c2 = made(&drv);
        assert_eq!(taken, Ok(300));
        assert_eq!(
            *drv.log.borrow(),
            [format!("free@{ctx}"), format!("free@{ctx}")]
        );
        lock.add_created(c2, 300);
        assert_eq!(book.created_device(c2), Some(0));
        assert_eq!(
            lock.take_primary(),
            Some(Charge {
                device: 0,
                bytes: 300
            })
        );
        assert_eq!(lock.take_primary(), None);
        // With the primary gone, the created context is the vantage.
        drv.log.borrow_mut().clear();
        let _ = lock.measure(&drv, || drv.call());
        assert_eq!(drv.log.borrow()[0], format!("free@{c2}"));
        assert_eq!(
            lock.take_created(c2),
            Some(Charge {
                device: 0,
                bytes: 300
            })
        );
        assert_eq!(book.created_device(c2), None);
    }

    #[test]
    fn nvml_failing_before_the_call_falls_back_to_a_temporary_context() {
        let book = ContextBook::new();
        let mut drv = Fake::new(10_000, 300);
        drv.nvml = true;
        drv.fail_nvml_from.set(1);
        let lock = book.lock(0).unwrap();
        let (rc, taken, how) = lock.measure(&drv, || drv.call());
        assert_eq!(
            (rc, taken, how),
            (SUCCESS, Ok(300), Vantage::Temporary("NVML failed".into()))
        );
        assert_eq!(
            *drv.log.borrow(),
            ["nvml@0", "temp 101", "free@101", "free@101", "destroy 101"]
        );
    }

    #[test]
    fn a_failed_call_leaves_nothing_behind() {
        let book = ContextBook::new();
        let drv = Fake::new(10_000, 300);
        let lock = book.lock(3).unwrap();
        let (rc, _, _) = lock.measure(&drv, || 999);
        assert_eq!(rc, 999);
        assert_eq!(
            drv.free.get(),
            10_000,
            "the temporary context was destroyed"
        );
        assert!(book.lock(MAX_DEVICES).is_none());
    }

    #[test]
    fn memory_given_back_meanwhile_never_makes_a_negative_charge() {
        let book = ContextBook::new();
        let drv = Fake::new(10_000, 0);
        let lock = book.lock(0).unwrap();
        let (_, taken, _) = lock.measure(&drv, || {
            drv.free.set(20_000);
            SUCCESS
        });
        assert_eq!(taken, Ok(0));
    }

    #[test]
    fn room_for_one_context_only_the_call_is_made_without_the_temporary_one() {
        let book = ContextBook::new();
        let drv = Fake::new(500, 300);
        let lock = book.lock(0).unwrap();
        let mut calls = 0;
        let (rc, taken, _) = lock.measure(&drv, || {
            calls += 1;
            drv.call()
        });
        assert_eq!(rc, SUCCESS, "the device has room for the program's context");
        assert_eq!(calls, 2);
        assert_eq!(
            drv.live.borrow().len(),
            1,
            "only the program's context is left"
        );
        let why = taken.unwrap_err();
        assert_eq!(
            why,
            Unmeasured {
                step: Step::NoRoom,
                rc: OUT_OF_MEMORY
            }
        );
        assert!(
            why.to_string()
                .contains("no room for the temporary context"),
            "{why}"
        );
        assert_eq!(verdict(taken, true), Verdict::Refuse(OUT_OF_MEMORY));
        assert_eq!(verdict(taken, false), Verdict::Uncounted);
        assert_eq!(verdict(Ok(300), true), Verdict::Charge(300));

        // No room at all: the temporary context fails, so does the call.
        let drv = Fake::new(100, 300);
        let (rc, taken, _) = lock.measure(&drv, || drv.call());
        assert_eq!(rc, OUT_OF_MEMORY);
        assert_eq!(taken.unwrap_err().step, Step::Temporary);
    }

    #[test]
    fn a_query_that_fails_is_never_a_charge_of_zero() {
        let book = ContextBook::new();
        for (from, step) in [(1, Step::FreeBefore), (2, Step::FreeAfter)] {
            let drv = Fake::new(10_000, 300);
            drv.fail_free_from.set(from);
            let lock = book.lock(1).unwrap();
            let (rc, taken, _) = lock.measure(&drv, || drv.call());
            assert_eq!(rc, SUCCESS);
            assert_eq!(taken, Err(Unmeasured { step, rc: 201 }));
            assert_eq!(verdict(taken, true), Verdict::Refuse(201));
            assert!(taken.unwrap_err().to_string().contains("error 201"));
            assert_eq!(drv.live.borrow().len(), 1, "the temporary context is gone");
        }
    }

    #[test]
    fn a_detach_credits_only_when_the_driver_says_the_context_is_gone() {
        let book = ContextBook::new();
        let drv = Fake::new(10_000, 300);
        let mut lock = book.lock(0).unwrap();
        let ctx = drv.make().unwrap();
        lock.add_created(ctx, 300);
        let id = drv.id(ctx);
        // Another reference holds it.
        assert_eq!(lock.after_release(&drv, ctx, id), Ending::Alive);
        assert_eq!(book.created_device(ctx), Some(0));
        // The last reference went: the driver no longer knows it.
        drv.drop_ctx(ctx);
        assert_eq!(
            lock.after_release(&drv, ctx, id),
            Ending::Gone(Some(Charge {
                device: 0,
                bytes: 300
            }))
        );
        assert_eq!(book.created_device(ctx), None);
        // A handle the driver gave to a new context is not the old one.
        drv.live.borrow_mut().insert(ctx, 1);
        assert_eq!(lock.after_release(&drv, ctx, id), Ending::Gone(None));

        // The primary context: its state says.
        let p = drv.make().unwrap();
        lock.set_primary(p, 300);
        drv.active.set(true);
        assert_eq!(lock.after_release(&drv, p, drv.id(p)), Ending::Alive);
        drv.active.set(false);
        assert_eq!(
            lock.after_release(&drv, p, drv.id(p)),
            Ending::Gone(Some(Charge {
                device: 0,
                bytes: 300
            }))
        );

        // A driver that cannot say: the charge is kept.
        let mut mute = Fake::new(10_000, 300);
        mute.can_tell = false;
        let c = mute.make().unwrap();
        lock.add_created(c, 300);
        mute.drop_ctx(c);
        assert_eq!(lock.after_release(&mute, c, None), Ending::Unknown);
        assert_eq!(book.created_device(c), Some(0));
    }

    #[test]
    fn the_next_context_is_expected_to_take_the_least_a_context_took_on_its_device() {
        let book = ContextBook::new();
        assert_eq!(book.lock(1).unwrap().expected(), 0, "nothing measured yet");
        book.lock(1).unwrap().learn(16 << 20);
        assert_eq!(book.lock(1).unwrap().expected(), 16 << 20);
        assert_eq!(book.lock(0).unwrap().expected(), 0, "per device");
        book.lock(1).unwrap().learn(8 << 20);
        assert_eq!(book.lock(1).unwrap().expected(), 8 << 20, "a lower one");
        // One measured high (others' frees counted in) does not become what the next
        // context reserves first.
        book.lock(1).unwrap().learn(2400 << 20);
        assert_eq!(
            book.lock(1).unwrap().expected(),
            8 << 20,
            "the least measured"
        );
        // Beside a pool: the least of this process's and the pool's.
        assert_eq!(book.lock(1).unwrap().expected_beside(0), 8 << 20);
        assert_eq!(book.lock(1).unwrap().expected_beside(6 << 20), 6 << 20);
        assert_eq!(book.lock(1).unwrap().expected_beside(9 << 20), 8 << 20);
        assert_eq!(book.lock(0).unwrap().expected_beside(300 << 20), 300 << 20);
    }

    #[test]
    fn a_measurement_that_erred_low_is_forgotten_zero_included() {
        let book = ContextBook::new();
        book.lock(0).unwrap().learn(300 << 20);
        assert!(!book.lock(0).unwrap().expectation_settled());
        // Others' allocations outside the pool inside the window: measured at 0.
        book.lock(0).unwrap().learn(0);
        assert_eq!(
            book.lock(0).unwrap().expected(),
            0,
            "a measurement like any"
        );
        for _ in 0..RECENT {
            book.lock(0).unwrap().learn(300 << 20);
        }
        assert_eq!(
            book.lock(0).unwrap().expected(),
            300 << 20,
            "the low one forgotten after {RECENT} more: no floor that only erodes"
        );
        assert!(book.lock(0).unwrap().expectation_settled());
    }

    #[test]
    fn a_first_context_measured_high_does_not_outweigh_the_pools_least() {
        // This process's first context was measured at 2.35 GiB (other members freed
        // inside its window); the pool's members measured 300 MiB: the next reserves 300.
        let book = ContextBook::new();
        book.lock(0).unwrap().learn(2400 << 20);
        assert_eq!(book.lock(0).unwrap().expected_beside(300 << 20), 300 << 20);
    }
}
