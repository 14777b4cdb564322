//! The exit hook: the final report and summary. A `.fini_array` entry rather than
//! `ctor`'s `dtor` (an `atexit` handler registered from a constructor): an atexit
//! handler runs before later-registered handlers are done, this entry after all of them.

/// Runs at process exit: from `exit()` on any thread and on return from `main`, after
/// the program's own atexit handlers and destructors (`.fini_array` entries run from
/// the dynamic loader's exit handler, which is registered before any other), so the
/// figures are final. Not on `_exit()` or a fatal signal: see `after_refusal`.
#[used]
// SAFETY: a .fini_array entry is a plain `extern "C" fn()` the loader calls once.
#[unsafe(link_section = ".fini_array")]
static EXIT_HOOK: extern "C" fn() = exit_hook;

extern "C" fn exit_hook() {
    // Never unwind into the C runtime.
    let _ = std::panic::catch_unwind(|| crate::state::SHIM.at_exit());
}
