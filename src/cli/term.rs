//! Stdout, where every command writes: written ignoring a closed pipe, and the size of
//! the terminal `gpucap status` and `top` write to: asked of the kernel at each frame (a
//! resized window is seen at the next refresh; no signal handler), else
//! `COLUMNS`/`LINES`, else 80×24.

use std::io::{self, Write};

/// Columns and lines of the terminal on stdout, if it is one.
pub fn window() -> Option<(usize, usize)> {
    // SAFETY: winsize is plain data; TIOCGWINSZ only fills it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: descriptor 1 and a winsize to fill.
    let rc = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0 && ws.ws_row > 0)
        .then(|| (usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// Whether stdout is a terminal.
pub fn is_terminal() -> bool {
    // SAFETY: isatty only asks about descriptor 1.
    unsafe { libc::isatty(1) == 1 }
}

/// Whether stdout is a terminal that takes screen codes (moving the cursor, erasing):
/// `TERM` is set and not `dumb`.
pub fn takes_screen_codes() -> bool {
    is_terminal() && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
}

/// The size to fit: the terminal's, else `COLUMNS` and `LINES`, else 80×24.
pub fn size() -> (usize, usize) {
    window().unwrap_or_else(|| {
        let env = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .unwrap_or(d)
        };
        (env("COLUMNS", 80), env("LINES", 24))
    })
}

/// Writes to stdout, ignoring a closed pipe (`gpucap check | head -1`).
pub fn print_out(s: &str) {
    let _ = io::stdout().lock().write_all(s.as_bytes());
}
