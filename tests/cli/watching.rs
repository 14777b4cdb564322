//! Watching every capped process: a process capped on its own (no pool) shows in
//! `gpucap status` and `gpucap top` beside a pool's members (its `.lone` file, gone when
//! it exits, ignored and removed once it died), a member held at a ceiling handed down
//! marked in every view of its pool, and `top` in a real terminal (tmux) at
//! 80×24 and 200×50, resized between the two.
//!
//! Processes are tests/c/script.c started with `gpucap run` on the fake GPU, in a
//! scratch pool directory (GPUCAP_POOL_DIR).

use super::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use common::pool_scratch::*;
use common::*;

const MIB: u64 = 1 << 20;

/// Children killed when dropped, even when a test fails first.
struct Killed(Vec<u32>);

impl Drop for Killed {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill on our own children's pids (at worst already reaped: ESRCH).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

fn kill(mut child: Child) -> Output {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    child.wait_with_output().unwrap()
}

/// The `.lone` files of the scratch's pool directory.
fn lone_files(s: &Scratch) -> Vec<PathBuf> {
    let dir = s.pool_file("x").parent().unwrap().to_path_buf();
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "lone"))
                .collect()
        })
        .unwrap_or_default()
}

/// The row of `pid` in a table (its second word is the pid).
fn row(text: &str, pid: u32) -> &str {
    text.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("no row for pid {pid} in\n{text}"))
}

#[test]
fn a_lone_process_and_a_pool_member_show_in_status_and_top() {
    let s = Scratch::new("watch-status");
    let lone = s.lone("lone", &["alloc:300Mi", "alloc:900Mi"]);
    let member = s.member("train", "member", &["alloc:200Mi"]);
    let (pl, pm) = (lone.id(), member.id());
    let _guard = Killed(vec![pl, pm]);

    // `status` with no pool: one table, 80 columns, both processes; PEAK gone so that
    // each command keeps 16 characters.
    let o = run(&mut s.gpucap(&["status"]));
    assert_ok(&o);
    let text = stdout(&o);
    for l in text.lines() {
        assert!(l.chars().count() <= 80, "{l:?} wider than 80\n{text}");
    }
    let header = text.lines().next().unwrap();
    let words: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        words,
        [
            "GPU", "PID", "USER", "POOL", "CAP", "USED", "USE%", "FREE", "REFUSED", "COMMAND"
        ],
        "{text}"
    );
    assert!(row(&text, pl).contains("script alloc:300"), "{text}");
    assert!(!text.contains("GPU-"), "no UUID unless asked\n{text}");
    // At 100 columns PEAK is back: the figures.
    let o = run(s.gpucap(&["status"]).env("COLUMNS", "100"));
    assert_ok(&o);
    let text = stdout(&o);
    let rl = row(&text, pl);
    let cols: Vec<&str> = rl.split_whitespace().collect();
    // GPU 0, the pid, the user, no pool, its cap, use, share, room, peak, one refusal.
    assert_eq!(cols[0], "0", "{text}");
    assert_eq!(
        &cols[3..10],
        ["-", "1.00Gi", "300Mi", "29%", "724Mi", "300Mi", "1"],
        "{text}"
    );
    assert!(rl.contains(" script "), "{text}");
    let rm = row(&text, pm);
    let cols: Vec<&str> = rm.split_whitespace().collect();
    assert_eq!(
        &cols[3..10],
        ["train", "1.00Gi", "200Mi", "19%", "824Mi", "200Mi", "-"],
        "{text}"
    );
    assert!(
        text.contains("\npool train GPU 0: 200Mi/1.00Gi used"),
        "{text}"
    );

    // --uuid adds the GPU's UUID.
    let o = run(s.gpucap(&["status", "--uuid"]).env("COLUMNS", "120"));
    assert!(stdout(&o).contains("GPU-"), "{}", dump(&o));

    // --json: every process, with its figures in bytes.
    let o = run(&mut s.gpucap(&["status", "--json"]));
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let p = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pl)
        .unwrap_or_else(|| panic!("{doc}"));
    assert_eq!(p["pool"], serde_json::Value::Null);
    assert_eq!(
        (p["used"].as_u64(), p["cap"].as_u64()),
        (Some(300 * MIB), Some(1 << 30))
    );
    assert_eq!(p["refusals"], 1);
    assert_eq!(p["gpu"], 0);
    assert!(p["gpu_uuid"].as_str().unwrap().starts_with("GPU-"));
    assert_eq!(doc["lone"][0]["gpus"][0]["largest_refused"], 900 * MIB);
    assert_eq!(doc["pools"][0]["name"], "train");
    let m = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pm)
        .unwrap();
    assert_eq!(
        (m["pool"].as_str(), m["used"].as_u64()),
        (Some("train"), Some(200 * MIB))
    );

    // top --once: both, with bars; --pool and --user choose; --sort orders.
    let o = run(&mut s.gpucap(&["top", "--once"]));
    assert_ok(&o);
    let text = stdout(&o);
    assert!(!text.contains('\x1b'), "{text}");
    assert!(row(&text, pl).contains("[|"), "a bar\n{text}");
    row(&text, pm);
    let other = s.member("other", "other", &["alloc:10Mi"]);
    let o = run(&mut s.gpucap(&["top", "--once"]));
    assert!(stdout(&o).contains("pool other "), "{}", dump(&o));
    let o = run(&mut s.gpucap(&["top", "--once", "--pool", "train"]));
    assert!(!stdout(&o).contains(&format!(" {pl} ")), "{}", dump(&o));
    row(&stdout(&o), pm);
    // The pool lines are filtered as the rows are: the pool chosen's only.
    assert!(stdout(&o).contains("pool train "), "{}", dump(&o));
    assert!(!stdout(&o).contains("pool other"), "{}", dump(&o));
    assert!(stdout(&o).contains(", 1 pool "), "{}", dump(&o));
    let o = run(&mut s.gpucap(&["top", "--once", "--user", "nobody-here"]));
    assert!(!stdout(&o).contains(" script "), "{}", dump(&o));
    assert!(!stdout(&o).contains("pool train"), "{}", dump(&o));
    let _ = kill(other);
    let o = run(&mut s.gpucap(&["top", "--once", "--sort", "pid"]));
    let text = stdout(&o);
    let (a, b) = (
        text.find(row(&text, pl)).unwrap(),
        text.find(row(&text, pm)).unwrap(),
    );
    assert_eq!(a < b, pl < pm, "sorted by pid\n{text}");

    let _ = kill(member);
    let _ = kill(lone);
}

#[test]
fn a_member_held_at_a_ceiling_handed_down_is_marked_in_every_view_of_its_pool() {
    let s = Scratch::new("watch-handed-down");
    // A pool of 1 GiB (its maker's cap), joined by a process whose library has a
    // gpucap.env of 256 MiB beside it: it is held at that ceiling.
    let maker = s.member("train", "maker", &["alloc:100Mi"]);
    let lib = s.library_with_env_file("home", "GPUCAP_LIMIT=256Mi\n");
    let held = s.preloaded(&lib, "held", &[("GPUCAP_POOL", "train")], &["alloc:50Mi"]);
    let (pm, ph) = (maker.id(), held.id());
    let _guard = Killed(vec![pm, ph]);
    let note = format!("^ the cap is a ceiling from gpucap.env beside the library (pid {ph})");

    // status --pool: the member's ceiling marked, the line under the members.
    let o = run(&mut s.gpucap(&["status", "--pool", "train"]));
    assert_ok(&o);
    let text = stdout(&o);
    let member_row = |pid: u32| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no row for pid {pid} in\n{text}"))
    };
    assert!(member_row(ph).contains(" 256 MiB^ "), "{text}");
    assert!(!member_row(pm).contains('^'), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("^ "))
            .collect::<Vec<_>>(),
        [note.as_str()],
        "{text}"
    );
    // Its JSON says where from, per GPU.
    let o = run(&mut s.gpucap(&["status", "--pool", "train", "--json"]));
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let from = |pid: u32| {
        doc["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["pid"] == pid)
            .unwrap_or_else(|| panic!("{doc}"))["gpus"][0]["ceiling_from"]
            .clone()
    };
    assert_eq!(from(ph), "gpucap.env beside the library", "{doc}");
    assert_eq!(from(pm), serde_json::Value::Null, "{doc}");
    // status and top, of every pool and of this one: the cap marked, the same line.
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["top", "--once"],
        &["top", "--once", "--pool", "train"],
    ] {
        let o = run(s.gpucap(args).env("COLUMNS", "120"));
        assert_ok(&o);
        let text = stdout(&o);
        if args.contains(&"--json") {
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
            let p = doc["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["pid"] == ph)
                .unwrap_or_else(|| panic!("{doc}"));
            assert_eq!(
                (p["cap"].as_u64(), p["ceiling_from"].as_str()),
                (Some(256 * MIB), Some("gpucap.env beside the library")),
                "{doc}"
            );
            continue;
        }
        assert!(row(&text, ph).contains(" 256Mi^ "), "{args:?}\n{text}");
        assert!(!row(&text, pm).contains('^'), "{args:?}\n{text}");
        assert!(text.lines().any(|l| l == note), "{args:?}\n{text}");
    }
    // `pool set` may lower that ceiling, never raise it: the process holds itself to it
    // whatever the pool file says, so the views would show a figure that does not hold.
    let ceiling_shown = || {
        let o = run(&mut s.gpucap(&["status", "--pool", "train", "--json"]));
        let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let m = doc["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["pid"] == ph)
            .unwrap()
            .clone();
        m["gpus"][0]["ceiling"].as_u64()
    };
    let pid = ph.to_string();
    for raise in ["512Mi", "none"] {
        let o = run(&mut s.gpucap(&["pool", "set", "train", &pid, "--ceiling", raise]));
        assert_eq!(o.status.code(), Some(1), "{raise}: {}", dump(&o));
        assert!(
            stderr(&o).contains(&format!(
                "pid {ph} not changed: its ceiling, 256 MiB, was handed down to it by gpucap.env \
                 beside the library, which nothing raises"
            )),
            "{raise}: {}",
            dump(&o)
        );
        assert_eq!(ceiling_shown(), Some(256 * MIB), "{raise}");
    }
    let o = run(&mut s.gpucap(&["pool", "set", "train", &pid, "--ceiling", "128Mi"]));
    assert_ok(&o);
    assert_eq!(ceiling_shown(), Some(128 * MIB));
    let _ = kill(held);
    let _ = kill(maker);
}

#[test]
fn a_lone_process_file_goes_when_it_exits_or_dies() {
    let s = Scratch::new("watch-gone");
    // Exits: its file is removed at exit.
    let script = script();
    let o = run(&mut s.gpucap(&[
        "run",
        "--limit",
        "1Gi",
        "--",
        script.to_str().unwrap(),
        "alloc:1Mi",
    ]));
    assert_ok(&o);
    assert_eq!(lone_files(&s), Vec::<PathBuf>::new());
    // Killed: its file stays until a reader finds nobody holds it, then is removed.
    let a = s.lone("a", &["alloc:64Mi"]);
    let pid = a.id();
    assert_eq!(lone_files(&s).len(), 1);
    let o = run(&mut s.gpucap(&["status"]));
    row(&stdout(&o), pid);
    let _ = kill(a);
    assert_eq!(
        lone_files(&s).len(),
        1,
        "a killed process cannot remove its file"
    );
    let o = run(&mut s.gpucap(&["status"]));
    assert_ok(&o);
    assert!(
        stdout(&o).starts_with("no capped process"),
        "a dead process is not shown\n{}",
        dump(&o)
    );
    assert_eq!(
        lone_files(&s),
        Vec::<PathBuf>::new(),
        "the reader removed it"
    );
}

/// A tmux server of its own (its socket in the scratch directory).
struct Tmux {
    socket: PathBuf,
    bin: PathBuf,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        let o = Command::new(&self.bin)
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "tmux {args:?}\n{}", dump(&o));
        o
    }

    /// [`cmd`](Self::cmd), None when tmux fails.
    fn try_cmd(&self, args: &[&str]) -> Option<Output> {
        let o = Command::new(&self.bin)
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        o.status.success().then_some(o)
    }

    /// Waits (at most 60 s: a harness limit, not a timing assertion) for a screen
    /// `ready` accepts: wrapped lines joined (`-J`), so a line the program wrapped
    /// shows wider than the window.
    fn wait_for(&self, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let Some(o) = self.try_cmd(&["capture-pane", "-p", "-J", "-t", "w"]) else {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "tmux never answered"
                );
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let s = stdout(&o);
            if ready(&s) {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "never ready:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin)
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// A shell script that runs `cmd` with its environment.
fn script_of(cmd: &Command, path: &Path) {
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let mut text = String::from("#!/bin/sh\nexec env");
    // env's options (-u NAME) before its assignments: after one, `-u` would be the command.
    for (k, v) in cmd.get_envs() {
        if v.is_none() {
            text.push_str(&format!(" -u {}", k.to_string_lossy()));
        }
    }
    for (k, v) in cmd.get_envs().filter_map(|(k, v)| Some((k, v?))) {
        text.push_str(&format!(" {}={}", k.to_string_lossy(), quote(v)));
    }
    text.push(' ');
    text.push_str(&quote(cmd.get_program()));
    for a in cmd.get_args() {
        text.push(' ');
        text.push_str(&quote(a));
    }
    // The pane stays when the command ends, saying how: a failure is on the screen.
    text = text.replacen("exec env", "env", 1);
    text.push_str("\necho \"gpucap top exited with status $?\"\nsleep 600\n");
    std::fs::write(path, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// What every screen of `top` must be at `width`: no line wider (none wrapped), the
/// header's words whole, both processes' rows, a bar.
fn check_screen(screen: &str, width: usize, pids: [u32; 2]) {
    for l in screen.lines() {
        assert!(
            l.chars().count() <= width,
            "{l:?} wider than {width}\n{screen}"
        );
    }
    let header = screen
        .lines()
        .find(|l| l.trim_start().starts_with("GPU ") && l.contains("PID"))
        .unwrap_or_else(|| panic!("no header\n{screen}"));
    const WORDS: [&str; 13] = [
        "GPU", "UUID", "PID", "USER", "POOL", "CAP", "USED", "USED/CAP", "USE%", "FREE", "PEAK",
        "REFUSED", "COMMAND",
    ];
    for w in header.split_whitespace() {
        assert!(WORDS.contains(&w), "header word {w:?} is cut\n{screen}");
    }
    for p in pids {
        row(screen, p);
    }
    assert!(screen.contains("[|"), "no bar\n{screen}");
}

#[test]
fn top_in_a_real_terminal_fits_80x24_and_200x50_and_follows_a_resize() {
    let Some(bin) = checker_tool(
        "GPUCAP_TEST_TMUX",
        "tmux",
        "gpucap top is checked in a real terminal; scripts/test.sh installs tmux with apt-get",
    ) else {
        return;
    };
    let s = Scratch::new("watch-tmux");
    let lone = s.lone("lone", &["alloc:300Mi"]);
    let member = s.member("a-pool-with-a-long-name", "member", &["alloc:200Mi"]);
    let pids = [lone.id(), member.id()];
    let _guard = Killed(pids.to_vec());
    let mut top = s.gpucap(&["top", "--interval", "0.2"]);
    top.env("LANG", "C.UTF-8");
    let launcher = s.dir.join("top.sh");
    script_of(&top, &launcher);
    // A short socket path (a socket's path has at most 107 bytes; the scratch
    // directory may be deep).
    let t = Tmux {
        socket: std::env::temp_dir().join(format!("gpucap-tmux-{}", std::process::id())),
        bin,
    };
    t.cmd(&[
        "-u",
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "w",
        "-x",
        "80",
        "-y",
        "24",
        launcher.to_str().unwrap(),
    ]);
    let has_rows =
        |sc: &str| sc.contains("COMMAND") && pids.iter().all(|p| sc.contains(&format!(" {p} ")));
    let small = t.wait_for(has_rows);
    check_screen(&small, 80, pids);
    assert!(small.lines().count() <= 24, "{small}");
    assert!(
        !small.contains("PEAK"),
        "PEAK is the first column to go at 80\n{small}"
    );
    // Each command keeps 16 characters: the processes can be told apart.
    for (p, command) in pids.iter().zip(["script alloc:300", "script alloc:200"]) {
        assert!(row(&small, *p).contains(command), "{command}\n{small}");
    }

    t.cmd(&["resize-window", "-t", "w", "-x", "200", "-y", "50"]);
    let big = t.wait_for(|sc| has_rows(sc) && sc.contains("PEAK"));
    check_screen(&big, 200, pids);
    assert!(
        big.lines().any(|l| l.chars().count() > 80),
        "the rows use the width\n{big}"
    );

    t.cmd(&["resize-window", "-t", "w", "-x", "80", "-y", "24"]);
    let again = t.wait_for(|sc| has_rows(sc) && !sc.contains("PEAK"));
    check_screen(&again, 80, pids);

    let _ = kill(member);
    let _ = kill(lone);
}
