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

    /// The least width: the header's, or the widest value's when wider.
    fn min(self) -> usize {
        let value = match self {
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
            let pad = w - text.chars().count();
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
/// widened by [`GROWTH`]. PID, GPU, USED and COMMAND are always there (a row then may be wider
/// than a window narrower than 26 columns).
pub fn fit(wanted: &[Col], width: usize) -> Layout {
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
                .max(c.min());
            chosen.push((c, w));
            used += w + sep;
            continue;
        }
        let need = c.min() + sep;
        let always = matches!(c, Pid | Gpu | Used);
        if always || (!full && used + need <= width) {
            chosen.push((c, c.min()));
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

/// `text` (control characters as `?`) in at most `width` characters: cut with `…` last.
pub fn cut(text: &str, width: usize) -> String {
    let clean: Vec<char> = text
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if clean.len() <= width {
        return clean.into_iter().collect();
    }
    if width == 0 {
        return String::new();
    }
    let mut s: String = clean[..width - 1].iter().collect();
    s.push('…');
    s
}

/// A bar of `used` out of `cap` in `width` characters: `[|||||     ]`; full past the
/// cap; `[   -    ]` without a cap.
pub fn bar(used: u64, cap: Option<u64>, width: usize) -> String {
    let inner = width.saturating_sub(2);
    let body = match cap {
        None => format!("{:^inner$}", "-"),
        Some(c) => {
            let filled = if c == 0 {
                if used > 0 { inner } else { 0 }
            } else {
                ((used as f64 / c as f64) * inner as f64)
                    .round()
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
        for uuid in [false, true] {
            for width in 40..=250 {
                let mut wanted = ALL.to_vec();
                if uuid {
                    wanted.push(Uuid);
                }
                let l = fit(&wanted, width);
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
                let wider = fit(&wanted, width + 1);
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
        let names = |w: usize| -> Vec<Col> { fit(&ALL, w).cols.iter().map(|(c, _)| *c).collect() };
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
        assert!(fit(&with_uuid, 80).cols.iter().any(|(c, _)| *c == Uuid));
    }

    #[test]
    fn the_command_keeps_16_characters_from_47_columns() {
        for width in 47..=250 {
            let l = fit(&ALL, width);
            let command = l.cols.iter().find(|(c, _)| *c == Command).unwrap().1;
            assert!(command >= COMMAND_KEPT, "{width}: {l:?}");
        }
        // At 80 (79 in a terminal) the first optional columns to go make the room.
        for width in [79, 80] {
            let names: Vec<Col> = fit(&ALL, width).cols.iter().map(|(c, _)| *c).collect();
            assert!(
                !names.contains(&Peak) && !names.contains(&Refused),
                "{names:?}"
            );
            assert!(names.contains(&Bar) && names.contains(&Free), "{names:?}");
        }
    }

    #[test]
    fn rows_are_cut_to_their_columns() {
        let l = fit(&ALL, 80);
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
    }
}
