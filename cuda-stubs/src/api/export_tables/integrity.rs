//! INTEGRITY_CHECK: the value cudart checks the driver with (`crate::integrity`).

use libc::c_void;

use super::runtime::CUDART;
use super::{Slot, Words, slot};
use crate::abi::{CUDA_ERROR_NOT_SUPPORTED, CUresult, call, fmt_args, out};
use crate::api::device::attribute;
use crate::integrity::{self, CheckDevice, CheckInput};
use crate::model::device::{cfg, uuid_v2};

slot_stubs! {
    integrity_2 = "INTEGRITY_CHECK[2]",
}

// --- INTEGRITY_CHECK (d4082055-bde6-704b-8d34-ba123c66e1f2) --------------------------------

/// [1]: the value cudart checks the driver with (crate::integrity).
unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    result: *mut [u64; 2],
) -> CUresult {
    slot(
        "INTEGRITY_CHECK[1]",
        || {
            fmt_args(&[
                ("version", &version),
                ("unix_seconds", &unix_seconds),
                ("result", &result),
            ])
        },
        || {
            let cfg = cfg()?;
            let devices: Vec<CheckDevice> = (0..cfg.visible.len())
                .map(|dev| CheckDevice {
                    uuid: uuid_v2(dev),
                    pci_domain: attribute(50, dev),
                    pci_bus: attribute(33, dev),
                    pci_device: attribute(34, dev),
                })
                .collect();
            let input = CheckInput {
                driver_version: cfg.driver_version as u32,
                version,
                pid: std::process::id(),
                // SAFETY: pthread_self has no preconditions.
                thread: unsafe { libc::pthread_self() } as u32,
                cudart_table: CUDART.addr() as usize,
                integrity_table: INTEGRITY.addr() as usize,
                function: integrity_check as *const c_void as usize,
                unix_seconds,
            };
            out(result, integrity::check(&input, &devices))
        },
    )
}

pub(super) const INTEGRITY_SLOTS: [Slot; 3] = [
    Slot::Size,
    Slot::Fn(integrity_check as *const c_void),
    Slot::Stub(integrity_2 as *const c_void),
];
pub(super) static INTEGRITY: Words<3> = Words::build(&INTEGRITY_SLOTS);
