//! The report file's schema (see the module doc of `report`): the entries as serde
//! structs, the text of a whole file, and the one-line summary of a device.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::size::format_bytes;

/// The value of the `gpucap_report` key: bumped on incompatible changes.
pub const REPORT_VERSION: u64 = 1;

/// One GPU's figures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceReport {
    pub ordinal: u32,
    /// None = no cap (`null`; the key is required all the same).
    #[serde(deserialize_with = "Option::deserialize")]
    pub cap: Option<u64>,
    pub peak: u64,
    pub in_use: u64,
    pub retained: u64,
    pub allocations: u64,
    pub refusals: u64,
    pub largest_refused: u64,
}

/// One process's entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessReport {
    pub id: String,
    pub pid: u32,
    pub cmdline: Vec<String>,
    /// True when written at exit (`"state":"exited"`), false after a refusal
    /// (`"running"`).
    #[serde(
        rename = "state",
        serialize_with = "state_out",
        deserialize_with = "state_in"
    )]
    pub exited: bool,
    pub time: u64,
    pub growth: bool,
    pub devices: Vec<DeviceReport>,
}

fn state_out<S: Serializer>(exited: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *exited { "exited" } else { "running" })
}

fn state_in<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(String::deserialize(d)? == "exited")
}

/// A report file as read: its entries kept as written, so that another process's
/// entry is written back byte for byte (whatever version or fields it has).
#[derive(Deserialize)]
struct FileIn {
    /// Required: a file without it is no gpucap report; one of another version is not
    /// this version's to merge into (its entries would be relabelled as this one's).
    gpucap_report: u64,
    processes: Vec<Box<RawValue>>,
}

/// The one field of an entry needed to merge: whose it is.
#[derive(Deserialize)]
struct EntryId {
    id: String,
}

/// One entry of a report file, as written.
#[derive(Debug)]
pub struct Entry(Box<RawValue>);

impl Entry {
    /// The entry of `report`.
    pub fn of(report: &ProcessReport) -> Entry {
        let text = serde_json::to_string(report).expect("a report serialises");
        Entry(RawValue::from_string(text).expect("serde_json wrote JSON"))
    }

    /// The entry's `id`, if it has one.
    pub fn id(&self) -> Option<String> {
        serde_json::from_str::<EntryId>(self.0.get())
            .ok()
            .map(|e| e.id)
    }

    /// The entry as a version-1 report; None if it lacks a field.
    pub fn report(&self) -> Option<ProcessReport> {
        serde_json::from_str(self.0.get()).ok()
    }
}

/// A report file's text: the header line, one line per entry, the closing line.
pub fn render(entries: &[Entry]) -> String {
    let mut s = format!("{{\"gpucap_report\":{REPORT_VERSION},\"processes\":[\n");
    for (i, e) in entries.iter().enumerate() {
        s.push_str(e.0.get());
        s.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
    }
    s.push_str("]}\n");
    s
}

/// The entries of a report file's text; None if it is not a gpucap report of this
/// version (a writer then writes beside it, `PATH.<pid>`, never over it).
pub fn entries_of(text: &str) -> Option<Vec<Entry>> {
    let file: FileIn = serde_json::from_str(text).ok()?;
    (file.gpucap_report == REPORT_VERSION).then(|| file.processes.into_iter().map(Entry).collect())
}

/// The `GPUCAP_LOG=info` line for one device at exit, e.g.
/// `GPU 0: peak 1.5 GiB of the 4 GiB cap, 0 B in use at exit, 12 allocations, 1 refused (largest 3 GiB)`.
pub fn summary_line(d: &DeviceReport, growth: bool) -> String {
    let cap = match d.cap {
        Some(c) => format!("of the {} cap", format_bytes(c)),
        None => "(no cap)".to_string(),
    };
    let mut s = format!(
        "GPU {}: peak {} {cap}, {} in use at exit",
        d.ordinal,
        format_bytes(d.peak),
        format_bytes(d.in_use)
    );
    if growth {
        s.push_str(&format!(", {} retained", format_bytes(d.retained)));
    }
    let plural = if d.allocations == 1 { "" } else { "s" };
    s.push_str(&format!(", {} allocation{plural}", d.allocations));
    if d.refusals > 0 {
        s.push_str(&format!(
            ", {} refused (largest {})",
            d.refusals,
            format_bytes(d.largest_refused)
        ));
    } else {
        s.push_str(", none refused");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn entry_round_trips_through_json() {
        let r = sample(42, true);
        let text = render(&[Entry::of(&r)]);
        assert!(
            text.starts_with("{\"gpucap_report\":1,\"processes\":[\n{\"id\":\"42-77\",\"pid\":42,")
        );
        assert!(text.contains("\"cap\":null"));
        assert!(text.contains("\"state\":\"exited\""));
        let back: Vec<ProcessReport> = entries_of(&text)
            .unwrap()
            .iter()
            .filter_map(Entry::report)
            .collect();
        assert_eq!(back, [r]);
        let running = render(&[Entry::of(&sample(1, false))]);
        assert!(running.contains("\"state\":\"running\""));
        assert!(!entries_of(&running).unwrap()[0].report().unwrap().exited);
    }

    #[test]
    fn other_entries_are_kept_as_written() {
        // Another writer's entry: other key order, a huge number, an unknown field.
        let foreign = r#"{"pid":7,"id":"7-1","x":123456789012345678901234567890,"state":"exited"}"#;
        let text = format!("{{\"gpucap_report\":1,\"processes\":[\n{foreign}\n]}}\n");
        let entries = entries_of(&text).unwrap();
        assert_eq!(entries[0].id().as_deref(), Some("7-1"));
        assert_eq!(entries[0].report(), None); // not a version-1 entry: skipped on reading
        assert_eq!(render(&entries), text);
    }

    #[test]
    fn entries_lacking_a_field_are_skipped() {
        let text = render(&[Entry::of(&sample(3, true))]);
        for field in ["\"cap\":null,", "\"growth\":false,", "\"time\":1700000000,"] {
            assert!(text.contains(field), "{field}");
            let cut = text.replacen(field, "", 1);
            assert_eq!(entries_of(&cut).unwrap()[0].report(), None, "{field}");
        }
    }

    #[test]
    fn what_is_no_report() {
        for bad in [
            "",
            "{",
            "my notes",
            "{\"processes\":[]}",
            "{\"gpucap_report\":1}",
            "{\"gpucap_report\":1,\"processes\":{}}",
            "[1] 2",
            // Another version's: not relabelled as this one's.
            "{\"gpucap_report\":2,\"processes\":[{\"id\":\"1-1\",\"future\":true}]}",
        ] {
            assert!(entries_of(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn summary_lines() {
        let r = sample(1, true);
        assert_eq!(
            summary_line(&r.devices[0], false),
            "GPU 0: peak 1.5 GiB of the 4 GiB cap, 0 B in use at exit, 12 allocations, 1 refused (largest 3 GiB)"
        );
        assert_eq!(
            summary_line(&r.devices[1], true),
            "GPU 3: peak 5 B (no cap), 5 B in use at exit, 0 B retained, 1 allocation, none refused"
        );
    }
}
