//! A call the cap refused by its measurement alone, undone and made again: a raised
//! limit (set back) and a module or library load (unloaded; [`Loads`] judges each
//! attempt, having no expected figure).
//!
//! A figure measured device-wide is an upper bound: what the other members had in
//! flight when the window opened (an allocation started before it, a raise of their
//! own stack reserved before it) is left in, never taken off, so that nothing is charged
//! short. Beside a churning pool that bound can be far above what the call took (a
//! 132 MiB stack measured at 312 MiB; four members raising their stacks at once, each
//! window holding the others' raises: 848 MiB for 396), and a call whose expected
//! figure fit under the cap is refused far below it. Where the call can be undone (a
//! limit set back) the caller undoes it and makes it again, after a short pause that
//! differs between members (so that two who met in each other's windows do not meet
//! again), up to [`ATTEMPTS`] times: what was in flight has ended by then, and the next
//! window holds only the call. Only the last refusal is said to the program; a call the
//! cap cannot take by its expected figure is refused at its reservation, without a
//! second attempt.

use std::time::Duration;

/// How many times a call refused by its measurement is made at most.
pub const ATTEMPTS: u32 = 6;

/// The first pause after a refused attempt; each next one doubles it.
const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// How an attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Attempt<T, R> {
    /// Done, whatever the driver or gpucap answered: nothing to make again.
    Done(T),
    /// Undone for its measurement (the cap refused its figure, or the figure may be the
    /// pool's traffic): `R` says why, and the refusal if it is the last.
    Undone(R),
}

/// The pause after refused attempt `k` (0 for the first), between half and one and a
/// half times `FIRST_PAUSE` × 2^k, the fraction drawn from `seed` and `k` (a member's
/// own: two members that met do not pause alike).
pub fn pause(k: u32, seed: u64) -> Duration {
    let base = FIRST_PAUSE.saturating_mul(1 << k.min(16));
    // splitmix64 of the seed and the attempt: a fraction in [0, 1) by 1/1024ths.
    let mut z = seed ^ u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let per_1024 = 512 + (z % 1024) as u32;
    base.saturating_mul(per_1024) / 1024
}

/// Makes `attempt` (given its number, from 0) until one is done, or [`ATTEMPTS`] were
/// refused by their measurement: Ok(what the done one answered), or Err(the last
/// refusal, for the caller to say). `sleep` pauses between attempts ([`pause`] of
/// `seed`).
pub fn until_measured<T, R>(
    seed: u64,
    mut attempt: impl FnMut(u32) -> Attempt<T, R>,
    mut sleep: impl FnMut(Duration),
) -> Result<T, R> {
    let mut k = 0;
    loop {
        match attempt(k) {
            Attempt::Done(t) => return Ok(t),
            Attempt::Undone(r) if k + 1 >= ATTEMPTS => return Err(r),
            Attempt::Undone(_) => {
                sleep(pause(k, seed));
                k += 1;
            }
        }
    }
}

/// What a load (a module, a library loaded eagerly) is charged, judged over its
/// attempts: each attempt's figure is an upper bound on what the same load takes (the
/// pool's traffic in flight left in, memory taken outside the pool in the window seen as
/// the load's); a load has no expected figure (the shim reads no image's sizes), so
/// where the cap cannot take a figure, a second window says whether the load itself is
/// that large.
#[derive(Debug, Default)]
pub struct Loads {
    /// What the attempts so far saw, of those from the same start.
    seen: Option<Seen>,
}

/// What a load's attempts from one start saw.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// What they started from (a library loaded eagerly: its GPU's contexts, each of
    /// which takes a copy): an attempt from another start is another load.
    start: u64,
    /// The least figure among them.
    least: u64,
    /// Whether what one of them surely held was beyond the cap.
    sure_beyond: bool,
}

/// What to do with an attempt of a load.
#[derive(Debug, PartialEq, Eq)]
pub enum Judged {
    /// Charge these bytes (the cap may still refuse them: another member took its room
    /// meanwhile).
    Charge(u64),
    /// Undo it and make it again: its figure may not be the load's (no refusal counted).
    Again,
    /// Charge these bytes where the cap takes them, refused otherwise: two windows saw
    /// them beyond the cap, or it is the last attempt.
    Refuse(u64),
}

impl Judged {
    /// The bytes to charge (refused where the cap cannot take them); None: made again.
    pub fn bytes(&self) -> Option<u64> {
        match *self {
            Judged::Charge(b) | Judged::Refuse(b) => Some(b),
            Judged::Again => None,
        }
    }
}

impl Loads {
    /// Judges an attempt from `start` (see [`Seen`]) that measured `figure` bytes, of
    /// which up to `doubt` may be the pool's traffic (`DeviceLock::measure_with_doubt`);
    /// `last`: no attempt follows; `beyond`: whether the cap cannot take a figure now
    /// (checked with no effect). The figure kept is the least of the attempts' from the
    /// same start, but no lower than this one's less its doubt: memory freed outside the
    /// pool in one window (which no mark shows) could make that window's figure short,
    /// and the least of several would pick it. Where the cap cannot take it: made again
    /// while what this window surely holds fits (the rest may be the pool's traffic), and
    /// where it does not, once more (memory taken outside the pool shows in no mark);
    /// refused where a second window surely held more than the cap takes too, and at the
    /// last attempt.
    pub fn judge(
        &mut self,
        start: u64,
        (figure, doubt): (u64, u64),
        last: bool,
        beyond: impl Fn(u64) -> bool,
    ) -> Judged {
        let sure = figure.saturating_sub(doubt);
        let earlier = self.seen.filter(|s| s.start == start);
        let least = earlier.map_or(figure, |s| s.least.min(figure));
        let sure_beyond = beyond(sure);
        let twice = sure_beyond && earlier.is_some_and(|s| s.sure_beyond);
        self.seen = Some(Seen {
            start,
            least,
            sure_beyond: sure_beyond || earlier.is_some_and(|s| s.sure_beyond),
        });
        let kept = least.max(sure);
        if !beyond(kept) {
            return Judged::Charge(kept);
        }
        if last || twice {
            return Judged::Refuse(kept);
        }
        Judged::Again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_refused_by_its_measurement_is_made_again_until_it_fits() {
        let mut pauses = Vec::new();
        let mut made = 0;
        let got = until_measured(
            7,
            |k| {
                made += 1;
                match k {
                    0 | 1 => Attempt::Undone(k),
                    _ => Attempt::Done("fits"),
                }
            },
            |d| pauses.push(d),
        );
        assert_eq!(got, Ok("fits"));
        assert_eq!(made, 3);
        assert_eq!(pauses, vec![pause(0, 7), pause(1, 7)]);
    }

    #[test]
    fn a_done_attempt_is_not_made_again_and_the_last_refusal_is_returned() {
        let mut made = 0;
        let got: Result<(), u32> = until_measured(
            1,
            |_| {
                made += 1;
                Attempt::Done(())
            },
            |_| panic!("no pause after a done attempt"),
        );
        assert_eq!((got, made), (Ok(()), 1));

        let mut slept = 0;
        let got: Result<(), u32> = until_measured(1, Attempt::Undone, |_| slept += 1);
        assert_eq!(got, Err(ATTEMPTS - 1));
        assert_eq!(slept, ATTEMPTS - 1);
    }

    #[test]
    fn pauses_double_and_differ_between_members() {
        for k in 0..ATTEMPTS {
            for seed in [0, 1, 42, u64::MAX] {
                let p = pause(k, seed);
                let base = FIRST_PAUSE * (1 << k);
                assert!(p >= base / 2 && p < base * 3 / 2, "{k} {seed}: {p:?}");
            }
        }
        let firsts: std::collections::BTreeSet<_> = (0..64).map(|s| pause(0, s)).collect();
        assert!(firsts.len() > 32, "{firsts:?}");
        // All the attempts together wait well under a second.
        let all: Duration = (0..ATTEMPTS - 1).map(|k| pause(k, 3)).sum();
        assert!(all < Duration::from_millis(100), "{all:?}");
    }

    /// The cap of the judge's tests: 1,000 bytes.
    fn beyond(bytes: u64) -> bool {
        bytes > 1000
    }

    /// [`Loads::judge`] of attempts from one start.
    fn judge(l: &mut Loads, figure: u64, doubt: u64, last: bool) -> Judged {
        l.judge(0, (figure, doubt), last, beyond)
    }

    #[test]
    fn what_a_judged_attempt_charges() {
        assert_eq!(Judged::Charge(7).bytes(), Some(7));
        assert_eq!(Judged::Refuse(9).bytes(), Some(9));
        assert_eq!(Judged::Again.bytes(), None);
    }

    #[test]
    fn a_load_whose_figure_fits_is_charged_its_figure() {
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 400, 300, false), Judged::Charge(400));
    }

    #[test]
    fn a_load_measured_beyond_the_cap_beside_the_pools_traffic_is_made_again() {
        let mut l = Loads::default();
        // 1,200 seen, 700 of it possibly the pool's: what it surely took fits.
        assert_eq!(judge(&mut l, 1200, 700, false), Judged::Again);
        // Again, though an earlier window saw more: still possibly traffic.
        assert_eq!(judge(&mut l, 1300, 800, false), Judged::Again);
        // A quiet window: the least figure, charged.
        assert_eq!(judge(&mut l, 500, 0, false), Judged::Charge(500));
    }

    #[test]
    fn a_load_beyond_the_cap_in_two_windows_is_refused() {
        let mut l = Loads::default();
        // No doubt, but memory taken outside the pool would show in no mark: once more.
        assert_eq!(judge(&mut l, 1500, 0, false), Judged::Again);
        assert_eq!(judge(&mut l, 1400, 0, false), Judged::Refuse(1400));
        // Two windows whose sure parts fit, then one beyond: once more, not refused.
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1100, 200, false), Judged::Again);
        assert_eq!(judge(&mut l, 1050, 100, false), Judged::Again);
        assert_eq!(judge(&mut l, 1080, 10, false), Judged::Again);
        assert_eq!(judge(&mut l, 1060, 0, false), Judged::Refuse(1060));
    }

    #[test]
    fn one_window_beyond_the_cap_after_an_unsure_one_is_not_a_refusal() {
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1200, 700, false), Judged::Again);
        // 1,100 allocated outside the pool inside this window: no mark shows it.
        assert_eq!(judge(&mut l, 1500, 0, false), Judged::Again);
        assert_eq!(judge(&mut l, 500, 0, false), Judged::Charge(500));
    }

    #[test]
    fn a_load_taken_outside_the_pool_in_its_first_window_is_charged_its_own() {
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1100, 0, false), Judged::Again);
        assert_eq!(judge(&mut l, 400, 0, false), Judged::Charge(400));
    }

    #[test]
    fn the_last_attempt_is_refused_where_the_cap_cannot_take_it() {
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1200, 900, true), Judged::Refuse(1200));
    }

    #[test]
    fn the_least_figure_is_kept_but_never_below_this_windows_sure_part() {
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1200, 700, false), Judged::Again);
        // 300 seen (something freed outside the pool in it?): the earlier window's
        // sure part is no bound here, this one's is.
        assert_eq!(judge(&mut l, 300, 0, false), Judged::Charge(300));
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1100, 200, false), Judged::Again);
        assert_eq!(judge(&mut l, 1200, 300, false), Judged::Again);
        assert_eq!(judge(&mut l, 990, 0, false), Judged::Charge(990));
        // The least of 1,100 and 1,200, yet not below this window's 950 sure.
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1100, 200, false), Judged::Again);
        assert_eq!(judge(&mut l, 1200, 250, true), Judged::Refuse(1100));
        let mut l = Loads::default();
        assert_eq!(judge(&mut l, 1100, 200, false), Judged::Again);
        assert_eq!(judge(&mut l, 980, 0, false), Judged::Charge(980));
    }

    #[test]
    fn an_attempt_from_another_start_keeps_nothing_of_the_earlier_ones() {
        let mut l = Loads::default();
        // Loaded into one context: 400 seen beside the pool's traffic.
        assert_eq!(l.judge(1, (1100, 700), false, beyond), Judged::Again);
        // A second context made meanwhile takes a copy too: 800, not the least 400-ish.
        assert_eq!(l.judge(2, (800, 0), false, beyond), Judged::Charge(800));
        let mut l = Loads::default();
        assert_eq!(l.judge(1, (600, 0), false, beyond), Judged::Charge(600));
        assert_eq!(l.judge(2, (1200, 0), false, beyond), Judged::Again);
        // From that start, the earlier sure-beyond window was another start's: once more.
        assert_eq!(l.judge(1, (1200, 0), false, beyond), Judged::Again);
    }
}
