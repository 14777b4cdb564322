//! Share words that cannot be, found and repaired: a guarantee's holder bit on a slot
//! no live member holds, a guarantee above the pool's cap or above its own ceiling
//! word, live guarantees that sum above the cap, a ceiling above the cap, a bit and a
//! guarantee word that disagree, and this member's own words changed under it.
//!
//! Who repairs: the next member to join (at its slot, and when it registers a GPU), the
//! next refusal (with its recount, under the word lock), a guarantee's admission that
//! was refused, and a member asking what it could reserve (`room`, `cuMemGetInfo`: its
//! own words only, unless they are wrong). Never the allocation's short path.
//!
//! The rule, per GPU entry, deterministic and the same for every repairer:
//!
//! 1. The repairer's own words are written back from what it claimed, kept in its own
//!    memory (`Member::own`: what it decides by in any case).
//! 2. A holder bit of a slot that is empty and whose kernel lock nobody holds is
//!    cleared with the slot's share words (a slot being joined, or a live member whose
//!    state word was cleared, holds its lock: left to its owner).
//! 3. For each other slot in use: a ceiling word above the cap is cleared ("none"); a
//!    bit without a guarantee, or a guarantee without its bit, is cleared; a guarantee
//!    above the cap or above the slot's own ceiling word is cleared.
//! 4. The guarantees left must sum within the cap, as admission left them: the
//!    repairer's own first (it knows it is true), then the others in the order their
//!    members joined (start time, then slot). One that does not fit beside those before
//!    it could not have been admitted, and is cleared.
//!
//! A cleared guarantee is no longer kept by the others; its member still decides by
//! its own memory, so its requests inside the guarantee still need only the cap's room,
//! and it writes its words back at its next refusal or `room` (if another member
//! borrowed the room meanwhile, that comes back as the borrower frees).

use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};

use super::layout::{
    G_CAP, G_CAP_GEN, MAX_POOL_GPUS, S_START_MS, SH_CEILING, SH_GUARANTEE, STATE_LIVE, USED_BYTES,
    decode_cap,
};
use super::member::Member;
use super::notes::{Repair, ShareFault, ShareRepair};

impl Member<'_> {
    /// Repairs the impossible share words on GPU entry `g` (see the module's rule) under
    /// its word lock, if a look without the lock finds any; each repair is told to the
    /// member's note. True if anything was repaired.
    pub(super) fn repair_shares(&self, g: usize) -> bool {
        if self.left.load(Acquire) || self.share_faults(g).is_empty() {
            return false;
        }
        let repairs = self.locked(g, || self.fix_shares(g));
        for r in &repairs {
            self.report_repair(r);
        }
        !repairs.is_empty()
    }

    /// [`repair_shares`](Self::repair_shares) if this member's own share words on GPU
    /// entry `g` differ from what it claimed (three loads otherwise).
    pub(super) fn repair_own_shares(&self, g: usize) {
        if !self.own_words_right(g) {
            self.repair_shares(g);
        }
    }

    /// Under GPU entry `g`'s word lock: finds the faults again and repairs them.
    pub(super) fn fix_shares(&self, g: usize) -> Vec<Repair> {
        if self.left.load(Acquire) {
            return Vec::new();
        }
        // Words `gpucap pool set` wrote are this member's share, not damage
        // (`share_set`): taken before its own are compared.
        self.refresh_cap(g);
        let faults = self.share_faults(g);
        for r in &faults {
            if r.slot == self.slot {
                self.write_own_words(g);
                continue;
            }
            let (k, bit) = (r.slot / 64, 1u64 << (r.slot % 64));
            let clear_guarantee = || {
                self.w.share_bits(g, k).fetch_and(!bit, SeqCst);
                self.w.share(r.slot, g, SH_GUARANTEE).store(0, SeqCst);
            };
            match r.fault {
                ShareFault::NoMember => {
                    clear_guarantee();
                    self.w.share(r.slot, g, SH_CEILING).store(0, SeqCst);
                }
                ShareFault::CeilingAboveCap => {
                    self.w.share(r.slot, g, SH_CEILING).store(0, SeqCst);
                }
                _ => clear_guarantee(),
            }
        }
        faults.into_iter().map(Repair::Share).collect()
    }

    /// Whether this member's own share words and bit on GPU entry `g` say what it
    /// claimed.
    fn own_words_right(&self, g: usize) -> bool {
        let (k, bit) = (self.slot / 64, 1u64 << (self.slot % 64));
        let ours = [self.own_word(g, SH_GUARANTEE), self.own_word(g, SH_CEILING)];
        let found = [
            self.w.share(self.slot, g, SH_GUARANTEE).load(SeqCst),
            self.w.share(self.slot, g, SH_CEILING).load(SeqCst),
        ];
        let bit_set = self.w.share_bits(g, k).load(SeqCst) & bit != 0;
        found == ours && bit_set == (ours[0] != 0)
    }

    /// The impossible share words on GPU entry `g`, changing nothing (see the module's
    /// rule; the order of the list is the order of the rule).
    fn share_faults(&self, g: usize) -> Vec<ShareRepair> {
        let cap = decode_cap(self.caps.get(g).map_or(0, |c| c.load(Relaxed)))
            .flatten()
            .unwrap_or(u64::MAX);
        // No guarantee can be above what `used` can count, with a cap or without.
        let limit = cap.min(USED_BYTES);
        let mut out = Vec::new();
        let found = |s: usize, fault| ShareRepair {
            gpu: g,
            slot: s,
            guarantee: self.w.share(s, g, SH_GUARANTEE).load(SeqCst),
            ceiling: self.w.share(s, g, SH_CEILING).load(SeqCst),
            cap,
            fault,
        };
        let own_guarantee = self.own_word(g, SH_GUARANTEE);
        // While a change is under way (the generation odd), this member's words may be
        // the change's (`share_set`): taken once it ends, never written back before.
        let changing = self.w.gpu(g, G_CAP_GEN).load(SeqCst) & 1 == 1;
        if !changing && !self.own_words_right(g) {
            out.push(found(
                self.slot,
                ShareFault::Own {
                    guarantee: own_guarantee,
                    ceiling: self.own_word(g, SH_CEILING),
                },
            ));
        }
        // (join start, slot, guarantee) of the guarantees that pass rules 2 and 3.
        let mut kept: Vec<(u64, usize, u64)> = Vec::new();
        // One pass over the slots' states and the GPU's holder bits (each a compact
        // array: a few pages, a few instructions a slot whatever the member count); a live
        // slot's share words are read where it is live.
        let (bits, shares) = (self.w.share_bits_of(g), self.w.shares_of(g));
        for (k, group) in self.w.states().chunks(64).enumerate() {
            let holders = bits.get(k).map_or(0, |b| b.load(SeqCst));
            for (i, state) in group.iter().enumerate() {
                if state.load(Acquire) != STATE_LIVE {
                    // Empty: a bit there is no member's, unless a process holds the slot
                    // (joining it, or a live member whose state word was cleared).
                    let s = k * 64 + i;
                    if holders >> i & 1 != 0 && s != self.slot && !self.locks.held(s) {
                        out.push(found(s, ShareFault::NoMember));
                    }
                    continue;
                }
                let (s, bit) = (k * 64 + i, holders >> i & 1 != 0);
                let Some(words) = shares.get(s).filter(|_| s != self.slot) else {
                    continue;
                };
                let guarantee = words[SH_GUARANTEE].load(SeqCst);
                let ceiling = words[SH_CEILING].load(SeqCst);
                if guarantee == 0 && ceiling == 0 && !bit {
                    continue; // no share: none of the rules below can find a fault
                }
                if ceiling > limit {
                    out.push(found(s, ShareFault::CeilingAboveCap));
                }
                let fault = if bit != (guarantee != 0) {
                    Some(ShareFault::Bit)
                } else if guarantee > limit {
                    Some(ShareFault::AboveCap)
                } else if ceiling != 0 && guarantee > ceiling {
                    Some(ShareFault::AboveCeiling)
                } else {
                    None
                };
                match fault {
                    Some(f) => out.push(found(s, f)),
                    None if bit => {
                        kept.push((self.w.slot(s, S_START_MS).load(Relaxed), s, guarantee));
                    }
                    None => {}
                }
            }
        }
        // Rule 4: this member's own first, then in the order the members joined.
        kept.sort_unstable();
        let mut given = own_guarantee;
        for (_, s, guarantee) in kept {
            match given.checked_add(guarantee).filter(|&t| t <= limit) {
                Some(t) => given = t,
                None => out.push(found(s, ShareFault::NoRoom { given })),
            }
        }
        out
    }

    /// At join, on the empty slot just taken: share words or a holder bit left in it are
    /// no member's (a forged file, or a bug): cleared, each told. On the GPU entries in
    /// use only (each GPU's words lie apart: the others' would cost a page each); words
    /// left on an entry no GPU has yet are read by nobody until one registers there, and
    /// then are this member's own to write back, or another joiner's to repair.
    pub(super) fn clear_new_slot_shares(&self) {
        let s = self.slot;
        let (k, bit) = (s / 64, 1u64 << (s % 64));
        for g in (0..MAX_POOL_GPUS).filter(|&g| self.w.has_gpu(g)) {
            let bits = self.w.share_bits(g, k).fetch_and(!bit, SeqCst);
            let guarantee = self.w.share(s, g, SH_GUARANTEE).swap(0, SeqCst);
            let ceiling = self.w.share(s, g, SH_CEILING).swap(0, SeqCst);
            if bits & bit != 0 || guarantee != 0 || ceiling != 0 {
                self.report_repair(&Repair::Share(ShareRepair {
                    gpu: g,
                    slot: s,
                    guarantee,
                    ceiling,
                    cap: decode_cap(self.w.gpu(g, G_CAP).load(Relaxed))
                        .flatten()
                        .unwrap_or(u64::MAX),
                    fault: ShareFault::NoMember,
                }));
            }
        }
    }
}
