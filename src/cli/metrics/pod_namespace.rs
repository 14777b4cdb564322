//! The Kubernetes namespace of a container's process, as the kubelet mounts it in the
//! container (`/var/run/secrets/kubernetes.io/serviceaccount/namespace`), read by root's
//! `metrics` through `/proc/PID/root`. Everything under that root is the container's to
//! make: a link there is resolved in the container's root (openat2's `RESOLVE_IN_ROOT`,
//! never to the node's files, never through `/proc`'s magic links), and the file is
//! looked at before it is opened (`O_PATH`): only a regular file is read (a FIFO there
//! would make the reader wait forever, a link to a device would open it), at most
//! [`MOST`] bytes, and what it says counts only as a DNS label (what Kubernetes names
//! namespaces by). A kernel without openat2 (before 5.6): no namespace.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Where the kubelet mounts it, from a container's root.
const NAMESPACE_FILE: &str = "var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The most bytes read of it (a namespace's name is at most 63).
const MOST: u64 = 256;

/// The namespace named in the file of the container whose root is `root`
/// (`/proc/PID/root`); None where there is none, or the file is not a regular file
/// within that root that holds one name.
pub fn namespace_in(root: &Path) -> Option<String> {
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(root)
        .ok()?;
    let looked = open_in_root(&root, NAMESPACE_FILE)?;
    if !looked.metadata().ok()?.is_file() {
        return None;
    }
    // The very file looked at, opened to be read (never waits, never a terminal).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", looked.as_raw_fd()))
        .ok()?;
    let mut text = Vec::new();
    file.take(MOST + 1).read_to_end(&mut text).ok()?;
    if text.len() as u64 > MOST {
        return None;
    }
    let name = std::str::from_utf8(&text).ok()?.trim();
    dns_label(name).then(|| name.to_string())
}

/// `path` (relative) under the directory `root`, resolved as if `root` were `/` and
/// through no magic link, opened with `O_PATH` (nothing is opened but the name).
fn open_in_root(root: &File, path: &str) -> Option<File> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: plain data, all zero is valid (no mode, no resolve flags).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: a directory descriptor, a NUL-terminated path and an open_how of its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the descriptor openat2 just returned, owned from here.
    Some(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Whether `name` is an RFC 1123 label: 1 to 63 of `a-z`, `0-9` and `-`, a letter or
/// digit first and last.
fn dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    (1..=63).contains(&b.len())
        && b.iter().all(inner)
        && b.first() != Some(&b'-')
        && b.last() != Some(&b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A container's root of this test's, the namespace's directory made in it: with
    /// `linked`, in `/run`, `/var/run` a link to `/run` (as in most images); its path.
    fn root(tag: &str, linked: bool) -> (PathBuf, PathBuf) {
        let root = std::env::temp_dir().join(format!("gpucap-ns-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let run = if linked { "run" } else { "var/run" };
        let dir = root.join(run).join("secrets/kubernetes.io/serviceaccount");
        std::fs::create_dir_all(&dir).unwrap();
        if linked {
            std::fs::create_dir_all(root.join("var")).unwrap();
            std::os::unix::fs::symlink("/run", root.join("var/run")).unwrap();
        }
        (root, dir.join("namespace"))
    }

    /// [`namespace_in`] within 10 s (a reader that waits on the file fails the test).
    fn within_10s(root: &Path) -> Option<String> {
        let (tx, rx) = std::sync::mpsc::channel();
        let root = root.to_path_buf();
        std::thread::spawn(move || tx.send(namespace_in(&root)));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the namespace's file was waited on")
    }

    /// Read where the container sees it, `/var/run` a link to `/run` or not (before, the
    /// link was resolved in the reader's root: no namespace).
    #[test]
    fn the_namespace_is_read_through_links_resolved_in_the_containers_root() {
        for linked in [false, true] {
            let (root, file) = root("plain", linked);
            std::fs::write(&file, "team-a\n").unwrap();
            assert_eq!(within_10s(&root).as_deref(), Some("team-a"), "{linked}");
            std::fs::remove_dir_all(root).unwrap();
        }
    }

    /// A link to a file outside the container's root (a node's file, a device) is
    /// resolved in the root (where nothing is); a FIFO is not waited on; a file longer
    /// than a name or not a DNS label gives none (before: the node's file was read, the
    /// FIFO waited on forever, the whole file read and shown).
    #[test]
    fn what_a_container_puts_at_the_namespaces_path_is_read_only_as_one_name() {
        let outside = std::env::temp_dir().join(format!("gpucap-ns-node-{}", std::process::id()));
        std::fs::write(&outside, "node-secret\n").unwrap();
        type Make<'a> = Box<dyn Fn(&Path) + 'a>;
        let cases: [(&str, Make); 4] = [
            (
                "link",
                Box::new(|f: &Path| std::os::unix::fs::symlink(&outside, f).unwrap()),
            ),
            (
                "fifo",
                Box::new(|f: &Path| {
                    let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
                    // SAFETY: a NUL-terminated path.
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                }),
            ),
            (
                "long",
                Box::new(|f: &Path| std::fs::write(f, "a".repeat(1 << 20)).unwrap()),
            ),
            (
                "label",
                Box::new(|f: &Path| std::fs::write(f, "Not_A_Label\n").unwrap()),
            ),
        ];
        for (tag, make) in &cases {
            let (root, file) = root(tag, false);
            make(&file);
            assert_eq!(within_10s(&root), None, "{tag}");
            std::fs::remove_dir_all(root).unwrap();
        }
        drop(cases);
        std::fs::remove_file(outside).unwrap();
    }

    #[test]
    fn a_dns_label_is_one_to_63_lowercase_letters_digits_and_inner_dashes() {
        for good in ["default", "kube-system", "a", "a1", &"x".repeat(63)] {
            assert!(dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a b", &"x".repeat(64)] {
            assert!(!dns_label(bad), "{bad}");
        }
    }
}
