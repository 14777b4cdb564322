//! CUDA graph memory (graph memory nodes, tests/c/graphs.c): the memory the driver reserves
//! for a graph's allocations is charged as it reserves it, a graph the cap cannot take is
//! refused with `CUDA_ERROR_OUT_OF_MEMORY` at its instantiation or launch, trims credit it.
//! With the shim the program's checks pass and the fake driver's own figure never passes
//! the cap; without it the same checks fail (the escape is real).

use super::common;

use std::path::PathBuf;
use std::process::Output;

use common::*;

fn prog() -> PathBuf {
    compile_c("graphs", "", &["-lcuda"])
}

/// Runs `graphs mode 1Gi` on one fake GPU of 8 GiB, with the shim and a 1 GiB cap when
/// `capped`; `env` goes to the run too.
fn graphs(mode: &str, capped: bool, env: &[(&str, &str)]) -> (Output, Vec<DevStats>) {
    let tag = format!("graphs-{mode}-{capped}-{}", env.len());
    let stats = scratch(&tag).join("stats.json");
    let mut c = fake_cmd(prog(), &stats);
    c.env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", "1");
    if capped {
        preload(&mut c).env("GPUCAP_LIMIT", "1Gi");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(c.args([mode, "1Gi"]));
    let s = read_stats(&stats);
    (o, s)
}

/// Graphs of alloc nodes (cuGraphAddMemAllocNode) and graphs captured from
/// cuMemAllocAsync/cuMemFreeAsync, alone and in a pool.
#[test]
fn graph_memory_is_charged_as_the_driver_reserves_it() {
    let dir = scratch("graphs-pool");
    let pool_dir = dir.to_str().unwrap();
    for mode in ["nodes", "capture"] {
        for env in [
            &[][..],
            &[("GPUCAP_POOL", "graphs"), ("GPUCAP_POOL_DIR", pool_dir)][..],
        ] {
            let (o, s) = graphs(mode, true, env);
            assert_passed(&o, &format!("{mode} with the shim {env:?}"));
            assert!(
                s[0].peak_used <= GIB,
                "{mode} {env:?}: the driver held more than the cap: {:?}",
                s[0]
            );
            assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
            let refused = refusals(&stderr(&o));
            let of = super::escapes::of_the(env);
            for api in [
                format!(
                    "cuGraphInstantiateWithFlags of 640 MiB on GPU 0: 640 MiB of {of} 1 GiB cap in use"
                ),
                format!("cuGraphLaunch of 640 MiB on GPU 0: 512 MiB of {of} 1 GiB cap in use"),
            ] {
                assert!(
                    refused.iter().any(|l| l.contains(&api)),
                    "{mode} {env:?}: {api:?} in {refused:?}"
                );
            }
        }
        let (o, s) = graphs(mode, false, &[]);
        assert_failed(&o, &format!("{mode} without the shim"));
        assert!(
            s[0].peak_used > GIB,
            "{mode}: without the shim the driver passes the cap: {:?}",
            s[0]
        );
    }
}

/// A graph whose memory nodes the driver will not list (`FAKECUDA_GRAPH_NODES_FAIL=1`) is
/// charged the graph memory the driver reserves for it after its instantiation and its
/// launches, never taken as holding nothing: an allocation the cap cannot take beside it
/// is refused. Alone and in a pool.
#[test]
fn a_graph_whose_nodes_cannot_be_listed_is_charged_what_the_driver_reserves() {
    let dir = scratch("graphs-unlisted-pool");
    let pool_dir = dir.to_str().unwrap();
    let fail = ("FAKECUDA_GRAPH_NODES_FAIL", "1");
    for env in [
        &[fail][..],
        &[
            fail,
            ("GPUCAP_POOL", "unlisted"),
            ("GPUCAP_POOL_DIR", pool_dir),
        ][..],
    ] {
        let (o, s) = graphs("unlisted", true, env);
        assert_passed(&o, &format!("unlisted with the shim {env:?}"));
        assert_eq!(s[0].final_used, 0, "{:?}", s[0]);
        let err = stderr(&o);
        assert!(
            err.contains("cuGraphInstantiateWithFlags: the graph's memory nodes could not be listed: charged the graph memory the driver reserves for it"),
            "{env:?}: {err}"
        );
        let line = format!(
            "refused cuMemAlloc of 512 MiB on GPU 0: 640 MiB of {} 1 GiB cap in use",
            super::escapes::of_the(env)
        );
        assert!(
            refusals(&err).iter().any(|l| l.contains(&line)),
            "{env:?}: {err}"
        );
    }
    let (o, _) = graphs("unlisted", false, &[fail]);
    assert_failed(&o, "unlisted without the shim");
}
