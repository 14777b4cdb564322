//! Which pools a `gpucap metrics` server or `status --prometheus` reads, and reading
//! them read-only (README.md, "Metrics").

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpucap_core::budget::PoolView;
use gpucap_core::config::{self, PoolSpec};
use gpucap_pool_file::{PoolFile, Sharing};

use super::Reading;
use crate::pool::{self, EXIT_NO_POOL_FILE, Located};

/// Which pools a [`Reader`] reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Which {
    /// These pools (labelled by their name, or path), in this order.
    Pools(Vec<PoolSpec>),
    /// Every `NAME.pool` file in this user's pool directory, labelled `NAME`, listed at
    /// each reading, and every process capped on its own there.
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
    /// HAMi's series too (`--hami`): who each process is in Kubernetes, from /proc.
    hami: Option<super::workload::FromProc>,
}

impl Reader {
    pub fn new(which: Which, pool_dir: Option<PathBuf>) -> Reader {
        Reader {
            which,
            pool_dir,
            open: HashMap::new(),
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
                Ok(Located::File(d) | Located::NotYet(d)) => {
                    format!("every pool in {}", d.display())
                }
                Err(e) => format!("every pool of the pool directory ({e})"),
            },
        }
    }

    /// With `--all`: whether the pool directory can be used (a directory that does not
    /// exist yet, made by the first member, can). The line to print if not.
    pub fn check_dir(&self) -> Result<(), String> {
        match self.which {
            Which::All => self
                .user_dir()
                .map(|_| ())
                .map_err(|e| format!("gpucap: --all: {e}")),
            Which::Pools(_) => Ok(()),
        }
    }

    /// The pools, read now. Err: `--all`'s directory cannot be used (a line to print).
    pub fn read(&mut self) -> Result<Vec<Reading>, String> {
        // Claims whose members do not answer cost this scrape one patience in all.
        gpucap_pool_file::new_reading_round();
        let targets: Vec<(String, PoolSpec)> = match &self.which {
            Which::Pools(specs) => specs.iter().map(|s| (s.to_string(), s.clone())).collect(),
            Which::All => match self.list() {
                Ok(names) => names
                    .into_iter()
                    .map(|n| (n.clone(), PoolSpec::Name(n)))
                    // The containers' pools kept there, every user's (the pod's
                    // `/dev/shm` holds each of its containers'), named by directory.
                    .chain(
                        gpucap_pool_file::container_pools(self.pool_dir.as_deref())
                            .into_iter()
                            .filter_map(|(file, _)| {
                                let dir = file.parent()?.to_path_buf();
                                let name = dir.file_name()?.to_str()?.to_string();
                                Some((name, PoolSpec::Claim(dir)))
                            }),
                    )
                    .collect(),
                Err(e) => {
                    // Out of descriptors, the listing fails: those of files gone from
                    // their path are closed all the same, so that the next one can list.
                    self.open.retain(|path, o| {
                        let keep = std::fs::symlink_metadata(path)
                            .is_ok_and(|m| (m.dev(), m.ino()) == o.id);
                        if !keep {
                            o.file.locks.forget_in_child();
                        }
                        keep
                    });
                    return Err(e);
                }
            },
        };
        let mut seen = Vec::new();
        let readings = targets
            .into_iter()
            .map(|(label, spec)| {
                let result = self.read_one(&spec, &mut seen);
                Reading { label, result }
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

    /// With `--all`: the processes capped on their own in this user's pool directory
    /// (their `.lone` files; a dead one's removed), read now. Else none.
    pub fn lone(&self) -> Vec<gpucap_core::lone::LoneView> {
        match (&self.which, self.user_dir()) {
            (Which::All, Ok(Located::File(d))) => {
                match gpucap_pool_file::HeldDir::open(&d, gpucap_pool_file::own_uid()) {
                    Ok(Some(held)) => gpucap_pool_file::read_lone_dir(&held)
                        .0
                        .into_iter()
                        .map(|r| r.view)
                        .collect(),
                    _ => Vec::new(),
                }
            }
            _ => Vec::new(),
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

    /// The names of the pool files in this user's pool directory, sorted: regular
    /// files `NAME.pool` whose NAME is a valid pool name (a file being made is
    /// `.NAME.PID.RANDOM.new`), and those removed from it while their members run
    /// (gpucap_pool_file's `beacon`).
    fn list(&self) -> Result<Vec<String>, String> {
        let dir = match self.user_dir().map_err(|e| format!("gpucap: --all: {e}"))? {
            Located::NotYet(d) | Located::File(d) => d,
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e.filter_map(Result::ok).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("gpucap: --all: {}: {e}", dir.display())),
        };
        let removed = crate::pool_names::removed_file_names(&dir);
        let mut names: Vec<String> = entries
            .into_iter()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name())
            .chain(removed)
            .filter_map(|name| {
                let name = name.into_string().ok()?;
                let stem = name.strip_suffix(".pool")?;
                matches!(config::parse_pool(stem), Ok(Some(PoolSpec::Name(_))))
                    .then(|| stem.to_string())
            })
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn read_one(
        &mut self,
        spec: &PoolSpec,
        seen: &mut Vec<PathBuf>,
    ) -> Result<(PathBuf, PoolView), (i32, String)> {
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
        Ok((path, view))
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
