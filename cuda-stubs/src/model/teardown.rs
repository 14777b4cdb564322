//! What goes when a context ends (destroyed, reset, released or detached to zero): its
//! context-local storage (destructors called), linear allocations, its modules, its limits (and the stack memory they took), its arrays and mipmapped arrays, its context memory. Not what
//! belongs to no context (cuCtxDestroy's doc in cuda.h): stream-ordered (pool)
//! allocations stay valid and in use, the pools keep what they cache (they release it at
//! a synchronisation or trim, as at any other time), VMM handles stay.

use super::ctx::Ended;
use super::device::{cfg, ledger};
use super::{array, cls, limit, linear, module};

/// Frees what lived in the context that ended.
pub fn end(e: Ended) {
    cls::end_context(e.ctx);
    linear::free_all_of_context(e.ctx);
    array::free_all_of_context(e.ctx)
        .into_iter()
        .for_each(super::vmm::drop_array_tiles);
    module::end_context(e.ctx);
    limit::end_context(e.ctx, e.dev);
    if e.context_mem
        && let (Ok(l), Ok(c)) = (ledger(), cfg())
    {
        l.release_context(e.dev, c.context_mem);
    }
}
