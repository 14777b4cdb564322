//! Which pools a `gpucap metrics` server or `status --prometheus` reads, and reading
//! them read-only (README.md, "Metrics").

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpucap_core::budget::PoolView;
use gpucap_core::config::PoolSpec;
use gpucap_pool_file::{PoolFile, Sharing};

use super::{Reading, UnreadableFiles};
use crate::pool::{self, EXIT_NO_POOL_FILE, Located};
use crate::procs::{LoneReading, Sources, Unread, user_name};

/// Which pools a [`Reader`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Which {
    /// These pools (labelled by their name, or path), in this order.
    Pools(Vec<PoolSpec>),
    /// What `gpucap status` shows (`procs::Sources`, read at each reading): every pool
    /// of this user's pool directory (root: of every user's), every process capped on
    /// its own there, and the containers' pools.
    All,
}

/// An open pool file, and which file it is.
struct Opened {
    id: (u64, u64),
    file: PoolFile,
}

/// Reads pools, again at each [`Reader::read`]. A file is opened once and kept while
/// its path names the same file (device and inode): a pool file is never unmapped
/// (`PoolFile`), so opening it at every scrape would add a mapping per scrape. A file
/// that is replaced or removed has its descriptor closed; its 420 KiB read-only mapping
/// stays, one per file replaced while the server runs.
pub struct Reader {
    which: Which,
    pool_dir: Option<PathBuf>,
    open: HashMap<PathBuf, Opened>,
    /// `--all`: `status`'s reader (which keeps its own files open), what it found last
    /// besides the pools: the lone processes, and the lines of what it could not read
    /// or read all the same.
    all: Option<All>,
    /// HAMi's series too (`--hami`): who each process is in Kubernetes, from /proc.
    hami: Option<super::workload::FromProc>,
}

struct All {
    sources: Sources,
    lone: Vec<LoneReading>,
    notes: Vec<String>,
    /// Per user, the files named like pool files that are not pools.
    unreadable: Vec<UnreadableFiles>,
}

impl Reader {
    pub fn new(which: Which, pool_dir: Option<PathBuf>) -> Reader {
        let all = (which == Which::All).then(|| All {
            sources: Sources::new(pool_dir.clone(), crate::status::every_user()),
            lone: Vec::new(),
            notes: Vec::new(),
            unreadable: Vec::new(),
        });
        Reader {
            which,
            pool_dir,
            open: HashMap::new(),
            all,
            hami: None,
        }
    }

    /// With `hami`, the expositions carry HAMi's monitor series too (hami.rs).
    pub fn with_hami(mut self, hami: bool) -> Reader {
        self.hami = hami.then(super::workload::FromProc::new);
        self
    }

    /// How to name the processes in HAMi's series, if they are exported.
    pub fn hami(&self) -> Option<&dyn super::workload::Identify> {
        self.hami
            .as_ref()
            .map(|h| h as &dyn super::workload::Identify)
    }

    /// What it reads, for the server's first line.
    pub fn describe(&self) -> String {
        match &self.which {
            Which::Pools(specs) => {
                let names: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
                format!(
                    "pool{} {}",
                    if names.len() == 1 { "" } else { "s" },
                    names.join(", ")
                )
            }
            Which::All => match self.user_dir() {
                Ok(Located::File(d) | Located::NotYet(d)) if self.every_user() => {
                    let base = d.parent().map(Path::to_path_buf).unwrap_or_default();
                    format!("every user's pools in {}", base.display())
                }
                Ok(Located::File(d) | Located::NotYet(d)) => {
                    format!("every pool in {}", d.display())
                }
                Err(e) => format!("every pool of the pool directory ({e})"),
            },
        }
    }

    /// Whether every user's directory is read (`--all` as root).
    fn every_user(&self) -> bool {
        self.all.as_ref().is_some_and(|a| a.sources.every_user())
    }

    /// With `--all`: whether the pool directory can be used (a directory that does not
    /// exist yet, made by the first member, can). The line to print if not. Root reads
    /// every user's directory, as its `status` does: its own being unusable is a line
    /// beside the others' pools ([`Reader::notes`]), not the end of the reading; a pool
    /// directory that is not a directory is.
    pub fn check_dir(&self) -> Result<(), String> {
        if self.which != Which::All {
            return Ok(());
        }
        match self.user_dir() {
            Ok(_) => Ok(()),
            Err(_) if self.every_user() && self.base_is_dir() => Ok(()),
            Err(e) => Err(format!("gpucap: --all: {e}")),
        }
    }

    /// The pool directory (what holds the `gpucap-UID` directories) is a directory.
    fn base_is_dir(&self) -> bool {
        let all = self.all.as_ref();
        all.and_then(|a| a.sources.own_dir())
            .and_then(|d| d.parent().map(Path::to_path_buf))
            .is_some_and(|b| std::fs::metadata(b).is_ok_and(|m| m.is_dir()))
    }

    /// The pools, read now. Err: `--all`'s directory cannot be used (a line to print).
    pub fn read(&mut self) -> Result<Vec<Reading>, String> {
        if self.which == Which::All {
            return self.read_all();
        }
        let Which::Pools(specs) = &self.which else {
            return Ok(Vec::new());
        };
        // Claims whose members do not answer cost this scrape one patience in all.
        gpucap_pool_file::new_reading_round();
        let targets: Vec<(String, PoolSpec)> =
            specs.iter().map(|s| (s.to_string(), s.clone())).collect();
        let mut seen = Vec::new();
        let readings = targets
            .into_iter()
            .map(|(label, spec)| {
                let result = self.read_one(&spec, &mut seen);
                let user = match &result {
                    Ok((_, _, uid)) => user_name(*uid),
                    Err(_) => self.owner_unread(&spec),
                };
                let result = result.map(|(path, view, _)| (path, view));
                Reading {
                    label,
                    user,
                    result,
                }
            })
            .collect();
        // Files no longer read (removed, or replaced: reopened under the same path):
        // close their descriptors.
        self.open.retain(|path, o| {
            let keep = seen.contains(path);
            if !keep {
                o.file.locks.forget_in_child();
            }
            keep
        });
        Ok(readings)
    }

    /// `--all`: what `status` reads ([`Sources`]), as readings; the pool files of the
    /// directories that could not be read are `up 0`, the other files named like pool
    /// files are counted per user, with one line each user.
    fn read_all(&mut self) -> Result<Vec<Reading>, String> {
        self.check_dir()?;
        let all = self.all.as_mut().expect("--all has its sources");
        let (pools, lone, errors, warnings) = all
            .sources
            .read()
            .map_err(|e| format!("gpucap: --all: {e}"))?;
        let (unread, junk): (Vec<&Unread>, Vec<&Unread>) =
            all.sources.unread().iter().partition(|u| u.pool_like);
        let readings: Vec<(Reading, PathBuf)> = pools
            .into_iter()
            .map(|p| {
                let file = p.file.clone();
                let r = Reading {
                    label: label_of(&p.file, &p.name),
                    user: p.user,
                    result: Ok((p.file, p.view)),
                };
                (r, file)
            })
            .chain(unread.iter().map(|u| {
                let r = Reading {
                    label: label_of(&u.path, &u.name),
                    user: user_name(u.uid),
                    result: Err((2, format!("gpucap: {}", u.error))),
                };
                (r, u.path.clone())
            }))
            .collect();
        let readings = distinct(readings);
        // Each unread file's line is its reading's, or its user's count's (a set: the
        // errors and the unread files are as many as the files).
        let said: std::collections::HashSet<&str> = all
            .sources
            .unread()
            .iter()
            .map(|u| u.error.as_str())
            .collect();
        let (counts, lines) = junk_by_user(&junk);
        all.notes = errors
            .into_iter()
            .filter(|e| !said.contains(e.as_str()))
            .map(|e| format!("gpucap: {e}"))
            .chain(lines)
            .chain(warnings.into_iter().map(|w| format!("gpucap: {w}")))
            .collect();
        all.unreadable = counts;
        all.lone = lone;
        Ok(readings)
    }

    /// With `--all`: the last reading's files named like pool files that are not pools,
    /// counted per user (`gpucap_pool_files_unreadable`). Else none.
    pub fn unreadable(&self) -> &[UnreadableFiles] {
        self.all.as_ref().map_or(&[], |a| &a.unreadable)
    }

    /// With `--all`: the processes capped on their own, as the last reading found them
    /// (a dead one's file removed). Else none.
    pub fn lone(&self) -> &[LoneReading] {
        self.all.as_ref().map_or(&[], |a| &a.lone)
    }

    /// With `--all`: the last reading's lines about what it could not read, or read all
    /// the same though it should not be as it is (root's own directory writable by
    /// others), besides the pools' (`up 0`). Else none.
    pub fn notes(&self) -> &[String] {
        self.all.as_ref().map_or(&[], |a| &a.notes)
    }

    /// The `user` of a pool named that could not be read: its file's owner where there
    /// is a file, else the reader's own user (a pool of its directory, or at a path, is
    /// made by its members, who run as it: the series keeps its `user` once they come),
    /// or none for a claim's or the container's (every user's).
    fn owner_unread(&self, spec: &PoolSpec) -> String {
        let path = match pool::locate(spec, self.pool_dir.as_deref()) {
            Ok(Located::File(p) | Located::NotYet(p)) => Some(p),
            Err(_) => None,
        };
        match path.and_then(|p| std::fs::symlink_metadata(p).ok()) {
            Some(m) => user_name(m.uid()),
            None if Sharing::of(spec) == Sharing::Claim => String::new(),
            None => user_name(gpucap_pool_file::own_uid()),
        }
    }

    /// This user's pool directory (`gpucap-UID` in the pool directory), checked as a
    /// member would check it; `NotYet` when no process made it yet.
    fn user_dir(&self) -> Result<Located, String> {
        let any = PoolSpec::Name("any".into());
        match pool::locate(&any, self.pool_dir.as_deref())? {
            Located::File(p) => Ok(Located::File(parent(&p))),
            Located::NotYet(p) => Ok(Located::NotYet(parent(&p))),
        }
    }

    fn read_one(
        &mut self,
        spec: &PoolSpec,
        seen: &mut Vec<PathBuf>,
    ) -> Result<(PathBuf, PoolView, u32), (i32, String)> {
        let path = match pool::locate(spec, self.pool_dir.as_deref())
            .map_err(|e| (2, format!("gpucap: pool {spec}: {e}")))?
        {
            Located::NotYet(p) | Located::File(p) => p,
        };
        // No file there: the one that was, removed while its members run, is read through
        // a member's descriptor where one announces it (`open_reader`), opened again each
        // time.
        let id = match std::fs::symlink_metadata(&path) {
            Ok(m) => Some((m.dev(), m.ino())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err((2, format!("gpucap: {}: {e}", path.display()))),
        };
        // The identity is taken before opening: if the file is replaced in between,
        // the next reading sees another identity and opens it again.
        if id.is_none_or(|id| self.open.get(&path).is_none_or(|o| o.id != id)) {
            let file = gpucap_pool_file::open_reader(&path, Sharing::of(spec)).map_err(|e| {
                if path.exists() {
                    (2, format!("gpucap: {e}"))
                } else {
                    (EXIT_NO_POOL_FILE, no_file(&path))
                }
            })?;
            let id = id.unwrap_or_default();
            if let Some(old) = self.open.insert(path.clone(), Opened { id, file }) {
                old.file.locks.forget_in_child();
            }
        }
        seen.push(path.clone());
        let o = &self.open[&path];
        let view = o.file.view().map_err(|e| (2, format!("gpucap: {e}")))?;
        let uid = o.file.identity().map_or(0, |(_, _, uid)| uid);
        Ok((path, view, uid))
    }
}

/// The files named like pool files that are not pools (`junk`, in the order read: each
/// directory's together), counted per user (one user may have a directory in /dev/shm
/// and one in /tmp), and a line for each directory: the count, and its first file's line
/// (`gpucap status` lists each).
fn junk_by_user(junk: &[&Unread]) -> (Vec<UnreadableFiles>, Vec<String>) {
    let mut counts: Vec<(u32, u64)> = Vec::new();
    let mut dirs: Vec<(PathBuf, u64, &Unread)> = Vec::new();
    for u in junk {
        match counts.iter_mut().find(|(uid, _)| *uid == u.uid) {
            Some((_, n)) => *n += 1,
            None => counts.push((u.uid, 1)),
        }
        let dir = parent(&u.path);
        match dirs.iter_mut().find(|(d, _, _)| *d == dir) {
            Some((_, n, _)) => *n += 1,
            None => dirs.push((dir, 1, u)),
        }
    }
    let lines = dirs
        .into_iter()
        .map(|(dir, files, first)| {
            let what = if files == 1 {
                "file named like a pool file is not a gpucap pool file"
            } else {
                "files named like pool files are not gpucap pool files"
            };
            format!(
                "gpucap: {}: {files} {what} (counted in \
                 gpucap_pool_files_unreadable{{user=\"{}\"}}; gpucap status lists each): the \
                 first, {}",
                dir.display(),
                user_name(first.uid),
                first.error
            )
        })
        .collect();
    let counts = counts
        .into_iter()
        .map(|(uid, files)| UnreadableFiles {
            user: user_name(uid),
            files,
        })
        .collect();
    (counts, lines)
}

/// `--all`'s readings, each with its file: two with one label and user (one user's pools
/// of one name in /dev/shm and /tmp) the later ones labelled by their path, never the
/// same series twice; a file that could not be read (its `up 0`) too.
fn distinct(mut readings: Vec<(Reading, PathBuf)>) -> Vec<Reading> {
    let mut taken = std::collections::HashSet::new();
    for (r, path) in &mut readings {
        if !taken.insert((r.label.clone(), r.user.clone())) {
            r.label = path.to_string_lossy().into_owned();
        }
    }
    readings.into_iter().map(|(r, _)| r).collect()
}

/// The `pool` label of a pool `--all` read, named `name`: its name where that names it
/// among its user's pools (a file of a `gpucap-UID` directory; a container's pool, by
/// its `gpucap-container-…` directory), else its file's path (a pool at a path, a
/// claim's), as `--pool PATH` labels it.
fn label_of(file: &Path, name: &str) -> String {
    let dir = file
        .parent()
        .and_then(Path::file_name)
        .and_then(|d| d.to_str());
    let named = dir.is_some_and(|d| {
        d.strip_prefix("gpucap-")
            .is_some_and(|r| r.starts_with("container-") || r.bytes().all(|b| b.is_ascii_digit()))
    });
    if named {
        name.to_string()
    } else {
        file.to_string_lossy().into_owned()
    }
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn no_file(path: &Path) -> String {
    format!(
        "gpucap: no pool file at {} (no process has joined it yet){}",
        path.display(),
        crate::pool_names::suggestion(path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One user's pool `x` read in /dev/shm and a file of that name in /tmp that could
    /// not be read: two `gpucap_pool_up` series, the later one by its path (before, the
    /// unread one kept the label: `gpucap_pool_up{pool="x",user="root"}` 1 and 0).
    #[test]
    fn a_pool_that_could_not_be_read_is_never_the_same_series_as_another() {
        let view = crate::procs::tests::pool().view;
        let read = |label: &str, user: &str, result| Reading {
            label: label.into(),
            user: user.into(),
            result,
        };
        let shm = PathBuf::from("/dev/shm/gpucap-0/x.pool");
        let tmp = PathBuf::from("/tmp/gpucap-0/x.pool");
        let other = PathBuf::from("/tmp/gpucap-1000/x.pool");
        let got = distinct(vec![
            (read("x", "root", Ok((shm.clone(), view))), shm),
            (read("x", "root", Err((2, "not a pool".into()))), tmp),
            (read("x", "alice", Err((2, "not a pool".into()))), other),
        ]);
        let labels: Vec<(&str, &str)> = got
            .iter()
            .map(|r| (r.label.as_str(), r.user.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("x", "root"),
                ("/tmp/gpucap-0/x.pool", "root"),
                ("x", "alice")
            ]
        );
    }
}
