//! Growth-only mode's small allocations (GPUCAP_GROWTH=1): requests of at
//! most half a page are carved from shared pages ("slabs"), so many small blocks fit
//! under a cap that whole pages per block would exhaust; the footprint still never
//! shrinks, a page whose blocks are all freed serves a large request again, and the
//! free figure of cuMemGetInfo is never more than a request can get.

use super::common;

use common::*;
use std::path::Path;
use std::process::{Command, Output};

const PAGE: u64 = 2 * MIB; // the fake driver's VMM granularity
const KIB64: u64 = 64 * 1024;

/// `growth_small STEP...` on a 16 GiB fake GPU, preloaded, growth mode, capped.
fn growth_cmd(stats: &Path, limit: &str) -> Command {
    let mut c = fake_cmd(compile_c("growth_small", "", &["-lcuda"]), stats);
    preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", "16Gi")
        .env("GPUCAP_LIMIT", limit)
        .env("GPUCAP_GROWTH", "1");
    c
}

/// The words after `key` on the first line starting with it.
fn line(o: &Output, key: &str) -> Vec<String> {
    lines(o, key)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {key} line\n{}", dump(o)))
}

/// All lines starting with `key`, their words after it.
fn lines(o: &Output, key: &str) -> Vec<Vec<String>> {
    stdout(o)
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(key))
        .map(|l| l.split_whitespace().skip(1).map(String::from).collect())
        .collect()
}

fn num(w: &str) -> u64 {
    w.parse().unwrap()
}

/// Slab pages needed for `n` blocks of `size` bytes (a multiple of 512), one-page slabs.
fn slab_pages(n: u64, size: u64) -> u64 {
    n.div_ceil(PAGE / size)
}

#[test]
fn ten_thousand_64_kib_blocks_fit_under_a_1_gib_cap() {
    let dir = scratch("growth-small-many");
    let stats = dir.join("stats.json");
    let o =
        run(growth_cmd(&stats, "1Gi").args(["many:10000:64Ki", "align", "write", "range", "info"]));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    // Before sub-allocation each block took a 2 MiB page: refused at the 513th.
    assert_eq!(
        line(&o, "many"),
        ["10000", "65536", "ok", "10000", "rc", "0"]
    );
    assert_eq!(line(&o, "align"), ["ok"], "512-byte aligned");
    assert_eq!(line(&o, "verify"), ["ok"], "no two blocks overlap");
    assert_eq!(
        line(&o, "range"),
        ["ok"],
        "interior pointers name their block"
    );
    let pages = slab_pages(10_000, KIB64);
    let s = &read_stats(&stats)[0];
    assert_eq!(s.alloc_calls, pages, "one page per 32 blocks: {s:?}");
    assert_eq!(s.peak_used, pages * PAGE);
    assert!(s.peak_used <= GIB);
    // Slabs holding live blocks are not free to the process.
    let info = line(&o, "info");
    assert_eq!((num(&info[0]), num(&info[1])), (GIB - pages * PAGE, GIB));
}

/// A request growth mode does not serve (a pitched, managed or stream-ordered
/// allocation, a `cuMemCreate` handle) gets the retained pages no allocation needs:
/// they go back to the driver and the cap, as the free figure counted them free. They
/// were refused at the cap (retained 700 MiB of a 1 GiB cap, `info` saying 1 GiB free,
/// 600 MiB refused). A live allocation's pages and a slab's with a live block stay.
#[test]
fn retained_pages_are_given_back_for_a_request_growth_mode_does_not_serve() {
    for kind in ["pitch", "managed", "async", "create"] {
        let dir = scratch("growth-small-other");
        let stats = dir.join("stats.json");
        let o = run(growth_cmd(&stats, "1Gi").args([
            "alloc:700Mi",
            "alloc:64Ki", // a slab with a live block: its page stays
            "free",
            "alloc:64Ki",
            "info",
            &format!("other:{kind}:600Mi"),
            "info",
            &format!("other:{kind}:1023Mi"), // more than the cap less the live slab
        ]));
        assert_eq!(o.status.code(), Some(0), "{kind}\n{}", dump(&o));
        let infos = lines(&o, "info");
        assert_eq!(
            num(&infos[0][0]),
            GIB - PAGE,
            "{kind}: the free figure\n{}",
            dump(&o)
        );
        let others = lines(&o, "other");
        assert_eq!(
            others[0][2],
            "0",
            "{kind}: 600 MiB refused under that figure\n{}",
            dump(&o)
        );
        assert_eq!(num(&infos[1][0]), GIB - PAGE, "{kind}\n{}", dump(&o));
        assert_eq!(others[1][2], "2", "{kind}: past the cap\n{}", dump(&o));
        let s = &read_stats(&stats)[0];
        assert!(s.peak_used <= GIB, "{kind}: {s:?}");
    }
}

#[test]
fn freed_small_blocks_give_their_pages_to_a_large_request() {
    let dir = scratch("growth-small-reuse");
    let stats = dir.join("stats.json");
    let pages = slab_pages(10_000, KIB64);
    let retained = format!("alloc:{}", pages * PAGE);
    let rest = format!("alloc:{}", GIB - pages * PAGE);
    let o = run(growth_cmd(&stats, "1Gi").args([
        "many:10000:64Ki",
        "free",
        "info",
        "refree",
        &retained, // exactly the retained bytes: the empty slabs' pages, remapped
        "info",
        &rest, // the cap's remainder: new pages
        "alloc:64Ki",
        "write",
        "range",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert_eq!(line(&o, "freed"), ["10000", "failed", "0"]);
    let infos = lines(&o, "info");
    assert_eq!(
        (num(&infos[0][0]), num(&infos[0][1])),
        (GIB, GIB),
        "all of the cap is free to the process again"
    );
    assert_ne!(
        line(&o, "refree")[0],
        "0",
        "a double free is the driver's error"
    );
    let allocs = lines(&o, "alloc");
    assert_eq!(allocs[0][1], "0", "{}", dump(&o));
    assert_eq!(num(&infos[1][0]), GIB - pages * PAGE);
    assert_eq!(allocs[1][1], "0", "{}", dump(&o));
    assert_eq!(allocs[2][1], "2", "the footprint is the cap: refused");
    assert_eq!(line(&o, "verify"), ["ok"]);
    assert_eq!(line(&o, "range"), ["ok"]);
    let s = &read_stats(&stats)[0];
    assert_eq!(
        s.alloc_calls,
        GIB / PAGE,
        "the retained request made no page: {s:?}"
    );
    assert_eq!(s.free_calls, 0, "nothing went back to the driver");
    assert_eq!(s.peak_used, GIB);
}

#[test]
fn small_blocks_use_loose_and_cached_pages_before_new_ones() {
    let dir = scratch("growth-small-loose");
    let stats = dir.join("stats.json");
    let o = run(growth_cmd(&stats, "1Gi").args([
        "alloc:64Mi",
        "alloc:64Mi",
        "free",       // two cached mappings of 32 pages
        "alloc:32Mi", // unmaps one: 16 pages taken, 16 loose
        "many:10000:64Ki",
        "write",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert_eq!(line(&o, "many")[3], "10000", "{}", dump(&o));
    assert_eq!(line(&o, "verify"), ["ok"]);
    let first = 2 * 64 * MIB / PAGE;
    let spare = first - 32 * MIB / PAGE; // 16 loose + 32 in the other cached mapping
    let s = &read_stats(&stats)[0];
    assert_eq!(
        s.alloc_calls,
        first + slab_pages(10_000, KIB64) - spare,
        "{s:?}"
    );
}

#[test]
fn small_blocks_answer_range_queries_and_only_their_base_frees_them() {
    let dir = scratch("growth-small-range");
    let stats = dir.join("stats.json");
    let o = run(growth_cmd(&stats, "1Gi").args([
        "alloc:1",
        "alloc:1000",
        "alloc:4097",
        "alloc:700Ki",
        "alloc:1Mi", // half a page: still small
        "alloc:64Ki",
        "range",
        "align",
        "write",
        "free-interior",
        "write",
        "free",
        "refree",
        "alloc:1000",
        "alloc:1000",
        "write",
    ]));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert!(
        lines(&o, "alloc").iter().all(|a| a[1] == "0"),
        "{}",
        dump(&o)
    );
    assert_eq!(line(&o, "range"), ["ok"], "{}", dump(&o));
    assert_eq!(line(&o, "align"), ["ok"]);
    assert_ne!(
        line(&o, "free-interior")[0],
        "0",
        "an interior pointer does not free"
    );
    assert!(
        lines(&o, "verify").iter().all(|v| v == &["ok"]),
        "{}",
        dump(&o)
    );
    assert_eq!(line(&o, "freed"), ["6", "failed", "0"]);
    assert_ne!(line(&o, "refree")[0], "0");
    // The six blocks, each rounded up to 512 bytes, share pages; the two after the
    // frees reuse them.
    let bytes: u64 = [1u64, 1000, 4097, 700 * 1024, MIB, KIB64]
        .iter()
        .map(|s| s.next_multiple_of(512))
        .sum();
    assert_eq!(read_stats(&stats)[0].alloc_calls, bytes.div_ceil(PAGE));
}

/// `mixed:SEED:20000:BUDGET` under `limit`: (allocs, refused, broken, bad) and the
/// driver's peak.
fn mixed(name: &str, limit: &str, seed: u32, budget: &str) -> (u64, u64, u64, u64, u64) {
    let dir = scratch(name);
    let stats = dir.join("stats.json");
    let o = run(growth_cmd(&stats, limit).arg(format!("mixed:{seed}:20000:{budget}")));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let w = line(&o, "mixed");
    assert_eq!(w[0], "allocs", "{w:?}");
    assert!(
        num(&w[3]) > 0 && num(&w[5]) > 0,
        "small and large blocks: {w:?}"
    );
    (
        num(&w[1]),
        num(&w[7]),
        num(&w[9]),
        num(&w[11]),
        read_stats(&stats)[0].peak_used,
    )
}

#[test]
fn a_mixed_workload_at_half_the_cap_is_never_refused() {
    // Random small (512 B..1 MiB, log-uniform) and large (1..24 MiB) sizes, 40 % of
    // operations frees, at most 128 MiB live under a 256 MiB cap. With a page per
    // small block this was refused 2,369 times (the cap reached).
    let (allocs, refused, broken, bad, peak) = mixed("growth-mixed-half", "256Mi", 1, "128Mi");
    assert!(allocs > 10_000);
    assert_eq!((refused, broken, bad), (0, 0, 0));
    assert!(peak <= 256 * MIB, "driver peak {peak}");
}

#[test]
fn a_mixed_workload_at_the_cap_keeps_the_free_figure_s_promise() {
    // Live bytes unbounded: the workload runs into the cap. Every refusal must come
    // when cuMemGetInfo said less than the request was free; the driver's peak stays
    // within the cap, also when the cap is not a whole number of pages.
    for (limit, cap) in [("256Mi", 256 * MIB), ("101Mi", 101 * MIB)] {
        for seed in [1, 2] {
            let (_, refused, broken, bad, peak) = mixed(
                &format!("growth-mixed-cap-{limit}-{seed}"),
                limit,
                seed,
                "1Gi",
            );
            assert!(refused > 0, "{limit}: the cap was reached");
            assert_eq!(
                (broken, bad),
                (0, 0),
                "{limit} seed {seed}: broken promises, bad blocks"
            );
            assert!(peak <= cap, "{limit}: driver peak {peak}");
        }
    }
}
