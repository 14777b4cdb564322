//! A user's directory swapped while root reads it (docs/src/threat-model.md, "Squat a
//! directory"): uid 65534 may exchange its `gpucap-65534` directory with a link of its
//! own to any directory at any moment (`renameat2`'s `RENAME_EXCHANGE`, one atomic
//! step), between root's look at the directory and root's reading of it. Root's
//! `status` reads the directory it looked at, never where the link leads: it shows no
//! pool file of a directory only root may read and removes no file there.
//!
//! The swaps run in a thread of this test (root, standing in for uid 65534, who may
//! do the same with its own directory and link) for as long as `status` runs again and
//! again: before the fix, a reading that looked at the real directory and then listed
//! it through the link named root's private pool, showed it as a pool of uid 65534's
//! directory and removed the private directory's `.lone` file (9 of 40 readings named
//! it, 4 showed it, and the file was removed).

use super::common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::pool_scratch::*;
use common::*;

/// Readings of `status` while the directory is swapped (before the fix about one in
/// five followed the link).
const READINGS: usize = 40;

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Exchanges what `a` and `b` name, atomically.
fn exchange(a: &CString, b: &CString) -> bool {
    // SAFETY: two NUL-terminated paths.
    unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        ) == 0
    }
}

/// Root's pool `hidden`, moved into a directory only root may read, and uid 65534's
/// directory holding a copy of it named `name`, with a link of uid 65534's to the private
/// directory beside it: (uid 65534's directory, the copy, the private directory, the
/// link).
fn hidden_beside(s: &Scratch, name: &str) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    assert_ok(&s.once("hidden", &["alloc:10Mi"]));
    let (user, copy) = s.copy_as_nobody("hidden", "gpucap-65534", name);
    let private = s.dir.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::rename(s.pool_file("hidden"), private.join("hidden.pool")).unwrap();
    let link = s.pools.join("swap");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
    (user, copy, private, link)
}

/// `n` readings of root's `status --json --all` while a thread exchanges `a` and `b`
/// again and again, then the two put back as they were: the readings, and how many
/// exchanges were made.
fn readings_while_swapping(s: &Scratch, a: &Path, b: &Path, n: usize) -> (Vec<Output>, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let (a, b) = (c(a), c(b));
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert!(exchange(&a, &b), "{}", std::io::Error::last_os_error());
                swaps += 1;
            }
            if swaps % 2 == 1 {
                assert!(exchange(&a, &b));
            }
            swaps
        })
    };
    let readings = (0..n)
        .map(|_| run(&mut s.gpucap(&["status", "--json", "--all"])))
        .collect();
    stop.store(true, Ordering::Relaxed);
    (readings, swapper.join().unwrap())
}

#[test]
fn a_users_directory_swapped_for_a_link_while_root_reads_it_is_never_followed() {
    if !as_root("reading every user's directory") {
        return;
    }
    let s = Scratch::new("readers-swapped");
    // uid 65534's pool of its own (a copy), and a file in the private directory named as
    // a dead lone process's would be.
    let (user, _, private, link) = hidden_beside(&s, "own.pool");
    let lone = private.join("4242-1.lone");
    std::fs::write(&lone, b"").unwrap();
    let (readings, swaps) = readings_while_swapping(&s, &user, &link, READINGS);

    assert!(swaps > READINGS as u64);
    assert!(std::fs::symlink_metadata(&user).unwrap().is_dir());
    for o in &readings {
        assert_ok(o);
    }
    let named: Vec<String> = readings
        .iter()
        .map(stdout)
        .filter(|out| out.contains("hidden"))
        .collect();
    let shown = named
        .iter()
        .filter(|o| o.contains("\"name\":\"hidden\""))
        .count();
    // The user's own pool is read where its directory was there to read: the reader
    // does not just leave a directory being swapped out.
    let own = readings
        .iter()
        .filter(|o| stdout(o).contains("\"name\":\"own\""))
        .count();
    assert!(
        own > 0,
        "no reading of {READINGS} showed uid 65534's own pool"
    );
    assert!(
        named.is_empty() && lone.exists(),
        "of {READINGS} readings {} named the private directory's pool ({shown} showed it), \
         and {} was {}: {named:?}",
        named.len(),
        lone.display(),
        if lone.exists() { "left" } else { "removed" },
    );
}

/// The same swap for a pool file its member removed and announces (anyone may remove
/// their own file while a process holds it; root's readers then look for it by its
/// path first): root's private `hidden.pool`, where the link leads, is never shown as
/// the announced file (before: 3 and 8 of 40 readings here showed it, uid 0, at uid
/// 65534's path; 21 of 100 in the review that found it).
#[test]
fn a_removed_pool_files_directory_swapped_for_a_link_is_never_followed() {
    use std::os::unix::fs::MetadataExt;
    if !as_root("reading every user's directory") {
        return;
    }
    let s = Scratch::new("readers-swapped-removed");
    let (user, theirs, _, link) = hidden_beside(&s, "hidden.pool");
    // uid 65534's process holds its file (descriptor 3), which is then removed.
    let mut holder = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg("exec 3<\"$0\"; echo held; exec sleep 600")
        .arg(&theirs)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "held");
    let meta = std::fs::metadata(&theirs).unwrap();
    std::fs::remove_file(&theirs).unwrap();
    let name = format!(
        "gpucap-pool/65534/{:016x}/{:x}/{:x}/{}/3",
        super::readers::path_hash(&theirs),
        meta.dev(),
        meta.ino(),
        holder.id()
    );
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let beacon = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
    let (readings, swaps) = readings_while_swapping(&s, &user, &link, 2 * READINGS);
    drop(beacon);
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(holder.id() as i32, libc::SIGKILL) };
    let _ = holder.wait();

    assert!(swaps > READINGS as u64);
    let mut shown = 0;
    for o in &readings {
        assert_ok(o);
        let doc: serde_json::Value = serde_json::from_str(&stdout(o)).unwrap();
        shown += doc["pools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"] == "hidden" && p["uid"] == 0)
            .count();
    }
    assert_eq!(
        shown,
        0,
        "root's private pool shown in {shown} of {} readings",
        readings.len()
    );
}
