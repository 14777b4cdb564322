//! A library opened with `RTLD_DEEPBIND` (Julia's default for every library it loads)
//! looks its references up in its own dependencies first: libcuda's `cuMemAlloc_v2`
//! and the C library's `dlsym`, not the shim's. Each of the four ways such a library
//! reaches the driver (linked, `dlsym` on libcuda's handle, `cuGetProcAddress`,
//! `dlsym(RTLD_DEFAULT)`) took memory past the cap (tests/c/deepbind.c,
//! tests/c/libdeepbind.c); the shim's `dlopen` now binds them to the hooks, keeping the
//! library's own definitions its own, and its `dlsym` answers `RTLD_DEFAULT` from the
//! global scope. The same holds for the library opened with `dlmopen(LM_ID_BASE)` and
//! with the `dlopen` that `dlsym` finds on the C library's handle (each took memory past
//! the cap after the shim's `dlopen` was there, until its `dlmopen` and the answer of
//! its `dlsym` for the loader's own names). A fifth way, `dlsym(RTLD_NEXT)` from the
//! library (after the shim in the loader's list, with the flag or without), found the
//! driver's own function until the shim's `dlsym` answered it with the hook. Three more
//! go through the C library's own `dlsym` on libcuda's handle, taken by `dlvsym` from the
//! global scope, by `dlvsym(RTLD_NEXT)` and by `dlsym(RTLD_NEXT, "dlsym")` (as interposers
//! that wrap `dlsym` take the one they wrap), and a fourth way of opening, the `dlopen`
//! `dlvsym` finds by its version: each took memory past the cap, the three with the
//! flag and without, until the shim exported `dlvsym` and answered the loader's names
//! asked for so with its own.

use std::path::PathBuf;
use std::process::Output;

use crate::common::*;

const CAP: &str = "1Gi";

fn library() -> PathBuf {
    compile_c("libdeepbind", ".so", &["-shared", "-fPIC", "-lcuda"])
}

/// The same library bound at load (`-z now`, as distributions build theirs): its slots lie
/// in the pages the loader makes read-only after relocating (RELRO), which the shim makes
/// writable for its write (else the write faults).
fn library_bound_now() -> PathBuf {
    compile_c(
        "libdeepbind",
        "-now.so",
        &["-shared", "-fPIC", "-Wl,-z,now,-z,relro", "-lcuda"],
    )
}

/// The program, built beside the library and finding it through its own `RUNPATH`
/// (`$ORIGIN`): a search path only a call from the program itself has.
fn program() -> PathBuf {
    compile_c(
        "deepbind",
        "",
        &[
            "-lcuda",
            "-rdynamic",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
        ],
    )
}

/// The ways the program opens the library in the process's own namespace: `dlopen`,
/// `dlmopen(LM_ID_BASE)`, the `dlopen` found by `dlsym` on the C library's handle and
/// the one `dlvsym` finds by its version.
const OPENS: [&str; 4] = ["dlopen", "dlmopen", "libc", "versioned"];

/// Runs the program in `mode` (`deepbind` or `plain`) on `lib` (a path or a bare name),
/// opened `how` (one of [`OPENS`], or `newlm`), under the shim or not.
fn run_program(mode: &str, lib: &str, how: &str, shim: bool) -> Output {
    let prog = program();
    let stats = scratch("deepbind").join("stats.json");
    let mut c = fake_cmd(&prog, &stats);
    c.env("FAKECUDA_TOTAL_MEM", "8Gi");
    if shim {
        preload(&mut c).env("GPUCAP_LIMIT", CAP);
    }
    run(c.args([mode, CAP, lib, how]))
}

#[test]
fn a_library_opened_with_rtld_deepbind_is_capped_each_way_it_reaches_the_driver() {
    for lib in [library(), library_bound_now()] {
        let lib = lib.to_str().unwrap();
        for how in OPENS {
            let o = run_program("deepbind", lib, how, true);
            assert_passed(
                &o,
                &format!("{lib} opened with RTLD_DEEPBIND by {how} under the shim"),
            );
            // Control: without the shim the second allocation of each way is served.
            let o = run_program("deepbind", lib, how, false);
            assert_failed(&o, &format!("{lib} opened by {how} without the shim"));
        }
    }
}

#[test]
fn a_bare_name_opened_with_rtld_deepbind_is_found_through_the_callers_own_search_path() {
    // The library lies beside the program, on no search path but the program's RUNPATH:
    // opened from the shim's code, the name would not be found.
    library();
    for how in OPENS {
        let o = run_program("deepbind", "libdeepbind.so", how, true);
        assert_passed(
            &o,
            &format!("a bare name opened with RTLD_DEEPBIND by {how} under the shim"),
        );
    }
}

#[test]
fn a_library_opened_without_rtld_deepbind_is_capped_and_found_as_before() {
    library();
    for lib in [
        library().to_str().unwrap().to_string(),
        "libdeepbind.so".into(),
    ] {
        for how in OPENS {
            let o = run_program("plain", &lib, how, true);
            assert_passed(
                &o,
                &format!("{lib} opened by {how} without RTLD_DEEPBIND under the shim"),
            );
        }
    }
}

#[test]
fn a_library_opened_in_a_namespace_of_its_own_is_opened_as_glibc_opens_it_and_said() {
    // dlmopen(LM_ID_NEWLM) goes to glibc's untouched (the shim does not reach the
    // namespace's own libcuda: threat-model.md): the library opens, a bare name through
    // the program's own RUNPATH, and keeps its own definitions, with the flag or without;
    // one line says the namespace is out of the cap's reach.
    library();
    for mode in ["deepbind", "plain"] {
        let o = run_program(mode, "libdeepbind.so", "newlm", true);
        assert_passed(
            &o,
            &format!("a bare name opened by dlmopen(LM_ID_NEWLM), {mode}, under the shim"),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            err.matches("dlmopen opens libdeepbind.so in a namespace of its own, where gpucap is not: a CUDA driver loaded there is not capped").count(),
            1,
            "{mode}: {err}"
        );
    }
    // The library's own namespace is only said where it is asked for.
    let o = run_program("plain", "libdeepbind.so", "dlmopen", true);
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("namespace of its own"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
