//! Modules: the device memory a module takes when the driver loads it (its code and its
//! `__device__` globals: an H200 with driver 580 took 2 MiB for a module holding a
//! 1 MiB global, and gave it back at `cuModuleUnload`), which no allocation call shows.
//! The hooks measure it around the load as a context is measured (`contexts`), charge
//! it to the device of the context it was loaded in, and credit it at `cuModuleUnload`
//! or once that context is gone (the driver unloads a context's modules with it). Which
//! module holds what is kept in a [`ResidentCharges`].

use crate::residents::ResidentCharges;

/// A `CUmodule`, as an integer.
pub type Module = u64;

/// The modules loaded through the shim that hold a charge.
pub type ModuleBook = ResidentCharges<Module>;
