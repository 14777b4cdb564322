//! Context overhead: a CUDA context takes device memory that no allocation call shows
//! (about 0.5 GiB on an H100: the context's own structures, its local memory, printf
//! and malloc heaps). The shim charges what each context really took, measured as the
//! driver's free memory on that device just before and just after the driver created
//! it, and credits it when the context goes away.
//!
//! Measuring needs a context on the device to ask `cuMemGetInfo_v2` with (a
//! "vantage"): one the process already has there (its primary context, or a context
//! it created), pushed for the query and popped again; for the very first context on
//! a device, a temporary context is created, kept floating (not current) while the
//! new context is made, and destroyed afterwards. That temporary context costs one
//! context creation, once per device per process.
//!
//! Accuracy: `cuMemGetInfo_v2` is device-wide, so memory that anything else takes or
//! gives back on the device between the two reads (another process, or another thread
//! of this one allocating at that moment) is counted in, or out of, the context's
//! charge. Context operations are serialised per device, so two contexts created at
//! once are not mixed up; allocations are not held up. The driver also takes device
//! memory later for a context (modules loaded lazily, a grown malloc heap): that is
//! not measured.
//!
//! This module is safe Rust over a [`CtxDriver`]; the hooks pass the real driver.

use std::sync::{Mutex, MutexGuard};

use crate::config::MAX_DEVICES;
use crate::ledger::{Charge, LiveMap};

/// A `CUcontext`, as an integer.
pub type Ctx = u64;

/// What measuring needs from the driver.
pub trait CtxDriver {
    /// The driver's free memory on `ctx`'s device, asked with `ctx` pushed current.
    fn free_with(&self, ctx: Ctx) -> Option<u64>;
    /// Creates a context on `device` and leaves it not current (a temporary vantage).
    fn create_floating(&self, device: usize) -> Option<Ctx>;
    /// Destroys a context made by `create_floating`.
    fn destroy(&self, ctx: Ctx);
    /// Whether `device`'s primary context is active (retained at least once).
    fn primary_active(&self, device: usize) -> Option<bool>;
}

#[derive(Debug, Default, Clone, Copy)]
struct DevState {
    /// The primary context's handle and the bytes charged for it, while active.
    primary: Option<(Ctx, u64)>,
}

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
            devices: [const { Mutex::new(DevState { primary: None }) }; MAX_DEVICES],
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

    /// Runs `call` (which creates a context; `ok` says whether it did) and returns its
    /// result with the device memory the context took: free before minus free after,
    /// or None when it could not be measured.
    pub fn measure<R>(
        &self,
        drv: &impl CtxDriver,
        call: impl FnOnce() -> R,
        ok: impl Fn(&R) -> bool,
    ) -> (R, Option<u64>) {
        let (vantage, temporary) = match self.vantage() {
            Some(v) => (Some(v), None),
            None => {
                let t = drv.create_floating(self.device);
                (t, t)
            }
        };
        let before = vantage.and_then(|v| drv.free_with(v));
        let result = call();
        let after = if ok(&result) {
            vantage.and_then(|v| drv.free_with(v))
        } else {
            None
        };
        if let Some(t) = temporary {
            drv.destroy(t);
        }
        let taken = before.zip(after).map(|(b, a)| b.saturating_sub(a));
        (result, taken)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};

    /// A device with `free` bytes; each live context takes `per_ctx`.
    struct Fake {
        free: Cell<u64>,
        per_ctx: u64,
        next: Cell<Ctx>,
        log: RefCell<Vec<String>>,
        active: bool,
    }

    impl Fake {
        fn new(free: u64, per_ctx: u64) -> Fake {
            Fake {
                free: Cell::new(free),
                per_ctx,
                next: Cell::new(100),
                log: RefCell::default(),
                active: false,
            }
        }
        fn make(&self) -> Ctx {
            self.free.set(self.free.get() - self.per_ctx);
            self.next.set(self.next.get() + 1);
            self.next.get()
        }
    }

    impl CtxDriver for Fake {
        fn free_with(&self, ctx: Ctx) -> Option<u64> {
            self.log.borrow_mut().push(format!("free@{ctx}"));
            Some(self.free.get())
        }
        fn create_floating(&self, _device: usize) -> Option<Ctx> {
            let c = self.make();
            self.log.borrow_mut().push(format!("temp {c}"));
            Some(c)
        }
        fn destroy(&self, ctx: Ctx) {
            self.free.set(self.free.get() + self.per_ctx);
            self.log.borrow_mut().push(format!("destroy {ctx}"));
        }
        fn primary_active(&self, _device: usize) -> Option<bool> {
            Some(self.active)
        }
    }

    #[test]
    fn first_context_is_measured_with_a_temporary_one() {
        let book = ContextBook::new();
        let drv = Fake::new(10_000, 300);
        let mut lock = book.lock(0).unwrap();
        assert!(!lock.primary_active(&drv));
        let (ctx, taken) = lock.measure(&drv, || drv.make(), |_| true);
        assert_eq!(taken, Some(300));
        assert_eq!(
            *drv.log.borrow(),
            ["temp 101", "free@101", "free@101", "destroy 101"]
        );
        lock.set_primary(ctx, 300);
        assert!(lock.primary_active(&drv));
        // The next context is measured from the primary: no temporary one.
        drv.log.borrow_mut().clear();
        let (c2, taken) = lock.measure(&drv, || drv.make(), |_| true);
        assert_eq!(taken, Some(300));
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
        lock.measure(&drv, || drv.make(), |_| true);
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
    fn a_failed_call_measures_nothing() {
        let book = ContextBook::new();
        let drv = Fake::new(10_000, 300);
        let lock = book.lock(3).unwrap();
        let (rc, taken) = lock.measure(&drv, || 2u32, |rc| *rc == 0);
        assert_eq!((rc, taken), (2, None));
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
        let (_, taken) = lock.measure(&drv, || drv.free.set(20_000), |_| true);
        assert_eq!(taken, Some(0));
    }
}
