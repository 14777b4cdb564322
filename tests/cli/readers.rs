//! What `gpucap status`, `top` and `metrics` do with the files of the pool directory that
//! others can write (docs/src/watching.md, docs/src/threat-model.md): a pool file they
//! refuse leaves nothing of its size in their memory; a pool file removed while its
//! member runs, read again at each refresh, does not grow them.
//!
//! Processes are tests/c/script.c started with `gpucap run` on the fake GPU, in a
//! scratch pool directory (GPUCAP_POOL_DIR). Memory is bounded, never timed: a reader
//! runs under an address-space limit (`RLIMIT_AS`) it needs a fraction of, and fails
//! where it keeps what it read. (The peak resident set `wait4` gives a child counts the
//! test process's own, from before the child's exec: too loud to compare.)

use super::common;

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

use common::pool_scratch::*;
use common::*;

/// The length of a pool file of 4096 members, the most a layout has (what a header
/// may state for a reader to copy that much).
const LARGEST_POOL_FILE: u64 = 13_162_624;

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
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only setrlimit, async-signal-safe, is called.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: READER_SPACE,
                rlim_max: READER_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    run(cmd)
}

/// This user's directory in the scratch's pool directory, made as gpucap makes it.
fn own_dir(s: &Scratch) -> PathBuf {
    let dir = s.pool_file("x").parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
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
