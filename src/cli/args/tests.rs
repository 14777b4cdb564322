//! Unit tests of the command-line parser.

use super::super::help::help;
use super::*;
use crate::top::select::SortKey;
use std::os::unix::ffi::OsStringExt;

fn p(args: &[&str]) -> Result<Command, UsageError> {
    parse(args.iter().map(OsString::from))
}

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn run(limit: Option<&str>, log: Option<&str>, program: &str, args: &[&str]) -> Command {
    Command::Run {
        overrides: Overrides {
            limit: limit.map(String::from),
            log: log.map(String::from),
            ..Overrides::default()
        },
        measure: false,
        program: program.into(),
        args: os(args),
    }
}

fn err(args: &[&str]) -> UsageError {
    p(args).expect_err(&format!("{args:?}"))
}

#[test]
fn run_forms() {
    assert_eq!(
        p(&["run", "python", "x.py"]),
        Ok(run(None, None, "python", &["x.py"]))
    );
    assert_eq!(
        p(&[
            "run", "--limit", "8Gi", "--log", "debug", "python", "-m", "t"
        ]),
        Ok(run(Some("8Gi"), Some("debug"), "python", &["-m", "t"]))
    );
    assert_eq!(
        p(&["run", "--limit=0=8Gi,1=50%", "--log=info", "--", "./a.out"]),
        Ok(run(Some("0=8Gi,1=50%"), Some("info"), "./a.out", &[]))
    );
    // Options after CMD belong to CMD.
    assert_eq!(
        p(&["run", "prog", "--limit", "1Gi", "--"]),
        Ok(run(None, None, "prog", &["--limit", "1Gi", "--"]))
    );
    // After --, a leading dash is CMD's.
    assert_eq!(
        p(&["run", "--", "-weird", "a"]),
        Ok(run(None, None, "-weird", &["a"]))
    );
    // An empty --limit value is passed on, for config to reject with its message.
    assert_eq!(
        p(&["run", "--limit=", "x"]),
        Ok(run(Some(""), None, "x", &[]))
    );
    // A value that looks like an option is still the value.
    assert_eq!(
        p(&["run", "--log", "-x", "y"]),
        Ok(run(None, Some("-x"), "y", &[]))
    );
}

#[test]
fn run_takes_a_guarantee_and_a_ceiling() {
    let Ok(Command::Run { overrides, .. }) = p(&[
        "run",
        "--pool",
        "p",
        "--guarantee",
        "4Gi",
        "--ceiling=0=6Gi,1=50%",
        "nb",
    ]) else {
        panic!("not a run");
    };
    assert_eq!(overrides.guarantee.as_deref(), Some("4Gi"));
    assert_eq!(overrides.ceiling.as_deref(), Some("0=6Gi,1=50%"));
    assert!(overrides.vars().contains(&("GPUCAP_GUARANTEE", "4Gi")));
    assert!(
        overrides
            .vars()
            .contains(&("GPUCAP_CEILING", "0=6Gi,1=50%"))
    );
    assert!(
        err(&["run", "--guarantee", "1Gi", "--guarantee", "2Gi", "x"])
            .message
            .contains("more than once")
    );
    assert!(
        err(&["status", "--guarantee", "1Gi"])
            .message
            .contains("unknown option")
    );
}

#[test]
fn run_passes_non_utf8_arguments() {
    let bad = OsString::from_vec(b"caf\xe9".to_vec());
    let args = vec![OsString::from("run"), OsString::from("echo"), bad.clone()];
    assert_eq!(
        parse(args),
        Ok(Command::Run {
            overrides: Overrides::default(),
            measure: false,
            program: "echo".into(),
            args: vec![bad.clone()],
        })
    );
    let args = vec![OsString::from("run"), OsString::from("--limit"), bad];
    assert!(parse(args).unwrap_err().message.contains("not valid UTF-8"));
}

#[test]
fn run_errors() {
    let e = err(&["run"]);
    assert_eq!(e.topic, Topic::Run);
    assert!(e.message.contains("no command to run"));
    assert!(err(&["run", "--"]).message.contains("no command to run"));
    assert!(
        err(&["run", "--limit", "8Gi"])
            .message
            .contains("no command to run")
    );
    assert!(
        err(&["run", "--limit"])
            .message
            .contains("--limit needs a value")
    );
    assert!(
        err(&["run", "--log"])
            .message
            .contains("--log needs a value")
    );
    assert_eq!(
        err(&["run", "--lmit", "8Gi", "x"]).message,
        "unknown option '--lmit' (did you mean --limit?)"
    );
    assert_eq!(
        err(&["run", "--lmit=8Gi", "x"]).message,
        "unknown option '--lmit' (did you mean --limit?)"
    );
    assert_eq!(
        err(&["run", "-l", "8Gi", "x"]).message,
        "unknown option '-l'"
    );
    assert!(
        err(&["run", "--limit", "1Gi", "--limit", "2Gi", "x"])
            .message
            .contains("more than once")
    );
    assert!(err(&["run", ""]).message.contains("empty"));
}

#[test]
fn check_forms() {
    assert_eq!(
        p(&["check"]),
        Ok(Command::Check {
            overrides: Overrides::default(),
            write_env: None,
        })
    );
    assert_eq!(
        p(&["check", "--limit", "50%", "--log=off"]),
        Ok(Command::Check {
            overrides: Overrides {
                limit: Some("50%".into()),
                log: Some("off".into()),
                ..Overrides::default()
            },
            write_env: None,
        })
    );
    assert_eq!(p(&["check", "--help"]), Ok(Command::Help(Topic::Check)));
    let e = err(&["check", "extra"]);
    assert_eq!(e.topic, Topic::Check);
    assert!(e.message.contains("unexpected argument 'extra'"));
    assert_eq!(
        err(&["check", "--bogus"]).message,
        "unknown option '--bogus'"
    );
    assert!(err(&["check", "--limit"]).message.contains("needs a value"));
}

#[test]
fn help_and_version() {
    assert_eq!(p(&["--help"]), Ok(Command::Help(Topic::General)));
    assert_eq!(p(&["-h"]), Ok(Command::Help(Topic::General)));
    assert_eq!(p(&["help"]), Ok(Command::Help(Topic::General)));
    assert_eq!(p(&["help", "run"]), Ok(Command::Help(Topic::Run)));
    assert_eq!(p(&["help", "check"]), Ok(Command::Help(Topic::Check)));
    assert_eq!(p(&["run", "-h"]), Ok(Command::Help(Topic::Run)));
    assert_eq!(
        p(&["run", "--limit", "1Gi", "--help"]),
        Ok(Command::Help(Topic::Run))
    );
    // A command's --help takes nothing after it either, as gpucap --help.
    let e = err(&["run", "--limit", "1Gi", "--help", "x"]);
    assert_eq!(e.topic, Topic::Run);
    assert_eq!(
        e.message,
        "unexpected argument 'x' after --help (it takes no arguments)"
    );
    assert_eq!(p(&["--version"]), Ok(Command::Version));
    assert_eq!(p(&["-V"]), Ok(Command::Version));
    assert_eq!(p(&["version"]), Ok(Command::Version));
    // Nothing may follow them: a typo is an error, not ignored.
    for args in [
        &["--version", "--bogus"][..],
        &["-V", "x"],
        &["version", "--bogus"],
        &["--help", "--bogus"],
        &["-h", "run"],
    ] {
        let e = err(args);
        assert_eq!(e.topic, Topic::General);
        assert!(
            e.message.starts_with(&format!(
                "unexpected argument '{}' after {}",
                args[1], args[0]
            )),
            "{args:?}: {}",
            e.message
        );
    }
    assert!(
        err(&["help", "nope"])
            .message
            .contains("no help for 'nope'")
    );
    assert!(
        err(&["help", "run", "x"])
            .message
            .contains("unexpected argument")
    );
}

#[test]
fn top_level_errors() {
    assert_eq!(err(&[]).message, "no command given");
    assert!(
        err(&["frobnicate"])
            .message
            .starts_with("unknown command 'frobnicate'")
    );
    assert_eq!(
        err(&["stauts"]).message,
        "unknown command 'stauts' (did you mean status?)"
    );
    assert!(
        err(&["--limit", "8Gi"])
            .message
            .starts_with("unknown option '--limit' (options go")
    );
    assert_eq!(err(&["-x"]).message, "unknown option '-x'");
}

#[test]
fn overrides_vars() {
    let o = Overrides {
        limit: Some("8Gi".into()),
        ..Overrides::default()
    };
    assert_eq!(o.vars(), vec![("GPUCAP_LIMIT", "8Gi")]);
    let o = Overrides {
        growth: true,
        report: Some("/r.json".into()),
        ..Overrides::default()
    };
    assert_eq!(
        o.vars(),
        vec![("GPUCAP_GROWTH", "1"), ("GPUCAP_REPORT", "/r.json")]
    );
    assert!(Overrides::default().vars().is_empty());
}

#[test]
fn growth_report_measure_flags() {
    assert_eq!(
        p(&[
            "run",
            "--growth",
            "--report",
            "/r-%p.json",
            "--measure",
            "--",
            "x",
            "--growth"
        ]),
        Ok(Command::Run {
            overrides: Overrides {
                growth: true,
                report: Some("/r-%p.json".into()),
                ..Overrides::default()
            },
            measure: true,
            program: "x".into(),
            args: os(&["--growth"]),
        })
    );
    assert!(matches!(
        p(&["run", "--report=r.json", "x"]),
        Ok(Command::Run { overrides: Overrides { report: Some(r), .. }, .. }) if r == "r.json"
    ));
    assert_eq!(
        err(&["run", "--growth=1", "x"]).message,
        "--growth takes no value"
    );
    assert!(
        err(&["run", "--measure", "--measure", "x"])
            .message
            .contains("more than once")
    );
    assert!(
        err(&["run", "--report"])
            .message
            .contains("--report needs a value: --report PATH")
    );
    // --measure is run's; --write-env is check's.
    assert_eq!(
        err(&["check", "--measure"]).message,
        "unknown option '--measure'"
    );
    assert_eq!(
        err(&["run", "--write-env", "f", "x"]).message,
        "unknown option '--write-env'"
    );
    assert_eq!(
        p(&["check", "--growth", "--write-env", "/g/gpucap.env"]),
        Ok(Command::Check {
            overrides: Overrides {
                growth: true,
                ..Overrides::default()
            },
            write_env: Some("/g/gpucap.env".into()),
        })
    );
    assert!(matches!(
        p(&["check", "--write-env=/a=b"]),
        Ok(Command::Check { write_env: Some(f), .. }) if f == "/a=b"
    ));
    assert!(
        err(&["check", "--write-env"])
            .message
            .contains("needs a value")
    );
    assert!(
        err(&["check", "--write-env="])
            .message
            .contains("needs a file name")
    );
}

#[test]
fn status_and_top_forms() {
    assert_eq!(
        p(&["status"]),
        Ok(Command::Status {
            pool: None,
            json: false,
            uuid: false,
            all: false
        })
    );
    assert_eq!(
        p(&["status", "--pool", "train", "--json"]),
        Ok(Command::Status {
            pool: Some("train".into()),
            json: true,
            uuid: false,
            all: false
        })
    );
    assert_eq!(
        p(&["status", "--pool=/dev/shm/x.pool"]),
        Ok(Command::Status {
            pool: Some("/dev/shm/x.pool".into()),
            json: false,
            uuid: false,
            all: false
        })
    );
    assert_eq!(p(&["status", "-h"]), Ok(Command::Help(Topic::Status)));
    assert_eq!(p(&["help", "status"]), Ok(Command::Help(Topic::Status)));
    assert_eq!(p(&["help", "top"]), Ok(Command::Help(Topic::Top)));
    assert_eq!(
        p(&["top"]),
        Ok(Command::Top {
            pool: None,
            interval_ms: 1000,
            iterations: None,
            user: None,
            sort: SortKey::Used,
            uuid: false,
            once: false
        })
    );
    assert_eq!(
        p(&["top", "--interval", "0.2", "--iterations=3", "--pool", "p"]),
        Ok(Command::Top {
            pool: Some("p".into()),
            interval_ms: 200,
            iterations: Some(3),
            user: None,
            sort: SortKey::Used,
            uuid: false,
            once: false
        })
    );
    assert_eq!(
        p(&["top", "--interval=60"]),
        Ok(Command::Top {
            pool: None,
            interval_ms: 60_000,
            iterations: None,
            user: None,
            sort: SortKey::Used,
            uuid: false,
            once: false
        })
    );
    assert_eq!(p(&["top", "--help"]), Ok(Command::Help(Topic::Top)));
    // A user top could show: a uid, or a name in /etc/passwd.
    assert!(p(&["top", "--user", "1000"]).is_ok());
    for bad in ["", "no-such-user-here", "99999999999"] {
        assert!(p(&["top", "--user", bad]).is_err(), "{bad:?}");
    }
    assert_eq!(
        p(&["top", "--once", "--sort", "peak", "--user=root", "--uuid"]),
        Ok(Command::Top {
            pool: None,
            interval_ms: 1000,
            iterations: None,
            user: Some("root".into()),
            sort: SortKey::Peak,
            uuid: true,
            once: true
        })
    );
    assert_eq!(
        p(&["status", "--uuid"]),
        Ok(Command::Status {
            pool: None,
            json: false,
            uuid: true,
            all: false
        })
    );
    let e = err(&["top", "--sort", "size"]);
    assert!(
        e.message.starts_with("invalid --sort \"size\": used, peak"),
        "{}",
        e.message
    );
    let e = err(&["top", "--once", "--iterations", "2"]);
    assert!(
        e.message
            .starts_with("--once and --iterations exclude each other"),
        "{}",
        e.message
    );
    assert!(
        err(&["status", "--once"])
            .message
            .contains("unknown option '--once'")
    );
}

#[test]
fn status_and_top_errors() {
    for bad in ["0", "0.1", "61", "abc", "", "-1", "nan", "inf", "1s"] {
        let e = err(&["top", "--interval", bad]);
        assert_eq!(e.topic, Topic::Top);
        assert!(
            e.message
                .starts_with(&format!("invalid --interval {bad:?}"))
                && e.message.contains("from 0.2 to 60"),
            "{bad}: {}",
            e.message
        );
    }
    assert!(
        err(&["top", "--interval"])
            .message
            .contains("needs a value")
    );
    for bad in ["0", "-2", "x", "1.5"] {
        assert!(
            err(&["top", "--iterations", bad])
                .message
                .starts_with(&format!("invalid --iterations {bad:?}")),
            "{bad}"
        );
    }
    assert!(
        err(&["top", "--iterations", "1", "--iterations", "2"])
            .message
            .contains("more than once")
    );
    let e = err(&["status", "--bogus"]);
    assert_eq!(
        (e.topic, e.message.as_str()),
        (Topic::Status, "unknown option '--bogus'")
    );
    // Each command has its own options.
    assert_eq!(
        err(&["status", "--interval", "1"]).message,
        "unknown option '--interval'"
    );
    assert_eq!(err(&["top", "--json"]).message, "unknown option '--json'");
    assert_eq!(
        err(&["status", "--limit", "1Gi"]).message,
        "unknown option '--limit'"
    );
    assert_eq!(
        err(&["top", "--growth"]).message,
        "unknown option '--growth'"
    );
    assert_eq!(
        err(&["run", "--json", "x"]).message,
        "unknown option '--json'"
    );
    assert_eq!(
        err(&["status", "extra"]).message,
        "unexpected argument 'extra' (status takes only options)"
    );
    assert_eq!(
        err(&["top", "--"]).message,
        "unexpected argument '--' (top takes only options)"
    );
    assert_eq!(
        err(&["status", "--json=1"]).message,
        "--json takes no value"
    );
    assert!(
        err(&["status", "--pool"])
            .message
            .contains("--pool needs a value")
    );
    assert!(
        err(&["status", "--pool", "a", "--pool", "b"])
            .message
            .contains("more than once")
    );
}

#[test]
fn prometheus_and_metrics_forms() {
    let named = |v: &[&str]| PoolSet::Named(v.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        p(&["status", "--prometheus"]),
        Ok(Command::StatusPrometheus {
            pools: PoolSet::Configured,
            hami: false
        })
    );
    assert_eq!(
        p(&[
            "status",
            "--pool",
            "a",
            "--prometheus",
            "--pool=/x/b.pool",
            "--pool",
            "a"
        ]),
        Ok(Command::StatusPrometheus {
            pools: named(&["a", "/x/b.pool"]),
            hami: false
        })
    );
    assert_eq!(
        p(&["status", "--all", "--prometheus"]),
        Ok(Command::StatusPrometheus {
            pools: PoolSet::All,
            hami: false
        })
    );
    let listen = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert_eq!(
        p(&["metrics", "--listen", "127.0.0.1:9400"]),
        Ok(Command::Metrics {
            listen: listen("127.0.0.1:9400"),
            pools: PoolSet::Configured,
            hami: false
        })
    );
    assert_eq!(
        p(&["metrics", "--pool", "a", "--listen=[::]:0", "--pool", "b"]),
        Ok(Command::Metrics {
            listen: listen("[::]:0"),
            pools: named(&["a", "b"]),
            hami: false
        })
    );
    assert_eq!(
        p(&["metrics", "--all", "--listen", "0.0.0.0:9400"]),
        Ok(Command::Metrics {
            listen: listen("0.0.0.0:9400"),
            pools: PoolSet::All,
            hami: false
        })
    );
    assert_eq!(
        p(&["status", "--prometheus", "--hami"]),
        Ok(Command::StatusPrometheus {
            pools: PoolSet::Configured,
            hami: true
        })
    );
    assert_eq!(
        p(&["metrics", "--hami", "--listen", "0.0.0.0:9400"]),
        Ok(Command::Metrics {
            listen: listen("0.0.0.0:9400"),
            pools: PoolSet::Configured,
            hami: true
        })
    );
    assert!(
        err(&["status", "--hami"])
            .message
            .contains("give --prometheus too")
    );
    assert!(help(Topic::Metrics).contains("--hami"));
    assert_eq!(p(&["metrics", "-h"]), Ok(Command::Help(Topic::Metrics)));
    assert_eq!(p(&["help", "metrics"]), Ok(Command::Help(Topic::Metrics)));
    assert!(help(Topic::General).contains("gpucap metrics --listen ADDR:PORT"));
    assert!(help(Topic::Status).contains("--prometheus"));
    assert!(help(Topic::General).contains("  metrics "));
}

#[test]
fn prometheus_and_metrics_errors() {
    let e = err(&["metrics"]);
    assert_eq!(e.topic, Topic::Metrics);
    assert!(e.message.starts_with("no --listen: "), "{}", e.message);
    for bad in [
        "9400",
        "localhost:9400",
        "127.0.0.1",
        "1.2.3.4:99999",
        "",
        ":9400",
    ] {
        let e = err(&["metrics", "--listen", bad]);
        assert_eq!(
            e.message,
            format!("invalid --listen {bad:?}: {LISTEN_ACCEPTED}"),
            "{bad}"
        );
    }
    assert!(
        err(&["metrics", "--listen"])
            .message
            .contains("--listen needs a value")
    );
    assert!(
        err(&["metrics", "--listen", ":1", "--listen", ":2"])
            .message
            .starts_with("invalid --listen")
    );
    assert!(
        err(&["metrics", "--listen", "[::]:1", "--listen", "[::]:2"])
            .message
            .contains("more than once")
    );
    assert_eq!(
        err(&["metrics", "--listen", "[::]:1", "--all", "--pool", "a"]).message,
        "--all and --pool exclude each other (--all: every pool of this user)"
    );
    assert_eq!(
        err(&["status", "--prometheus", "--json"]).message,
        "--json and --prometheus exclude each other"
    );
    assert_eq!(
        p(&["status", "--all"]),
        Ok(Command::Status {
            pool: None,
            json: false,
            uuid: false,
            all: true
        })
    );
    assert!(
        err(&["status", "--all", "--pool", "a"])
            .message
            .starts_with("--all and --pool exclude each other")
    );
    assert!(
        err(&["status", "--pool", "a", "--pool", "b", "--json"])
            .message
            .starts_with("--pool given more than once")
    );
    // Each command has its own options.
    for (args, opt) in [
        (&["metrics", "--listen", "[::]:1", "--json"][..], "--json"),
        (
            &["metrics", "--listen", "[::]:1", "--prometheus"],
            "--prometheus",
        ),
        (&["status", "--listen", "[::]:1"], "--listen"),
        (&["top", "--all"], "--all"),
        (&["top", "--prometheus"], "--prometheus"),
        (&["check", "--all"], "--all"),
    ] {
        assert_eq!(
            err(args).message,
            format!("unknown option '{opt}'"),
            "{args:?}"
        );
    }
    assert_eq!(
        err(&["metrics", "--listen", "[::]:1", "x"]).message,
        "unexpected argument 'x' (metrics takes only options)"
    );
    assert!(
        err(&["top", "--pool", "a", "--pool", "b"])
            .message
            .contains("more than once")
    );
}

#[test]
fn the_pool_flag_of_run_and_check() {
    assert!(matches!(
        p(&["run", "--pool", "train", "x"]),
        Ok(Command::Run { overrides: Overrides { pool: Some(n), .. }, .. }) if n == "train"
    ));
    assert!(matches!(
        p(&["check", "--pool=off"]),
        Ok(Command::Check { overrides: Overrides { pool: Some(n), .. }, .. }) if n == "off"
    ));
    let o = Overrides {
        pool: Some("t".into()),
        ..Overrides::default()
    };
    assert_eq!(o.vars(), vec![("GPUCAP_POOL", "t")]);
    assert!(
        help(Topic::General).contains("gpucap status")
            && help(Topic::General).contains("gpucap top")
    );
    for topic in [Topic::General, Topic::Status, Topic::Top] {
        assert!(help(topic).contains("--pool NAME|PATH"), "{topic:?}");
    }
    assert!(help(Topic::General).contains("GPUCAP_POOL_DIR"));
}

/// Corners where lexopt alone would read the words differently; they keep the
/// meaning and messages that the hand parser gave them.
#[test]
fn words_lexopt_would_read_otherwise() {
    // lexopt skips `--`: it is neither a command nor an argument of check.
    assert_eq!(err(&["--", "run", "x"]).message, "unknown option '--'");
    assert_eq!(
        err(&["check", "--"]).message,
        "unexpected argument '--' (check takes only options)"
    );
    assert!(
        err(&["check", "--limit", "1Gi", "--"])
            .message
            .contains("unexpected argument '--'")
    );
    // `help` takes words, not options.
    assert!(
        err(&["help", "--", "run"])
            .message
            .contains("no help for '--'")
    );
    assert!(
        err(&["help", "--help"])
            .message
            .contains("no help for '--help'")
    );
    // A short option stands alone: no clusters, no attached values.
    assert_eq!(err(&["run", "-hx", "y"]).message, "unknown option '-hx'");
    assert_eq!(err(&["run", "-h=x", "y"]).message, "unknown option '-h=x'");
    assert_eq!(err(&["check", "-hV"]).message, "unknown option '-hV'");
    assert_eq!(err(&["-Vh"]).message, "unknown option '-Vh'");
    assert_eq!(err(&["-"]).message, "unknown option '-'");
    // --help with a value is said as such, in every command (before: "unknown option
    // '--help'" in some, the help in others).
    assert_eq!(err(&["--help=x"]).message, "--help takes no value");
    for args in [
        &["run", "--help=x", "y"][..],
        &["check", "--help=x"],
        &["cdi", "--help=x"],
        &["cdi", "generate", "--help=x"],
        &["jupyter", "--help=x"],
        &["jupyter", "install", "--help=x"],
        &["pool", "resize", "--help=x"],
        &["pool", "list", "--help=x"],
    ] {
        assert_eq!(err(args).message, "--help takes no value", "{args:?}");
    }
    assert!(err(&["--limit=8Gi", "run"]).message.starts_with(
        "unknown option '--limit=8Gi' (options go after the command: gpucap run --limit=8Gi"
    ));
    // After `--` the next word is CMD whatever it looks like; after CMD all is CMD's.
    assert_eq!(
        p(&["run", "--", "--", "a"]),
        Ok(run(None, None, "--", &["a"]))
    );
    assert_eq!(
        p(&["run", "-", "-h", "--limit=1Gi", "--", "-Vx"]),
        Ok(run(None, None, "-", &["-h", "--limit=1Gi", "--", "-Vx"]))
    );
    assert_eq!(
        p(&["run", "--limit", "--", "x"]),
        Ok(run(Some("--"), None, "x", &[]))
    );
    assert_eq!(
        p(&["run", "--", ""]).unwrap_err().message,
        "the command to run is empty"
    );
}

#[test]
fn non_utf8_values_and_option_names() {
    let bad = || OsString::from_vec(b"/tmp/caf\xe9.env".to_vec());
    let mut inline = b"--write-env=".to_vec();
    inline.extend_from_slice(bad().as_encoded_bytes());
    assert_eq!(
        parse([OsString::from("check"), OsString::from_vec(inline)]),
        Ok(Command::Check {
            overrides: Overrides::default(),
            write_env: Some(bad()),
        })
    );
    assert_eq!(
        parse([OsString::from("check"), "--write-env".into(), bad()]),
        Ok(Command::Check {
            overrides: Overrides::default(),
            write_env: Some(bad()),
        })
    );
    let e = parse([
        OsString::from("run"),
        OsString::from_vec(b"--limit=8G\xe9".to_vec()),
        "x".into(),
    ])
    .unwrap_err();
    assert_eq!(e.message, "the value of --limit is not valid UTF-8");
    let e = parse([
        OsString::from("run"),
        OsString::from_vec(b"--lim\xe9t".to_vec()),
        "x".into(),
    ])
    .unwrap_err();
    assert_eq!(e.message, "unknown option '--lim\u{fffd}t'");
    // CMD and its arguments are passed on byte for byte.
    assert_eq!(
        parse([OsString::from("run"), "--".into(), bad(), bad()]),
        Ok(Command::Run {
            overrides: Overrides::default(),
            measure: false,
            program: bad(),
            args: vec![bad()],
        })
    );
}

#[test]
fn pool_list_and_clean() {
    assert_eq!(p(&["pool", "list"]), Ok(Command::Pool(PoolAction::List)));
    assert_eq!(
        p(&["pool", "clean"]),
        Ok(Command::Pool(PoolAction::Clean(None)))
    );
    assert_eq!(
        p(&["pool", "clean", "train"]),
        Ok(Command::Pool(PoolAction::Clean(Some("train".into()))))
    );
    assert_eq!(p(&["pool", "--help"]), Ok(Command::Help(Topic::Pool)));
    assert_eq!(p(&["help", "pool"]), Ok(Command::Help(Topic::Pool)));
    for (args, says) in [
        (&["pool"][..], "no action"),
        (&["pool", "remove"], "unknown action 'remove'"),
        (
            &["pool", "lsit"],
            "unknown action 'lsit' (did you mean list?)",
        ),
        (
            &["pool", "remove"],
            "(the actions are list, clean, resize and set)",
        ),
        (&["pool", "clean", "/tmp/x.pool"], "invalid pool name"),
        (&["pool", "clean", "a", "b"], "unexpected argument 'b'"),
        (&["pool", "list", "--all"], "unknown option '--all'"),
    ] {
        let e = err(args);
        assert_eq!(e.topic, Topic::Pool, "{args:?}");
        assert!(e.message.contains(says), "{args:?}: {}", e.message);
    }
}

#[test]
fn run_quiet_is_a_flag_of_run_only() {
    let Ok(Command::Run { overrides, .. }) = p(&["run", "--quiet", "--", "prog"]) else {
        panic!("run --quiet");
    };
    assert!(overrides.quiet);
    assert!(overrides.vars().is_empty(), "--quiet sets no variable");
    assert!(
        err(&["check", "--quiet"])
            .message
            .contains("unknown option")
    );
    assert!(
        err(&["run", "--quiet", "--quiet", "x"])
            .message
            .contains("more than once")
    );
}

#[test]
fn a_misspelt_option_names_the_nearest() {
    for (args, line) in [
        (
            &["run", "--limt", "8Gi", "x"][..],
            "unknown option '--limt' (did you mean --limit?)",
        ),
        (
            &["check", "--limt=8Gi"],
            "unknown option '--limt' (did you mean --limit?)",
        ),
        (
            &["check", "--write-evn", "f"],
            "unknown option '--write-evn' (did you mean --write-env?)",
        ),
        (
            &["status", "--prometeus"],
            "unknown option '--prometeus' (did you mean --prometheus?)",
        ),
        (
            &["top", "--usr", "x"],
            "unknown option '--usr' (did you mean --user?)",
        ),
        (
            &["metrics", "--lsten", "127.0.0.1:1"],
            "unknown option '--lsten' (did you mean --listen?)",
        ),
        // Nothing near: no guess.
        (
            &["run", "--frobnicate", "x"],
            "unknown option '--frobnicate'",
        ),
    ] {
        assert_eq!(err(args).message, line, "{args:?}");
    }
}
