//! Root's `gpucap status` out of descriptors (docs/src/threat-model.md, "Squat a
//! directory": anyone may make a thousand pool files): what it cannot open is a line in
//! `errors[]`, never a pool gone silent.

use super::common;

use std::path::Path;

use common::pool_scratch::*;
use common::*;

/// `gpucap status --json --all` with `RLIMIT_NOFILE` set to `soft`/`hard`: its reading,
/// the paths of the pools it shows, and its error lines.
fn status_within(
    s: &Scratch,
    soft: u64,
    hard: u64,
) -> (serde_json::Value, Vec<String>, Vec<String>) {
    let mut cmd = s.gpucap(&["status", "--json", "--all"]);
    with_rlimit(&mut cmd, libc::RLIMIT_NOFILE, soft, hard);
    let o = run(&mut cmd);
    let doc: serde_json::Value = match serde_json::from_str(&stdout(&o)) {
        Ok(doc) => doc,
        Err(e) => panic!("limit {soft}/{hard}: no reading ({e}): {}", stderr(&o)),
    };
    let strings = |v: &serde_json::Value, key: Option<&str>| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .filter_map(|x| key.map_or(x, |k| &x[k]).as_str().map(str::to_string))
            .collect()
    };
    let shown = strings(&doc["pools"], Some("path"));
    let errors = strings(&doc["errors"], None);
    (doc, shown, errors)
}

/// Root's `status` out of descriptors (a hard limit on them it cannot raise, from 6 to
/// 40, and 32 pool files in two users' directories): every pool file is shown, or named
/// in `errors[]` with why, or its directory is; none gone silent, and no reading lost.
/// (A soft limit under the hard one is raised: by `status` itself, and by the driver's
/// `cuInit`, the fake's as the real one.)
#[test]
fn out_of_descriptors_every_pool_file_is_shown_or_a_line() {
    if !as_root("reading every user's directory") {
        return;
    }
    let s = Scratch::new("readers-descriptors");
    assert_ok(&s.once("p", &["alloc:10Mi"]));
    let own = s.pool_file("p").parent().unwrap().to_path_buf();
    let mut files = vec![s.pool_file("p")];
    for i in 0..30 {
        files.push(own.join(format!("p{i:02}.pool")));
        std::fs::copy(&files[0], files.last().unwrap()).unwrap();
    }
    let (theirs, file) = s.copy_as_nobody("p", "gpucap-65534", "theirs.pool");
    files.push(file);
    let paths: Vec<String> = files.iter().map(|f| f.to_str().unwrap().into()).collect();

    for limit in 6..=40u64 {
        let (doc, shown, errors) = status_within(&s, limit, limit);
        let dir_line = |d: &Path| {
            let d = format!("{}: ", d.display());
            errors
                .iter()
                .any(|e| e.starts_with(&d) && e.contains("cannot"))
        };
        for (f, path) in files.iter().zip(&paths) {
            assert!(
                shown.contains(path)
                    || errors
                        .iter()
                        .any(|e| e.contains(path.as_str()) && e.contains("Too many"))
                    || dir_line(f.parent().unwrap()),
                "limit {limit}: {path} neither shown nor said: {doc}"
            );
        }
        assert!(shown.len() + errors.len() >= files.len(), "{doc}");
    }
    assert!(theirs.exists());
}

/// Root's `status` where /proc is not mounted (a mount namespace of the test's own, /proc
/// unmounted in it): a user directory is read through `/proc/self/fd`, so it cannot be,
/// and says so in one line (before the line: every directory read as empty, nothing
/// said).
#[test]
fn without_proc_a_directory_that_cannot_be_read_is_a_line() {
    if !as_root("unmounting /proc in a mount namespace of the test's own") {
        return;
    }
    let s = Scratch::new("readers-no-proc");
    assert_ok(&s.once("p", &["alloc:10Mi"]));
    let inner = s.gpucap(&["status", "--json", "--all"]);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "sh", "-c", "umount -l /proc && exec \"$@\"", "sh"])
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let o = run(&mut cmd);
    assert_ok(&o);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let dir = s.pool_file("p").parent().unwrap().display().to_string();
    let lines: Vec<&str> = doc["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .filter(|e| e.starts_with(&format!("{dir}: ")))
        .collect();
    assert_eq!(lines.len(), 1, "{doc}");
    assert!(lines[0].contains("is /proc mounted?"), "{doc}");
}
