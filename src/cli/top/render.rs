//! One frame of `gpucap top`: a title line, the process table fitted to the window's
//! width with a used/cap bar (`layout`), as many rows as its height allows (then a
//! line saying how many more), a line per pool and GPU when there is room, and, as
//! `gpucap status` says them, the lines that explain a cap marked as a ceiling handed
//! down (`^`) where there is room left.

use crate::layout;
use crate::procs::{Row, Snapshot};
use crate::status::table;

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
    pub now: String,
}

/// The frame's lines, none wider than `width`; at most `height - 1` of them when a
/// height is given (a terminal: the last line is left empty, so nothing scrolls).
pub fn lines(f: &Frame, width: usize, height: Option<usize>) -> Vec<String> {
    let s = f.snapshot;
    let mut title = format!(
        "gpucap top  {} UTC  {} process{}, {} pool{}  sort: {}",
        f.now,
        f.rows.len(),
        if f.rows.len() == 1 { "" } else { "es" },
        s.pools.len(),
        if s.pools.len() == 1 { "" } else { "s" },
        f.sort.name()
    );
    if let Some(e) = &f.every {
        title.push_str(&format!("  {e}"));
    }
    let mut out = vec![layout::cut(&title, width)];
    let layout = layout::fit(&table::columns(f.uuid, true), width);
    out.push(layout.header());
    let rows = table::rows(&layout, f.rows);
    let pools = table::pool_lines(s, width);
    let mut notes = table::ceiling_notes(f.rows.iter().copied(), width);
    // What could not be read (a damaged file, root's own directory another user made),
    // as `status` says it: whole in a log (`--once`, a pipe), cut to the window's width.
    let cut_at = if height.is_some() { width } else { usize::MAX };
    notes.extend(
        s.errors
            .iter()
            .map(|e| layout::cut(&format!("cannot read {e}"), cut_at)),
    );
    let Some(height) = height else {
        out.extend(rows);
        out.extend(notes);
        if !pools.is_empty() {
            out.push(String::new());
            out.extend(pools);
        }
        return out;
    };
    // Lines left under the title and the header, the last one of the window unused.
    let room = height.saturating_sub(3);
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
        out.extend(pools.into_iter().take(pool_room - 1));
    }
    // The ceilings' lines where the window has lines left (its last one stays empty).
    let left = height.saturating_sub(1).saturating_sub(out.len());
    out.extend(notes.into_iter().take(left));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::tests::{lone, pool};
    use crate::procs::{Gpus, rows};

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
    fn all_rows_without_a_height() {
        let s = snapshot(30);
        let l = frame_of(&s, 80, None);
        // The title, the header, 34 rows, a blank line, the pool's line.
        assert_eq!(l.len(), 2 + 34 + 2, "{l:#?}");
        assert!(l.iter().any(|x| x.starts_with("pool train")), "{l:#?}");
    }
}
