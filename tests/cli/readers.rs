//! What `gpucap status`, `top` and `metrics` do with the files of the pool directory that
//! others can write (docs/src/watching.md, docs/src/threat-model.md): a pool file they
//! refuse leaves nothing of its size in their memory; a pool file removed while its
//! member runs, read again at each refresh, does not grow them; a file reached through a
//! member's announcement follows the rule of the directories (a `gpucap-UID` file is
//! UID's); a `.lone` file whose header says another user or another pid than its owner
//! and name is skipped with a line; a live process's damaged `.lone` file is a line, not
//! a process gone silently; and root's own directory that cannot be used is said, as it
//! is to any other user.
//!
//! Processes are tests/c/script.c started with `gpucap run` on the fake GPU, in a
//! scratch pool directory (GPUCAP_POOL_DIR). Memory is bounded, never timed: a reader
//! runs under an address-space limit (`RLIMIT_AS`) it needs a fraction of, and fails
//! where it keeps what it read. (The peak resident set `wait4` gives a child counts the
//! test process's own, from before the child's exec: too loud to compare.)

use super::common;

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use common::pool_scratch::*;
use common::*;

/// The length of a pool file of 4096 members, the most a layout has (what a header
/// may state for a reader to copy that much).
const LARGEST_POOL_FILE: u64 = 13_162_624;
/// The length of a `.lone` file, and where its header starts (word index).
const LONE_FILE_BYTES: u64 = 69_632;
const LONE_HEADER: usize = 65_536 / 8;

fn kill(mut child: Child) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

/// The address space a reader is given here: 32 MiB, some five times what `status` and
/// `top` map reading a pool on the fake GPU (under 7 MiB; they run within 16 MiB), and
/// less than what the readings below kept before the fix (24 refused files: 300 MiB; 60
/// readings of a removed pool file: 48 MiB more).
const READER_SPACE: u64 = 32 << 20;

/// Runs `cmd` to its end within [`READER_SPACE`] of address space (`RLIMIT_AS`: a
/// reader that needs more fails to allocate, and aborts): its output.
fn within_bound(cmd: &mut Command) -> Output {
    run(with_rlimit(
        cmd,
        libc::RLIMIT_AS,
        READER_SPACE,
        READER_SPACE,
    ))
}

/// This user's directory in the scratch's pool directory, made as gpucap makes it.
fn own_dir(s: &Scratch) -> PathBuf {
    let dir = s.pool_file("x").parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn status_json(s: &Scratch) -> serde_json::Value {
    let o = run(&mut s.gpucap(&["status", "--json", "--all"]));
    assert_ok(&o);
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// A pool file whose header is not a pool's (magic `NOTAPOOL`) but states the length of
/// the largest pool file, that long (sparse), as the reviewer's `mkbad.py` makes it.
fn not_a_pool(path: &Path) {
    let mut head = b"NOTAPOOL".to_vec();
    for w in [9u64, 0, LARGEST_POOL_FILE] {
        head.extend(w.to_le_bytes());
    }
    std::fs::write(path, head).unwrap();
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(LARGEST_POOL_FILE)
        .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// 24 files that state the largest pool file's length but are no pool files: each is a
/// line in `errors[]`, and root's `status` reads them within [`READER_SPACE`] (before:
/// a copy of each, 12.6 MiB, kept for the process's life; it aborted here, "memory
/// allocation of 13162625 bytes failed", and 200 of them took 2.6 GB).
#[test]
fn pool_files_a_reader_refuses_leave_nothing_of_their_size_in_its_memory() {
    let s = Scratch::new("readers-refused");
    let dir = own_dir(&s);
    for i in 0..24 {
        not_a_pool(&dir.join(format!("bad-{i}.pool")));
    }
    let o = within_bound(&mut s.gpucap(&["status", "--json"]));
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let errors = doc["errors"].to_string();
    for i in 0..24 {
        assert!(errors.contains(&format!("bad-{i}.pool")), "{doc}");
    }
    assert!(errors.contains("not a gpucap pool file"), "{doc}");
}

/// A pool file removed while its member runs is read through the member's descriptor at
/// every refresh of `top`: 60 refreshes run within [`READER_SPACE`] (before: each opened
/// it again and kept a copy of it, 810 KiB a refresh, and `top` aborted here).
#[test]
fn top_reading_a_removed_pool_file_again_and_again_does_not_grow() {
    let s = Scratch::new("readers-removed-top");
    let member = s.member("p", "m", &["alloc:10Mi"]);
    std::fs::remove_file(s.pool_file("p")).unwrap();
    let args = ["top", "--interval", "0.2", "--iterations", "60"];
    let o = within_bound(&mut s.gpucap(&args));
    kill(member);
    assert_ok(&o);
    assert_eq!(
        stdout(&o).matches("pool p GPU 0").count(),
        60,
        "{}",
        dump(&o)
    );
}

/// The FNV-1a hash of `path`'s bytes, as an announcement names a pool file.
pub(crate) fn path_hash(path: &Path) -> u64 {
    path.to_str()
        .unwrap()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// uid 65534 makes `gpucap-1000` (not its uid), a pool file in it, opens and removes
/// it, and announces it as a claim's member would (anyone may bind an abstract name):
/// root's `status` shows no such pool, whether the squatted directory is there or was
/// removed too (before: the pool showed as if user 1000's).
#[test]
fn a_pool_file_announced_in_another_users_directory_is_not_shown() {
    if !as_root("reading every user's directory") {
        return;
    }
    let s = Scratch::new("readers-announced");
    let member = s.member("real", "m", &["alloc:10Mi"]);
    let (squat, path) = s.copy_as_nobody("real", "gpucap-1000", "spoofed.pool");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let meta = file.metadata().unwrap();
    std::fs::remove_file(&path).unwrap();
    let name = format!(
        "gpucap-pool/claim/{:016x}/{:x}/{:x}/{}/{}",
        path_hash(&path),
        meta.dev(),
        meta.ino(),
        std::process::id(),
        file.as_raw_fd()
    );
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let beacon = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
    let squatted = status_json(&s);
    std::fs::remove_dir(&squat).unwrap();
    let gone = status_json(&s);
    drop(beacon);
    kill(member);
    for doc in [squatted, gone] {
        let names: Vec<&str> = doc["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert_eq!(names, ["real"], "{doc}");
        assert!(!doc.to_string().contains("spoofed"), "{doc}");
    }
}

/// Root's `status` reads every user's directory: uid 65534's unused pool `train` (a
/// copy of a pool whose member exited) beside root's `train` in use. Without `--all`,
/// the unused one is left out and the one in use shown with its member (before: hidden
/// by name, both were, and the member's row with them).
#[test]
fn an_unused_pool_hides_no_other_users_pool_of_its_name() {
    if !as_root("reading every user's directory") {
        return;
    }
    let s = Scratch::new("readers-unused-same-name");
    assert_ok(&s.once("idle", &["alloc:10Mi"]));
    let (_, idle) = s.copy_as_nobody("idle", "gpucap-65534", "train.pool");
    std::fs::remove_file(s.pool_file("idle")).unwrap();
    let member = s.member("train", "m", &["alloc:10Mi"]);
    let o = run(&mut s.gpucap(&["status", "--json"]));
    kill(member);
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let paths: Vec<&str> = doc["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    let live = s.pool_file("train");
    assert_eq!(paths, [live.to_str().unwrap()], "{doc}");
    assert!(!doc.to_string().contains(idle.to_str().unwrap()), "{doc}");
    let pools: Vec<&str> = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pool"].as_str())
        .collect();
    assert_eq!(pools, ["train"], "{doc}");
}

/// The `.lone` file of a live process capped alone (the only one in the scratch).
fn lone_file(s: &Scratch) -> PathBuf {
    let dir = s.pool_file("x").parent().unwrap().to_path_buf();
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "lone"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// A copy of a real `.lone` file under uid 65534's name `name` in its directory, with
/// `pid` and `uid` in its header, held by this process (an open-file-description lock,
/// as a live process holds its own), as the reviewer's `forge_lone.py` makes it.
fn forged(dir: &Path, real: &[u8], name: &str, pid: u64, uid: u64) -> File {
    let mut bytes = real.to_vec();
    let mut set = |word: usize, value: u64| {
        bytes[word * 8..word * 8 + 8].copy_from_slice(&value.to_le_bytes());
    };
    set(LONE_HEADER + 1, pid);
    set(LONE_HEADER + 4, uid);
    set(LONE_HEADER + 7, 0); // no live figures to read
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // SAFETY: flock is plain data, all zero is a valid value (l_pid 0 for OFD locks).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as _;
    // SAFETY: our descriptor and a flock for the duration of the call.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) };
    assert_eq!(rc, 0, "lock {}", path.display());
    f
}

/// uid 65534 holds `.lone` files in its own directory whose headers say pid 1 and uid 0,
/// or pid 1 under a name of pid 4242: root's `status` shows neither process and names
/// both files in `errors[]` (before: pid 1 shown with `"uid": 0` beside `"user":
/// "nobody"`); the real process capped alone shows as ever.
#[test]
fn a_lone_file_whose_header_is_not_its_owners_or_its_names_is_a_line() {
    if !as_root("another user's .lone file") {
        return;
    }
    let s = Scratch::new("readers-forged-lone");
    let real = s.lone("real", &["alloc:100Mi"]);
    let real_pid = real.id();
    let file = lone_file(&s);
    let bytes = std::fs::read(&file).unwrap();
    let pidns = file
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".lone"))
        .and_then(|n| n.split_once('-'))
        .map(|(_, ns)| ns.to_string())
        .unwrap();
    let nobody = s.pools.join("gpucap-65534");
    std::fs::create_dir(&nobody).unwrap();
    std::fs::set_permissions(&nobody, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&nobody, Some(65534), Some(65534)).unwrap();
    let root_uid = format!("1-{pidns}.lone");
    let other_pid = format!("4242-{pidns}.lone");
    let _a = forged(&nobody, &bytes, &root_uid, 1, 0);
    let _b = forged(&nobody, &bytes, &other_pid, 1, 65534);
    let doc = status_json(&s);
    kill(real);
    let lone = doc["lone"].as_array().unwrap();
    let pids: Vec<u64> = lone.iter().filter_map(|l| l["pid"].as_u64()).collect();
    assert_eq!(pids, [u64::from(real_pid)], "{doc}");
    assert_eq!(lone[0]["uid"], 0, "{doc}");
    let errors = doc["errors"].to_string();
    for name in [&root_uid, &other_pid] {
        assert!(errors.contains(name.as_str()), "{name} named\n{doc}");
    }
    assert!(errors.contains("uid 0"), "{doc}");
    assert!(errors.contains("pid 1"), "{doc}");
}

/// What a test does to a file.
type Damage = Box<dyn Fn(&File)>;

/// A live process capped alone whose `.lone` file was truncated, made huge (sparse) or
/// overwritten with garbage: `status` names the file and what is wrong in `errors[]`
/// (before: the process vanished with `errors: []`).
#[test]
fn a_live_processs_damaged_lone_file_is_a_line() {
    let s = Scratch::new("readers-damaged-lone");
    let p = s.lone("p", &["alloc:100Mi"]);
    let file = lone_file(&s);
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    let damage: [(&str, Damage); 3] = [
        ("100 bytes", Box::new(|f: &File| f.set_len(100).unwrap())),
        (
            "107374182400 bytes",
            Box::new(|f: &File| f.set_len(100 << 30).unwrap()),
        ),
        (
            "not a lone process's file",
            Box::new(|f: &File| {
                use std::os::unix::fs::FileExt;
                f.set_len(0).unwrap();
                f.write_all_at(&vec![0x5a; LONE_FILE_BYTES as usize], 0)
                    .unwrap();
            }),
        ),
    ];
    let mut seen = Vec::new();
    for (what, f) in &damage {
        f(&OpenOptions::new().write(true).open(&file).unwrap());
        seen.push((what, status_json(&s)));
    }
    kill(p);
    for (what, doc) in seen {
        let line = doc["errors"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e.as_str())
            .find(|e| e.contains(&name))
            .unwrap_or_else(|| panic!("no line naming {name}\n{doc}"));
        assert!(line.contains(what), "{what}: {line}");
    }
}

/// What makes this user's directory at the first path (in the scratch, the second).
type MakeDir = Box<dyn Fn(&Path, &Path)>;

/// This user's directory in the pool directory made unusable (a link to a directory, a
/// FIFO, a file, mode 777; owned by another user, for root): `status`, `status --json`
/// and `top --once` say it in a line naming it: exit 2 for a user, and for root, who
/// reads every user's directory, a line among what could not be read, the others read
/// all the same (before, root's printed "no capped process", exit 0, no line).
#[test]
fn an_unusable_own_directory_is_said_by_status_and_top() {
    let mut cases: Vec<(&str, MakeDir)> = vec![
        (
            "link",
            Box::new(|dir: &Path, base: &Path| {
                let real = base.join("real");
                std::fs::create_dir(&real).unwrap();
                std::os::unix::fs::symlink(&real, dir).unwrap();
            }),
        ),
        (
            "fifo",
            Box::new(|dir: &Path, _: &Path| {
                let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
                // SAFETY: a NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
        ),
        (
            "file",
            Box::new(|dir: &Path, _: &Path| std::fs::write(dir, b"").unwrap()),
        ),
        (
            "777",
            Box::new(|dir: &Path, _: &Path| {
                std::fs::create_dir(dir).unwrap();
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            }),
        ),
    ];
    if is_root() {
        cases.push((
            "owned",
            Box::new(|dir: &Path, _: &Path| {
                std::fs::create_dir(dir).unwrap();
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
                std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
            }),
        ));
    }
    for (tag, make) in &cases {
        let s = Scratch::new(&format!("readers-own-{tag}"));
        let dir = s.pool_file("x").parent().unwrap().to_path_buf();
        make(&dir, &s.dir);
        for args in [&["status"][..], &["status", "--json"], &["top", "--once"]] {
            let o = run(&mut s.gpucap(args));
            // Root reads every user's directory: its own that cannot be used is a line
            // among what could not be read, and the others are read all the same (a
            // user who made `gpucap-0` first must not blind root). Another user's
            // `status` is about its own directory only: exit 2.
            let (code, said) = if is_root() {
                (0, stdout(&o))
            } else {
                (2, stderr(&o))
            };
            assert_eq!(o.status.code(), Some(code), "{tag} {args:?}\n{}", dump(&o));
            assert!(
                said.contains(dir.to_str().unwrap()),
                "{tag} {args:?}\n{}",
                dump(&o)
            );
            // Whole, in a pipe's 80 columns too: before, cut short of its reason.
            if *tag == "777" {
                assert!(said.contains("chmod 700 it"), "{args:?}\n{}", dump(&o));
            }
        }
    }
}

/// A pool directory that does not exist (a mistyped `GPUCAP_POOL_DIR`) holds no user's
/// directory for root to read either: `status`, `status --json`, `top --once` and
/// `status --prometheus --all` exit 2 with the line naming it, whoever runs them (before,
/// root's printed "no capped process", the line after it on stdout, and exit status 0).
#[test]
fn a_pool_directory_that_does_not_exist_is_an_error_for_root_too() {
    let s = Scratch::new("readers-no-pool-dir");
    let missing = s.dir.join("no-such-dir");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["top", "--once"],
        &["status", "--prometheus", "--all"],
    ] {
        let o = run(s.gpucap(args).env("GPUCAP_POOL_DIR", &missing));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains(&format!("GPUCAP_POOL_DIR={}", missing.display())),
            "{args:?}\n{}",
            dump(&o)
        );
        assert!(
            !stdout(&o).contains("no capped process"),
            "{args:?}\n{}",
            dump(&o)
        );
    }
}

/// A pool named by a path outside the pool directory (`GPUCAP_POOL=/path/x.pool`, which
/// gpucap accepts) and a pool file renamed under its members: both found through their
/// members' announcements, as a removed one is, in the machine's view (no
/// `GPUCAP_POOL_DIR`: other tests' pools may show too, so only this test's are counted).
/// Their members were in no view. A pool directory named is that directory's view.
#[test]
fn a_pool_at_a_path_outside_the_pool_directory_shows_in_status_and_top() {
    let s = Scratch::new("readers-path-pool");
    let shared = s.dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let team = shared.join("team.pool");
    let team = team.to_str().unwrap();
    let a = s.member("tr", "a", &["alloc:100Mi"]);
    let b = s.member(team, "b", &["alloc:200Mi"]);
    let c = s.member(team, "c", &["alloc:300Mi"]);
    // The named pool's file renamed out of the pool directory under its member.
    let moved = s.dir.join("moved.pool");
    std::fs::rename(s.pool_file("tr"), &moved).unwrap();
    let machine = |args: &[&str]| {
        let mut c = s.gpucap(args);
        c.env_remove("GPUCAP_POOL_DIR");
        run(&mut c)
    };
    let pids: Vec<u64> = [&a, &b, &c].iter().map(|x| u64::from(x.id())).collect();
    let o = machine(&["status", "--json"]);
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut rows: Vec<(String, u64)> = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"].as_u64().is_some_and(|pid| pids.contains(&pid)))
        .map(|p| {
            (
                p["pool"].as_str().unwrap_or_default().to_string(),
                p["used"].as_u64().unwrap() >> 20,
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("moved".into(), 100),
            ("team".into(), 200),
            ("team".into(), 300)
        ],
        "{}",
        stdout(&o)
    );
    let o = machine(&["top", "--once"]);
    assert_ok(&o);
    for pid in &pids {
        assert!(
            stdout(&o)
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(&pid.to_string())),
            "{pid}\n{}",
            stdout(&o)
        );
    }
    // The scratch's pool directory named: its pools only.
    let o = run(&mut s.gpucap(&["status", "--json"]));
    assert!(!stdout(&o).contains("\"team\""), "{}", stdout(&o));
    for child in [a, b, c] {
        kill(child);
    }
}

/// Directories that say a claim's members live (a read lock on their first byte: anyone
/// may make a `gpucap-container-…` directory where the containers' pools are kept and
/// hold one) while nobody answers there cost one reading of `status` one patience (5 s)
/// in all, never 5 s each: six of them, status answers in under 10 s, which two
/// patiences would already take (measured 5.0 s; before: 30.0 s, and so each refresh of
/// `top` and each scrape of `metrics`).
#[test]
fn directories_whose_members_never_answer_cost_a_reading_one_patience_in_all() {
    let s = Scratch::new("readers-squatted");
    let mut held = Vec::new();
    for i in 0..6 {
        let d = s.pools.join(format!("gpucap-container-squat{i}"));
        std::fs::create_dir_all(&d).unwrap();
        let f = File::open(&d).unwrap();
        // SAFETY: a plain struct of integers, all zero before the fields are set.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_RDLCK as i16;
        lock.l_whence = libc::SEEK_SET as i16;
        lock.l_len = 1;
        // SAFETY: our open directory, and a flock that lives across the call.
        let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        held.push(f);
    }
    let start = std::time::Instant::now();
    let o = run(&mut s.gpucap(&["status", "--json", "--all"]));
    let took = start.elapsed();
    assert!(
        took < std::time::Duration::from_secs(10),
        "status took {took:?} over six directories whose members never answer\n{}",
        dump(&o)
    );
    assert!(
        stdout(&o).contains("gpucap-container-squat0"),
        "each is still said\n{}",
        dump(&o)
    );
    drop(held);
}
