//! One GPU's cap in bytes: the limit the configuration asks for that GPU, under the
//! ceiling handed down in a file, turned into bytes with the GPU's total. The shim
//! applies it when a GPU is first used; `gpucap check` prints it. One rule for both.

use super::ceiling::{Capped, HandedDown, cap_under, held_line};
use super::limit::{DeviceKey, Limit, LimitSpec};
use super::model::{Ceiling, Config};
use crate::size::format_bytes;

/// A GPU's cap, and what to say about it once.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCap {
    /// The cap in bytes (None: uncapped, counted only).
    pub cap: Option<u64>,
    /// The limit the environment asked for this GPU (None: none, or `GPUCAP_LIMIT=none`
    /// under a ceiling).
    pub asked: Option<Limit>,
    /// The file's ceiling for this GPU (None: no file's ceiling, or none for this GPU).
    pub ceiling: Option<Limit>,
    /// The environment asked more than a file's ceiling: the cap is held at the ceiling.
    pub held: bool,
    /// Where the cap was handed down from, when the cap is that ceiling (a file's, held
    /// there or asked just as much; a GPU driver's hand-over). None: the cap is the
    /// environment's own, or lower than the ceiling, or there is none.
    pub handed_down: Option<HandedDown>,
    /// The most this process may ever hold on the GPU, whatever a pool's words say: the
    /// ceiling handed down (a file's, or a driver's hand-over without one), in bytes.
    /// None: no ceiling for this GPU. A pool resized above it, or a member ceiling set
    /// above it by `gpucap pool set`, never lets the process past it.
    pub ceiling_bytes: Option<u64>,
    /// What the shim says, once, when the GPU is first used.
    pub notes: Vec<CapNote>,
}

/// Something to say about a GPU's cap.
#[derive(Clone, Debug, PartialEq)]
pub enum CapNote {
    /// A cap in bytes above the GPU's memory: it never binds.
    AboveTotal { cap: u64, total: u64 },
    /// The GPU's total could not be read to resolve a fraction, so the GPU is capped at
    /// zero (never uncapped). `limit`: the fraction (None: a fraction in the ceiling or
    /// under it).
    TotalUnreadable { limit: Option<Limit> },
    /// The environment asked more than the ceiling (gpucap's line, for warn level).
    Held(String),
    /// A ceiling keyed by ordinal, under `CUDA_VISIBLE_DEVICES`: held at the least of its
    /// figures (`from`: the file).
    OrdinalCeiling { from: String, cap: u64 },
}

impl CapNote {
    /// Whether the note is an error (the GPU refuses every allocation) rather than a warning.
    pub fn is_error(&self) -> bool {
        matches!(self, CapNote::TotalUnreadable { .. })
    }

    /// The line, without the `gpucap: ` prefix, for GPU `device`.
    pub fn text(&self, device: usize) -> String {
        match self {
            CapNote::AboveTotal { cap, total } => format!(
                "the cap of GPU {device}, {}, is more than the GPU has ({}): it never binds",
                format_bytes(*cap),
                format_bytes(*total)
            ),
            CapNote::TotalUnreadable { limit: Some(l) } => format!(
                "cannot read the physical memory of GPU {device} to resolve the limit {l}: \
                 allocations on it are refused"
            ),
            CapNote::TotalUnreadable { limit: None } => format!(
                "cannot read the physical memory of GPU {device} to resolve its cap: \
                 allocations on it are refused"
            ),
            CapNote::Held(line) => line.trim_start_matches("gpucap: ").to_string(),
            CapNote::OrdinalCeiling { from, cap } => format!(
                "the ceiling of {from} names GPUs by ordinal, and CUDA_VISIBLE_DEVICES chooses \
                 which GPU each ordinal is: GPU {device} is held at the least of its figures, {} \
                 (name the GPUs by UUID in the file to give them different ceilings)",
                format_bytes(*cap)
            ),
        }
    }
}

/// GPU `device`'s cap under `config`: `limit_of` picks the GPU's limit out of a spec (by
/// ordinal or UUID), `total` reads the GPU's memory (asked at most once, and only where
/// a fraction needs it or a cap in bytes may exceed it).
///
/// Without a file's ceiling the limit asked is the cap. Under one, the smaller of the
/// two, in bytes; `GPUCAP_LIMIT=none` asks for none, which leaves the ceiling. A fraction
/// whose total cannot be read caps the GPU at zero.
pub fn device_cap(
    config: &Config,
    device: usize,
    limit_of: impl Fn(&LimitSpec) -> Option<Limit>,
    total: impl FnOnce() -> Option<u64>,
) -> DeviceCap {
    let mut read = Some(total);
    let mut total_read: Option<Option<u64>> = None;
    let mut total = || *total_read.get_or_insert_with(|| read.take().and_then(|f| f()));
    let mut notes = Vec::new();
    let asked = match &config.bound {
        Some(b) if b.asked_none => None,
        _ => config.limit.as_ref().and_then(&limit_of),
    };
    let Some(bound) = &config.bound else {
        let cap = in_bytes(asked, &mut total, &mut notes);
        let handed_down = cap.and(HandedDown::of(config));
        return DeviceCap {
            cap,
            asked,
            ceiling: None,
            held: false,
            handed_down,
            ceiling_bytes: handed_down.and(cap),
            notes,
        };
    };
    // Every figure a ceiling may hold this GPU to ([`held_figures`]).
    let inner = held_figures(config, &bound.spec, limit_of(&bound.spec));
    // /etc's ceiling over a file beside a copy of the library, where both were read.
    let outer = config
        .outer
        .as_ref()
        .map(|o| (o, held_figures(config, &o.spec, limit_of(&o.spec))))
        .filter(|(_, f)| !f.is_empty());
    let fraction = |l: Option<Limit>| matches!(l, Some(Limit::Fraction(_)));
    let any_fraction = |f: &[Limit]| f.iter().any(|&l| fraction(Some(l)));
    let known = if fraction(asked)
        || any_fraction(&inner)
        || outer.as_ref().is_some_and(|(_, f)| any_fraction(f))
    {
        let t = total();
        if t.is_none() {
            notes.push(CapNote::TotalUnreadable { limit: None });
        }
        t
    } else {
        None
    };
    let ceiling = least(&inner, known);
    let outer = outer.and_then(|(o, f)| least(&f, known).map(|l| (o, l)));
    // Where a ceiling keyed by ordinal holds this GPU at less than its own figure: said.
    let own_bytes = |spec: &LimitSpec| cap_under(None, limit_of(spec), known).cap;
    let lowered = [(bound, ceiling)]
        .into_iter()
        .chain(outer.map(|(o, l)| (o, Some(l))))
        .filter_map(|(c, l)| {
            let cap = cap_under(None, l, known).cap?;
            (Some(cap) != own_bytes(&c.spec)).then(|| CapNote::OrdinalCeiling {
                from: c.from.clone(),
                cap,
            })
        });
    notes.extend(lowered);
    let mut capped = cap_under(asked, ceiling, known);
    let mut ceiling_bytes = cap_under(None, ceiling, known).cap;
    // The ceiling that holds: the file's, or /etc's over it where that is no larger.
    let mut holding = (bound, HandedDown::of(config));
    if let Some((o, l)) = outer {
        let over = cap_under(capped.cap.map(Limit::Bytes), Some(l), known);
        capped = Capped {
            cap: over.cap,
            held: capped.held || over.held,
        };
        let o_bytes = cap_under(None, Some(l), known).cap;
        if ceiling_bytes.is_none_or(|c| o_bytes.is_some_and(|b| b <= c)) {
            ceiling_bytes = o_bytes;
            holding = (o, Some(HandedDown::of_file(&o.from)));
        }
    }
    // At the ceiling (held there, or asked just as much), not lowered below it.
    let at_ceiling = capped.cap.is_some() && capped.cap == ceiling_bytes;
    // The line names what the environment asked, else what the file under /etc asked.
    let asked_text = bound.asked.as_ref().or(holding.0.asked.as_ref());
    if capped.held
        && let Some(asked_text) = asked_text
        && let Some(c) = capped.cap
    {
        let said = Ceiling {
            asked: Some(asked_text.clone()),
            ..holding.0.clone()
        };
        notes.push(CapNote::Held(held_line(&said, device, c)));
    }
    let cap = in_bytes(capped.cap.map(Limit::Bytes), &mut total, &mut notes);
    DeviceCap {
        cap,
        asked,
        ceiling,
        held: capped.held,
        handed_down: if at_ceiling { holding.1 } else { None },
        ceiling_bytes,
        notes,
    }
}

/// The figures a ceiling `spec` may hold a GPU to: its own (`own`: by its UUID, its
/// ordinal or the default; none: the ceiling names it not). Where the environment chose
/// which GPU each CUDA ordinal is (`CUDA_VISIBLE_DEVICES`) and the ceiling keys
/// ordinals, an ordinal may name another GPU than the ceiling's writer saw: every figure
/// of the ceiling then, of which the least holds.
fn held_figures(config: &Config, spec: &LimitSpec, own: Option<Limit>) -> Vec<Limit> {
    let ordinal = |k: &DeviceKey| matches!(k, DeviceKey::Ordinal(_));
    let mut figures: Vec<Limit> = own.into_iter().collect();
    if config.visible_chosen && spec.devices.iter().any(|(k, _)| ordinal(k)) {
        figures.extend(spec.default);
        figures.extend(
            spec.devices
                .iter()
                .filter(|(k, _)| ordinal(k))
                .map(|(_, l)| *l),
        );
    }
    figures
}

/// The least of `figures` (one: as it is; several: in bytes, fractions of `total`).
fn least(figures: &[Limit], total: Option<u64>) -> Option<Limit> {
    match figures {
        [] => None,
        [one] => Some(*one),
        many => many
            .iter()
            .filter_map(|&l| cap_under(None, Some(l), total).cap)
            .min()
            .map(Limit::Bytes),
    }
}

/// A limit in bytes: bytes as given (noted when above the GPU's memory: it never binds),
/// a fraction of the GPU's total; a fraction whose total cannot be read is zero.
fn in_bytes(
    limit: Option<Limit>,
    total: &mut impl FnMut() -> Option<u64>,
    notes: &mut Vec<CapNote>,
) -> Option<u64> {
    match limit? {
        Limit::Bytes(b) => {
            if let Some(t) = total()
                && b > t
            {
                notes.push(CapNote::AboveTotal { cap: b, total: t });
            }
            Some(b)
        }
        limit => Some(match total() {
            Some(t) => limit.resolve(t),
            None => {
                notes.push(CapNote::TotalUnreadable { limit: Some(limit) });
                0
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Ceiling, parse_limit_spec};

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    fn env(limit: Option<&str>) -> Config {
        Config {
            limit: limit.map(|l| parse_limit_spec(l).unwrap()),
            ..Config::default()
        }
    }

    /// `asked` under a file's ceiling of `ceiling` (`none`: GPUCAP_LIMIT=none).
    fn under(asked: Option<&str>, ceiling: &str) -> Config {
        let none = asked == Some("none");
        Config {
            limit: match asked {
                Some(a) if !none => Some(parse_limit_spec(a).unwrap()),
                _ => Some(parse_limit_spec(ceiling).unwrap()),
            },
            bound: Some(Ceiling {
                spec: parse_limit_spec(ceiling).unwrap(),
                from: "/x/gpucap.env".into(),
                asked: asked.map(|a| format!("GPUCAP_LIMIT={a:?}")),
                asked_none: none,
            }),
            ..Config::default()
        }
    }

    fn cap_of(config: &Config, total: Option<u64>) -> DeviceCap {
        device_cap(config, 0, |s| s.for_ordinal(0), || total)
    }

    #[test]
    fn the_environment_alone_gives_bytes_and_fractions_of_the_total() {
        assert_eq!(cap_of(&env(None), Some(80 * GI)).cap, None);
        let c = cap_of(&env(Some("4Gi")), Some(80 * GI));
        assert_eq!((c.cap, c.held, c.handed_down), (Some(4 * GI), false, None));
        assert!(c.notes.is_empty(), "{:?}", c.notes);
        assert_eq!(cap_of(&env(Some("25%")), Some(80 * GI)).cap, Some(20 * GI));
    }

    #[test]
    fn a_fraction_without_a_total_caps_at_zero_with_an_error() {
        let c = cap_of(&env(Some("50%")), None);
        assert_eq!(c.cap, Some(0));
        assert_eq!(c.notes.len(), 1);
        assert!(c.notes[0].is_error());
        assert!(
            c.notes[0].text(0).contains("to resolve the limit 50%"),
            "{:?}",
            c.notes
        );
        // Under a ceiling too, whichever side is the fraction.
        let c = cap_of(&under(Some("50%"), "1Gi"), None);
        assert_eq!(c.cap, Some(0));
        assert!(c.notes.iter().any(CapNote::is_error), "{:?}", c.notes);
        assert_eq!(cap_of(&under(Some("1Gi"), "50%"), None).cap, Some(0));
    }

    #[test]
    fn bytes_above_the_total_are_said_and_kept() {
        let c = cap_of(&env(Some("100Gi")), Some(80 * GI));
        assert_eq!(c.cap, Some(100 * GI));
        assert_eq!(
            c.notes,
            [CapNote::AboveTotal {
                cap: 100 * GI,
                total: 80 * GI
            }]
        );
        assert!(!c.notes[0].is_error());
    }

    #[test]
    fn under_a_ceiling_the_smaller_holds_and_a_raise_is_held_with_a_line() {
        // Lowered: the environment's, not handed down.
        let c = cap_of(&under(Some("128Mi"), "256Mi"), Some(80 * GI));
        assert_eq!(
            (c.cap, c.held, c.handed_down),
            (Some(128 * MI), false, None)
        );
        assert!(c.notes.is_empty(), "{:?}", c.notes);
        // Raised, removed: held at the ceiling, said once, handed down from the file.
        for asked in ["4Gi", "90%", "none"] {
            let c = cap_of(&under(Some(asked), "256Mi"), Some(80 * GI));
            assert_eq!(c.cap, Some(256 * MI), "{asked}");
            assert_eq!(c.handed_down, Some(HandedDown::BesideLibrary), "{asked}");
            if asked != "none" {
                assert!(c.held, "{asked}");
                assert!(
                    matches!(&c.notes[..], [CapNote::Held(l)] if l.contains("256 MiB")),
                    "{asked}: {:?}",
                    c.notes
                );
            }
        }
        // Asked just as much: at the ceiling, nothing to say.
        let c = cap_of(&under(Some("256Mi"), "256Mi"), Some(80 * GI));
        assert_eq!((c.cap, c.held), (Some(256 * MI), false));
        assert_eq!(c.handed_down, Some(HandedDown::BesideLibrary));
        assert!(c.notes.is_empty(), "{:?}", c.notes);
        // No variable of its own: the file's cap.
        let c = cap_of(&under(None, "25%"), Some(80 * GI));
        assert_eq!(c.cap, Some(20 * GI));
        assert_eq!(c.handed_down, Some(HandedDown::BesideLibrary));
    }

    /// The ceiling in bytes is kept whatever the environment asked under it: the most
    /// the process may ever hold, even where a pool's words would let it hold more.
    #[test]
    fn the_ceiling_in_bytes_is_kept_beside_the_cap_lowered_or_not() {
        for (asked, cap) in [
            (Some("128Mi"), 128 * MI),
            (Some("4Gi"), 256 * MI),
            (Some("none"), 256 * MI),
            (None, 256 * MI),
        ] {
            let c = cap_of(&under(asked, "256Mi"), Some(80 * GI));
            assert_eq!(
                (c.cap, c.ceiling_bytes),
                (Some(cap), Some(256 * MI)),
                "{asked:?}"
            );
        }
        let c = cap_of(&under(Some("1Gi"), "1%"), Some(80 * GI));
        assert_eq!(c.ceiling_bytes, Some(80 * GI / 100));
        // The environment alone hands nothing down; a driver's hand-over does.
        assert_eq!(cap_of(&env(Some("4Gi")), Some(80 * GI)).ceiling_bytes, None);
        let handed = crate::config::from_vars([
            ("NVIDIA_GPU_MEMORY_LIMIT", "512"),
            ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
        ])
        .unwrap();
        let c = cap_of(&handed, Some(80 * GI));
        assert_eq!((c.cap, c.ceiling_bytes), (Some(512 * MI), Some(512 * MI)));
    }

    /// /etc's ceiling over a file beside a copy of the library: the smaller holds, and
    /// the line and the mark name the one that holds.
    #[test]
    fn an_outer_ceiling_holds_over_the_files_where_it_is_smaller() {
        let with_outer = |asked: &str, beside: &str, etc: &str| Config {
            outer: Some(Ceiling {
                spec: parse_limit_spec(etc).unwrap(),
                from: super::super::model::ETC_ENV_FILE.into(),
                asked: Some(format!("GPUCAP_LIMIT={beside:?} in /x/gpucap.env")),
                asked_none: false,
            }),
            ..under(Some(asked), beside)
        };
        let c = cap_of(&with_outer("80Gi", "4Gi", "256Mi"), Some(80 * GI));
        assert_eq!((c.cap, c.ceiling_bytes), (Some(256 * MI), Some(256 * MI)));
        assert_eq!(c.handed_down, Some(HandedDown::Etc));
        assert!(
            matches!(&c.notes[..], [CapNote::Held(l)] if l.contains("GPUCAP_LIMIT=\"80Gi\"")
                && l.contains("256 MiB (from /etc/gpucap/gpucap.env)")),
            "{:?}",
            c.notes
        );
        // The file's is smaller: it holds, and it is the mark.
        let c = cap_of(&with_outer("80Gi", "256Mi", "1Gi"), Some(80 * GI));
        assert_eq!((c.cap, c.ceiling_bytes), (Some(256 * MI), Some(256 * MI)));
        assert_eq!(c.handed_down, Some(HandedDown::BesideLibrary));
        // Fractions meet in bytes: 1% of 80 GiB under /etc's 256 MiB.
        let c = cap_of(&with_outer("1%", "50%", "256Mi"), Some(80 * GI));
        assert_eq!(c.cap, Some(256 * MI));
        assert_eq!(c.handed_down, Some(HandedDown::Etc));
    }

    /// A ceiling keyed by ordinal under `CUDA_VISIBLE_DEVICES`: each GPU is held at the
    /// least of its figures, said once; without the variable, each ordinal its own.
    #[test]
    fn a_ceiling_keyed_by_ordinal_holds_every_gpu_at_its_least_where_the_environment_picks_gpus() {
        let on = |config: &Config, device: u32| {
            device_cap(
                config,
                device as usize,
                |s| s.for_ordinal(device),
                || Some(80 * GI),
            )
        };
        let c = under(Some("4Gi"), "8Gi,1=256Mi");
        assert_eq!(
            on(&c, 0).cap,
            Some(4 * GI),
            "as before without CUDA_VISIBLE_DEVICES"
        );
        assert_eq!(on(&c, 1).cap, Some(256 * MI));
        let chosen = Config {
            visible_chosen: true,
            ..c
        };
        let d = on(&chosen, 0);
        assert_eq!((d.cap, d.ceiling_bytes), (Some(256 * MI), Some(256 * MI)));
        assert!(
            d.notes
                .iter()
                .any(|n| matches!(n, CapNote::OrdinalCeiling { cap, .. }
                if *cap == 256 * MI)),
            "{:?}",
            d.notes
        );
        assert!(
            d.notes[0].text(0).contains("name the GPUs by UUID"),
            "{:?}",
            d.notes
        );
        // A GPU the ceiling names not (no default): held at the least as well.
        let c = Config {
            visible_chosen: true,
            ..under(Some("4Gi"), "1=256Mi")
        };
        assert_eq!(on(&c, 0).cap, Some(256 * MI));
        // UUID keys name GPUs whatever their ordinal: unchanged.
        let c = Config {
            visible_chosen: true,
            ..under(
                Some("4Gi"),
                "GPU-00000000-0000-0000-0000-000000000001=256Mi",
            )
        };
        let d = on(&c, 0);
        assert_eq!(d.cap, Some(4 * GI));
        assert!(d.notes.is_empty(), "{:?}", d.notes);
    }

    /// A ceiling's keys are checked as the environment's: one naming no visible GPU (a
    /// MIG instance's parent by its UUID) fails closed, naming the ceiling.
    #[test]
    fn a_ceilings_key_naming_no_visible_gpu_fails_closed() {
        let c = under(
            Some("100%"),
            "GPU-00000000-0000-0000-0000-0000000000aa=20Gi",
        );
        let seen = [[7u8; 16]];
        let e = crate::config::check_gpu_keys(&c, Some(1), || Some(&seen[..])).unwrap_err();
        assert!(
            e.contains("the configuration file's GPUCAP_LIMIT (a ceiling)"),
            "{e}"
        );
        let c = under(Some("100%"), "0=20Gi");
        assert_eq!(
            crate::config::check_gpu_keys(&c, Some(1), || Some(&seen[..])),
            Ok(())
        );
    }

    #[test]
    fn the_total_is_read_once_and_only_when_needed() {
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            Some(80 * GI)
        };
        device_cap(&under(Some("50%"), "25%"), 0, |s| s.for_ordinal(0), read);
        assert_eq!(reads.get(), 1);
        reads.set(0);
        device_cap(&env(None), 0, |s| s.for_ordinal(0), read);
        assert_eq!(reads.get(), 0, "no cap needs no total");
    }
}
