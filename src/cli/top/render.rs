//! One frame of `gpucap top`: a title line, the process table fitted to the window's
//! width with a used/cap bar (`layout`), as many rows as its height allows (then a
//! line saying how many more), a line per pool and GPU when there is room, and, as
//! `gpucap status` says them, the lines that explain a cap marked as a ceiling handed
//! down (`^`) where there is room left.

use crate::layout;
use crate::procs::{Row, Snapshot};
use crate::status::table;
use crate::text_width;

use super::select::SortKey;

/// What a frame says besides the rows.
pub struct Frame<'a> {
    pub snapshot: &'a Snapshot,
    /// The rows to show, in order (filtered and sorted).
    pub rows: &'a [&'a Row],
    pub sort: SortKey,
    pub uuid: bool,
    /// "every 1s", or nothing (`--once`).
    pub every: Option<String>,
    /// On a terminal: how to quit ("Ctrl-C quits"), kept whatever the width.
    pub quits: Option<&'static str>,
    pub now: String,
}

/// The frame's lines, none wider than `width`; at most `height - 1` of them when a
/// height is given (a terminal: the last line is left empty, so nothing scrolls).
pub fn lines(f: &Frame, width: usize, height: Option<usize>) -> Vec<String> {
    let s = f.snapshot;
    // A process on two GPUs is two rows, one process.
    let mut processes: Vec<(u32, u64)> = f.rows.iter().map(|r| (r.pid, r.pid_namespace)).collect();
    processes.sort_unstable();
    processes.dedup();
    let processes = processes.len();
    let title_at = |now: &str| {
        let mut t = format!(
            "gpucap top  {now}  {} process{}, {} pool{}  sort: {}",
            processes,
            if processes == 1 { "" } else { "es" },
            s.pools.len(),
            if s.pools.len() == 1 { "" } else { "s" },
            f.sort.name()
        );
        if let Some(e) = &f.every {
            t.push_str(&format!("  {e}"));
        }
        t
    };
    let quits = f.quits.map_or(String::new(), |q| format!("  ({q})"));
    // Too wide: the time without the date, then the rest cut before how to quit.
    let mut title = title_at(&format!("{} UTC", f.now));
    if text_width::width(&title) + quits.len() > width {
        title = title_at(f.now.rsplit(' ').next().unwrap_or(&f.now));
    }
    let title = if text_width::width(&title) + quits.len() > width && width > quits.len() + 10 {
        layout::cut(&title, width - quits.len()) + &quits
    } else {
        layout::cut(&(title + &quits), width)
    };
    let mut out = vec![layout::cut(&title, width)];
    let layout = layout::fit(
        &table::columns(f.uuid, true),
        width,
        table::users(f.rows.iter().copied()),
    );
    out.push(layout.header());
    let rows = table::rows(&layout, f.rows);
    // In a log (`--once`, a pipe) the pool lines and what could not be read are whole,
    // as `status` writes them; on a terminal, cut to the window's width.
    let cut_at = if height.is_some() { width } else { usize::MAX };
    let pools = table::pool_lines(s, cut_at);
    let notes = table::ceiling_notes(f.rows.iter().copied(), width);
    // What could not be read (a damaged file, root's own directory another user made).
    let errors: Vec<String> = table::error_lines(s)
        .map(|e| layout::cut(&e, cut_at))
        .collect();
    let Some(height) = height else {
        out.extend(rows);
        out.extend(notes);
        out.extend(errors);
        if !pools.is_empty() {
            out.push(String::new());
            out.extend(pools);
        }
        return out;
    };
    // Lines left under the title and the header, the last one of the window unused.
    let room = height.saturating_sub(3);
    // What could not be read comes first: up to a quarter of the lines (at least one),
    // the last saying how many more there are.
    let error_room = if errors.is_empty() {
        0
    } else {
        errors.len().min((room / 4).max(1)).min(room)
    };
    let room = room - error_room;
    // Then the pools' lines: up to a third of what is left, the last saying how many
    // more there are.
    let pool_room = if pools.is_empty() {
        0
    } else {
        (pools.len() + 1).min(room / 3)
    };
    let row_room = room - pool_room;
    if rows.len() <= row_room {
        out.extend(rows.iter().cloned());
    } else if row_room > 0 {
        let shown = row_room - 1;
        out.extend(rows.iter().take(shown).cloned());
        out.push(layout::cut(
            &format!(
                "… {} more (--sort, --pool, --user choose which; a taller window shows more)",
                rows.len() - shown
            ),
            width,
        ));
    }
    if pool_room > 1 {
        out.push(String::new());
    }
    out.extend(some(
        pools,
        pool_room.saturating_sub(1).max(pool_room.min(1)),
        |n| format!("{n} more pool lines (--pool NAME shows one pool; a taller window shows more)"),
        width,
    ));
    out.extend(some(
        errors,
        error_room,
        |n| format!("{n} more files cannot be read (gpucap status says which)"),
        width,
    ));
    // The ceilings' lines where the window has lines left (its last one stays empty).
    let left = height.saturating_sub(1).saturating_sub(out.len());
    out.extend(notes.into_iter().take(left));
    out
}

/// `lines` in at most `room` lines: all of them, or the first ones and a last line
/// (`more`, given how many are left out) saying how many more there are.
fn some(
    lines: Vec<String>,
    room: usize,
    more: impl Fn(usize) -> String,
    width: usize,
) -> Vec<String> {
    if lines.len() <= room {
        return lines;
    }
    if room == 0 {
        return Vec::new();
    }
    let n = lines.len() - (room - 1);
    let mut out: Vec<String> = lines.into_iter().take(room - 1).collect();
    out.push(layout::cut(&format!("… {}", more(n)), width));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::tests::{lone, pool};
    use crate::procs::{Gpus, PoolReading, rows};

    fn snapshot(extra_lone: u32) -> Snapshot {
        let pools = vec![pool()];
        let lone: Vec<_> = (0..=extra_lone)
            .map(|i| lone(100 + i, (i as u64 + 1) << 20, Some(1 << 30)))
            .collect();
        Snapshot {
            processes: rows(&pools, &lone, 7, &Gpus::from_uuids(vec![[0x11; 16]])),
            pools,
            lone,
            errors: vec![],
            warnings: vec![],
            gpus: Gpus::from_uuids(vec![[0x11; 16]]),
        }
    }

    fn frame_of(s: &Snapshot, width: usize, height: Option<usize>) -> Vec<String> {
        let sel: Vec<&Row> = s.processes.iter().collect();
        lines(
            &Frame {
                snapshot: s,
                rows: &sel,
                sort: SortKey::Used,
                uuid: false,
                every: Some("every 1s".into()),
                quits: Some("Ctrl-C quits"),
                now: "2026-11-28 01:00:00".into(),
            },
            width,
            height,
        )
    }

    #[test]
    fn a_frame_fits_its_window() {
        let s = snapshot(60);
        for (w, h) in [(40, 10), (80, 24), (120, 30), (200, 50), (250, 12)] {
            let l = frame_of(&s, w, Some(h));
            assert!(l.len() < h, "{w}x{h}: {} lines", l.len());
            for line in &l {
                assert!(line.chars().count() <= w, "{w}x{h}: {line:?}");
            }
            assert!(l[1].contains("COMMAND"), "{w}x{h}: {:?}", l[1]);
            assert!(
                l.iter().any(|x| x.starts_with("… ") && x.contains(" more")),
                "{w}x{h}: {l:#?}"
            );
        }
        // Bars at 80 columns.
        let l = frame_of(&s, 80, Some(24));
        assert!(l[1].contains("USED/CAP"), "{}", l[1]);
        assert!(l.iter().skip(2).any(|x| x.contains("[|")), "{l:#?}");
    }

    #[test]
    fn a_cap_handed_down_is_explained_under_the_rows_where_there_is_room() {
        let mut s = snapshot(2);
        s.processes[0].ceiling_from = Some("/etc/gpucap/gpucap.env".into());
        let pid = s.processes[0].pid;
        let said = |l: &[String]| {
            l.iter().any(|x| {
                x.starts_with("^ the cap is a ceiling from /etc/gpucap/gpucap.env")
                    && x.contains(&pid.to_string())
            })
        };
        let l = frame_of(&s, 120, Some(30));
        assert!(said(&l), "{l:#?}");
        assert!(l.len() < 30, "{l:#?}");
        assert!(said(&frame_of(&s, 120, None)));
        // No room: the rows first, the window never overflows.
        let l = frame_of(&snapshot(60), 80, Some(10));
        assert!(l.len() < 10, "{l:#?}");
        // Nobody held at a ceiling: no such line.
        assert!(
            !frame_of(&snapshot(2), 120, None)
                .iter()
                .any(|x| x.starts_with('^'))
        );
    }

    #[test]
    fn the_title_counts_processes_not_rows() {
        // Two members on two GPUs each: four rows, two processes.
        let mut s = snapshot(0);
        let twice: Vec<Row> = s
            .processes
            .iter()
            .filter(|r| r.pid == 10 || r.pid == 12)
            .map(|r| Row {
                gpu: Some(1),
                gpu_uuid: "GPU-2222".into(),
                ..r.clone()
            })
            .collect();
        s.processes.extend(twice);
        s.processes.retain(|r| r.pid == 10 || r.pid == 12);
        assert_eq!(s.processes.len(), 4);
        let l = frame_of(&s, 120, None);
        assert!(l[0].contains(" 2 processes, 1 pool "), "{}", l[0]);
        s.processes.retain(|r| r.pid == 10);
        assert!(frame_of(&s, 120, None)[0].contains(" 1 process, "));
    }

    /// `s` with `n` pools (copies of the test pool, named `pool-0`…), each on one GPU.
    fn with_pools(mut s: Snapshot, n: usize) -> Snapshot {
        let one = s.pools[0].clone();
        s.pools = (0..n)
            .map(|i| PoolReading {
                name: format!("pool-{i}"),
                path: format!("/p/pool-{i}.pool"),
                ..one.clone()
            })
            .collect();
        s
    }

    #[test]
    fn pool_lines_and_what_cannot_be_read_are_never_dropped_silently() {
        // 18 pools and a damaged file: every size says how many pool lines it leaves
        // out, and shows the error (before: 11 pools at 120x40, 6 at 80x24, no marker,
        // no error line).
        let mut s = with_pools(snapshot(30), 18);
        s.errors = vec!["/p/broken.pool: not a pool file (bad magic)".into()];
        for (w, h) in [(80, 24), (120, 40), (200, 12), (80, 8)] {
            let l = frame_of(&s, w, Some(h));
            assert!(l.len() < h, "{w}x{h}: {l:#?}");
            let shown = l.iter().filter(|x| x.starts_with("pool pool-")).count();
            let more: usize = l
                .iter()
                .find_map(|x| x.strip_prefix("… ")?.split_once(" more pool lines"))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or_else(|| {
                    panic!("{w}x{h}: no line saying how many pools are left out: {l:#?}")
                });
            assert_eq!(shown + more, 18, "{w}x{h}: {l:#?}");
            assert!(
                l.iter()
                    .any(|x| x.starts_with("cannot read /p/broken.pool")),
                "{w}x{h}: {l:#?}"
            );
        }
        // Many files that cannot be read: the first ones, then how many more.
        s.errors = (0..40)
            .map(|i| format!("/p/broken-{i}.pool: bad magic"))
            .collect();
        let l = frame_of(&s, 80, Some(24));
        assert!(l.len() < 24, "{l:#?}");
        let errors = l.iter().filter(|x| x.starts_with("cannot read ")).count();
        assert!(errors >= 1, "{l:#?}");
        assert!(
            l.iter()
                .any(|x| x.starts_with(&format!("… {} more files cannot be read", 40 - errors))),
            "{l:#?}"
        );
        // A window tall enough shows them all, and no such line.
        let l = frame_of(&with_pools(snapshot(0), 18), 80, Some(60));
        assert_eq!(
            l.iter().filter(|x| x.starts_with("pool pool-")).count(),
            18,
            "{l:#?}"
        );
        assert!(!l.iter().any(|x| x.contains("more pool lines")), "{l:#?}");
    }

    #[test]
    fn the_title_says_how_to_quit_at_any_width_from_40() {
        let s = with_pools(snapshot(120), 12);
        for w in 40..=200 {
            let l = frame_of(&s, w, Some(24));
            assert!(l[0].ends_with("  (Ctrl-C quits)"), "{w}: {:?}", l[0]);
            assert!(text_width::width(&l[0]) <= w, "{w}: {:?}", l[0]);
        }
        let l = frame_of(&s, 79, Some(24));
        assert!(
            l[0].starts_with("gpucap top  01:00:00  124 processes, 12 pools"),
            "{:?}",
            l[0]
        );
        assert!(frame_of(&s, 200, Some(24))[0].contains("2026-11-28 01:00:00 UTC"));
    }

    #[test]
    fn all_rows_without_a_height() {
        let s = snapshot(30);
        let l = frame_of(&s, 80, None);
        // The title, the header, 34 rows, a blank line, the pool's line.
        assert_eq!(l.len(), 2 + 34 + 2, "{l:#?}");
        assert!(l.iter().any(|x| x.starts_with("pool train")), "{l:#?}");
    }
}
