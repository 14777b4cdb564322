//! How long a process waits for a claim's members who hold its words but do not answer
//! (their socket removed: they bind it again within about a second). A joiner, and a
//! resize, wait up to [`PATIENCE`] each time. Readers (`gpucap status`, `top`, `metrics`)
//! share one [`PATIENCE`] in all within one round of reading ([`new_reading_round`]):
//! directories that say members live but answer nothing (anyone may make one and hold a
//! lock on it) cost a round at most that, never that much each.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::PATIENCE;

/// Who waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// A joiner or a resize: [`PATIENCE`] each time.
    Patient,
    /// A reader: what is left of its round's [`PATIENCE`].
    Reader,
}

/// The instant the readers' times count from.
static BASE: OnceLock<Instant> = OnceLock::new();
/// When the current round's readers give up, in ms after [`BASE`] (0: not set yet: the
/// first wait of the round sets it).
static ROUND_ENDS_MS: AtomicU64 = AtomicU64::new(0);

/// Starts a round of reading: the readers' next waits share a new [`PATIENCE`].
pub fn new_reading_round() {
    ROUND_ENDS_MS.store(0, Relaxed);
}

impl Waiter {
    /// When a wait that starts now gives up.
    pub(crate) fn gives_up(self) -> Instant {
        match self {
            Waiter::Patient => Instant::now() + PATIENCE,
            Waiter::Reader => {
                let base = *BASE.get_or_init(Instant::now);
                let ends = base.elapsed() + PATIENCE;
                let ends = u64::try_from(ends.as_millis()).unwrap_or(u64::MAX);
                let set = match ROUND_ENDS_MS.compare_exchange(0, ends, Relaxed, Relaxed) {
                    Ok(_) => ends,
                    Err(earlier) => earlier,
                };
                base + Duration::from_millis(set)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_share_one_patience_a_round_and_a_new_round_gives_a_new_one() {
        new_reading_round();
        let first = Waiter::Reader.gives_up();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(Waiter::Reader.gives_up(), first, "the round's one deadline");
        assert!(Waiter::Patient.gives_up() > first, "a joiner waits its own");
        new_reading_round();
        assert!(Waiter::Reader.gives_up() > first);
    }
}
