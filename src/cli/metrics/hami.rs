//! HAMi's monitor series (`--hami`), so that HAMi's Grafana dashboard
//! (hami-vgpu-dashboard, grafana.com 21833) and queries written for HAMi read gpucap:
//! `hami_vgpu_memory_used_bytes` and `hami_vgpu_memory_limit_bytes`, labelled
//! `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid` as HAMi's
//! vGPUmonitor (v2.9 and later) labels them. HAMi's names before v2.9
//! (`vGPU_device_memory_usage_in_bytes`, off by default in HAMi since) are not
//! exported: they are not snake_case, and promtool's lint refuses them.
//!
//! HAMi shows one series per container and GPU: what the container's processes use
//! and the limit they share. gpucap's budgets are pools and processes capped alone:
//! a pool's live members are grouped by their Kubernetes names (`workload`), each
//! group's use summed, the pool's cap its limit, with a `pool` label; a process capped
//! alone is one series with `pid` and `pid_namespace` labels (two containers' pid 1);
//! both with gpucap's `user` label (two users' pools of one name are two budgets). `vdevice_index` is the GPU's place in the
//! pool's (or the process's) list of GPUs, as HAMi numbers a container's devices.

use std::collections::BTreeMap;

use super::Reading;
use super::families::{HAMI_LIMIT, HAMI_USED};
use super::text_format::{Samples, labels};
use super::workload::{Identify, Workload};
use crate::procs::LoneReading;

/// Adds the HAMi series of `readings` and `lone` to `s`.
pub fn add(s: &mut Samples, readings: &[Reading], lone: &[LoneReading], who: &dyn Identify) {
    for r in readings {
        let Ok((_, view)) = &r.result else { continue };
        let budget = [("pool", r.label.as_str()), ("user", r.user.as_str())];
        let mut groups: BTreeMap<Workload, Vec<&gpucap_core::budget::MemberView>> = BTreeMap::new();
        for m in view.members.iter().filter(|m| m.alive) {
            groups
                .entry(who.workload(m.pid, m.pid_namespace))
                .or_default()
                .push(m);
        }
        for (index, g) in view.gpus.iter().enumerate() {
            if groups.is_empty() {
                // No live member: what the dead still hold, under no one's name.
                series(
                    s,
                    &Workload::default(),
                    index,
                    &g.uuid,
                    &budget,
                    g.used,
                    g.cap,
                );
            }
            for (workload, members) in &groups {
                let used = members
                    .iter()
                    .flat_map(|m| m.gpus.iter().filter(|mg| mg.uuid == g.uuid))
                    .map(|mg| mg.used)
                    .sum();
                series(s, workload, index, &g.uuid, &budget, used, g.cap);
            }
        }
    }
    for LoneReading { user, view: p, .. } in lone {
        let workload = who.workload(p.pid, p.pid_namespace);
        // Two containers' pid 1 are two processes: their PID namespace keeps them apart.
        let pid = p.pid.to_string();
        let ns = p.pid_namespace.to_string();
        let budget = [
            ("pid", pid.as_str()),
            ("pid_namespace", ns.as_str()),
            ("user", user.as_str()),
        ];
        for (index, g) in p.gpus.iter().enumerate() {
            series(s, &workload, index, &g.uuid, &budget, g.used, g.cap);
        }
    }
}

/// One container's (or group's) used and limit on one GPU.
fn series(
    s: &mut Samples,
    w: &Workload,
    index: usize,
    uuid: &str,
    budget: &[(&str, &str)],
    used: u64,
    cap: Option<u64>,
) {
    let index = index.to_string();
    let mut pairs = vec![
        ("namespace", w.namespace.as_str()),
        ("pod", w.pod.as_str()),
        ("container", w.container.as_str()),
        ("vdevice_index", index.as_str()),
        ("device_uuid", uuid),
    ];
    pairs.extend_from_slice(budget);
    let current = labels(&pairs);
    s.add(HAMI_USED, &current, used);
    if let Some(cap) = cap {
        s.add(HAMI_LIMIT, &current, cap);
    }
}
