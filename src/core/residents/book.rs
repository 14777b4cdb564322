//! The book of residents: what a context holds beside its allocations, by key, with the
//! charge of each (the modules loaded in it, the memory its limits took, the kernels its
//! first uses loaded). An entry is credited when its key goes (an unload, a limit
//! lowered) or once its context is gone (the driver frees all of it with the context).
//! Such events are rare: a lock and a list.

use std::sync::{Mutex, MutexGuard};

use crate::contexts::Ctx;
use crate::ledger::Charge;

/// What an entry was charged, and the context it lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    pub ctx: Ctx,
    /// The driver's unique id of that context (`cuCtxGetId`), if it gave one: a handle
    /// the driver hands out again for a later context is not taken for this one.
    pub ctx_id: Option<u64>,
    /// Whether that context is the device's primary context: gone when the primary is
    /// inactive (its last release, a reset), though its handle stays.
    pub primary: bool,
    pub charge: Charge,
}

/// Entries by key (a module handle, a context's limit) with what each holds.
pub struct ResidentCharges<K> {
    held: Mutex<Vec<(K, Resident)>>,
}

impl<K: Copy + PartialEq> Default for ResidentCharges<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Copy + PartialEq> ResidentCharges<K> {
    pub const fn new() -> Self {
        ResidentCharges {
            held: Mutex::new(Vec::new()),
        }
    }

    fn list(&self) -> MutexGuard<'_, Vec<(K, Resident)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `key`, charged as `held` says. A key seen again replaces the old entry
    /// (a module handle the driver handed out again, its old module gone with its
    /// context), which is returned: its charge is the caller's to credit, never dropped.
    #[must_use = "a replaced entry's charge must be credited"]
    pub fn add(&self, key: K, held: Resident) -> Option<Resident> {
        let mut l = self.list();
        let old = l
            .iter()
            .position(|(k, _)| *k == key)
            .map(|i| l.swap_remove(i).1);
        l.push((key, held));
        old
    }

    /// Adds `held` to what `key` holds when its entry lives in the same context (a
    /// function measured again after a teardown keeps what it held), else records it as
    /// [`add`](Self::add) does: an entry of a context gone (its handle another context's
    /// now) is returned, its charge the caller's to credit.
    #[must_use = "a replaced entry's charge must be credited"]
    pub fn add_to(&self, key: K, held: Resident) -> Option<Resident> {
        let mut l = self.list();
        match l.iter_mut().find(|(k, _)| *k == key) {
            Some((_, prev)) if prev.ctx == held.ctx && prev.ctx_id == held.ctx_id => {
                prev.charge.bytes = prev.charge.bytes.saturating_add(held.charge.bytes);
                None
            }
            Some((_, prev)) => Some(std::mem::replace(prev, held)),
            None => {
                l.push((key, held));
                None
            }
        }
    }

    /// Takes `key` out (before the driver frees what it holds; None: not charged here).
    pub fn take(&self, key: K) -> Option<Resident> {
        let mut l = self.list();
        let i = l.iter().position(|(k, _)| *k == key)?;
        Some(l.swap_remove(i).1)
    }

    /// Puts back what [`take`](Self::take) gave, the driver having refused the call.
    pub fn restore(&self, key: K, held: Resident) -> Option<Resident> {
        self.add(key, held)
    }

    /// Takes out the entries whose key `pick` says (what an unload frees), with their keys.
    pub fn take_keys(&self, pick: impl Fn(&K) -> bool) -> Vec<(K, Resident)> {
        let mut l = self.list();
        let mut out = Vec::new();
        l.retain(|(k, r)| {
            let picked = pick(k);
            if picked {
                out.push((*k, *r));
            }
            !picked
        });
        out
    }

    /// Whether an entry's key is one `pick` says.
    pub fn any(&self, pick: impl Fn(&K) -> bool) -> bool {
        self.list().iter().any(|(k, _)| pick(k))
    }

    /// The bytes the entries on `device` hold.
    pub fn bytes_on(&self, device: usize) -> u64 {
        self.list()
            .iter()
            .filter(|(_, l)| l.charge.device == device)
            .map(|(_, l)| l.charge.bytes)
            .sum()
    }

    /// Takes out the entries on `device` whose context `gone` says no longer exists
    /// (the driver freed what they held with it): their charges, to credit.
    pub fn take_gone(&self, device: usize, gone: impl Fn(&Resident) -> bool) -> Vec<Charge> {
        let mut l = self.list();
        let mut out = Vec::new();
        l.retain(|(_, m)| {
            let ended = m.charge.device == device && gone(m);
            if ended {
                out.push(m.charge);
            }
            !ended
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(ctx: Ctx, device: usize, bytes: u64) -> Resident {
        Resident {
            ctx,
            ctx_id: Some(ctx + 100),
            primary: false,
            charge: Charge { device, bytes },
        }
    }

    #[test]
    fn an_entry_is_taken_once_and_restored_if_the_driver_refused() {
        let b = ResidentCharges::<u64>::new();
        assert_eq!(b.add(7, held(1, 0, 2 << 20)), None);
        assert_eq!(b.bytes_on(0), 2 << 20);
        let l = b.take(7).unwrap();
        assert_eq!(b.take(7), None, "taken twice");
        assert_eq!(b.bytes_on(0), 0);
        assert_eq!(b.restore(7, l), None);
        assert_eq!(b.take(7), Some(l));
        assert_eq!(b.take(8), None, "never loaded here");
    }

    #[test]
    fn entries_are_taken_by_their_keys() {
        let b = ResidentCharges::<(u64, u64)>::new();
        assert_eq!(b.add((1, 7), held(1, 0, 2 << 20)), None);
        assert_eq!(b.add((2, 7), held(2, 0, 4 << 20)), None);
        assert_eq!(b.add((1, 8), held(1, 0, 8 << 20)), None);
        let mut taken = b.take_keys(|&(_, owner)| owner == 7);
        taken.sort_by_key(|(k, _)| *k);
        assert_eq!(
            taken
                .iter()
                .map(|(k, r)| (*k, r.charge.bytes))
                .collect::<Vec<_>>(),
            vec![((1, 7), 2 << 20), ((2, 7), 4 << 20)]
        );
        assert_eq!(b.bytes_on(0), 8 << 20);
        assert!(b.take_keys(|&(_, owner)| owner == 7).is_empty());
    }

    #[test]
    fn a_key_added_again_replaces_its_old_entry_and_returns_it_to_credit() {
        let b = ResidentCharges::<u64>::new();
        assert_eq!(b.add(7, held(1, 0, 4 << 20)), None);
        let old = b.add(7, held(2, 0, 2 << 20));
        assert_eq!(old.map(|r| (r.ctx, r.charge.bytes)), Some((1, 4 << 20)));
        assert_eq!(b.bytes_on(0), 2 << 20);
        assert_eq!(b.take(7).map(|l| l.ctx), Some(2));
    }

    #[test]
    fn a_key_added_to_in_its_own_context_grows_and_in_another_is_replaced() {
        let b = ResidentCharges::<u64>::new();
        assert_eq!(b.add_to(7, held(1, 0, 4 << 20)), None);
        assert_eq!(b.add_to(7, held(1, 0, 2 << 20)), None, "the same context");
        assert_eq!(b.bytes_on(0), 6 << 20);
        // The handle is another context's now: the old entry comes back to credit.
        let old = b.add_to(7, held(2, 0, 1 << 20));
        assert_eq!(old.map(|r| (r.ctx, r.charge.bytes)), Some((1, 6 << 20)));
        assert_eq!(b.bytes_on(0), 1 << 20);
    }

    #[test]
    fn the_entries_of_a_gone_context_are_taken_on_their_device_only() {
        let b = ResidentCharges::<u64>::new();
        assert_eq!(b.add(1, held(10, 0, 2 << 20)), None);
        assert_eq!(b.add(2, held(10, 0, 4 << 20)), None);
        assert_eq!(b.add(3, held(11, 0, 8 << 20)), None);
        assert_eq!(b.add(4, held(10, 1, 16 << 20)), None);
        let mut credited = b.take_gone(0, |l| l.ctx == 10);
        credited.sort_by_key(|c| c.bytes);
        assert_eq!(
            credited,
            vec![
                Charge {
                    device: 0,
                    bytes: 2 << 20
                },
                Charge {
                    device: 0,
                    bytes: 4 << 20
                }
            ]
        );
        assert_eq!((b.bytes_on(0), b.bytes_on(1)), (8 << 20, 16 << 20));
        assert!(b.take_gone(0, |l| l.ctx == 10).is_empty());
    }
}
