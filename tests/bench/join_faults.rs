//! What a start touches of a large pool's file, counted in the page faults the process
//! took (`bench_start faults`: the kernel's count, the same run to run within a few,
//! whatever the machine's load): a start beside 1,000 live members of a pool of 4,096
//! member slots takes about as many as one in a pool of 256 with nobody in it. A joiner
//! that read a word of every slot (its state, its share words: a slot a page or more
//! apart) would take hundreds more; a context's measurement that kept a copy of every
//! member's marks at each of its reads, about 35 more.

use super::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::*;

/// The pool `name` of `members` slots in `dir`, on the fake GPU, for `bench_start`.
fn in_pool(bin: &std::path::Path, dir: &std::path::Path, name: &str, members: u32) -> Command {
    let mut cmd = fake_cmd(bin, &dir.join(format!("stats-{name}")));
    cmd.env("FAKECUDA_TOTAL_MEM", "80Gi")
        .env("GPUCAP_LIMIT", "40Gi")
        .env("GPUCAP_POOL", name)
        .env("GPUCAP_POOL_DIR", dir.join("pools"))
        .env("GPUCAP_POOL_MEMBERS", members.to_string());
    cmd
}

/// The minor page faults of one start (`bench_start faults` under the shim).
fn faults(cmd: &mut Command) -> i64 {
    let o = run(preload(cmd).arg("faults"));
    assert_ok(&o);
    let out = stdout(&o);
    out.trim()
        .strip_prefix("minflt=")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no minflt= in {out:?}\n{}", dump(&o)))
}

/// `bench_start`, a scratch folder `tag` with its pool folder, and the faults of a start
/// into the pool `name` of 256 slots there, made by a first start (as in a mass start,
/// where every member but one joins a pool that exists).
fn joined_256(tag: &str, name: &str) -> (std::path::PathBuf, std::path::PathBuf, i64) {
    let bin = compile_c("bench_start", "", &["-lcuda"]);
    let dir = scratch(tag);
    std::fs::create_dir_all(dir.join("pools")).unwrap();
    assert_ok(&run(
        preload(&mut in_pool(&bin, &dir, name, 256)).arg("once")
    ));
    let faults = faults(&mut in_pool(&bin, &dir, name, 256));
    (bin, dir, faults)
}

#[test]
fn a_start_beside_many_members_of_a_large_pool_faults_in_a_few_pages_more() {
    // What a start takes in a pool of 256 slots.
    let (bin, dir, small) = joined_256("join-faults", "small");
    // 1,000 members of a pool of 4,096 slots, holding their blocks.
    let mut held = in_pool(&bin, &dir, "large", 4096)
        .args(["1000", shim().to_str().unwrap()])
        .env("BENCH_START_HOLD", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("bench_start");
    let mut line = String::new();
    BufReader::new(held.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("failed=0"), "the 1,000 members: {line:?}");
    let large = faults(&mut in_pool(&bin, &dir, "large", 4096));
    drop(held.stdin.take()); // the members free their blocks and exit
    assert!(held.wait().unwrap().success());
    // The pages a start needs of a larger file (the states of 4,096 slots, one GPU's
    // share words of the live ones and its marks of the slots taken: about 12) and
    // what its measurement keeps of 1,000 members' marks (24 bytes each).
    assert!(
        large - small <= 24,
        "a start beside 1,000 live members of a 4,096-slot pool took {large} page faults, \
         one in an empty 256-slot pool {small}"
    );
}

/// A pool member's start touches little more than a start capped alone: the pages of the
/// pool file it reads and writes (header, its slot, one GPU's entry and marks) in place of
/// the lone file's, and a member built where it is kept. When each step of the join
/// (slot search, join, wait, the shim's membership) held its own 4.5 KiB copy of the
/// member on the stack, the join's frames touched 32 KiB more stack: 15 page faults more
/// than alone (167 against 152), against 6 since the member is boxed where it is made.
#[test]
fn a_pool_members_start_faults_in_about_as_many_pages_as_one_alone() {
    let (bin, dir, pool) = joined_256("join-faults-alone", "member");
    let mut alone = fake_cmd(&bin, &dir.join("stats-alone"));
    alone
        .env("FAKECUDA_TOTAL_MEM", "80Gi")
        .env("GPUCAP_LIMIT", "40Gi");
    let alone = faults(&mut alone);
    assert!(
        pool - alone <= 10,
        "a pool member's start took {pool} page faults, one capped alone {alone}"
    );
}

/// A member joining a pool that exists makes one lock call at its start, its slot taken:
/// each lock call on the pool file walks every lock on it, one a member, so what a start
/// makes there the kernel pays for every member of a mass start. Whether the file system
/// has these locks is tested where the file is made (on the new file, with no lock on it
/// yet), not by every joiner (before: a lock test, then the slot, each a walk of the list).
#[test]
fn a_joiner_makes_one_lock_call_on_the_pool_file_at_its_start() {
    if !strace_runs() {
        return;
    }
    let (bin, dir, _) = joined_256("join-lock-calls", "locks");
    let trace = dir.join("trace");
    let mut c = in_pool(std::path::Path::new("strace"), &dir, "locks", 256);
    c.args(["-f", "-qq", "-e", "trace=fcntl", "-o"])
        .arg(&trace)
        .arg(&bin)
        .arg("once");
    assert_ok(&run(preload(&mut c)));
    let text = std::fs::read_to_string(&trace).unwrap();
    let calls = |what: &str| text.lines().filter(|l| l.contains(what)).count();
    assert_eq!(calls("F_OFD_GETLK"), 0, "a lock test at the start:\n{text}");
    assert_eq!(
        calls("F_OFD_SETLK, {l_type=F_WRLCK"),
        1,
        "the slot's lock, once:\n{text}"
    );
}
