//! One cap for every process of a pool: members share it, agree on it, get a killed
//! member's share back; a bad pool file fails closed. Also the runner of the tables of
//! cases in this file, `shares` and `contexts` ([`run_table`]), and of their cases with
//! two members ([`Duet`]).

use super::*;

// ---- Tables of cases ---------------------------------------------------------------------

/// Runs each case of a table in turn, each in a thread named after it (its failure reads
/// `thread '<name>' panicked at …`), and fails naming the cases that failed once all have
/// run.
pub(super) fn run_table<C: Sync>(cases: &[C], name: fn(&C) -> &str, run: fn(&C)) {
    let failed: Vec<&str> = cases
        .iter()
        .filter(|&case| {
            std::thread::scope(|s| {
                std::thread::Builder::new()
                    .name(name(case).to_string())
                    .spawn_scoped(s, || run(case))
                    .unwrap()
                    .join()
                    .is_err()
            })
        })
        .map(name)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} cases failed: {failed:?}",
        failed.len(),
        cases.len()
    );
}

/// Two members of pool `t` (1 GiB cap, [`Pool::cmd`]) taking turns: A starts first, B
/// once A has touched its first file; both run to the end, and then what each printed
/// and what the pool and the fake GPU held are checked.
#[derive(Default)]
pub(super) struct Duet {
    /// The case, and the tag of its scratch directory.
    pub name: &'static str,
    pub a: Part,
    pub b: Part,
    /// `(file, bytes, why)`: once `file` exists (both members hold what they took), the
    /// pool uses `bytes`; the runner then touches `end`, which both members wait for.
    pub used_while: Option<(&'static str, u64, &'static str)>,
    /// The most the fake GPU may have held at once (the higher of the members' peaks).
    pub peak_at_most: Option<u64>,
    /// What the pool uses once both left.
    pub used_after: Option<u64>,
    /// The case's own checks, after the others.
    pub then: Option<fn(&Pool, &Output, &Output)>,
}

/// One member of a [`Duet`]: its script's steps (`touch:NAME` and `wait:NAME` name files
/// in the pool's directory), what it adds to or takes from the member's environment
/// (`{dir}` in a value is the pool's directory), and what it must print.
#[derive(Default)]
pub(super) struct Part {
    pub steps: &'static [&'static str],
    pub env: &'static [(&'static str, &'static str)],
    pub env_remove: &'static [&'static str],
    /// It must exit 0.
    pub ok: bool,
    /// Lines it must print, each with why.
    pub says: Vec<(String, &'static str)>,
    /// What its stderr must contain.
    pub err_has: &'static [&'static str],
}

impl Part {
    fn command(&self, p: &Pool, stats: &str) -> Command {
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| match s.split_once(':') {
                Some((k @ ("touch" | "wait"), file)) => format!("{k}:{}", p.path(file)),
                _ => s.to_string(),
            })
            .collect();
        let mut c = p.cmd(script(), stats);
        c.args(&steps);
        for (k, v) in self.env {
            c.env(k, v.replace("{dir}", &p.dir.display().to_string()));
        }
        for k in self.env_remove {
            c.env_remove(k);
        }
        c
    }

    fn check(&self, who: &str, o: &Output) {
        if self.ok {
            assert_ok(o);
        }
        for (line, why) in &self.says {
            let sep = if why.is_empty() { "" } else { ": " };
            assert!(has(o, line), "{who} prints {line:?}{sep}{why}\n{}", dump(o));
        }
        for piece in self.err_has {
            assert!(
                stderr(o).contains(piece),
                "{who}'s stderr holds {piece:?}\n{}",
                dump(o)
            );
        }
    }
}

pub(super) fn duet(case: &Duet) {
    let p = Pool::new(case.name);
    let a = spawn(&mut case.a.command(&p, "a.json"));
    if let Some(first) = case.a.steps.iter().find_map(|s| s.strip_prefix("touch:")) {
        p.wait_file(first);
    }
    let (a, b) = match case.used_while {
        None => {
            let b = run(&mut case.b.command(&p, "b.json"));
            (finish(a), b)
        }
        Some((file, bytes, why)) => {
            let b = spawn(&mut case.b.command(&p, "b.json"));
            p.wait_file(file);
            let used = p.used_peak().0;
            p.touch("end");
            let (a, b) = (finish(a), finish(b));
            assert_eq!(used, bytes, "{why}");
            (a, b)
        }
    };
    case.a.check("A", &a);
    case.b.check("B", &b);
    if let Some(most) = case.peak_at_most {
        let peak = p.shared_peak("a.json").max(p.shared_peak("b.json"));
        assert!(
            peak <= most,
            "the fake GPU held {} MiB at once, more than {} MiB",
            peak / MIB,
            most / MIB
        );
    }
    if let Some(used) = case.used_after {
        assert_eq!(p.used_peak().0, used, "what the pool uses once both left");
    }
    if let Some(then) = case.then {
        then(&p, &a, &b);
    }
}

/// The line of a script's `alloc` of `mib` MiB that returned `code`.
pub(super) fn alloc(mib: u64, code: &str) -> String {
    format!("alloc {} {code}", mib * MIB)
}

/// The line of a script's `info`: `free` and `total` MiB.
pub(super) fn info(free: u64, total: u64) -> String {
    format!("info {} {}", free * MIB, total * MIB)
}

// ---- One cap for the members of a pool ---------------------------------------------------

/// A holds 600 MiB until B has tried; B asks for 600 MiB and then less.
fn two_members() -> Vec<Duet> {
    vec![
        Duet {
            name: "processes_of_a_pool_share_one_cap",
            a: Part {
                steps: &["alloc:600Mi", "touch:a", "wait:b", "free"],
                ok: true,
                ..Part::default()
            },
            b: Part {
                steps: &["alloc:600Mi", "alloc:300Mi", "info", "touch:b"],
                says: vec![
                    (alloc(600, OOM), "the other member holds 600 MiB"),
                    (alloc(300, "0"), ""),
                    (
                        info(1024 - 900, 1024),
                        "cuMemGetInfo shows the pool: free = cap - what every member holds",
                    ),
                ],
                ..Part::default()
            },
            peak_at_most: Some(1024 * MIB),
            used_after: Some(0),
            then: Some(|p, _, b| {
                let refusal = refusals(&stderr(b));
                assert_eq!(refusal.len(), 1, "{}", dump(b));
                assert!(
                    refusal[0].contains(
                        "600 MiB of the pool's 1 GiB cap in use, 0 B of it by this process"
                    ),
                    "{}",
                    refusal[0]
                );
                assert_eq!(
                    p.used_peak().1,
                    900 * MIB,
                    "the pool's peak: 600 MiB and 300 MiB"
                );
            }),
            ..Duet::default()
        },
        // The control of the case above: the same two processes without GPUCAP_POOL.
        Duet {
            name: "without_a_pool_each_process_has_the_whole_cap",
            a: Part {
                steps: &["alloc:600Mi", "touch:a", "wait:b"],
                env_remove: &["GPUCAP_POOL"],
                ok: true,
                ..Part::default()
            },
            b: Part {
                steps: &["alloc:600Mi", "touch:b"],
                env_remove: &["GPUCAP_POOL"],
                says: vec![(alloc(600, "0"), "")],
                ..Part::default()
            },
            then: Some(|p, _, _| assert!(!p.file().exists())),
            ..Duet::default()
        },
        // HAMi-core's variables, as its device plugin sets them: the limit in MiB and
        // the cache file, which names the pool file.
        Duet {
            name: "hamis_shared_cache_variable_names_the_pool_file",
            a: Part {
                steps: &["alloc:600Mi", "touch:a", "wait:b"],
                env: HAMI,
                env_remove: NOT_GPUCAPS,
                ok: true,
                ..Part::default()
            },
            b: Part {
                steps: &["alloc:600Mi", "alloc:400Mi", "touch:b"],
                env: HAMI,
                env_remove: NOT_GPUCAPS,
                says: vec![(alloc(600, OOM), ""), (alloc(400, "0"), "")],
                ..Part::default()
            },
            then: Some(|p, _, _| {
                let file = p.dir.join("cudevshr.cache");
                let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "the cache file is the pool's, made 0600");
            }),
            ..Duet::default()
        },
    ]
}

const HAMI: &[(&str, &str)] = &[
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
    ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "{dir}/cudevshr.cache"),
];
const NOT_GPUCAPS: &[&str] = &["GPUCAP_LIMIT", "GPUCAP_POOL", "GPUCAP_POOL_DIR"];

#[test]
fn two_members_share_the_pools_cap_and_two_processes_outside_a_pool_do_not() {
    run_table(&two_members(), |c| c.name, duet);
}

#[test]
fn members_must_agree_on_the_cap() {
    let p = Pool::new("pool-agree");
    let a = spawn(&mut p.script(
        "a.json",
        &[
            "alloc:1Mi",
            &format!("touch:{}", p.path("a")),
            &format!("wait:{}", p.path("b")),
        ],
    ));
    p.wait_file("a");
    let b = run(p
        .script("b.json", &["alloc:1Mi"])
        .env("GPUCAP_LIMIT", "2Gi"));
    p.touch("b");
    assert_ok(&finish(a));
    assert!(has(&b, "cuInit 800"), "refused at cuInit\n{}", dump(&b));
    let err = stderr(&b);
    assert_eq!(err.lines().count(), 1, "one line\n{}", dump(&b));
    assert!(
        err.contains("caps GPU 0 at 2 GiB, the pool's live members at 1 GiB"),
        "names both values\n{}",
        dump(&b)
    );
    // Once no member lives, a new cap replaces the old one.
    let c = run(p
        .script("c.json", &["alloc:1500Mi"])
        .env("GPUCAP_LIMIT", "2Gi"));
    assert!(has(&c, &format!("alloc {} 0", 1500 * MIB)), "{}", dump(&c));
}

#[test]
fn a_killed_members_share_comes_back_to_the_allocation_that_needs_it() {
    let p = Pool::new("pool-kill");
    let mut a = spawn(&mut p.script(
        "a.json",
        &[
            "alloc:800Mi",
            &format!("touch:{}", p.path("a")),
            &format!("wait:{}", p.path("never")),
        ],
    ));
    p.wait_file("a");
    let b = spawn(&mut p.script(
        "b.json",
        &[
            "alloc:600Mi",
            &format!("touch:{}", p.path("b1")),
            &format!("wait:{}", p.path("killed")),
            "alloc:600Mi",
            "info",
        ],
    ));
    p.wait_file("b1");
    sigkill(&mut a);
    assert_eq!(
        p.used_peak().0,
        800 * MIB,
        "nobody took the dead member's share back yet"
    );
    p.touch("killed");
    let b = finish(b);
    assert!(
        has(&b, &format!("alloc {} {OOM}", 600 * MIB)),
        "while A lived\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("alloc {} 0", 600 * MIB)),
        "the dead member's 800 MiB came back to the allocation that needed them\n{}",
        dump(&b)
    );
    assert!(
        has(&b, &format!("info {} {}", 424 * MIB, 1024 * MIB)),
        "{}",
        dump(&b)
    );
    assert_eq!(p.used_peak().0, 0);
}

/// A pool file no member may join: `spoil` makes it so (given a pool whose directory
/// exists, 0700, and no file yet), and the script must then fail closed at `cuInit` with
/// one line that names the pool and says `says`.
struct BadFile {
    name: &'static str,
    spoil: Spoil,
    says: &'static str,
}

enum Spoil {
    /// Does it to the pool.
    By(fn(&Pool)),
    /// A good file made by a member, then cut to `len` bytes (all shorter than today's)
    /// with `version` in its version byte: the file a gpucap of that version left.
    OldVersion { version: u8, len: usize },
}

const BAD_FILES: &[BadFile] = &[
    BadFile {
        name: "pool-magic",
        spoil: Spoil::By(|p| {
            std::fs::write(p.file(), b"\x00\x00HAMI-core shared region ....").unwrap()
        }),
        says: "not a gpucap pool file",
    },
    BadFile {
        name: "pool-garbage",
        spoil: Spoil::By(|p| {
            let n = made(p).len();
            std::fs::write(p.file(), vec![0xA5; n]).unwrap()
        }),
        says: "not a gpucap pool file",
    },
    BadFile {
        name: "pool-version",
        spoil: Spoil::By(|p| {
            let mut b = made(p);
            b[8] = 12;
            std::fs::write(p.file(), b).unwrap()
        }),
        says: "version 12 pool file and this gpucap reads version 11",
    },
    // Version 10: version 11's words less the sixth traffic mark (`unsure`): version 11
    // would read its marks past their place.
    BadFile {
        name: "pool-version-10",
        spoil: Spoil::OldVersion {
            version: 10,
            len: 828_544,
        },
        says: "version 10 pool file and this gpucap reads version 11",
    },
    // Version 9: version 10's words, a member's pid alone in its word (version 10 keeps its
    // uid beside it, which version 9 would read as a pid past 32 bits: no process).
    BadFile {
        name: "pool-version-9",
        spoil: Spoil::OldVersion {
            version: 9,
            len: 828_544,
        },
        says: "version 9 pool file and this gpucap reads version 11",
    },
    // Version 8: version 9's words, mapped by a claim's members (an older gpucap beside a
    // newer one in a claim would keep a budget apart).
    BadFile {
        name: "pool-version-8",
        spoil: Spoil::OldVersion {
            version: 8,
            len: 828_544,
        },
        says: "version 8 pool file and this gpucap reads version 11",
    },
    // Version 7: the slots' states and traffic marks in the slots, share words member
    // by member: another length.
    BadFile {
        name: "pool-version-7",
        spoil: Spoil::OldVersion {
            version: 7,
            len: 826_496,
        },
        says: "version 7 pool file and this gpucap reads version 11",
    },
    // Version 6: no record of a ceiling handed down: version 7's length, its slots'
    // last two words left unwritten.
    BadFile {
        name: "pool-version-6",
        spoil: Spoil::OldVersion {
            version: 6,
            len: 826_496,
        },
        says: "version 6 pool file and this gpucap reads version 11",
    },
    // Version 5: 16 words per GPU entry.
    BadFile {
        name: "pool-version-5",
        spoil: Spoil::OldVersion {
            version: 5,
            len: 824_448,
        },
        says: "version 5 pool file and this gpucap reads version 11",
    },
    // Version 3: no announced frees.
    BadFile {
        name: "pool-version-3",
        spoil: Spoil::OldVersion {
            version: 3,
            len: 496_768,
        },
        says: "version 3 pool file and this gpucap reads version 11",
    },
    // Version 2: a journal per member and GPU.
    BadFile {
        name: "pool-version-2",
        spoil: Spoil::OldVersion {
            version: 2,
            len: 627_840,
        },
        says: "version 2 pool file and this gpucap reads version 11",
    },
    // Version 1: before guarantees.
    BadFile {
        name: "pool-version-1",
        spoil: Spoil::OldVersion {
            version: 1,
            len: 495_744,
        },
        says: "version 1 pool file and this gpucap reads version 11",
    },
    BadFile {
        name: "pool-corrupt",
        spoil: Spoil::By(|p| {
            let mut b = made(p);
            // Slot 0's state: the first word after the header and the GPU entries.
            let state0 = (16 + 32 * 24) * 8;
            b[state0] = 9;
            std::fs::write(p.file(), b).unwrap()
        }),
        says: "corrupted (member slot 0 has state 9)",
    },
    BadFile {
        name: "pool-truncated",
        spoil: Spoil::By(|p| {
            let b = made(p);
            std::fs::write(p.file(), &b[..b.len() / 2]).unwrap()
        }),
        says: "truncated",
    },
    BadFile {
        name: "pool-mode",
        spoil: Spoil::By(|p| {
            made(p);
            std::fs::set_permissions(p.file(), std::fs::Permissions::from_mode(0o666)).unwrap()
        }),
        says: "writable by group or others (mode 666)",
    },
    BadFile {
        name: "pool-symlink",
        spoil: Spoil::By(|p| {
            made(p);
            let real = p.dir.join("elsewhere.pool");
            std::fs::rename(p.file(), &real).unwrap();
            std::os::unix::fs::symlink(&real, p.file()).unwrap()
        }),
        // Before: "Too many levels of symbolic links (os error 40)".
        says: "is a symbolic link, and gpucap never follows one at a pool's path",
    },
    BadFile {
        name: "pool-dir-mode",
        spoil: Spoil::By(|p| {
            let dir = p.file().parent().unwrap().to_path_buf();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap()
        }),
        says: "writable by group or others (mode 777)",
    },
];

fn refused_at_cuinit(case: &BadFile) {
    let p = Pool::new(case.name);
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    match case.spoil {
        Spoil::By(spoil) => spoil(&p),
        Spoil::OldVersion { version, len } => {
            let mut b = made(&p);
            assert!(
                b.len() >= len,
                "today's file ({} bytes) is shorter",
                b.len()
            );
            b.truncate(len);
            b[8] = version;
            std::fs::write(p.file(), b).unwrap()
        }
    }
    let o = run(&mut p.script("s.json", &["alloc:1Mi"]));
    assert!(has(&o, "cuInit 800"), "fail closed\n{}", dump(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line\n{}", dump(&o));
    assert!(err.contains("cannot join the pool t"), "{}", dump(&o));
    assert!(
        err.contains(case.says),
        "says {:?}\n{}",
        case.says,
        dump(&o)
    );
}

#[test]
fn a_bad_pool_file_fails_closed_with_a_clear_line() {
    run_table(BAD_FILES, |c| c.name, refused_at_cuinit);
}

#[test]
fn a_fifo_at_the_pools_path_fails_closed_at_once() {
    let p = Pool::new("pool-fifo");
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let c = std::ffi::CString::new(p.file().to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = run_within(&mut p.script("s.json", &["alloc:1Mi"]), 30);
    assert!(has(&o, "cuInit 800"), "fail closed\n{}", dump(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{}", dump(&o));
    assert!(
        err.contains("cannot join the pool t") && err.contains("it is not a regular file"),
        "{}",
        dump(&o)
    );
}

#[test]
fn two_first_joiners_with_one_pid_do_not_remove_each_others_temporary_file() {
    if !unshare_works() {
        return;
    }
    let p = Pool::new("pool-tmpname");
    let dir = p.file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Another first joiner, PID 1 of its namespace, is making the file: its temporary
    // file has the name today's creator gives its own (the pid alone) and names to come.
    let theirs = [dir.join(".t.pool.1.new")];
    for f in &theirs {
        std::fs::write(f, b"being made").unwrap();
    }
    // Two creators, each PID 1 of its own namespace.
    let in_ns = |stats: &str| {
        let mut c = p.cmd("unshare", stats);
        c.args(["-pf", "--mount-proc", "--kill-child"])
            .arg(script())
            .arg("alloc:1Mi");
        spawn(&mut c)
    };
    let (a, b) = (in_ns("a.json"), in_ns("b.json"));
    for o in [finish(a), finish(b)] {
        assert!(has(&o, &format!("alloc {} 0", MIB)), "{}", dump(&o));
    }
    for f in &theirs {
        assert_eq!(
            std::fs::read(f).ok().as_deref(),
            Some(&b"being made"[..]),
            "{} was removed by a creator in another PID namespace",
            f.display()
        );
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".new") && n != ".t.pool.1.new")
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}
