//! Residents: the memory the driver takes on its own, without an allocation call, and
//! holds for a context until something ends it. Every kind shares this home:
//!
//! | kind | taken at | measured | can be undone | credited at |
//! |---|---|---|---|---|
//! | a context | `cuCtxCreate`, a primary retain | device-wide (`contexts`) | yes (destroyed) | its end |
//! | a module | `cuModuleLoad*` | device-wide in its context | yes (unloaded) | unload, its context's end |
//! | a limit's memory | `cuCtxSetLimit` | device-wide change in its context | yes (set back) | lowered, its context's end |
//! | kernels loaded lazily | a function's first use | NVML's figure for the process, else device-wide | no | its owner's unload, its context's end |
//! | graph memory | instantiate, upload, launch | the driver's graph attribute (`graphs`) | no | the driver's figure falling |
//!
//! One policy charges them all ([`charge`]): what a call is expected to take is reserved
//! before it, so that one the cap cannot take is refused while it can still fail; after
//! it the reservation is settled to the measured figure, refused (the caller undoes the
//! call) where the call can be undone and the figure does not fit, charged by force where
//! it cannot (never out of another member's guarantee). One measurement of the device's
//! free memory serves every kind measured device-wide (`contexts::DeviceLock::measure`;
//! [`taken`] makes its signed change a charge), the driver's figure for the process
//! measures a first use where it can be read ([`measure_loaded`]), and the driver's graph
//! attribute graph memory: all read through one trait the shim implements ([`Gauge`]),
//! and one [`ResidentCharges`] per kind records what each holds and in which
//! context, so that a context's end credits all of it.
//!
//! A call the cap refused by its device-wide figure alone (an upper bound beside a
//! churning pool) and that can be undone is made again after a pause ([`again`]).
//!
//! The shim only measures and calls the driver: each hook hands its kind's figure to
//! [`charge`] and records the result in its book.

pub mod again;
mod book;
mod charge;
mod gauge;
mod ledgered;

pub use book::{Resident, ResidentCharges};
pub use charge::{Charged, Refused, Undo, charge, charge_done, charge_floored, reserve_expected};
pub use gauge::{By, Gauge, loaded, measure_loaded};
pub use ledgered::{given_back, record, record_more};

/// A measured change as a charge (it lives beside the measurement it converts).
pub use crate::contexts::taken;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_charged_what_was_taken_never_below_zero() {
        assert_eq!(taken(2048), 2048);
        assert_eq!(taken(-5), 0);
        assert_eq!(taken(i128::MAX), u64::MAX);
    }
}
