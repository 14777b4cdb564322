//! Growth-only mode (GPUCAP_GROWTH=1) on the fake driver: freed memory stays with
//! the process and serves later requests of any split without new physical
//! allocations, the cap still holds, and cuMemGetInfo stays truthful.

use super::common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

const PAGE: u64 = 2 * MIB; // the fake driver's VMM granularity

fn script() -> std::path::PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// `script` on a fake GPU of `phys` bytes, with the shim, `limit` and growth on or off.
fn script_cmd(stats: &Path, phys: &str, limit: &str, growth: bool) -> Command {
    let mut c = fake_cmd(script(), stats);
    preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", phys)
        .env("GPUCAP_LIMIT", limit)
        .env("GPUCAP_GROWTH", if growth { "1" } else { "0" });
    c
}

/// The rc of every `alloc SIZE rc` line, in order.
fn alloc_rcs(o: &Output) -> Vec<i32> {
    stdout(o)
        .lines()
        .filter_map(|l| l.strip_prefix("alloc "))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect()
}

fn info_lines(o: &Output) -> Vec<(u64, u64)> {
    stdout(o)
        .lines()
        .filter_map(|l| l.strip_prefix("info "))
        .map(|l| {
            let mut it = l.split_whitespace().map(|x| x.parse::<u64>().unwrap());
            (it.next().unwrap(), it.next().unwrap())
        })
        .collect()
}

const RESHAPE: &[&str] = &[
    "alloc:1Gi",
    "alloc:1Gi",
    "alloc:1Gi",
    "write",
    "free",
    "info",
    // one block larger than any freed block
    "alloc:2Gi",
    "write",
    "range",
    "free",
    // then the same memory in six pieces
    "alloc:512Mi",
    "alloc:512Mi",
    "alloc:512Mi",
    "alloc:512Mi",
    "alloc:512Mi",
    "alloc:512Mi",
    "write",
    "range",
    "info",
    "free",
];

#[test]
fn freed_blocks_serve_any_later_split_without_new_physical_memory() {
    let dir = scratch("growth-reshape");
    let stats = dir.join("stats.json");
    let o = run(script_cmd(&stats, "16Gi", "4Gi", true).args(RESHAPE));
    assert_eq!(o.status.code(), Some(0), "{}\n{}", stdout(&o), stderr(&o));
    assert!(alloc_rcs(&o).iter().all(|&rc| rc == 0), "{}", stdout(&o));
    assert!(!stdout(&o).contains("verify bad") && !stdout(&o).contains("range bad"));
    let s = &read_stats(&stats)[0];
    // Only the first 3 GiB ever reached the driver, as pages; nothing was freed.
    assert_eq!(s.alloc_calls, 3 * GIB / PAGE, "{s:?}");
    assert_eq!(s.free_calls, 0, "{s:?}");
    assert_eq!(s.peak_used, 3 * GIB);
    // After freeing, the retained memory is free to the process.
    let infos = info_lines(&o);
    assert_eq!(infos[0], (4 * GIB, 4 * GIB));
    assert_eq!(infos[1], (GIB, 4 * GIB), "3 GiB live of the 4 GiB cap");

    // Control: the same program without growth mode goes back to the driver.
    let stats2 = dir.join("stats-pass.json");
    let o = run(script_cmd(&stats2, "16Gi", "4Gi", false).args(RESHAPE));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = &read_stats(&stats2)[0];
    assert_eq!(s.alloc_calls, 3 + 1 + 6);
    assert_eq!(s.free_calls, 3 + 1 + 6);
}

#[test]
fn the_cap_holds_over_retained_plus_live_memory() {
    let dir = scratch("growth-cap");
    let stats = dir.join("stats.json");
    let o = run(script_cmd(&stats, "16Gi", "4Gi", true).args([
        "alloc:3Gi",
        "free", // 3 GiB retained
        "alloc:2Gi",
        "alloc:2Gi", // 2 from retained, then 1 retained + 1 new: 4 GiB footprint
        "info",
        "alloc:2Mi", // over the cap
    ]));
    assert_eq!(alloc_rcs(&o), vec![0, 0, 0, 2], "{}", stdout(&o));
    assert_eq!(info_lines(&o), vec![(0, 4 * GIB)]);
    assert!(
        stderr(&o).contains(
            "gpucap: refused cuMemAlloc of 2 MiB on GPU 0: 4 GiB of the 4 GiB cap in use"
        ),
        "{}",
        stderr(&o)
    );
    let s = &read_stats(&stats)[0];
    assert_eq!(
        s.peak_used,
        4 * GIB,
        "the driver never held more than the cap"
    );
    assert_eq!(s.alloc_calls, 4 * GIB / PAGE);
}

#[test]
fn a_request_larger_than_the_cap_is_refused_without_touching_retained_pages() {
    let dir = scratch("growth-big");
    let stats = dir.join("stats.json");
    let o = run(script_cmd(&stats, "16Gi", "1Gi", true).args([
        "alloc:512Mi",
        "free",
        "alloc:2Gi",
        "alloc:1Gi",
        "write",
        "info",
    ]));
    assert_eq!(
        alloc_rcs(&o),
        vec![0, 2, 0],
        "{}\n{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(stdout(&o).contains("verify ok"));
    assert_eq!(info_lines(&o), vec![(0, GIB)]);
}

/// A request of the largest size there is is a refusal like any other in growth mode:
/// said in a line and counted (before, growth mode refused it with no line and did not
/// count it, where normal mode did both).
#[test]
fn a_request_of_the_largest_size_is_said_and_counted_in_growth_mode() {
    let dir = scratch("growth-max");
    for growth in [false, true] {
        let o = run(script_cmd(&dir.join("stats.json"), "16Gi", "1Gi", growth)
            .env("GPUCAP_LOG", "info")
            .arg(format!("alloc:{}", u64::MAX)));
        assert_eq!(alloc_rcs(&o), vec![2], "growth {growth}\n{}", dump(&o));
        let err = stderr(&o);
        assert!(
            err.contains("gpucap: refused cuMemAlloc of 15.99 EiB on GPU 0"),
            "growth {growth}\n{}",
            dump(&o)
        );
        assert!(
            err.contains("1 refused (largest 15.99 EiB)"),
            "growth {growth}\n{}",
            dump(&o)
        );
    }
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// Two processes on one shared fake GPU: A keeps what it freed even after B filled
/// the device, and its later requests need no new physical memory.
fn two_processes(growth: bool) -> (Output, Output, Vec<DevStats>) {
    let dir = scratch(if growth {
        "growth-shared"
    } else {
        "growth-shared-off"
    });
    let (a_stats, b_stats) = (dir.join("a.json"), dir.join("b.json"));
    let name = format!("gpucap-test-{}-{}", std::process::id(), growth);
    let flag = |n: &str| dir.join(n).display().to_string();
    let mut a = script_cmd(&a_stats, "8Gi", "6Gi", growth);
    a.env("FAKECUDA_SHARED", &name).args([
        "alloc:1Gi".to_string(),
        "alloc:1Gi".into(),
        "alloc:1Gi".into(),
        "free".into(),
        format!("touch:{}", flag("a-freed")),
        format!("wait:{}", flag("b-filled")),
        "alloc:2Gi".into(),
        "write".into(),
        "free".into(),
        "alloc:1Gi".into(),
        "alloc:1Gi".into(),
        "alloc:512Mi".into(),
        "alloc:512Mi".into(),
        "write".into(),
        "info".into(),
        format!("touch:{}", flag("a-done")),
    ]);
    // B is capped at the whole device: it takes whatever the GPU has left.
    let mut b = script_cmd(&b_stats, "8Gi", "8Gi", false);
    b.env("FAKECUDA_SHARED", &name).args([
        format!("wait:{}", flag("a-freed")),
        "fill:256Mi".into(),
        "info".into(),
        format!("touch:{}", flag("b-filled")),
        format!("wait:{}", flag("a-done")),
    ]);
    let (a, b) = (spawn(&mut a), spawn(&mut b));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let _ = std::fs::remove_file(Path::new("/dev/shm").join(format!("fakecuda-{name}")));
    let stats = read_stats(&a_stats);
    (a, b, stats)
}

#[test]
fn retained_memory_survives_another_process_filling_the_gpu() {
    let (a, b, a_stats) = two_processes(true);
    assert_eq!(
        b.status.code(),
        Some(0),
        "B: {}\n{}",
        stdout(&b),
        stderr(&b)
    );
    assert_eq!(
        a.status.code(),
        Some(0),
        "A: {}\n{}",
        stdout(&a),
        stderr(&a)
    );
    // B filled all the GPU except A's 3 GiB: 5 GiB in 256 MiB blocks.
    assert!(stdout(&b).contains("filled 20"), "B: {}", stdout(&b));
    assert!(
        alloc_rcs(&a).iter().all(|&rc| rc == 0),
        "A: {}\n{}",
        stdout(&a),
        stderr(&a)
    );
    assert_eq!(
        stdout(&a).matches("verify ok").count(),
        2,
        "A: {}",
        stdout(&a)
    );
    assert_eq!(
        a_stats[0].alloc_calls,
        3 * GIB / PAGE,
        "A made no new physical allocation"
    );
    assert_eq!(a_stats[0].free_calls, 0);
}

#[test]
fn without_growth_mode_the_other_process_takes_the_freed_memory() {
    let (a, b, _) = two_processes(false);
    assert_eq!(
        b.status.code(),
        Some(0),
        "B: {}\n{}",
        stdout(&b),
        stderr(&b)
    );
    assert!(stdout(&b).contains("filled 32"), "B: {}", stdout(&b));
    // A's 2 GiB request now fails at the driver: the GPU is full.
    assert_eq!(alloc_rcs(&a)[3], 2, "A: {}", stdout(&a));
}

/// Kernels loaded at a first launch take their memory whatever the cap says (charged by
/// force): in growth mode the retained pages no allocation needs go back until the cap
/// has room again, where the process stayed 300 MiB over it until exit (900 MiB
/// retained beside the kernels' 300 under 1 GiB).
#[test]
fn memory_taken_past_the_cap_gives_retained_pages_back() {
    let dir = scratch("growth-forced");
    let stats = dir.join("stats.json");
    let mut c = script_cmd(&stats, "16Gi", "1Gi", true);
    c.env("FAKECUDA_LIBRARY_MEM", "300Mi")
        .args(["alloc:900Mi", "free", "kernel", "info"]);
    let o = run(&mut c);
    assert_ok(&o);
    let s = &read_stats(&stats)[0];
    assert!(
        s.final_used <= GIB,
        "{} MiB held at the end\n{}",
        s.final_used >> 20,
        dump(&o)
    );
}

/// A request that would not fit even with every retained page given back gives none
/// back: growth mode keeps what it holds (a later request of that size is served from
/// it whatever other processes took), and the request is refused.
#[test]
fn a_request_that_cannot_fit_keeps_the_retained_pages() {
    let dir = scratch("growth-keep");
    let stats = dir.join("stats.json");
    let mut c = fake_cmd(compile_c("growth_small", "", &["-lcuda"]), &stats);
    preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", "16Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_GROWTH", "1")
        .env("GPUCAP_LOG", "info")
        .args(["alloc:700Mi", "free", "other:pitch:2Gi"]);
    let o = run(&mut c);
    assert_ok(&o);
    assert!(
        stdout(&o).contains("other pitch 2147483648 2"),
        "{}",
        dump(&o)
    );
    assert!(stderr(&o).contains(", 700 MiB retained"), "{}", dump(&o));
}
