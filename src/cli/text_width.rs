//! How many terminal columns text takes (pure, no table of every code point): East
//! Asian Wide and Fullwidth characters and emoji take two, combining marks and other
//! zero-width characters none, every other character one. A character counted two
//! that a terminal draws in one only leaves a column empty; the ranges err that way,
//! so a line measured here is never wider on the screen. And whether to write ASCII
//! only (`...` for `…`): the locale's character set is not UTF-8.

use std::sync::atomic::{AtomicBool, Ordering};

/// Zero-width: combining marks, joiners, variation selectors, other format characters.
const ZERO: &[(u32, u32)] = &[
    (0x0300, 0x036F),
    (0x0483, 0x0489),
    (0x0591, 0x05BD),
    (0x0610, 0x061A),
    (0x064B, 0x065F),
    (0x0E31, 0x0E31),
    (0x0E34, 0x0E3A),
    (0x0E47, 0x0E4E),
    (0x1AB0, 0x1AFF),
    (0x1DC0, 0x1DFF),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x20D0, 0x20FF),
    (0xFE00, 0xFE0F),
    (0xFE20, 0xFE2F),
    (0xFEFF, 0xFEFF),
    (0xE0000, 0xE0FFF),
];

/// Two columns: East Asian Wide and Fullwidth, emoji.
const WIDE: &[(u32, u32)] = &[
    (0x1100, 0x115F),
    (0x231A, 0x231B),
    (0x2329, 0x232A),
    (0x23E9, 0x23F3),
    (0x25FD, 0x25FE),
    (0x2600, 0x27BF), // misc symbols and dingbats: many are emoji, counted two
    (0x2B1B, 0x2B1C),
    (0x2B50, 0x2B55),
    (0x2E80, 0x303E),
    (0x3041, 0x33FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xA000, 0xA4CF),
    (0xA960, 0xA97F),
    (0xAC00, 0xD7A3),
    (0xF900, 0xFAFF),
    (0xFE10, 0xFE19),
    (0xFE30, 0xFE6F),
    (0xFF00, 0xFF60),
    (0xFFE0, 0xFFE6),
    (0x16FE0, 0x18CFF),
    (0x1B000, 0x1B2FF),
    (0x1F000, 0x1FAFF),
    (0x20000, 0x3FFFD),
];

fn within(c: u32, ranges: &[(u32, u32)]) -> bool {
    ranges.iter().any(|&(a, b)| (a..=b).contains(&c))
}

/// The columns `c` takes (a control character: 1, as the `?` it is shown as).
pub fn char_width(c: char) -> usize {
    let u = u32::from(c);
    if u < 0x7F {
        return 1;
    }
    if within(u, ZERO) {
        0
    } else if within(u, WIDE) {
        2
    } else {
        1
    }
}

/// The columns `s` takes.
pub fn width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

static ASCII: AtomicBool = AtomicBool::new(false);

/// Writes ASCII only from now on (`...` for `…`, `?` for any other non-ASCII character).
pub fn set_ascii(on: bool) {
    ASCII.store(on, Ordering::Relaxed);
}

/// Whether only ASCII is written.
pub fn ascii() -> bool {
    ASCII.load(Ordering::Relaxed)
}

/// The mark of a cut text: `…`, or `...` when only ASCII is written.
pub fn ellipsis() -> &'static str {
    if ascii() { "..." } else { "…" }
}

/// Whether the locale's character set is UTF-8: `LC_ALL`, else `LC_CTYPE`, else `LANG`
/// (the first set and not empty) names `UTF-8` or `utf8`, in any case. None set: the C
/// locale, ASCII.
pub fn utf8_locale(var: impl Fn(&str) -> Option<String>) -> bool {
    ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .find_map(|k| var(k).filter(|v| !v.is_empty()))
        .is_some_and(|v| {
            let v = v.to_ascii_lowercase();
            v.contains("utf-8") || v.contains("utf8")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_and_zero_width_characters() {
        assert_eq!(width("python train.py"), 15);
        assert_eq!(width("训练"), 4);
        assert_eq!(width("ｆｕｌｌ"), 8);
        assert_eq!(width("🚀x"), 3);
        assert_eq!(width("e\u{301}"), 1, "a combining accent takes no column");
        assert_eq!(width("한국어"), 6);
        assert_eq!(width("é…"), 2);
    }

    #[test]
    fn the_locale_says_whether_utf8_is_written() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(utf8_locale(env(&[("LANG", "C.UTF-8")])));
        assert!(utf8_locale(env(&[("LANG", "en_US.utf8")])));
        assert!(!utf8_locale(env(&[("LANG", "C.UTF-8"), ("LC_ALL", "C")])));
        assert!(utf8_locale(env(&[
            ("LC_ALL", ""),
            ("LC_CTYPE", "de_DE.UTF-8")
        ])));
        assert!(!utf8_locale(env(&[
            ("LC_CTYPE", "POSIX"),
            ("LANG", "C.UTF-8")
        ])));
        assert!(!utf8_locale(env(&[])));
    }
}
