//! The lines of a configuration under a `gpucap.env` file's ceiling: the ceiling and
//! what the environment asked, and each GPU's cap with where it came from.

use gpucap_core::config::{self, Config, Limit};
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
        describe_limit(Some(&b.spec)),
        b.from
    )];
    if let Some(asked) = &b.asked {
        out.push(format!(
            "asked: {asked} (the environment's; on each GPU the smaller of it and the ceiling \
             holds)"
        ));
    }
    out
}

/// GPU `d`'s cap in bytes under a ceiling, and what to add to its line: where the cap
/// came from. None without a ceiling.
pub fn device_under_ceiling(config: &Config, d: &Device) -> Option<(Option<Limit>, String)> {
    let b = config.bound.as_ref()?;
    let capped = config::device_cap(
        config,
        d.ordinal as usize,
        |s| s.for_device(d.ordinal, d.uuid.as_ref()),
        || Some(d.total),
    );
    let note = match (&b.asked, capped.held, capped.cap) {
        (Some(asked), true, Some(cap)) => format!(
            " (the ceiling from {}, {}: {asked} asks more)",
            b.from,
            format_bytes(cap)
        ),
        (Some(asked), false, Some(_)) => {
            format!(" (from {asked}, under the ceiling of {})", b.from)
        }
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
}
