//! Secure execution: a set-user-ID or set-group-ID program, or one with file
//! capabilities, started by another user (the kernel's `AT_SECURE`). The library reaches
//! such a program only through `/etc/ld.so.preload` (the C library ignores `LD_PRELOAD`
//! there), and its environment is the user's while it runs as someone else: a path the
//! environment names (a report to write, a pool's directory or file, a claim's
//! directory) would be made, written or renamed over as that someone else. The pool's
//! variables and those paths are dropped, as the C library's `secure_getenv` drops every
//! variable; the cap, the log level and growth mode stay (the environment may still only
//! lower a cap handed down), and the process is capped alone.

use std::ffi::OsString;

/// The variables dropped in secure execution: every one that names a file, a directory
/// or a pool (whose file lies in a directory of the environment's choosing).
const SECURE_DROPPED: &[&str] = &[
    "GPUCAP_REPORT",
    "GPUCAP_POOL",
    "GPUCAP_POOL_DIR",
    "GPUCAP_CLAIM_DIR",
    "GPUCAP_GUARANTEE",
    "GPUCAP_CEILING",
    "GPUCAP_WAIT",
    "GPUCAP_POOL_MEMBERS",
    "GPUCAP_HOME",
    "GPUCAP_LIB",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
];

/// Takes out of `vars` those `SECURE_DROPPED` names; the line that says so (None: none
/// was set).
pub fn drop_in_secure_execution(vars: &mut Vec<(OsString, OsString)>) -> Option<String> {
    let mut dropped: Vec<String> = Vec::new();
    vars.retain(|(k, _)| {
        let drop = SECURE_DROPPED
            .iter()
            .any(|d| k.as_encoded_bytes() == d.as_bytes());
        if drop && !dropped.iter().any(|n| k.as_encoded_bytes() == n.as_bytes()) {
            dropped.push(k.to_string_lossy().into_owned());
        }
        !drop
    });
    (!dropped.is_empty()).then(|| {
        format!(
            "this program runs as another user than the one who started it (set-user-ID, \
             set-group-ID or file capabilities): {} ignored, since a path or pool the \
             environment names would be used as that other user; the process is capped alone",
            dropped.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn paths_and_pools_are_dropped_the_cap_and_log_level_kept() {
        let mut v = vars(&[
            ("GPUCAP_LIMIT", "1Gi"),
            ("GPUCAP_REPORT", "/etc/passwd"),
            ("GPUCAP_LOG", "debug"),
            ("GPUCAP_POOL", "train"),
            ("GPUCAP_POOL_DIR", "/etc"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/etc/x.cache"),
        ]);
        let line = drop_in_secure_execution(&mut v).expect("a line");
        assert_eq!(v, vars(&[("GPUCAP_LIMIT", "1Gi"), ("GPUCAP_LOG", "debug")]));
        assert!(
            line.contains(
                "GPUCAP_REPORT, GPUCAP_POOL, GPUCAP_POOL_DIR, CUDA_DEVICE_MEMORY_SHARED_CACHE \
                 ignored"
            ),
            "{line}"
        );
        let mut v = vars(&[("GPUCAP_LIMIT", "1Gi")]);
        assert_eq!(drop_in_secure_execution(&mut v), None);
        assert_eq!(v.len(), 1);
    }
}
