//! Context limits (`cuCtxSetLimit`, and so `cudaDeviceSetLimit`): raising some takes
//! device memory at the call, which no allocation call shows. An H100 with driver 580
//! took 3.87 GiB (4,152,360,960 bytes) for a stack of 16 KiB per thread: (16 KiB - the
//! default 1 KiB) for each of 132 SMs x 2,048 resident threads, in whole 2 MiB pages
//! (docs/gpu-runs/2026-11-26-h100). The hooks measure the call as a module load is
//! measured, charge what it took to the context's device under the (context, limit)
//! key of a [`ResidentCharges`], credit what a lowered limit gave back, never more than
//! that limit was charged, and the rest once the context is gone.

use crate::contexts::Ctx;
use crate::residents::ResidentCharges;

/// A context's limit: the context and the `CUlimit`.
pub type LimitKey = (Ctx, u32);

/// The memory the contexts' limits took.
pub type LimitBook = ResidentCharges<LimitKey>;

/// What a limit is charged after a successful `cuCtxSetLimit` that moved the driver's
/// free memory by `measured` (bytes taken; negative: given back), the limit having been
/// charged `charged` before and the new value being lower than the old (`lowered`), the
/// driver being known to take `expected` for it (a stack raised from nothing charged: each
/// byte more for every resident thread; 0 where not known). Memory taken is added whatever the direction,
/// never less than `expected`: the free figure is the device's, and memory that anything
/// else gave back inside the window (a process outside the pool, the driver's own) would
/// make it short, as for a context. Memory given back is credited only for a lowered
/// limit, and at most what it was charged: memory another process gave back at that
/// moment must not count as this limit's.
pub fn after_change(charged: u64, measured: i128, lowered: bool, expected: u64) -> u64 {
    let taken = u64::try_from(measured.max(0))
        .unwrap_or(u64::MAX)
        .max(expected);
    if taken > 0 {
        return charged.saturating_add(taken);
    }
    if !lowered {
        return charged;
    }
    let given_back = u64::try_from(measured.unsigned_abs()).unwrap_or(u64::MAX);
    charged.saturating_sub(given_back)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STACK_16K: u64 = 4_152_360_960;

    #[test]
    fn memory_taken_is_charged_whichever_way_the_limit_moved() {
        assert_eq!(after_change(0, STACK_16K as i128, false, 0), STACK_16K);
        assert_eq!(after_change(2 << 20, 4 << 20, false, 0), 6 << 20);
        assert_eq!(after_change(2 << 20, 4 << 20, true, 0), 6 << 20);
    }

    #[test]
    fn a_lowered_limit_is_credited_what_it_gave_back_never_more_than_its_charge() {
        assert_eq!(after_change(STACK_16K, -(STACK_16K as i128), true, 0), 0);
        assert_eq!(
            after_change(STACK_16K, -(1 << 30), true, 0),
            STACK_16K - (1 << 30)
        );
        // another process freed memory at the same moment: the charge goes, no further
        assert_eq!(
            after_change(STACK_16K, -(STACK_16K as i128) * 3, true, 0),
            0
        );
    }

    #[test]
    fn memory_freed_while_a_limit_was_raised_is_not_this_limits() {
        assert_eq!(after_change(STACK_16K, -(1 << 30), false, 0), STACK_16K);
        assert_eq!(after_change(0, -(1 << 30), false, 0), 0);
        assert_eq!(after_change(0, 0, true, 0), 0);
    }

    #[test]
    fn a_raise_is_charged_at_least_what_the_driver_is_known_to_take() {
        // Memory given back inside the window (graph memory trimmed beside it, a process
        // outside the pool) took 256 MiB off a 396 MiB stack's measurement.
        let stack = 396 << 20;
        assert_eq!(after_change(0, 140 << 20, false, stack), stack);
        assert_eq!(after_change(0, -(200 << 20), false, stack), stack);
        assert_eq!(
            after_change(8 << 20, 140 << 20, false, stack),
            (8 << 20) + stack
        );
        // measured above it: the measurement
        assert_eq!(after_change(0, 500 << 20, false, stack), 500 << 20);
    }
}
