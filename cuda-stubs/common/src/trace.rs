//! FAKECUDA_TRACE: whether the fakes log every call, and the one-line log they write.

use std::io::Write as _;
use std::sync::OnceLock;

/// FAKECUDA_TRACE is set to something other than empty or `0` (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("FAKECUDA_TRACE").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Writes `prefix: msg` to stderr as one line, in a single write so that the lines of
/// threads don't mix.
pub fn log(prefix: &str, msg: &str) {
    let line = format!("{prefix}: {msg}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
