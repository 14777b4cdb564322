//! What goes when a context ends (destroyed, reset, released or detached to zero): its
//! linear and pool allocations (pool memory goes back to its pools, and the pools of the
//! device release what they cache), its arrays and mipmapped arrays, its context memory.

use super::ctx::Ended;
use super::device::{cfg, ledger};
use super::{array, linear};

/// Frees what lived in the context that ended.
pub fn end(e: Ended) {
    linear::free_all_of_context(e.ctx);
    array::free_all_of_context(e.ctx);
    if e.context_mem
        && let (Ok(l), Ok(c)) = (ledger(), cfg())
    {
        l.release_context(e.dev, c.context_mem);
    }
}
