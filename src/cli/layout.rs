//! The process table of `gpucap status` and `gpucap top` fitted to a width: which
//! columns are shown, how wide, and each cell cut to fit (pure).
//!
//! Columns are given room in a stated order of importance ([`IMPORTANCE`]): a column
//! is shown when its least width still fits beside the ones before it, so the last
//! ones drop first as the window narrows (PEAK, then REFUSED, FREE, USER, POOL, USE%,
//! the bar, CAP; PID, GPU, USED and COMMAND always stay). The command keeps
//! [`COMMAND_KEPT`] columns (16 characters and `…`) before any of the optional columns is shown (at 80
//! columns: PEAK and REFUSED go so that it does). What is left over widens
//! POOL and USER a little, the command, then the bar ([`GROWTH`]). A column is never
//! narrower than its header, so a header is never cut; a cell longer than its column
//! (a command, a user, a pool) is cut with `…`, never wrapped.

use crate::text_width::{self, char_width};

/// A column of the process table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Col {
    Gpu,
    Uuid,
    Pid,
    User,
    Pool,
    Cap,
    Used,
    /// A bar of used / cap.
    Bar,
    UsePct,
    Free,
    Peak,
    Refused,
    Command,
}

use Col::{Bar, Cap, Command, Free, Gpu, Peak, Pid, Pool, Refused, UsePct, Used, User, Uuid};

/// Left to right.
const ORDER: [Col; 13] = [
    Gpu, Uuid, Pid, User, Pool, Cap, Used, Bar, UsePct, Free, Peak, Refused, Command,
];

/// The order columns get room in: the first ones stay longest.
pub const IMPORTANCE: [Col; 13] = [
    Pid, Gpu, Used, Command, Uuid, Cap, Bar, UsePct, Pool, User, Free, Refused, Peak,
];

/// The command's width kept before the optional columns get room: 16 characters of a
/// longer command and its `…`, enough to tell processes apart (`python train.py …`),
/// where the window allows.
pub const COMMAND_KEPT: usize = 17;

/// The columns USER keeps of the widest user name before the columns after it in
/// [`IMPORTANCE`] (FREE, REFUSED, PEAK) are given room: enough to tell users apart
/// (`systemd-n…`, `systemd-t…`), as USER's header's 4 were not (`sys…` twice).
pub const USER_KEPT: usize = 10;

/// Where the room left over goes, in turn: (column, up to this width).
const GROWTH: [(Col, usize); 9] = [
    (Pool, 8),
    (User, 6),
    (Command, 16),
    (Bar, 20),
    (Command, 48),
    (User, 12),
    (Pool, 16),
    (Bar, 40),
    (Command, usize::MAX),
];

impl Col {
    pub fn header(self) -> &'static str {
        match self {
            Gpu => "GPU",
            Uuid => "GPU UUID",
            Pid => "PID",
            User => "USER",
            Pool => "POOL",
            Cap => "CAP",
            Used => "USED",
            Bar => "USED/CAP",
            UsePct => "USE%",
            Free => "FREE",
            Peak => "PEAK",
            Refused => "REFUSED",
            Command => "COMMAND",
        }
    }

    /// The least width: the header's, or the widest value's when wider (`users`: the
    /// widest user name shown, of which USER keeps up to [`USER_KEPT`] columns).
    fn min(self, users: usize) -> usize {
        let value = match self {
            User => users.min(USER_KEPT),
            Uuid => 40,
            Pid => 8, // 7 digits and `*` (another PID namespace)
            Cap | Used | Free | Peak => SIZE_WIDTH,
            Bar => 10,
            _ => 0,
        };
        value.max(self.header().chars().count())
    }

    /// Numbers are right-aligned.
    pub fn right(self) -> bool {
        matches!(
            self,
            Gpu | Pid | Cap | Used | UsePct | Free | Peak | Refused
        )
    }
}

/// The columns shown and their widths, left to right; one space between two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub cols: Vec<(Col, usize)>,
}

impl Layout {
    /// The width of a row.
    pub fn width(&self) -> usize {
        self.cols.iter().map(|(_, w)| w).sum::<usize>() + self.cols.len().saturating_sub(1)
    }

    /// One row of `cells` (one per column, in order), each fitted to its column.
    pub fn row(&self, cell: impl Fn(Col, usize) -> String) -> String {
        let mut out = String::new();
        for (i, &(c, w)) in self.cols.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let text = cut(&cell(c, w), w);
            let pad = w.saturating_sub(text_width::width(&text));
            let last = i + 1 == self.cols.len();
            if c.right() {
                out.extend(std::iter::repeat_n(' ', pad));
                out.push_str(&text);
            } else {
                out.push_str(&text);
                if !last {
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
        }
        out
    }

    /// The header row.
    pub fn header(&self) -> String {
        self.row(|c, _| c.header().to_string())
    }
}

/// The first columns of `wanted` in [`IMPORTANCE`]'s order that fit in `width`,
/// widened by [`GROWTH`]; `users`: the widest user name shown, in columns (USER keeps up
/// to [`USER_KEPT`] of it). PID, GPU, USED and COMMAND are always there (a row then is wider
/// than a window narrower than [`NARROWEST`] columns).
pub fn fit(wanted: &[Col], width: usize, users: usize) -> Layout {
    let mut chosen: Vec<(Col, usize)> = Vec::new();
    let mut used = 0usize;
    let mut full = false;
    for c in IMPORTANCE.iter().copied().filter(|c| wanted.contains(c)) {
        let sep = usize::from(!chosen.is_empty());
        if c == Command {
            // The command keeps COMMAND_KEPT characters before any optional column is
            // given room (less in a window too narrow for it beside PID, GPU, USED).
            let w = COMMAND_KEPT
                .min(width.saturating_sub(used + sep))
                .max(c.min(users));
            chosen.push((c, w));
            used += w + sep;
            continue;
        }
        let need = c.min(users) + sep;
        let always = matches!(c, Pid | Gpu | Used);
        if always || (!full && used + need <= width) {
            chosen.push((c, c.min(users)));
            used += need;
        } else {
            // The first that does not fit ends the choice: the columns shown at a
            // width are always the first ones of the order, so a wider window never
            // shows fewer.
            full = true;
        }
    }
    let mut spare = width.saturating_sub(used);
    for (col, upto) in GROWTH {
        if let Some((_, w)) = chosen.iter_mut().find(|(c, _)| *c == col) {
            let more = upto.saturating_sub(*w).min(spare);
            *w += more;
            spare -= more;
        }
    }
    chosen.sort_by_key(|(c, _)| ORDER.iter().position(|o| o == c));
    Layout { cols: chosen }
}

/// The narrowest width every row fits: PID, GPU, USED and COMMAND at their least.
pub const NARROWEST: usize = 27;

/// The widest a size is written ([`size`]).
pub const SIZE_WIDTH: usize = 6;

/// A size in at most [`SIZE_WIDTH`] characters, binary units: `512B`, `768Mi`, `1.50Gi`,
/// `80.0Gi`, `141Gi`.
pub fn size(b: u64) -> String {
    const UNITS: [(&str, u32); 5] = [("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    for (unit, shift) in UNITS {
        if b >= 1 << shift {
            let v = b as f64 / (1u64 << shift) as f64;
            if shift <= 20 {
                return format!("{}{unit}", v.round() as u64);
            }
            for decimals in [2, 1, 0] {
                let s = format!("{v:.decimals$}{unit}");
                if s.len() <= SIZE_WIDTH {
                    return s;
                }
            }
            return format!("{}{unit}", v.round() as u64);
        }
    }
    format!("{b}B")
}

/// `text` (control characters as `?`) in at most `width` columns of a terminal (a wide
/// character takes two, `text_width`): cut with `…` last. Where only ASCII is written
/// (`text_width::ascii`: a locale that is not UTF-8), `…` is `...` and any other
/// character past ASCII `?`.
pub fn cut(text: &str, width: usize) -> String {
    let ascii = text_width::ascii();
    let mut clean = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if c.is_control() => clean.push('?'),
            '…' if ascii => clean.push_str("..."),
            c if ascii && !c.is_ascii() => clean.push('?'),
            c => clean.push(c),
        }
    }
    if text_width::width(&clean) <= width {
        return clean;
    }
    let ellipsis = text_width::ellipsis();
    let Some(room) = width.checked_sub(text_width::width(ellipsis)) else {
        return ".".repeat(width);
    };
    let mut s = String::new();
    let mut used = 0;
    for c in clean.chars() {
        let w = char_width(c);
        if used + w > room {
            break;
        }
        s.push(c);
        used += w;
    }
    s.push_str(ellipsis);
    s
}

/// A bar of `used` out of `cap` in `width` characters: `[|||||     ]` (rounded down); full
/// at and past the cap; `[   -    ]` without a cap.
pub fn bar(used: u64, cap: Option<u64>, width: usize) -> String {
    let inner = width.saturating_sub(2);
    let body = match cap {
        None => format!("{:^inner$}", "-"),
        Some(c) => {
            let filled = if c == 0 {
                if used > 0 { inner } else { 0 }
            } else {
                // Rounded down, as USE% is: a full bar is a full cap.
                ((used as f64 / c as f64) * inner as f64)
                    .floor()
                    .min(inner as f64) as usize
            };
            format!("{}{}", "|".repeat(filled), " ".repeat(inner - filled))
        }
    };
    format!("[{body}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Col; 12] = [
        Gpu, Pid, User, Pool, Cap, Used, Bar, UsePct, Free, Peak, Refused, Command,
    ];

    #[test]
    fn every_width_from_40_to_250_fits_and_keeps_headers_whole() {
        for (uuid, users) in [(false, 4), (true, 4), (false, 16), (true, 9)] {
            for width in 40..=250 {
                let mut wanted = ALL.to_vec();
                if uuid {
                    wanted.push(Uuid);
                }
                let l = fit(&wanted, width, users);
                assert!(l.width() <= width, "{width}: {l:?}");
                let header = l.header();
                assert!(header.chars().count() <= width, "{width}: {header}");
                for (c, w) in &l.cols {
                    assert!(
                        *w >= c.header().len(),
                        "{width}: {c:?} narrower than its header"
                    );
                    assert!(header.contains(c.header()), "{width}: {header}");
                }
                for must in [Pid, Gpu, Used, Command] {
                    assert!(l.cols.iter().any(|(c, _)| *c == must), "{width}: {must:?}");
                }
                // Every column kept at this width is kept at any wider one.
                let wider = fit(&wanted, width + 1, users);
                for (c, _) in &l.cols {
                    assert!(wider.cols.iter().any(|(d, _)| d == c), "{width}: {c:?}");
                }
                // The whole width is used, less nothing (the command takes what is left).
                assert_eq!(l.width(), width, "{width}: {l:?}");
            }
        }
    }

    #[test]
    fn columns_drop_in_the_stated_order() {
        let names =
            |w: usize| -> Vec<Col> { fit(&ALL, w, 4).cols.iter().map(|(c, _)| *c).collect() };
        assert_eq!(names(200).len(), ALL.len(), "all at 200");
        // At 80 the bar stays, PEAK is the first to go.
        assert!(
            names(80).contains(&Bar) && !names(80).contains(&Peak),
            "{:?}",
            names(80)
        );
        // At 40 the command's 17 columns leave no room for CAP; at 44 it fits.
        assert_eq!(names(40), [Gpu, Pid, Used, Command]);
        assert_eq!(names(44), [Gpu, Pid, Cap, Used, Command]);
        // --uuid: the UUID column comes before the optional ones.
        let with_uuid: Vec<Col> = ALL.iter().copied().chain([Uuid]).collect();
        assert!(fit(&with_uuid, 80, 4).cols.iter().any(|(c, _)| *c == Uuid));
    }

    #[test]
    fn the_command_keeps_16_characters_from_47_columns() {
        for width in 47..=250 {
            let l = fit(&ALL, width, 4);
            let command = l.cols.iter().find(|(c, _)| *c == Command).unwrap().1;
            assert!(command >= COMMAND_KEPT, "{width}: {l:?}");
        }
        // At 80 (79 in a terminal) the first optional columns to go make the room.
        for width in [79, 80] {
            let names: Vec<Col> = fit(&ALL, width, 4).cols.iter().map(|(c, _)| *c).collect();
            assert!(
                !names.contains(&Peak) && !names.contains(&Refused),
                "{names:?}"
            );
            assert!(names.contains(&Bar) && names.contains(&Free), "{names:?}");
        }
    }

    #[test]
    fn user_keeps_enough_of_the_longest_name_to_tell_users_apart() {
        // top's columns at 80 (79 on a terminal): USER was its header's 4 columns
        // (`sys…` for both systemd users).
        for width in [79, 80] {
            let l = fit(&ALL, width, "systemd-timesync".len());
            let row = |user: &str| {
                l.row(|c, _| match c {
                    User => user.into(),
                    _ => "1".into(),
                })
            };
            let (a, b) = (row("systemd-network"), row("systemd-timesync"));
            assert_ne!(a, b, "{width}: {l:?}");
            let user = l.cols.iter().find(|(c, _)| *c == User).unwrap().1;
            assert!(user >= USER_KEPT, "{width}: {l:?}");
            // What made the room: the columns after USER in the order (FREE here).
            assert!(
                l.cols.iter().any(|(c, _)| *c == Command) && l.width() <= width,
                "{width}: {l:?}"
            );
            let command = l.cols.iter().find(|(c, _)| *c == Command).unwrap().1;
            assert!(command >= COMMAND_KEPT, "{width}: {l:?}");
        }
        // Short names (root) take no more than their header.
        let l = fit(&ALL, 79, 4);
        assert!(l.cols.iter().any(|(c, _)| *c == Free), "{l:?}");
        assert!(row_words(&fit(&ALL, 79, "nobody".len())).contains(&"nobody"));
    }

    fn row_words(l: &Layout) -> Vec<&'static str> {
        let row = l.row(|c, _| match c {
            User => "nobody".into(),
            _ => "1".into(),
        });
        row.split_whitespace()
            .filter(|w| *w == "nobody")
            .map(|_| "nobody")
            .collect()
    }

    #[test]
    fn rows_are_cut_to_their_columns() {
        let l = fit(&ALL, 80, 4);
        let row = l.row(|c, _| match c {
            Command => "python train.py --a-very-long-argument-list --that --goes --on".into(),
            User => "a-user-name-too-long".into(),
            _ => "1".into(),
        });
        assert_eq!(row.chars().count(), 80, "{row}");
        assert!(row.ends_with('…'), "{row}");
        assert!(row.contains("a-us…") || row.contains('…'), "{row}");
        assert_eq!(cut("ab\x1bc", 10), "ab?c");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abcdef", 0), "");
    }

    #[test]
    fn wide_characters_are_measured_in_columns() {
        // A command of CJK characters and emoji: each takes two columns of a terminal.
        let l = fit(&ALL, 80, 4);
        for command in [
            "训练模型训练模型训练模型训练模型训练模型训练模型",
            "🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀🚀",
        ] {
            let row = l.row(|c, _| match c {
                Command => command.into(),
                User => "用户名用户名".into(),
                Pool => "池池池池池池".into(),
                _ => "1".into(),
            });
            assert_eq!(text_width::width(&row), 80, "{row}");
            assert!(row.ends_with('…'), "{row}");
        }
        // A short wide name is padded to its column's width in columns.
        let row = l.row(|c, _| match c {
            User => "用户".into(),
            Command => "X".into(),
            _ => "1".into(),
        });
        let header = l.header();
        assert_eq!(
            text_width::width(&row[..row.find('X').unwrap()]),
            header.find("COMMAND").unwrap(),
            "{row}\n{header}"
        );
        assert_eq!(cut("训练模型", 5), "训练…");
        assert_eq!(cut("训练模型", 8), "训练模型");
        assert_eq!(cut("训练模型", 7), "训练模…");
        assert_eq!(cut("e\u{301}tude", 5), "e\u{301}tude");
    }

    #[test]
    fn rows_fit_from_the_narrowest_width_the_documents_give() {
        for width in NARROWEST..60 {
            assert!(fit(&ALL, width, 16).width() <= width, "{width}");
        }
        assert!(fit(&ALL, NARROWEST - 1, 4).width() > NARROWEST - 1);
        let doc = include_str!("../../docs/src/watching.md").replace('\n', " ");
        assert!(
            doc.contains(&format!(
                "narrower than {NARROWEST} columns gets rows wider than it"
            )),
            "watching.md gives another width"
        );
    }

    #[test]
    fn sizes_fit_six_characters() {
        for (b, s) in [
            (0, "0B"),
            (1023, "1023B"),
            (1 << 20, "1Mi"),
            (768 << 20, "768Mi"),
            (1 << 30, "1.00Gi"),
            (3 << 29, "1.50Gi"),
            (80 << 30, "80.0Gi"),
            (141 << 30, "141Gi"),
            ((10 << 30) - 1, "10.0Gi"),
        ] {
            assert_eq!(size(b), s, "{b}");
        }
        for shift in 0..63 {
            assert!(size(1u64 << shift).len() <= SIZE_WIDTH);
            assert!(size((1u64 << shift) * 3 / 2).len() <= SIZE_WIDTH);
        }
    }

    #[test]
    fn bars() {
        assert_eq!(bar(50, Some(100), 12), "[|||||     ]");
        assert_eq!(bar(500, Some(100), 6), "[||||]");
        assert_eq!(bar(0, Some(100), 6), "[    ]");
        assert_eq!(bar(1, None, 7), "[  -  ]");
        assert_eq!(bar(1020 << 20, Some(1 << 30), 10), "[||||||| ]");
        assert_eq!(bar(1 << 30, Some(1 << 30), 10), "[||||||||]");
    }
}
