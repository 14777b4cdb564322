//! FAKECUDA_STATS: a JSON summary written when the process exits.

use std::sync::Once;

use crate::model::device::ledger;
use crate::model::ledger::DevStats;
use crate::model::pool;

static REGISTER: Once = Once::new();

/// Registers the exit hook (once, at the first successful cuInit). atexit handlers run on
/// exit() and on return from main; the handler lives in this library (`__dso_handle`), so
/// it also runs if the library is unloaded first.
pub fn register_at_exit() {
    REGISTER.call_once(|| {
        // SAFETY: registers a plain extern "C" fn that never unwinds.
        unsafe { libc::atexit(write_at_exit) };
    });
}

extern "C" fn write_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Ok(cfg) = fake_gpu::config::get() else {
            return;
        };
        if let Some(path) = &cfg.stats_path
            && let Err(e) = write_atomically(path, &to_json(std::process::id(), &all_stats()))
        {
            crate::abi::log(&format!(
                "cannot write FAKECUDA_STATS={}: {e}",
                path.display()
            ));
        }
        // Give this process's memory back to the others sharing the devices.
        if let Ok(l) = ledger() {
            l.leave_shared();
        }
    });
}

/// Per-device stats for the stats file (none before cuInit).
fn all_stats() -> Vec<DevStats> {
    match ledger() {
        Ok(l) => (0..l.devices())
            .map(|d| DevStats {
                pool_reserved: pool::reserved_of(d),
                ..l.stats(d)
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// `{"pid":N,"devices":[{"ordinal":0,"physical":P,"total":B,"peak_used":B,"final_used":B,
/// "alloc_calls":N,"free_calls":N,"failed_alloc_calls":N,"context_mem":B,"contexts_created":N,
/// "pool_reserved":B,"shared_peak_used":B}]}`
pub fn to_json(pid: u32, devices: &[DevStats]) -> String {
    let devs: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            format!(
                "{{\"ordinal\":{i},\"physical\":{},\"total\":{},\"peak_used\":{},\"final_used\":{},\"alloc_calls\":{},\"free_calls\":{},\"failed_alloc_calls\":{},\"context_mem\":{},\"contexts_created\":{},\"pool_reserved\":{},\"shared_peak_used\":{}}}",
                d.phys, d.total, d.peak, d.used, d.alloc_calls, d.free_calls, d.failed_alloc_calls,
                d.context_mem, d.contexts_created, d.pool_reserved, d.shared_peak
            )
        })
        .collect();
    format!("{{\"pid\":{pid},\"devices\":[{}]}}\n", devs.join(","))
}

fn write_atomically(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_format() {
        let d = DevStats {
            total: 100,
            used: 10,
            peak: 50,
            alloc_calls: 3,
            free_calls: 2,
            failed_alloc_calls: 1,
            context_mem: 4,
            contexts_created: 6,
            pool_reserved: 5,
            shared_peak: 70,
            phys: 2,
        };
        assert_eq!(
            to_json(7, &[d]),
            "{\"pid\":7,\"devices\":[{\"ordinal\":0,\"physical\":2,\"total\":100,\"peak_used\":50,\"final_used\":10,\
             \"alloc_calls\":3,\"free_calls\":2,\"failed_alloc_calls\":1,\"context_mem\":4,\"contexts_created\":6,\"pool_reserved\":5,\
             \"shared_peak_used\":70}]}\n"
        );
    }
}
