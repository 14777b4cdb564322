//! A book's entries against the ledger: recorded without ever dropping a charge, and
//! given back around the driver call that frees them (announced to the pool first, as a
//! free, credited once the driver freed them, put back if it refused).

use super::book::{Resident, ResidentCharges};
use crate::ledger::{Freeing, Ledger};

/// Records `held` under `key` in `book`; an entry it replaces (a handle the driver
/// handed out again, or another thread's record made meanwhile) is credited: the driver
/// freed what it held, and a charge is never dropped.
pub fn record<K: Copy + PartialEq>(
    ledger: &Ledger,
    book: &ResidentCharges<K>,
    key: K,
    held: Resident,
) {
    if let Some(replaced) = book.add(key, held) {
        ledger.settle(replaced.charge);
    }
}

/// [`record`], adding to what `key` holds in the same context (see
/// `ResidentCharges::add_to`): an entry of a context gone is credited.
pub fn record_more<K: Copy + PartialEq>(
    ledger: &Ledger,
    book: &ResidentCharges<K>,
    key: K,
    held: Resident,
) {
    if let Some(replaced) = book.add_to(key, held) {
        ledger.settle(replaced.charge);
    }
}

/// Runs `call`, which frees what the entries `taken` out of `book` hold (an unload):
/// announced before it, credited if it succeeded (`CUDA_SUCCESS`, 0), recorded again if
/// the driver refused. Returns the driver's answer.
pub fn given_back<K: Copy + PartialEq>(
    ledger: &Ledger,
    book: &ResidentCharges<K>,
    taken: Vec<(K, Resident)>,
    call: impl FnOnce() -> u32,
) -> u32 {
    let freeing: Vec<Freeing> = taken
        .iter()
        .map(|(_, r)| ledger.announce(r.charge))
        .collect();
    let rc = call();
    if rc == 0 {
        freeing.into_iter().for_each(|f| ledger.settle_announced(f));
    } else {
        freeing.into_iter().for_each(|f| ledger.withdraw(f));
        for (key, r) in taken {
            record(ledger, book, key, r);
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Charge;

    fn held(ctx: u64, bytes: u64) -> Resident {
        Resident {
            ctx,
            ctx_id: Some(ctx),
            primary: false,
            charge: Charge { device: 0, bytes },
        }
    }

    fn used(l: &Ledger) -> u64 {
        l.usage(0).unwrap().used
    }

    #[test]
    fn an_entry_replaced_is_credited_never_dropped() {
        let (l, b) = (Ledger::new(), ResidentCharges::<u64>::new());
        l.charge_past_cap(0, 6);
        record(&l, &b, 7, held(1, 4));
        record(&l, &b, 7, held(2, 2));
        assert_eq!((used(&l), b.bytes_on(0)), (2, 2));
        record_more(&l, &b, 7, held(2, 3));
        assert_eq!((used(&l), b.bytes_on(0)), (2, 5), "the same context: added");
    }

    #[test]
    fn what_an_unload_frees_is_credited_only_if_the_driver_freed_it() {
        let (l, b) = (Ledger::new(), ResidentCharges::<u64>::new());
        l.charge_past_cap(0, 6);
        record(&l, &b, 7, held(1, 4));
        record(&l, &b, 8, held(1, 2));
        let taken = b.take_keys(|&k| k == 7);
        assert_eq!(given_back(&l, &b, taken, || 1), 1);
        assert_eq!((used(&l), b.bytes_on(0)), (6, 6), "refused: put back");
        let taken = b.take_keys(|&k| k == 7);
        assert_eq!(given_back(&l, &b, taken, || 0), 0);
        assert_eq!((used(&l), b.bytes_on(0)), (2, 2));
    }
}
