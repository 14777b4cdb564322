//! Which GPUs the ordinal keys of the per-GPU variables count (`GPUCAP_ORDINALS`).
//!
//! An ordinal key (`GPUCAP_LIMIT=0=256Mi,1=1Gi`, `GPUCAP_GUARANTEE`, `GPUCAP_CEILING`,
//! HAMi-core's `CUDA_DEVICE_MEMORY_LIMIT_<n>`) counts the GPUs `CUDA_VISIBLE_DEVICES`
//! leaves visible. A launcher that picks each worker's GPUs (`CUDA_VISIBLE_DEVICES=1,0`,
//! `=1`) would move a parent's keys onto other GPUs, or make them name a GPU the worker
//! does not see. `GPUCAP_ORDINALS` names the `CUDA_VISIBLE_DEVICES` the keys were
//! written under (`all`: every GPU, in CUDA's order), and each key is then moved onto
//! the process's own ordinal of the same GPU, or dropped where the process does not see
//! that GPU. The shim hands it down with the parent's keys (`hand_down`), so a child
//! whose launcher chose its GPUs keeps each GPU's cap on that GPU. Only gpucap's own
//! variables move: a driver's grant is a ceiling the environment never moves (`env`'s
//! `apply_frame` fails closed where a frame would move one of its keys).
//!
//! The shim binds a frame it hands down to the keys it came with: `<list>@<digest>`, the
//! digest of those keys' entries. A process whose keys are not those (set in its own
//! environment since, or given by its launcher) keeps them on its own ordinals: the
//! frame is not theirs. A frame written without a digest applies to whatever keys are
//! there.
//!
//! Worked out from the two lists alone, as the driver reads them: two indices are the
//! same GPU when they are equal, two UUIDs (`GPU-…`, `MIG-…`, or a prefix) when one
//! begins with the other. An index against a UUID cannot be told without the driver:
//! where the process's list mixes the other form in and none of its entries matches, the
//! configuration is an error (fail closed), never a guess.

use super::limit::{DeviceKey, LimitSpec};

/// What `GPUCAP_ORDINALS` accepts.
pub const ORDINALS_ACCEPTED: &str = "all, or a CUDA_VISIBLE_DEVICES list the ordinal keys were written \
     under (0,1,3; GPU-<uuid>,MIG-<uuid>, or their prefixes), and where the shim hands it \
     down @ and the 16 hex digits of the keys it came with";

/// The variable's name.
pub const ORDINALS_VAR: &str = "GPUCAP_ORDINALS";

/// The GPUs ordinal keys count: every GPU, or the entries of a `CUDA_VISIBLE_DEVICES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    All,
    List(Vec<Entry>),
}

impl Frame {
    /// As written in `GPUCAP_ORDINALS` (UUIDs lower case).
    pub fn text(&self) -> String {
        match self {
            Frame::All => "all".into(),
            Frame::List(l) => l
                .iter()
                .map(|e| match e {
                    Entry::Index(i) => i.to_string(),
                    Entry::Uuid(u) => u.clone(),
                })
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// One GPU of a `CUDA_VISIBLE_DEVICES` list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// An index into the driver's order of every GPU.
    Index(u32),
    /// A UUID or a prefix of one, lower case (`gpu-8d7f…`, `mig-…`).
    Uuid(String),
}

impl Entry {
    fn parse(e: &str) -> Option<Entry> {
        let e = e.trim();
        if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
            return e.parse().ok().map(Entry::Index);
        }
        let lower = e.to_ascii_lowercase();
        let named = ["gpu-", "mig-"]
            .iter()
            .any(|p| lower.len() > p.len() && lower.starts_with(p));
        named.then_some(Entry::Uuid(lower))
    }

    /// Whether the two name the same GPU: `Some(true)`/`Some(false)` where the forms
    /// agree, None where one is an index and the other a UUID.
    fn same(&self, other: &Entry) -> Option<bool> {
        match (self, other) {
            (Entry::Index(a), Entry::Index(b)) => Some(a == b),
            // Two GPU UUIDs, or two MIG UUIDs: one a prefix of the other. A GPU's UUID
            // against a MIG device's (a GPU in MIG mode stands for its first MIG device),
            // or the legacy `MIG-GPU-<uuid>/<gi>/<ci>`, cannot be told from the text.
            (Entry::Uuid(a), Entry::Uuid(b))
                if a[..4] == b[..4] && !a.starts_with("mig-gpu-") && !b.starts_with("mig-gpu-") =>
            {
                Some(a.starts_with(b.as_str()) || b.starts_with(a.as_str()))
            }
            _ => None,
        }
    }
}

/// `GPUCAP_ORDINALS`: the frame, and the digest of the ordinal keys it was handed down
/// with ([`keys_digest`]; None: it applies to whatever keys there are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ordinals {
    pub frame: Frame,
    pub keys: Option<u64>,
}

/// Parses a `GPUCAP_ORDINALS` value: a frame, and `@` and 16 hex digits where it is
/// bound to the keys it came with.
pub fn parse_ordinals(v: &str) -> Result<Ordinals, String> {
    let (list, keys) = match v.rsplit_once('@') {
        Some((list, digest)) => {
            let d = (digest.len() == 16)
                .then(|| u64::from_str_radix(digest, 16).ok())
                .flatten()
                .ok_or_else(|| {
                    format!("{digest:?} after the @ is not the 16 hex digits of a digest")
                })?;
            (list, Some(d))
        }
        None => (v, None),
    };
    Ok(Ordinals {
        frame: parse_frame(list)?,
        keys,
    })
}

/// Parses a frame: `all`, or a `CUDA_VISIBLE_DEVICES` list.
pub fn parse_frame(v: &str) -> Result<Frame, String> {
    if v.trim().eq_ignore_ascii_case("all") {
        return Ok(Frame::All);
    }
    v.split(',')
        .map(|e| {
            Entry::parse(e).ok_or_else(|| {
                format!(
                    "{:?} is not a GPU index, a GPU-… or MIG-… UUID or prefix",
                    e.trim()
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Frame::List)
}

/// A process's own `CUDA_VISIBLE_DEVICES` as a frame (unset: every GPU). The driver
/// reads the list up to its first entry naming no device: an entry that is neither an
/// index nor a UUID ends it here too.
pub fn own_frame(visible: Option<&str>) -> Frame {
    match visible {
        None => Frame::All,
        Some(v) => Frame::List(v.split(',').map_while(Entry::parse).collect()),
    }
}

/// The leading entries of a `CUDA_VISIBLE_DEVICES` value that name a GPU in a form
/// [`parse_frame`] takes (the driver ends the list at the first that does not), as a
/// `GPUCAP_ORDINALS` value; None where there is none. No allocation (the shim asks at
/// the library's load and between `fork` and `exec`).
pub fn visible_as_frame(v: &[u8]) -> Option<&[u8]> {
    let mut end = None;
    let mut at = 0;
    for e in v.split(|&b| b == b',') {
        let t = e.trim_ascii();
        let index = !t.is_empty() && t.iter().all(u8::is_ascii_digit) && t.len() <= 9;
        let named = [b"gpu-", b"mig-"]
            .iter()
            .any(|p| t.len() > p.len() && t[..p.len()].eq_ignore_ascii_case(*p))
            && t.is_ascii();
        if !(index || named) {
            break;
        }
        end = Some(at + e.len());
        at += e.len() + 1;
    }
    end.map(|n| &v[..n])
}

/// Where the GPU a frame's ordinal names is among this process's ordinals.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    At(u32),
    /// This process does not see it.
    Hidden,
}

/// This process's ordinal (under `own`) of the GPU that ordinal `k` of `frame` names.
fn find(frame: &Frame, own: &Frame, k: u32) -> Result<Found, String> {
    let entry = match frame {
        Frame::All => Entry::Index(k),
        Frame::List(l) => match l.get(k as usize) {
            Some(e) => e.clone(),
            None => {
                return Err(format!(
                    "a key names GPU {k}, but it lists {} GPU(s)",
                    l.len()
                ));
            }
        },
    };
    match (own, &entry) {
        (Frame::All, Entry::Index(i)) => Ok(Found::At(*i)),
        (Frame::All, Entry::Uuid(u)) => Err(format!(
            "a key names GPU {k}, {u}, and this process's GPUs are all GPUs by index \
             (CUDA_VISIBLE_DEVICES unset): which index that GPU has cannot be told without \
             the driver; name the GPU by its UUID in the variable instead"
        )),
        (Frame::List(mine), _) => {
            let mut unsure = false;
            let mut found = None;
            for (i, m) in mine.iter().enumerate() {
                match m.same(&entry) {
                    // Two of this process's entries begin alike: which one is meant
                    // cannot be told either.
                    Some(true) if found.is_some() => unsure = true,
                    Some(true) => found = Some(i as u32),
                    Some(false) => {}
                    None => unsure = true,
                }
            }
            if let (Some(i), false) = (found, unsure) {
                return Ok(Found::At(i));
            }
            if unsure {
                return Err(format!(
                    "a key names GPU {k}, {}, and CUDA_VISIBLE_DEVICES names GPUs in the other \
                     form (indices against UUIDs, a GPU's UUID against MIG devices') or two \
                     entries that begin alike: which of them it is cannot be told without the \
                     driver; name the GPU by its UUID in the variable, or write both lists in \
                     one form",
                    match &entry {
                        Entry::Index(i) => format!("index {i}"),
                        Entry::Uuid(u) => u.clone(),
                    }
                ));
            }
            Ok(Found::Hidden)
        }
    }
}

/// Moves the ordinal keys of `spec`, written under `frame`, onto this process's own
/// ordinals under `own`: a key whose GPU this process does not see is dropped. UUID
/// keys and the default stay as they are.
pub fn reframe(spec: &mut LimitSpec, frame: &Frame, own: &Frame) -> Result<(), String> {
    if frame == own {
        return Ok(());
    }
    let mut moved = Vec::with_capacity(spec.devices.len());
    for (key, limit) in spec.devices.drain(..) {
        match key {
            DeviceKey::Ordinal(k) => match find(frame, own, k)? {
                Found::At(n) => moved.push((DeviceKey::Ordinal(n), limit)),
                Found::Hidden => {}
            },
            uuid => moved.push((uuid, limit)),
        }
    }
    spec.devices = moved;
    Ok(())
}

/// The same for one key (None: dropped).
pub fn reframe_key(
    key: &DeviceKey,
    frame: &Frame,
    own: &Frame,
) -> Result<Option<DeviceKey>, String> {
    match key {
        DeviceKey::Ordinal(k) if frame != own => Ok(match find(frame, own, *k)? {
            Found::At(n) => Some(DeviceKey::Ordinal(n)),
            Found::Hidden => None,
        }),
        other => Ok(Some(other.clone())),
    }
}

/// Whether an environment entry `NAME=value` gives a per-GPU figure with an ordinal key
/// (`GPUCAP_LIMIT=8Gi,1=2Gi`, `GPUCAP_GUARANTEE=0=1Gi`, `CUDA_DEVICE_MEMORY_LIMIT_1=…`):
/// the figures `GPUCAP_ORDINALS` is handed down with. No allocation (the shim asks
/// between `fork` and `exec`).
pub fn keyed_by_ordinal(entry: &[u8]) -> bool {
    match entry.iter().position(|&b| b == b'=') {
        Some(eq) => keyed(&entry[..eq], &entry[eq + 1..]),
        None => false,
    }
}

/// The digest of the ordinal keys among `entries` (`NAME=value` each: those
/// [`keyed_by_ordinal`] takes, the first of each name, as `getenv` reads them and a
/// child is handed them, in any order): the sum of each one's FNV-1a. No allocation.
pub fn keys_digest<'a>(entries: impl Iterator<Item = &'a [u8]> + Clone) -> u64 {
    entries
        .clone()
        .enumerate()
        .filter(|(i, e)| {
            keyed_by_ordinal(e) && !entries.clone().take(*i).any(|o| name_of(o) == name_of(e))
        })
        .fold(0u64, |sum, (_, e)| sum.wrapping_add(fnv(e)))
}

/// [`keys_digest`] of entries given as names and values.
pub fn pairs_digest<'a>(pairs: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone) -> u64 {
    pairs
        .clone()
        .enumerate()
        .map(|(i, (name, value))| (i, name, key_digest(name, value)))
        .filter(|&(i, name, d)| d != 0 && !pairs.clone().take(i).any(|(n, _)| n == name))
        .fold(0u64, |sum, (_, _, d)| sum.wrapping_add(d))
}

/// The name of an entry `NAME=value`.
fn name_of(e: &[u8]) -> &[u8] {
    e.iter().position(|&b| b == b'=').map_or(e, |eq| &e[..eq])
}

/// The digest a `GPUCAP_ORDINALS` value is bound to (`…@<16 hex digits>`), read without
/// allocating; None where it has none (or not in that form).
pub fn bound_digest(value: &[u8]) -> Option<u64> {
    let at = value.iter().rposition(|&b| b == b'@')?;
    let hex = &value[at + 1..];
    if hex.len() != 16 {
        return None;
    }
    hex.iter().try_fold(0u64, |d, &b| {
        let v = (b as char).to_digit(16)?;
        Some(d << 4 | u64::from(v))
    })
}

/// [`keys_digest`] of one entry given as its name and value (0 where it has no
/// ordinal key).
pub fn key_digest(name: &[u8], value: &[u8]) -> u64 {
    if !keyed(name, value) {
        return 0;
    }
    let h = fnv_from(FNV_START, name);
    fnv_from(fnv_from(h, b"="), value)
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv_from(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// FNV-1a, 64 bits (also `GPUCAP_TYPED`'s digest of a value).
pub(super) fn fnv(bytes: &[u8]) -> u64 {
    fnv_from(FNV_START, bytes)
}

/// A digest as the 16 lower-case hex digits written after the `@`.
pub fn digest_hex(d: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = b"0123456789abcdef"[((d >> (60 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// [`keyed_by_ordinal`] of an entry given as its name and value.
fn keyed(name: &[u8], value: &[u8]) -> bool {
    let digits = |s: &[u8]| {
        let s = s.trim_ascii();
        !s.is_empty() && s.iter().all(u8::is_ascii_digit)
    };
    if let Some(n) = name.strip_prefix(b"CUDA_DEVICE_MEMORY_LIMIT_") {
        return digits(n);
    }
    if !matches!(
        name,
        b"GPUCAP_LIMIT" | b"GPUCAP_GUARANTEE" | b"GPUCAP_CEILING"
    ) {
        return false;
    }
    value.split(|&b| b == b',').any(|item| {
        item.iter()
            .position(|&b| b == b'=')
            .is_some_and(|eq| digits(&item[..eq]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::limit::parse_limit_spec;

    fn moved(limit: &str, frame: &str, own: Option<&str>) -> Result<String, String> {
        let mut spec = parse_limit_spec(limit).unwrap();
        reframe(&mut spec, &parse_frame(frame).unwrap(), &own_frame(own))?;
        Ok(spec.to_gpucap_limit().unwrap_or_default())
    }

    const MI256: &str = "268435456";
    const GI1: &str = "1073741824";

    #[test]
    fn a_parents_keys_follow_its_gpus_into_a_childs_ordinals() {
        let keys = "0=256Mi,1=1Gi";
        // Reordered: the parent's GPU 0 is the child's 1.
        assert_eq!(
            moved(keys, "all", Some("1,0")),
            Ok(format!("1={MI256},0={GI1}"))
        );
        // Narrowed: only the parent's GPU 1, now the child's 0; GPU 0's key dropped.
        assert_eq!(moved(keys, "all", Some("1")), Ok(format!("0={GI1}")));
        // Under a parent's own list, by index and by UUID (prefixes and case agree).
        assert_eq!(moved(keys, "3,5", Some("5")), Ok(format!("0={GI1}")));
        assert_eq!(moved(keys, "3,5", None), Ok(format!("3={MI256},5={GI1}")));
        assert_eq!(
            moved(keys, "GPU-aaaa,GPU-bbbb", Some("gpu-bbbb1234,GPU-cccc")),
            Ok(format!("0={GI1}"))
        );
        // The same list: nothing moves; a default stays a default.
        assert_eq!(
            moved(keys, "1,0", Some("1,0")),
            Ok(format!("0={MI256},1={GI1}"))
        );
        assert_eq!(moved(keys, "all", None), Ok(format!("0={MI256},1={GI1}")));
        assert_eq!(
            moved("8Gi,1=1Gi", "all", Some("1")),
            Ok(format!("8589934592,0={GI1}"))
        );
        // UUID keys are the GPU's already.
        let uuid = "GPU-00000000-0000-0000-0000-000000000001";
        assert_eq!(
            moved(&format!("{uuid}=1Gi"), "all", Some("1")),
            Ok(format!(
                "{}={GI1}",
                uuid.to_ascii_lowercase().replace("gpu", "GPU")
            ))
        );
    }

    #[test]
    fn two_entries_that_begin_alike_are_not_guessed_between() {
        assert!(moved("0=1Gi", "GPU-a", Some("GPU-ac,GPU-ab")).is_err());
        assert_eq!(
            moved("0=1Gi", "GPU-ab", Some("GPU-ac,GPU-ab12")),
            Ok(format!("1={GI1}"))
        );
    }

    #[test]
    fn gpu_and_mig_uuids_are_matched_only_within_their_kind() {
        assert_eq!(
            moved("0=1Gi", "GPU-aaaa", Some("GPU-bbbb,gpu-aaaa12")),
            Ok(format!("1={GI1}"))
        );
        assert_eq!(
            moved("0=1Gi", "MIG-aaaa", Some("MIG-aaaa")),
            Ok(format!("0={GI1}"))
        );
        assert!(moved("0=1Gi", "GPU-aaaa", Some("MIG-cccc")).is_err());
        assert!(
            moved(
                "0=1Gi",
                "MIG-GPU-aaaa/1/0",
                Some("MIG-bbbb,MIG-GPU-aaaa/1/0")
            )
            .is_err(),
            "the legacy form is not matched"
        );
    }

    #[test]
    fn what_cannot_be_told_from_the_lists_is_an_error() {
        // A key past the frame's GPUs.
        let e = moved("2=1Gi", "1,0", Some("0")).unwrap_err();
        assert!(e.contains("names GPU 2, but it lists 2 GPU(s)"), "{e}");
        // An index against UUIDs.
        let e = moved("0=1Gi", "all", Some("GPU-aaaa")).unwrap_err();
        assert!(e.contains("indices against UUIDs"), "{e}");
        let e = moved("0=1Gi", "GPU-aaaa", None).unwrap_err();
        assert!(e.contains("cannot be told without the driver"), "{e}");
        // Even beside a match in the same form: the UUID before it may be that GPU (the
        // driver then ends the list at the repeat). A list of the same form without it
        // hides the GPU.
        assert!(moved("0=1Gi", "2", Some("GPU-aaaa,2")).is_err());
        assert_eq!(
            moved("0=1Gi,1=2Gi", "2,3", Some("3,4")),
            Ok("0=2147483648".into())
        );
    }

    #[test]
    fn frames_parse_as_the_driver_reads_its_list() {
        assert_eq!(parse_frame("ALL"), Ok(Frame::All));
        assert_eq!(
            parse_frame("1, GPU-AbC"),
            Ok(Frame::List(vec![
                Entry::Index(1),
                Entry::Uuid("gpu-abc".into())
            ]))
        );
        for bad in ["", "1,,2", "x", "GPU-", "-1"] {
            assert!(parse_frame(bad).is_err(), "{bad:?}");
        }
        assert_eq!(own_frame(None), Frame::All);
        assert_eq!(
            own_frame(Some("2,x,1")),
            Frame::List(vec![Entry::Index(2)]),
            "the driver stops at the first entry naming no device"
        );
        assert_eq!(own_frame(Some("")), Frame::List(vec![]));
    }

    #[test]
    fn a_visible_list_is_a_frame_up_to_its_first_entry_naming_no_gpu() {
        for (visible, frame) in [
            ("1,0", Some("1,0")),
            ("1, GPU-aB", Some("1, GPU-aB")),
            ("2,x,1", Some("2")),
            ("0,", Some("0")),
            ("", None),
            ("x", None),
            ("-1", None),
            ("99999999999", None),
        ] {
            let got = visible_as_frame(visible.as_bytes());
            assert_eq!(got, frame.map(str::as_bytes), "{visible:?}");
            if let Some(f) = got {
                let f = std::str::from_utf8(f).unwrap();
                assert_eq!(
                    parse_frame(f).map(|p| p.text()),
                    Ok(own_frame(Some(visible)).text())
                );
            }
        }
    }

    #[test]
    fn a_frame_is_bound_to_the_keys_it_came_with() {
        let entries: [&[u8]; 3] = [
            b"GPUCAP_LIMIT=0=256Mi,1=1Gi",
            b"GPUCAP_LOG=info",
            b"CUDA_DEVICE_MEMORY_LIMIT_1=1024m",
        ];
        let d = keys_digest(entries.into_iter());
        assert_eq!(
            d,
            key_digest(b"GPUCAP_LIMIT", b"0=256Mi,1=1Gi")
                .wrapping_add(key_digest(b"CUDA_DEVICE_MEMORY_LIMIT_1", b"1024m")),
            "the same digest from whole entries and from names and values, in any order"
        );
        assert_eq!(key_digest(b"GPUCAP_LOG", b"info"), 0);
        assert_ne!(
            d,
            keys_digest([b"GPUCAP_LIMIT=0=2Gi".as_slice()].into_iter())
        );
        // The first of a name counts, as `getenv` reads it.
        let twice: [&[u8]; 2] = [b"GPUCAP_LIMIT=0=1Gi", b"GPUCAP_LIMIT=0=2Gi"];
        assert_eq!(
            keys_digest(twice.into_iter()),
            keys_digest([twice[0]].into_iter())
        );
        assert_eq!(bound_digest(format!("1,0@{d:016x}").as_bytes()), Some(d));
        let pairs = [
            (b"GPUCAP_LIMIT".as_slice(), b"0=256Mi,1=1Gi".as_slice()),
            (b"CUDA_DEVICE_MEMORY_LIMIT_1", b"1024m"),
            (b"GPUCAP_LIMIT", b"0=9Gi"),
        ];
        assert_eq!(pairs_digest(pairs.into_iter()), d);
        assert_eq!(bound_digest(b"all"), None);
        assert_eq!(bound_digest(b"all@zz"), None);
        let hex = digest_hex(d);
        let text = format!("1,0@{}", std::str::from_utf8(&hex).unwrap());
        assert_eq!(
            parse_ordinals(&text),
            Ok(Ordinals {
                frame: parse_frame("1,0").unwrap(),
                keys: Some(d)
            })
        );
        assert_eq!(
            parse_ordinals("all"),
            Ok(Ordinals {
                frame: Frame::All,
                keys: None
            })
        );
        for bad in [
            "all@",
            "all@12",
            "all@zzzzzzzzzzzzzzzz",
            "x@0000000000000000",
        ] {
            assert!(parse_ordinals(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ordinal_keyed_figures_are_told_without_allocating() {
        for (entry, keyed) in [
            ("GPUCAP_LIMIT=0=256Mi,1=1Gi", true),
            ("GPUCAP_LIMIT=8Gi, 1 =2Gi", true),
            ("GPUCAP_LIMIT=8Gi", false),
            ("GPUCAP_LIMIT=GPU-aaaa=1Gi", false),
            ("GPUCAP_GUARANTEE=0=1Gi", true),
            ("GPUCAP_CEILING=50%", false),
            ("CUDA_DEVICE_MEMORY_LIMIT_1=1024m", true),
            ("CUDA_DEVICE_MEMORY_LIMIT=1024m", false),
            ("GPUCAP_LOG=0=1", false),
            ("GPUCAP_LIMIT", false),
        ] {
            assert_eq!(keyed_by_ordinal(entry.as_bytes()), keyed, "{entry}");
        }
    }
}
