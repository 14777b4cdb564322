//! Who a capped process is in Kubernetes, for HAMi's series (hami.rs): its
//! namespace, pod and container, where /proc tells them. A container's processes run in
//! a cgroup under `kubepods` whose path names the pod's UID and the container's ID
//! (`.../kubepods-burstable-pod<UID>.slice/cri-containerd-<ID>.scope` with systemd,
//! `.../kubepods/burstable/pod<UID>/<ID>` with cgroupfs); the kubelet sets `HOSTNAME`
//! to the pod's name and mounts the namespace's name at
//! `/var/run/secrets/kubernetes.io/serviceaccount/namespace` (read through
//! `/proc/PID/root`, as `pod_namespace` says). Outside Kubernetes, or where a file cannot
//! be read, the labels are empty. A process in another PID namespace than the reader's (a container's own, seen
//! from a node's sidecar with `hostPID`) is looked up under the pid it has here: the
//! process in /proc whose PID namespace is its and whose `NSpid` ends with its pid.
//!
//! On a node (a metrics sidecar with the host's /var/log), the kubelet's links name
//! every container: `/var/log/containers/<pod>_<namespace>_<container>-<ID>.log`.
//! Where the container's ID is found there, its three names come from that link (the
//! container's name, which /proc does not hold; the pod's real name, whatever
//! `hostname` the pod set); elsewhere the container is named by its ID's first 12
//! characters.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A process's Kubernetes names; empty strings where unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Workload {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// Names processes by pid and PID namespace.
pub trait Identify {
    fn workload(&self, pid: u32, pid_namespace: u64) -> Workload;
}

/// The kubelet's folder of links to its containers' logs.
const KUBELET_LOG_LINKS: &str = "/var/log/containers";

/// The pod's UID and the container's ID (whole, as the cgroup holds it) in a
/// `/proc/PID/cgroup` text, if it is a Kubernetes container's (a path under `kubepods`).
/// A line that is not `ID:CONTROLLERS:PATH` is passed over.
pub fn pod_and_container(cgroup: &str) -> Option<(String, String)> {
    for line in cgroup.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        if !path.contains("kubepods") {
            continue;
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let pod = parts.iter().find_map(|p| {
            let p = p.strip_suffix(".slice").unwrap_or(p);
            let uid = p
                .rsplit_once("-pod")
                .map(|(_, u)| u)
                .or_else(|| p.strip_prefix("pod"))?;
            Some(uid.replace('_', "-"))
        })?;
        let last = parts.last()?;
        let last = last.strip_suffix(".scope").unwrap_or(last);
        let id = last.rsplit_once('-').map_or(last, |(_, id)| id);
        let container = if id.len() >= 12 && id.chars().all(|c| c.is_ascii_hexdigit()) {
            id.to_ascii_lowercase()
        } else {
            String::new()
        };
        return Some((pod, container));
    }
    None
}

/// The names in the kubelet's link to container `id`'s log, among `names` (the entries
/// of its folder): `<pod>_<namespace>_<container>-<id>.log`. Kubernetes' names hold no
/// `_` (DNS labels and subdomains), so the three split apart.
pub fn names_in_log_links<'a>(
    names: impl IntoIterator<Item = &'a str>,
    id: &str,
) -> Option<Workload> {
    if id.is_empty() {
        return None;
    }
    let tail = format!("-{id}.log");
    names.into_iter().find_map(|name| {
        let front = name.strip_suffix(&tail)?;
        let (pod, rest) = front.split_once('_')?;
        let (namespace, container) = rest.split_once('_')?;
        (![pod, namespace, container].iter().any(|n| n.is_empty())).then(|| Workload {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            container: container.to_string(),
        })
    })
}

/// `HOSTNAME` in a `/proc/PID/environ` (NUL-separated `NAME=value`).
pub fn hostname(environ: &[u8]) -> Option<String> {
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"HOSTNAME="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| !v.is_empty())
}

/// Looks processes up in this machine's /proc (and the kubelet's log links).
pub struct FromProc {
    own_pid_namespace: u64,
    proc: PathBuf,
    log_links: PathBuf,
    /// The log links' names and when they were read: read again when a container is
    /// not among them and they are older than [`LINKS_FRESH`] (a server scrapes for
    /// days; containers come and go).
    links: Mutex<Option<(Instant, Vec<String>)>>,
    /// The pids here of the processes of other PID namespaces, by (namespace, pid in
    /// it), and when they were read: read again when one is not among them and they are
    /// older than [`LINKS_FRESH`].
    elsewhere: Mutex<Option<(Instant, PidsElsewhere)>>,
}

/// Pids in this PID namespace by (PID namespace, pid there).
type PidsElsewhere = HashMap<(u64, u32), u32>;

/// The last pid of a `/proc/PID/status` text's `NSpid:` line: the process's pid in its
/// own PID namespace.
pub fn own_namespace_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The number in a namespace link's text (`pid:[4026531836]`).
fn namespace_number(link: &Path) -> Option<u64> {
    let digits: String = link
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// How long a reading of the kubelet's log links names new containers.
const LINKS_FRESH: Duration = Duration::from_secs(1);

impl FromProc {
    pub fn new() -> FromProc {
        FromProc {
            own_pid_namespace: crate::pool::own_pid_namespace(),
            proc: PathBuf::from("/proc"),
            log_links: PathBuf::from(KUBELET_LOG_LINKS),
            links: Mutex::new(None),
            elsewhere: Mutex::new(None),
        }
    }

    /// The pid here of the process that is `pid` in PID namespace `ns`, if this
    /// namespace holds it (one read of /proc per second at most for a miss).
    fn pid_here(&self, pid: u32, ns: u64) -> Option<u32> {
        let mut known = self.elsewhere.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((read, pids)) = known.as_ref() {
            let found = pids.get(&(ns, pid)).copied();
            if found.is_some() || read.elapsed() < LINKS_FRESH {
                return found;
            }
        }
        let pids = self.read_pids_elsewhere();
        let found = pids.get(&(ns, pid)).copied();
        *known = Some((Instant::now(), pids));
        found
    }

    /// Every process of /proc in another PID namespace than this one, by (namespace,
    /// its pid there).
    fn read_pids_elsewhere(&self) -> PidsElsewhere {
        let Ok(entries) = std::fs::read_dir(&self.proc) else {
            return HashMap::new();
        };
        let mut out = HashMap::new();
        for e in entries.filter_map(Result::ok) {
            let Some(here) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let dir = e.path();
            let Some(ns) = std::fs::read_link(dir.join("ns/pid"))
                .ok()
                .and_then(|l| namespace_number(&l))
            else {
                continue;
            };
            if ns == self.own_pid_namespace {
                continue;
            }
            if let Some(pid) = std::fs::read_to_string(dir.join("status"))
                .ok()
                .and_then(|t| own_namespace_pid(&t))
            {
                out.insert((ns, pid), here);
            }
        }
        out
    }

    /// Container `id`'s names in the kubelet's log links, if it has one.
    fn named(&self, id: &str) -> Option<Workload> {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((read, names)) = links.as_ref() {
            let found = names_in_log_links(names.iter().map(String::as_str), id);
            if found.is_some() || read.elapsed() < LINKS_FRESH {
                return found;
            }
        }
        let names: Vec<String> = std::fs::read_dir(&self.log_links)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        let found = names_in_log_links(names.iter().map(String::as_str), id);
        *links = Some((Instant::now(), names));
        found
    }
}

impl Identify for FromProc {
    fn workload(&self, pid: u32, pid_namespace: u64) -> Workload {
        if pid == 0 {
            return Workload::default();
        }
        let pid = if pid_namespace == self.own_pid_namespace {
            pid
        } else {
            match self.pid_here(pid, pid_namespace) {
                Some(here) => here,
                None => return Workload::default(),
            }
        };
        let dir = self.proc.join(pid.to_string());
        let Some((uid, id)) = std::fs::read_to_string(dir.join("cgroup"))
            .ok()
            .and_then(|t| pod_and_container(&t))
        else {
            return Workload::default();
        };
        if let Some(named) = self.named(&id) {
            return named;
        }
        let container = id.get(..12).unwrap_or_default().to_string();
        let pod = std::fs::read(dir.join("environ"))
            .ok()
            .and_then(|e| hostname(&e))
            .unwrap_or(uid);
        let namespace = super::pod_namespace::namespace_in(&dir.join("root")).unwrap_or_default();
        Workload {
            namespace,
            pod,
            container,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_systemd_kubepods_cgroup_names_the_pod_and_the_container() {
        let cg = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n";
        assert_eq!(
            pod_and_container(cg),
            Some((
                "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901".into(),
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into()
            ))
        );
    }

    #[test]
    fn a_cgroupfs_kubepods_cgroup_names_them_too() {
        let cg = "12:memory:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\n";
        assert_eq!(
            pod_and_container(cg),
            Some((
                "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b".into(),
                "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210".into()
            ))
        );
    }

    #[test]
    fn a_process_outside_kubernetes_has_no_pod() {
        assert_eq!(
            pod_and_container("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
        assert_eq!(
            pod_and_container("0::/system.slice/docker-0123456789abcdef.scope\n"),
            None
        );
        assert_eq!(pod_and_container(""), None);
    }

    #[test]
    fn a_malformed_line_is_passed_over_not_the_end_of_the_search() {
        let cg = "garbage\n0::/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/fedcba9876543210\n";
        assert_eq!(
            pod_and_container(cg).map(|(pod, _)| pod),
            Some("0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b".into())
        );
    }

    #[test]
    fn the_kubelets_log_link_names_the_container() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let links = [
            "other-pod_default_web-fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210.log".to_string(),
            format!("trainer-7d9f_ml-team_worker-{id}.log"),
        ];
        assert_eq!(
            names_in_log_links(links.iter().map(String::as_str), id),
            Some(Workload {
                namespace: "ml-team".into(),
                pod: "trainer-7d9f".into(),
                container: "worker".into(),
            })
        );
        // Another container's ID, no ID, or a name that is not the kubelet's: no names.
        assert_eq!(
            names_in_log_links(links.iter().map(String::as_str), "00aa"),
            None
        );
        assert_eq!(
            names_in_log_links(links.iter().map(String::as_str), ""),
            None
        );
        assert_eq!(
            names_in_log_links([format!("x-{id}.log").as_str()], id),
            None
        );
    }

    #[test]
    fn a_process_is_named_by_the_kubelets_link_where_there_is_one_else_by_proc() {
        let root = std::env::temp_dir().join(format!("gpucap-workload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let proc_dir = root.join("proc/4242");
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::create_dir_all(root.join("logs")).unwrap();
        std::fs::write(
            proc_dir.join("cgroup"),
            format!("0::/kubepods/burstable/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/{id}\n"),
        )
        .unwrap();
        std::fs::write(proc_dir.join("environ"), b"HOSTNAME=custom-host\0").unwrap();
        let from = FromProc {
            own_pid_namespace: 7,
            proc: root.join("proc"),
            log_links: root.join("logs"),
            links: Mutex::new(None),
            elsewhere: Mutex::new(None),
        };
        let by_proc = from.workload(4242, 7);
        assert_eq!(
            (by_proc.pod.as_str(), by_proc.container.as_str()),
            ("custom-host", "0123456789ab")
        );
        // The kubelet links the container's log: read again (after LINKS_FRESH) for a
        // container it did not know.
        std::fs::write(
            root.join(format!("logs/trainer-7d9f_ml-team_worker-{id}.log")),
            b"",
        )
        .unwrap();
        std::thread::sleep(LINKS_FRESH);
        assert_eq!(
            from.workload(4242, 7),
            Workload {
                namespace: "ml-team".into(),
                pod: "trainer-7d9f".into(),
                container: "worker".into(),
            }
        );
        // A process of another PID namespace (a container's pid 1, seen from a node's
        // sidecar with hostPID) is looked up under its pid here, by its NSpid.
        let other = root.join("proc/5000");
        std::fs::create_dir_all(other.join("ns")).unwrap();
        std::os::unix::fs::symlink("pid:[8]", other.join("ns/pid")).unwrap();
        std::fs::write(other.join("status"), "Name:\tpython\nNSpid:\t5000\t1\n").unwrap();
        std::fs::copy(proc_dir.join("cgroup"), other.join("cgroup")).unwrap();
        assert_eq!(from.workload(1, 8).container, "worker");
        // A pid that namespace does not hold, or one of a namespace not seen: no names.
        assert_eq!(from.workload(4242, 8), Workload::default());
        assert_eq!(from.workload(1, 9), Workload::default());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_processs_own_pid_is_the_last_of_its_nspid() {
        assert_eq!(
            own_namespace_pid("Name:\tx\nNSpid:\t5000\t17\t1\n"),
            Some(1)
        );
        assert_eq!(own_namespace_pid("Name:\tx\nNSpid:\t42\n"), Some(42));
        assert_eq!(own_namespace_pid("Name:\tx\n"), None);
    }

    #[test]
    fn the_pods_name_is_its_hostname() {
        assert_eq!(
            hostname(b"PATH=/bin\0HOSTNAME=trainer-7d9f\0HOME=/root\0"),
            Some("trainer-7d9f".into())
        );
        assert_eq!(hostname(b"PATH=/bin\0"), None);
        assert_eq!(hostname(b"HOSTNAME=\0"), None);
    }
}
