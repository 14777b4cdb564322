//! `gpucap status` without a pool: every capped process as one table fitted to the
//! width (see `layout`), then a line per pool and GPU with the pool's own figures.

use crate::handed_down;
use crate::layout::{self, Col, Layout};
use crate::procs::{Row, Snapshot};

/// The columns of the table (`uuid`: the GPU's UUID too); `bar`: a used/cap bar (`top`).
pub fn columns(uuid: bool, bar: bool) -> Vec<Col> {
    let mut c = vec![
        Col::Gpu,
        Col::Pid,
        Col::User,
        Col::Pool,
        Col::Cap,
        Col::Used,
        Col::UsePct,
        Col::Free,
        Col::Peak,
        Col::Refused,
        Col::Command,
    ];
    if uuid {
        c.push(Col::Uuid);
    }
    if bar {
        c.push(Col::Bar);
    }
    c
}

/// One cell of `r` in column `c`, `w` wide.
pub fn cell(r: &Row, c: Col, w: usize) -> String {
    let size = |v: Option<u64>| v.map_or("-".to_string(), layout::size);
    match c {
        Col::Gpu => r.gpu.map_or("-".to_string(), |g| g.to_string()),
        Col::Uuid => r.gpu_uuid.clone(),
        Col::Pid => format!("{}{}", r.pid, if r.other_namespace { "*" } else { "" }),
        Col::User => r.user.clone(),
        Col::Pool => r.pool.clone().unwrap_or_else(|| "-".to_string()),
        Col::Cap => match (&r.ceiling_from, r.cap) {
            (Some(_), Some(cap)) => marked_size(cap),
            _ => size(r.cap),
        },
        Col::Used => layout::size(r.used),
        Col::Bar => layout::bar(r.used, r.cap, w),
        Col::UsePct => r
            .use_percent
            .map_or("-".to_string(), |p| format!("{:.0}%", p)),
        Col::Free => size(r.free),
        Col::Peak => layout::size(r.peak),
        Col::Refused => r.refusals.map_or("-".to_string(), |n| n.to_string()),
        Col::Command if !r.alive => format!("(dead) {}", r.command),
        Col::Command => r.command.clone(),
    }
}

/// A cap handed down, marked, in the column's width: `256Mi^`, `1.5Gi^`.
fn marked_size(b: u64) -> String {
    let mut s = layout::size(b);
    if s.chars().count() >= layout::SIZE_WIDTH {
        // One character for the mark: a decimal less, or the unit's `i`.
        s = match s.find('.') {
            Some(dot) if s.len() - dot > 3 => format!("{}{}", &s[..s.len() - 3], &s[s.len() - 2..]),
            _ => s.trim_end_matches('i').to_string(),
        };
    }
    format!("{s}{}", handed_down::MARK)
}

/// One line per place ceilings were handed down from, under the table: which processes'
/// caps (marked [`handed_down::MARK`]) are a ceiling their environment cannot raise.
pub fn ceiling_notes<'a>(rows: impl IntoIterator<Item = &'a Row>, width: usize) -> Vec<String> {
    handed_down::notes(
        rows.into_iter()
            .filter_map(|r| Some((r.ceiling_from.as_deref()?, r.pid))),
    )
    .iter()
    .map(|l| layout::cut(l, width))
    .collect()
}

/// The table's rows under `layout`.
pub fn rows(layout: &Layout, rows: &[&Row]) -> Vec<String> {
    rows.iter()
        .map(|r| layout.row(|c, w| cell(r, c, w)))
        .collect()
}

/// One line per pool and GPU: its cap, use, peak, refusals, what the dead hold.
pub fn pool_lines(s: &Snapshot, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for p in &s.pools {
        let alive = p.view.members.iter().filter(|m| m.alive).count();
        let dead = p.view.members.len() - alive;
        if p.view.gpus.is_empty() {
            out.push(layout::cut(
                &format!("pool {}: no GPU yet; {alive} alive, {dead} dead", p.name),
                width,
            ));
        }
        for g in &p.view.gpus {
            let cap = g.cap.map_or("no cap".to_string(), layout::size);
            let gpu = match s.gpus.index(&g.raw_uuid) {
                Some(i) => format!("GPU {i}"),
                None => short_uuid(&g.uuid),
            };
            let mut line = format!(
                "pool {} {gpu}: {}/{cap} used, peak {}, {} refused; {alive} alive, {dead} dead",
                p.name,
                layout::size(g.used),
                layout::size(g.peak),
                g.refusals,
            );
            if g.held_by_dead > 0 {
                line.push_str(&format!(
                    ", {} held by the dead",
                    layout::size(g.held_by_dead)
                ));
            }
            out.push(layout::cut(&line, width));
        }
    }
    out
}

/// `GPU-11111111-…`: enough of a UUID to tell GPUs apart on a line.
fn short_uuid(u: &str) -> String {
    layout::cut(u, 13)
}

/// The whole `gpucap status` text at `width`.
pub fn render(s: &Snapshot, width: usize, uuid: bool) -> String {
    let mut out = String::new();
    if s.processes.is_empty() {
        out.push_str("no capped process (no pool member, no process capped on its own)\n");
    } else {
        let layout = layout::fit(&columns(uuid, false), width);
        out.push_str(&layout.header());
        out.push('\n');
        let sorted = by_pool(&s.processes);
        for line in rows(&layout, &sorted) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    let pools = pool_lines(s, width);
    if !pools.is_empty() {
        out.push('\n');
        for l in pools {
            out.push_str(&l);
            out.push('\n');
        }
    }
    for l in ceiling_notes(&s.processes, width) {
        out.push_str(&l);
        out.push('\n');
    }
    if s.processes.iter().any(|r| r.other_namespace) {
        out.push_str(&layout::cut(
            "* a pid in another PID namespace (another container)",
            width,
        ));
        out.push('\n');
    }
    for e in &s.errors {
        // Whole, however wide the terminal: an error cut short loses its reason.
        out.push_str(&layout::cut(&format!("cannot read {e}"), usize::MAX));
        out.push('\n');
    }
    out
}

/// Pools by name, then processes capped alone; the largest first within each.
fn by_pool(rows: &[Row]) -> Vec<&Row> {
    let mut v: Vec<&Row> = rows.iter().collect();
    v.sort_by(|a, b| {
        (a.pool.is_none(), &a.pool)
            .cmp(&(b.pool.is_none(), &b.pool))
            .then(b.used.cmp(&a.used))
            .then(a.pid.cmp(&b.pid))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::tests::{lone, pool};
    use crate::procs::{Gpus, rows as make_rows};

    const MIB: u64 = 1 << 20;

    fn snapshot() -> Snapshot {
        let pools = vec![pool()];
        let lone = vec![lone(99, 300 * MIB, Some(1 << 30))];
        let gpus = Gpus::from_uuids(vec![[0x11; 16]]);
        Snapshot {
            processes: make_rows(&pools, &lone, 7, &gpus),
            pools,
            lone,
            errors: vec![],
            gpus,
        }
    }

    #[test]
    fn one_table_of_members_and_lone_processes_in_80_columns() {
        let text = render(&snapshot(), 80, false);
        for l in text.lines() {
            assert!(l.chars().count() <= 80, "{l:?}\n{text}");
        }
        let header = text.lines().next().unwrap();
        for h in [
            "GPU", "PID", "USER", "POOL", "CAP", "USED", "USE%", "FREE", "REFUSED", "COMMAND",
        ] {
            assert!(header.split_whitespace().any(|w| w == h), "{h} in {header}");
        }
        // PEAK goes first, so that the command keeps 16 characters; wider, it is back.
        assert!(!header.contains("PEAK"), "{header}");
        let wide = render(&snapshot(), 120, false);
        assert!(wide.lines().next().unwrap().contains("PEAK"), "{wide}");
        assert!(
            !text.contains("GPU-1111"),
            "no UUID column unless asked\n{text}"
        );
        let lone_row = text.lines().find(|l| l.contains("prog-99")).unwrap();
        for part in [
            " 99 ", " alice ", " - ", "1.00Gi", "300Mi", "29%", "724Mi", " 2 ",
        ] {
            assert!(lone_row.contains(part), "{part:?} in {lone_row:?}");
        }
        let member = text.lines().find(|l| l.contains("prog-10")).unwrap();
        assert!(
            member.contains("train") && member.contains("512Mi"),
            "{member}"
        );
        let dead = text
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("11"))
            .unwrap();
        assert!(dead.contains(" (dead) "), "{dead}");
        // Members first (pool by pool), then the processes capped alone.
        let at = |s: &str| text.find(s).unwrap();
        assert!(
            at("prog-10") < at("prog-99") && at("(dead)") < at("prog-99"),
            "{text}"
        );
        assert!(
            text.contains("\npool train GPU 0: 700Mi/1.00Gi used, peak 701Mi, 1 re"),
            "{text}"
        );
        let wide = render(&snapshot(), 120, false);
        assert!(
            wide.contains("\npool train GPU 0: 700Mi/1.00Gi used, peak 701Mi, 1 refused; 2 alive, 1 dead, 200Mi held by the dead\n"),
            "{wide}"
        );
        assert!(text.contains("* a pid in another PID namespace"));
    }

    #[test]
    fn a_cap_handed_down_is_marked_with_where_it_came_from() {
        let mut s = snapshot();
        for r in s
            .processes
            .iter_mut()
            .filter(|r| r.pid == 99 || r.pid == 10)
        {
            r.ceiling_from = Some("/etc/gpucap/gpucap.env".into());
        }
        let text = render(&s, 80, false);
        let lone_row = text.lines().find(|l| l.contains("prog-99")).unwrap();
        assert!(lone_row.contains(" 1.0Gi^ "), "{lone_row:?}");
        let member = text.lines().find(|l| l.contains("prog-10")).unwrap();
        assert!(member.contains(" 512Mi^ "), "{member:?}");
        let notes: Vec<&str> = text.lines().filter(|l| l.starts_with("^ ")).collect();
        assert_eq!(
            notes,
            ["^ the cap is a ceiling from /etc/gpucap/gpucap.env (pid 10, 99)"],
            "{text}"
        );
        assert!(!render(&snapshot(), 80, false).contains('^'));
        assert_eq!(marked_size(256 << 20), "256Mi^");
        assert_eq!(marked_size(1000 << 20), "1000M^");
        assert_eq!(marked_size(3 << 39), "1.5Ti^");
    }

    #[test]
    fn uuid_on_demand() {
        let text = render(&snapshot(), 120, true);
        assert!(text.lines().next().unwrap().contains("GPU UUID"), "{text}");
        assert!(
            text.contains("GPU-11111111-1111-1111-1111-111111111111"),
            "{text}"
        );
    }

    #[test]
    fn nothing_to_show() {
        let text = render(&Snapshot::default(), 80, false);
        assert!(text.starts_with("no capped process"), "{text}");
    }
}
