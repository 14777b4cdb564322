//! What a context is charged from its measurement, given what was expected of it and
//! whether other members of its pool made contexts on the same GPU at the same moment.
//!
//! The measurement is device-wide (free memory before minus after, the pool's own
//! traffic taken out): with nobody else making a context meanwhile it is the context's
//! own figure, and the expectation for the next contexts there is learned from it. With
//! `others` contexts in flight beside it, it also holds whatever of theirs fell inside its
//! window, up to the expectation each if they take what contexts there took before. So:
//!
//! - alone: the measurement, never less than the expectation reserved before the call
//!   (a process outside the pool that freed memory in the window makes it short);
//! - beside others, with an expectation: the measurement less the others' expectations,
//!   never less than its own expectation; but a measurement above what every context in
//!   flight could explain at its expectation is charged whole (a context larger than
//!   expected is among them, and it may be this one);
//! - beside others, with no expectation yet (none measured alone on the GPU): the
//!   measurement whole.
//!
//! Charges err high, never low, while every context on a GPU takes at most the
//! expectation (contexts made alike take alike); the property test below holds the
//! pool's charges to the driver's figure over random interleavings.
//!
//! Where the driver also gives this process's own figure (NVML's per-process memory,
//! where the pid it lists is provably this process's), [`settle_own`] uses it: other
//! members' contexts do not move it, so beside others it is this context's figure
//! whatever else fell in the device-wide window (the first context of a pool on a GPU
//! needs no measurement alone then), never below what a context there was expected to
//! take; alone, the device-wide measurement, never below it.

/// A context's charge, and whether its measurement may teach the expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    pub bytes: u64,
    pub learn: bool,
}

/// Settles a context measured at `measured` bytes, `expected` having been reserved for it
/// (0: nothing known yet), with `others` contexts of other members in flight beside it.
pub fn settle(measured: u64, expected: u64, others: u64) -> Settled {
    if others == 0 {
        return Settled {
            bytes: measured.max(expected),
            learn: true,
        };
    }
    let theirs = expected.saturating_mul(others);
    let bytes = if expected == 0 || measured > theirs.saturating_add(expected) {
        measured
    } else {
        measured.saturating_sub(theirs).max(expected)
    };
    Settled {
        bytes,
        learn: false,
    }
}

/// A context settled with `own`, what the driver's figure for this process moved by in
/// the call (less this process's other threads' charges meanwhile): (the charge, what is
/// learned). Alone ([`settle`] with nothing in flight): the device-wide measurement,
/// never below `own` or the expectation, and learned. Beside `others`: `own`, never below
/// the expectation, and `own` learned; the device-wide window is not charged whole there
/// (16 members at once on a loaded machine put 1.71 GiB of others' memory in one 300 MiB
/// context's window, beyond what their count explained, and the pool refused it).
pub fn settle_own(measured: u64, expected: u64, others: u64, own: u64) -> (u64, u64) {
    if others == 0 {
        let s = settle(measured, expected.max(own), 0);
        return (s.bytes, measured);
    }
    (own.max(expected), own)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn alone_the_measurement_is_charged_and_learned() {
        assert_eq!(
            settle(100 * MIB, 0, 0),
            Settled {
                bytes: 100 * MIB,
                learn: true
            }
        );
        // Short of the expectation (another process freed memory in the window).
        assert_eq!(settle(60 * MIB, 100 * MIB, 0).bytes, 100 * MIB);
    }

    #[test]
    fn beside_others_their_expected_contexts_come_off() {
        // Two others' contexts fell in the window.
        assert_eq!(
            settle(300 * MIB, 100 * MIB, 2),
            Settled {
                bytes: 100 * MIB,
                learn: false
            }
        );
        // None of theirs fell in it: still at least its own expectation.
        assert_eq!(settle(100 * MIB, 100 * MIB, 5).bytes, 100 * MIB);
        // More than every context in flight explains: charged whole.
        assert_eq!(settle(350 * MIB, 100 * MIB, 2).bytes, 350 * MIB);
        // Nothing known yet: whole.
        assert_eq!(settle(300 * MIB, 0, 2).bytes, 300 * MIB);
    }

    /// One member's context: when its window opens and closes (`a < t < b`, `t` when the
    /// driver takes its `size`), in ticks.
    #[derive(Debug, Clone)]
    struct Made {
        a: u32,
        t: u32,
        b: u32,
        size: u64,
    }

    fn made(max_size: u64) -> impl Strategy<Value = Made> {
        (0u32..1000, 1u32..400, 1u32..400, 1..=max_size).prop_map(move |(a, x, y, size)| Made {
            a,
            t: a + x.min(y),
            b: a + x.max(y) + 1,
            size,
        })
    }

    /// Each context charged from a device-wide window: every take inside it, less what
    /// processes outside the pool freed there (`noise`, never below 0), the others
    /// counted as the flight words count them (in flight at its start, or started
    /// before its end).
    fn charges(all: &[Made], expected: u64, noise: u64) -> Vec<u64> {
        all.iter()
            .enumerate()
            .map(|(i, m)| {
                let seen: u64 = all
                    .iter()
                    .filter(|o| o.t > m.a && o.t < m.b)
                    .map(|o| o.size)
                    .sum();
                let others = all
                    .iter()
                    .enumerate()
                    .filter(|&(j, o)| j != i && o.a < m.b && o.b > m.a)
                    .count() as u64;
                settle(seen.saturating_sub(noise), expected, others).bytes
            })
            .collect()
    }

    #[test]
    fn the_processs_own_figure_settles_a_context_made_beside_others() {
        // Nothing known yet, two others in the window: their contexts come off at this
        // process's own figure.
        assert_eq!(
            settle_own(300 * MIB, 0, 2, 100 * MIB),
            (100 * MIB, 100 * MIB)
        );
        // Alone: the device-wide figure, never below the process's own.
        assert_eq!(
            settle_own(100 * MIB, 0, 0, 100 * MIB),
            (100 * MIB, 100 * MIB)
        );
        assert_eq!(settle_own(90 * MIB, 0, 0, 100 * MIB), (100 * MIB, 90 * MIB));
        // Beside others, a window holding more than their count explains (the pool-64
        // check's member: 1.71 GiB measured for a 300 MiB context, 4 others counted):
        // its own figure, not the window whole.
        assert_eq!(
            settle_own(1751 * MIB, 300 * MIB, 4, 300 * MIB),
            (300 * MIB, 300 * MIB)
        );
        // Never below what a context there was expected to take.
        assert_eq!(
            settle_own(900 * MIB, 300 * MIB, 2, 290 * MIB),
            (300 * MIB, 290 * MIB)
        );
    }

    proptest! {
        /// Contexts made alike (each at most the expectation learned alone): the pool
        /// charges each at least what the driver took for it, however they interleave.
        #[test]
        fn every_context_is_charged_at_least_its_size(
            all in prop::collection::vec(made(100), 1..24),
        ) {
            let expected = 100;
            for (m, charged) in all.iter().zip(charges(&all, expected, 0)) {
                prop_assert!(charged >= m.size, "{m:?} charged {charged}");
            }
        }

        /// Nothing known yet, each process's own figure read: every context charged at
        /// least its size, whatever the sizes.
        #[test]
        fn with_its_own_figure_every_context_is_charged_at_least_its_size(
            all in prop::collection::vec(made(500), 1..24),
        ) {
            let plain = charges(&all, 0, 0);
            for ((m, c), i) in all.iter().zip(&plain).zip(0..) {
                // The same window's measurement, settled beside the process's own figure.
                let others = all
                    .iter()
                    .enumerate()
                    .filter(|&(j, o)| j != i && o.a < m.b && o.b > m.a)
                    .count() as u64;
                let (charged, _) = settle_own(*c, 0, others, m.size);
                prop_assert!(charged >= m.size, "{m:?} charged {charged}");
            }
        }

        /// Nothing known yet (the first contexts of a pool on a GPU): charged whole,
        /// and the pool's sum at least the driver's.
        #[test]
        fn with_nothing_expected_the_sum_is_never_short(
            all in prop::collection::vec(made(500), 1..24),
        ) {
            let total: u64 = all.iter().map(|m| m.size).sum();
            let charged: u64 = charges(&all, 0, 0).iter().sum();
            prop_assert!(charged >= total, "{charged} < {total}");
        }

        /// A process outside the pool freeing memory in the windows: never below the
        /// expectation, so never below a context made alike.
        #[test]
        fn frees_outside_the_pool_never_take_a_context_below_its_expectation(
            all in prop::collection::vec(made(100), 1..24),
            noise in 0u64..1000,
        ) {
            for (m, charged) in all.iter().zip(charges(&all, 100, noise)) {
                prop_assert!(charged >= m.size.min(100), "{m:?} charged {charged}");
            }
        }
    }
}
