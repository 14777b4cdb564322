//! One device's figures as the ledger keeps them ([`Device`]), every device's in whole
//! pages ([`Devices`]: a lone process maps its file over them), and their reading
//! ([`usage_in`], [`Usage`]); the cap check of a reservation ([`add_within_cap`]).

use std::sync::atomic::{
    AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed},
};

use crate::config::MAX_DEVICES;
use crate::counter::Counter;

/// The cap of a device that has none.
pub const NO_CAP: u64 = u64::MAX;

/// The word [`Device`] keeps for `cap` (inverted: [`NO_CAP`] is 0).
#[inline(always)]
pub(super) const fn cap_word(cap: u64) -> u64 {
    !cap
}

/// The cap a [`Device`]'s cap word holds.
#[inline(always)]
pub(super) const fn cap_of(word: u64) -> u64 {
    !word
}

/// What the ledger knows of one device. The figures every allocation changes (`used`,
/// and `peak` when it moves) share one cache line with the cap; the allocation count is
/// spread over lines of its own ([`Counter`]), so that threads allocating at once share
/// no written line but the cap's. `repr(C)`: a lone process's file holds these words as
/// they are (see the lone file of the core), read by [`usage_in`].
#[derive(Debug)]
#[repr(C, align(64))]
pub struct Device {
    /// The cap, stored inverted ([`cap_word`], [`cap_of`]): 0 is "no cap", so that a
    /// device nothing was set on is all zero, as a fresh memfd reads (a lone process's
    /// figures need no copy into it at start, and take no page until used).
    pub(super) cap: AtomicU64,
    pub(super) used: AtomicU64,
    pub(super) peak: AtomicU64,
    pub(super) refusals: AtomicU64,
    pub(super) largest_refused: AtomicU64,
    /// The rest of the first line, explicit: the file holds no padding (every byte of
    /// [`Devices`] is a word).
    _line: [AtomicU64; 3],
    pub(super) allocs: Counter,
}

impl Device {
    pub(super) const fn new() -> Self {
        Device {
            cap: AtomicU64::new(cap_word(NO_CAP)),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            largest_refused: AtomicU64::new(0),
            _line: [const { AtomicU64::new(0) }; 3],
            allocs: Counter::new(),
        }
    }
}

/// Every device's figures, alone in whole pages (64 KiB: any page size up to that): a
/// process capped alone (no pool) maps its file over them, so that `gpucap status`,
/// `top` and `metrics` read the words every allocation writes anyway (see the lone file of the core).
#[derive(Debug)]
#[repr(C, align(65536))]
pub struct Devices {
    devices: [Device; MAX_DEVICES],
    /// The rest of the 64 KiB, explicit (no padding: every byte is a word).
    _rest: [AtomicU64; DEVICES_REST],
}

impl Devices {
    /// Every device uncapped, nothing used.
    pub(super) const fn new() -> Self {
        Devices {
            devices: [const { Device::new() }; MAX_DEVICES],
            _rest: [const { AtomicU64::new(0) }; DEVICES_REST],
        }
    }
}

/// The bytes of [`Devices`]: a whole number of pages.
pub const DEVICES_BYTES: usize = 65536;
/// The bytes of [`Devices`] that hold figures, from its start: every device's. The rest
/// (up to [`DEVICES_BYTES`]) is never written and stays zero.
pub const DEVICE_FIGURES_BYTES: usize = MAX_DEVICES * std::mem::size_of::<Device>();
const DEVICES_REST: usize = (DEVICES_BYTES - MAX_DEVICES * std::mem::size_of::<Device>()) / 8;
const _: () = assert!(std::mem::size_of::<Devices>() == DEVICES_BYTES);
const _: () = assert!(std::mem::size_of::<Device>() == 64 + 64 * crate::counter::COUNTER_LINES);

impl std::ops::Deref for Devices {
    type Target = [Device; MAX_DEVICES];
    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        &self.devices
    }
}

/// Words of one [`Device`].
pub const DEVICE_WORDS: usize = std::mem::size_of::<Device>() / 8;

/// One device's figures read from `words`, a copy of [`Devices`]' bytes as words (a lone
/// process's file): None when `device` is beyond them.
pub fn usage_in(words: &[AtomicU64], device: usize) -> Option<Usage> {
    use std::mem::offset_of;
    let base = device.checked_mul(DEVICE_WORDS)?;
    let d = words.get(base..base + DEVICE_WORDS)?;
    let at = |offset: usize| d[offset / 8].load(Relaxed);
    let allocs = (0..crate::counter::COUNTER_LINES)
        .map(|l| at(offset_of!(Device, allocs) + l * crate::counter::LINE_BYTES))
        .fold(0u64, u64::wrapping_add);
    Some(Usage {
        cap: cap_of(at(offset_of!(Device, cap))),
        used: at(offset_of!(Device, used)),
        peak: at(offset_of!(Device, peak)),
        allocs,
        refusals: at(offset_of!(Device, refusals)),
        largest_refused: at(offset_of!(Device, largest_refused)),
    })
}

/// Adds `bytes` to `d`'s use if its cap allows: one compare-and-swap (retried while
/// other threads change the use). Ok: the new use; Err: the use and cap that refused.
#[inline]
pub(super) fn add_within_cap(d: &Device, bytes: u64) -> Result<u64, (u64, u64)> {
    let cap = cap_of(d.cap.load(Relaxed));
    let mut used = d.used.load(Relaxed);
    loop {
        let new = match used.checked_add(bytes) {
            Some(n) if n <= cap => n,
            _ => return Err((used, cap)),
        };
        match d.used.compare_exchange_weak(used, new, AcqRel, Relaxed) {
            Ok(_) => return Ok(new),
            Err(now) => used = now,
        }
    }
}

/// Adds `bytes` to `d`'s use whatever its cap, up to `ceiling` (the most the process may
/// ever hold there, [`NO_CAP`] for none): Ok: the new use; Err: the use and the ceiling
/// that refused, nothing added (also where the sum would not fit a `u64`: a rollback of
/// a saturated sum would take off what was there).
#[inline]
pub(super) fn add_past_cap(d: &Device, bytes: u64, ceiling: u64) -> Result<u64, (u64, u64)> {
    d.used
        .fetch_update(AcqRel, Acquire, |u| {
            u.checked_add(bytes).filter(|&n| n <= ceiling)
        })
        .map(|old| old + bytes)
        .map_err(|used| (used, ceiling))
}

/// Raises `d`'s peak to `used` if it is higher. A plain load first: the peak rarely
/// moves, and an atomic read-modify-write on every allocation would cost more.
#[inline]
pub(super) fn note_peak(d: &Device, used: u64) {
    if used > d.peak.load(Relaxed) {
        d.peak.fetch_max(used, Relaxed);
    }
}

/// A snapshot of one device's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// The cap in bytes, or [`NO_CAP`].
    pub cap: u64,
    pub used: u64,
    pub peak: u64,
    pub allocs: u64,
    pub refusals: u64,
    pub largest_refused: u64,
}

impl Usage {
    /// Bytes the cap still allows (unbounded without a cap).
    pub fn headroom(&self) -> u64 {
        self.cap.saturating_sub(self.used)
    }
}
