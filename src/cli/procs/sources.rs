//! Where the rows come from: this user's pool directory (root: every user's), its
//! pool files (each opened once and kept while it stays the same file: a pool file's
//! mapping is never unmapped, so a refreshing `top` must not open it again each time)
//! and its lone processes' files (a dead one's removed by `read_lone_dir`).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use gpucap_pool_file::{PoolFile, Sharing};

use super::{LoneReading, PoolReading, user_name};

/// What one reading found: the pools, the lone processes, the files that could not be
/// read (each with why), and what was read all the same though it should not be as it
/// is (root's own directory writable by others).
pub type Found = (Vec<PoolReading>, Vec<LoneReading>, Vec<String>, Vec<String>);

/// What is wrong with root's own pool directory (root's readers read every user's).
pub enum OwnDir {
    /// It cannot be read (the line says why): not among the directories read.
    Unusable(String),
    /// Writable by others, but a real directory of root's: read, and said.
    ReadAnyway(String),
}

/// A pool file of a directory read that could not be read (not a pool file, another
/// layout): its name, path, owner (the directory's user) and why (the line, among the
/// reading's errors too).
#[derive(Debug, Clone)]
pub struct Unread {
    pub name: String,
    pub path: PathBuf,
    pub uid: u32,
    pub error: String,
    /// Named as a pool can be (`NAME.pool`, NAME a pool name `GPUCAP_POOL` takes) and
    /// starting as a pool file does (its magic word): a pool this gpucap cannot read
    /// (another layout, damaged, a mode that lets others write it). Else any other file
    /// named `*.pool`, which anyone may make by the thousand in their own directory.
    pub pool_like: bool,
}

/// The directories read, and the pool files kept open.
pub struct Sources {
    pool_dir: Option<PathBuf>,
    every_user: bool,
    /// Pool files named by path, read beside the directories', each with its sharing.
    extra: Vec<(PathBuf, Sharing)>,
    /// Only the files of `extra` are read (`top --pool`: that pool, not every user's
    /// pools of its name).
    only: bool,
    open: HashMap<PathBuf, ((u64, u64), PoolFile)>,
    /// The last reading's pool files that could not be read, of the directories read.
    unread: Vec<Unread>,
}

impl Sources {
    /// This user's directory in `pool_dir` (`GPUCAP_POOL_DIR`, else the default); with
    /// `every_user`, every user's (what root reads).
    pub fn new(pool_dir: Option<PathBuf>, every_user: bool) -> Sources {
        raise_open_files_limit();
        Sources {
            pool_dir,
            every_user,
            extra: Vec::new(),
            only: false,
            open: HashMap::new(),
            unread: Vec::new(),
        }
    }

    /// Whether every user's directory is read (root's readers).
    pub fn every_user(&self) -> bool {
        self.every_user
    }

    /// The pool files of the directories read that the last reading could not read
    /// (each is among its errors too): a metrics reader's `gpucap_pool_up 0` for those
    /// [`Unread::pool_like`], its count of the others.
    pub fn unread(&self) -> &[Unread] {
        &self.unread
    }

    /// Reads the pool file at `path` only: no directory, no other pool (`top --pool`).
    /// A claim's file, or the container's pool's, is `sharing` Claim (every user's).
    pub fn only_pool_file(mut self, path: PathBuf, sharing: Sharing) -> Sources {
        self.extra.push((path, sharing));
        self.only = true;
        self
    }

    /// This user's directory in the pool directory (`gpucap-UID`), made or not.
    pub fn own_dir(&self) -> Option<PathBuf> {
        let any = gpucap_core::config::PoolSpec::Name("any".into());
        let file = gpucap_pool_file::path_of(&any, self.pool_dir.as_deref()).ok()?;
        file.parent().map(Path::to_path_buf)
    }

    /// The directories read now, and what is wrong with root's own where something is.
    /// Err: this user's own cannot be used (a link, not a directory, another user's,
    /// writable by others).
    pub fn dirs(&self) -> Result<(Vec<PathBuf>, Option<OwnDir>), String> {
        if self.every_user {
            // Root's own is checked as any user's is (`every_user_dir` leaves it out
            // without a word: root's `status` said "no capped process"); where it cannot
            // be used, a line, and every other user's are read all the same: another
            // user who made it first must not blind root to every capped process.
            let own = gpucap_pool_file::user_dir(self.pool_dir.as_deref(), false).err();
            // Where the pool directory itself cannot be used (a GPUCAP_POOL_DIR mistyped),
            // there is no user's to read either: an error, as for any user (before: "no
            // capped process", the line after it, and exit status 0).
            let base = self
                .own_dir()
                .and_then(|d| d.parent().map(Path::to_path_buf));
            if let Some(e) = &own
                && !base.is_some_and(|b| std::fs::metadata(b).is_ok_and(|m| m.is_dir()))
            {
                return Err(e.clone());
            }
            let dirs = gpucap_pool_file::every_user_dir(self.pool_dir.as_deref());
            // Writable by others, it is still a real directory of root's: read.
            let read = self.own_dir().is_some_and(|d| dirs.contains(&d));
            let own = own.map(|e| {
                if read {
                    OwnDir::ReadAnyway(format!("{e} (what it holds is shown all the same)"))
                } else {
                    OwnDir::Unusable(e)
                }
            });
            return Ok((dirs, own));
        }
        Ok((
            gpucap_pool_file::user_dir(self.pool_dir.as_deref(), false)?
                .into_iter()
                .collect(),
            None,
        ))
    }

    /// Every pool and lone process, read now; the files that could not be read, each
    /// with why. Err: this user's directory cannot be used (a line to print).
    pub fn read(&mut self) -> Result<Found, String> {
        // Claims whose members do not answer cost this read one patience in all.
        gpucap_pool_file::new_reading_round();
        let mut pools = Vec::new();
        let mut lone = Vec::new();
        let mut errors = Vec::new();
        let mut warnings = Vec::new();
        let mut unread = Vec::new();
        // The files read: a set (anyone may make hundreds of thousands of pool files).
        let mut seen = std::collections::HashSet::new();
        let extra = self.extra.clone();
        for (path, sharing) in extra {
            match self.read_pool_as(&path, sharing) {
                Ok(p) => pools.push(p),
                Err(e) if self.only => errors.push(e),
                Err(_) => {}
            }
            seen.insert(path);
        }
        if self.only {
            return Ok((pools, lone, errors, warnings));
        }
        // Pools whose file was removed while their members run, read through a member's
        // descriptor (gpucap_pool_file's `beacon`): those of the directories read (a
        // removed `gpucap-UID` directory of the pool directory, for root), or named.
        let (dirs, own_unusable) = self.dirs()?;
        match own_unusable {
            Some(OwnDir::ReadAnyway(w)) => warnings.push(w),
            Some(OwnDir::Unusable(e)) => errors.push(e),
            None => {}
        }
        // This user's directory, made or not (a removed one's pools are still read).
        let own = self.own_dir();
        let base = own.as_deref().and_then(Path::parent);
        // A file of a `gpucap-UID` directory is UID's, in a directory (while it is there)
        // that is a real one of UID's: the rule the directories are read by
        // (`every_user_dir`), kept for a file reached through an announcement, which
        // anyone may make (a squatter's file, announced, was shown as UID's pool).
        let ours = |path: &Path, owner: u32| {
            if self.extra.iter().any(|(e, _)| e == path) {
                return true;
            }
            let Some(dir) = path.parent() else {
                return false;
            };
            let real = match std::fs::symlink_metadata(dir) {
                Ok(m) => m.is_dir() && m.uid() == owner,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            };
            dir_uid(dir) == Some(owner)
                && real
                && (Some(dir) == own.as_deref()
                    || dirs.iter().any(|x| x == dir)
                    || (self.every_user && dir.parent() == base))
        };
        let removed: Vec<_> = gpucap_pool_file::removed_pool_files(self.every_user)
            .into_iter()
            .filter(|(p, _, owner)| ours(p, *owner))
            .collect();
        for (path, sharing, owner) in removed {
            if seen.contains(&path) {
                continue;
            }
            match self.read_announced(&path, sharing, owner) {
                Ok(p) => pools.push(p),
                Err(e) => errors.push(e),
            }
            seen.insert(path);
        }
        for dir in dirs {
            // Held open and checked again, every name reached through it: its owner may
            // have swapped it for a link since it was looked at.
            let Some(owner) = dir_uid(&dir) else {
                continue;
            };
            let held = match gpucap_pool_file::HeldDir::open(&dir, owner) {
                Ok(Some(held)) => held,
                Ok(None) => continue,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            // A directory that cannot be listed is one line (its lone files' listing
            // would fail alike).
            let files = match pool_files(&held) {
                Ok(files) => files,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            for file in files {
                let path = held.shown_inside(&file);
                if seen.contains(&path) {
                    continue;
                }
                match self.read_pool_at(&path, &held.inside(&file), Sharing::Private) {
                    Ok(p) => pools.push(p),
                    Err(e) => {
                        let error = held.as_shown(&e);
                        let name = pool_name(&path, Sharing::Private).unwrap_or_default();
                        let pool_like = names_a_pool(&name) && held.starts_as_pool_file(&file);
                        unread.push(Unread {
                            name,
                            path: path.clone(),
                            uid: owner,
                            error: error.clone(),
                            pool_like,
                        });
                        errors.push(error);
                    }
                }
                seen.insert(path);
            }
            let (found, unshown) = gpucap_pool_file::read_lone_dir(&held);
            lone.extend(found.into_iter().map(|r| LoneReading {
                path: r.path.to_string_lossy().into_owned(),
                user: user_name(r.owner),
                view: r.view,
            }));
            errors.extend(unshown);
        }
        // Pools at a path outside the directories read (`GPUCAP_POOL=/path/x.pool`, a
        // claim's, a file renamed): found through their members' announcements, as the
        // removed ones are; each file once (a path read above may name it another way).
        // Only in the machine's view: a pool directory named (`GPUCAP_POOL_DIR`, a pod's
        // volume) is the view of that directory's pools.
        let read: std::collections::HashSet<(u64, u64)> = seen
            .iter()
            .filter_map(|p| self.open.get(p).map(|(id, _)| *id))
            .collect();
        let me = gpucap_pool_file::own_uid();
        let elsewhere = match &self.pool_dir {
            // And the containers' pools where they are kept (`/dev/shm`) whose file was
            // removed while their members run: announced under a name no reader can turn
            // back into a path, but their directory says their members live.
            None => {
                let mut found = gpucap_pool_file::announced_pool_files(self.every_user);
                found.extend(
                    gpucap_pool_file::container_pools(None)
                        .into_iter()
                        .filter(|(path, _)| std::fs::symlink_metadata(path).is_err())
                        .map(|(path, owner)| (path, Sharing::Claim, owner)),
                );
                found
            }
            // The directory's containers' pools (`gpucap-container-NS/gpucap.pool`, every
            // user's): before, a pool directory named showed its users' pools only.
            Some(dir) => gpucap_pool_file::container_pools(Some(dir))
                .into_iter()
                .map(|(path, owner)| (path, Sharing::Claim, owner))
                .collect(),
        };
        for (path, sharing, owner) in elsewhere {
            let id = std::fs::symlink_metadata(&path).map(|m| (m.dev(), m.ino()));
            if seen.contains(&path)
                || id.as_ref().is_ok_and(|id| read.contains(id))
                || (!self.every_user && sharing == Sharing::Private && owner != me)
            {
                continue;
            }
            match self.read_announced(&path, sharing, owner) {
                Ok(p) => pools.push(p),
                Err(e) => errors.push(e),
            }
            seen.insert(path);
        }
        self.open.retain(|path, (_, file)| {
            let keep = seen.contains(path);
            if !keep {
                file.locks.forget_in_child(); // closes its descriptor
            }
            keep
        });
        self.unread = unread;
        Ok((pools, lone, errors, warnings))
    }

    /// [`Self::read_pool_as`] for a file a member announces, whose owner (`owner`, what
    /// the member's descriptor gives) the file opened must have: opened by its path, it
    /// may be another file (the path's directory swapped for a link to another since the
    /// announcement was read: root's private `hidden.pool` was shown as uid 65534's).
    fn read_announced(
        &mut self,
        path: &Path,
        sharing: Sharing,
        owner: u32,
    ) -> Result<PoolReading, String> {
        let reading = self.read_pool_as(path, sharing)?;
        if reading.uid != owner {
            return Err(format!(
                "{}: the file there is uid {}'s, not the announced file's owner's (uid \
                 {owner}): not shown",
                path.display(),
                reading.uid
            ));
        }
        Ok(reading)
    }

    /// The pool file at `path` (shared as `sharing`), or the one that was there, removed
    /// while its members run (shown with its path and `(removed)`).
    fn read_pool_as(&mut self, path: &Path, sharing: Sharing) -> Result<PoolReading, String> {
        self.read_pool_at(path, path, sharing)
    }

    /// [`Self::read_pool_as`] with the file reached at `at` (in a directory held open:
    /// [`gpucap_pool_file::HeldDir`]) and shown as `path`.
    fn read_pool_at(
        &mut self,
        path: &Path,
        at: &Path,
        sharing: Sharing,
    ) -> Result<PoolReading, String> {
        let there = match std::fs::symlink_metadata(at) {
            Ok(meta) => Some((meta.dev(), meta.ino())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if there.is_none_or(|id| self.open.get(path).is_none_or(|(i, _)| *i != id)) {
            let mut file = gpucap_pool_file::open_reader(at, sharing)?;
            // Named by its path from here (the held directory's descriptor is closed after
            // this reading; a later reading's lines must not name `/proc/self/fd/N`).
            file.path = path.to_path_buf();
            let id = file.identity().map(|(d, i, _)| (d, i)).unwrap_or_default();
            if let Some((_, old)) = self.open.insert(path.to_path_buf(), (id, file)) {
                old.locks.forget_in_child();
            }
        }
        let (_, file) = &self.open[path];
        let uid = file.identity().map_or(0, |(_, _, uid)| uid);
        // Reached through an announcement: the file opened must be the directory's
        // user's too (another process may announce the same path). A claim's or the
        // container's is every user's.
        if file.joined_through.is_some()
            && sharing == gpucap_pool_file::Sharing::Private
            && !self.extra.iter().any(|(e, _)| e == path)
            && path.parent().and_then(dir_uid) != Some(uid)
        {
            return Err(format!(
                "{}: the file a process announces there is uid {uid}'s, not its \
                 directory's user's: not shown",
                path.display()
            ));
        }
        let name = pool_name(path, sharing).unwrap_or_default();
        let path = match file.joined_through {
            Some(t) => format!(
                "{} (removed while its members run; read through {})",
                path.display(),
                t.via()
            ),
            None => path.to_string_lossy().into_owned(),
        };
        Ok(PoolReading {
            name,
            file: file.path.clone(),
            path,
            uid,
            user: user_name(uid),
            shared: sharing == Sharing::Claim,
            view: file.view()?,
        })
    }
}

/// The name a pool file at `path` (shared as `sharing`) is shown by: its file's name
/// without `.pool`, or for a claim's or the container's (always `gpucap.pool`) its
/// directory's. None where the path has no such name.
pub fn pool_name(path: &Path, sharing: Sharing) -> Option<String> {
    let named_by = match sharing {
        Sharing::Claim => path.parent().unwrap_or(path),
        Sharing::Private => path,
    };
    let n = named_by.file_name()?.to_str()?;
    Some(n.strip_suffix(".pool").unwrap_or(n).to_string())
}

/// Whether `name` is one a pool of a pool directory can have (`GPUCAP_POOL=NAME`: 1 to
/// 64 of A-Z a-z 0-9 . _ -, not starting with '.', not `off`).
fn names_a_pool(name: &str) -> bool {
    matches!(
        gpucap_core::config::parse_pool(name),
        Ok(Some(gpucap_core::config::PoolSpec::Name(_)))
    )
}

/// The uid a `gpucap-UID` directory's name gives (None: not such a name).
fn dir_uid(dir: &Path) -> Option<u32> {
    let uid = dir.file_name()?.to_str()?.strip_prefix("gpucap-")?;
    uid.parse::<u32>().ok().filter(|u| u.to_string() == uid)
}

/// The names of the pool files of `dir` (`NAME.pool`, regular files; one being made is
/// `.NAME….new`), sorted.
fn pool_files(dir: &gpucap_pool_file::HeldDir) -> Result<Vec<std::ffi::OsString>, String> {
    let mut files: Vec<std::ffi::OsString> = dir
        .list()?
        .into_iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name())
        .filter(|n| {
            n.to_str()
                .is_some_and(|n| !n.starts_with('.') && n.len() > 5 && n.ends_with(".pool"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Raises this process's soft limit on open descriptors to its hard limit: a reader
/// keeps a descriptor per pool file it reads (the metrics server one per connection
/// too), and the usual soft limit (1024) is far below the hard one (a service's
/// 524288): anyone may make a thousand pool files. Where it cannot, the limit stays,
/// and a pool or directory that cannot be opened is a line (`gpucap_pool_up 0`).
pub fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the plain struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit reads the struct; raising the soft limit to the hard one is allowed.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}
