//! Prometheus's text format (version 0.0.4): label values escaped, and the samples
//! collected by family, then printed each family together after its HELP and TYPE lines.

use super::COMMAND_LABEL_CHARS;
use super::families::{FAMILIES, Kind};

/// A label value as the text format wants it: backslash, double quote and line feed
/// escaped (`\\`, `\"`, `\n`); other control characters, which a member's command
/// could hold and which would reach a terminal through `curl`, become `?`.
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The `command` label: the member's command line as it stored it, at most
/// [`COMMAND_LABEL_CHARS`] characters.
pub fn command_label(command: &str) -> String {
    command.chars().take(COMMAND_LABEL_CHARS).collect()
}

/// `{name="value",...}`, values escaped.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// The samples of an exposition, collected by family (the format wants each family's
/// samples together, after its HELP and TYPE lines).
#[derive(Default)]
pub struct Samples(Vec<(usize, String)>);

impl Samples {
    pub fn add(&mut self, family: usize, labels: &str, value: impl std::fmt::Display) {
        self.0.push((
            family,
            format!("{}{labels} {value}\n", FAMILIES[family].name),
        ));
    }

    /// A cap's figures on one GPU: the families `cap` (no sample without a cap) and the
    /// four after it (used, peak, refusals, largest refused), in that order.
    pub fn add_figures(
        &mut self,
        cap_family: usize,
        labels: &str,
        cap: Option<u64>,
        figures: [u64; 4],
    ) {
        if let Some(cap) = cap {
            self.add(cap_family, labels, cap);
        }
        for (i, v) in figures.into_iter().enumerate() {
            self.add(cap_family + 1 + i, labels, v);
        }
    }

    /// A sample of milliseconds, shown in seconds (base units).
    pub fn add_ms_as_seconds(&mut self, family: usize, labels: &str, ms: u64) {
        self.0.push((
            family,
            format!(
                "{}{labels} {}.{:03}\n",
                FAMILIES[family].name,
                ms / 1000,
                ms % 1000
            ),
        ));
    }

    pub fn render(mut self) -> String {
        // Stable: within a family, samples keep the order they were added in.
        self.0.sort_by_key(|(f, _)| *f);
        let mut out = String::new();
        let mut current = None;
        for (f, line) in self.0 {
            if current != Some(f) {
                let fam = &FAMILIES[f];
                let kind = match fam.kind {
                    Kind::Gauge => "gauge",
                    Kind::Counter => "counter",
                };
                out.push_str(&format!("# HELP {} {}\n", fam.name, fam.help));
                out.push_str(&format!("# TYPE {} {kind}\n", fam.name));
                current = Some(f);
            }
            out.push_str(&line);
        }
        out
    }
}
