//! The short path of a reservation ([`Member::try_reserve`]): one word per CUDA ordinal
//! (`Member::route`) tells the way. A member with neither a guarantee nor a ceiling of
//! its own there makes one try of the cap alone ([`Plain`]) while no member holds a
//! guarantee on the GPU; anything else (its own share, another's guarantee, a swap lost
//! to another change) takes the whole rule (`Member::take_shared`), out of line. A
//! reservation taken is marked started (`traffic`) on the words the try used, found
//! once for both.

use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};

use super::gpu_words::GpuWords;
use super::layout::{SH_CEILING, SH_GUARANTEE, T_STARTED};
use super::member::{Member, OWN_SHARE};
use super::used::Rule;

/// The rule of one try of a reservation on the short path by a member that holds
/// neither a guarantee nor a ceiling on the GPU ([`Member::try_reserve`]), while no other
/// member holds a guarantee there: the pool's cap alone (`limit`: the cap, at most
/// `USED_BYTES`), as long as no resize came into force since the member read it. If another member holds one, it refuses and says so in `shared`: the
/// caller then tries again with the whole rule, out of line (the try makes no call, so
/// it saves few registers).
struct Plain<'m, 'a> {
    m: &'m Member<'a>,
    h: &'m GpuWords<'a>,
    bytes: u64,
    shared: std::cell::Cell<bool>,
}

impl Rule for Plain<'_, '_> {
    #[inline(always)]
    fn apply(&self, pool: u64, own: u64) -> Option<u64> {
        let Plain { m, h, bytes, .. } = *self;
        // The limit read after its generation: a resize in force since sends the
        // reservation the full way, which takes the new cap.
        let seen = m.cap_gen[h.g].load(Acquire);
        if m.queue_first_at(h) || pool < own || m.cap_changed(h, seen) {
            return None; // waiters first, in order; or a `used` that cannot be
        }
        if h.bits.iter().fold(0, |a, b| a | b.load(Acquire)) != 0
            || !h.more.is_empty() && h.more.iter().any(|b| b.load(Acquire) != 0)
        {
            // Some member holds a guarantee: its unused part is kept for it.
            self.shared.set(true);
            return None;
        }
        let limit = m.limit[h.g].load(Relaxed);
        if bytes > limit {
            return None;
        }
        // No overflow: `pool` and `bytes` are each at most `USED_BYTES`.
        let new = pool + bytes;
        (new <= limit).then_some(new)
    }
}

impl Member<'_> {
    /// The short path's [`reserve`](Self::reserve): None, with nothing counted, marked or
    /// changed, if anything more is needed (waiting, a sweep, a recount, a refusal): the
    /// caller then goes the full way, [`reserve`](Self::reserve). Some(true): the pool
    /// took `bytes` on `device` and the allocation is marked started (see `traffic`):
    /// the caller calls [`alloc_ended`](Self::alloc_ended) once the driver answered.
    /// Some(false): the device is not the pool's, nothing charged or marked.
    #[inline(always)]
    pub fn try_reserve(&self, device: usize, bytes: u64) -> Option<bool> {
        // The way (see `route`): one load tells it.
        if let Some(r) = self.route.get(device) {
            let r = r.load(Acquire);
            let g = ((r & !OWN_SHARE) as usize).wrapping_sub(1);
            if let Some(Some(h)) = self.hot.get(g) {
                let taken = if r & OWN_SHARE != 0 {
                    self.take_shared(h, bytes)
                } else {
                    self.reserve_plain(h, bytes)
                };
                if !taken {
                    return None;
                }
                // As `alloc_started`, on the words already found.
                h.marks[T_STARTED].fetch_add(bytes, SeqCst);
                return Some(true);
            }
        }
        self.try_reserve_rest(device, bytes)
    }

    /// [`try_reserve`](Self::try_reserve) off its `route`: a device not registered, or a
    /// member that left. Marks nothing: `alloc_started` goes by the route too.
    #[cold]
    #[inline(never)]
    fn try_reserve_rest(&self, device: usize, bytes: u64) -> Option<bool> {
        let Some(g) = self.entry_of(device) else {
            return Some(false);
        };
        if self.left.load(Acquire) {
            return None;
        }
        let h = self.hot(g)?;
        let (guarantee, ceiling) = (self.own_word(g, SH_GUARANTEE), self.own_word(g, SH_CEILING));
        let taken = if guarantee | ceiling != 0 {
            self.take_shared(h, bytes)
        } else {
            self.reserve_plain(h, bytes)
        };
        taken.then_some(false)
    }

    /// [`try_reserve`](Self::try_reserve) by a member without a guarantee or a ceiling of
    /// its own on the GPU entry of words `h`, under its limit (see [`Plain`]): one try;
    /// anything else (a guarantee of another member there, another change first) the
    /// whole rule.
    #[inline(always)]
    fn reserve_plain(&self, h: &GpuWords<'_>, bytes: u64) -> bool {
        let rule = Plain {
            m: self,
            h,
            bytes,
            shared: std::cell::Cell::new(false),
        };
        match self.add_once(h, bytes, &rule) {
            Some(true) => true,
            // Another member holds a guarantee: the whole rule (nothing was counted).
            Some(false) => rule.shared.get() && self.take_shared(h, bytes),
            // Another change came first: the whole rule, in its loop.
            None => self.take_shared(h, bytes),
        }
    }
}
