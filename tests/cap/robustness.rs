//! The ledger under stress and misuse: concurrent allocation, wrong frees, absurd
//! sizes, allocations the driver refuses, fork(), VMM handles, per-device caps; a thread
//! cancelled inside the shim, a stderr that cannot be written, and standard descriptors
//! closed before the first CUDA call.
//!
//! The C programs (tests/c) check their own results ("ok"/"FAIL" lines, exit status);
//! this side adds the fake driver's view (its stats file: what it really handed out)
//! and compares with runs without the shim where that shows something.

use super::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// A command on the fake (with `total` memory per device) with the shim and `limit`.
fn capped(prog: &Path, tag: &str, total: &str, limit: &str) -> (Command, PathBuf) {
    let stats = scratch(tag).join("stats.json");
    let mut c = fake_cmd(prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", total);
    preload(&mut c).env("GPUCAP_LIMIT", limit);
    (c, stats)
}

/// The same without the shim.
fn uncapped(prog: &Path, tag: &str, total: &str) -> (Command, PathBuf) {
    let stats = scratch(tag).join("stats.json");
    let mut c = fake_cmd(prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", total);
    (c, stats)
}

/// `key=value` from a line of "k=v k=v" pairs.
fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}

// ---- concurrency --------------------------------------------------------------------

#[test]
fn concurrent_alloc_free_never_exceeds_the_cap() {
    let prog = compile_c("stress", "", &["-lcuda"]);
    const CAP: u64 = 256 * MIB;
    // Several seeds: a race that lets the driver go over the cap may need a few runs to show.
    for seed in (1..=12).map(|n| n.to_string()) {
        let (mut c, stats) = capped(&prog, "stress", "8Gi", "256Mi");
        let o = run(c.args(["256Mi", "16", "3000", &seed, "40Mi"]));
        let out = stdout(&o);
        let line = out
            .lines()
            .find(|l| l.starts_with("allocs="))
            .expect("counts line");
        eprintln!("seed {seed}, with the shim: {line}");
        let (allocs, refused, frees) = (
            field(line, "allocs"),
            field(line, "refused"),
            field(line, "frees"),
        );
        assert!(allocs > 1000, "too few allocations succeeded: {line}");
        assert!(
            refused > 100,
            "the cap was not contended (no refusals): {line}"
        );
        assert_eq!(allocs, frees);

        let s = read_stats(&stats);
        eprintln!("fake driver: {:?}", s[0]);
        assert!(
            s[0].peak_used <= CAP,
            "seed {seed}: the driver had {} bytes out at once, over the {CAP}-byte cap \
             (16 threads, cuMemAlloc_v2 mixed with cuMemAllocAsync/_ptsz on the default pool)",
            s[0].peak_used
        );
        assert_eq!(
            s[0].final_used, 0,
            "memory still allocated in the driver at exit"
        );
        // The shim may take back an allocation the driver made (e.g. when settling a
        // pool's charge shows it over the cap), so the driver can count more than the
        // program; but everything it handed out came back.
        assert!(
            s[0].alloc_calls >= allocs,
            "the driver made fewer allocations ({}) than the program got ({allocs})",
            s[0].alloc_calls
        );
        assert_eq!(
            s[0].free_calls, s[0].alloc_calls,
            "driver allocations never freed"
        );
        // The program's own checks last (mid-run cuMemGetInfo, free == cap at the end),
        // so that the driver-side invariants above are reported first.
        assert_passed(&o, "stress with the shim");
    }

    // Control: the same load without the shim goes past the cap, so the cap is what held it.
    let (mut c, stats) = uncapped(&prog, "stress-control", "8Gi");
    let o = run(c.args(["8Gi", "16", "3000", "1", "40Mi"]));
    let out = stdout(&o);
    eprintln!(
        "without the shim: {}",
        out.lines()
            .find(|l| l.starts_with("allocs="))
            .unwrap_or("?")
    );
    let s = read_stats(&stats);
    assert!(
        s[0].peak_used > CAP,
        "the load never needed more than the cap: {:?}",
        s[0]
    );
}

/// Many threads making the process's first CUDA calls at once (cuInit, cuGetProcAddress,
/// dlsym, allocations) race the shim's lazy initialisation. Repeated, as races are rare.
#[test]
fn first_use_from_many_threads_at_once() {
    let prog = compile_c("racy_start", "", &["-lcuda"]);
    for i in 0..25 {
        let (mut c, stats) = capped(&prog, "racy-start", "8Gi", "256Mi");
        let o = run(c.args(["256Mi", "16"]));
        assert_passed(&o, &format!("racy_start run {i}"));
        let s = read_stats(&stats);
        assert_eq!(s[0].peak_used, 256 * MIB, "run {i}: {:?}", s[0]);
        assert_eq!(s[0].final_used, 0);
    }
}

// ---- misuse -------------------------------------------------------------------------

/// The "rc <label> <code>" lines.
fn rc_lines(o: &Output) -> Vec<String> {
    stdout(o)
        .lines()
        .filter(|l| l.starts_with("rc "))
        .map(str::to_string)
        .collect()
}

#[test]
fn misuse_gets_the_drivers_errors_and_leaves_the_ledger_alone() {
    let prog = compile_c("misuse", "", &["-lcuda"]);
    let (mut c, stats) = capped(&prog, "misuse", "8Gi", "1Gi");
    let with = run(c.args(["misuse", "capped", "1Gi", "8Gi"]));
    assert_passed(&with, "misuse with the shim");
    let s = read_stats(&stats);
    assert_eq!(s[0].final_used, 0);
    assert!(s[0].peak_used <= GIB);

    let (mut c, _) = uncapped(&prog, "misuse", "8Gi");
    let without = run(c.args(["misuse", "uncapped", "1Gi", "8Gi"]));
    assert_passed(&without, "misuse without the shim (control)");

    // The shim hands back exactly the driver's error codes.
    let (a, b) = (rc_lines(&with), rc_lines(&without));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let label = x.rsplit_once(' ').unwrap().0;
        // Sizes the fake itself refuses (past its memory) are OUT_OF_MEMORY either way;
        // everything else must be the very same code.
        assert_eq!(x, y, "{label}: the shim's answer differs from the driver's");
    }
}

#[test]
fn allocations_the_driver_refuses_are_not_charged() {
    let prog = compile_c("misuse", "", &["-lcuda"]);
    let (mut c, stats) = capped(&prog, "rollback", "2Gi", "4Gi");
    let o = run(c.args(["rollback", "capped", "4Gi", "2Gi"]));
    assert_passed(
        &o,
        "rollback with the shim (FAKECUDA_TOTAL_MEM=2Gi, GPUCAP_LIMIT=4Gi)",
    );
    let s = read_stats(&stats);
    assert_eq!(s[0].final_used, 0);
    // The shim did not refuse these itself (they were within its cap).
    assert!(
        !stderr(&o).contains("gpucap: refused"),
        "the shim refused allocations within its cap:\n{}",
        stderr(&o)
    );

    let (mut c, _) = uncapped(&prog, "rollback", "2Gi");
    let o = run(c.args(["rollback", "uncapped", "4Gi", "2Gi"]));
    assert_passed(&o, "rollback without the shim (control)");
}

// ---- fork ---------------------------------------------------------------------------

#[test]
fn forked_children_that_skip_cuda_exit_cleanly() {
    let prog = compile_c("fork", "", &["-lcuda"]);
    let (mut c, stats) = capped(&prog, "fork", "8Gi", "256Mi");
    let o = run(c.arg("256Mi"));
    assert_passed(&o, "fork with the shim");
    assert_eq!(stderr(&o), "", "stderr must be empty");
    // The parent exits last, so the stats are the parent's.
    let s = read_stats(&stats);
    assert_eq!(s[0].final_used, 0);
    assert!(s[0].peak_used <= 256 * MIB);
}

// ---- several devices ----------------------------------------------------------------

fn multidev() -> PathBuf {
    compile_c("multidev", "", &["-lcuda"])
}

#[test]
fn mem_create_is_counted_by_handle_on_its_location() {
    let (mut c, stats) = capped(&multidev(), "vmm", "8Gi", "0=64Mi,1=1Gi");
    c.env("FAKECUDA_DEVICES", "2");
    let o = run(c.args(["vmm", "64Mi", "1Gi"]));
    assert_passed(&o, "vmm with the shim");
    let s = read_stats(&stats);
    assert_eq!(s.len(), 2);
    assert!(
        s[0].peak_used <= 64 * MIB,
        "GPU 0 over its cap in the driver: {:?}",
        s[0]
    );
    assert_eq!(s[1].peak_used, 512 * MIB, "GPU 1: {:?}", s[1]);
    assert_eq!((s[0].final_used, s[1].final_used), (0, 0));

    // Without the shim the refusals do not happen.
    let (mut c, _) = uncapped(&multidev(), "vmm", "8Gi");
    c.env("FAKECUDA_DEVICES", "2");
    let o = run(c.args(["vmm", "64Mi", "1Gi"]));
    assert!(
        !o.status.success(),
        "vmm passed without the shim:\n{}",
        stdout(&o)
    );
}

#[test]
fn each_device_has_its_own_cap() {
    let (mut c, stats) = capped(&multidev(), "perdevice", "8Gi", "0=256Mi,1=1Gi");
    c.env("FAKECUDA_DEVICES", "2");
    let o = run(c.args(["perdevice", "256Mi", "1Gi"]));
    assert_passed(&o, "perdevice with the shim");
    let s = read_stats(&stats);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].peak_used, 256 * MIB, "GPU 0: {:?}", s[0]);
    assert_eq!(s[1].peak_used, GIB, "GPU 1: {:?}", s[1]);
    assert_eq!((s[0].final_used, s[1].final_used), (0, 0));

    let (mut c, _) = uncapped(&multidev(), "perdevice", "8Gi");
    c.env("FAKECUDA_DEVICES", "2");
    let o = run(c.args(["perdevice", "256Mi", "1Gi"]));
    assert!(
        !o.status.success(),
        "perdevice passed without the shim:\n{}",
        stdout(&o)
    );
}

// ---- context teardown ---------------------------------------------------------------

/// The driver frees a context's allocations when the context is destroyed or reset;
/// the ledger must not keep charging them.
#[test]
fn context_teardown_credits_the_ledger() {
    let prog = compile_c("teardown", "", &["-lcuda"]);
    let (mut c, stats) = capped(&prog, "teardown", "8Gi", "256Mi");
    let with = run(c.args(["capped", "256Mi", "8Gi"]));
    let (mut c, _) = uncapped(&prog, "teardown", "8Gi");
    let without = run(c.args(["uncapped", "256Mi", "8Gi"]));
    assert_passed(&without, "teardown without the shim (control)");
    assert_passed(&with, "teardown with the shim");
    assert_eq!(read_stats(&stats)[0].final_used, 0);
}

/// FAKECUDA_ARENA=1 (for measuring the shim's own time): a freed block stays mapped and
/// serves the next request of its length, so an alloc/free loop makes no `mmap`/`munmap`
/// once warm; without it every pair maps and unmaps. Counted with strace when present.
#[test]
fn the_fakes_arena_mode_makes_no_system_call_per_pair() {
    if !strace_runs() {
        return;
    }
    let prog = compile_c("bench_alloc", "", &["-lcuda"]);
    let munmaps = |arena: &str| {
        let dir = scratch("arena");
        let trace = dir.join("trace");
        let mut c = fake_cmd("strace", &dir.join("s.json"));
        c.args(["-f", "-qq", "-e", "trace=munmap", "-o"])
            .arg(&trace)
            .arg(&prog)
            .args(["1", "2000", "64Ki", "pair"])
            .env("FAKECUDA_ARENA", arena);
        preload(&mut c).env("GPUCAP_LIMIT", "1Gi");
        assert_ok(&run(&mut c));
        std::fs::read_to_string(&trace)
            .unwrap()
            .lines()
            .filter(|l| l.contains("munmap("))
            .count()
    };
    let (plain, arena) = (munmaps("0"), munmaps("1"));
    assert!(
        plain >= 2000,
        "without the arena every free unmaps: {plain}"
    );
    assert!(
        arena < 100,
        "with the arena the loop does not unmap: {arena}"
    );
}

// ---- cancellation and stderr --------------------------------------------------------

/// A thread with a `pthread_cancel` pending reaches the shim's cancellation points (its
/// configuration's `open` at `cuInit`, a refusal line's `write`): the call returns the
/// driver's answer (the refusal still `CUDA_ERROR_OUT_OF_MEMORY`) and the thread is
/// cancelled after it, as without the shim. Before, glibc's unwind reached the shim's Rust
/// frames and the process aborted (SIGABRT, exit 134).
#[test]
fn a_thread_cancelled_inside_the_shim_is_cancelled_after_it() {
    let prog = compile_c("cancelled", "", &["-lcuda", "-lpthread"]);
    for (args, rc) in [(&["init"][..], "0"), (&["refused", "2048"][..], "2")] {
        let (mut c, _) = capped(&prog, "cancelled", "8Gi", "1Gi");
        let o = run(c.args(args));
        assert!(o.status.success(), "{args:?}\n{}", dump(&o));
        let out = stdout(&o);
        assert!(
            out.contains(&format!("call {rc}\n")),
            "{args:?}\n{}",
            dump(&o)
        );
        assert!(
            out.contains("joined cancelled\nok\n"),
            "{args:?}\n{}",
            dump(&o)
        );
    }
}

/// A refusal whose line cannot be written (stderr on a full disk) is still
/// `CUDA_ERROR_OUT_OF_MEMORY`; before, the failed write panicked in the shim and the
/// program got `CUDA_ERROR_UNKNOWN` (999), which PyTorch, JAX and TensorFlow take as fatal
/// where they would have freed their caches and tried again.
#[test]
fn a_refusal_whose_line_cannot_be_written_is_still_out_of_memory() {
    if !Path::new("/dev/full").exists() {
        skip("/dev/full (a disk that is always full) is not here");
        return;
    }
    let prog = compile_c("script", "", &["-lcuda"]);
    let (mut c, _) = capped(&prog, "stderr-full", "8Gi", "256Mi");
    c.args([format!("alloc:{}", 200 * MIB), format!("alloc:{GIB}")])
        .env("GPUCAP_LOG", "debug")
        .stderr(
            std::fs::File::options()
                .write(true)
                .open("/dev/full")
                .unwrap(),
        );
    let o = run(&mut c);
    assert!(o.status.success(), "{}", dump(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("alloc {} 0\n", 200 * MIB)),
        "{}",
        dump(&o)
    );
    assert!(out.contains(&format!("alloc {GIB} 2\n")), "{}", dump(&o));
}

/// A program that closed its standard input, output or error before its first CUDA call
/// (a daemon; `prog <&- >&- 2>&-`) keeps those numbers for its own: every descriptor
/// gpucap keeps (a lone process's memfd and visible file, a pool file, a claim's memfd
/// and sockets, the beacon) lies above 2. Before, gpucap's visible file took descriptor 2
/// and its refusal lines were written into it, the program's next `open` got a number
/// other than the one it closed, and a `dup2` onto 0-2 would have closed gpucap's file
/// (and with it the locks that show a pool member alive).
#[test]
fn descriptors_a_program_closed_stay_its_own() {
    let prog = compile_c("closed_stdio", "", &["-lcuda"]);
    let dir = scratch("closed-stdio");
    let pools = dir.join("pools");
    let claim = dir.join("claim");
    std::fs::create_dir_all(&claim).unwrap();
    std::fs::create_dir_all(&pools).unwrap();
    let ways: [(&str, Vec<(&str, &Path)>); 3] = [
        ("alone", vec![("GPUCAP_POOL_DIR", &pools)]),
        ("named pool", vec![("GPUCAP_POOL_DIR", &pools)]),
        ("claim", vec![("GPUCAP_CLAIM_DIR", &claim)]),
    ];
    for (way, vars) in &ways {
        for closed in ["012", "2", "0"] {
            let report = dir.join(format!("{}-{closed}.txt", way.replace(' ', "-")));
            let (mut c, _) = capped(&prog, "closed-stdio", "8Gi", "256Mi");
            c.envs(vars.iter().map(|(k, v)| (*k, *v)));
            if *way == "named pool" {
                c.env("GPUCAP_POOL", "closed");
            }
            c.arg(&report)
                .arg(closed)
                .args([(128 * MIB).to_string(), GIB.to_string()]);
            let o = run(&mut c);
            let out = std::fs::read_to_string(&report).unwrap_or_default();
            let what = format!("{way}, {closed} closed:\n{out}{}", dump(&o));
            assert!(o.status.success(), "{what}");
            assert!(
                out.contains(&format!("alloc {} 0\nalloc {GIB} 2\n", 128 * MIB)),
                "{what}"
            );
            let lowest = &closed[..1];
            assert!(out.contains(&format!("next {lowest}\n")), "{what}");
            for line in out.lines().filter(|l| l.starts_with("fd ")) {
                assert!(
                    !["gpucap", "memfd:", "socket:", ".pool", ".lone"]
                        .iter()
                        .any(|m| line.contains(m)),
                    "a descriptor the program closed holds gpucap's: {line}\n{what}"
                );
            }
        }
    }
}
