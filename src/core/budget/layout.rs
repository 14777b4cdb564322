//! The pool file's words. Every field is a little-endian `u64` read and written as an
//! atomic; the file is `pool_file_bytes(N)` long for `N` member slots (256 unless its
//! creator chose another count):
//!
//! ```text
//! header   16 words   magic "GPUCAPPL", version, geometry, length, created, creator uid,
//!                     slots ever taken, slot freed (wake word), joining hints (next slot,
//!                     slots freed, search cursor, last sweep), in a claim's memfd the
//!                     file it was made from (device, inode)
//! GPUs     32 x 24    key (UUID folded), UUID, cap, used (a change count in its top 16
//!                     bits, bytes in the low 48), peak, lock, refusals, largest refused,
//!                     waiters, tickets, wake word, waits, wait ms, lock blocking since,
//!                     recent least context bytes, contexts in flight, cap generation;
//!                     6 words spare
//! states   N          per member slot: empty or live
//! members  N x 176    a waiter's last look, pid, pid namespace, start, generation, command (64 bytes),
//!                     GPU entries with a context in flight, where a ceiling handed down
//!                     to the member came from and the GPU entries it is held at it on
//!                     (for `gpucap status`),
//!                     then per GPU: used, peak, pending, cap, wait ticket
//! shares   32 x N/64  per GPU: which slots hold a guarantee (whole groups of 256 bits)
//!          32 x N x 2 per GPU per member: guarantee, ceiling (`GPUCAP_GUARANTEE`,
//!                     `GPUCAP_CEILING`; 0: none)
//! marks    32 x N x 5 per GPU per member: bytes freeing, freed, allocations started,
//!                     made, not made (see `marks`)
//! ```
//!
//! What a look over every slot reads (the slots' states, one GPU's guarantees and
//! ceilings, one GPU's traffic marks) lies in arrays of a few words per slot, apart
//! from the slots (a slot is 1,408 bytes): a joiner's checks and sweep, and a context's
//! measurement, read a few pages of the file whatever its member count, not a page per
//! member.
//!
//! A member slot is live while its owner holds the kernel lock of the slot (see
//! `member`). A GPU entry's `used` changes only by compare-and-swap, each change counted
//! in its top bits (see `used`: no lock, no journal); its `lock` word holds the slot (+1)
//! of the member recounting `used`, claiming a guarantee or taking a waiter's ticket, and
//! [`LOCK_WAITING`] while another member sleeps on it.
//!
//! Members of different versions cannot share a file (each version's members would
//! miss words the others keep): a file of another version is refused with a line that
//! says so.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

pub use super::layout_error::{LayoutError, MAGIC, POOL_VERSION};

pub const HEADER_WORDS: usize = 16;
pub const MAX_POOL_GPUS: usize = 32;
pub const GPU_WORDS: usize = 24;
/// The member slots of a pool file whose creator chose no count (`GPUCAP_POOL_MEMBERS`).
pub const DEFAULT_SLOTS: usize = 256;
/// The most member slots a pool file may have (the count is chosen at creation).
pub const MAX_SLOTS: usize = 4096;
pub const SLOT_HEAD_WORDS: usize = 16;
pub const PER_GPU_WORDS: usize = 5;
pub const SLOT_WORDS: usize = SLOT_HEAD_WORDS + MAX_POOL_GPUS * PER_GPU_WORDS;
/// The words of a GPU's guarantee bits every file has (the first 256 slots'): the
/// short path reads them as one fixed array, and the rest (more than 256 slots) apart.
pub const SHARE_HEAD_WORDS: usize = 4;
pub const SHARE_WORDS: usize = 2;
/// The words of one member's traffic marks on one GPU entry (`T_FREEING` ...).
pub const MARK_WORDS: usize = 6;
pub const COMMAND_BYTES: usize = 64;

/// The words of one GPU's guarantee bits in a file of `slots` members: whole groups of
/// 256 bits, at least one.
pub const fn share_bits_words(slots: usize) -> usize {
    let groups = slots.div_ceil(SHARE_HEAD_WORDS * 64);
    if groups == 0 {
        SHARE_HEAD_WORDS
    } else {
        groups * SHARE_HEAD_WORDS
    }
}

/// Where the slots' states start (after the GPU entries).
pub const STATES_AT: usize = HEADER_WORDS + MAX_POOL_GPUS * GPU_WORDS;

/// Where the member slots start (after their states) in a file of `slots` members.
pub const fn slots_at(slots: usize) -> usize {
    STATES_AT + slots
}

/// Where the shares start (after the member slots) in a file of `slots` members.
pub const fn shares_at(slots: usize) -> usize {
    slots_at(slots) + slots * SLOT_WORDS
}

/// Where the traffic marks start (after the shares) in a file of `slots` members.
pub const fn marks_at(slots: usize) -> usize {
    shares_at(slots) + MAX_POOL_GPUS * share_bits_words(slots) + slots * MAX_POOL_GPUS * SHARE_WORDS
}

/// The words of a pool file of `slots` members.
pub const fn pool_words(slots: usize) -> usize {
    marks_at(slots) + MAX_POOL_GPUS * slots * MARK_WORDS
}

/// The bytes of a pool file of `slots` members.
pub const fn pool_file_bytes(slots: usize) -> usize {
    pool_words(slots) * 8
}

/// The geometry word of a file of `slots` members: what a reader must agree on to read
/// the rest (the member count in bits 16 to 31).
pub const fn geometry(slots: usize) -> u64 {
    (MAX_POOL_GPUS as u64)
        | (slots as u64) << 16
        | (GPU_WORDS as u64) << 32
        | (SLOT_WORDS as u64) << 48
}

/// The member count a geometry word gives, if the rest of it is this layout's.
pub const fn geometry_slots(word: u64) -> Option<usize> {
    let slots = ((word >> 16) & 0xffff) as usize;
    if word & !(0xffff << 16) == geometry(0) && slots >= 1 && slots <= MAX_SLOTS {
        Some(slots)
    } else {
        None
    }
}

/// The words and bytes of a pool file of [`DEFAULT_SLOTS`] members.
pub const POOL_WORDS: usize = pool_words(DEFAULT_SLOTS);
pub const POOL_FILE_BYTES: usize = POOL_WORDS * 8;
/// Where the shares start in a file of [`DEFAULT_SLOTS`] members.
#[cfg(test)]
pub const SHARES_AT: usize = shares_at(DEFAULT_SLOTS);

// Header words.
pub const H_MAGIC: usize = 0;
pub const H_VERSION: usize = 1;
pub const H_GEOMETRY: usize = 2;
pub const H_BYTES: usize = 3;
pub const H_CREATED: usize = 4;
pub const H_UID: usize = 5;
/// One more than the highest slot a member ever took (never lowered): the slots past it
/// were never used, all their words zero, so a reading of every member's marks (see
/// `traffic`) stops there instead of reading all [`MAX_SLOTS`].
pub const H_SLOTS_SEEN: usize = 6;
/// Bumped (and woken) whenever a member empties a slot: a joiner that found every slot
/// taken sleeps on it (`GPUCAP_WAIT`; a dead member's slot is found by a timed retry).
pub const H_SLOT_FREED: usize = 7;
/// The next slot never handed out to a joiner: a joiner takes the value it gives
/// (`fetch_add`), so members started together each try a slot of their own (see `join`;
/// a hint: a slot held all the same is passed over, and past the last slot a joiner
/// tries every one).
pub const H_JOIN_NEXT: usize = 8;
/// Slots emptied (a member left, a dead member's slot taken back) and not taken again
/// since, as far as anyone counted: while not 0, a joiner looks for an empty slot among
/// those handed out before taking a new one (a hint).
pub const H_JOIN_FREED: usize = 9;
/// Where a joiner's search of the slots starts: each search moves it on by one, so
/// joiners searching at once start apart.
pub const H_JOIN_CURSOR: usize = 10;
/// When a joiner of a large pool last swept it for dead members, ms since the Unix
/// epoch: the others skip their sweep within `JOIN_SWEEP_EVERY_MS` of it.
pub const H_JOIN_SWEPT_MS: usize = 11;
/// In a claim's memfd only (0 in a file): the device and inode of the pool file its words
/// were made from. The members' liveness locks are on that file: a joiner whose file at
/// the claim's path is another (one renamed over it while they run, a copy of it
/// included) would find every member dead there and take their bytes back, so it does
/// not join through it.
pub const H_FILE_DEV: usize = 12;
pub const H_FILE_INO: usize = 13;

// GPU entry words.
pub const G_KEY: usize = 0;
pub const G_UUID: usize = 1; // and 2
pub const G_CAP: usize = 3;
/// Bytes every member holds on the GPU (low [`USED_BITS`] bits) and a count of the
/// changes (the bits above), so that a compare-and-swap fails after any change, even
/// one that left the bytes as they were (no ABA). See `used`.
pub const G_USED: usize = 4;
pub const G_PEAK: usize = 5;
pub const G_LOCK: usize = 6;
pub const G_REFUSALS: usize = 7;
pub const G_LARGEST_REFUSED: usize = 8;
/// The least of the recent contexts the last member to measure one on this GPU measured
/// (`Member::note_context_bytes`), stored inverted (`!bytes`; 0: none yet): a member reserves it before the driver makes its own first context
/// there, so that a context the pool cannot take is refused before it is made.
pub const G_CONTEXT_BYTES: usize = 15;
/// How many members wait for memory on this GPU (`GPUCAP_WAIT`): a hint read on the
/// way of every credit (0: nobody to wake), recounted when a dead member is taken back.
pub const G_WAITERS: usize = 9;
/// The last ticket handed to a waiter: waiters are served in ticket order.
pub const G_TICKET: usize = 10;
/// The futex word waiters sleep on (its low 32 bits): bumped when memory is freed.
pub const G_WAIT_SEQ: usize = 11;
/// Waits that ended (served or timed out), and their total time in milliseconds.
pub const G_WAITS: usize = 12;
pub const G_WAIT_MS: usize = 13;
/// Since when the word lock's holder has kept a member waiting: the holder (+1) in the
/// low 16 bits, ms since the Unix epoch above them (0: nobody waited for this holder).
/// Written by the first member that goes to sleep on the lock, never by a holder.
pub const G_LOCK_SINCE: usize = 14;
/// The contexts the members are making on this GPU now (low 32 bits) and how many were
/// ever started (the bits above, wrapping): read at a context's start and end, they
/// tell whether another member's context was made inside its measurement (see
/// `context_flight`).
pub const G_CONTEXTS: usize = 16;
/// How many times the cap word was changed by a resize (`gpucap pool resize`), times
/// two: odd while a resize is under way, even once its cap is in force (see `resize`).
/// A member that saw another value than the one it last read takes the cap word as its
/// cap; with the value it last read, a cap word that differs is another process's
/// damage, repaired.
pub const G_CAP_GEN: usize = 17;
/// One in flight, and one more started, in [`G_CONTEXTS`].
pub const CONTEXT_STARTED: u64 = 1 | 1 << 32;
pub const CONTEXTS_IN_FLIGHT: u64 = 0xffff_ffff;

/// The bits of `used` that hold bytes (256 TiB); the 16 above count changes.
pub const USED_BITS: u32 = 48;
pub const USED_BYTES: u64 = (1 << USED_BITS) - 1;

/// The bytes a `used` word holds.
#[inline]
pub fn used_bytes(word: u64) -> u64 {
    word & USED_BYTES
}

/// The `used` word that follows `prev` when the bytes become `bytes`: one more change.
#[inline]
pub fn used_word(prev: u64, bytes: u64) -> u64 {
    (prev & !USED_BYTES).wrapping_add(1 << USED_BITS) | bytes.min(USED_BYTES)
}

/// The `lock` word: the holder's slot (+1) in the low 16 bits, and this bit while a
/// member sleeps on the word (its release then wakes them).
pub const LOCK_HOLDER: u64 = 0xffff;
pub const LOCK_WAITING: u64 = 1 << 16;

// Member slot words (a slot's state is in the states array).
/// When a waiting thread of this member last looked at a queue (`GPUCAP_WAIT`), in
/// milliseconds since the epoch; 0: never (or a build before the word had a use). A
/// waiter that has not looked for [`STALE_WAITER_MS`] (stopped: SIGSTOP, a debugger, a
/// frozen container) is passed over by the waiters behind it until it looks again.
pub const S_WAIT_LOOK: usize = 0;
/// See [`S_WAIT_LOOK`]: twenty of a waiter's rechecks (50 ms each) missed.
pub const STALE_WAITER_MS: u64 = 1000;

/// The clock of the file's time words ([`H_JOIN_SWEPT_MS`], [`G_LOCK_SINCE`],
/// [`S_WAIT_LOOK`]): milliseconds since the Unix epoch, 0 where the clock is before it.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
/// The member's pid as it sees itself (the low 32 bits) and its user: uid + 1 in the high
/// 32 bits (0: not said), what `gpucap status` and `top` show (a claim's or a container's
/// pool has members of several users, its file one owner). See [`pid_word`].
pub const S_PID: usize = 1;
/// The [`S_PID`] word of process `pid` of user `uid`.
pub const fn pid_word(pid: u32, uid: u32) -> u64 {
    let uid = if uid == u32::MAX { u32::MAX - 1 } else { uid };
    (uid as u64 + 1) << 32 | pid as u64
}
/// The pid an [`S_PID`] word holds.
pub const fn word_pid(word: u64) -> u32 {
    word as u32
}
/// The uid an [`S_PID`] word holds, None where it says none.
pub const fn word_uid(word: u64) -> Option<u32> {
    match word >> 32 {
        0 => None,
        n => Some((n - 1) as u32),
    }
}
pub const S_PIDNS: usize = 2;
pub const S_START_MS: usize = 3;
pub const S_GENERATION: usize = 4;
pub const S_COMMAND: usize = 5; // 8 words
/// The GPU entries (one bit each) on which this member is making a context now: counted
/// in their [`G_CONTEXTS`], taken out of it by whoever takes a dead member's slot back.
pub const S_CONTEXTS: usize = 13;
/// What `gpucap pool set` did to this member's guarantee and ceiling since it joined:
/// how many changes, on any GPU entry (the high 32 bits, [`SHARE_GEN_COUNT`] each), and
/// the GPU entries changed (one bit each, the low 32 bits). The member takes its share
/// words as its own share only when the word moved since it last looked; other changes
/// of its words are damage, written back. Its claim at join leaves a changed entry's
/// words as the change wrote them (see `share_set`).
pub const S_SHARE_GEN: usize = 14;
/// One change counted in [`S_SHARE_GEN`].
pub const SHARE_GEN_COUNT: u64 = 1 << 32;
const _: () = assert!(MAX_POOL_GPUS <= 32, "S_SHARE_GEN has a bit per GPU entry");
/// Where a ceiling handed down to the member came from (`config::HandedDown`'s word,
/// in the high 32 bits; 0: none) and the GPU entries (one bit each, the low 32 bits) on
/// which it is held at that ceiling: what `gpucap status` shows. Written once at join,
/// read by nobody that decides.
pub const S_HANDED: usize = 15;
// Per GPU, at SLOT_HEAD_WORDS + g * PER_GPU_WORDS:
pub const M_USED: usize = 0;
pub const M_PEAK: usize = 1;
/// Bytes of this member's changes of `used` in flight (added before the change, taken
/// off after it): a recount counts them as held, so it never counts less than the
/// pool's `used` holds for the member (see `used`).
pub const M_PENDING: usize = 2;
/// The cap this member holds the GPU to (encoded as `G_CAP`; 0: the member does not use it).
pub const M_CAP: usize = 3;
/// The ticket this member waits with on the GPU (0: not waiting).
pub const M_WAIT: usize = 4;

// Traffic marks, per member per GPU (`Words::mark`; see `marks`).
/// Bytes of this member's frees announced and not yet credited or withdrawn: the
/// driver may be freeing them now.
pub const T_FREEING: usize = 0;
/// Every byte this slot's members ever announced they free: only goes up, never
/// cleared (so do the next three).
pub const T_FREED: usize = 1;
/// Every byte of the slot's reservations made before their driver call...
pub const T_STARTED: usize = 2;
/// ...of those the driver allocated (marked after its call)...
pub const T_MADE: usize = 3;
/// ...and of those it did not (refused, rolled back, or memory the driver takes later).
pub const T_UNMADE: usize = 4;
/// Of the bytes in `T_FREED`, those whose announcement was withdrawn (the driver refused,
/// or an upper bound ended: a raise set back, a lowered limit, graph or pool memory
/// trimmed), which the driver may not have given back: a measurement whose window holds
/// them may be this much above what its call took.
pub const T_UNSURE: usize = 5;

// Share words, per member per GPU.
pub const SH_GUARANTEE: usize = 0;
pub const SH_CEILING: usize = 1;

pub const STATE_EMPTY: u64 = 0;
pub const STATE_LIVE: u64 = 1;

/// A GPU's cap as stored: 0 = not set yet, `u64::MAX` = no cap, else cap + 1.
pub fn encode_cap(cap: Option<u64>) -> u64 {
    match cap {
        None => u64::MAX,
        Some(c) => c.saturating_add(1),
    }
}

/// The short path's limit for a cap word (`G_CAP` encoding): the cap in bytes, never
/// past what `used` can hold (also with no cap).
pub fn limit_of(word: u64) -> u64 {
    decode_cap(word)
        .flatten()
        .unwrap_or(USED_BYTES)
        .min(USED_BYTES)
}

/// The cap a stored word means (None: not set yet; Some(None): no cap).
pub fn decode_cap(word: u64) -> Option<Option<u64>> {
    match word {
        0 => None,
        u64::MAX => Some(None),
        w => Some(Some(w - 1)),
    }
}

/// The key of a GPU entry: the UUID folded into a word, never 0 (0 = empty entry).
pub fn gpu_key(uuid: &[u8; 16]) -> u64 {
    let lo = u64::from_le_bytes(uuid[..8].try_into().unwrap_or([0; 8]));
    let hi = u64::from_le_bytes(uuid[8..].try_into().unwrap_or([0; 8]));
    match lo ^ hi.rotate_left(17) {
        0 => 1,
        k => k,
    }
}

/// A corrupted pool file, saying what is wrong in it.
fn corrupt<T>(what: String) -> Result<T, LayoutError> {
    Err(LayoutError::Corrupt { what })
}

/// The member slots' states, checked against `seen`, the count of slots ever taken as
/// read before them. A member that joins while they are read raises the count before it
/// is marked live (`Member::join`): a slot seen live past `seen` has the count read again
/// (seeing the slot live with Acquire, that read sees the count its member raised), and
/// only a live slot past that one is a corrupted count. (Read once, a process joining
/// beside others would take their pool file for a corrupted one and refuse to join it.)
pub(super) fn check_slots(w: Words<'_>, mut seen: u64) -> Result<(), LayoutError> {
    for (s, state) in w.states().iter().enumerate() {
        let state = state.load(Acquire);
        if state > STATE_LIVE {
            return corrupt(format!("member slot {s} has state {state}"));
        }
        if state == STATE_LIVE && s as u64 >= seen {
            seen = w.header(H_SLOTS_SEEN).load(Acquire);
            if s as u64 >= seen {
                return corrupt(format!(
                    "member slot {s} is live but only {seen} slots were ever taken"
                ));
            }
        }
    }
    Ok(())
}

/// One GPU entry's guarantee and ceiling words of every slot ([`Words::shares_of`]).
#[derive(Clone, Copy)]
pub struct SlotShares<'a> {
    words: &'a [[AtomicU64; SHARE_WORDS]],
    /// Where they start in the file (noted in tests: `touched`).
    #[cfg(test)]
    at: usize,
}

impl<'a> SlotShares<'a> {
    /// Slot `s`'s guarantee and ceiling words (`SH_GUARANTEE`, `SH_CEILING`).
    #[inline]
    pub fn get(&self, s: usize) -> Option<&'a [AtomicU64; SHARE_WORDS]> {
        #[cfg(test)]
        super::touched::note(self.at + s * SHARE_WORDS, SHARE_WORDS);
        self.words.get(s)
    }
}

/// The words of a pool file, checked, and where its parts are (they follow from its
/// member count).
#[derive(Clone, Copy)]
pub struct Words<'a> {
    pub words: &'a [AtomicU64],
    slots: usize,
    bits: usize,
    slots_at: usize,
    shares_at: usize,
    marks_at: usize,
}

impl<'a> Words<'a> {
    /// The words of a file of `slots` members (`words` already checked to be as long).
    fn of(words: &'a [AtomicU64], slots: usize) -> Self {
        Words {
            words,
            slots,
            bits: share_bits_words(slots),
            slots_at: slots_at(slots),
            shares_at: shares_at(slots),
            marks_at: marks_at(slots),
        }
    }

    /// Writes the header of a new pool file of `slots` members (all other words must be
    /// zero).
    pub fn init(
        words: &'a [AtomicU64],
        slots: usize,
        created_secs: u64,
        uid: u64,
    ) -> Result<Self, LayoutError> {
        let slots = slots.clamp(1, MAX_SLOTS);
        if words.len() != pool_words(slots) {
            return Err(LayoutError::Size {
                bytes: words.len() * 8,
                expected: pool_file_bytes(slots),
            });
        }
        words[H_VERSION].store(POOL_VERSION, Relaxed);
        words[H_GEOMETRY].store(geometry(slots), Relaxed);
        words[H_BYTES].store(pool_file_bytes(slots) as u64, Relaxed);
        words[H_CREATED].store(created_secs, Relaxed);
        words[H_UID].store(uid, Relaxed);
        words[H_MAGIC].store(MAGIC, Release);
        Ok(Words::of(words, slots))
    }

    /// Checks the header and every word whose values are bounded.
    pub fn check(words: &'a [AtomicU64]) -> Result<Self, LayoutError> {
        let first = |i: usize| words.get(i).map(|w| w.load(Acquire));
        if let Some(magic) = first(H_MAGIC)
            && magic != MAGIC
        {
            return Err(LayoutError::Magic {
                found: magic.to_le_bytes(),
            });
        }
        // Before the length: another version may have another length.
        let version = first(H_VERSION);
        if let Some(version) = version
            && version != POOL_VERSION
        {
            return Err(LayoutError::Version { found: version });
        }
        if words.len() < HEADER_WORDS {
            return Err(LayoutError::Size {
                bytes: words.len() * 8,
                expected: POOL_FILE_BYTES,
            });
        }
        let found = words[H_GEOMETRY].load(Relaxed);
        let slots = match geometry_slots(found) {
            Some(n) => n,
            _ => {
                return corrupt(format!(
                    "geometry word {found:#x}, expected {:#x} with a member count of 1 to \
                     {MAX_SLOTS}",
                    geometry(0)
                ));
            }
        };
        if words.len() != pool_words(slots) {
            return Err(LayoutError::Size {
                bytes: words.len() * 8,
                expected: pool_file_bytes(slots),
            });
        }
        let bytes = words[H_BYTES].load(Relaxed);
        if bytes != pool_file_bytes(slots) as u64 {
            return corrupt(format!(
                "length word {bytes}, expected {}",
                pool_file_bytes(slots)
            ));
        }
        let w = Words::of(words, slots);
        for g in 0..MAX_POOL_GPUS {
            // The key last: a member counts memory on an entry or takes its word lock only
            // once it found the entry's key, so what these reads see of a member that is
            // registering the GPU right now shows its key too (Acquire).
            let lock = w.gpu(g, G_LOCK).load(Acquire);
            let used = w.used(g);
            let key = w.gpu(g, G_KEY).load(Acquire);
            if lock & !LOCK_WAITING > slots as u64 {
                return corrupt(format!(
                    "GPU entry {g} is locked by member {lock}, past {slots}"
                ));
            }
            if key == 0 && (used != 0 || lock != 0) {
                return corrupt(format!("GPU entry {g} is empty but has memory in use"));
            }
        }
        // A member raises the count of slots ever taken before it is marked live, so a
        // live slot past it is a corrupted count (the traffic marks would skip it).
        check_slots(w, w.header(H_SLOTS_SEEN).load(Acquire))?;
        Ok(w)
    }

    /// The file's member slots (its creator's `GPUCAP_POOL_MEMBERS`).
    #[inline]
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The file's version.
    pub fn version(&self) -> u64 {
        self.header(H_VERSION).load(Relaxed)
    }

    /// Word `i` (noted in tests: `touched`).
    #[inline(always)]
    fn at(&self, i: usize) -> &'a AtomicU64 {
        #[cfg(test)]
        super::touched::note(i, 1);
        &self.words[i]
    }

    pub fn header(&self, i: usize) -> &'a AtomicU64 {
        self.at(i)
    }

    /// The bytes GPU entry `g`'s `used` word says every member holds.
    #[inline]
    pub fn used(&self, g: usize) -> u64 {
        used_bytes(self.gpu(g, G_USED).load(Acquire))
    }

    pub fn gpu(&self, g: usize, i: usize) -> &'a AtomicU64 {
        self.at(HEADER_WORDS + g * GPU_WORDS + i)
    }

    /// Whether GPU entry `g` holds a GPU (its key is set).
    #[inline]
    pub fn has_gpu(&self, g: usize) -> bool {
        self.gpu(g, G_KEY).load(Acquire) != 0
    }

    /// Slot `s`'s state ([`STATE_EMPTY`], [`STATE_LIVE`]; any other value: corrupted).
    #[inline]
    pub fn state(&self, s: usize) -> &'a AtomicU64 {
        self.at(STATES_AT + s)
    }

    /// Every slot's state, at once (one bounds check for a scan of them all).
    #[inline]
    pub fn states(&self) -> &'a [AtomicU64] {
        #[cfg(test)]
        super::touched::note(STATES_AT, self.slots);
        &self.words[STATES_AT..STATES_AT + self.slots]
    }

    pub fn slot(&self, s: usize, i: usize) -> &'a AtomicU64 {
        self.at(self.slots_at + s * SLOT_WORDS + i)
    }

    pub fn member_gpu(&self, s: usize, g: usize, i: usize) -> &'a AtomicU64 {
        self.slot(s, SLOT_HEAD_WORDS + g * PER_GPU_WORDS + i)
    }

    /// GPU entry `g`'s words, all at once (one bounds check for the lot).
    #[inline]
    pub fn gpu_all(&self, g: usize) -> Option<&'a [AtomicU64; GPU_WORDS]> {
        let at = HEADER_WORDS + g * GPU_WORDS;
        self.words.get(at..at + GPU_WORDS)?.try_into().ok()
    }

    /// Slot `s`'s words for GPU entry `g`, all at once.
    #[inline]
    pub fn member_gpu_all(&self, s: usize, g: usize) -> Option<&'a [AtomicU64; PER_GPU_WORDS]> {
        let at = self.slots_at + s * SLOT_WORDS + SLOT_HEAD_WORDS + g * PER_GPU_WORDS;
        self.words.get(at..at + PER_GPU_WORDS)?.try_into().ok()
    }

    /// GPU entry `g`'s guarantee and ceiling words of every slot, for a scan of them (one
    /// bounds check for the lot).
    #[inline]
    pub fn shares_of(&self, g: usize) -> SlotShares<'a> {
        let at = self.shares_at + MAX_POOL_GPUS * self.bits + g * self.slots * SHARE_WORDS;
        SlotShares {
            words: self
                .words
                .get(at..at + self.slots * SHARE_WORDS)
                .map_or(&[], |w| w.as_chunks().0),
            #[cfg(test)]
            at,
        }
    }

    /// Slot `s`'s traffic mark `i` (`T_FREEING` ...) on GPU entry `g` (one GPU's marks of
    /// every slot lie together: a measurement reads a few pages).
    #[inline]
    pub fn mark(&self, s: usize, g: usize, i: usize) -> &'a AtomicU64 {
        self.at(self.marks_at + (g * self.slots + s) * MARK_WORDS + i)
    }

    /// The traffic marks on GPU entry `g` of the first `n` slots (at most every slot), at
    /// once: a scan of them checks bounds once.
    #[inline]
    pub fn marks_of(&self, g: usize, n: usize) -> &'a [[AtomicU64; MARK_WORDS]] {
        let at = self.marks_at + g * self.slots * MARK_WORDS;
        let n = n.min(self.slots);
        #[cfg(test)]
        super::touched::note(at, n * MARK_WORDS);
        self.words
            .get(at..at + n * MARK_WORDS)
            .map_or(&[], |w| w.as_chunks().0)
    }

    /// Slot `s`'s traffic marks on GPU entry `g`, all at once.
    #[inline]
    pub fn marks_all(&self, s: usize, g: usize) -> Option<&'a [AtomicU64; MARK_WORDS]> {
        if s >= self.slots {
            return None;
        }
        let at = self.marks_at + (g * self.slots + s) * MARK_WORDS;
        self.words.get(at..at + MARK_WORDS)?.try_into().ok()
    }

    /// Word `k` of GPU entry `g`'s bits of the slots that hold a guarantee.
    pub fn share_bits(&self, g: usize, k: usize) -> &'a AtomicU64 {
        &self.share_bits_of(g)[k]
    }

    /// The words of GPU entry `g`'s bits of the slots that hold a guarantee (one bit
    /// per slot, then zeros up to a whole 256).
    pub fn share_bits_of(&self, g: usize) -> &'a [AtomicU64] {
        let at = self.shares_at + g * self.bits;
        #[cfg(test)]
        super::touched::note(at, self.bits);
        &self.words[at..at + self.bits]
    }

    /// GPU entry `g`'s bits of the slots that hold a guarantee: the first 256 slots'
    /// words at once, and the rest's (empty in a pool of 256 members or fewer).
    #[inline]
    pub fn share_bits_split(
        &self,
        g: usize,
    ) -> Option<(&'a [AtomicU64; SHARE_HEAD_WORDS], &'a [AtomicU64])> {
        let at = self.shares_at + g * self.bits;
        let all = self.words.get(at..at + self.bits)?;
        let (head, rest) = all.split_at_checked(SHARE_HEAD_WORDS)?;
        Some((head.try_into().ok()?, rest))
    }

    /// Slot `s`'s share word `i` for GPU entry `g` (one GPU's words of every slot lie
    /// together: a look over them reads a few pages).
    pub fn share(&self, s: usize, g: usize, i: usize) -> &'a AtomicU64 {
        self.at(self.shares_at + MAX_POOL_GPUS * self.bits + (g * self.slots + s) * SHARE_WORDS + i)
    }

    pub fn uuid(&self, g: usize) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.gpu(g, G_UUID).load(Relaxed).to_le_bytes());
        out[8..].copy_from_slice(&self.gpu(g, G_UUID + 1).load(Relaxed).to_le_bytes());
        out
    }

    pub fn command(&self, s: usize) -> String {
        let mut bytes = Vec::with_capacity(COMMAND_BYTES);
        for i in 0..COMMAND_BYTES / 8 {
            bytes.extend_from_slice(&self.slot(s, S_COMMAND + i).load(Relaxed).to_le_bytes());
        }
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    pub fn set_command(&self, s: usize, command: &str) {
        let mut bytes = [0u8; COMMAND_BYTES];
        let mut n = command.len().min(COMMAND_BYTES - 1);
        while !command.is_char_boundary(n) {
            n -= 1;
        }
        bytes[..n].copy_from_slice(&command.as_bytes()[..n]);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            self.slot(s, S_COMMAND + i).store(word, Relaxed);
        }
    }
}
