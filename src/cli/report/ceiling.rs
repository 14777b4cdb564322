//! The lines of a configuration under a `gpucap.env` file's ceiling: the ceiling and
//! what the environment asked, and each GPU's cap with where it came from.

use gpucap_core::config::{Config, Limit, LimitFrom};
use gpucap_core::size::format_bytes;

use super::limits::describe_limit;
use crate::driver::Device;

/// The lines of a file's ceiling: the ceiling and its file, and what the environment
/// asked (empty without a ceiling).
pub fn ceiling_lines(config: &Config) -> Vec<String> {
    let Some(b) = &config.bound else {
        return Vec::new();
    };
    let mut out = vec![format!(
        "ceiling: {} (from {}: the environment may lower it, never raise or remove it)",
        describe_limit(Some(&b.spec), None),
        b.from
    )];
    if let Some(asked) = &b.asked {
        // A driver's grant in the environment is a ceiling handed down too.
        let whose = match config.limit.as_ref().map(|l| l.from) {
            Some(LimitFrom::Hami | LimitFrom::Handover(_)) if !b.asked_none => {
                "a driver's hand-over, a ceiling too"
            }
            _ => "the environment's",
        };
        out.push(format!(
            "asked: {asked} ({whose}; on each GPU the smaller of it and the ceiling holds)"
        ));
    }
    out
}

/// GPU `d`'s cap in bytes under a ceiling, and what to add to its line: where the cap
/// came from. None without a ceiling.
pub fn device_under_ceiling(config: &Config, d: &Device) -> Option<(Option<Limit>, String)> {
    let b = config.bound.as_ref()?;
    let capped = d.cap(config);
    let (asked, ceiling) = (capped.asked, capped.ceiling);
    // Both figures of this GPU in bytes (a fraction resolved against its total), so
    // that the line shows which one holds and by how much.
    let bytes =
        |l: Option<Limit>| l.map_or("no cap".to_string(), |l| format_bytes(l.resolve(d.total)));
    let note = match (&b.asked, capped.held, capped.cap) {
        (Some(text), true, Some(cap)) => format!(
            " (the ceiling from {}, {}: {text} asks more, {})",
            b.from,
            format_bytes(cap),
            bytes(asked)
        ),
        (Some(text), false, Some(_)) => format!(
            " (from {text}, under the ceiling of {}, {})",
            b.from,
            bytes(ceiling)
        ),
        (None, _, Some(_)) => format!(" (from {})", b.from),
        (_, _, None) => String::new(),
    };
    Some((capped.cap.map(Limit::Bytes), note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpucap_core::config::{Ceiling, parse_limit_spec};

    fn dev(total: u64) -> Device {
        Device {
            ordinal: 0,
            total,
            name: None,
            uuid: None,
        }
    }

    fn under(asked: Option<&str>, none: bool) -> Config {
        Config {
            limit: Some(parse_limit_spec(asked.unwrap_or("256Mi")).unwrap()),
            bound: Some(Ceiling {
                spec: parse_limit_spec("256Mi").unwrap(),
                from: "/x/gpucap.env".into(),
                asked: asked
                    .map(|a| format!("GPUCAP_LIMIT={a:?}"))
                    .or(none.then(|| "GPUCAP_LIMIT=\"none\"".into())),
                asked_none: none,
            }),
            ..Config::default()
        }
    }

    #[test]
    fn a_device_shows_the_figure_that_holds_and_where_it_came_from() {
        const MIB: u64 = 1 << 20;
        let gpu = dev(4 << 30);
        let (cap, note) = device_under_ceiling(&under(Some("4Gi"), false), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes(256 * MIB)));
        assert!(
            note.contains("the ceiling from /x/gpucap.env, 256 MiB"),
            "{note}"
        );
        assert!(note.contains("GPUCAP_LIMIT=\"4Gi\" asks more"), "{note}");
        let (cap, note) = device_under_ceiling(&under(Some("50%"), false), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes(256 * MIB)), "{note}");
        let (cap, note) = device_under_ceiling(&under(Some("3%"), false), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes((4u64 << 30) * 3 / 100)));
        assert!(note.contains("under the ceiling"), "{note}");
        let (cap, note) = device_under_ceiling(&under(None, true), &gpu).unwrap();
        assert_eq!(cap, Some(Limit::Bytes(256 * MIB)));
        assert!(note.contains("GPUCAP_LIMIT=\"none\" asks more"), "{note}");
        let lines = ceiling_lines(&under(Some("4Gi"), false));
        assert!(
            lines[0].starts_with("ceiling: every GPU: 256 MiB"),
            "{lines:?}"
        );
        assert!(
            lines[1].starts_with("asked: GPUCAP_LIMIT=\"4Gi\""),
            "{lines:?}"
        );
        assert!(ceiling_lines(&Config::default()).is_empty());
    }

    #[test]
    fn both_figures_of_a_gpu_in_bytes_and_a_drivers_grant_is_a_ceiling_too() {
        let gpu = dev(4 << 30);
        let note = |c: &Config| device_under_ceiling(c, &gpu).unwrap().1;
        assert_eq!(
            note(&under(Some("4Gi"), false)),
            " (the ceiling from /x/gpucap.env, 256 MiB: GPUCAP_LIMIT=\"4Gi\" asks more, 4 GiB)"
        );
        assert_eq!(
            note(&under(Some("50%"), false)),
            " (the ceiling from /x/gpucap.env, 256 MiB: GPUCAP_LIMIT=\"50%\" asks more, 2 GiB)"
        );
        assert_eq!(
            note(&under(None, true)),
            " (the ceiling from /x/gpucap.env, 256 MiB: GPUCAP_LIMIT=\"none\" asks more, no cap)"
        );
        assert_eq!(
            note(&under(Some("100Mi"), false)),
            " (from GPUCAP_LIMIT=\"100Mi\", under the ceiling of /x/gpucap.env, 256 MiB)"
        );
        // A fractional ceiling, resolved on this GPU.
        let mut c = under(Some("1Gi"), false);
        c.bound.as_mut().unwrap().spec = parse_limit_spec("50%").unwrap();
        assert_eq!(
            note(&c),
            " (from GPUCAP_LIMIT=\"1Gi\", under the ceiling of /x/gpucap.env, 2 GiB)"
        );
        // What a driver's grant asked is a ceiling handed down too.
        let mut c = under(Some("100Mi"), false);
        c.limit.as_mut().unwrap().from = LimitFrom::Hami;
        let lines = ceiling_lines(&c);
        assert!(
            lines[1].contains("(a driver's hand-over, a ceiling too; "),
            "{lines:?}"
        );
        assert!(ceiling_lines(&under(Some("100Mi"), false))[1].contains("(the environment's; "));
    }
}
