//! Pools in Prometheus's text exposition format (version 0.0.4): `gpucap status
//! --prometheus` prints it once, `gpucap metrics --listen ADDR:PORT` serves it over HTTP.
//!
//! - [`exposition`] (pure): the series of a list of pool readings, with HELP and TYPE
//!   lines, label values escaped. A GPU without a cap has no `gpucap_pool_cap_bytes`
//!   sample (rather than `+Inf`: "no cap" is not a size, and `used / cap` then gives
//!   nothing instead of a misleading 0).
//! - [`Reader`]: which pools (named ones, or every file of the user's pool directory)
//!   and reading them read-only, each file opened once and kept while it stays the
//!   same file.
//! - [`serve`]: a one-thread HTTP/1.1 server; [`route`] (pure) decides the answer.
//!
//! Reading never changes a pool and never waits for its members: the file is opened
//! with `open_reader` (read-only descriptor, read-only mapping), `Pool::view` only loads
//! words and asks the kernel which members' locks are held.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpucap_core::budget::PoolView;
use gpucap_core::config::{self, PoolSpec};
use gpucap_pool_file::PoolFile;

use crate::pool::{self, EXIT_NO_POOL_FILE, Located};

/// The Content-Type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The longest `command` label value, in characters (a member stores the first 63
/// bytes of its command line; this only bounds what a damaged file could show).
pub const COMMAND_LABEL_CHARS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// One metric family: name, type, HELP text.
struct Family {
    name: &'static str,
    kind: Kind,
    help: &'static str,
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
    }
}

// The families, in the order they are printed. Indices into FAMILIES below.
const UP: usize = 0;
const INFO: usize = 1;
const MEMBERS: usize = 2;
const CAP: usize = 3;
const USED: usize = 4;
const PEAK: usize = 5;
const REFUSALS: usize = 6;
const LARGEST_REFUSED: usize = 7;
const HELD_BY_DEAD: usize = 8;
const MEMBER_ALIVE: usize = 9;
const MEMBER_USED: usize = 10;
const MEMBER_PEAK: usize = 11;
const WAITERS: usize = 12;
const WAITS: usize = 13;
const WAIT_SECONDS: usize = 14;
const DRIFT: usize = 15;

const FAMILIES: [Family; 16] = [
    gauge(
        "gpucap_pool_up",
        "1 if the pool's file was read, 0 if not (no process has joined the pool yet, or \
         a file this gpucap cannot read).",
    ),
    gauge(
        "gpucap_pool_info",
        "Always 1: the pool's file (path) and its layout version.",
    ),
    gauge(
        "gpucap_pool_members",
        "Member slots in use, by state: alive, or dead (the process died and its share \
         was not taken back yet).",
    ),
    gauge(
        "gpucap_pool_cap_bytes",
        "The pool's cap on this GPU in bytes, shared by all its members (no sample: no cap).",
    ),
    gauge(
        "gpucap_pool_used_bytes",
        "Bytes the pool's members hold on this GPU now, dead members' included.",
    ),
    gauge(
        "gpucap_pool_peak_bytes",
        "The highest used bytes the pool has recorded on this GPU.",
    ),
    Family {
        name: "gpucap_pool_refusals_total",
        kind: Kind::Counter,
        help: "Allocations the pool refused on this GPU because they did not fit under its cap.",
    },
    gauge(
        "gpucap_pool_largest_refused_bytes",
        "The largest allocation the pool refused on this GPU, in bytes (0: none).",
    ),
    gauge(
        "gpucap_pool_held_by_dead_bytes",
        "Bytes of the used bytes held by dead members (the next allocation that needs \
         them takes them back).",
    ),
    gauge(
        "gpucap_member_alive",
        "1 if the member process lives, 0 if it died without leaving (its share is still \
         counted).",
    ),
    gauge(
        "gpucap_member_used_bytes",
        "Bytes the member holds on this GPU now.",
    ),
    gauge(
        "gpucap_member_peak_bytes",
        "The most bytes the member held on this GPU at once.",
    ),
    gauge(
        "gpucap_pool_waiters",
        "Allocations waiting for memory on this GPU now (GPUCAP_WAIT).",
    ),
    Family {
        name: "gpucap_pool_waits_total",
        kind: Kind::Counter,
        help: "Waits for memory on this GPU that ended, served or timed out (GPUCAP_WAIT).",
    },
    Family {
        name: "gpucap_pool_wait_seconds_total",
        kind: Kind::Counter,
        help: "Seconds spent in those waits, summed.",
    },
    gauge(
        "gpucap_pool_drift_bytes",
        "The pool file's used bytes on this GPU minus what its members' slots hold: 0 \
         unless another process wrote the file (the next refusal recounts it).",
    ),
];

/// One pool as read for an exposition.
pub struct Reading {
    /// The `pool` label: the name, or the file's path when the pool was named by path.
    pub label: String,
    /// The file and its view, or why it could not be read: the exit status `status`
    /// would give (1: no file yet; 2: unusable) and the line to print.
    pub result: Result<(PathBuf, PoolView), (i32, String)>,
}

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
fn command_label(command: &str) -> String {
    command.chars().take(COMMAND_LABEL_CHARS).collect()
}

/// `{name="value",...}`, values escaped.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// The samples of an exposition, collected by family (the format wants each family's
/// samples together, after its HELP and TYPE lines).
#[derive(Default)]
struct Samples(Vec<(usize, String)>);

impl Samples {
    fn add(&mut self, family: usize, labels: &str, value: impl std::fmt::Display) {
        self.0.push((
            family,
            format!("{}{labels} {value}\n", FAMILIES[family].name),
        ));
    }

    /// A sample of milliseconds, shown in seconds (base units).
    fn add_ms_as_seconds(&mut self, family: usize, labels: &str, ms: u64) {
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

    fn render(mut self) -> String {
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

/// The exposition of `readings`: `gpucap_pool_up` for every pool, the other series for
/// the pools that were read. Families without a sample are left out.
pub fn exposition(readings: &[Reading]) -> String {
    let mut s = Samples::default();
    for r in readings {
        let pool = r.label.as_str();
        let Ok((path, view)) = &r.result else {
            s.add(UP, &labels(&[("pool", pool)]), 0);
            continue;
        };
        s.add(UP, &labels(&[("pool", pool)]), 1);
        let path = path.to_string_lossy();
        let version = view.version.to_string();
        s.add(
            INFO,
            &labels(&[("pool", pool), ("path", &path), ("version", &version)]),
            1,
        );
        let alive = view.members.iter().filter(|m| m.alive).count() as u64;
        let dead = view.members.len() as u64 - alive;
        s.add(
            MEMBERS,
            &labels(&[("pool", pool), ("state", "alive")]),
            alive,
        );
        s.add(MEMBERS, &labels(&[("pool", pool), ("state", "dead")]), dead);
        for g in &view.gpus {
            let l = labels(&[("pool", pool), ("gpu_uuid", &g.uuid)]);
            if let Some(cap) = g.cap {
                s.add(CAP, &l, cap);
            }
            s.add(USED, &l, g.used);
            s.add(PEAK, &l, g.peak);
            s.add(REFUSALS, &l, g.refusals);
            s.add(LARGEST_REFUSED, &l, g.largest_refused);
            s.add(HELD_BY_DEAD, &l, g.held_by_dead);
            s.add(WAITERS, &l, g.waiters);
            s.add(WAITS, &l, g.waits);
            s.add_ms_as_seconds(WAIT_SECONDS, &l, g.wait_ms);
            s.add(DRIFT, &l, g.drift);
        }
        for m in &view.members {
            // The slot tells apart two members with one pid (pid 1 of two containers).
            let slot = m.slot.to_string();
            let pid = m.pid.to_string();
            let command = command_label(&m.command);
            let member = [
                ("pool", pool),
                ("slot", slot.as_str()),
                ("pid", pid.as_str()),
                ("command", command.as_str()),
            ];
            s.add(MEMBER_ALIVE, &labels(&member), u64::from(m.alive));
            for g in &m.gpus {
                let mut l = member.to_vec();
                l.push(("gpu_uuid", &g.uuid));
                let l = labels(&l);
                s.add(MEMBER_USED, &l, g.used);
                s.add(MEMBER_PEAK, &l, g.peak);
            }
        }
    }
    s.render()
}

// ---------------------------------------------------------------------------
// Reading pools.

/// Which pools a [`Reader`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Which {
    /// These pools (labelled by their name, or path), in this order.
    Pools(Vec<PoolSpec>),
    /// Every `NAME.pool` file in this user's pool directory, labelled `NAME`, listed at
    /// each reading.
    All,
}

/// An open pool file, and which file it is.
struct Opened {
    id: (u64, u64),
    file: PoolFile,
}

/// Reads pools, again at each [`Reader::read`]. A file is opened once and kept while
/// its path names the same file (device and inode): a pool file is never unmapped
/// (`PoolFile`), so opening it at every scrape would add a mapping per scrape. A file
/// that is replaced or removed has its descriptor closed; its 420 KiB read-only mapping
/// stays, one per file replaced while the server runs.
pub struct Reader {
    which: Which,
    pool_dir: Option<PathBuf>,
    open: HashMap<PathBuf, Opened>,
}

impl Reader {
    pub fn new(which: Which, pool_dir: Option<PathBuf>) -> Reader {
        Reader {
            which,
            pool_dir,
            open: HashMap::new(),
        }
    }

    /// What it reads, for the server's first line.
    pub fn describe(&self) -> String {
        match &self.which {
            Which::Pools(specs) => {
                let names: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
                format!(
                    "pool{} {}",
                    if names.len() == 1 { "" } else { "s" },
                    names.join(", ")
                )
            }
            Which::All => match self.user_dir() {
                Ok(Located::File(d) | Located::NotYet(d)) => {
                    format!("every pool in {}", d.display())
                }
                Err(e) => format!("every pool of the pool directory ({e})"),
            },
        }
    }

    /// The pools, read now. Err: `--all`'s directory cannot be used (a line to print).
    pub fn read(&mut self) -> Result<Vec<Reading>, String> {
        let targets: Vec<(String, PoolSpec)> = match &self.which {
            Which::Pools(specs) => specs.iter().map(|s| (s.to_string(), s.clone())).collect(),
            Which::All => self
                .list()?
                .into_iter()
                .map(|n| (n.clone(), PoolSpec::Name(n)))
                .collect(),
        };
        let mut seen = Vec::new();
        let readings = targets
            .into_iter()
            .map(|(label, spec)| {
                let result = self.read_one(&spec, &mut seen);
                Reading { label, result }
            })
            .collect();
        // Files no longer read (removed, or replaced: reopened under the same path):
        // close their descriptors.
        self.open.retain(|path, o| {
            let keep = seen.contains(path);
            if !keep {
                o.file.locks.forget_in_child();
            }
            keep
        });
        Ok(readings)
    }

    /// This user's pool directory (`gpucap-UID` in the pool directory), checked as a
    /// member would check it; `NotYet` when no process made it yet.
    fn user_dir(&self) -> Result<Located, String> {
        let any = PoolSpec::Name("any".into());
        match pool::locate(&any, self.pool_dir.as_deref())? {
            Located::File(p) => Ok(Located::File(parent(&p))),
            Located::NotYet(p) => Ok(Located::NotYet(parent(&p))),
        }
    }

    /// The names of the pool files in this user's pool directory, sorted: regular
    /// files `NAME.pool` whose NAME is a valid pool name (a file being made is
    /// `.NAME.PID.RANDOM.new`).
    fn list(&self) -> Result<Vec<String>, String> {
        let dir = match self.user_dir().map_err(|e| format!("gpucap: --all: {e}"))? {
            Located::NotYet(_) => return Ok(Vec::new()),
            Located::File(d) => d,
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("gpucap: --all: {}: {e}", dir.display())),
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let stem = name.strip_suffix(".pool")?;
                matches!(config::parse_pool(stem), Ok(Some(PoolSpec::Name(_))))
                    .then(|| stem.to_string())
            })
            .collect();
        names.sort();
        Ok(names)
    }

    fn read_one(
        &mut self,
        spec: &PoolSpec,
        seen: &mut Vec<PathBuf>,
    ) -> Result<(PathBuf, PoolView), (i32, String)> {
        let path = match pool::locate(spec, self.pool_dir.as_deref())
            .map_err(|e| (2, format!("gpucap: pool {spec}: {e}")))?
        {
            Located::NotYet(p) => return Err((EXIT_NO_POOL_FILE, no_file(&p))),
            Located::File(p) => p,
        };
        let id = match std::fs::symlink_metadata(&path) {
            Ok(m) => (m.dev(), m.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err((EXIT_NO_POOL_FILE, no_file(&path)));
            }
            Err(e) => return Err((2, format!("gpucap: {}: {e}", path.display()))),
        };
        // The identity is taken before opening: if the file is replaced in between,
        // the next reading sees another identity and opens it again.
        if self.open.get(&path).is_none_or(|o| o.id != id) {
            let file = gpucap_pool_file::open_reader(&path).map_err(|e| {
                (
                    if path.exists() { 2 } else { EXIT_NO_POOL_FILE },
                    format!("gpucap: {e}"),
                )
            })?;
            if let Some(old) = self.open.insert(path.clone(), Opened { id, file }) {
                old.file.locks.forget_in_child();
            }
        }
        seen.push(path.clone());
        let o = &self.open[&path];
        Ok((path, o.file.pool.view(&o.file.locks)))
    }
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn no_file(path: &Path) -> String {
    format!(
        "gpucap: no pool file at {} (no process has joined it yet)",
        path.display()
    )
}

// ---------------------------------------------------------------------------
// The HTTP server.

/// What a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `GET /metrics` (with `head`: `HEAD /metrics`, the same without the body).
    Metrics { head: bool },
    /// Another path: 404.
    NotFound,
    /// Another method on /metrics: 405.
    MethodNotAllowed,
    /// Not an HTTP/1.x request line: 400.
    BadRequest,
}

/// The answer to a request whose head (request line and headers) is `head`. A query
/// string is ignored (`/metrics?x=1` is `/metrics`).
pub fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::BadRequest;
    };
    let mut words = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Route::BadRequest;
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != "/metrics" {
        return Route::NotFound;
    }
    match method {
        "GET" => Route::Metrics { head: false },
        "HEAD" => Route::Metrics { head: true },
        _ => Route::MethodNotAllowed,
    }
}

/// The bytes of an HTTP/1.1 response, which closes the connection.
pub fn response(status: &str, content_type: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if !head_only {
        bytes.extend_from_slice(body.as_bytes());
    }
    bytes
}

/// The longest request head read; a longer one is answered 400.
const MAX_HEAD: usize = 16 * 1024;

/// How long a client may take to send its whole request (and, separately, to read the
/// answer): one thread serves every request, so a slow client holds the others up at
/// most this long.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Reads a request head (up to the blank line) within [`CLIENT_TIMEOUT`] in all (a
/// client sending a byte now and then is cut off too). None: the client sent nothing
/// usable (closed, too slow, too long).
fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())?;
        stream.set_read_timeout(Some(left)).ok()?;
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return (!head.is_empty()).then_some(head);
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Some(head);
        }
        if head.len() > MAX_HEAD {
            return Some(Vec::new());
        }
    }
}

/// Answers one connection.
fn handle(mut stream: TcpStream, reader: &mut Reader, log: &mut Log) {
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let Some(head) = read_head(&mut stream) else {
        return;
    };
    let text = "text/plain; charset=utf-8";
    let answer = match route(&head) {
        Route::Metrics { head } => {
            let body = scrape(reader, log);
            response("200 OK", CONTENT_TYPE, &body, head)
        }
        Route::NotFound => response(
            "404 Not Found",
            text,
            "not found: gpucap serves its metrics at /metrics\n",
            false,
        ),
        Route::MethodNotAllowed => response(
            "405 Method Not Allowed",
            text,
            "/metrics answers GET and HEAD\n",
            false,
        ),
        Route::BadRequest => response("400 Bad Request", text, "bad request\n", false),
    };
    let _ = stream.write_all(&answer);
    let _ = stream.flush();
}

/// One reading of the pools as an exposition; what changed is logged.
fn scrape(reader: &mut Reader, log: &mut Log) -> String {
    match reader.read() {
        Ok(readings) => {
            log.note(&readings);
            exposition(&readings)
        }
        Err(e) => {
            log.line(&e);
            String::new()
        }
    }
}

/// The server's log: a line when a pool becomes readable or unreadable (not at every
/// scrape: a sidecar may wait a long time for the first member).
pub struct Log<'a> {
    out: &'a mut dyn Write,
    /// Per pool label, the last error (None: readable).
    last: HashMap<String, Option<String>>,
    last_line: Option<String>,
}

impl<'a> Log<'a> {
    pub fn new(out: &'a mut dyn Write) -> Log<'a> {
        Log {
            out,
            last: HashMap::new(),
            last_line: None,
        }
    }

    fn note(&mut self, readings: &[Reading]) {
        self.last_line = None;
        for r in readings {
            let now = r.result.as_ref().err().map(|(_, e)| e.clone());
            let before = self.last.insert(r.label.clone(), now.clone());
            if before.as_ref() == Some(&now) {
                continue;
            }
            let line = match (&now, &r.result) {
                (Some(e), _) => format!("{e} (served as gpucap_pool_up 0)"),
                (None, Ok((path, _))) => format!(
                    "gpucap metrics: pool {} readable (file {})",
                    r.label,
                    path.display()
                ),
                (None, Err(_)) => continue,
            };
            let _ = writeln!(self.out, "{line}");
        }
        let _ = self.out.flush();
    }

    fn line(&mut self, line: &str) {
        if self.last_line.as_deref() != Some(line) {
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
            self.last_line = Some(line.to_string());
        }
    }
}

/// Serves `reader`'s pools on `listener` until the process is killed: one request at
/// a time. Only returns if accepting keeps failing (the error).
pub fn serve(listener: TcpListener, mut reader: Reader, out: &mut dyn Write) -> io::Error {
    let mut log = Log::new(out);
    let mut failures = 0u32;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                failures = 0;
                handle(stream, &mut reader, &mut log);
            }
            // Out of descriptors, a connection reset before it was accepted...: wait a
            // little and go on, unless it never stops.
            Err(e) => {
                failures += 1;
                if failures > 1000 {
                    return e;
                }
                log.line(&format!("gpucap metrics: accept: {e}"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::tests::view;

    fn reading(label: &str, view: PoolView) -> Reading {
        Reading {
            label: label.into(),
            result: Ok((PathBuf::from(format!("/p/{label}.pool")), view)),
        }
    }

    /// The sample lines of `text` for metric `name` (exact name).
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| {
                !l.starts_with('#')
                    && l.strip_prefix(name)
                        .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            })
            .collect()
    }

    const UUID: &str = "GPU-11111111-1111-1111-1111-111111111111";
    const MIB: u64 = 1 << 20;

    #[test]
    fn waits_in_base_units() {
        let mut v = view();
        v.gpus[0].waiters = 1;
        v.gpus[0].waits = 2;
        v.gpus[0].wait_ms = 1_500;
        let text = exposition(&[reading("t", v)]);
        let gpu = format!("{{pool=\"t\",gpu_uuid=\"{UUID}\"}}");
        assert_eq!(
            samples(&text, "gpucap_pool_waiters"),
            [format!("gpucap_pool_waiters{gpu} 1")]
        );
        assert_eq!(
            samples(&text, "gpucap_pool_waits_total"),
            [format!("gpucap_pool_waits_total{gpu} 2")]
        );
        assert_eq!(
            samples(&text, "gpucap_pool_wait_seconds_total"),
            [format!("gpucap_pool_wait_seconds_total{gpu} 1.500")]
        );
        assert!(
            text.contains("# TYPE gpucap_pool_wait_seconds_total counter"),
            "{text}"
        );
    }

    #[test]
    fn every_series_of_a_pool() {
        let text = exposition(&[reading("t", view())]);
        let one = |name: &str| {
            let s = samples(&text, name);
            assert_eq!(s.len(), 1, "{name}\n{text}");
            s[0].to_string()
        };
        let gpu = format!("{{pool=\"t\",gpu_uuid=\"{UUID}\"}}");
        assert_eq!(one("gpucap_pool_up"), "gpucap_pool_up{pool=\"t\"} 1");
        assert_eq!(
            one("gpucap_pool_info"),
            "gpucap_pool_info{pool=\"t\",path=\"/p/t.pool\",version=\"1\"} 1"
        );
        assert_eq!(
            one("gpucap_pool_cap_bytes"),
            format!("gpucap_pool_cap_bytes{gpu} {}", 1u64 << 30)
        );
        assert_eq!(
            one("gpucap_pool_used_bytes"),
            format!("gpucap_pool_used_bytes{gpu} {}", 700 * MIB)
        );
        assert_eq!(
            one("gpucap_pool_peak_bytes"),
            format!("gpucap_pool_peak_bytes{gpu} {}", 701 * MIB)
        );
        assert_eq!(
            one("gpucap_pool_refusals_total"),
            format!("gpucap_pool_refusals_total{gpu} 1")
        );
        assert_eq!(
            one("gpucap_pool_largest_refused_bytes"),
            format!("gpucap_pool_largest_refused_bytes{gpu} {}", 600 * MIB)
        );
        assert_eq!(
            one("gpucap_pool_held_by_dead_bytes"),
            format!("gpucap_pool_held_by_dead_bytes{gpu} {}", 200 * MIB)
        );
        assert_eq!(
            samples(&text, "gpucap_pool_members"),
            [
                "gpucap_pool_members{pool=\"t\",state=\"alive\"} 2",
                "gpucap_pool_members{pool=\"t\",state=\"dead\"} 1"
            ]
        );
        assert_eq!(
            samples(&text, "gpucap_member_alive"),
            [
                "gpucap_member_alive{pool=\"t\",slot=\"0\",pid=\"10\",command=\"prog-10 --x\"} 1",
                "gpucap_member_alive{pool=\"t\",slot=\"1\",pid=\"11\",command=\"prog-11 --x\"} 0",
                "gpucap_member_alive{pool=\"t\",slot=\"2\",pid=\"12\",command=\"prog-12 --x\"} 1",
            ]
        );
        assert_eq!(
            samples(&text, "gpucap_member_used_bytes")[1],
            format!(
                "gpucap_member_used_bytes{{pool=\"t\",slot=\"1\",pid=\"11\",\
                 command=\"prog-11 --x\",gpu_uuid=\"{UUID}\"}} {}",
                200 * MIB
            )
        );
        assert_eq!(
            samples(&text, "gpucap_member_peak_bytes")[2],
            format!(
                "gpucap_member_peak_bytes{{pool=\"t\",slot=\"2\",pid=\"12\",\
                 command=\"prog-12 --x\",gpu_uuid=\"{UUID}\"}} {}",
                401 * MIB
            )
        );
    }

    #[test]
    fn each_family_once_with_help_and_type_before_its_samples() {
        let mut second = view();
        second.gpus[0].cap = None;
        let text = exposition(&[
            reading("a", view()),
            Reading {
                label: "gone".into(),
                result: Err((1, "gpucap: no pool file".into())),
            },
            reading("b", second),
        ]);
        let mut names_seen = Vec::new();
        let mut current = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap();
                assert!(!names_seen.contains(&name), "{name} twice\n{text}");
                names_seen.push(name);
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(name, current, "{text}");
                let want = if name.ends_with("_total") {
                    "counter"
                } else {
                    "gauge"
                };
                assert_eq!(kind, want, "{text}");
            } else {
                assert!(line.starts_with(current), "{line} under {current}\n{text}");
            }
        }
        assert_eq!(names_seen.len(), FAMILIES.len(), "{text}");
        // The pools follow each other within each family.
        assert_eq!(
            samples(&text, "gpucap_pool_up"),
            [
                "gpucap_pool_up{pool=\"a\"} 1",
                "gpucap_pool_up{pool=\"gone\"} 0",
                "gpucap_pool_up{pool=\"b\"} 1"
            ]
        );
        // No cap, no sample; the unreadable pool has nothing but its up.
        let caps = samples(&text, "gpucap_pool_cap_bytes");
        assert_eq!(caps.len(), 1, "{text}");
        assert!(caps[0].contains("pool=\"a\""));
        assert!(!text.contains("pool=\"gone\",") && !text.contains("+Inf"));
        assert_eq!(samples(&text, "gpucap_pool_used_bytes").len(), 2);
    }

    #[test]
    fn nothing_read_nothing_printed() {
        assert_eq!(exposition(&[]), "");
        let text = exposition(&[Reading {
            label: "x".into(),
            result: Err((1, String::new())),
        }]);
        assert_eq!(
            text,
            format!(
                "# HELP gpucap_pool_up {}\n# TYPE gpucap_pool_up gauge\n\
                 gpucap_pool_up{{pool=\"x\"}} 0\n",
                FAMILIES[UP].help
            )
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("l1\nl2"), "l1\\nl2");
        assert_eq!(escape_label("x\x1b[2J\ty\r"), "x?[2J?y?");
        assert_eq!(escape_label("café ✓"), "café ✓");
        let mut v = view();
        v.members[0].command = "evil\"} 1\ngpucap_x 2 \\".into();
        let text = exposition(&[reading("t\"q", v)]);
        let alive = samples(&text, "gpucap_member_alive");
        assert_eq!(
            alive[0],
            "gpucap_member_alive{pool=\"t\\\"q\",slot=\"0\",pid=\"10\",\
             command=\"evil\\\"} 1\\ngpucap_x 2 \\\\\"} 1"
        );
        assert!(!text.lines().any(|l| l.starts_with("gpucap_x")), "{text}");
        // A command longer than a member stores (a damaged file) is cut.
        let mut v = view();
        v.members[0].command = "é".repeat(100);
        let text = exposition(&[reading("t", v)]);
        let line = samples(&text, "gpucap_member_alive")[0];
        assert!(
            line.contains(&format!("command=\"{}\"", "é".repeat(64))),
            "{line}"
        );
        assert!(!line.contains(&"é".repeat(65)), "{line}");
    }

    #[test]
    fn routes() {
        let r = |s: &str| route(s.as_bytes());
        assert_eq!(
            r("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            r("GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            r("HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { head: true }
        );
        assert_eq!(r("GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /metrics/ HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("GET /favicon.ico HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(r("POST /metrics HTTP/1.1\r\n\r\n"), Route::MethodNotAllowed);
        assert_eq!(r("GET /metrics\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET /metrics SPDY/3\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("GET metrics HTTP/1.1\r\n\r\n"), Route::BadRequest);
        assert_eq!(r("\u{1b}\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(b"GET /\xff HTTP/1.1\r\n\r\n"), Route::BadRequest);
        assert_eq!(r(""), Route::BadRequest);
    }

    #[test]
    fn responses() {
        let ok = String::from_utf8(response("200 OK", CONTENT_TYPE, "a 1\n", false)).unwrap();
        assert_eq!(
            ok,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: 4\r\nConnection: close\r\n\r\na 1\n"
        );
        let head = String::from_utf8(response("200 OK", CONTENT_TYPE, "a 1\n", true)).unwrap();
        assert!(head.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
        let no = String::from_utf8(response("405 Method Not Allowed", "t", "", false)).unwrap();
        assert!(no.contains("\r\nAllow: GET, HEAD\r\n"), "{no}");
    }

    #[test]
    fn the_log_says_what_changed_once() {
        let mut out = Vec::new();
        {
            let mut log = Log::new(&mut out);
            let down = || Reading {
                label: "p".into(),
                result: Err((1, "gpucap: no pool file at /x".into())),
            };
            log.note(&[down()]);
            log.note(&[down()]);
            log.note(&[reading("p", view())]);
            log.note(&[reading("p", view())]);
            log.note(&[down()]);
        }
        let out = String::from_utf8(out).unwrap();
        assert_eq!(
            out,
            "gpucap: no pool file at /x (served as gpucap_pool_up 0)\n\
             gpucap metrics: pool p readable (file /p/p.pool)\n\
             gpucap: no pool file at /x (served as gpucap_pool_up 0)\n"
        );
    }
}
