//! Never silently uncapped: `gpucap run` with no cap says so, a
//! gpucap variable in another case is an error, a cap above the GPU is one warning
//! line, and `check` and `run` refuse what the library would refuse at `cuInit` (pool
//! shares of no cap included), making nothing (no pool file) when they do.

use super::common;

use std::path::Path;
use std::process::Command;

use common::pool_scratch::Scratch;
use common::*;

/// `gpucap ARGS` on a fake GPU of 4 GiB.
fn gpucap(dir: &Path, args: &[&str]) -> Command {
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.args(args).env("FAKECUDA_TOTAL_MEM", "4Gi");
    c
}

fn script() -> std::path::PathBuf {
    compile_c("script", "", &["-lcuda"])
}

const NO_CAP: &str = "no cap is set";

#[test]
fn run_with_no_cap_from_any_source_says_so_in_one_line() {
    let dir = scratch("uncapped-line");
    let script = script();
    let s = script.to_str().unwrap();
    let o = run(&mut gpucap(&dir, &["run", "--", s, "alloc:1Mi"]));
    assert_ok(&o);
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(NO_CAP)).collect();
    assert_eq!(lines.len(), 1, "{}", dump(&o));
    assert!(
        lines[0].contains("--limit")
            && lines[0].contains("GPUCAP_LIMIT")
            && lines[0].contains("--quiet"),
        "the line says how to set a cap and how to silence it: {}",
        lines[0]
    );
    // Capped, or uncapped on purpose: no line.
    for args in [
        vec!["run", "--limit", "1Gi", "--", s, "alloc:1Mi"],
        vec!["run", "--quiet", "--", s, "alloc:1Mi"],
        vec!["run", "--limit", "none", "--", s, "alloc:1Mi"],
    ] {
        let o = run(&mut gpucap(&dir, &args));
        assert_ok(&o);
        assert!(!stderr(&o).contains(NO_CAP), "{args:?}\n{}", dump(&o));
    }
    let o = run(gpucap(&dir, &["run", "--", s, "alloc:1Mi"]).env("GPUCAP_LIMIT", "none"));
    assert_ok(&o);
    assert!(!stderr(&o).contains(NO_CAP), "{}", dump(&o));
    // HAMi-core's variable is a cap too.
    let o = run(gpucap(&dir, &["run", "--", s, "alloc:1Mi"]).env("CUDA_DEVICE_MEMORY_LIMIT", "1g"));
    assert_ok(&o);
    assert!(!stderr(&o).contains(NO_CAP), "{}", dump(&o));
    // `none` is no cap: a 2 GiB allocation under it succeeds.
    let o = run(&mut gpucap(
        &dir,
        &["run", "--limit", "none", "--", s, "alloc:2Gi"],
    ));
    assert!(
        stdout(&o).contains(&format!("alloc {} 0", 2u64 << 30)),
        "{}",
        dump(&o)
    );
}

#[test]
fn a_gpucap_variable_in_another_case_is_an_error() {
    let dir = scratch("uncapped-case");
    let script = script();
    let s = script.to_str().unwrap();
    for (var, meant) in [
        ("gpucap_limit", "GPUCAP_LIMIT"),
        ("Gpucap_Pool", "GPUCAP_POOL"),
        ("GPUCAP_limit", "GPUCAP_LIMIT"),
    ] {
        for args in [vec!["run", "--", s, "alloc:1Mi"], vec!["check"]] {
            let o = run(gpucap(&dir, &args).env(var, "1Gi"));
            assert_eq!(o.status.code(), Some(2), "{var} {args:?}\n{}", dump(&o));
            assert!(
                stderr(&o).contains(&format!("did you mean {meant}?")),
                "{var}\n{}",
                dump(&o)
            );
        }
        // The shim alone refuses it too (fail closed): the allocation fails.
        let mut c = fake_cmd(&script, &dir.join("stats.json"));
        let o = run(preload(&mut c).env(var, "1Gi").arg("alloc:1Mi"));
        assert!(
            !stdout(&o).contains(&format!("alloc {} 0", 1u64 << 20)),
            "{var}\n{}",
            dump(&o)
        );
        assert!(
            stderr(&o).contains(&format!("did you mean {meant}?")),
            "{}",
            dump(&o)
        );
    }
}

#[test]
fn a_cap_above_the_gpu_is_one_warning_line() {
    let dir = scratch("uncapped-above");
    let script = script();
    let s = script.to_str().unwrap();
    let o = run(&mut gpucap(
        &dir,
        &["run", "--limit", "200Gi", "--", s, "alloc:1Mi", "alloc:1Mi"],
    ));
    assert_ok(&o);
    let warned: Vec<String> = stderr(&o)
        .lines()
        .filter(|l| l.contains("never binds"))
        .map(String::from)
        .collect();
    assert_eq!(warned.len(), 1, "{}", dump(&o));
    assert!(
        warned[0].contains("200 GiB") && warned[0].contains("4 GiB"),
        "{}",
        warned[0]
    );
    // The shim alone says it as well (no gpucap run).
    let mut c = fake_cmd(&script, &dir.join("stats.json"));
    let o = run(preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "200Gi")
        .arg("alloc:1Mi"));
    assert_eq!(
        stderr(&o)
            .lines()
            .filter(|l| l.contains("never binds"))
            .count(),
        1,
        "{}",
        dump(&o)
    );
    // A cap within the GPU: no such line.
    let o = run(&mut gpucap(
        &dir,
        &["run", "--limit", "1Gi", "--", s, "alloc:1Mi"],
    ));
    assert!(!stderr(&o).contains("never binds"), "{}", dump(&o));
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn check_and_run_refuse_a_share_of_a_pool_with_no_cap_and_make_no_pool_file() {
    let s = Scratch::new("uncapped-share");
    let script = script();
    let sc = script.to_str().unwrap();
    for args in [
        vec!["check", "--pool", "x", "--guarantee", "50%"],
        vec![
            "run",
            "--pool",
            "x",
            "--guarantee",
            "50%",
            "--",
            sc,
            "alloc:1Mi",
        ],
        vec!["check", "--pool", "x", "--ceiling", "50%"],
    ] {
        let o = run(&mut s.gpucap(&args));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        assert!(
            stderr(&o).contains("the pool has no cap"),
            "{args:?}\n{}",
            dump(&o)
        );
        assert!(!stdout(&o).contains("configuration OK"), "{}", dump(&o));
        assert!(
            !stdout(&o).contains("alloc "),
            "the program never ran\n{}",
            dump(&o)
        );
        assert_eq!(
            files_under(&s.pools),
            Vec::<std::path::PathBuf>::new(),
            "{args:?}"
        );
    }
    // A cap on GPU 0 only, two GPUs: GPU 1's share is of no cap. check and run see the
    // GPUs and refuse it, with the check the library makes when it joins.
    for args in [
        vec![
            "check",
            "--limit",
            "0=2Gi",
            "--pool",
            "x",
            "--guarantee",
            "50%",
        ],
        vec![
            "run",
            "--limit",
            "0=2Gi",
            "--pool",
            "x",
            "--guarantee",
            "50%",
            "--",
            sc,
        ],
    ] {
        let o = run(s.gpucap(&args).env("FAKECUDA_DEVICES", "2"));
        assert_eq!(o.status.code(), Some(2), "{args:?}\n{}", dump(&o));
        let err = stderr(&o);
        assert!(
            err.contains("GPU 1") && err.contains("the pool has no cap"),
            "{}",
            dump(&o)
        );
        assert_eq!(
            files_under(&s.pools),
            Vec::<std::path::PathBuf>::new(),
            "{args:?}"
        );
    }
    // The library says the same of the same configuration.
    let mut c = fake_cmd(&script, &s.dir.join("stats.json"));
    let o = run(preload(&mut c)
        .env("GPUCAP_POOL_DIR", &s.pools)
        .env("GPUCAP_POOL", "x")
        .env("GPUCAP_GUARANTEE", "50%")
        .arg("alloc:1Mi"));
    assert!(stderr(&o).contains("the pool has no cap"), "{}", dump(&o));
    assert!(
        !stdout(&o).contains(&format!("alloc {} 0", 1u64 << 20)),
        "{}",
        dump(&o)
    );
}

/// A `gpucap.env` beside the library that is a link to nothing (its target removed, a
/// volume not mounted) or that sets a name twice (an operator appending a lower cap)
/// fails closed: the program's `cuInit` is refused with a line naming the file, and
/// `gpucap check` exits 2 with it. Before, the dangling link was taken for no file (the
/// program ran uncapped, `check` said "limit: none") and the first of two lines held.
#[test]
fn a_configuration_file_that_is_a_broken_link_or_says_a_name_twice_fails_closed() {
    let dir = scratch("file-fails-closed");
    let prog = compile_c("script", "", &["-lcuda"]);
    type Make<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Make, &str); 2] = [
        (
            "link to nothing",
            &|f: &Path| std::os::unix::fs::symlink("/nonexistent/gpucap.env", f).unwrap(),
            "it is a link to nothing",
        ),
        (
            "name twice",
            &|f: &Path| std::fs::write(f, "GPUCAP_LIMIT=2Gi\nGPUCAP_LIMIT=256Mi\n").unwrap(),
            "line 2: GPUCAP_LIMIT is set again (first on line 1)",
        ),
    ];
    for (i, (what, make, line)) in cases.iter().enumerate() {
        let home = dir.join(format!("home{i}"));
        std::fs::create_dir_all(&home).unwrap();
        let lib = home.join("libgpucap.so");
        std::fs::copy(shim(), &lib).unwrap();
        let file = home.join("gpucap.env");
        make(&file);

        let mut c = fake_cmd(&prog, &dir.join("stats.json"));
        c.env("LD_PRELOAD", &lib)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .arg(format!("alloc:{}", GIB));
        let o = run(&mut c);
        let row = format!("{what}\n{}", dump(&o));
        assert!(stdout(&o).contains("cuInit 800\n"), "{row}");
        assert!(!stdout(&o).contains(&format!("alloc {GIB} 0")), "{row}");
        assert!(
            stderr(&o).contains(line) && stderr(&o).contains(&file.display().to_string()),
            "the refusal names the file and what is wrong: {row}"
        );

        let mut c = gpucap(&dir, &["check"]);
        c.env("GPUCAP_LIB", &lib);
        let o = run(&mut c);
        let row = format!("gpucap check, {what}\n{}", dump(&o));
        assert_eq!(o.status.code(), Some(2), "{row}");
        assert!(stderr(&o).contains(line), "{row}");
    }
}
