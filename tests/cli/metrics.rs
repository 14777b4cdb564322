//! Pools in Prometheus's text format: `gpucap status --prometheus` and the HTTP server
//! `gpucap metrics --listen` (docs/src/metrics.md).
//!
//! Members are tests/c/script.c processes started with `gpucap run --pool` on the fake
//! GPU, each test with its own pool directory (GPUCAP_POOL_DIR). The samples are parsed
//! back (label values unescaped) and compared with what the members did, and the output
//! is given to Prometheus's own `promtool check metrics`, which must accept it; a
//! negative control shows promtool refusing expositions broken in the ways an exporter
//! breaks them.
//!
//! promtool comes from `GPUCAP_TEST_PROMTOOL` (scripts/test.sh unpacks it from Debian's
//! package prometheus), else from PATH. Without it the promtool checks print `SKIP: ...`
//! and the rest runs, unless `CI` or `GPUCAP_TEST_REQUIRE_CLIENTS=1` is set: then a
//! missing promtool fails the tests.

use super::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::pool_scratch::*;
use common::*;

/// SIGKILLs `child` and waits for it.
pub(super) fn kill(mut child: Child) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

// ---------------------------------------------------------------------------
// Reading an exposition back.

/// One sample: metric name, labels (values unescaped), value.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) value: f64,
}

/// The samples of a text exposition, label values unescaped (`\\`, `\"`, `\n`).
/// Panics on a line it cannot read: the format is the one gpucap writes.
pub(super) fn parse(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, rest) = match line.find('{') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => {
                let (n, v) = line.split_once(' ').unwrap();
                out.push(Sample {
                    name: n.into(),
                    labels: BTreeMap::new(),
                    value: v.parse().unwrap(),
                });
                continue;
            }
        };
        let mut labels = BTreeMap::new();
        let mut chars = rest.chars();
        loop {
            let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
            assert_eq!(chars.next(), Some('"'), "{line}");
            let mut value = String::new();
            loop {
                match chars
                    .next()
                    .unwrap_or_else(|| panic!("unterminated: {line}"))
                {
                    '\\' => match chars.next() {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        c => panic!("bad escape {c:?} in {line}"),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key, value);
            match chars.next() {
                Some(',') => continue,
                Some('}') => break,
                c => panic!("{c:?} after a label in {line}"),
            }
        }
        let value = chars.as_str().trim_start().parse().unwrap();
        out.push(Sample {
            name: name.into(),
            labels,
            value,
        });
    }
    out
}

/// The samples named `name` whose labels include `want`.
pub(super) fn find<'a>(
    samples: &'a [Sample],
    name: &str,
    want: &[(&str, &str)],
) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The value of the one sample named `name` with labels `want`.
#[track_caller]
pub(super) fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found = find(samples, name, want);
    assert_eq!(
        found.len(),
        1,
        "{name} {want:?}: {found:#?}\nin {samples:#?}"
    );
    found[0].value
}

/// The line `gpucap_pool_up` gives pool `pool` of this user (its `user` label) read or not.
fn up_line(pool: &str, up: u8) -> String {
    let me = own_user();
    format!("gpucap_pool_up{{pool=\"{pool}\",user=\"{me}\"}} {up}")
}

// ---------------------------------------------------------------------------
// promtool.

/// Prometheus's promtool, or None (after SKIP) when there is none outside CI.
fn promtool() -> Option<PathBuf> {
    checker_tool(
        "GPUCAP_TEST_PROMTOOL",
        "promtool",
        "the exposition must be checked by Prometheus's promtool; run scripts/test.sh, \
         which unpacks it from Debian's package prometheus",
    )
}

/// `promtool check metrics` with `text` on its standard input.
fn promtool_check(promtool: &Path, text: &str) -> Output {
    checker(Command::new(promtool).args(["check", "metrics"]), text)
}

/// scripts/gpu/promcheck.py, the same rules for the real-GPU run (no promtool there),
/// with `text` on its standard input.
fn promcheck(text: &str) -> Output {
    checker(
        Command::new("python3").arg(root().join("scripts/gpu/promcheck.py")),
        text,
    )
}

fn checker(cmd: &mut Command, text: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Each series (name and labels) once in `text` (promtool 2.42 does not check this:
/// Prometheus would drop the scrape's duplicates), and promtool accepts it (when there
/// is a promtool), and so does scripts/gpu/promcheck.py.
#[track_caller]
pub(super) fn assert_promtool_accepts(text: &str) {
    let o = promcheck(text);
    assert!(
        o.status.success(),
        "scripts/gpu/promcheck.py refused it\n{}\n--- input\n{text}",
        dump(&o)
    );
    let samples = parse(text);
    for (i, a) in samples.iter().enumerate() {
        assert!(
            !samples[..i]
                .iter()
                .any(|b| b.name == a.name && b.labels == a.labels),
            "{a:?} twice in\n{text}"
        );
    }
    if let Some(p) = promtool() {
        let o = promtool_check(&p, text);
        assert!(
            o.status.success() && stdout(&o).trim().is_empty() && stderr(&o).trim().is_empty(),
            "promtool check metrics refused it\n{}\n--- input\n{text}",
            dump(&o)
        );
    }
}

// ---------------------------------------------------------------------------
// HTTP.

/// A `gpucap metrics` server: the child, its address, its stderr file.
pub(super) struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    /// Starts `gpucap metrics --listen 127.0.0.1:0 ARGS` and reads the address it
    /// bound from its first line (waiting at most 60 s: a harness limit).
    pub(super) fn start(s: &Scratch, args: &[&str]) -> Server {
        // Numbered, not named by the arguments: those hold paths under the checkout, and
        // a long checkout path made the name longer than a file name may be.
        static SERVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = s.dir.join(format!("server-{n}.log"));
        let mut all = vec!["metrics", "--listen", "127.0.0.1:0"];
        all.extend(args);
        let mut child = s
            .gpucap(&all)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            // Only a whole line: the server may be writing it while it is read (a fresh
            // clone's run once read "gpucap metrics: serving http://127.0").
            if let Some((line, _)) = text.split_once('\n') {
                let addr = line
                    .strip_prefix("gpucap metrics: serving http://")
                    .and_then(|r| r.split_once("/metrics "))
                    .map(|(a, _)| a.to_string())
                    .unwrap_or_else(|| panic!("first line: {line:?}"));
                return Server { child, addr, log };
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("gpucap metrics exited ({status}): {text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no address printed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// One request (`METHOD PATH`): status line, headers, body.
    fn request(&self, method: &str, path: &str) -> (String, Vec<String>, String) {
        let mut c = TcpStream::connect(&self.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: */*\r\n\r\n",
            self.addr
        )
        .unwrap();
        let mut bytes = Vec::new();
        c.read_to_end(&mut bytes).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{text:?}"));
        let mut lines = head.split("\r\n").map(String::from);
        let status = lines.next().unwrap();
        let headers: Vec<String> = lines.collect();
        let length = headers
            .iter()
            .find_map(|h| h.strip_prefix("Content-Length: "))
            .map(|n| n.parse::<usize>().unwrap());
        if method != "HEAD" {
            assert_eq!(length, Some(body.len()), "{text:?}");
        }
        (status, headers, body.to_string())
    }

    /// `GET /metrics`: the body, after checking the status and the content type.
    pub(super) fn scrape(&self) -> String {
        let (status, headers, body) = self.request("GET", "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK", "{headers:?}\n{body}");
        assert!(
            headers
                .iter()
                .any(|h| h == "Content-Type: text/plain; version=0.0.4; charset=utf-8"),
            "{headers:?}"
        );
        body
    }

    /// How many of the server's descriptors and mappings are of `file` (by path, a
    /// removed file's included: the kernel shows it as `PATH (deleted)`).
    fn open_files(&self, file: &Path) -> (usize, usize) {
        let pid = self.child.id();
        let name = file.to_str().unwrap();
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .filter(|t| t.to_str().is_some_and(|t| t.starts_with(name)))
            .count();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .filter(|l| l.contains(name))
            .count();
        (fds, maps)
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// The server's resident memory now, in KiB (`VmRSS`).
    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix(" kB"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap()
    }

    /// The connections the server holds: its sockets but its listener.
    fn connections(&self) -> usize {
        let sockets = std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .filter(|t| t.to_str().is_some_and(|t| t.starts_with("socket:")))
            .count();
        sockets.saturating_sub(1)
    }

    /// The server's threads.
    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id()))
            .unwrap()
            .count()
    }

    /// Waits (at most `within`) until the server holds `n` connections; how many it
    /// holds then.
    fn await_connections(&self, n: usize, within: Duration) -> usize {
        let start = Instant::now();
        loop {
            let now = self.connections();
            if now == n || start.elapsed() > within {
                return now;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `n` clients that connect and send nothing (each connection waits at most 1 s:
    /// a server that does not take them stops it).
    fn silent_clients(&self, n: usize) -> Vec<TcpStream> {
        let addr = self.addr.parse().unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(c) => out.push(c),
                Err(e) => {
                    eprintln!("connection {} of {n}: {e}", out.len() + 1);
                    break;
                }
            }
        }
        out
    }

    /// `GET /metrics` on a new connection, each step within `within`: how long the
    /// answer took (from connecting to the end of the answer), and the answer; Err when
    /// it did not come in time.
    fn scrape_within(&self, within: Duration) -> Result<(Duration, String), String> {
        let start = Instant::now();
        let addr = self.addr.parse().unwrap();
        let mut c =
            TcpStream::connect_timeout(&addr, within).map_err(|e| format!("connect: {e}"))?;
        c.set_read_timeout(Some(within)).unwrap();
        c.set_write_timeout(Some(within)).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        let mut bytes = Vec::new();
        c.read_to_end(&mut bytes)
            .map_err(|e| format!("no answer after {:?}: {e}", start.elapsed()))?;
        Ok((start.elapsed(), String::from_utf8(bytes).unwrap()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------

/// `status --prometheus`: every series with the members' figures, a dead member's
/// share held by the dead, a refusal, another pool with `--all`, a missing pool as
/// `gpucap_pool_up 0` (exit status 1), a command with a quote, a backslash and a line
/// break escaped; promtool accepts each output.
#[test]
fn status_prometheus_shows_what_the_members_did() {
    let s = Scratch::new("metrics-status");
    // A program whose name has a quote, a backslash and a line break: its command line
    // is what the member stores, and what the `command` label shows.
    // The member shows the program's file name, without the directory it ran from.
    let odd = "we\"ird\\na\nme";
    std::os::unix::fs::symlink(script(), s.dir.join(odd)).unwrap();
    let a = s.member_as(&Path::new(".").join(odd), "t", "a", &["alloc:300Mi"]);
    let b = s.member("t", "b", &["alloc:200Mi"]);
    let (pid_a, pid_b) = (a.id().to_string(), b.id().to_string());
    // 300 + 200 of 1 GiB held: 600 MiB more is refused; the process then leaves.
    let o = s.once("t", &["alloc:600Mi"]);
    assert!(
        stdout(&o).contains(&format!("alloc {} 2", 600 * MIB)),
        "{}",
        dump(&o)
    );
    // b dies; its share stays until a member needs it.
    kill(b);
    let c = s.member("u", "c", &["alloc:64Mi"]);

    let o = run(&mut s.gpucap(&["status", "--prometheus", "--pool", "t"]));
    assert_ok(&o);
    let text = stdout(&o);
    let m = parse(&text);
    let t = [("pool", "t")];
    assert_eq!(value(&m, "gpucap_pool_up", &t), 1.0);
    let info = find(&m, "gpucap_pool_info", &t)[0];
    assert_eq!(info.labels["path"], s.pool_file("t").to_str().unwrap());
    assert_eq!(info.labels["version"], "11");
    let uuid = find(&m, "gpucap_pool_used_bytes", &t)[0].labels["gpu_uuid"].clone();
    assert!(uuid.starts_with("GPU-"), "{uuid}");
    let gpu = [("pool", "t"), ("gpu_uuid", uuid.as_str())];
    for (name, want) in [
        ("gpucap_pool_cap_bytes", GIB),
        ("gpucap_pool_used_bytes", 500 * MIB),
        ("gpucap_pool_peak_bytes", 500 * MIB),
        ("gpucap_pool_refusals_total", 1),
        ("gpucap_pool_largest_refused_bytes", 600 * MIB),
        ("gpucap_pool_held_by_dead_bytes", 200 * MIB),
    ] {
        assert_eq!(value(&m, name, &gpu), want as f64, "{name}\n{text}");
    }
    assert_eq!(
        value(
            &m,
            "gpucap_pool_members",
            &[("pool", "t"), ("state", "alive")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "gpucap_pool_members",
            &[("pool", "t"), ("state", "dead")]
        ),
        1.0
    );
    let ma = [("pool", "t"), ("pid", pid_a.as_str())];
    let mb = [("pool", "t"), ("pid", pid_b.as_str())];
    assert_eq!(value(&m, "gpucap_member_alive", &ma), 1.0);
    assert_eq!(value(&m, "gpucap_member_alive", &mb), 0.0);
    assert_eq!(
        value(&m, "gpucap_member_used_bytes", &ma),
        (300 * MIB) as f64
    );
    assert_eq!(
        value(&m, "gpucap_member_peak_bytes", &ma),
        (300 * MIB) as f64
    );
    assert_eq!(
        value(&m, "gpucap_member_used_bytes", &mb),
        (200 * MIB) as f64
    );
    let used_b = find(&m, "gpucap_member_used_bytes", &mb)[0];
    assert_eq!(used_b.labels["gpu_uuid"], uuid);
    assert!(
        used_b.labels["command"].starts_with("script alloc:200Mi "),
        "{:?}",
        used_b.labels["command"]
    );
    // The odd command comes back whole once unescaped, and stays on its line.
    let cmd_a = &find(&m, "gpucap_member_alive", &ma)[0].labels["command"];
    assert!(
        cmd_a.starts_with(&format!("{odd} alloc:300Mi")),
        "{cmd_a:?}"
    );
    assert!(
        text.contains("command=\"we\\\"ird\\\\na\\nme alloc:300Mi"),
        "{text}"
    );
    // Only pool t was asked for.
    assert!(find(&m, "gpucap_pool_up", &[("pool", "u")]).is_empty());
    assert_promtool_accepts(&text);

    // --all: both pools, each labelled by its name.
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all"]));
    assert_ok(&o);
    let all = parse(&stdout(&o));
    let pid_c = c.id().to_string();
    assert_eq!(value(&all, "gpucap_pool_up", &[("pool", "u")]), 1.0);
    assert_eq!(
        value(
            &all,
            "gpucap_member_used_bytes",
            &[("pool", "u"), ("pid", &pid_c)]
        ),
        (64 * MIB) as f64
    );
    assert_eq!(
        value(&all, "gpucap_pool_used_bytes", &[("pool", "t")]),
        (500 * MIB) as f64
    );
    assert_eq!(find(&all, "gpucap_pool_up", &[]).len(), 2);
    assert_promtool_accepts(&stdout(&o));

    // A pool nobody joined: up 0, its line on stderr, exit status 1 (as status); the
    // other pool is there all the same.
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--pool", "u", "--pool", "nobody"]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    let m = parse(&stdout(&o));
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "nobody")]), 0.0);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "u")]), 1.0);
    assert_eq!(
        find(&m, "gpucap_pool_used_bytes", &[]).len(),
        1,
        "nothing but up for the missing pool"
    );
    // The line, then the pools there are (`gpucap pool list`'s hint).
    let err = stderr(&o);
    assert!(
        err.starts_with(&format!(
            "gpucap: no pool file at {} (no process has joined it yet)",
            s.pool_file("nobody").display()
        )) && err.contains("the pools there: t, u")
            && err.lines().count() == 1,
        "{err}"
    );
    assert_promtool_accepts(&stdout(&o));

    // The configured pool, as status has it.
    let o = run(s
        .gpucap(&["status", "--prometheus"])
        .env("GPUCAP_POOL", "u"));
    assert_ok(&o);
    assert_eq!(
        find(&parse(&stdout(&o)), "gpucap_pool_up", &[]),
        [&Sample {
            name: "gpucap_pool_up".into(),
            labels: [
                ("pool".to_string(), "u".to_string()),
                // SAFETY: geteuid has no preconditions.
                ("user".to_string(), own_user()),
            ]
            .into(),
            value: 1.0
        }]
    );
    kill(a);
    kill(c);
}

/// The server: a pool nobody joined yet is served as up 0, then its members once they
/// join, each scrape read afresh (a kill shows at the next one); 404, 405, HEAD; the
/// file is not changed by scrapes; a member killed while the server has the file open
/// still gives its share back to the next member that needs it; a pool file removed and
/// made again is read anew.
#[test]
fn the_server_reads_the_pools_at_each_scrape() {
    let s = Scratch::new("metrics-server");
    let path_q = s.pool_file("q");
    let server = Server::start(&s, &["--pool", "p", "--pool", path_q.to_str().unwrap()]);
    assert!(
        server
            .log()
            .lines()
            .next()
            .unwrap()
            .ends_with(&format!("/metrics (pools p, {})", path_q.display())),
        "{}",
        server.log()
    );
    let q = path_q.to_str().unwrap();

    // Nobody joined yet: up 0 for both, and nothing else.
    let body = server.scrape();
    let m = parse(&body);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "p")]), 0.0);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", q)]), 0.0);
    assert_eq!(m.len(), 2, "{body}");
    assert_promtool_accepts(&body);

    // Members join p: the next scrape shows them.
    let a = s.member("p", "a", &["alloc:300Mi"]);
    let b = s.member("p", "b", &["alloc:500Mi"]);
    let (pid_a, pid_b) = (a.id().to_string(), b.id().to_string());
    let body = server.scrape();
    let m = parse(&body);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "p")]), 1.0);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", q)]), 0.0);
    assert_eq!(
        value(&m, "gpucap_pool_used_bytes", &[("pool", "p")]),
        (800 * MIB) as f64
    );
    assert_eq!(
        value(&m, "gpucap_member_used_bytes", &[("pid", &pid_b)]),
        (500 * MIB) as f64
    );
    assert_eq!(value(&m, "gpucap_member_alive", &[("pid", &pid_b)]), 1.0);
    assert_promtool_accepts(&body);

    // b is killed: the next scrape says so (the server keeps the file open between
    // scrapes, and that changes nothing for the members)...
    kill(b);
    let m = parse(&server.scrape());
    assert_eq!(value(&m, "gpucap_member_alive", &[("pid", &pid_b)]), 0.0);
    assert_eq!(
        value(&m, "gpucap_pool_held_by_dead_bytes", &[("pool", "p")]),
        (500 * MIB) as f64
    );
    // ...and a new member that needs b's share gets it back: the reader's open file
    // neither looks like a live member nor holds anything up.
    let c = s.member("p", "c", &["alloc:700Mi"]);
    let m = parse(&server.scrape());
    assert!(find(&m, "gpucap_member_alive", &[("pid", &pid_b)]).is_empty());
    assert_eq!(
        value(&m, "gpucap_pool_used_bytes", &[("pool", "p")]),
        (1000 * MIB) as f64
    );
    assert_eq!(
        value(&m, "gpucap_pool_held_by_dead_bytes", &[("pool", "p")]),
        0.0
    );
    assert_eq!(value(&m, "gpucap_member_alive", &[("pid", &pid_a)]), 1.0);

    // Other requests.
    let (status, _, body) = server.request("GET", "/");
    assert_eq!(status, "HTTP/1.1 404 Not Found", "{body}");
    let (status, _, _) = server.request("GET", "/metricsx");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    let (status, headers, _) = server.request("POST", "/metrics");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(
        headers.iter().any(|h| h == "Allow: GET, HEAD"),
        "{headers:?}"
    );
    let (status, headers, body) = server.request("HEAD", "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(body, "", "HEAD has no body");
    assert!(headers.iter().any(|h| h.starts_with("Content-Length: ")));
    // A client that connects and goes away does not stop the server.
    drop(TcpStream::connect(&server.addr).unwrap());
    let body = server.scrape();
    assert!(body.contains(&up_line("p", 1)), "{body}");

    // Every member dead: nothing can take their shares back, so a change to the file
    // would be the server's. Scrapes leave it as it was.
    kill(a);
    kill(c);
    let before = std::fs::read(s.pool_file("p")).unwrap();
    for _ in 0..20 {
        server.scrape();
    }
    assert!(
        std::fs::read(s.pool_file("p")).unwrap() == before,
        "scraping changed the pool file"
    );
    // The file is opened once, not at every scrape, and never mapped: it is read into
    // the server's own memory (a file another process truncates is a line, not SIGBUS).
    let p_file = s.pool_file("p");
    assert_eq!(server.open_files(&p_file), (1, 0), "descriptors, mappings");

    // The file removed (no process uses it) then made again by a new member: the server
    // reads the new file, not the one it had open.
    std::fs::remove_file(s.pool_file("p")).unwrap();
    let m = parse(&server.scrape());
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "p")]), 0.0);
    let d = s.member("p", "d", &["alloc:50Mi"]);
    let m = parse(&server.scrape());
    assert_eq!(
        value(&m, "gpucap_pool_used_bytes", &[("pool", "p")]),
        (50 * MIB) as f64
    );
    assert_eq!(
        find(&m, "gpucap_member_alive", &[("pool", "p")]).len(),
        1,
        "only the new member"
    );
    // Again, with no scrape while the file is missing: the server sees another file
    // under the same path, and reads it instead of the one it has open.
    kill(d);
    std::fs::remove_file(&p_file).unwrap();
    let e = s.member("p", "e", &["alloc:70Mi"]);
    let pid_e = e.id().to_string();
    let m = parse(&server.scrape());
    assert_eq!(
        value(&m, "gpucap_pool_used_bytes", &[("pool", "p")]),
        (70 * MIB) as f64
    );
    let members = find(&m, "gpucap_member_alive", &[("pool", "p")]);
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].labels["pid"], pid_e);
    // The replaced file's descriptor is closed (its mapping stays: docs/src/metrics.md).
    assert_eq!(server.open_files(&p_file).0, 1);
    kill(e);

    // The log: each change of a pool once, not a line per scrape.
    let log = server.log();
    let missing = format!(
        "gpucap: no pool file at {} (no process has joined it yet) (served as gpucap_pool_up 0)",
        s.pool_file("p").display()
    );
    let readable = format!(
        "gpucap metrics: pool p readable (file {})",
        s.pool_file("p").display()
    );
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" p ") || l.contains("/p.pool"))
        .collect();
    assert_eq!(lines, [&missing, &readable, &missing, &readable], "{log}");
}

/// `--all` serves the pools of the directory as they come.
#[test]
fn the_server_lists_the_pool_directory_at_each_scrape() {
    let s = Scratch::new("metrics-all");
    let server = Server::start(&s, &["--all"]);
    // No pool directory yet: an empty exposition.
    assert_eq!(server.scrape(), "");
    let a = s.member("one", "a", &["alloc:10Mi"]);
    let m = parse(&server.scrape());
    assert_eq!(find(&m, "gpucap_pool_up", &[]).len(), 1);
    let b = s.member("two", "b", &["alloc:20Mi"]);
    // A file named like a pool file that is not one, and one not named like one, in the
    // directory: the first is counted (no series of its own: anyone may make thousands,
    // junk_in_a_pool_directory_is_one_count_not_a_series_each), the second is not a pool.
    let dir = s.pool_file("x").parent().unwrap().to_path_buf();
    std::fs::write(dir.join("junk.pool"), b"not a pool").unwrap();
    std::fs::write(dir.join("notes.txt"), b"hello").unwrap();
    let body = server.scrape();
    let m = parse(&body);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "one")]), 1.0);
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "two")]), 1.0);
    assert_eq!(find(&m, "gpucap_pool_up", &[]).len(), 2, "{body}");
    assert_eq!(
        value(&m, "gpucap_pool_files_unreadable", &[("user", &own_user())]),
        1.0
    );
    assert_eq!(
        value(&m, "gpucap_pool_used_bytes", &[("pool", "two")]),
        (20 * MIB) as f64
    );
    assert_promtool_accepts(&body);
    assert!(
        server
            .log()
            .contains("junk.pool: it is not a gpucap pool file"),
        "{}",
        server.log()
    );
    // The directory becomes one that others may write in: not an empty answer, which
    // Prometheus would take for no pools, but a 500 with the line (the target is down).
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Root reads every user's directory, its own as its `status` does: read all the
    // same, and said (metrics_users.rs).
    let (status, _, body) = server.request("GET", "/metrics");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    if is_root() {
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        assert_eq!(
            find(&parse(&body), "gpucap_pool_up", &[]).len(),
            2,
            "{body}"
        );
        assert!(
            server
                .log()
                .contains("(what it holds is shown all the same)"),
            "{}",
            server.log()
        );
    } else {
        assert_eq!(status, "HTTP/1.1 500 Internal Server Error", "{body}");
        assert!(body.starts_with("gpucap: --all: "), "{body}");
    }
    assert_eq!(
        find(&parse(&server.scrape()), "gpucap_pool_up", &[]).len(),
        2,
        "served again once the directory is fixed"
    );
    kill(a);
    kill(b);
}

/// Files named like pool files that are not pools (no pool file's header, or a name no
/// pool can have) are one count per user, `gpucap_pool_files_unreadable`, and one line:
/// anyone may fill their directory with such files, and each was a `gpucap_pool_up 0`
/// series labelled with its name (200 junk files, 200 series: unbounded for
/// Prometheus). A pool file this gpucap cannot read (another layout) keeps its `up 0`.
#[test]
fn junk_in_a_pool_directory_is_one_count_not_a_series_each() {
    let s = Scratch::new("metrics-litter");
    let a = s.member("one", "a", &["alloc:10Mi"]);
    let file = s.pool_file("one");
    let dir = file.parent().unwrap().to_path_buf();
    for i in 0..200 {
        std::fs::write(dir.join(format!("junk{i}.pool")), b"not a pool").unwrap();
    }
    // A pool's header, but a name no pool can have: junk too.
    std::fs::write(dir.join("no pool.pool"), b"GPUCAPPL").unwrap();
    // A pool file of another layout (its version word changed): a pool, up 0.
    let mut old = std::fs::read(&file).unwrap();
    old[8..16].copy_from_slice(&9u64.to_le_bytes());
    std::fs::write(dir.join("old.pool"), &old).unwrap();
    let me = own_user();
    let check = |text: &str| {
        let m = parse(text);
        assert_eq!(
            value(&m, "gpucap_pool_up", &[("pool", "one")]),
            1.0,
            "{text}"
        );
        assert_eq!(
            value(&m, "gpucap_pool_up", &[("pool", "old")]),
            0.0,
            "{text}"
        );
        assert_eq!(find(&m, "gpucap_pool_up", &[]).len(), 2, "{text}");
        assert_eq!(
            value(&m, "gpucap_pool_files_unreadable", &[("user", &me)]),
            201.0,
            "{text}"
        );
        assert!(!text.contains("junk"), "{text}");
        assert_promtool_accepts(text);
    };
    let summary = format!(
        "gpucap: {}: 201 files named like pool files are not gpucap pool files (counted \
         in gpucap_pool_files_unreadable{{user=\"{me}\"}}; gpucap status lists each): the \
         first, the pool file {}/junk0.pool: it is not a gpucap pool file",
        dir.display(),
        dir.display()
    );
    // status --prometheus: a file it cannot read is exit status 2, as before; one line
    // for the junk, one for the other layout's pool.
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    check(&stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(
        err.lines().any(|l| l.starts_with(&summary)),
        "{summary}\n{err}"
    );
    assert!(
        err.contains("old.pool: it is a version 9 pool file"),
        "{err}"
    );
    // The server: the same, the line logged once.
    let server = Server::start(&s, &["--all"]);
    check(&server.scrape());
    check(&server.scrape());
    let log = server.log();
    assert_eq!(
        log.lines().filter(|l| l.starts_with(&summary)).count(),
        1,
        "{log}"
    );
    assert!(!log.contains("junk1.pool"), "{log}");
    kill(a);
}

/// A server reading 200 pools holds none of their words between scrapes: each reading's
/// copy of a file (809 KiB for 256 members) is freed after it, where every pool kept
/// one (167 MB resident for 201 pools; 4 MB now).
#[test]
fn the_server_keeps_no_copy_of_the_pools_it_read() {
    let s = Scratch::new("metrics-many-pools");
    let seed = s.member("seed", "a", &["alloc:10Mi"]);
    let file = s.pool_file("seed");
    for i in 0..200 {
        std::fs::copy(&file, file.with_file_name(format!("p{i}.pool"))).unwrap();
    }
    let server = Server::start(&s, &["--all"]);
    let body = server.scrape();
    assert_eq!(find(&parse(&body), "gpucap_pool_up", &[]).len(), 201);
    server.scrape();
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    // 200 copies kept would be 158 MiB at least.
    assert!(rss_kib < 64 * 1024, "{rss_kib} KiB resident");
    kill(seed);
}

/// `--all` exports the containers' pools kept in the pool directory beside the user's
/// own (a pod's containers share its `/dev/shm`: a metrics sidecar in another container
/// sees each one's pool), named by their directory. Before, `--all` listed `gpucap-UID`'s
/// pools only, and a container's processes holding 30 MiB were not exported.
#[test]
fn all_exports_the_containers_pools_beside_the_users() {
    let s = Scratch::new("metrics-all-containers");
    let a = s.member("container-mntns", "a", &["alloc:30Mi"]);
    let b = s.member("mine", "b", &["alloc:10Mi"]);
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all"]));
    kill(a);
    kill(b);
    assert_ok(&o);
    let body = stdout(&o);
    let m = parse(&body);
    let ns = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let ns = ns.to_string_lossy();
    let ns = ns.trim_start_matches("mnt:[").trim_end_matches(']');
    let container = format!("gpucap-container-{ns}");
    assert_eq!(
        value(&m, "gpucap_pool_up", &[("pool", &container)]),
        1.0,
        "{body}"
    );
    assert_eq!(
        value(&m, "gpucap_pool_used_bytes", &[("pool", &container)]),
        (30 * MIB) as f64,
        "{body}"
    );
    assert_eq!(
        value(&m, "gpucap_pool_up", &[("pool", "mine")]),
        1.0,
        "{body}"
    );
    assert_promtool_accepts(&body);
}

/// `gpucap metrics --all` in a pool directory that does not exist does not start: it
/// says so, where it served empty answers.
#[test]
fn the_server_refuses_a_pool_directory_that_cannot_be_used() {
    let s = Scratch::new("metrics-no-dir");
    let mut c = s.gpucap(&["metrics", "--listen", "127.0.0.1:0", "--all"]);
    c.env("GPUCAP_POOL_DIR", s.dir.join("missing"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    // A harness limit, not a timing assertion: a server that started serves forever.
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("gpucap metrics started serving a directory that does not exist");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).starts_with("gpucap: --all: "), "{}", dump(&o));
}

/// A process capped on its own (no pool) is exported with `--all` beside the pools'
/// members (`gpucap_process_*`), until it dies.
#[test]
fn a_process_capped_alone_is_exported_beside_a_pools_members() {
    let s = Scratch::new("metrics-lone");
    let member = s.member("one", "a", &["alloc:10Mi"]);
    let lone = s.lone("l", &["alloc:30Mi", "alloc:2Gi"]);
    let pid = lone.id().to_string();
    // With no pool configured, `status --prometheus` shows what `status` shows: every
    // pool and every process capped alone, as `--all` does.
    for text in [
        Server::start(&s, &["--all"]).scrape(),
        stdout(&run(&mut s.gpucap(&["status", "--prometheus", "--all"]))),
        stdout(&run(&mut s.gpucap(&["status", "--prometheus"]))),
    ] {
        let m = parse(&text);
        let who = [("pid", pid.as_str())];
        assert_eq!(
            value(&m, "gpucap_process_used_bytes", &who),
            (30 * MIB) as f64,
            "{text}"
        );
        assert_eq!(
            value(&m, "gpucap_process_cap_bytes", &who),
            (1u64 << 30) as f64
        );
        assert_eq!(value(&m, "gpucap_process_refusals_total", &who), 1.0);
        assert_eq!(
            value(&m, "gpucap_process_largest_refused_bytes", &who),
            (2u64 << 30) as f64
        );
        let s1 = find(&m, "gpucap_process_used_bytes", &who);
        assert!(s1[0].labels["gpu_uuid"].starts_with("GPU-"), "{text}");
        assert!(
            s1[0].labels["command"].starts_with("script alloc:30Mi"),
            "{text}"
        );
        assert_eq!(
            value(&m, "gpucap_member_used_bytes", &[("pool", "one")]),
            (10 * MIB) as f64
        );
        assert_promtool_accepts(&text);
    }
    kill(lone);
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all"]));
    assert!(
        find(&parse(&stdout(&o)), "gpucap_process_used_bytes", &[]).is_empty(),
        "{}",
        dump(&o)
    );
    kill(member);
}

/// A client that sends its request a byte at a time, never finishing it, is cut off
/// (after 5 s in all), and a scrape meanwhile is answered.
#[test]
fn a_slow_client_does_not_hold_the_server() {
    let s = Scratch::new("metrics-slow");
    let server = Server::start(&s, &["--pool", "p"]);
    let addr = server.addr.clone();
    // The slow client: a byte every 200 ms, for at most 60 s (a harness limit); true
    // when the server closed the connection first.
    let slow = std::thread::spawn(move || {
        let mut c = TcpStream::connect(&addr).unwrap();
        let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
        c.write_all(head).unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if c.write_all(b"a").is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    std::thread::sleep(Duration::from_millis(300));
    let body = server.scrape();
    assert!(body.contains(&up_line("p", 0)), "{body}");
    assert!(slow.join().unwrap(), "the slow client was never cut off");
}

/// Writes one byte to each of `clients` every 100 ms until `stop` (at most 60 s: a
/// harness limit), ignoring the ones the server closed.
fn trickle(clients: Vec<TcpStream>, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let start = Instant::now();
    while !stop.load(std::sync::atomic::Ordering::Relaxed)
        && start.elapsed() < Duration::from_secs(60)
    {
        for mut c in &clients {
            let _ = c.write_all(b"a");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// 200 slow clients connected at once (a third send nothing, a third a request line a
/// byte every 100 ms, a third headers a byte every 100 ms) do not keep a scrape waiting:
/// it is answered while every one of them is still connected (a server that served
/// them in turn would answer only once their 5 s were up and they were cut off; how
/// fast is the benchmark's business, not a test's); each slow client is cut off once
/// its 5 s to send a request are up.
#[test]
fn a_scrape_is_answered_while_200_slow_clients_are_connected() {
    const SLOW: usize = 200;
    let s = Scratch::new("metrics-slow-200");
    let a = s.member("p", "a", &["alloc:10Mi"]);
    let server = Server::start(&s, &["--pool", "p"]);
    let opened = Instant::now();
    let mut clients = server.silent_clients(SLOW);
    let mut trickling = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        match i % 3 {
            0 => continue,
            1 => c.write_all(b"GE").unwrap(),
            _ => c.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ").unwrap(),
        }
        trickling.push(c.try_clone().unwrap());
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickler = {
        let stop = stop.clone();
        std::thread::spawn(move || trickle(trickling, stop))
    };
    let held = server.await_connections(SLOW, Duration::from_secs(3));

    let scrape = server.scrape_within(Duration::from_secs(5));
    let held_after = server.connections();
    eprintln!(
        "{SLOW} slow clients: {} connected, the server held {held}; scrape: {:?}",
        clients.len(),
        scrape.as_ref().map(|(t, _)| *t)
    );
    let (took, answer) = scrape.unwrap_or_else(|e| {
        panic!("no answer to a scrape with {SLOW} slow clients connected: {e}")
    });
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains(&up_line("p", 1)), "{answer}");
    assert_eq!(clients.len(), SLOW, "connections taken");
    assert_eq!(held, SLOW, "connections the server held");
    assert!(
        held_after >= SLOW,
        "the scrape ({took:?}) was answered only after slow clients were cut off: \
         {held_after} of {SLOW} still connected"
    );

    // Each is cut off when its 5 s are up (the trickling ones too): all gone within
    // 5 s of the last one, give or take a loaded machine.
    let left = server.await_connections(0, Duration::from_secs(20));
    let gone = opened.elapsed();
    eprintln!("the {SLOW} slow clients cut off {gone:?} after the first connected");
    assert_eq!(left, 0, "slow clients still connected after {gone:?}");
    assert!(
        gone >= Duration::from_secs(5),
        "cut off before their 5 s: {gone:?}"
    );
    let mut buf = [0u8; 64];
    for c in &mut clients {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The server closed it: the end of the stream, or a reset (bytes were unread).
        assert!(matches!(c.read(&mut buf), Ok(0) | Err(_)));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickler.join().unwrap();
    drop(clients);
    kill(a);
}

/// At most 256 connections are served at once: the 257th is taken all the same, and
/// the oldest connection closed, unanswered, to make room; the 257th gets its answer;
/// a scrape at the bound is answered within 1 s, the oldest making room again; the
/// server has a thread per connection and one more.
#[test]
fn at_the_connection_bound_the_oldest_client_makes_room() {
    const MAX: usize = 256;
    let s = Scratch::new("metrics-bound");
    let server = Server::start(&s, &["--pool", "p"]);
    let first = Instant::now();
    let mut clients = server.silent_clients(MAX);
    assert_eq!(clients.len(), MAX, "connections taken");
    assert_eq!(server.await_connections(MAX, Duration::from_secs(3)), MAX);
    assert!(server.threads() <= MAX + 2, "{} threads", server.threads());

    let mut extra = server
        .silent_clients(1)
        .pop()
        .expect("the 257th connection");
    // The oldest is closed: the end of its stream, well before its own 5 s are up.
    clients[0]
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut buf = [0u8; 64];
    let closed = clients[0].read(&mut buf);
    assert!(
        matches!(closed, Ok(0)),
        "the oldest connection: {closed:?} (no answer, closed)"
    );
    assert!(
        first.elapsed() < Duration::from_secs(5),
        "too slow to tell the bound from the time limit: {:?}",
        first.elapsed()
    );
    // (Its descriptor closes when its thread sees the end.)
    assert_eq!(server.await_connections(MAX, Duration::from_secs(3)), MAX);
    // The others stay open.
    for c in &clients[1..] {
        c.set_nonblocking(true).unwrap();
        let mut one = [0u8; 1];
        assert_eq!(
            (&*c).read(&mut one).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }

    // The 257th is served.
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let asked = Instant::now();
    extra
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    extra.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8(answer).unwrap();
    eprintln!("the 257th connection answered in {:?}", asked.elapsed());
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains(&up_line("p", 0)), "{answer}");

    // The bound again (the 257th is done: one more client makes 256): a scrape is
    // answered within 1 s, and the oldest left, client 1, makes room.
    let newest = server.silent_clients(1);
    assert_eq!(newest.len(), 1);
    assert_eq!(server.await_connections(MAX, Duration::from_secs(3)), MAX);
    let (took, answer) = server
        .scrape_within(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("no answer at the bound: {e}"));
    eprintln!("a scrape at the connection bound: {took:?}");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    clients[1].set_nonblocking(false).unwrap();
    clients[1]
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let closed = clients[1].read(&mut buf);
    assert!(matches!(closed, Ok(0)), "client 1: {closed:?}");
    assert_eq!(
        server.await_connections(MAX - 1, Duration::from_secs(3)),
        MAX - 1
    );
    assert!(server.threads() <= MAX + 2, "{} threads", server.threads());
    assert!(
        server.log().contains(
            "gpucap metrics: 256 connections open (the most it serves at once): \
             closing the oldest for each new one"
        ),
        "{}",
        server.log()
    );
    drop(clients);
    drop(newest);
}

/// Bad command lines and a port in use: exit status 2, one line.
#[test]
fn metrics_errors_say_what_is_wrong() {
    let s = Scratch::new("metrics-errors");
    for (args, line) in [
        (
            &["metrics"][..],
            "gpucap: no --listen: where to serve, an IP address and a port",
        ),
        (
            &["metrics", "--listen", "localhost:9400"],
            "gpucap: invalid --listen \"localhost:9400\": an IP address and a port",
        ),
        (
            &["metrics", "--listen", "127.0.0.1:0"],
            "gpucap: no pool configured: name one with --pool NAME|PATH, or set GPUCAP_POOL \
             (or CUDA_DEVICE_MEMORY_SHARED_CACHE) as the pool's processes have it; or --all \
             for every pool of the pool directory",
        ),
        (
            &[
                "metrics",
                "--listen",
                "127.0.0.1:0",
                "--pool",
                "ok",
                "--pool",
                "no good",
            ],
            "gpucap: invalid --pool=\"no good\": not a pool name",
        ),
        (
            &["status", "--prometheus", "--pool", "off"],
            "gpucap: invalid --pool=\"off\": off names no pool",
        ),
        (
            &["status", "--prometheus", "--json"],
            "gpucap: --json and --prometheus exclude each other",
        ),
    ] {
        let o = run(&mut s.gpucap(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).starts_with(line),
            "{args:?}: {line}\n{}",
            dump(&o)
        );
        assert_eq!(stdout(&o), "", "{args:?}");
    }
    // An address in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = run(&mut s.gpucap(&["metrics", "--listen", &addr, "--pool", "p"]));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).starts_with(&format!("gpucap: cannot listen on {addr}: ")),
        "{}",
        dump(&o)
    );
    // A GPUCAP_POOL_DIR that does not exist: --all says so (status), exit status 2.
    let o = run(s
        .gpucap(&["status", "--prometheus", "--all"])
        .env("GPUCAP_POOL_DIR", s.dir.join("missing")));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("GPUCAP_POOL_DIR="), "{}", dump(&o));
}

/// The negative control: promtool is not a rubber stamp. gpucap's own output passes,
/// and the same output broken in the ways an exporter breaks it is refused: a label
/// value with its line break or quote not escaped, a counter without `_total`, a family
/// typed twice, a sample with no value, a metric without HELP. scripts/gpu/promcheck.py
/// (the real-GPU run's checker, where there is no promtool) must agree on each, with or
/// without a promtool here.
#[test]
fn promtool_rejects_a_broken_exposition() {
    let promtool = promtool();
    let s = Scratch::new("metrics-promtool");
    // The member shows the program's file name, without its directory.
    let odd = "a\"b\nc";
    std::os::unix::fs::symlink(script(), s.dir.join(odd)).unwrap();
    let a = s.member_as(&Path::new(".").join(odd), "t", "a", &["alloc:10Mi"]);
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--pool", "t"]));
    assert_ok(&o);
    let good = stdout(&o);
    kill(a);
    if let Some(promtool) = &promtool {
        let o = promtool_check(promtool, &good);
        assert!(o.status.success(), "{}\n{good}", dump(&o));
    }
    let o = promcheck(&good);
    assert!(o.status.success(), "promcheck.py: {}\n{good}", dump(&o));

    let must = |from: &str| {
        assert!(good.contains(from), "no {from:?} in\n{good}");
    };
    let escaped = "command=\"a\\\"b\\nc ";
    must(escaped);
    must("gpucap_pool_refusals_total");
    must("# HELP gpucap_pool_peak_bytes ");
    let used_line = good
        .lines()
        .find(|l| l.starts_with("gpucap_pool_used_bytes{"))
        .unwrap()
        .to_string();
    let (series, _) = used_line.rsplit_once(' ').unwrap();
    let broken: Vec<(&str, String)> = vec![
        (
            "a raw line break in a label value",
            good.replace(escaped, "command=\"a\\\"b\nc "),
        ),
        (
            "a raw quote in a label value",
            good.replace(escaped, "command=\"a\"b\\nc "),
        ),
        (
            "a counter without _total",
            good.replace("gpucap_pool_refusals_total", "gpucap_pool_refusals"),
        ),
        (
            "a family typed twice",
            format!("{good}# TYPE gpucap_pool_used_bytes gauge\n{used_line}\n"),
        ),
        ("a sample without a value", good.replace(&used_line, series)),
        (
            "no HELP",
            good.lines()
                .filter(|l| !l.starts_with("# HELP gpucap_pool_peak_bytes "))
                .map(|l| format!("{l}\n"))
                .collect(),
        ),
    ];
    for (what, text) in &broken {
        assert_ne!(text, &good, "{what}: nothing was broken");
        let o = promcheck(text);
        assert!(
            !o.status.success() && stdout(&o).starts_with("FAIL: "),
            "promcheck.py accepted {what}\n{}\n--- input\n{text}",
            dump(&o)
        );
        let Some(promtool) = &promtool else { continue };
        let o = promtool_check(promtool, text);
        assert!(
            !o.status.success(),
            "promtool accepted {what}\n{}\n--- input\n{text}",
            dump(&o)
        );
        assert!(
            !(stdout(&o).trim().is_empty() && stderr(&o).trim().is_empty()),
            "{what}: promtool said nothing\n{}",
            dump(&o)
        );
    }
}

/// A FIFO at a pool's path: the server opens it without waiting, refuses it
/// with a line, and answers the scrape (a hang would leave the scrape unanswered: the
/// request's 60 s read timeout fails the test).
#[test]
fn a_fifo_at_a_pools_path_does_not_hang_the_server() {
    let s = Scratch::new("metrics-fifo");
    s.fifo_pool("fifo");
    let server = Server::start(&s, &["--pool", "fifo"]);
    let start = Instant::now();
    let body = server.scrape();
    assert!(body.contains(&up_line("fifo", 0)), "{body}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the scrape took {:?}",
        start.elapsed()
    );
    assert!(
        server.log().contains("it is not a regular file"),
        "{}",
        server.log()
    );
    // `status --prometheus` too.
    let mut c = s.gpucap(&["status", "--prometheus", "--pool", "fifo"]);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            kill(child);
            panic!("status --prometheus hangs on a FIFO");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        stderr(&o).contains("it is not a regular file"),
        "{}",
        dump(&o)
    );
}

#[test]
fn a_pool_file_truncated_under_the_server_is_a_line_not_a_signal() {
    let s = Scratch::new("metrics-truncated");
    let server = Server::start(&s, &["--pool", "p"]);
    let a = s.member("p", "a", &["alloc:300Mi"]);
    let m = parse(&server.scrape());
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "p")]), 1.0);
    // Another process that may write the file shrinks it while the server holds it open.
    std::fs::OpenOptions::new()
        .write(true)
        .open(s.pool_file("p"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let m = parse(&server.scrape());
    assert_eq!(value(&m, "gpucap_pool_up", &[("pool", "p")]), 0.0);
    assert!(
        server.log().contains("4096 bytes now"),
        "the server says why\n{}",
        server.log()
    );
    kill(a);
}

/// A pool file removed while its member runs is read through the member's descriptor at
/// every scrape (the pool named, and `--all`): 100 more scrapes leave the server's memory
/// where it was (before: each opened the file again and kept a copy of it, 810 KiB a
/// scrape: 5 MiB to 248 MiB after 300).
#[test]
fn scraping_a_removed_pool_file_again_and_again_does_not_grow_the_server() {
    let s = Scratch::new("metrics-removed-rss");
    let a = s.member("p", "a", &["alloc:10Mi"]);
    std::fs::remove_file(s.pool_file("p")).unwrap();
    for args in [&["--pool", "p"][..], &["--all"]] {
        let server = Server::start(&s, args);
        for _ in 0..10 {
            let m = parse(&server.scrape());
            assert_eq!(
                value(&m, "gpucap_pool_up", &[("pool", "p")]),
                1.0,
                "{args:?}"
            );
        }
        let before = server.rss_kib();
        for _ in 0..100 {
            server.scrape();
        }
        let after = server.rss_kib();
        assert!(
            after < before + 16 * 1024,
            "{args:?}: {before} KiB after 10 scrapes, {after} KiB after 110"
        );
    }
    kill(a);
}

/// A pool whose members allocate and free all the time shows no drift: a reader's copy
/// of the file taken between a member's word and the pool's `used` (which disagree
/// for a moment) is read again, so that `gpucap_pool_drift_bytes`, documented as 0
/// unless another process wrote the file, does not alarm on busy members (it did in
/// 35 of 342 readings).
#[test]
fn a_busy_pools_readings_show_no_drift() {
    let s = Scratch::new("metrics-busy-drift");
    let churn = compile_c("pool_churn", "", &["-lcuda"]);
    let mut members = Vec::new();
    for _ in 0..3 {
        let mut c = s.gpucap(&["run", "--limit", "1Gi", "--pool", "busy", "--"]);
        c.arg(&churn)
            .args(["4", "2000000", "64000000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        members.push(c.spawn().unwrap());
    }
    let pool_file = s.pool_file("busy");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pool_file.exists() {
        assert!(Instant::now() < deadline, "no pool file");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut drifted = Vec::new();
    for _ in 0..150 {
        let o = run(&mut s.gpucap(&["status", "--prometheus", "--pool", "busy"]));
        let text = stdout(&o);
        let m = parse(&text);
        for d in find(&m, "gpucap_pool_drift_bytes", &[("pool", "busy")]) {
            if d.value != 0.0 {
                drifted.push(d.value);
            }
        }
    }
    for c in members {
        kill(c);
    }
    assert!(
        drifted.is_empty(),
        "drift in {} readings: {drifted:?}",
        drifted.len()
    );
}

/// Two containers' programs capped alone, each PID 1 of its own PID namespace: two
/// HAMi series (their `pid_namespace` keeps them apart, as in `gpucap_process_*`), where
/// the same labels twice made Prometheus keep one and drop the other's bytes.
#[test]
fn hami_series_of_two_containers_pid_1_are_two_series() {
    if !unshare_works() {
        return;
    }
    let s = Scratch::new("metrics-hami-pid1");
    let mut held = Vec::new();
    for (tag, mib) in [("c1", 10), ("c2", 20)] {
        let ready = s.dir.join(format!("{tag}.ready"));
        // The environment of `s.gpucap`, the program unshare.
        let c = s.gpucap(&[]);
        let mut u = Command::new("unshare");
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => u.env(k, v),
                None => u.env_remove(k),
            };
        }
        u.args(["-pf", "--mount-proc", "--kill-child"])
            .arg(cli())
            .args(["run", "--limit", "1Gi", "--"])
            .arg(script())
            .arg(format!("alloc:{mib}Mi"))
            .arg(format!("touch:{}", ready.display()))
            .arg(format!("wait:{}", s.dir.join("never").display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = u.spawn().unwrap();
        wait_ready(&mut child, &ready, tag);
        held.push(child);
    }
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all", "--hami"]));
    assert_ok(&o);
    let text = stdout(&o);
    let m = parse(&text);
    let ones = find(&m, "hami_vgpu_memory_used_bytes", &[("pid", "1")]);
    let mut got: Vec<f64> = ones.iter().map(|x| x.value).collect();
    got.sort_by(f64::total_cmp);
    assert_eq!(got, [(10 * MIB) as f64, (20 * MIB) as f64], "{text}");
    let keys: std::collections::BTreeSet<_> = ones.iter().map(|x| x.labels.clone()).collect();
    assert_eq!(keys.len(), 2, "the same labels twice\n{text}");
    for c in held {
        kill(c);
    }
}

/// `--hami`: HAMi's monitor series beside gpucap's, the names HAMi's vGPU dashboard
/// queries (`hami_vgpu_memory_used_bytes`, `hami_vgpu_memory_limit_bytes`, labelled
/// namespace, pod, container, vdevice_index, device_uuid): a pool's live members as one
/// container (outside Kubernetes: empty names) holding their sum under the pool's cap,
/// a process capped alone under its own; promtool accepts it; without `--hami`, none.
#[test]
fn hami_names_show_a_pools_use_and_cap_and_a_lone_processs() {
    let s = Scratch::new("metrics-hami");
    let a = s.member("t", "a", &["alloc:300Mi"]);
    let b = s.member("t", "b", &["alloc:200Mi"]);
    let lone = s.lone("l", &["alloc:64Mi"]);
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all", "--hami"]));
    assert_ok(&o);
    let text = stdout(&o);
    let m = parse(&text);
    let pool = [("pool", "t")];
    let used = find(&m, "hami_vgpu_memory_used_bytes", &pool);
    assert_eq!(used.len(), 1, "one series for the pool's GPU\n{text}");
    let l = &used[0].labels;
    for (k, v) in [
        ("namespace", ""),
        ("pod", ""),
        ("container", ""),
        ("vdevice_index", "0"),
    ] {
        assert_eq!(l[k], v, "{k}\n{text}");
    }
    assert!(l["device_uuid"].starts_with("GPU-"), "{text}");
    assert_eq!(used[0].value, (500 * MIB) as f64, "{text}");
    assert_eq!(
        value(&m, "hami_vgpu_memory_limit_bytes", &pool),
        GIB as f64,
        "{text}"
    );
    let pid = lone.id().to_string();
    let alone = [("pid", pid.as_str())];
    assert_eq!(
        value(&m, "hami_vgpu_memory_used_bytes", &alone),
        (64 * MIB) as f64,
        "{text}"
    );
    assert!(
        !find(&m, "hami_vgpu_memory_limit_bytes", &alone).is_empty(),
        "{text}"
    );
    assert_promtool_accepts(&text);
    let o = run(&mut s.gpucap(&["status", "--prometheus", "--all"]));
    assert_ok(&o);
    assert!(!stdout(&o).contains("hami_"), "{}", stdout(&o));
    for c in [a, b, lone] {
        kill(c);
    }
}
