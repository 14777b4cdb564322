//! Modules: the device memory a module takes when the driver loads it (its code and its
//! `__device__` globals: an H200 with driver 580 took 2 MiB for a module holding a
//! 1 MiB global, and gave it back at `cuModuleUnload`), which no allocation call shows.
//! The hooks measure it around the load as a context is measured (`contexts`), charge
//! it to the device of the context it was loaded in, and credit it at `cuModuleUnload`
//! or once that context is gone (the driver unloads a context's modules with it). This
//! book keeps which module holds what. Loads and unloads are rare: a lock and a list.

use std::sync::{Mutex, MutexGuard};

use crate::contexts::Ctx;
use crate::ledger::Charge;

/// A `CUmodule`, as an integer.
pub type Module = u64;

/// What a loaded module was charged, and the context it lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    pub ctx: Ctx,
    /// The driver's unique id of that context (`cuCtxGetId`), if it gave one: a handle
    /// the driver hands out again for a later context is not taken for this one.
    pub ctx_id: Option<u64>,
    /// Whether that context is the device's primary context: gone when the primary is
    /// inactive (its last release, a reset), though its handle stays.
    pub primary: bool,
    pub charge: Charge,
}

/// The modules loaded through the shim that hold a charge.
pub struct ModuleBook {
    loaded: Mutex<Vec<(Module, Loaded)>>,
}

impl Default for ModuleBook {
    fn default() -> Self {
        Self::new()
    }
}

impl ModuleBook {
    pub const fn new() -> Self {
        ModuleBook {
            loaded: Mutex::new(Vec::new()),
        }
    }

    fn list(&self) -> MutexGuard<'_, Vec<(Module, Loaded)>> {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `module`, charged as `loaded` says (a handle seen again replaces the old
    /// entry: the driver unloaded that module behind the book, with its context).
    pub fn add(&self, module: Module, loaded: Loaded) {
        let mut l = self.list();
        l.retain(|(m, _)| *m != module);
        l.push((module, loaded));
    }

    /// Takes `module` out before the driver unloads it (None: not charged here).
    pub fn take(&self, module: Module) -> Option<Loaded> {
        let mut l = self.list();
        let i = l.iter().position(|(m, _)| *m == module)?;
        Some(l.swap_remove(i).1)
    }

    /// Puts back what [`take`](Self::take) gave, the driver having refused the unload.
    pub fn restore(&self, module: Module, loaded: Loaded) {
        self.add(module, loaded);
    }

    /// The bytes the modules loaded on `device` hold.
    pub fn bytes_on(&self, device: usize) -> u64 {
        self.list()
            .iter()
            .filter(|(_, l)| l.charge.device == device)
            .map(|(_, l)| l.charge.bytes)
            .sum()
    }

    /// Takes out the modules on `device` whose context `gone` says no longer exists
    /// (the driver unloaded them with it): their charges, to credit.
    pub fn take_gone(&self, device: usize, gone: impl Fn(&Loaded) -> bool) -> Vec<Charge> {
        let mut l = self.list();
        let mut out = Vec::new();
        l.retain(|(_, m)| {
            let ended = m.charge.device == device && gone(m);
            if ended {
                out.push(m.charge);
            }
            !ended
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(ctx: Ctx, device: usize, bytes: u64) -> Loaded {
        Loaded {
            ctx,
            ctx_id: Some(ctx + 100),
            primary: false,
            charge: Charge { device, bytes },
        }
    }

    #[test]
    fn a_module_is_taken_once_and_restored_if_the_driver_refused() {
        let b = ModuleBook::new();
        b.add(7, loaded(1, 0, 2 << 20));
        assert_eq!(b.bytes_on(0), 2 << 20);
        let l = b.take(7).unwrap();
        assert_eq!(b.take(7), None, "taken twice");
        assert_eq!(b.bytes_on(0), 0);
        b.restore(7, l);
        assert_eq!(b.take(7), Some(l));
        assert_eq!(b.take(8), None, "never loaded here");
    }

    #[test]
    fn a_handle_loaded_again_replaces_its_old_entry() {
        let b = ModuleBook::new();
        b.add(7, loaded(1, 0, 4 << 20));
        b.add(7, loaded(2, 0, 2 << 20));
        assert_eq!(b.bytes_on(0), 2 << 20);
        assert_eq!(b.take(7).map(|l| l.ctx), Some(2));
    }

    #[test]
    fn the_modules_of_a_gone_context_are_taken_on_their_device_only() {
        let b = ModuleBook::new();
        b.add(1, loaded(10, 0, 2 << 20));
        b.add(2, loaded(10, 0, 4 << 20));
        b.add(3, loaded(11, 0, 8 << 20));
        b.add(4, loaded(10, 1, 16 << 20));
        let mut credited = b.take_gone(0, |l| l.ctx == 10);
        credited.sort_by_key(|c| c.bytes);
        assert_eq!(
            credited,
            vec![
                Charge {
                    device: 0,
                    bytes: 2 << 20
                },
                Charge {
                    device: 0,
                    bytes: 4 << 20
                }
            ]
        );
        assert_eq!((b.bytes_on(0), b.bytes_on(1)), (8 << 20, 16 << 20));
        assert!(b.take_gone(0, |l| l.ctx == 10).is_empty());
    }
}
