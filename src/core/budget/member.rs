//! A pool member, and agreeing on caps (joining and sweeping for the dead: `join`).
//!
//! A member owns a slot while its process holds the slot's kernel lock
//! ([`MemberLocks`]: an open-file-description lock on the pool file, which the kernel
//! drops when the process dies, however it dies). Whoever can take a live slot's lock
//! knows its owner is dead: no pid is compared, so a recycled pid or another PID
//! namespace cannot fool it. The taker clears the dead member's words (its use and the
//! bytes it had in flight), counts the pool's `used` again and empties the slot.

use std::fmt;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};

use super::gpu_words::GpuWords;
use super::layout;
use super::notes::{Repair, WaitNote};
use super::reclaim::Exit;
use crate::config::MAX_DEVICES;

/// How long a resize waits for another one under way before taking it over (its
/// resizer died half-way: a resize takes a few microseconds), where the lock of the
/// GPU's turn cannot say whether its holder lives ([`MemberLocks::take_turn`]).
pub const RESIZE_TAKEOVER: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a `gpucap pool resize` or `pool set` waits for the turn a live process holds
/// (a change takes microseconds: one stopped half-way) before it gives up, changing
/// nothing.
pub const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What [`MemberLocks::take_turn`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnLock {
    /// This process holds the turn's lock until [`MemberLocks::give_back_turn`]: any
    /// other holder of the turn (a generation left odd) died half-way.
    Taken,
    /// A live process held it all the time allowed.
    Busy,
    /// The lock cannot say: the generation word alone orders the changes, and one
    /// left odd is taken over after [`RESIZE_TAKEOVER`].
    Untold,
}

/// What a member needs of the kernel, provided by the code that maps the file: the
/// per-slot locks, and sleeping on a word of the file until another process wakes it.
pub trait MemberLocks: Sync {
    /// Sleeps while `word` still holds `seen` (its low 32 bits), at most `timeout`, or
    /// until [`wake`](Self::wake). May return early.
    fn sleep_on(
        &self,
        word: &std::sync::atomic::AtomicU64,
        seen: u64,
        timeout: std::time::Duration,
    ) {
        let _ = (word, seen);
        std::thread::sleep(timeout.min(std::time::Duration::from_millis(1)));
    }
    /// Wakes every process sleeping on `word`.
    fn wake(&self, word: &std::sync::atomic::AtomicU64) {
        let _ = word;
    }
    /// Takes slot `s`'s lock without waiting. True: this process now holds it, so no
    /// other process does (whoever held it is dead). False: another process holds it,
    /// or another thread of this process is acting on that slot.
    fn try_take(&self, s: usize) -> bool;
    /// Gives back a lock taken with [`try_take`](Self::try_take).
    fn give_back(&self, s: usize);
    /// Whether a live process (this one included) holds slot `s`'s lock. Changes nothing.
    fn held(&self, s: usize) -> bool;
    /// What the kernel shows of a dead member's process, `pid` in PID namespace
    /// `pid_namespace` (0: unknown), which joined at `start_ms` (ms since the Unix
    /// epoch): whether its teardown, device files included, is over (see `reclaim`).
    fn exiting(&self, pid: u32, pid_namespace: u64, start_ms: u64) -> Exit {
        let _ = (pid, pid_namespace, start_ms);
        Exit::Done
    }
    /// Whether forked children of slot `s`'s member (or their own children) still hold
    /// its device files, and so the driver still holds its memory however it died (see
    /// `reclaim`). Changes nothing.
    fn descendants_hold(&self, s: usize) -> bool {
        let _ = s;
        false
    }
    /// Whether a lock was refused for another reason than another holder (a file
    /// system without these locks): no slot can be taken, so a joiner does not wait for
    /// one.
    fn refusing(&self) -> bool {
        false
    }
    /// Takes the lock of GPU entry `g`'s turn, held by the one `gpucap pool resize` or
    /// `pool set` changing its cap or shares (`resize::take_turn`) for as long as its
    /// process lives, waiting at most `max` while another live process holds it.
    fn take_turn(&self, g: usize, max: std::time::Duration) -> TurnLock {
        let _ = (g, max);
        TurnLock::Untold
    }
    /// Gives back the lock [`take_turn`](Self::take_turn) took.
    fn give_back_turn(&self, g: usize) {
        let _ = g;
    }
}

/// A checked pool file.
#[derive(Clone, Copy)]
pub struct Pool<'a> {
    pub(super) w: layout::Words<'a>,
}

impl<'a> Pool<'a> {
    /// Writes the header of a freshly made (all-zero) pool file of [`layout::DEFAULT_SLOTS`]
    /// members.
    pub fn create(
        words: &'a [std::sync::atomic::AtomicU64],
        created_secs: u64,
        uid: u64,
    ) -> Result<Self, layout::LayoutError> {
        Self::create_with(words, layout::DEFAULT_SLOTS, created_secs, uid)
    }

    /// Writes the header of a freshly made (all-zero) pool file of `slots` members
    /// (`words` must be [`pool_words`](super::pool_words)`(slots)` long).
    pub fn create_with(
        words: &'a [std::sync::atomic::AtomicU64],
        slots: usize,
        created_secs: u64,
        uid: u64,
    ) -> Result<Self, layout::LayoutError> {
        Ok(Pool {
            w: layout::Words::init(words, slots, created_secs, uid)?,
        })
    }

    /// How many members the pool holds at most (chosen when the file was made).
    pub fn slots(&self) -> usize {
        self.w.slots()
    }

    /// The file's layout version.
    pub fn version(&self) -> u64 {
        self.w.version()
    }

    /// Checks an existing pool file: another version, layout or corrupted words are errors.
    pub fn open(words: &'a [std::sync::atomic::AtomicU64]) -> Result<Self, layout::LayoutError> {
        Ok(Pool {
            w: layout::Words::check(words)?,
        })
    }

    /// The uid of the process that created the file.
    pub fn creator_uid(&self) -> u64 {
        self.w.header(layout::H_UID).load(Relaxed)
    }
}

/// What a member tells the others about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberInfo {
    pub pid: u32,
    /// The process's effective uid (shown beside its pid: a claim's members may be
    /// several users').
    pub uid: u32,
    /// The inode of the process's PID namespace (`/proc/self/ns/pid`), 0 if unknown.
    pub pid_namespace: u64,
    /// When it joined, in ms since the Unix epoch.
    pub start_ms: u64,
    pub command: String,
}

/// Why a process could not join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinError {
    /// Every one of the pool's `slots` slots is held by a live process (after waiting
    /// `waited`, under `GPUCAP_WAIT`).
    Full {
        slots: usize,
        waited: std::time::Duration,
    },
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Full { slots, waited } => {
                write!(
                    f,
                    "the pool has {slots} live members already, the most it can hold"
                )?;
                if !waited.is_zero() {
                    write!(f, " (no slot freed within {} ms)", waited.as_millis())?;
                }
                write!(
                    f,
                    "; a pool holds the member count its file was made with: remove the \
                     file once no process uses it and start the first member with \
                     GPUCAP_POOL_MEMBERS=N (at most {}; default {})",
                    layout::MAX_SLOTS,
                    layout::DEFAULT_SLOTS
                )?;
                if waited.is_zero() {
                    write!(f, ", or set GPUCAP_WAIT to wait for a member to leave")?;
                }
                Ok(())
            }
        }
    }
}

/// Why a GPU could not be registered with its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapMismatch {
    /// Live members hold the GPU to another cap (None: no cap).
    Differs {
        ours: Option<u64>,
        pool: Option<u64>,
    },
    /// The pool's GPU table is full.
    TooManyGpus,
}

impl CapMismatch {
    /// What a process refused for it is told, for its GPU `ordinal` (the library at
    /// `cuInit`, `gpucap check` before it).
    pub fn text(&self, ordinal: usize) -> String {
        let b = crate::size::format_bytes;
        match self {
            CapMismatch::Differs { ours, pool } => {
                // Each side in words that read as a sentence: "at no cap" would not.
                let sides = match (ours, pool) {
                    (Some(o), Some(p)) => format!(
                        "this process caps GPU {ordinal} at {}, the pool's live members at {}",
                        b(*o),
                        b(*p)
                    ),
                    (None, Some(p)) => format!(
                        "this process sets no cap on GPU {ordinal}, the pool's live members \
                         cap it at {}",
                        b(*p)
                    ),
                    (Some(o), None) => format!(
                        "this process caps GPU {ordinal} at {}, the pool's live members set \
                         no cap on it",
                        b(*o)
                    ),
                    (None, None) => format!("GPU {ordinal}: neither side sets a cap"),
                };
                format!("{sides} (every member of a pool must set the same GPUCAP_LIMIT)")
            }
            CapMismatch::TooManyGpus => format!(
                "GPU {ordinal}: a pool holds {} GPUs at most",
                layout::MAX_POOL_GPUS
            ),
        }
    }
}

/// In a [`Member`]'s `route`: the member holds a guarantee or a ceiling there.
pub(super) const OWN_SHARE: u32 = 1 << 31;

/// `GPUCAP_WAIT`, and what to tell of a wait.
pub(super) type Waiting = (std::time::Duration, fn(&WaitNote));

/// One process's membership of a pool.
pub struct Member<'a> {
    pub(super) w: layout::Words<'a>,
    pub(super) slot: usize,
    /// Per GPU entry, the words this member's changes there touch (see `hot`): None
    /// only past a layout the file check refused.
    pub(super) hot: [Option<GpuWords<'a>>; layout::MAX_POOL_GPUS],
    /// Masks of the first 256 slots' guarantee bits words (`GpuWords::bits`): every bit but
    /// this slot's.
    pub(super) not_me: [u64; layout::SHARE_HEAD_WORDS],
    pub(super) locks: &'a dyn MemberLocks,
    /// The pool's GPU entry (+1) of each CUDA ordinal of this process (0: none yet).
    pub(super) entry_of: [AtomicU32; MAX_DEVICES],
    /// The short path's way for each CUDA ordinal of this process, once registered and
    /// until the member left: its GPU entry (+1), with [`OWN_SHARE`] if this member holds
    /// a guarantee or a ceiling there; 0: ask the rest (`try_reserve`).
    pub(super) route: [AtomicU32; MAX_DEVICES],
    /// Set once the member gave its share back at exit: later changes are ignored.
    pub(super) left: AtomicBool,
    /// `GPUCAP_WAIT` and what to tell of a wait (see [`Member::waiting`]).
    pub(super) wait: Option<Waiting>,
    /// One waiting thread per GPU of this process at a time; the others queue here.
    pub(super) wait_turn: [std::sync::Mutex<()>; layout::MAX_POOL_GPUS],
    /// Per GPU entry, the gate a thread of this process passes before its word lock
    /// (0 free, 1 taken, 2 taken with threads asleep on it).
    pub(super) gate: [AtomicU64; layout::MAX_POOL_GPUS],
    /// Per GPU entry, the cap this member registered (encoded as `G_CAP`; 0: none):
    /// the cap it enforces, whatever the shared cap word says.
    pub(super) caps: [AtomicU64; layout::MAX_POOL_GPUS],
    /// Per GPU entry, the most the pool's use may reach, for the short path: the same
    /// cap in bytes, never past what `used` can hold (`USED_BYTES`, also with no cap).
    pub(super) limit: [AtomicU64; layout::MAX_POOL_GPUS],
    /// Per GPU entry, the cap generation (`G_CAP_GEN`) whose cap `caps` and `limit`
    /// hold (see `resize`).
    pub(super) cap_gen: [AtomicU64; layout::MAX_POOL_GPUS],
    /// Hears of every impossible word found and repaired (see [`Member::on_repair`]; None
    /// until then: kept in `early`, told when it is set).
    pub(super) note: Option<fn(&Repair)>,
    /// Repairs made while joining, before [`Member::on_repair`] said whom to tell.
    pub(super) early: std::sync::Mutex<Vec<Repair>>,
    /// Per GPU entry, the guarantee and ceiling this member claimed (as its share words
    /// hold them; 0: none), kept in its own memory: what it decides by, and what it
    /// writes back over share words another process changed (see `repair`).
    pub(super) own: [[AtomicU64; layout::SHARE_WORDS]; layout::MAX_POOL_GPUS],
    /// Per GPU entry, the slot's share change count (`S_SHARE_GEN`) when this member
    /// last took its share words there as its own (see `share_set`).
    pub(super) share_seen: [AtomicU64; layout::MAX_POOL_GPUS],
}

impl<'a> Member<'a> {
    /// Allocations the pool cannot take now wait up to `max` for members to free memory
    /// (`GPUCAP_WAIT`), in arrival order; `note` hears when a wait starts and ends.
    pub fn waiting(
        mut self: Box<Self>,
        max: std::time::Duration,
        note: fn(&WaitNote),
    ) -> Box<Self> {
        if !max.is_zero() {
            self.wait = Some((max, note));
        }
        self
    }

    /// Every impossible word this member finds and repairs (a word lock no member can
    /// hold, a `used` or cap word another process changed) is reported to `note`; repairs
    /// made before (while joining) are reported now.
    pub fn on_repair(mut self: Box<Self>, note: fn(&Repair)) -> Box<Self> {
        self.note = Some(note);
        let early = std::mem::take(&mut *self.early.lock().unwrap_or_else(|p| p.into_inner()));
        for r in &early {
            note(r);
        }
        self
    }

    /// Reports repair `r` to the member's note, or keeps it until
    /// [`on_repair`](Self::on_repair) names one.
    pub(super) fn report_repair(&self, r: &Repair) {
        match self.note {
            Some(note) => note(r),
            None => self
                .early
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(*r),
        }
    }

    /// This member's slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Registers CUDA ordinal `device` (the GPU `uuid`) with this member's cap for it.
    /// Every live member of the pool must hold a GPU to the same cap; once none does,
    /// the next member's cap replaces the old one.
    pub fn register_gpu(
        &self,
        device: usize,
        uuid: &[u8; 16],
        cap: Option<u64>,
    ) -> Result<(), CapMismatch> {
        let Some(slot_of_device) = self.entry_of.get(device) else {
            return Err(CapMismatch::TooManyGpus);
        };
        let g = self.entry(uuid).ok_or(CapMismatch::TooManyGpus)?;
        let word = self.w.gpu(g, layout::G_CAP);
        let own = layout::encode_cap(cap);
        let mut resized = 0;
        let started = std::time::Instant::now();
        let (ours, generation) = 'register: loop {
            // A pool resized while members hold it keeps the cap it was resized to: a
            // member started with another `GPUCAP_LIMIT` takes the pool's (`resize`).
            let (ours, generation, seen) = self.cap_to_register(g, own);
            let adopted = ours != own;
            // Ours first, then the others': of two members registering different caps
            // at once, at least one sees the other (both orders are sequentially
            // consistent). The live members' own cap words decide, not the shared one:
            // a cap word another process zeroed does not let a new cap in beside theirs.
            self.w
                .member_gpu(self.slot, g, layout::M_CAP)
                .store(ours, SeqCst);
            #[cfg(test)]
            self.queued_step();
            let mut have = word.load(SeqCst);
            // Bounded: each failed swap means another member registered meanwhile;
            // after as many as there are slots, the others' caps are known from their
            // slots.
            for _ in 0..=self.w.slots() {
                if have == ours || adopted {
                    break 'register (ours, generation);
                }
                if let Some(theirs) = self.other_live_cap(g, ours) {
                    if resized < 4 && self.w.gpu(g, layout::G_CAP_GEN).load(SeqCst) != seen {
                        // Resized meanwhile: the others hold the resize's cap.
                        resized += 1;
                        continue 'register;
                    }
                    self.w
                        .member_gpu(self.slot, g, layout::M_CAP)
                        .store(0, SeqCst);
                    return Err(CapMismatch::Differs {
                        ours: cap,
                        pool: layout::decode_cap(theirs).flatten(),
                    });
                }
                // A resize under way when this member read the cap, or begun since: its
                // cap word is not to be replaced (the live members may not hold it
                // yet), the pool's cap is read again once it is in force (a resizer
                // that died half-way is waited for as long as the next one would).
                let now = self.w.gpu(g, layout::G_CAP_GEN).load(SeqCst);
                if now & 1 == 1 && started.elapsed() < RESIZE_TAKEOVER {
                    std::thread::yield_now();
                    continue 'register;
                }
                if resized < 4 && now != seen {
                    resized += 1;
                    continue 'register;
                }
                // Not set yet, set by members that are all gone, or not what the live
                // members hold: ours replaces it.
                match word.compare_exchange(have, ours, SeqCst, SeqCst) {
                    Ok(_) => break 'register (ours, generation),
                    Err(now) => have = now,
                }
            }
            break (ours, generation);
        };
        self.caps[g].store(ours, Relaxed);
        self.limit[g].store(layout::limit_of(ours), Relaxed);
        self.cap_gen[g].store(generation, Relaxed);
        slot_of_device.store(g as u32 + 1, Release);
        self.note_route(g);
        // The guarantees this joiner will be weighed against: none that cannot be.
        self.repair_shares(g);
        Ok(())
    }

    /// Sets the short path's way (`route`) of every CUDA ordinal on GPU entry `g` from
    /// this member's share (as it claimed it, `own`): called when it changes.
    pub(super) fn note_route(&self, g: usize) {
        if self.hot(g).is_none() {
            return;
        }
        let shared =
            self.own_word(g, layout::SH_GUARANTEE) | self.own_word(g, layout::SH_CEILING) != 0;
        let route = (g as u32 + 1) | if shared { OWN_SHARE } else { 0 };
        for (d, e) in self.entry_of.iter().enumerate() {
            if e.load(Acquire) == g as u32 + 1 {
                self.route[d].store(route, SeqCst);
            }
        }
    }

    /// The cap of a live member other than this one that holds GPU entry `g` to
    /// another cap than `ours`, if any. The states first (one array): only a live
    /// slot's own words are read, not a page of every slot's.
    fn other_live_cap(&self, g: usize, ours: u64) -> Option<u64> {
        (0..self.w.slots()).find_map(|s| {
            if s == self.slot || self.w.state(s).load(SeqCst) != layout::STATE_LIVE {
                return None;
            }
            let theirs = self.w.member_gpu(s, g, layout::M_CAP).load(SeqCst);
            (theirs != 0 && theirs != ours && self.locks.held(s)).then_some(theirs)
        })
    }

    /// The entry of GPU `uuid`, added if the pool has not seen it.
    fn entry(&self, uuid: &[u8; 16]) -> Option<usize> {
        let key = layout::gpu_key(uuid);
        for g in 0..layout::MAX_POOL_GPUS {
            let k = self.w.gpu(g, layout::G_KEY);
            let found = match k.load(Acquire) {
                cur if cur == key => true,
                0 => match k.compare_exchange(0, key, AcqRel, Acquire) {
                    Ok(_) => {
                        let lo = u64::from_le_bytes(uuid[..8].try_into().unwrap_or([0; 8]));
                        let hi = u64::from_le_bytes(uuid[8..].try_into().unwrap_or([0; 8]));
                        self.w.gpu(g, layout::G_UUID).store(lo, Relaxed);
                        self.w.gpu(g, layout::G_UUID + 1).store(hi, Relaxed);
                        true
                    }
                    Err(other) => other == key,
                },
                _ => false,
            };
            if found {
                return Some(g);
            }
        }
        None
    }

    /// The words this member's changes on GPU entry `g` touch.
    #[inline(always)]
    pub(super) fn hot(&self, g: usize) -> Option<&GpuWords<'a>> {
        self.hot.get(g)?.as_ref()
    }

    /// The pool's GPU entry of CUDA ordinal `device`, if registered.
    #[inline]
    pub(super) fn entry_of(&self, device: usize) -> Option<usize> {
        match self.entry_of.get(device)?.load(Acquire) {
            0 => None,
            g => Some(g as usize - 1),
        }
    }

    /// The pool's figures for CUDA ordinal `device`: (used by every member, cap, this
    /// member's use), or None if the device is not registered.
    pub fn usage(&self, device: usize) -> Option<(u64, Option<u64>, u64)> {
        let g = self.entry_of(device)?;
        self.refresh_cap(g);
        Some((
            self.w.used(g),
            layout::decode_cap(self.caps[g].load(Relaxed)).flatten(),
            self.w
                .member_gpu(self.slot, g, layout::M_USED)
                .load(Relaxed),
        ))
    }

    /// Records for `gpucap status` that this member is held at a ceiling handed down to
    /// it (`word`: where it came from, `config::HandedDown`'s word) on each of the CUDA
    /// ordinals `devices` it registered.
    pub fn mark_handed_down(&self, word: u64, devices: &[usize]) {
        let gpus = devices
            .iter()
            .filter_map(|&d| self.entry_of(d))
            .fold(0u64, |m, g| m | 1 << g);
        self.w
            .slot(self.slot, layout::S_HANDED)
            .store(if gpus == 0 { 0 } else { word << 32 | gpus }, Relaxed);
    }

    /// The pool itself, for a view.
    pub fn pool(&self) -> Pool<'a> {
        Pool { w: self.w }
    }

    /// The least any member measured a context on `device` to take (0: none measured
    /// yet, or the GPU is not registered): what a member reserves before its first
    /// context there is made.
    pub fn context_bytes(&self, device: usize) -> u64 {
        self.entry_of(device).map_or(0, |g| {
            match self.w.gpu(g, layout::G_CONTEXT_BYTES).load(Relaxed) {
                0 => 0,
                least => !least,
            }
        })
    }

    /// A context this member made on `device` was measured; `recent_least` is the least
    /// of this member's recent measurements there (`DeviceLock::expected`), `settled`
    /// whether it has a full window of them (`DeviceLock::expectation_settled`). The
    /// word (stored inverted; 0: none yet, so a measurement of 0 is a figure too) is
    /// lowered by any member's figure, and replaced by a settled one: a measurement is
    /// device-wide and errs both ways, so a high one must not become what every later
    /// member reserves and is charged at least, and a low one (or 0) must not stay the
    /// pool's figure for good, as the least-ever word did.
    pub fn note_context_bytes(&self, device: usize, recent_least: u64, settled: bool) {
        if let Some(g) = self.entry_of(device) {
            let word = self.w.gpu(g, layout::G_CONTEXT_BYTES);
            if settled {
                word.store(!recent_least, Relaxed);
            } else {
                word.fetch_max(!recent_least, Relaxed);
            }
        }
    }
}
