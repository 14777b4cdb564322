//! A kernel's first launch is measured by NVML's figure for this process only where the
//! pid NVML lists it under is provably its own (`gpucap_core::pid_namespace`), and
//! NVML's process list is read whole however many processes the GPU runs.
//!
//! - In a PID namespace of its own (a container: here `unshare -pf --mount-proc`, the
//!   program its PID 1), NVML lists the host's pids, and the fake's
//!   `FAKECUDA_NVML_EXTRA_PROCS` lists another process under the program's own number:
//!   the launch must not take that process's unmoved figure as its own (charged 0), but
//!   measure by the device's free memory: the 96 MiB its kernels load are charged.
//! - With 100 processes more on the GPU than NVML's 64-entry answer of old held, this
//!   process is still found in NVML's list and measured by its own figure.

use super::common;

use std::path::PathBuf;
use std::process::Output;

use common::*;

fn prog() -> PathBuf {
    compile_c("escapes", "", &["-lcuda"])
}

/// `escapes lazy-kernels 256Mi` under a 256 MiB cap, a library's kernels taking 96 MiB
/// at their first launch; in a PID namespace of its own when `own_namespace`.
fn lazy_kernels(own_namespace: bool, env: &[(&str, &str)]) -> (Output, Vec<DevStats>) {
    let stats = scratch("nvml-pids").join("stats.json");
    let mut c = if own_namespace {
        let mut c = fake_cmd("unshare", &stats);
        // --kill-child: the program (PID 1 of the namespace) dies with unshare.
        c.args(["-pf", "--mount-proc", "--kill-child"]).arg(prog());
        c
    } else {
        fake_cmd(prog(), &stats)
    };
    c.env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", "1")
        .env("FAKECUDA_LIBRARY_MEM", "96Mi")
        .env("FAKECUDA_FUNCTION_MEM", "32Mi")
        .env("GPUCAP_LOG", "debug");
    preload(&mut c).env("GPUCAP_LIMIT", "256Mi");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(c.args(["lazy-kernels", "256Mi"]));
    let s = read_stats(&stats);
    (o, s)
}

/// The debug lines that say how each first use was measured.
fn measured(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.contains("of kernels on GPU 0 (measured "))
        .collect()
}

#[test]
fn a_pid_that_nvml_lists_for_another_process_is_never_taken_for_this_ones() {
    if !unshare_works() {
        return;
    }
    let dir = scratch("nvml-pids-pool");
    let pool_dir = dir.to_str().unwrap();
    // The program is PID 1 of its namespace; NVML lists it under 100001 (the host's pid),
    // and the host's process 1 under 1.
    let collide = [
        ("FAKECUDA_NVML_PID_OFFSET", "100000"),
        ("FAKECUDA_NVML_EXTRA_PROCS", "1"),
    ];
    for env in [
        &collide[..],
        &[
            collide[0],
            collide[1],
            ("GPUCAP_POOL", "pids"),
            ("GPUCAP_POOL_DIR", pool_dir),
        ][..],
        // No offset: NVML's pid 1 is the program's own number, still not provably its own.
        &[("FAKECUDA_NVML_EXTRA_PROCS", "0")][..],
    ] {
        let (o, s) = lazy_kernels(true, env);
        assert_passed(&o, &format!("lazy-kernels in a PID namespace {env:?}"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let err = stderr(&o);
        assert!(
            err.contains("cuLaunchKernel: the kernels its first use loaded took 96 MiB on GPU 0, past the cap (320 MiB of 256 MiB in use)"),
            "{env:?}: {err}"
        );
        let lines = measured(&err);
        assert!(
            !lines.is_empty()
                && lines
                    .iter()
                    .all(|l| l.contains("by the device's free memory")),
            "{env:?}: {lines:?}"
        );
    }
}

#[test]
fn nvmls_process_list_is_read_whole_however_many_processes_the_gpu_runs() {
    for extra in ["100", "1000"] {
        let (o, s) = lazy_kernels(false, &[("FAKECUDA_NVML_EXTRA_PROCS", extra)]);
        assert_passed(&o, &format!("lazy-kernels beside {extra} processes"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let err = stderr(&o);
        let lines = measured(&err);
        assert!(
            !lines.is_empty()
                && lines
                    .iter()
                    .all(|l| l.contains("by the driver's figure for this process")),
            "{extra} processes: {lines:?}\n{err}"
        );
    }
}
