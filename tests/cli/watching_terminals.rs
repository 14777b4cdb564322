//! `gpucap top` and `status` on the terminals and locales they meet (docs/src/watching.md):
//! a terminal without screen codes (TERM=dumb, no TERM) gets frames one after the other as
//! a pipe does, a locale that is not UTF-8 gets ASCII (`...`); and what root's `top` and
//! `status` say of pools of one name that are different users', and of its own pool
//! directory made writable by others while it holds a pool.
//!
//! `top` runs in a pseudo-terminal made by `script` (util-linux), its raw bytes compared.

use super::common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output};

use common::pool_scratch::*;
use common::*;

fn kill(mut child: Child) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

/// `cmd` run in a pseudo-terminal (`script`), with `TERM` as given (None: unset): what it
/// wrote to the terminal, raw.
fn in_a_terminal(cmd: &Command, term: Option<&str>) -> Output {
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let mut line = quote(cmd.get_program());
    for a in cmd.get_args() {
        line.push(' ');
        line.push_str(&quote(a));
    }
    let mut c = Command::new("script");
    c.args(["-q", "-e", "-c", &line, "/dev/null"]);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    match term {
        Some(t) => c.env("TERM", t),
        None => c.env_remove("TERM"),
    };
    c.env("LANG", "C.UTF-8")
        .env_remove("LC_ALL")
        .env_remove("LC_CTYPE");
    run(&mut c)
}

/// TERM=dumb or no TERM: no screen code, each frame after the last with a blank line
/// between (before: the cursor moved home and the screen was erased, as on xterm).
#[test]
fn top_on_a_terminal_without_screen_codes_writes_frames_one_after_the_other() {
    let s = Scratch::new("terminals-dumb");
    let lone = s.lone("lone", &["alloc:300Mi"]);
    let top = s.gpucap(&["top", "--iterations", "2", "--interval", "0.2"]);
    let xterm = in_a_terminal(&top, Some("xterm"));
    let dumb = in_a_terminal(&top, Some("dumb"));
    let unset = in_a_terminal(&top, None);
    kill(lone);
    // On xterm the screen is redrawn: the pseudo-terminal is one.
    assert!(stdout(&xterm).contains("\x1b[H"), "{}", dump(&xterm));
    for o in [&dumb, &unset] {
        assert_ok(o);
        let text = stdout(o);
        assert!(!text.contains('\x1b'), "a screen code\n{text:?}");
        let titles: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpucap top "))
            .collect();
        assert_eq!(titles.len(), 2, "{text}");
        assert!(
            text.contains("\n\r\ngpucap top ") || text.contains("\n\ngpucap top "),
            "{text:?}"
        );
        // Still fitted to the window (80 columns, the last left empty).
        for l in text.lines() {
            assert!(l.trim_end_matches('\r').chars().count() < 80, "{l:?}");
        }
    }
}

/// LC_ALL=C (or LANG=C, or nothing set): a cut command ends in `...`, and nothing written
/// is past ASCII; a UTF-8 locale keeps `…`.
#[test]
fn a_locale_that_is_not_utf8_gets_ascii() {
    let s = Scratch::new("terminals-ascii");
    let lone = s.lone("lone-with-a-long-command", &["alloc:300Mi"]);
    let runs: Vec<(&str, Output)> = [
        ("utf8", vec![("LANG", "en_US.UTF-8")]),
        ("lc_all", vec![("LANG", "C.UTF-8"), ("LC_ALL", "C")]),
        ("lang", vec![("LANG", "C")]),
    ]
    .into_iter()
    .flat_map(|(tag, vars)| {
        [&["status"][..], &["top", "--once"]].map(|args| {
            let mut c = s.gpucap(args);
            c.env_remove("LC_ALL")
                .env_remove("LC_CTYPE")
                .env_remove("LANG");
            c.envs(vars.iter().copied());
            (tag, run(&mut c))
        })
    })
    .collect();
    kill(lone);
    for (tag, o) in &runs {
        assert_ok(o);
        let text = stdout(o);
        if *tag == "utf8" {
            assert!(text.contains('…'), "{tag}\n{text}");
        } else {
            assert!(text.is_ascii(), "{tag}\n{text}");
            assert!(text.contains("..."), "{tag}\n{text}");
        }
    }
}

/// Root's pool `train` and uid 65534's own `train` (a copy of root's file, owned by it):
/// `top --pool train` shows root's only, `--pool PATH` that file's only, as `status
/// --pool` does (before: both, "2 pools", two `pool train GPU 0:` lines); the overview
/// says whose each `train` is.
#[test]
fn root_sees_one_pool_when_it_names_one_and_whose_when_names_are_shared() {
    if !as_root("reading another user's pool") {
        return;
    }
    let s = Scratch::new("terminals-shared-name");
    let member = s.member("train", "m", &["alloc:200Mi"]);
    let (_, their_file) = s.copy_as_nobody("train", "gpucap-65534", "train.pool");
    let named = run(&mut s.gpucap(&["top", "--once", "--pool", "train"]));
    let by_path = run(&mut s.gpucap(&["top", "--once", "--pool", their_file.to_str().unwrap()]));
    let all = run(&mut s.gpucap(&["top", "--once"]));
    let status = run(s.gpucap(&["status"]).env("COLUMNS", "200"));
    kill(member);
    for o in [&named, &by_path] {
        assert_ok(o);
        let text = stdout(o);
        assert!(text.contains(" 1 pool "), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.starts_with("pool train")).count(),
            1,
            "{text}"
        );
        assert!(
            !text.contains("(nobody)") && !text.contains("(65534)"),
            "{text}"
        );
    }
    let root_rows = |text: &str| text.lines().filter(|l| l.contains(" root ")).count();
    assert_eq!(root_rows(&stdout(&named)), 1, "{}", stdout(&named));
    assert_eq!(root_rows(&stdout(&by_path)), 0, "{}", stdout(&by_path));
    for o in [&all, &status] {
        assert_ok(o);
        let text = stdout(o);
        assert!(text.contains("\npool train (root) GPU 0: "), "{text}");
        let user = user_name(65534);
        assert!(
            text.contains(&format!("\npool train ({user}) GPU 0: ")),
            "{text}"
        );
    }
}

/// Root's own pool directory made writable by others while a member of its pool runs:
/// the line says so, and that what it holds is shown all the same, as it is (before:
/// "cannot read the pool directory …", its member listed above it).
#[test]
fn roots_own_directory_writable_by_others_is_read_and_said() {
    if !as_root("root's own pool directory") {
        return;
    }
    let s = Scratch::new("terminals-777");
    let member = s.member("train", "m", &["alloc:200Mi"]);
    let dir = s.pool_file("train").parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let outputs = [
        run(&mut s.gpucap(&["status"])),
        run(&mut s.gpucap(&["top", "--once"])),
        run(&mut s.gpucap(&["status", "--json"])),
    ];
    let pid = member.id();
    kill(member);
    for o in &outputs {
        assert_ok(o);
        let text = stdout(o);
        assert!(
            text.contains(&format!(" {pid} ")) || text.contains(&format!("\"pid\":{pid}")),
            "{text}"
        );
        assert!(!text.contains("cannot read"), "{text}");
        assert!(text.contains(dir.to_str().unwrap()), "{text}");
        assert!(text.contains("shown all the same"), "{text}");
    }
}
