//! The scenarios every Python framework client runs on the fake GPU (`cupy.rs`,
//! `numba.rs`), each a function of the client: alone on the fake, then under gpucap (the
//! cap with the client's own out-of-memory error and gpucap's line, a fraction cap, the
//! context's memory counted, per-GPU caps under CUDA_VISIBLE_DEVICES, growth mode). Each
//! client's steps print the same facts (`tests/clients/*_client.py`).

use super::common;
use super::python_client::{Client, assert_peak, run_client};

use common::*;

/// Without gpucap: the client finds the fake's two devices with their properties, the
/// memory info shows each device whole, arrays are allocated until the client refuses
/// with its own error at the device's size, freed arrays give the memory back, copies
/// carry real bytes, and a kernel it compiles loads and launches.
pub fn runs_on_the_fake_gpu(c: &Client) {
    let env = [("FAKECUDA_DEVICES", "2"), ("FAKECUDA_TOTAL_MEM", "1Gi")];
    let steps = [
        "info", "meminfo", "fill:256", "free", "meminfo", "copy:16", "kernel",
    ];
    let Some(r) = run_client(c, false, &env, &steps) else {
        return;
    };
    assert_eq!(r.lines("count "), ["count 2"], "{}", r.dump());
    assert_eq!(
        r.lines("device "),
        [
            "device 0 name=FakeCUDA_Device_0 total=1073741824 cc=9.0",
            "device 1 name=FakeCUDA_Device_1 total=1073741824 cc=9.0"
        ],
        "{}",
        r.dump()
    );
    assert_eq!(r.mem_info(), [(GIB, GIB), (GIB, GIB)], "{}", r.dump());
    assert_eq!(
        r.fills(),
        [(4, c.oom.to_string())],
        "four 256 MiB arrays fill the 1 GiB device\n{}",
        r.dump()
    );
    assert_eq!(r.lines("copy "), ["copy 16 ok"], "{}", r.dump());
    assert_eq!(r.lines("kernel "), ["kernel ok shape=1024"], "{}", r.dump());
    assert!(r.refusals().is_empty(), "no gpucap here\n{}", r.dump());
    assert_eq!(r.stats[0].peak_used, GIB, "{}", r.dump());
}

/// Under gpucap with a 600 MiB cap, the client's extension modules imported with
/// `RTLD_DEEPBIND` (`sys.setdlopenflags`, the client's `deepbind`): each looks its
/// references up in its own dependencies first (the CUDA runtime linked into it found the
/// C library's `dlsym`, and through it the driver's functions), and the client still gets
/// six 100 MiB arrays and then its own error; on the tree before the shim's `dlopen`,
/// ten (the device's whole gigabyte, the cap never seen).
pub fn imported_with_rtld_deepbind_is_capped(c: &Client) {
    let env = [("FAKECUDA_TOTAL_MEM", "1Gi"), ("GPUCAP_LIMIT", "600MiB")];
    let Some(r) = run_client(c, true, &env, &["deepbind", "meminfo", "fill:100"]) else {
        return;
    };
    let cap = 600 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(r.fills(), [(6, c.oom.to_string())], "{}", r.dump());
    assert_peak(&r, 0, cap, cap);
}

/// Under gpucap with a 600 MiB cap on a 1 GiB device: the memory info shows the cap, the
/// client gets six 100 MiB arrays, then its own error with gpucap's line, once (the
/// client frees what it cached and asks again: the same request refused again at once
/// prints no second line; at GPUCAP_LOG=debug every attempt does); the driver never held
/// more than the cap; copies and a kernel still run. Without gpucap the same fill gets ten.
pub fn is_capped_with_its_own_out_of_memory_error(c: &Client) {
    let env = [("FAKECUDA_TOTAL_MEM", "1Gi"), ("GPUCAP_LIMIT", "600MiB")];
    let steps = ["meminfo", "fill:100", "free", "copy:16", "kernel"];
    let Some(r) = run_client(c, true, &env, &steps) else {
        return;
    };
    let cap = 600 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(r.fills(), [(6, c.oom.to_string())], "{}", r.dump());
    let line = "gpucap: refused cuMemAlloc of 100 MiB on GPU 0: 600 MiB of the 600 MiB cap in use";
    assert_eq!(r.refusals(), [line], "one refusal, one line\n{}", r.dump());
    assert_eq!(r.lines("copy "), ["copy 16 ok"], "{}", r.dump());
    assert_eq!(r.lines("kernel "), ["kernel ok shape=1024"], "{}", r.dump());
    assert_peak(&r, 0, cap, cap);

    // The client asked more than once: at debug every refusal has its line.
    let debug = [env[0], env[1], ("GPUCAP_LOG", "debug")];
    let Some(d) = run_client(c, true, &debug, &["fill:100"]) else {
        return;
    };
    assert_eq!(d.fills(), [(6, c.oom.to_string())], "{}", d.dump());
    let attempts = d.refusals();
    assert!(
        attempts.len() > 1 && attempts.iter().all(|l| l == line),
        "{} retries: {attempts:?}\n{}",
        c.what,
        d.dump()
    );

    // The same without gpucap gets past the cap: the test fails if the shim does nothing.
    let Some(control) = run_client(c, false, &env, &["fill:100"]) else {
        return;
    };
    assert_eq!(
        control.fills(),
        [(10, c.oom.to_string())],
        "{}",
        control.dump()
    );
}

/// A fraction cap: 25% of a 2 GiB device is 512 MiB.
pub fn under_a_fraction_cap(c: &Client) {
    let env = [("FAKECUDA_TOTAL_MEM", "2Gi"), ("GPUCAP_LIMIT", "25%")];
    let Some(r) = run_client(c, true, &env, &["meminfo", "fill:128"]) else {
        return;
    };
    let cap = 512 * MIB;
    assert_eq!(r.mem_info(), [(cap, cap)], "{}", r.dump());
    assert_eq!(r.fills(), [(4, c.oom.to_string())], "{}", r.dump());
    assert!(!r.refusals().is_empty(), "{}", r.dump());
    assert_peak(&r, 0, cap, cap);
}

/// The context the client makes is charged to the cap: with 300 MiB of context memory
/// (FAKECUDA_CONTEXT_MEM) a 1 GiB cap leaves seven 100 MiB arrays, and the memory info
/// shows what is left.
pub fn context_memory_counts_against_the_cap(c: &Client) {
    let env = [
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("FAKECUDA_CONTEXT_MEM", "300MiB"),
        ("GPUCAP_LIMIT", "1Gi"),
    ];
    let Some(r) = run_client(c, true, &env, &["meminfo", "fill:100"]) else {
        return;
    };
    assert_eq!(r.mem_info(), [(GIB - 300 * MIB, GIB)], "{}", r.dump());
    assert_eq!(r.fills(), [(7, c.oom.to_string())], "{}", r.dump());
    assert_peak(&r, 0, GIB, GIB - 24 * MIB);
}

/// Per-GPU caps with CUDA_VISIBLE_DEVICES=2,0 on three GPUs: ordinal 0 (physical GPU 2) is
/// capped at 300 MiB and ordinal 1 (physical GPU 0) at 500 MiB; the client sees each cap
/// as the device's memory and is refused at each.
pub fn per_gpu_caps_follow_cuda_visible_devices(c: &Client) {
    let env = [
        ("FAKECUDA_DEVICES", "3"),
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("CUDA_VISIBLE_DEVICES", "2,0"),
        ("GPUCAP_LIMIT", "0=300MiB,1=500MiB"),
    ];
    let steps = [
        "info", "device:0", "meminfo", "fill:100", "device:1", "meminfo", "fill:100",
    ];
    let Some(r) = run_client(c, true, &env, &steps) else {
        return;
    };
    assert_eq!(r.lines("count "), ["count 2"], "{}", r.dump());
    assert_eq!(
        r.lines("device "),
        [
            "device 0 name=FakeCUDA_Device_2 total=314572800 cc=9.0",
            "device 1 name=FakeCUDA_Device_0 total=524288000 cc=9.0"
        ],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.mem_info(),
        [(300 * MIB, 300 * MIB), (500 * MIB, 500 * MIB)],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.fills(),
        [(3, c.oom.to_string()), (5, c.oom.to_string())],
        "{}",
        r.dump()
    );
    let lines = r.refusals();
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("on GPU 0: 300 MiB of the 300 MiB cap in use"))
            && lines
                .iter()
                .any(|l| l.ends_with("on GPU 1: 500 MiB of the 500 MiB cap in use")),
        "{}",
        r.dump()
    );
    assert_peak(&r, 0, 300 * MIB, 300 * MIB);
    assert_peak(&r, 1, 500 * MIB, 500 * MIB);
    assert_eq!(r.stats[0].total, 2 * GIB);
}

/// Growth mode: the client fills the 1 GiB cap and frees every array (its cache emptied),
/// yet the driver still holds the footprint at exit (it never shrinks), the program sees
/// it as free, and a second fill is served from it without a new page. Without growth
/// mode the same program gives the memory back to the driver.
pub fn in_growth_mode_keeps_its_footprint(c: &Client) {
    let env = [
        ("FAKECUDA_TOTAL_MEM", "2Gi"),
        ("GPUCAP_LIMIT", "1Gi"),
        ("GPUCAP_GROWTH", "1"),
    ];
    let steps = ["fill:100", "free", "meminfo", "fill:100"];
    let Some(r) = run_client(c, true, &env, &steps) else {
        return;
    };
    let held = 1000 * MIB; // ten 100 MiB arrays (whole 2 MiB pages)
    assert_eq!(
        r.fills(),
        [(10, c.oom.to_string()), (10, c.oom.to_string())],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.mem_info(),
        [(GIB, GIB)],
        "after the frees the retained pages are free to the process\n{}",
        r.dump()
    );
    let d = &r.stats[0];
    assert_eq!(
        d.final_used,
        held,
        "the footprint never shrinks\n{}",
        r.dump()
    );
    assert_eq!(
        d.alloc_calls,
        held / (2 * MIB),
        "the second fill created no page\n{}",
        r.dump()
    );
    assert_peak(&r, 0, GIB, held);

    // Control: without growth mode the freed memory goes back to the driver.
    let env = [("FAKECUDA_TOTAL_MEM", "2Gi"), ("GPUCAP_LIMIT", "1Gi")];
    let Some(control) = run_client(c, true, &env, &["fill:100", "free", "meminfo"]) else {
        return;
    };
    assert_eq!(control.mem_info(), [(GIB, GIB)], "{}", control.dump());
    assert_eq!(control.stats[0].final_used, 0, "{}", control.dump());
}
