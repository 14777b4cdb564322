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
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

#[test]
fn a_users_directory_swapped_for_a_link_while_root_reads_it_is_never_followed() {
    if !as_root("reading every user's directory") {
        return;
    }
    let s = Scratch::new("readers-swapped");
    // Root's pool, moved into a directory only root may read, with a file named as a
    // dead lone process's would be.
    assert_ok(&s.once("hidden", &["alloc:10Mi"]));
    // uid 65534's directory, with a pool of its own (a copy), and its link to the
    // private one.
    let (user, _) = s.copy_as_nobody("hidden", "gpucap-65534", "own.pool");
    let private = s.dir.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::rename(s.pool_file("hidden"), private.join("hidden.pool")).unwrap();
    let lone = private.join("4242-1.lone");
    std::fs::write(&lone, b"").unwrap();
    let link = s.pools.join("swap");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let (a, b) = (c(&user), c(&link));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(exchange(&a, &b), "{}", std::io::Error::last_os_error());
                swaps.fetch_add(1, Ordering::Relaxed);
            }
            // The directory back at its name.
            if swaps.load(Ordering::Relaxed) % 2 == 1 {
                assert!(exchange(&a, &b));
            }
        })
    };
    let readings: Vec<std::process::Output> = (0..READINGS)
        .map(|_| run(&mut s.gpucap(&["status", "--json", "--all"])))
        .collect();
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();

    assert!(swaps.load(Ordering::Relaxed) > READINGS as u64);
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
