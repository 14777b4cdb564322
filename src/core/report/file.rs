//! The report file: `%p` in its name, this process's facts, the atomic write and the
//! merge of entries under a lock.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::schema::{Entry, ProcessReport, entries_of, render};

/// `template` with `%p` replaced by `pid` and `%%` by `%` (other `%` sequences are
/// kept as written), and whether it named a per-process file (had `%p`).
pub fn expand_path(template: &Path, pid: u32) -> (PathBuf, bool) {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = template.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(bytes.len() + 8);
    let mut per_process = false;
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'%', Some(b'p')) => {
                out.extend_from_slice(pid.to_string().as_bytes());
                per_process = true;
                i += 2;
            }
            (b'%', Some(b'%')) => {
                out.push(b'%');
                i += 2;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    (
        PathBuf::from(std::ffi::OsString::from_vec(out)),
        per_process,
    )
}

// ---- this process ---------------------------------------------------------------------

/// `/proc/self/cmdline` split at NULs (lossily decoded); empty if unreadable.
pub fn own_cmdline() -> Vec<String> {
    let Ok(bytes) = fs::read("/proc/self/cmdline") else {
        return Vec::new();
    };
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(&bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// This process's start time in clock ticks since boot (field 22 of /proc/self/stat).
pub fn own_start_time() -> Option<u64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ---- the file -------------------------------------------------------------------------

/// Reads a report file: every entry that has the version-1 fields.
pub fn read_report(path: &Path) -> Result<Vec<ProcessReport>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let entries =
        entries_of(&text).ok_or_else(|| format!("{} is not a gpucap report", path.display()))?;
    Ok(entries.iter().filter_map(Entry::report).collect())
}

/// Writes `contents` to `path` through a temporary file in the same directory and a
/// rename, so that a reader sees the old file or the new one, never a part. `mode`,
/// if given, is set on the file whatever the umask.
pub fn write_atomically(path: &Path, contents: &[u8], mode: Option<u32>) -> std::io::Result<()> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map_or("report".into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(contents)?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        f.sync_data()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Adds (or replaces, by `id`) `entry` in the report at `path`, creating the file.
///
/// A shared path (no `%p`) is updated under an exclusive `flock` on `PATH.lock` (left
/// in place: removing a lock file would race with the next writer): read, replace or
/// append this process's entry, write a temporary file, rename. A per-process path has
/// one writer at a time (this process, serialised by the caller), so it needs no lock.
/// An existing file that is not a gpucap report is never overwritten: the entry goes to
/// `PATH.<pid>` instead. Returns the path written.
pub fn write_entry(
    path: &Path,
    per_process: bool,
    entry: &ProcessReport,
) -> Result<PathBuf, String> {
    update_entries(path, per_process, entry, false)
}

/// [`write_entry`] for a process about to `exec` another program, which keeps its pid
/// and start time (its entry's `id`): the entry goes in as `<id>.exec<N>` (N counting
/// this process's programs before the new one, from 1), its `id` entry of a refusal
/// taken out, so that the new program's entry does not replace the figures of this one.
pub fn write_entry_before_exec(
    path: &Path,
    per_process: bool,
    entry: &ProcessReport,
) -> Result<PathBuf, String> {
    update_entries(path, per_process, entry, true)
}

/// What marks the entry of a program its process `exec`ed another from: `<id>.exec<N>`.
const EXEC_MARK: &str = ".exec";

/// The process an entry's `id` is of (a program before an `exec` and the one after it
/// are one process), and whether it is a program's before an `exec`.
pub fn process_of(id: &str) -> (&str, bool) {
    match id.find(EXEC_MARK) {
        Some(i) => (&id[..i], true),
        None => (id, false),
    }
}

fn update_entries(
    path: &Path,
    per_process: bool,
    entry: &ProcessReport,
    before_exec: bool,
) -> Result<PathBuf, String> {
    let _lock = if per_process {
        None
    } else {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                format!(
                    "cannot open the lock file {}: {e}",
                    Path::new(&lock_path).display()
                )
            })?;
        f.lock()
            .map_err(|e| format!("cannot lock {}: {e}", Path::new(&lock_path).display()))?;
        Some(f) // unlocked when closed
    };
    let mut text = String::new();
    let existing = match File::open(path) {
        Ok(mut f) => {
            f.read_to_string(&mut text)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let (target, mut entries) = if !existing || text.trim().is_empty() {
        (path.to_path_buf(), Vec::new())
    } else {
        match entries_of(&text) {
            Some(e) => (path.to_path_buf(), e),
            None => {
                let mut alt = path.as_os_str().to_owned();
                alt.push(format!(".{}", entry.pid));
                let alt = PathBuf::from(alt);
                return write_atomically(&alt, render(&[Entry::of(entry)]).as_bytes(), None)
                    .map(|()| alt.clone())
                    .map_err(|e| format!("cannot write {}: {e}", alt.display()));
            }
        }
    };
    if before_exec {
        let prefix = format!("{}{EXEC_MARK}", entry.id);
        let earlier = entries
            .iter()
            .filter(|e| e.id().is_some_and(|id| id.starts_with(&prefix)))
            .count();
        entries.retain(|e| e.id().as_deref() != Some(entry.id.as_str()));
        let renamed = ProcessReport {
            id: format!("{prefix}{}", earlier + 1),
            ..entry.clone()
        };
        entries.push(Entry::of(&renamed));
    } else {
        let mine = Entry::of(entry);
        match entries
            .iter_mut()
            .find(|e| e.id().as_deref() == Some(entry.id.as_str()))
        {
            Some(slot) => *slot = mine,
            None => entries.push(mine),
        }
    }
    write_atomically(&target, render(&entries).as_bytes(), None)
        .map_err(|e| format!("cannot write {}: {e}", target.display()))?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn percent_p() {
        let e = |t: &str| expand_path(Path::new(t), 123);
        assert_eq!(
            e("/tmp/r-%p.json"),
            (PathBuf::from("/tmp/r-123.json"), true)
        );
        assert_eq!(e("/tmp/r.json"), (PathBuf::from("/tmp/r.json"), false));
        assert_eq!(e("/tmp/%%p-%p%"), (PathBuf::from("/tmp/%p-123%"), true));
        assert_eq!(e("%d%"), (PathBuf::from("%d%"), false));
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpucap-report-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn shared_file_merges_and_replaces_by_id() {
        let dir = scratch("merge");
        let path = dir.join("r.json");
        assert_eq!(write_entry(&path, false, &sample(1, false)).unwrap(), path);
        write_entry(&path, false, &sample(2, true)).unwrap();
        write_entry(&path, false, &sample(1, true)).unwrap(); // replaces pid 1's entry
        let all = read_report(&path).unwrap();
        assert_eq!(
            all.iter().map(|p| (p.pid, p.exited)).collect::<Vec<_>>(),
            [(1, true), (2, true)]
        );
        // No temporary file is left behind; the lock file stays.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(dir.join("r.json.lock").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_program_a_process_execs_keeps_its_entry() {
        let dir = scratch("exec");
        let path = dir.join("r-1.json");
        // The first program, refused (running), then exec'ing; the second, exec'ing;
        // the third, exiting: three entries, none replacing another.
        write_entry(&path, true, &sample(1, false)).unwrap();
        write_entry_before_exec(&path, true, &sample(1, true)).unwrap();
        write_entry_before_exec(&path, true, &sample(1, true)).unwrap();
        write_entry(&path, true, &sample(1, true)).unwrap();
        let all = read_report(&path).unwrap();
        assert_eq!(
            all.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["1-77.exec1", "1-77.exec2", "1-77"]
        );
        assert!(all.iter().all(|p| p.exited));
        assert_eq!(process_of("1-77.exec2"), ("1-77", true));
        assert_eq!(process_of("1-77"), ("1-77", false));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_foreign_file_is_never_overwritten() {
        let dir = scratch("foreign");
        let path = dir.join("notes.txt");
        fs::write(&path, "my notes").unwrap();
        let written = write_entry(&path, true, &sample(9, true)).unwrap();
        assert_eq!(written, dir.join("notes.txt.9"));
        assert_eq!(fs::read_to_string(&path).unwrap(), "my notes");
        assert_eq!(read_report(&written).unwrap().len(), 1);
        assert!(write_entry(&dir.join("no/such/dir/r.json"), true, &sample(9, true)).is_err());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn own_process() {
        assert!(!own_cmdline().is_empty());
        assert!(own_start_time().is_some());
    }
}
