//! The monitoring files gpucap ships (scripts/monitoring/, docs/src/metrics.md): the
//! alert rules pass Prometheus's `promtool check rules` and their unit tests
//! (`promtool test rules`), and a real Prometheus scraping `gpucap metrics --all` beside
//! a pool with members on the fake GPU answers every query of the Grafana dashboard with
//! series, loads the rules healthy, and fires the refusal alert when a member is refused.
//!
//! promtool comes from `GPUCAP_TEST_PROMTOOL`, prometheus from `GPUCAP_TEST_PROMETHEUS`
//! (scripts/test.sh unpacks both from Debian's package prometheus, without installing it),
//! else from PATH. Without them the tests print `SKIP: ...`, unless `CI` or
//! `GPUCAP_TEST_REQUIRE_CLIENTS=1` is set: then a missing tool fails them. Everything
//! listens on 127.0.0.1 only, and every process the test starts is killed at its end.

use super::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pool_scratch::*;
use common::*;

const RULES: &str = "scripts/monitoring/gpucap-rules.yaml";
const RULES_TEST: &str = "scripts/monitoring/gpucap-rules.test.yaml";
const DASHBOARD: &str = "scripts/monitoring/gpucap-dashboard.json";

/// A harness limit for what the test waits on (a scrape, a rule evaluation): a hung
/// Prometheus fails the test instead of stalling it. Not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(120);

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn promtool() -> Option<PathBuf> {
    checker_tool(
        "GPUCAP_TEST_PROMTOOL",
        "promtool",
        "the alert rules must be checked by Prometheus's promtool; run scripts/test.sh, \
         which unpacks it from Debian's package prometheus",
    )
}

fn prometheus() -> Option<PathBuf> {
    checker_tool(
        "GPUCAP_TEST_PROMETHEUS",
        "prometheus",
        "the dashboard's queries and the rules must be run by a real Prometheus; run \
         scripts/test.sh, which unpacks it from Debian's package prometheus",
    )
}

/// A child process SIGKILLed (and reaped) when dropped, so that a failing assertion
/// leaves nothing running.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        // SAFETY: kill on our own child's pid, not reaped yet.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The alert names of the rules file, in order.
fn alert_names() -> Vec<String> {
    std::fs::read_to_string(repo(RULES))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(String::from)
        .collect()
}

/// The `expr` of alert `name` in the rules file (a folded `>-` block joined by spaces).
fn alert_expr(name: &str) -> String {
    let text = std::fs::read_to_string(repo(RULES)).unwrap();
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != format!("- alert: {name}"))
        .skip(1)
        .skip_while(|l| !l.trim_start().starts_with("expr:"));
    let first = lines.next().unwrap_or_else(|| panic!("no alert {name}"));
    let indent = first.len() - first.trim_start().len();
    let value = first.trim_start()["expr:".len()..].trim();
    if value != ">-" {
        return value.to_string();
    }
    lines
        .take_while(|l| l.len() - l.trim_start().len() > indent)
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every query of the dashboard's panels, with the dashboard's variables given the
/// values Grafana gives them for "All" (`$pool`: `.*`).
fn dashboard_queries() -> Vec<(String, String)> {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).unwrap();
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36, "schemaVersion");
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "no Prometheus datasource variable"
    );
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{t}");
            let expr = t["expr"].as_str().unwrap().replace("$pool", ".*");
            assert!(
                !expr.contains('$'),
                "a variable the test does not know: {expr}"
            );
            out.push((p["title"].as_str().unwrap().to_string(), expr));
        }
    }
    out
}

#[test]
fn the_alert_rules_pass_promtools_checks_and_unit_tests() {
    let Some(promtool) = promtool() else { return };
    let o = run(Command::new(&promtool)
        .args(["check", "rules"])
        .arg(repo(RULES)));
    assert!(o.status.success(), "{}", dump(&o));
    let found = format!("SUCCESS: {} rules found", alert_names().len());
    assert!(stdout(&o).contains(&found), "{}", dump(&o));
    // The unit tests name the rules file relative to themselves.
    let o = run(Command::new(&promtool)
        .args(["test", "rules", "gpucap-rules.test.yaml"])
        .current_dir(repo("scripts/monitoring")));
    assert!(o.status.success(), "{}", dump(&o));
    // Every alert has a unit test that makes it fire.
    let tests = std::fs::read_to_string(repo(RULES_TEST)).unwrap();
    for name in alert_names() {
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - "
            )),
            "no test makes {name} fire"
        );
    }
}

/// `METHOD PATH` on `addr` over HTTP/1.0: status code and body (reads until the server
/// closes; a read waits at most 60 s).
fn http(addr: &str, path: &str) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut bytes = Vec::new();
    c.read_to_end(&mut bytes).unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{text:?}"));
    (code, body.to_string())
}

/// `s` percent-encoded for a URL's query string.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus's answer to an instant query: its `data.result` (panics on an error).
fn query(addr: &str, q: &str) -> Vec<serde_json::Value> {
    let (code, body) = http(addr, &format!("/api/v1/query?query={}", urlencode(q)));
    assert_eq!(code, 200, "{q}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "{q}: {body}");
    v["data"]["result"].as_array().unwrap().clone()
}

/// A free port on 127.0.0.1 (bound, then let go: Prometheus 2.42 does not say which
/// port it took for `:0`).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `gpucap metrics --listen 127.0.0.1:0 --all` for scratch `s`: the server and its address.
fn metrics_server(s: &Scratch) -> (Killed, String) {
    let log = s.dir.join("metrics.log");
    let mut child = Killed(
        s.gpucap(&["metrics", "--listen", "127.0.0.1:0", "--all"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some((line, _)) = text.split_once('\n') {
            let addr = line
                .strip_prefix("gpucap metrics: serving http://")
                .and_then(|r| r.split_once("/metrics "))
                .map(|(a, _)| a.to_string())
                .unwrap_or_else(|| panic!("first line: {line:?}"));
            return (child, addr);
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("gpucap metrics exited ({status}): {text}");
        }
        assert!(start.elapsed() < PATIENCE, "no address printed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Prometheus on 127.0.0.1 scraping `target` every second and evaluating the rules
/// file every second, its data in scratch `s`: the process and its address.
fn start_prometheus(bin: &Path, s: &Scratch, target: &str) -> (Killed, String) {
    let config = s.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: gpucap\n    static_configs:\n      - targets: ['{target}']\n",
            repo(RULES).display()
        ),
    )
    .unwrap();
    // The port was free a moment ago; another process may take it first: then try
    // another.
    for attempt in 0.. {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = s.dir.join(format!("prometheus-{attempt}.log"));
        let mut child = Killed(
            Command::new(bin)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    s.dir.join(format!("tsdb-{attempt}")).display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .current_dir(&s.dir)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let start = Instant::now();
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                let text = std::fs::read_to_string(&log).unwrap();
                assert!(
                    attempt < 3 && text.contains("address already in use"),
                    "prometheus exited ({status}): {text}"
                );
                break;
            }
            if TcpStream::connect(&addr).is_ok() && http(&addr, "/-/ready").0 == 200 {
                return (child, addr);
            }
            assert!(
                start.elapsed() < PATIENCE,
                "prometheus not ready: {}",
                std::fs::read_to_string(&log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    unreachable!()
}

/// A member of pool `pool` started with `gpucap run OPTIONS --pool POOL -- script STEPS`
/// (cap 1 GiB), holding its memory until killed; returns once it did its steps.
fn member_with(s: &Scratch, pool: &str, tag: &str, options: &[&str], steps: &[&str]) -> Killed {
    let ready = s.dir.join(format!("{tag}.ready"));
    let never = s.dir.join("never");
    let script = script();
    let (touch, wait) = (
        format!("touch:{}", ready.display()),
        format!("wait:{}", never.display()),
    );
    let mut args = vec!["run", "--limit", "1Gi", "--pool", pool];
    args.extend(options);
    args.extend(["--", script.to_str().unwrap()]);
    args.extend(steps);
    args.extend([touch.as_str(), wait.as_str()]);
    let mut child = s
        .gpucap(&args)
        .current_dir(&s.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut child, &ready, &format!("the member {tag}"));
    Killed(child)
}

/// Waits (at most PATIENCE) until `done` returns None; panics with its last Some.
fn await_until(what: &str, mut done: impl FnMut() -> Option<String>) {
    let start = Instant::now();
    loop {
        let Some(why) = done() else { return };
        assert!(start.elapsed() < PATIENCE, "{what}: {why}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn prometheus_answers_every_dashboard_query_and_runs_the_rules() {
    let Some(prometheus) = prometheus() else {
        return;
    };
    let queries = dashboard_queries();
    // A panel shows the ceilings handed down (checked for series below, as every query).
    assert!(
        queries
            .iter()
            .any(|(_, q)| q.contains("gpucap_ceiling_handed_down_bytes")),
        "no panel shows gpucap_ceiling_handed_down_bytes: {queries:#?}"
    );
    let alerts = alert_names();
    let s = Scratch::new("monitoring");
    // A pool with a member holding memory, one with a guarantee and a ceiling, one
    // killed (its bytes held by the dead), and a process capped alone that was refused.
    let _a = member_with(&s, "train", "a", &[], &["alloc:300Mi"]);
    let _b = member_with(
        &s,
        "train",
        "b",
        &["--guarantee", "100Mi", "--ceiling", "512Mi"],
        &["alloc:200Mi"],
    );
    drop(member_with(&s, "train", "c", &[], &["alloc:50Mi"]));
    let _lone = Killed(s.lone("l", &["alloc:30Mi", "alloc:2Gi"]));
    // Held at ceilings handed down: a member of a pool of 1 GiB whose library has a
    // gpucap.env of 256 MiB beside it, holding 250 MiB of it; a process capped alone by
    // HAMi's device plugin's hand-over (512 MiB).
    let _maker = member_with(&s, "shared", "m", &[], &["alloc:10Mi"]);
    let lib = s.library_with_env_file("home", "GPUCAP_LIMIT=256Mi\n");
    let held = Killed(s.preloaded(&lib, "held", &[("GPUCAP_POOL", "shared")], &["alloc:250Mi"]));
    let hami = Killed(s.preloaded(
        &shim(),
        "hami",
        &[("CUDA_DEVICE_MEMORY_LIMIT", "512m")],
        &["alloc:20Mi"],
    ));
    let (_server, target) = metrics_server(&s);
    let (_prom, addr) = start_prometheus(&prometheus, &s, &target);

    // Every panel's query returns series once Prometheus has scraped twice (the
    // increase() and rate() queries need two samples).
    await_until("dashboard queries without series", || {
        let empty: Vec<String> = queries
            .iter()
            .filter(|(_, q)| query(&addr, q).is_empty())
            .map(|(title, q)| format!("{title}: {q}"))
            .collect();
        (!empty.is_empty()).then(|| format!("{empty:#?}"))
    });
    // What the dashboard shows is what the members did: the pool's used is its
    // members' (the dead one's included), the ceiling is the one member's.
    let used = query(&addr, "gpucap_pool_used_bytes{pool=\"train\"}");
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!(used[0]["value"][1], (550u64 << 20).to_string(), "{used:?}");
    let ceilings = query(&addr, "gpucap_member_ceiling_bytes{pool=\"train\"}");
    assert_eq!(ceilings.len(), 1, "{ceilings:?}");
    assert_eq!(ceilings[0]["value"][1], (512u64 << 20).to_string());
    // The ceilings handed down: each process held at one, with where it came from.
    let mut handed: Vec<(String, String, String)> =
        query(&addr, "gpucap_ceiling_handed_down_bytes")
            .iter()
            .map(|r| {
                let m = &r["metric"];
                (
                    m["pid"].as_str().unwrap().to_string(),
                    m["from"].as_str().unwrap().to_string(),
                    r["value"][1].as_str().unwrap().to_string(),
                )
            })
            .collect();
    handed.sort();
    let mut want = vec![
        (
            held.0.id().to_string(),
            "gpucap.env beside the library".to_string(),
            (256u64 << 20).to_string(),
        ),
        (
            hami.0.id().to_string(),
            "HAMi device plugin's hand-over".to_string(),
            (512u64 << 20).to_string(),
        ),
    ];
    want.sort();
    assert_eq!(handed, want);
    // The alerts' expressions on what gpucap exports: the member held at 250 MiB of its
    // 256 MiB ceiling handed down is GpucapAtHandedDownCeiling's (with its source), and
    // not GpucapMemberAtCeiling's although it has a member ceiling of 256 MiB too.
    let at = query(&addr, &alert_expr("GpucapAtHandedDownCeiling"));
    assert_eq!(at.len(), 1, "{at:?}");
    assert_eq!(at[0]["metric"]["pid"], held.0.id().to_string(), "{at:?}");
    assert_eq!(at[0]["metric"]["pool"], "shared", "{at:?}");
    assert_eq!(
        at[0]["metric"]["from"], "gpucap.env beside the library",
        "{at:?}"
    );
    let own = query(&addr, &alert_expr("GpucapMemberAtCeiling"));
    assert_eq!(own, Vec::<serde_json::Value>::new());
    let members = query(
        &addr,
        &format!("gpucap_member_ceiling_bytes{{pid=\"{}\"}}", held.0.id()),
    );
    assert_eq!(members.len(), 1, "{members:?}");

    // The rules file loaded: every alert there, each evaluated without error.
    await_until("rules not loaded healthy", || {
        let (code, body) = http(&addr, "/api/v1/rules");
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let rules: Vec<&serde_json::Value> = v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        let names: Vec<&str> = rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, alerts, "{body}");
        rules
            .iter()
            .any(|r| r["health"] != "ok")
            .then(|| body.clone())
    });

    // A member refused while Prometheus watches: the refusals alert fires for its pool.
    let _d = member_with(&s, "train", "d", &[], &["alloc:2Gi"]);
    await_until("GpucapPoolRefusals not firing for train", || {
        let firing = query(
            &addr,
            "ALERTS{alertname=\"GpucapPoolRefusals\",alertstate=\"firing\"}",
        );
        (!firing.iter().any(|a| a["metric"]["pool"] == "train")).then(|| format!("{firing:?}"))
    });
}
