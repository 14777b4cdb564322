//! Which pid NVML lists a process under, where that is provable.
//!
//! NVML names a process by its pid in the initial PID namespace (the host's), whatever
//! namespace the caller lives in. A process in the initial namespace is listed under its
//! own pid. Inside a container (its own PID namespace, its own /proc) the process knows
//! only its pid there: the number NVML lists for it is the host's, which the container
//! cannot see, and the same number in NVML's list, if any, is another process on the
//! host. A pid match is taken as proof only where the host pid is known: the process is
//! in the initial namespace, or /proc is the initial namespace's (then `NSpid` in
//! /proc/self/status lists the pid there first). Everywhere else the caller measures
//! some other way (see `kernels`, `budget::reclaim`).

/// The inode number of the initial PID namespace (`PROC_PID_INIT_INO`, fixed by the
/// kernel since Linux 3.8); every other namespace gets one from the dynamic range
/// (`0xF0000000` up), so no other namespace has it.
pub const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// The pid NVML lists this process under, or None where it cannot be proven.
/// `own_ns`: the inode of this process's PID namespace (`/proc/self/ns/pid`; None: not
/// readable); `pid`: its pid (`getpid`); `status`: the text of /proc/self/status (its
/// `NSpid` line lists the pid in each namespace from /proc's down to the process's
/// own); `proc_init_ns`: the inode of the PID namespace of /proc's pid 1 (None: not
/// readable, as it is not to an unprivileged process).
pub fn pid_in_nvml(
    own_ns: Option<u64>,
    pid: u32,
    status: Option<&str>,
    proc_init_ns: Option<u64>,
) -> Option<u32> {
    if own_ns == Some(INITIAL_PID_NAMESPACE) {
        return Some(pid);
    }
    // /proc mounted for an outer namespace: its first NSpid is the pid there, the host's
    // only when that namespace is the initial one (its pid 1 says so).
    if proc_init_ns != Some(INITIAL_PID_NAMESPACE) {
        return None;
    }
    let line = status?.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<u32> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    match pids.as_slice() {
        [outer, .., inner] if *inner == pid => Some(*outer),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTAINER_NS: u64 = 0xF000_0123;

    #[test]
    fn a_pid_is_nvmls_only_where_the_host_pid_is_known() {
        // The host's namespace: its own pid.
        assert_eq!(
            pid_in_nvml(Some(INITIAL_PID_NAMESPACE), 4242, None, None),
            Some(4242)
        );
        // A container with its own /proc: NSpid shows one pid, the host's is unknown.
        let own = "Name:\tpython\nNSpid:\t7\n";
        assert_eq!(pid_in_nvml(Some(CONTAINER_NS), 7, Some(own), None), None);
        assert_eq!(
            pid_in_nvml(Some(CONTAINER_NS), 7, Some(own), Some(CONTAINER_NS)),
            None
        );
        // The host's /proc seen from a container: the first NSpid is the host's pid,
        // proven by /proc's pid 1 living in the initial namespace.
        let host_proc = "Name:\tpython\nNSpid:\t91234\t7\n";
        assert_eq!(
            pid_in_nvml(
                Some(CONTAINER_NS),
                7,
                Some(host_proc),
                Some(INITIAL_PID_NAMESPACE)
            ),
            Some(91234)
        );
        // ... not when pid 1 cannot be read, nor when /proc is an outer container's.
        assert_eq!(
            pid_in_nvml(Some(CONTAINER_NS), 7, Some(host_proc), None),
            None
        );
        assert_eq!(
            pid_in_nvml(Some(CONTAINER_NS), 7, Some(host_proc), Some(CONTAINER_NS)),
            None
        );
        // A status that is not this process's, or unreadable, proves nothing.
        assert_eq!(
            pid_in_nvml(
                Some(CONTAINER_NS),
                8,
                Some(host_proc),
                Some(INITIAL_PID_NAMESPACE)
            ),
            None
        );
        assert_eq!(
            pid_in_nvml(
                Some(CONTAINER_NS),
                7,
                Some("NSpid:\tx\t7\n"),
                Some(INITIAL_PID_NAMESPACE)
            ),
            None
        );
        assert_eq!(
            pid_in_nvml(None, 7, None, Some(INITIAL_PID_NAMESPACE)),
            None
        );
    }
}
