//! `gpucap top`: every capped process (see `crate::procs`), again and again: on a
//! terminal the screen is redrawn to the window's size, asked at each refresh (a
//! resized window is drawn to its new size at the next one; no signal handler);
//! into a pipe or with `--once`, every row, frames separated by a blank line.

pub mod render;
pub mod select;

use std::io::{self, Write};

use crate::procs::{Gpus, Sources};
use select::{Filter, SortKey};

/// What `top` shows and how often.
pub struct Options {
    pub filter: Filter,
    pub sort: SortKey,
    pub uuid: bool,
    pub interval_ms: u64,
    /// How many frames (None: until interrupted).
    pub iterations: Option<u64>,
    /// `--once`: one frame, every row, no screen codes (for logs).
    pub once: bool,
}

/// The loop. Stops at the first write error (a closed pipe). Err: a line to print.
pub fn run(sources: &mut Sources, opts: &Options, out: &mut dyn Write) -> Result<(), String> {
    let gpus = Gpus::probe();
    let tty = crate::term::is_terminal() && !opts.once;
    // A terminal without screen codes (TERM=dumb, no TERM) is written to as a pipe is:
    // frames one after the other.
    let terminal = tty && crate::term::takes_screen_codes();
    let iterations = if opts.once { Some(1) } else { opts.iterations };
    let mut n = 0u64;
    let mut last_size = None;
    loop {
        let mut s = crate::status::snapshot(sources, &gpus)?;
        // A pool no process uses is shown only when named, as `status` shows it only
        // with --all.
        if opts.filter.pool.is_none() {
            crate::status::hide_unused(&mut s);
        }
        s.pools.retain(|p| opts.filter.keeps_pool(p));
        let rows = select::select(&s.processes, &opts.filter, opts.sort);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let frame = render::Frame {
            snapshot: &s,
            rows: &rows,
            sort: opts.sort,
            uuid: opts.uuid,
            every: (!opts.once).then(|| format!("every {}s", opts.interval_ms as f64 / 1000.0)),
            quits: tty.then_some("Ctrl-C quits"),
            now: crate::pool::utc(now),
        };
        let (mut width, height) = crate::term::size();
        if tty {
            // The last column is left empty: a line that fills the window leaves the
            // cursor waiting to wrap, and terminals then take the next line for its rest.
            width = width.saturating_sub(1).max(1);
        }
        let lines = render::lines(&frame, width, terminal.then_some(height));
        let mut text = String::new();
        if terminal {
            // Home, the frame, each line's rest and the screen's rest cleared (the
            // whole screen first, and again after a resize: what the terminal rewrapped
            // then is gone): no flicker.
            let resized = last_size != Some((width, height));
            last_size = Some((width, height));
            text.push_str(if resized { "\x1b[H\x1b[2J" } else { "\x1b[H" });
            for l in &lines {
                text.push_str(l);
                text.push_str("\x1b[K\n");
            }
            text.push_str("\x1b[J");
        } else {
            if n > 0 {
                text.push('\n');
            }
            for l in &lines {
                text.push_str(l);
                text.push('\n');
            }
        }
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(());
        }
        n += 1;
        if iterations.is_some_and(|max| n >= max) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(opts.interval_ms));
    }
}

/// Writes to `out`; a closed pipe is not an error.
pub fn run_to_stdout(sources: &mut Sources, opts: &Options) -> Result<(), String> {
    let stdout = io::stdout();
    let mut lock = stdout.lock();
    run(sources, opts, &mut lock)
}
