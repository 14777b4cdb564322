//! The shim's log: `gpucap: …` lines on stderr at or above `GPUCAP_LOG`'s level.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use gpucap_core::config::LogLevel;

/// The level set by the configuration (warnings until it is read).
pub static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

/// Writes one `gpucap: …` line to stderr if `level` is enabled.
pub fn write_log(level: LogLevel, msg: std::fmt::Arguments<'_>) {
    if level as u8 <= LEVEL.load(Relaxed) && level != LogLevel::Off {
        eprintln!("gpucap: {msg}");
    }
}

macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::write_log(::gpucap_core::config::LogLevel::$level, format_args!($($arg)*))
    };
}
pub(crate) use log;
