//! Usage reports (`GPUCAP_REPORT=PATH`): what a process used on each GPU, as JSON.
//!
//! Shared by the shim (which writes reports, from src/shim.rs's exit hook and after a
//! refusal) and the CLI (`gpucap run --measure` reads them), so it is plain safe Rust
//! over std: the schema, a small JSON reader/writer for it, `%p` expansion and the
//! crash-safe, multi-process-safe file update. Each crate uses part of it.
//!
//! # File format (version 1)
//!
//! ```text
//! {"gpucap_report":1,"processes":[
//! {"id":"4242-1234567","pid":4242,"cmdline":["python","train.py"],"state":"exited",
//!  "time":1712345678,"growth":false,"devices":[{"ordinal":0,"cap":4294967296,
//!  "peak":1610612736,"in_use":0,"retained":0,"allocations":12,"refusals":1,
//!  "largest_refused":3221225472}]}
//! ]}
//! ```
//!
//! One entry per process (one line each), in the order they first wrote:
//! - `id`: `<pid>-<start time>` (field 22 of /proc/self/stat): tells apart processes
//!   that reused a pid; a process's later writes replace its own entry.
//! - `pid`, `cmdline` (/proc/self/cmdline, invalid UTF-8 replaced by U+FFFD).
//! - `state`: `exited` when written at exit; `running` when written right after a
//!   refusal. An entry still `running` in a file whose process is gone means it ended
//!   without `exit()` (killed, crashed, `_exit`): its figures are from its last refusal.
//! - `time`: Unix seconds of the write. `growth`: growth mode was on.
//! - `devices`: the GPUs the process used (CUDA ordinals as it saw them), each with
//!   `cap` (bytes, `null` = none), `peak` (most bytes charged at once), `in_use`
//!   (bytes still allocated when written), `retained` (growth mode: bytes freed by
//!   the program but kept by the process), `allocations` (successful ones),
//!   `refusals` and `largest_refused` (bytes of the largest refused request, 0 if none).
//!   Bytes are those charged to the cap (pitch x height for pitched allocations).
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::size::format_bytes;

/// The value of the `gpucap_report` key: bumped on incompatible changes.
pub const REPORT_VERSION: u64 = 1;

/// One GPU's figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReport {
    pub ordinal: u32,
    /// None = no cap.
    pub cap: Option<u64>,
    pub peak: u64,
    pub in_use: u64,
    pub retained: u64,
    pub allocations: u64,
    pub refusals: u64,
    pub largest_refused: u64,
}

/// One process's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessReport {
    pub id: String,
    pub pid: u32,
    pub cmdline: Vec<String>,
    /// True when written at exit (`"state":"exited"`), false after a refusal.
    pub exited: bool,
    pub time: u64,
    pub growth: bool,
    pub devices: Vec<DeviceReport>,
}

impl DeviceReport {
    fn to_json(&self) -> Json {
        let n = |v: u64| Json::Num(v.to_string());
        Json::Obj(vec![
            ("ordinal".into(), n(self.ordinal.into())),
            ("cap".into(), self.cap.map_or(Json::Null, n)),
            ("peak".into(), n(self.peak)),
            ("in_use".into(), n(self.in_use)),
            ("retained".into(), n(self.retained)),
            ("allocations".into(), n(self.allocations)),
            ("refusals".into(), n(self.refusals)),
            ("largest_refused".into(), n(self.largest_refused)),
        ])
    }

    fn from_json(v: &Json) -> Option<DeviceReport> {
        Some(DeviceReport {
            ordinal: u32::try_from(v.get("ordinal")?.as_u64()?).ok()?,
            cap: match v.get("cap")? {
                Json::Null => None,
                c => Some(c.as_u64()?),
            },
            peak: v.get("peak")?.as_u64()?,
            in_use: v.get("in_use")?.as_u64()?,
            retained: v.get("retained")?.as_u64()?,
            allocations: v.get("allocations")?.as_u64()?,
            refusals: v.get("refusals")?.as_u64()?,
            largest_refused: v.get("largest_refused")?.as_u64()?,
        })
    }
}

impl ProcessReport {
    fn to_json(&self) -> Json {
        Json::Obj(vec![
            ("id".into(), Json::Str(self.id.clone())),
            ("pid".into(), Json::Num(self.pid.to_string())),
            (
                "cmdline".into(),
                Json::Arr(self.cmdline.iter().cloned().map(Json::Str).collect()),
            ),
            (
                "state".into(),
                Json::Str(if self.exited { "exited" } else { "running" }.into()),
            ),
            ("time".into(), Json::Num(self.time.to_string())),
            ("growth".into(), Json::Bool(self.growth)),
            (
                "devices".into(),
                Json::Arr(self.devices.iter().map(DeviceReport::to_json).collect()),
            ),
        ])
    }

    fn from_json(v: &Json) -> Option<ProcessReport> {
        let Json::Arr(cmd) = v.get("cmdline")? else {
            return None;
        };
        let Json::Arr(devs) = v.get("devices")? else {
            return None;
        };
        Some(ProcessReport {
            id: v.get("id")?.as_str()?.to_string(),
            pid: u32::try_from(v.get("pid")?.as_u64()?).ok()?,
            cmdline: cmd
                .iter()
                .map(|a| a.as_str().map(str::to_string))
                .collect::<Option<_>>()?,
            exited: v.get("state")?.as_str()? == "exited",
            time: v.get("time")?.as_u64()?,
            growth: matches!(v.get("growth")?, Json::Bool(true)),
            devices: devs
                .iter()
                .map(DeviceReport::from_json)
                .collect::<Option<_>>()?,
        })
    }
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

/// `template` with `%p` replaced by `pid` and `%%` by `%` (other `%` sequences are
/// kept as written), and whether it named a per-process file (had `%p`).
pub fn expand_path(template: &Path, pid: u32) -> (PathBuf, bool) {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = template.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + 8);
    let mut per_process = false;
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'%', Some(b'p')) => {
                out.extend_from_slice(pid.to_string().as_bytes());
                per_process = true;
                i += 2;
            }
            (b'%', Some(b'%')) => {
                out.push(b'%');
                i += 2;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    (
        PathBuf::from(std::ffi::OsString::from_vec(out)),
        per_process,
    )
}

// ---- this process ---------------------------------------------------------------------

/// `/proc/self/cmdline` split at NULs (lossily decoded); empty if unreadable.
pub fn own_cmdline() -> Vec<String> {
    let Ok(bytes) = fs::read("/proc/self/cmdline") else {
        return Vec::new();
    };
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(&bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// This process's start time in clock ticks since boot (field 22 of /proc/self/stat).
pub fn own_start_time() -> Option<u64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ---- the file -------------------------------------------------------------------------

/// A report file's text: the header line, one line per entry, the closing line.
fn render(entries: &[Json]) -> String {
    let mut s = format!("{{\"gpucap_report\":{REPORT_VERSION},\"processes\":[\n");
    for (i, e) in entries.iter().enumerate() {
        e.write(&mut s);
        s.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
    }
    s.push_str("]}\n");
    s
}

/// The entries of a report file's text; None if it is not a gpucap report.
fn entries_of(text: &str) -> Option<Vec<Json>> {
    let v = Json::parse(text).ok()?;
    v.get("gpucap_report")?.as_u64()?;
    match v.get("processes")? {
        Json::Arr(a) => Some(a.clone()),
        _ => None,
    }
}

/// Reads a report file: every entry that has the version-1 fields.
pub fn read_report(path: &Path) -> Result<Vec<ProcessReport>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let entries =
        entries_of(&text).ok_or_else(|| format!("{} is not a gpucap report", path.display()))?;
    Ok(entries
        .iter()
        .filter_map(ProcessReport::from_json)
        .collect())
}

/// Writes `contents` to `path` through a temporary file in the same directory and a
/// rename, so that a reader sees the old file or the new one, never a part. `mode`,
/// if given, is set on the file whatever the umask.
pub fn write_atomically(path: &Path, contents: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map_or("report".into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(contents)?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        f.sync_data()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Adds (or replaces, by `id`) `entry` in the report at `path`, creating the file.
///
/// A shared path (no `%p`) is updated under an exclusive `flock` on `PATH.lock` (left
/// in place: removing a lock file would race with the next writer): read, replace or
/// append this process's entry, write a temporary file, rename. A per-process path has
/// one writer at a time (this process, serialised by the caller), so it needs no lock.
/// An existing file that is not a gpucap report is never overwritten: the entry goes to
/// `PATH.<pid>` instead. Returns the path written.
pub fn write_entry(
    path: &Path,
    per_process: bool,
    entry: &ProcessReport,
) -> Result<PathBuf, String> {
    let _lock = if per_process {
        None
    } else {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                format!(
                    "cannot open the lock file {}: {e}",
                    Path::new(&lock_path).display()
                )
            })?;
        f.lock()
            .map_err(|e| format!("cannot lock {}: {e}", Path::new(&lock_path).display()))?;
        Some(f) // unlocked when closed
    };
    let mut text = String::new();
    let existing = match File::open(path) {
        Ok(mut f) => {
            f.read_to_string(&mut text)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let (target, mut entries) = if !existing || text.trim().is_empty() {
        (path.to_path_buf(), Vec::new())
    } else {
        match entries_of(&text) {
            Some(e) => (path.to_path_buf(), e),
            None => {
                let mut alt = path.as_os_str().to_owned();
                alt.push(format!(".{}", entry.pid));
                let alt = PathBuf::from(alt);
                return write_atomically(&alt, render(&[entry.to_json()]).as_bytes(), None)
                    .map(|()| alt.clone())
                    .map_err(|e| format!("cannot write {}: {e}", alt.display()));
            }
        }
    };
    let mine = entry.to_json();
    match entries
        .iter_mut()
        .find(|e| e.get("id").and_then(Json::as_str) == Some(entry.id.as_str()))
    {
        Some(slot) => *slot = mine,
        None => entries.push(mine),
    }
    write_atomically(&target, render(&entries).as_bytes(), None)
        .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
    Ok(target)
}

// ---- a small JSON value, enough for report files --------------------------------------

/// A JSON value. Numbers keep their text (no precision is lost re-writing another
/// process's entry); objects keep their key order.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

/// Nesting deeper than this is rejected (a report is 4 levels deep).
const MAX_DEPTH: usize = 32;

impl Json {
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Num(n) => n.parse().ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Appends the compact text of `self` to `out`.
    pub fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num(n) => out.push_str(n),
            Json::Str(s) => write_str(s, out),
            Json::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Json::Obj(kv) => {
                out.push('{');
                for (i, (k, v)) in kv.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_str(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }

    pub fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }
}

fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at byte {}", self.i))
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return self.err("nested too deeply");
        }
        self.ws();
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'n') if self.eat("null") => Ok(Json::Null),
            Some(b't') if self.eat("true") => Ok(Json::Bool(true)),
            Some(b'f') if self.eat("false") => Ok(Json::Bool(false)),
            Some(b'"') => self.string().map(Json::Str),
            Some(b'[') => {
                self.i += 1;
                let mut a = Vec::new();
                self.ws();
                if self.eat("]") {
                    return Ok(Json::Arr(a));
                }
                loop {
                    a.push(self.value(depth + 1)?);
                    self.ws();
                    if self.eat(",") {
                        continue;
                    }
                    if self.eat("]") {
                        return Ok(Json::Arr(a));
                    }
                    return self.err("expected , or ]");
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut kv = Vec::new();
                self.ws();
                if self.eat("}") {
                    return Ok(Json::Obj(kv));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return self.err("expected a key");
                    }
                    let k = self.string()?;
                    self.ws();
                    if !self.eat(":") {
                        return self.err("expected :");
                    }
                    kv.push((k, self.value(depth + 1)?));
                    self.ws();
                    if self.eat(",") {
                        continue;
                    }
                    if self.eat("}") {
                        return Ok(Json::Obj(kv));
                    }
                    return self.err("expected , or }");
                }
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = self.i;
                while matches!(
                    self.s.get(self.i),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.i += 1;
                }
                let n = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                if n.parse::<f64>().is_err() {
                    return self.err("bad number");
                }
                Ok(Json::Num(n.to_string()))
            }
            Some(_) => self.err("unexpected character"),
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .and_then(|h| std::str::from_utf8(h).ok());
        match h.and_then(|h| u32::from_str_radix(h, 16).ok()) {
            Some(v) => {
                self.i += 4;
                Ok(v)
            }
            None => self.err("bad \\u escape"),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1; // the opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.s.get(self.i) else {
                return self.err("unterminated string");
            };
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = self.s.get(self.i) else {
                        return self.err("unterminated string");
                    };
                    self.i += 1;
                    let c = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) && self.eat("\\u") {
                                let lo = self.hex4()?;
                                0x10000 + ((hi - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF)
                            } else {
                                hi
                            };
                            char::from_u32(cp).unwrap_or('\u{fffd}')
                        }
                        _ => return self.err("bad escape"),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                b if b < 0x20 => return self.err("control character in string"),
                b => out.push(b),
            }
        }
        String::from_utf8(out).map_err(|_| "invalid UTF-8 in string".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn sample(pid: u32, exited: bool) -> ProcessReport {
        ProcessReport {
            id: format!("{pid}-77"),
            pid,
            cmdline: vec!["prog".into(), "a \"b\"\n\u{1}é".into()],
            exited,
            time: 1_700_000_000,
            growth: false,
            devices: vec![
                DeviceReport {
                    ordinal: 0,
                    cap: Some(4 * GI),
                    peak: 3 * GI / 2,
                    in_use: 0,
                    retained: 0,
                    allocations: 12,
                    refusals: 1,
                    largest_refused: 3 * GI,
                },
                DeviceReport {
                    ordinal: 3,
                    cap: None,
                    peak: 5,
                    in_use: 5,
                    retained: 0,
                    allocations: 1,
                    refusals: 0,
                    largest_refused: 0,
                },
            ],
        }
    }

    #[test]
    fn entry_round_trips_through_json() {
        let r = sample(42, true);
        let text = render(&[r.to_json()]);
        assert!(
            text.starts_with("{\"gpucap_report\":1,\"processes\":[\n{\"id\":\"42-77\",\"pid\":42,")
        );
        assert!(text.contains("\"cap\":null"));
        assert!(text.contains("\"state\":\"exited\""));
        let back: Vec<ProcessReport> = entries_of(&text)
            .unwrap()
            .iter()
            .filter_map(ProcessReport::from_json)
            .collect();
        assert_eq!(back, [r]);
    }

    #[test]
    fn json_parser() {
        let v = Json::parse(r#" {"a":[1,-2.5e3,true,false,null,"x\u00e9\ud83d\ude00\n"],"b":{}} "#)
            .unwrap();
        assert_eq!(
            v.get("a").unwrap(),
            &Json::Arr(vec![
                Json::Num("1".into()),
                Json::Num("-2.5e3".into()),
                Json::Bool(true),
                Json::Bool(false),
                Json::Null,
                Json::Str("xé😀\n".into()),
            ])
        );
        for bad in ["", "{", "[1,]", "{\"a\"}", "\"\n\"", "01x", "[1] 2", "nul"] {
            assert!(Json::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Json::parse(&"[".repeat(100)).is_err());
        let mut s = String::new();
        v.write(&mut s);
        assert_eq!(Json::parse(&s).unwrap(), v);
    }

    #[test]
    fn percent_p() {
        let e = |t: &str| expand_path(Path::new(t), 123);
        assert_eq!(
            e("/tmp/r-%p.json"),
            (PathBuf::from("/tmp/r-123.json"), true)
        );
        assert_eq!(e("/tmp/r.json"), (PathBuf::from("/tmp/r.json"), false));
        assert_eq!(e("/tmp/%%p-%p%"), (PathBuf::from("/tmp/%p-123%"), true));
        assert_eq!(e("%d%"), (PathBuf::from("%d%"), false));
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

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpucap-report-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn shared_file_merges_and_replaces_by_id() {
        let dir = scratch("merge");
        let path = dir.join("r.json");
        assert_eq!(write_entry(&path, false, &sample(1, false)).unwrap(), path);
        write_entry(&path, false, &sample(2, true)).unwrap();
        write_entry(&path, false, &sample(1, true)).unwrap(); // replaces pid 1's entry
        let all = read_report(&path).unwrap();
        assert_eq!(
            all.iter().map(|p| (p.pid, p.exited)).collect::<Vec<_>>(),
            [(1, true), (2, true)]
        );
        // No temporary file is left behind; the lock file stays.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(dir.join("r.json.lock").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_foreign_file_is_never_overwritten() {
        let dir = scratch("foreign");
        let path = dir.join("notes.txt");
        fs::write(&path, "my notes").unwrap();
        let written = write_entry(&path, true, &sample(9, true)).unwrap();
        assert_eq!(written, dir.join("notes.txt.9"));
        assert_eq!(fs::read_to_string(&path).unwrap(), "my notes");
        assert_eq!(read_report(&written).unwrap().len(), 1);
        assert!(write_entry(&dir.join("no/such/dir/r.json"), true, &sample(9, true)).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn own_process() {
        assert!(!own_cmdline().is_empty());
        assert!(own_start_time().is_some());
    }
}
