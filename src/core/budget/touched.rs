//! In tests: the words of a pool file this thread reaches through `Words`'s accessors
//! of one word (and of a GPU's guarantee bits), noted while a test looks: what a start
//! touches of a large pool (`tests/join_pages`). The references a member keeps from its
//! join for its own changes (`GpuWords`: its own words, the GPU entries) are not noted:
//! those are pages it needs whatever the member count.

use std::cell::RefCell;

thread_local! {
    static NOTED: RefCell<Option<Vec<(usize, usize)>>> = const { RefCell::new(None) };
}

/// Starts noting this thread's accesses (forgetting any noted before).
pub fn start() {
    NOTED.with(|n| *n.borrow_mut() = Some(Vec::new()));
}

/// Stops noting: the word ranges (first word, count) accessed since [`start`].
pub fn stop() -> Vec<(usize, usize)> {
    NOTED.with(|n| n.borrow_mut().take()).unwrap_or_default()
}

/// Words `at..at + n` were accessed (a reference to them was handed out).
#[inline]
pub fn note(at: usize, n: usize) {
    NOTED.with(|noted| {
        if let Some(v) = noted.borrow_mut().as_mut() {
            v.push((at, n));
        }
    });
}
