//! gpucap's descriptors taken back by the program (`src/pool-file/kept.rs`): a program may
//! close every descriptor it did not open (`close_range`, as daemons and some servers
//! do) and open files of its own under the same numbers. gpucap then acts on a number only
//! while it is still the file it kept: a pool member takes no live member for dead, a
//! forked child closes none of the program's files, a lone process stays shown.

use super::common;

use common::pool_scratch::*;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Output, Stdio};

const MIB: u64 = 1 << 20;

/// The steps of a process that closes gpucap's descriptors, puts files of its own under
/// their numbers (in `files`), then allocates 700 MiB and forks.
fn taking_back(files: &Path) -> Vec<String> {
    std::fs::create_dir_all(files).unwrap();
    vec![
        "closefds".into(),
        format!("reusefds:{}", files.display()),
        format!("alloc:{}", 700 * MIB),
        "fork".into(),
    ]
}

/// What `child` said once killed.
fn kill_and_wait(mut child: Child) -> Output {
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

fn both(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What the process taking its descriptors back said: its 700 MiB refused beside the
/// live member's 700 MiB under the 1 GiB cap, none of its files closed in its forked
/// child, and none written.
fn refused_and_untouched(said: &str, files: &Path) {
    assert!(said.contains("closefds 0"), "{said}");
    assert!(
        said.lines()
            .any(|l| l.strip_prefix("reusefds ").is_some_and(|n| n != "0")),
        "no file took a number back: {said}"
    );
    assert!(
        said.contains(&format!("alloc {} 2", 700 * MIB)),
        "a live member's bytes were taken for a dead one's: {said}"
    );
    assert!(
        said.contains("fork lost 0"),
        "gpucap closed the program's files in its forked child: {said}"
    );
    for f in std::fs::read_dir(files).unwrap().flatten() {
        assert_eq!(
            f.metadata().unwrap().len(),
            0,
            "gpucap wrote into the program's file {}",
            f.path().display()
        );
    }
}

/// A named pool: the member whose pool file's number the program took asked its locks
/// of the program's file, found every slot free and took the live member's 700 MiB back
/// after the exit wait: 1,400 MiB served under a 1 GiB cap.
#[test]
fn a_named_pool_member_whose_descriptors_the_program_took_takes_no_live_member_for_dead() {
    let s = Scratch::new("desc-named");
    let a = s.member("p", "a", &[&format!("alloc:{}", 700 * MIB)]);
    let files = s.dir.join("files");
    let steps = taking_back(&files);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let b = s.once("p", &steps);
    let said = both(&b);
    let _ = kill_and_wait(a);
    refused_and_untouched(&said, &files);
}

/// A claim's pool: the same, through the claim's file and its memfd.
#[test]
fn a_claim_member_whose_descriptors_the_program_took_takes_no_live_member_for_dead() {
    let s = Scratch::new("desc-claim");
    let claim = s.dir.join("claim");
    std::fs::create_dir_all(&claim).unwrap();
    std::fs::set_permissions(&claim, std::fs::Permissions::from_mode(0o777)).unwrap();
    let in_claim = |tag: &str| {
        let mut c = fake_cmd(script(), &s.dir.join(format!("{tag}.json")));
        c.env("LD_PRELOAD", shim())
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("GPUCAP_LIMIT", "1Gi")
            .env("GPUCAP_CLAIM_DIR", &claim)
            .env("GPUCAP_POOL_DIR", &s.pools)
            .current_dir(&s.dir);
        c
    };
    let ready = s.dir.join("a.ready");
    let mut a = in_claim("a")
        .arg(format!("alloc:{}", 700 * MIB))
        .arg(format!("touch:{}", ready.display()))
        .arg(format!("wait:{}", s.dir.join("never").display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&mut a, &ready, "the member a");
    let files = s.dir.join("files");
    let b = run(in_claim("b").args(taking_back(&files)));
    let said = both(&b);
    let _ = kill_and_wait(a);
    refused_and_untouched(&said, &files);
}

/// A lone process: its file's lock outlives its descriptor (status showed nothing and
/// removed its file), and its forked child closes none of the program's files (two were
/// closed: the file's and its figures' numbers).
#[test]
fn a_lone_process_whose_descriptors_the_program_took_stays_shown_and_keeps_its_files() {
    let s = Scratch::new("desc-lone");
    let files = s.dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let reuse = format!("reusefds:{}", files.display());
    let l = s.lone("l", &["closefds", &reuse, "fork"]);
    let pid = l.id();
    let status = |s: &Scratch| -> String { both(&run(&mut s.gpucap(&["status"]))) };
    let first = status(&s);
    let again = status(&s);
    let said = both(&kill_and_wait(l));
    assert!(said.contains("closefds 0"), "{said}");
    assert!(said.contains("fork lost 0"), "{said}");
    for shown in [first, again] {
        assert!(
            shown.lines().any(|l| l
                .split_whitespace()
                .nth(1)
                .is_some_and(|p| p == pid.to_string())),
            "the process {pid} was not shown: {shown}"
        );
    }
}
