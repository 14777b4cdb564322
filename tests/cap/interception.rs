//! Every way a program can reach the driver's memory entry points must land in the
//! shim's hooks: linked symbols, dlopen + dlsym (both library names, RTLD_DEFAULT),
//! cuGetProcAddress / cuGetProcAddress_v2 at several versions and flags (including
//! the getters cuGetProcAddress returns for itself). The dlsym override must keep
//! dlsym's contract for other interposers and plugins, and processes that never use
//! CUDA must not notice the shim.
//!
//! The C programs (tests/c) check their own results and print one "ok"/"FAIL" line
//! per check. Each is run three times:
//!   * with the shim, expecting the cap ("capped"): must pass;
//!   * without the shim, expecting the fake's own figures ("uncapped"): must pass,
//!     which shows the allocations past the cap succeed on the fake alone;
//!   * without the shim but expecting the cap: must FAIL, so the checks do depend on
//!     the shim.

use super::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// The cap the tests set, and the fake's memory (well above it).
const CAP: &str = "256Mi";
const PHYS: &str = "8Gi";

fn intercept_linked() -> PathBuf {
    compile_c("intercept", "-linked", &["-DLINKED", "-lcuda"])
}

fn intercept_dl() -> PathBuf {
    compile_c("intercept", "-dl", &[])
}

/// A command for `prog` on the fake with PHYS memory; with the shim and CAP when `shim`.
fn cmd(prog: &Path, tag: &str, shim: bool) -> (Command, PathBuf) {
    let stats = scratch(tag).join("stats.json");
    let mut c = fake_cmd(prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS);
    if shim {
        preload(&mut c).env("GPUCAP_LIMIT", CAP);
    }
    (c, stats)
}

/// Number of "ok" lines.
fn oks(o: &Output) -> usize {
    stdout(o).lines().filter(|l| l.starts_with("ok ")).count()
}

/// The "addr ..." lines, with the library's name reduced to "libcuda" (dlopen of
/// libcuda.so and libcuda.so.1 may name the same file either way).
fn addr_lines(o: &Output) -> Vec<String> {
    let mut v: Vec<String> = stdout(o)
        .lines()
        .filter(|l| l.starts_with("addr "))
        .map(|l| {
            l.replace("libcuda.so.1+", "libcuda+")
                .replace("libcuda.so+", "libcuda+")
        })
        .collect();
    v.sort();
    v
}

/// Runs `prog mode` capped with the shim, uncapped without, and capped-expecting
/// without the shim (must fail). Returns the run with the shim.
fn three_ways(prog: &Path, mode: &str) -> Output {
    let tag = format!("intercept-{mode}");
    let (mut c, _) = cmd(prog, &tag, true);
    let with = run(c.args([mode, "capped", CAP, PHYS]));
    assert_passed(&with, &format!("{mode} with the shim"));

    let (mut c, _) = cmd(prog, &tag, false);
    let without = run(c.args([mode, "uncapped", CAP, PHYS]));
    assert_passed(&without, &format!("{mode} without the shim (control)"));

    let (mut c, _) = cmd(prog, &tag, false);
    let control = run(c.args([mode, "capped", CAP, PHYS]));
    assert_failed(
        &control,
        &format!("{mode} without the shim, expecting the cap"),
    );

    assert_eq!(
        oks(&with),
        oks(&without),
        "{mode}: the runs with and without the shim made different numbers of checks"
    );
    // Unhooked entry points are the driver's own, at the same offsets either way.
    assert_eq!(
        addr_lines(&with),
        addr_lines(&without),
        "{mode}: unhooked entry points differ"
    );
    with
}

// ---- (a) linked with -lcuda ---------------------------------------------------------

#[test]
fn linked_symbols_are_capped() {
    let out = three_ways(&intercept_linked(), "direct");
    let err = stderr(&out);
    assert!(
        err.contains("gpucap: refused cuMemAlloc"),
        "no refusal line on stderr:\n{err}"
    );
}

// ---- (b) dlopen + dlsym -------------------------------------------------------------

#[test]
fn dlsym_on_dlopen_of_libcuda_so_1_is_capped() {
    three_ways(&intercept_dl(), "dlopen-so1");
}

#[test]
fn dlsym_on_dlopen_of_libcuda_so_is_capped() {
    three_ways(&intercept_dl(), "dlopen-so");
}

/// Real installs have libcuda.so.1 -> libcuda.so.<driver version>; some programs
/// dlopen the driver by an absolute path.
#[test]
fn dlsym_on_dlopen_by_absolute_versioned_path_is_capped() {
    let dir = scratch("abs-path");
    let versioned = dir.join("libcuda.so.570.86.10");
    std::os::unix::fs::symlink(profile_dir().join("libcuda.so"), &versioned).unwrap();
    three_ways(
        &intercept_dl(),
        &format!("dlopen-path={}", versioned.display()),
    );
    let plain = fake_lib_dir().join("libcuda.so.1");
    three_ways(&intercept_dl(), &format!("dlopen-path={}", plain.display()));
}

#[test]
fn dlsym_rtld_default_after_global_dlopen_is_capped() {
    three_ways(&intercept_dl(), "rtld-default");
}

// ---- (c) cuGetProcAddress / cuGetProcAddress_v2 -------------------------------------

#[test]
fn get_proc_address_from_dlsym_is_capped() {
    let out = three_ways(&intercept_dl(), "procaddr");
    // 2 getters x 4 versions x 2 flags, plus the getters returned for themselves.
    assert!(oks(&out) > 500, "suspiciously few checks: {}", oks(&out));
}

#[test]
fn get_proc_address_linked_is_capped() {
    three_ways(&intercept_linked(), "procaddr-linked");
}

// ---- messages -----------------------------------------------------------------------

fn simple() -> PathBuf {
    compile_c("simple", "", &["-lcuda"])
}

#[test]
fn refusal_message_names_call_size_and_cap() {
    let stats = scratch("refusal").join("stats.json");
    let mut c = fake_cmd(simple(), &stats);
    preload(&mut c)
        .env("GPUCAP_LIMIT", "1Gi")
        .env("FAKECUDA_TOTAL_MEM", PHYS);
    let o = run(c.args(["512Mi", "600Mi"]));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains(&format!("alloc {} 0\n", 512 * MIB)), "{out}");
    assert!(out.contains(&format!("alloc {} 2\n", 600 * MIB)), "{out}");
    assert!(
        out.contains(&format!("info {} {}\n", 512 * MIB, GIB)),
        "{out}"
    );
    let err = stderr(&o);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("gpucap: refused"))
            .collect::<Vec<_>>(),
        ["gpucap: refused cuMemAlloc of 600 MiB on GPU 0: 512 MiB of the 1 GiB cap in use"],
        "stderr:\n{err}"
    );
    let s = read_stats(&stats);
    assert_eq!(
        s[0].peak_used,
        512 * MIB,
        "the refused 600 MiB reached the driver"
    );
}

#[test]
fn percentage_limit_is_of_the_physical_memory() {
    let stats = scratch("percent").join("stats.json");
    let mut c = fake_cmd(simple(), &stats);
    preload(&mut c)
        .env("GPUCAP_LIMIT", "25%")
        .env("FAKECUDA_TOTAL_MEM", PHYS);
    let o = run(c.args(["1Gi", "1Gi", "1Mi"]));
    assert_ok(&o);
    let out = stdout(&o);
    // 25% of 8 GiB = 2 GiB: two 1 GiB allocations fit, the next MiB does not.
    assert!(
        out.contains(&format!("alloc {GIB} 0\nalloc {GIB} 0\nalloc {MIB} 2\n")),
        "{out}"
    );
    assert!(out.contains(&format!("info 0 {}\n", 2 * GIB)), "{out}");
}

#[test]
fn without_a_limit_the_shim_does_not_cap() {
    let stats = scratch("nolimit").join("stats.json");
    let mut c = fake_cmd(simple(), &stats);
    preload(&mut c).env("FAKECUDA_TOTAL_MEM", PHYS);
    let o = run(c.args(["3Gi", "3Gi"]));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.contains(&format!("alloc {} 0\nalloc {} 0\n", 3 * GIB, 3 * GIB)),
        "{out}"
    );
    assert!(
        out.contains(&format!("info {} {}\n", 2 * GIB, 8 * GIB)),
        "{out}"
    );
    assert!(!stderr(&o).contains("refused"), "{}", stderr(&o));
}

#[test]
fn invalid_limit_fails_cuinit_with_a_message() {
    for limit in ["lots", "0=1Gi,0=2Gi", "-1Gi", "150%"] {
        let stats = scratch("invalid").join("stats.json");
        let mut c = fake_cmd(simple(), &stats);
        preload(&mut c).env("GPUCAP_LIMIT", limit);
        let o = run(c.args(["1Mi"]));
        assert_ok(&o);
        assert_eq!(stdout(&o).trim(), "cuInit 800", "GPUCAP_LIMIT={limit}");
        let err = stderr(&o);
        assert!(
            err.lines().any(|l| l.starts_with("gpucap: invalid")),
            "GPUCAP_LIMIT={limit}: no 'gpucap: invalid' line:\n{err}"
        );
    }
}

/// A misspelt variable stops the shim as a bad value does, with one line naming the
/// variable meant.
#[test]
fn a_misspelt_variable_names_the_one_meant() {
    let stats = scratch("misspelt").join("stats.json");
    let mut c = fake_cmd(simple(), &stats);
    preload(&mut c).env("GPUCAP_LIMT", "1Gi");
    let o = run(c.args(["1Mi"]));
    assert_ok(&o);
    assert_eq!(stdout(&o).trim(), "cuInit 800");
    let err = stderr(&o);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("GPUCAP_LIMT")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].starts_with("gpucap: invalid GPUCAP_LIMT="), "{err}");
    assert!(said[0].contains("did you mean GPUCAP_LIMIT?"), "{err}");
}

// ---- (d) the dlsym override and other interposers ------------------------------------

fn dlsym_compat() -> PathBuf {
    compile_c("dlsym_compat", "", &["-lcuda", "-rdynamic"])
}

fn libother() -> PathBuf {
    compile_c("libother", ".so", &["-shared", "-fPIC"])
}

fn liblocal() -> PathBuf {
    compile_c("liblocal", ".so", &["-shared", "-fPIC"])
}

/// Runs dlsym_compat with LD_PRELOAD = `preloads` (paths joined by spaces).
fn run_compat(preloads: &[PathBuf], capped: bool, other: bool) -> Output {
    let prog = dlsym_compat();
    let local = liblocal();
    let stats = scratch("dlsym-compat").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS);
    if !preloads.is_empty() {
        let list: Vec<String> = preloads.iter().map(|p| p.display().to_string()).collect();
        c.env("LD_PRELOAD", list.join(" "));
    }
    if capped {
        c.env("GPUCAP_LIMIT", CAP);
    }
    run(c.args([
        if capped { "capped" } else { "uncapped" },
        CAP,
        PHYS,
        local.to_str().unwrap(),
        if other { "other" } else { "noother" },
    ]))
}

/// A program built without PIE that takes a hook's address: its PLT entry is that
/// symbol's canonical address (what the loader binds every reference to, and what
/// `dlsym(RTLD_DEFAULT)` answers). The shim must not take it for the driver's function.
#[test]
fn a_non_pie_program_taking_a_hooks_address_stays_capped() {
    let prog = compile_c("nonpie", "", &["-lcuda", "-no-pie", "-fno-pie"]);
    let stats = scratch("nonpie").join("stats.json");
    let cap = (256u64 << 20).to_string();
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS).arg(&cap);
    let o = run(preload(&mut c).env("GPUCAP_LIMIT", &cap));
    assert_passed(&o, "a non-PIE program under the shim");
    // Control: without the shim nothing is refused.
    let mut c = fake_cmd(&prog, &stats);
    let o = run(c.env("FAKECUDA_TOTAL_MEM", PHYS).arg(&cap));
    assert_failed(&o, "the non-PIE program without the shim");
}

#[test]
fn dlsym_override_keeps_rtld_default_rtld_next_and_dlerror() {
    // Control: glibc's own dlsym gives what the checks expect.
    let o = run_compat(&[], false, false);
    assert_passed(&o, "dlsym_compat without any preload");
    // With the shim: same answers, and the cap applies.
    let o = run_compat(&[shim()], true, false);
    assert_passed(&o, "dlsym_compat with the shim");
    // Without the shim but expecting the cap: the cap checks fail.
    let o = run_compat(&[], true, false);
    assert_failed(&o, "dlsym_compat without the shim, expecting the cap");
}

#[test]
fn another_interposer_preloaded_after_the_shim_still_forwards() {
    let o = run_compat(&[libother()], false, true);
    assert_passed(&o, "libother alone (control)");
    let o = run_compat(&[shim(), libother()], true, true);
    assert_passed(&o, "LD_PRELOAD=\"libgpucap.so libother.so\"");
}

#[test]
fn another_interposer_preloaded_before_the_shim_still_forwards() {
    let o = run_compat(&[libother(), shim()], true, true);
    assert_passed(&o, "LD_PRELOAD=\"libother.so libgpucap.so\"");
    let out = stdout(&o);
    // The program's cuMemGetInfo_v2 went to libother first, whose RTLD_NEXT must reach
    // the shim's hook (the next definition) — the capped total proves it did.
    assert!(
        out.contains("libother saw 1 cuMemGetInfo_v2 calls")
            || out.contains("libother saw 2 cuMemGetInfo_v2 calls"),
        "libother's wrapper did not run:\n{out}"
    );
}

/// Runs tests/c/wrapnext.c on `lib` (a build of tests/c/libwrapnext.c) under the shim:
/// its output.
fn run_wrapnext(lib: &std::path::Path) -> std::process::Output {
    let prog = compile_c("wrapnext", "", &["-lcuda"]);
    let stats = scratch("wrapnext").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS).arg(lib);
    run(preload(&mut c).env("GPUCAP_LIMIT", CAP))
}

/// A library after the shim that interposes on the whole driver (it defines `cuInit`
/// too and links the driver, whose functions its `RTLD_NEXT` finds), wraps a driver function and forwards to `dlsym(RTLD_NEXT)`, whose wrapper the
/// shim took for the driver's function (the program looked the name up on its handle):
/// the shim answers a library after it its hook for a driver name with `RTLD_NEXT` (the
/// driver's own function escaped the cap before), but not this one, or the wrapper and
/// the hook call each other without end (the wrapper aborts past a depth of 3; seen
/// with the answer unguarded).
#[test]
fn a_wrapper_the_shim_forwards_to_is_never_answered_the_hook_back() {
    let lib = compile_c(
        "libwrapnext",
        "-whole.so",
        &[
            "-shared",
            "-fPIC",
            "-DWHOLE_DRIVER",
            "-Wl,--no-as-needed",
            "-lcuda",
        ],
    );
    let o = run_wrapnext(&lib);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.code().is_some() && out.contains("through what dlsym found 0, directly 0"),
        "the program did not end: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A library that defines one driver name for its own ends (a wrapper of
/// `cuMemAlloc_v2`), looked up on its handle: the program gets the wrapper itself,
/// whose `RTLD_NEXT` is the hook, and the driver's function the hook calls stays the
/// driver's. Before, the shim answered the hook and took the wrapper for the driver's
/// function: the program's direct call went through the wrapper too (it saw 2 calls,
/// not the 1 made through it).
#[test]
fn a_library_defining_one_driver_name_is_answered_its_own_function_not_taken_for_the_driver() {
    let lib = compile_c("libwrapnext", ".so", &["-shared", "-fPIC"]);
    let o = run_wrapnext(&lib);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("through what dlsym found 0, directly 0, the wrapper saw 1 calls"),
        "{:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The library opened with `dlopen` rather than preloaded comes after the C library in
/// the loader's list: it finds glibc's `dlvsym` (which it exports too, so reads from the
/// objects' symbol tables) before itself there. With the search after it alone, it found
/// none and no driver function: `cuInit` answered `CUDA_ERROR_NOT_FOUND`.
#[test]
fn the_library_opened_with_dlopen_finds_the_driver_and_caps_what_goes_through_it() {
    let prog = compile_c("opened_shim", "", &["-lcuda"]);
    let stats = scratch("opened_shim").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS)
        .env("GPUCAP_LIMIT", CAP)
        .arg(shim())
        .arg(CAP);
    assert_passed(&run(&mut c), "libgpucap.so opened with dlopen");
}

// ---- (e) processes that never use CUDA ----------------------------------------------

#[test]
fn non_cuda_processes_are_silent() {
    fake_lib_dir();
    let limits: [Option<&str>; 7] = [
        None,
        Some("1Gi"),
        Some("50%"),
        Some("0=1Gi,1=2Gi"),
        Some("garbage"),
        Some("0=1Gi,0=1Gi"),
        Some(""),
    ];
    for limit in limits {
        for argv in [&["/bin/true"][..], &["sh", "-c", "echo hi"][..]] {
            let stats = scratch("silent").join("stats.json");
            let mut c = fake_cmd(argv[0], &stats);
            c.args(&argv[1..]);
            preload(&mut c);
            if let Some(l) = limit {
                c.env("GPUCAP_LIMIT", l);
            }
            let o = run(&mut c);
            let what = format!("{argv:?} with GPUCAP_LIMIT={limit:?}");
            assert!(o.status.success(), "{what}: {:?}\n{}", o.status, stderr(&o));
            assert_eq!(stderr(&o), "", "{what}: stderr must be empty");
            let expected = if argv[0] == "sh" { "hi\n" } else { "" };
            assert_eq!(stdout(&o), expected, "{what}");
        }
    }
    // An unknown GPUCAP_ variable is a configuration error too: still silent.
    let stats = scratch("silent").join("stats.json");
    let mut c = fake_cmd("/bin/true", &stats);
    preload(&mut c).env("GPUCAP_NO_SUCH_SETTING", "1");
    let o = run(&mut c);
    assert!(o.status.success());
    assert_eq!(stderr(&o), "");
}

/// A library preloaded before the shim that interposes on `dl_iterate_phdr` and finds
/// the C library's with `dlsym(RTLD_NEXT)` at its first call (tests/c/libiterate_phdr.c):
/// a program that loads the driver with `dlopen` and `dlsym` (cudarc-client) runs
/// capped. Before, the shim's `dlsym` found glibc's `dlvsym` through `dl_iterate_phdr`,
/// the interposer asked the shim's `dlsym`, and the two called each other until the
/// stack overflowed (a review found it).
#[test]
fn an_interposed_dl_iterate_phdr_that_asks_dlsym_does_not_loop() {
    let lib = compile_c("libiterate_phdr", ".so", &["-shared", "-fPIC"]);
    let stats = scratch("iterate-phdr").join("stats.json");
    let mut c = fake_cmd(cudarc_client(), &stats);
    c.env("FAKECUDA_TOTAL_MEM", PHYS)
        .env("GPUCAP_LIMIT", CAP)
        .env(
            "LD_PRELOAD",
            format!("{} {}", lib.display(), shim().display()),
        )
        .args(["200", "100"]);
    let o = run(&mut c);
    assert!(
        o.status.success()
            && stdout(&o).contains("alloc 200 ok")
            && stdout(&o).contains("alloc 100 err CUDA_ERROR_OUT_OF_MEMORY"),
        "{}",
        dump(&o)
    );
}
