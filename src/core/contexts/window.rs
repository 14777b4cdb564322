//! The edges of a measurement's window: the pool's traffic marks read around its two
//! device reads (`budget::marks` says what each read is for), and each read made again
//! while the members' traffic moved during it.
//!
//! A member's free or allocation that falls inside a device read cannot be placed on
//! either side of the figure the read returns: its free is added back (it may be inside
//! the window) and its allocation left in (it may not be), so the charge grows by both.
//! Where the measuring thread is preempted inside a read beside a churning pool, that
//! was gigabytes (a 64 MiB context measured at up to 7.7 GiB beside six members
//! allocating and freeing, refused under a 1 GiB cap with 408 MiB in use). So a read
//! whose traffic moved is made again, up to [`TRIES`] times: the "before" read until one
//! is quiet (the call is not made yet: free; where none is, the window starts at the
//! least moved one, its marks kept), the "after" read until one is quiet, the window
//! ending at that read (where none is, each "after" read's figure is an upper bound on
//! what the call took, and the least is kept). What was in flight at a read (a
//! free announced before it, an allocation started before it) stays counted as before:
//! more, never less.

use crate::budget::{FreedBefore, MadeInside, PoolTraffic};

/// How many times a device read is made at most while the members' traffic moves
/// during it.
pub const TRIES: usize = 8;

/// What a measurement reads around its device reads. Outside a pool ([`Bare`]):
/// nothing, each read made once.
pub trait Edges {
    /// Whether there are marks to read (without, nothing moves: each read is made once;
    /// NVML's read that loads it is then the window's first).
    fn marked(&self) -> bool {
        false
    }
    /// Right before the "before" read.
    fn opening(&mut self) {}
    /// Right after it: how much the members' traffic moved during it (0: nothing, a
    /// figure of bytes to compare reads by, not a charge).
    fn opened(&mut self) -> u64 {
        0
    }
    /// The window starts at the read [`opened`](Self::opened) returned `moved` for, and
    /// at the least moved read so far: keep this one's marks (true), or go back to the
    /// kept ones (false).
    fn keep_opening(&mut self, keep: bool) {
        let _ = keep;
    }
    /// Right before the "after" read.
    fn closing(&mut self) {}
    /// Right after it: the bytes to add to the device's figure for the window (what the
    /// members may have given back in it, less what they surely allocated in it), and
    /// whether no member's traffic moved during the read.
    fn closed(&mut self) -> (i128, bool) {
        (0, true)
    }
    /// The window ends at the "after" read [`closed`](Self::closed) last returned for.
    fn chosen(&mut self) {}
    /// How far the window's figure may be above what the call took: the members'
    /// traffic counted in it that may have fallen outside the window or not happened
    /// (allocations in flight when it opened or before its last read, frees announced
    /// before it or still announced then, announcements withdrawn, traffic during a read
    /// that moved). 0 without a pool: nothing of the pool's is counted.
    fn unsure(&self) -> u64 {
        0
    }
}

/// No pool: nothing to read around the device reads.
pub struct Bare;

impl Edges for Bare {}

/// A pool's marks on the device, read around the reads.
pub struct Marked<'m, 'w> {
    traffic: PoolTraffic<'m, 'w>,
    before: Option<FreedBefore>,
    inside: Option<MadeInside>,
    /// The marks of the least moved "before" read so far.
    kept: Option<(FreedBefore, MadeInside)>,
    allocated: u64,
    activity: u64,
    /// How much the traffic moved during the "before" read the window starts at, and
    /// during the least moved one so far.
    moved_before: u64,
    kept_moved: u64,
    /// Allocations in flight at the window's opening that were made since (left in), and
    /// allocations and frees in flight right before the last "after" read.
    left_in: u64,
    /// [`Edges::unsure`] at the last "after" read, and at the one the window ends at.
    unsure_last: u64,
    unsure: u64,
    /// Whether [`Edges::unsure`] is asked (the extra reads of the marks are made only then).
    doubt: bool,
}

impl<'m, 'w> Marked<'m, 'w> {
    /// The marks of `traffic`; `doubt`: the window's doubt kept too ([`Edges::unsure`],
    /// its extra reads of the marks made only then).
    pub fn new(traffic: PoolTraffic<'m, 'w>, doubt: bool) -> Self {
        Marked {
            traffic,
            before: None,
            inside: None,
            kept: None,
            allocated: 0,
            activity: 0,
            moved_before: 0,
            kept_moved: 0,
            left_in: 0,
            unsure_last: 0,
            unsure: 0,
            doubt,
        }
    }
}

impl Edges for Marked<'_, '_> {
    fn marked(&self) -> bool {
        true
    }

    fn opening(&mut self) {
        self.before = Some(self.traffic.freed_before());
        self.activity = self.traffic.activity();
    }

    fn opened(&mut self) -> u64 {
        let moved = self.traffic.activity().wrapping_sub(self.activity);
        self.inside = Some(self.traffic.made_inside());
        self.moved_before = moved;
        moved
    }

    fn keep_opening(&mut self, keep: bool) {
        match keep {
            true => {
                self.kept = self.before.clone().zip(self.inside.clone());
                self.kept_moved = self.moved_before;
            }
            false => {
                if let Some((before, inside)) = self.kept.clone() {
                    (self.before, self.inside) = (Some(before), Some(inside));
                    self.moved_before = self.kept_moved;
                }
            }
        }
    }

    fn closing(&mut self) {
        self.allocated = self
            .inside
            .as_ref()
            .map_or(0, |first| self.traffic.taken_since(first));
        if self.doubt {
            // A free not finished before the "after" read may have its driver call after it.
            self.left_in = [
                self.inside
                    .as_ref()
                    .map_or(0, |first| self.traffic.left_in_since(first)),
                self.traffic.in_flight(),
                self.traffic.freeing_now(),
            ]
            .into_iter()
            .fold(0, u64::saturating_add);
        }
        self.activity = self.traffic.activity();
    }

    fn closed(&mut self) -> (i128, bool) {
        let moved = self.traffic.activity().wrapping_sub(self.activity);
        let given_back = self
            .before
            .as_ref()
            .map_or(0, |b| self.traffic.given_back_since(b));
        if !self.doubt {
            return (
                i128::from(given_back) - i128::from(self.allocated),
                moved == 0,
            );
        }
        let announced = self.before.as_ref().map_or(0, FreedBefore::announced);
        let overstated = self
            .before
            .as_ref()
            .map_or(0, |b| self.traffic.overstated_since(b));
        self.unsure_last = [
            self.left_in,
            announced,
            overstated,
            self.moved_before,
            moved,
        ]
        .into_iter()
        .fold(0, u64::saturating_add);
        (
            i128::from(given_back) - i128::from(self.allocated),
            moved == 0,
        )
    }

    fn chosen(&mut self) {
        self.unsure = self.unsure_last;
    }

    fn unsure(&self) -> u64 {
        self.unsure
    }
}

/// The "before" read, made again while the traffic moved during it (at most [`TRIES`]
/// reads): the first read nothing moved during, else the least moved one, whose marks
/// `edges` keeps.
pub fn read_before<E>(
    edges: &mut dyn Edges,
    mut read: impl FnMut() -> Result<u64, E>,
) -> Result<u64, E> {
    edges.opening();
    let free = read()?;
    let moved = edges.opened();
    if moved == 0 {
        return Ok(free);
    }
    edges.keep_opening(true);
    let mut best = (free, moved);
    for _ in 1..TRIES {
        edges.opening();
        // A read that fails now: the kept one stands.
        let Ok(free) = read() else { break };
        let moved = edges.opened();
        if moved == 0 {
            return Ok(free);
        }
        if moved < best.1 {
            edges.keep_opening(true);
            best = (free, moved);
        }
    }
    edges.keep_opening(false);
    Ok(best.0)
}

/// The "after" read, made again while the traffic moved during it: the free memory read
/// and the correction of the read whose figure for the window is least (each is an upper
/// bound on what the call took). An error only where no read answered.
pub fn read_after<E>(
    edges: &mut dyn Edges,
    mut read: impl FnMut() -> Result<u64, E>,
) -> Result<(u64, i128), E> {
    let mut best: Option<(u64, i128)> = None;
    for _ in 0..TRIES {
        edges.closing();
        let free = match read() {
            Ok(free) => free,
            Err(e) => return best.ok_or(e),
        };
        let (correction, quiet) = edges.closed();
        // Taken = before - free + correction: least where free - correction is most.
        let after = i128::from(free) - correction;
        if best.is_none_or(|(f, c)| after > i128::from(f) - c) {
            best = Some((free, correction));
            edges.chosen();
        }
        if quiet {
            break;
        }
    }
    // TRIES is at least 1: a read answered, or its error was returned.
    Ok(best.unwrap_or((0, 0)))
}
