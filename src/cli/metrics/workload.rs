//! Who a capped process is in Kubernetes, for HAMi's series (hami.rs): its
//! namespace, pod and container, where /proc tells them. A container's processes run in
//! a cgroup under `kubepods` whose path names the pod's UID and the container's ID
//! (`.../kubepods-burstable-pod<UID>.slice/cri-containerd-<ID>.scope` with systemd,
//! `.../kubepods/burstable/pod<UID>/<ID>` with cgroupfs); the kubelet sets `HOSTNAME`
//! to the pod's name and mounts the namespace's name at
//! `/var/run/secrets/kubernetes.io/serviceaccount/namespace` (read through
//! `/proc/PID/root`). Outside Kubernetes, or where a file cannot be read, the labels are
//! empty. A process in another PID namespace than the reader's is not looked up: its
//! pid names another process here.

use std::path::PathBuf;

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

/// The pod's UID and the container's ID in a `/proc/PID/cgroup` text, if it is a
/// Kubernetes container's (a path under `kubepods`).
pub fn pod_and_container(cgroup: &str) -> Option<(String, String)> {
    for line in cgroup.lines() {
        let path = line.splitn(3, ':').nth(2)?;
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
            id[..12].to_string()
        } else {
            String::new()
        };
        return Some((pod, container));
    }
    None
}

/// `HOSTNAME` in a `/proc/PID/environ` (NUL-separated `NAME=value`).
pub fn hostname(environ: &[u8]) -> Option<String> {
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(b"HOSTNAME="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| !v.is_empty())
}

/// Looks processes up in this machine's /proc.
pub struct FromProc {
    own_pid_namespace: u64,
    proc: PathBuf,
}

impl FromProc {
    pub fn new() -> FromProc {
        FromProc {
            own_pid_namespace: crate::pool::own_pid_namespace(),
            proc: PathBuf::from("/proc"),
        }
    }
}

impl Identify for FromProc {
    fn workload(&self, pid: u32, pid_namespace: u64) -> Workload {
        if pid_namespace != self.own_pid_namespace || pid == 0 {
            return Workload::default();
        }
        let dir = self.proc.join(pid.to_string());
        let Some((uid, container)) = std::fs::read_to_string(dir.join("cgroup"))
            .ok()
            .and_then(|t| pod_and_container(&t))
        else {
            return Workload::default();
        };
        let pod = std::fs::read(dir.join("environ"))
            .ok()
            .and_then(|e| hostname(&e))
            .unwrap_or(uid);
        let namespace = std::fs::read_to_string(
            dir.join("root/var/run/secrets/kubernetes.io/serviceaccount/namespace"),
        )
        .map(|n| n.trim().to_string())
        .unwrap_or_default();
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
                "0123456789ab".into()
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
                "fedcba987654".into()
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
    fn the_pods_name_is_its_hostname() {
        assert_eq!(
            hostname(b"PATH=/bin\0HOSTNAME=trainer-7d9f\0HOME=/root\0"),
            Some("trainer-7d9f".into())
        );
        assert_eq!(hostname(b"PATH=/bin\0"), None);
        assert_eq!(hostname(b"HOSTNAME=\0"), None);
    }
}
