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
            // Rounded down: 100% is a full cap, never one with room left.
            .map_or("-".to_string(), |p| format!("{}%", p.floor() as u64)),
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

/// The widest user name of `rows`, in columns (what USER is given room for).
pub fn users<'a>(rows: impl IntoIterator<Item = &'a Row>) -> usize {
    rows.into_iter()
        .map(|r| crate::text_width::width(&r.user))
        .max()
        .unwrap_or(0)
}

/// The table's rows under `layout`.
pub fn rows(layout: &Layout, rows: &[&Row]) -> Vec<String> {
    rows.iter()
        .map(|r| layout.row(|c, w| cell(r, c, w)))
        .collect()
}

/// One line per pool and GPU: its cap, use, peak, refusals, what the dead hold; in
/// `width` columns, the pool's name cut first (down to [`NAME_KEPT`] columns) so that its
/// figures stay (`usize::MAX`: whole, for a log).
pub fn pool_lines(s: &Snapshot, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for p in &s.pools {
        // Root sees every user's pools: two of one name say whose.
        let owner = if s.pools.iter().any(|o| o.name == p.name && o.uid != p.uid) {
            format!(" ({})", p.user)
        } else {
            String::new()
        };
        let alive = p.view.members.iter().filter(|m| m.alive).count();
        let dead = p.view.members.len() - alive;
        if p.view.gpus.is_empty() {
            out.push(pool_line(
                &p.name,
                &format!("{owner}: no GPU yet; {alive} alive, {dead} dead"),
                width,
            ));
        }
        for g in &p.view.gpus {
            let cap = g.cap.map_or("no cap".to_string(), layout::size);
            let gpu = match s.gpus.index(&g.raw_uuid) {
                Some(i) => format!("GPU {i}"),
                None => short_uuid(&g.uuid),
            };
            let mut figures = format!(
                "{owner} {gpu}: {}/{cap} used, peak {}, {} refused; {alive} alive, {dead} dead",
                layout::size(g.used),
                layout::size(g.peak),
                g.refusals,
            );
            if g.held_by_dead > 0 {
                figures.push_str(&format!(
                    ", {} held by the dead",
                    layout::size(g.held_by_dead)
                ));
            }
            out.push(pool_line(&p.name, &figures, width));
        }
    }
    out
}

/// What a pool's name keeps, at least, of its line's width ([`pool_line`]).
pub const NAME_KEPT: usize = 8;

/// `pool NAME` and its figures in `width` columns: the name cut first (to no less than
/// [`NAME_KEPT`] columns), the figures' end only where they alone do not fit.
fn pool_line(name: &str, figures: &str, width: usize) -> String {
    let whole = format!("pool {name}{figures}");
    if crate::text_width::width(&whole) <= width {
        return layout::cut(&whole, width);
    }
    let room = width
        .saturating_sub("pool ".len() + crate::text_width::width(figures))
        .max(NAME_KEPT);
    layout::cut(&format!("pool {}{figures}", layout::cut(name, room)), width)
}

/// `GPU-11111111-…`: enough of a UUID to tell GPUs apart on a line.
fn short_uuid(u: &str) -> String {
    layout::cut(u, 13)
}

/// The whole `gpucap status` text at `width`; `terminal`: written to one (else the pool
/// lines are whole, as the errors' are: a log keeps every figure).
pub fn render(s: &Snapshot, width: usize, uuid: bool, terminal: bool) -> String {
    let mut out = String::new();
    if s.processes.is_empty() {
        out.push_str("no capped process (no pool member, no process capped on its own)\n");
    } else {
        let layout = layout::fit(&columns(uuid, false), width, users(&s.processes));
        out.push_str(&layout.header());
        out.push('\n');
        let sorted = by_pool(&s.processes);
        for line in rows(&layout, &sorted) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    let pools = pool_lines(s, if terminal { width } else { usize::MAX });
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
    // Whole, however wide the terminal: an error cut short loses its reason.
    for e in error_lines(s) {
        out.push_str(&layout::cut(&e, usize::MAX));
        out.push('\n');
    }
    out
}

/// What could not be read (`cannot read …`), then what was read all the same though it
/// should not be as it is, one line each.
pub fn error_lines(s: &Snapshot) -> impl Iterator<Item = String> + '_ {
    s.errors
        .iter()
        .map(|e| format!("cannot read {e}"))
        .chain(s.warnings.iter().cloned())
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
            warnings: vec![],
            gpus,
        }
    }

    #[test]
    fn one_table_of_members_and_lone_processes_in_80_columns() {
        let text = render(&snapshot(), 80, false, true);
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
        let wide = render(&snapshot(), 120, false, true);
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
        let wide = render(&snapshot(), 120, false, true);
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
        let text = render(&s, 80, false, true);
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
        assert!(!render(&snapshot(), 80, false, true).contains('^'));
        assert_eq!(marked_size(256 << 20), "256Mi^");
        assert_eq!(marked_size(1000 << 20), "1000M^");
        assert_eq!(marked_size(3 << 39), "1.5Ti^");
    }

    #[test]
    fn use_is_rounded_down_so_that_100_percent_is_full() {
        let mut s = snapshot();
        let r = s.processes.iter_mut().find(|r| r.pid == 99).unwrap();
        r.cap = Some(1 << 30);
        r.used = 1020 * MIB;
        r.use_percent = Some(1020.0 * 100.0 / 1024.0);
        assert_eq!(cell(r, Col::UsePct, 4), "99%");
        r.use_percent = Some(100.0);
        assert_eq!(cell(r, Col::UsePct, 4), "100%");
        r.use_percent = Some(29.9);
        assert_eq!(cell(r, Col::UsePct, 4), "29%");
    }

    #[test]
    fn a_pool_line_cuts_the_name_not_the_figures() {
        let mut s = snapshot();
        s.pools[0].name = format!("a-pool-with-a-long-name-{}", "x".repeat(40));
        assert_eq!(s.pools[0].name.len(), 64);
        let lines = pool_lines(&s, 80);
        let l = &lines[0];
        assert!(l.chars().count() <= 80, "{l}");
        assert!(
            l.starts_with("pool a-pool-… GPU 0: 700Mi/1.00Gi used")
                && l.contains("2 alive, 1 dead"),
            "{l}"
        );
        // A log (status into a pipe) has the lines whole.
        let text = render(&s, 80, false, false);
        assert!(
            text.contains(&format!("\npool {} GPU 0: 700Mi/1.00Gi used, peak 701Mi, 1 refused; 2 alive, 1 dead, 200Mi held by the dead\n", s.pools[0].name)),
            "{text}"
        );
        // On a terminal, a short name and a long line: the name stays, the end is cut.
        let text = render(&snapshot(), 80, false, true);
        assert!(
            text.contains(
                "\npool train GPU 0: 700Mi/1.00Gi used, peak 701Mi, 1 refused; 2 alive, 1 dead,"
            ),
            "{text}"
        );
        for l in text.lines() {
            assert!(l.chars().count() <= 80, "{l:?}");
        }
    }

    #[test]
    fn pools_of_one_name_say_whose() {
        let mut s = snapshot();
        let mut other = s.pools[0].clone();
        other.uid = 65534;
        other.user = "nobody".into();
        other.path = "/p/gpucap-65534/train.pool".into();
        s.pools.push(other);
        let lines = pool_lines(&s, 120);
        assert!(
            lines[0].starts_with("pool train (alice) GPU 0: "),
            "{lines:#?}"
        );
        assert!(
            lines[1].starts_with("pool train (nobody) GPU 0: "),
            "{lines:#?}"
        );
        // One pool of its name: no owner said.
        assert!(pool_lines(&snapshot(), 120)[0].starts_with("pool train GPU 0: "));
    }

    #[test]
    fn uuid_on_demand() {
        let text = render(&snapshot(), 120, true, true);
        assert!(text.lines().next().unwrap().contains("GPU UUID"), "{text}");
        assert!(
            text.contains("GPU-11111111-1111-1111-1111-111111111111"),
            "{text}"
        );
    }

    #[test]
    fn nothing_to_show() {
        let text = render(&Snapshot::default(), 80, false, true);
        assert!(text.starts_with("no capped process"), "{text}");
    }
}
