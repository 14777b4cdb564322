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
        eprintln!("gpucap: {msg}");
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
