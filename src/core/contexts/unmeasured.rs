//! What a context's measurement says when it fails, and what follows for the context: why
//! it could not be measured ([`Unmeasured`], with the driver's error and the line a log
//! prints), how it was measured ([`MeasuredBy`]), and the [`verdict`] (charge it, refuse
//! it under a cap, or allow it uncounted without one).

use std::fmt;

use super::{OUT_OF_MEMORY, SUCCESS};

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

/// How a context's size was measured: whose free memory was read before and after the
/// call that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeasuredBy {
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
    pub(super) fn new(step: Step, rc: u32) -> Unmeasured {
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
