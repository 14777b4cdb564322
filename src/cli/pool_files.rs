//! `gpucap pool list` and `gpucap pool clean`: the pool files of this user's pool
//! directory, each with its members alive and dead, the bytes it holds and its last
//! use; removing those no process uses.
//!
//! Liveness is the members' own: a member holds its slot's lock while its process
//! lives (`gpucap_pool_file`'s locks); removal takes every slot's lock first, so a
//! pool in use is never removed, and a joiner arriving at the same moment is handled
//! there (`gpucap_pool_file::remove_unused`).

use std::path::{Path, PathBuf};

use gpucap_core::size::format_bytes;
use gpucap_pool_file::Removal;

use crate::pool::utc;
use crate::pool_names::{pool_names, suggestion};

/// Exit status of `pool clean NAME` when the pool is in use or does not exist.
pub const EXIT_NOT_REMOVED: i32 = 1;

/// One pool file, as `pool list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub path: PathBuf,
    /// The pids of the live members (as each sees itself).
    pub alive: Vec<u32>,
    pub dead: usize,
    /// Bytes the pool counts as held, on all its GPUs (dead members' included).
    pub held: u64,
    /// Of them, bytes held by members whose process died.
    pub held_by_dead: u64,
    /// The last time anything was seen to happen: the file made, a member joined, the
    /// file written (ms since the Unix epoch).
    pub last_use_ms: u64,
}

/// Reads one pool file of this user's directory.
pub fn entry(name: &str, path: &Path) -> Result<Entry, String> {
    entry_as(name, path, gpucap_pool_file::Sharing::Private)
}

/// Reads one pool file, shared as `sharing` (a claim's, the container's: every user's).
pub fn entry_as(
    name: &str,
    path: &Path,
    sharing: gpucap_pool_file::Sharing,
) -> Result<Entry, String> {
    let file = gpucap_pool_file::open_reader(path, sharing)?;
    let view = file.view()?;
    let mtime_ms = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    let joined = view.members.iter().map(|m| m.start_ms).max().unwrap_or(0);
    Ok(Entry {
        name: name.to_string(),
        path: path.to_path_buf(),
        alive: view
            .members
            .iter()
            .filter(|m| m.alive)
            .map(|m| m.pid)
            .collect(),
        dead: view.members.iter().filter(|m| !m.alive).count(),
        held: view.gpus.iter().map(|g| g.used).sum(),
        held_by_dead: view.gpus.iter().map(|g| g.held_by_dead).sum(),
        last_use_ms: (view.created.saturating_mul(1000))
            .max(joined)
            .max(mtime_ms),
    })
}

fn members_text(e: &Entry) -> String {
    format!("{} alive, {} dead", e.alive.len(), e.dead)
}

/// `gpucap pool list`'s table.
pub fn list_text(dir: &Path, entries: &[Result<Entry, (String, String)>]) -> String {
    let mut out = format!("pool directory: {}\n", dir.display());
    if entries.is_empty() {
        out.push_str("no pools (a pool's file is made when its first member starts)\n");
        return out;
    }
    // The names' column as wide as the longest (a container's pool's directory is 27).
    let w = entries
        .iter()
        .map(|e| match e {
            Ok(e) => e.name.chars().count(),
            Err((name, _)) => name.chars().count(),
        })
        .max()
        .unwrap_or(0)
        .max(24);
    out.push_str(&format!(
        "{:<w$}  {:<16}  {:>10}  {:>12}  {}\n",
        "POOL", "MEMBERS", "HELD", "HELD BY DEAD", "LAST USE (UTC)"
    ));
    for e in entries {
        match e {
            Ok(e) => out.push_str(&format!(
                "{:<w$}  {:<16}  {:>10}  {:>12}  {}{}\n",
                e.name,
                members_text(e),
                format_bytes(e.held),
                format_bytes(e.held_by_dead),
                utc(e.last_use_ms),
                if !e.path.exists() {
                    "  (its file removed while its members run)".to_string()
                } else if e.path.parent() != Some(dir) {
                    // The environment's claim's or container's pool: every user's.
                    format!(
                        "  (the environment's pool, every user's: {})",
                        e.path.display()
                    )
                } else {
                    String::new()
                }
            )),
            Err((name, why)) => out.push_str(&format!("{name:<w$}  unreadable: {why}\n")),
        }
    }
    out
}

/// Every pool of `dir`, read.
pub fn entries(dir: &Path) -> Vec<Result<Entry, (String, String)>> {
    pool_names(dir)
        .into_iter()
        .map(|n| {
            let path = dir.join(format!("{n}.pool"));
            entry(&n, &path).map_err(|e| (n, e))
        })
        .collect()
}

/// What `pool clean` did with one pool: the line to print, and whether it is an error.
fn removal_line(e: &Entry, named: bool) -> (String, bool) {
    if !e.alive.is_empty() {
        let pids: Vec<String> = e.alive.iter().map(u32::to_string).collect();
        return (
            format!(
                "kept {}: in use by {} live member{} (pid {})",
                e.name,
                e.alive.len(),
                if e.alive.len() == 1 { "" } else { "s" },
                pids.join(", ")
            ),
            named,
        );
    }
    if e.held > 0 && !named {
        return (
            format!(
                "kept {}: {} still counted as held ({} by dead members); `gpucap pool clean {}` \
                 removes it",
                e.name,
                format_bytes(e.held),
                format_bytes(e.held_by_dead),
                e.name
            ),
            false,
        );
    }
    match gpucap_pool_file::remove_unused(&e.path) {
        Ok(Removal::Removed) => (
            format!(
                "removed {} ({}, {})",
                e.name,
                e.path.display(),
                members_text(e)
            ),
            false,
        ),
        Ok(Removal::InUse) => (
            format!("kept {}: a member joined it just now", e.name),
            named,
        ),
        Ok(Removal::Changed) => (
            format!("kept {}: its file was replaced while being removed", e.name),
            named,
        ),
        Err(why) => (format!("kept {}: {why}", e.name), true),
    }
}

/// What `pool clean` printed and its exit status.
#[derive(Default)]
struct Cleaned {
    out: Vec<String>,
    err: Vec<String>,
    code: i32,
}

impl Cleaned {
    /// Removes the pool of `e` if it may be (see [`removal_line`]), and says so.
    fn pool(&mut self, e: &Entry, named: bool) {
        let (line, bad) = removal_line(e, named);
        if bad {
            self.err.push(format!("gpucap: {line}"));
            self.code = EXIT_NOT_REMOVED;
        } else {
            self.out.push(line);
        }
    }
}

/// `gpucap pool clean [NAME]` in `dir`: the lines for stdout, the lines for stderr and
/// the exit status. Without NAME, every pool with no live member and nothing held is
/// removed; with NAME, that pool unless a member lives.
pub fn clean(dir: &Path, name: Option<&str>) -> (Vec<String>, Vec<String>, i32) {
    let mut c = Cleaned::default();
    match name {
        None => {
            for e in entries(dir) {
                match e {
                    Ok(e) => c.pool(&e, false),
                    Err((n, why)) => c.out.push(format!("kept {n}: {why}")),
                }
            }
            if c.out.is_empty() && c.err.is_empty() {
                c.out.push(format!("no pools in {}", dir.display()));
            }
        }
        Some(name) => {
            let path = dir.join(format!("{name}.pool"));
            // A file removed under live members is still a pool (read through one).
            if !path.exists() && !pool_names(dir).iter().any(|n| n == name) {
                c.err.push(format!(
                    "gpucap: no pool {name} (no file {}){}",
                    path.display(),
                    suggestion(&path)
                ));
                c.code = EXIT_NOT_REMOVED;
            } else {
                match entry(name, &path) {
                    Ok(e) => c.pool(&e, true),
                    Err(why) => {
                        c.err.push(format!("gpucap: {why}"));
                        c.code = 2;
                    }
                }
            }
        }
    }
    (c.out, c.err, c.code)
}
