//! The shim's log: `gpucap: …` lines on stderr at or above `GPUCAP_LOG`'s level.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use gpucap_core::config::LogLevel;

/// The level set by the configuration (warnings until it is read).
pub static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

/// Whether lines at `level` are written.
#[inline]
pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Relaxed) && level != LogLevel::Off
}

/// Writes one `gpucap: …` line to stderr if `level` is enabled.
pub fn write_log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if enabled(level) {
        say(&format!("gpucap: {msg}"));
    }
}

/// Writes `line` and a newline to stderr, whatever the log level: in one `write` (a line
/// is never mixed with another thread's), the thread not cancelled meanwhile (`write` is a
/// cancellation point: `cancel.rs`), and errors ignored: a full disk, a pipe whose reader
/// is gone (SIGPIPE ignored, as Python does) or a closed descriptor loses the line, never
/// turns the call that said it into another error (`eprintln!` panics on a failed write,
/// and a refusal became `CUDA_ERROR_UNKNOWN`).
pub fn say(line: &str) {
    let _held = crate::cancel::NoCancel::hold();
    let mut text = Vec::with_capacity(line.len() + 1);
    text.extend_from_slice(line.as_bytes());
    text.push(b'\n');
    let mut at = 0;
    while at < text.len() {
        // SAFETY: writes bytes of `text`, which lives across the call, to descriptor 2.
        let n = unsafe { libc::write(2, text[at..].as_ptr().cast(), text.len() - at) };
        match n {
            n if n > 0 => at += n as usize,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

/// One line at a level; its arguments are evaluated only when that level is written (a
/// debug line's sizes are not formatted on every call that could print one).
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        if $crate::log::enabled(::gpucap_core::config::LogLevel::$level) {
            $crate::log::write_log(::gpucap_core::config::LogLevel::$level, format_args!($($arg)*))
        }
    };
}
pub(crate) use log;
