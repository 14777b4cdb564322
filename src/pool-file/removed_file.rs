//! A pool file removed while its members run (a logout's cleanup of `/dev/shm`, a claim's
//! file removed by hand): how a process opened it ([`Through`]: a member's descriptor
//! found by its announcement, or handed over on a claim's socket), and the lines that say
//! why a process may not join it.

use std::path::Path;

/// How a pool file removed while its members run was opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Through {
    /// Through this member's descriptor (`/proc/PID/fd/N`, [`crate::beacon`]).
    Process(u32),
    /// Handed over on the claim's socket by a member that none of this process's
    /// namespaces shows ([`crate::live::removed_file`]).
    Socket,
}

impl Through {
    /// What the file was read through, as a line says it ("process 42", "the claim's
    /// socket").
    pub fn via(self) -> String {
        match self {
            Through::Process(pid) => format!("process {pid}"),
            Through::Socket => "the claim's socket".into(),
        }
    }
}

/// Why a process may not join the pool of `path`: its file was removed while processes
/// `pids` use it, and none of them could be reached.
pub(crate) fn removed_unreachable(path: &Path, pids: &[u32]) -> String {
    let listed: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
    format!(
        "the pool file {} was removed while processes {}{} still use it (a logout's \
         cleanup of /dev/shm, or by hand), and none of them could be reached to join them \
         (another PID namespace or user, or their programs closed gpucap's descriptors); no \
         process can join until they exit (a new file would be a second budget)",
        path.display(),
        listed.join(", "),
        if pids.len() > 8 { ", …" } else { "" }
    )
}

/// Why a process may not join the claim of `path`: its file was removed while members
/// run (they answer on its socket), none of whom it could reach through an announcement
/// (another network namespace: each Kubernetes pod has one; another user's process), and
/// none handed the file over (`why`).
pub(crate) fn removed_answering(path: &Path, why: &str) -> String {
    format!(
        "the pool file {} was removed while the claim's members run (they listen on {}), \
         none of them announces itself where this process can open its descriptor (another \
         network namespace: a pod of its own; another user's process), and none handed the \
         file over ({why}); no process \
         can join until they exit (a new file would be a second budget)",
        path.display(),
        crate::live::socket_path(path).display()
    )
}

/// Why a process may not join the claim of `path`: its file (and socket) were removed
/// while members run (the claim's directory says they live: `live::presence`), and none
/// answered on the socket within the patience.
pub(crate) fn removed_silent(path: &Path) -> String {
    format!(
        "the pool file {} was removed while the claim's members run (the claim's directory \
         says they live), and none of them answered on {} within {} s (are they stopped?); \
         no process can join until they exit (a new file would be a second budget)",
        path.display(),
        crate::live::socket_path(path).display(),
        crate::live::PATIENCE.as_secs()
    )
}
