//! Usage reports (`GPUCAP_REPORT`), the `GPUCAP_LOG=info` summary at exit, and
//! `gpucap run --measure`, with real clients on the fake GPU.
//!
//! The C client is written here (not in tests/c) because only these tests use it:
//! `report_client [keep] [abort] [thread-exit=N] SIZE...` allocates each SIZE on GPU 0
//! (printing `alloc <bytes> <rc>`), then aborts, or calls exit(N) from a new thread
//! while the main thread waits, or frees everything (unless `keep`) and returns 0.

use super::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const CLIENT_C: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "fakecuda.h"

static int g_code;
static void *exiter(void *arg) { (void)arg; exit(g_code); }

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    MUST(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuCtxCreate_v2(&ctx, 0, dev));
    CUdeviceptr held[64];
    int n = 0, keep = 0, do_abort = 0, thread_exit = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "keep")) { keep = 1; continue; }
        if (!strcmp(argv[i], "abort")) { do_abort = 1; continue; }
        if (!strncmp(argv[i], "thread-exit=", 12)) { thread_exit = atoi(argv[i] + 12); continue; }
        size_t size = parse_size(argv[i]);
        CUdeviceptr d = 0;
        CUresult rc = cuMemAlloc_v2(&d, size);
        printf("alloc %zu %d\n", size, rc);
        if (rc == CUDA_SUCCESS && n < 64) held[n++] = d;
    }
    if (do_abort) abort();
    if (thread_exit >= 0) {
        g_code = thread_exit;
        pthread_t t;
        pthread_create(&t, NULL, exiter, NULL);
        for (;;) pause();
    }
    if (!keep) while (n > 0) MUST(cuMemFree_v2(held[--n]));
    return 0;
}
"#;

/// The C client, built once per test binary.
fn client() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib_dir = fake_lib_dir();
        let dir = profile_dir().join("ctests");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join(format!("report_client.{}.c", std::process::id()));
        std::fs::write(&src, CLIENT_C).unwrap();
        let out = dir.join(format!("report_client.{}", std::process::id()));
        let status = Command::new("cc")
            .args(["-O1", "-g", "-Wall", "-Werror", "-pthread", "-I"])
            .arg(root().join("tests/c"))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .arg("-L")
            .arg(&lib_dir)
            .args(["-lcuda", "-ldl"])
            .status()
            .expect("cc");
        assert!(status.success(), "compiling the report client failed");
        let _ = std::fs::remove_file(&src);
        out
    })
}

/// `prog` on the fake GPU (4 GiB) under the shim with `GPUCAP_REPORT=report`.
fn under_shim(prog: &Path, dir: &Path, report: &Path) -> Command {
    let mut c = fake_cmd(prog, &dir.join("stats.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_REPORT", report);
    preload(&mut c);
    c
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("report {} not written: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON ({e}):\n{text}"))
}

/// The entries of a report file.
fn processes(path: &Path) -> Vec<Value> {
    let v = read_json(path);
    assert_eq!(v["gpucap_report"], 1, "{v}");
    v["processes"].as_array().expect("processes array").clone()
}

/// The only entry of a report file.
fn only_process(path: &Path) -> Value {
    let p = processes(path);
    assert_eq!(p.len(), 1, "{p:?}");
    p[0].clone()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn report_holds_the_cap_peak_use_at_exit_allocations_and_refusals() {
    let dir = scratch("report-figures");
    let report = dir.join("r.json");
    let mut c = under_shim(client(), &dir, &report);
    c.env("GPUCAP_LIMIT", "1Gi")
        .args(["600Mi", "600Mi", "100Mi", "keep"]);
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_ok(&o);
    assert_eq!(refusals(&stderr(&o)).len(), 1, "{}", dump(&o));

    let p = only_process(&report);
    assert_eq!(p["pid"], pid, "{p}");
    assert!(
        p["id"].as_str().unwrap().starts_with(&format!("{pid}-")),
        "{p}"
    );
    let cmdline: Vec<&str> = p["cmdline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        cmdline,
        [
            client().to_str().unwrap(),
            "600Mi",
            "600Mi",
            "100Mi",
            "keep"
        ]
    );
    assert_eq!(p["state"], "exited");
    assert_eq!(p["growth"], false);
    assert!(p["time"].as_u64().unwrap() > 1_600_000_000, "{p}");
    let devices = p["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{p}");
    let d = &devices[0];
    assert_eq!(d["ordinal"], 0);
    assert_eq!(d["cap"], GIB);
    assert_eq!(d["peak"], 700 * MIB);
    assert_eq!(d["in_use"], 700 * MIB, "kept until exit");
    assert_eq!(d["retained"], 0);
    assert_eq!(d["allocations"], 2);
    assert_eq!(d["refusals"], 1);
    assert_eq!(d["largest_refused"], 600 * MIB);
    // Written through a temporary file and a rename: nothing else is left beside it.
    assert_eq!(files_in(&dir), ["r.json", "r.json.lock", "stats.json"]);
}

#[test]
fn freed_memory_is_not_in_use_at_exit_and_no_cap_is_null() {
    let dir = scratch("report-freed");
    let report = dir.join("r.json");
    let o = run(under_shim(client(), &dir, &report).args(["1Gi", "2Gi"]));
    assert_ok(&o);
    let d = &only_process(&report)["devices"][0];
    assert_eq!(d["cap"], Value::Null, "no GPUCAP_LIMIT: no cap");
    assert_eq!(d["peak"], 3 * GIB);
    assert_eq!(d["in_use"], 0);
    assert_eq!(d["allocations"], 2);
    assert_eq!(d["refusals"], 0);
    assert_eq!(d["largest_refused"], 0);
}

/// Growth mode: what the program freed stays with the process (`retained`), and is no
/// longer `in_use` (allocated and not freed): 0 once every block was freed, page
/// allocations and small blocks alike; the summary line says the same.
#[test]
fn in_growth_mode_freed_memory_is_retained_not_in_use() {
    let dir = scratch("report-growth");
    for (sizes, kept) in [
        (&["256Mi", "64Mi", "1Ki", "300"][..], 0),
        (&["keep", "256Mi", "64Mi"], 320 * MIB),
    ] {
        let report = dir.join(format!("r-{kept}.json"));
        let o = run(under_shim(client(), &dir, &report)
            .env("GPUCAP_LIMIT", "1Gi")
            .env("GPUCAP_GROWTH", "1")
            .env("GPUCAP_LOG", "info")
            .args(sizes));
        assert_ok(&o);
        let d = &only_process(&report)["devices"][0];
        assert_eq!(d["in_use"], kept, "{sizes:?}: {d}");
        let retained = d["retained"].as_u64().unwrap();
        if kept == 0 {
            assert!(retained >= 320 * MIB, "{d}");
        } else {
            assert_eq!(retained, 0, "{d}");
        }
        let summary = format!(
            ", {} in use at exit, ",
            if kept == 0 { "0 B" } else { "320 MiB" }
        );
        assert!(stderr(&o).contains(&summary), "{summary}\n{}", dump(&o));
    }
}

/// The client allocating `sizes` under a 1 GiB cap at `GPUCAP_LOG=log`: its output and
/// its report file (in `dir`, one a level).
fn allocate_at_log(dir: &Path, log: &str, sizes: &[&str]) -> (Output, PathBuf) {
    let report = dir.join(format!("r-{log}.json"));
    let o = run(under_shim(client(), dir, &report)
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_LOG", log)
        .args(sizes));
    assert_ok(&o);
    (o, report)
}

/// One line per refusal the program sees: the same request refused again at once (a
/// program retrying after freeing its cache, as CuPy does) prints no second line, but
/// every refusal is counted; another size has its own line; at debug every one does.
#[test]
fn the_same_refusal_again_at_once_prints_one_line_and_counts_each() {
    let dir = scratch("report-repeats");
    let sizes = ["600Mi", "600Mi", "600Mi", "600Mi", "700Mi", "keep"];
    for (log, lines) in [("warn", 2), ("debug", 4)] {
        let (o, report) = allocate_at_log(&dir, log, &sizes);
        let refused = refusals(&stderr(&o));
        assert_eq!(refused.len(), lines, "{log}\n{}", dump(&o));
        assert!(
            refused[0].starts_with("gpucap: refused cuMemAlloc of 600 MiB"),
            "{refused:?}"
        );
        assert!(
            refused[lines - 1].starts_with("gpucap: refused cuMemAlloc of 700 MiB"),
            "{refused:?}"
        );
        let d = &only_process(&report)["devices"][0];
        assert_eq!(d["refusals"], 4, "{d}");
        assert_eq!(d["largest_refused"], 700 * MIB, "{d}");
    }
}

/// An allocator backing off (TensorFlow's BFC allocator asks for a region a tenth
/// smaller each time) gets one line for the run of smaller refusals while it holds the
/// same memory; a refusal after its memory changed has its own line, smaller or not.
#[test]
fn a_back_off_to_smaller_requests_prints_one_line_and_counts_each() {
    let dir = scratch("report-back-off");
    let sizes = [
        "500Mi", "900Mi", "810Mi", "729Mi", "656Mi", "590Mi", "400Mi", "700Mi", "630Mi", "keep",
    ];
    for (log, lines) in [("warn", 2), ("debug", 7)] {
        let (o, report) = allocate_at_log(&dir, log, &sizes);
        let served = stdout(&o)
            .lines()
            .filter(|l| l.starts_with("alloc ") && l.ends_with(" 0"))
            .count();
        assert_eq!(served, 2, "500 MiB and 400 MiB fit\n{}", dump(&o));
        let refused = refusals(&stderr(&o));
        assert_eq!(refused.len(), lines, "{log}\n{}", dump(&o));
        assert!(
            refused[0].starts_with("gpucap: refused cuMemAlloc of 900 MiB on GPU 0: 500 MiB "),
            "{refused:?}"
        );
        let last = if log == "warn" {
            "gpucap: refused cuMemAlloc of 700 MiB on GPU 0: 900 MiB "
        } else {
            "gpucap: refused cuMemAlloc of 630 MiB on GPU 0: 900 MiB "
        };
        assert!(refused[lines - 1].starts_with(last), "{refused:?}");
        let d = &only_process(&report)["devices"][0];
        assert_eq!(d["refusals"], 7, "{d}");
    }
}

#[test]
fn exit_from_another_thread_writes_the_report() {
    let dir = scratch("report-thread-exit");
    let report = dir.join("r.json");
    let o = run(under_shim(client(), &dir, &report)
        .env("GPUCAP_LIMIT", "1Gi")
        .args(["256Mi", "thread-exit=7"]));
    assert_eq!(o.status.code(), Some(7), "{}", dump(&o));
    let p = only_process(&report);
    assert_eq!(p["state"], "exited", "{p}");
    assert_eq!(p["devices"][0]["in_use"], 256 * MIB, "{p}");
    assert_eq!(p["devices"][0]["allocations"], 1, "{p}");
}

#[test]
fn a_crash_after_a_refusal_leaves_a_running_entry() {
    let dir = scratch("report-crash");
    let report = dir.join("r.json");
    let o = run(under_shim(client(), &dir, &report)
        .env("GPUCAP_LIMIT", "1Gi")
        .args(["512Mi", "1Gi", "abort"]));
    assert!(!o.status.success(), "{}", dump(&o));
    let p = only_process(&report);
    assert_eq!(
        p["state"], "running",
        "written at the refusal, never at exit: {p}"
    );
    let d = &p["devices"][0];
    assert_eq!(
        (d["refusals"].as_u64(), d["largest_refused"].as_u64()),
        (Some(1), Some(GIB)),
        "{p}"
    );
    assert_eq!(d["in_use"], 512 * MIB, "{p}");
}

#[test]
fn percent_p_gives_each_process_its_own_file() {
    let dir = scratch("report-pid");
    let template = dir.join("r-%p.json");
    let mut pids = Vec::new();
    for _ in 0..2 {
        let child = under_shim(client(), &dir, &template)
            .arg("64Mi")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        pids.push(child.id());
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success());
    }
    for pid in &pids {
        let p = only_process(&dir.join(format!("r-{pid}.json")));
        assert_eq!(p["pid"], *pid);
    }
    // A per-process file needs no lock file.
    let mut expected: Vec<String> = pids.iter().map(|p| format!("r-{p}.json")).collect();
    expected.push("stats.json".into());
    expected.sort();
    assert_eq!(files_in(&dir), expected);
}

#[test]
fn processes_sharing_a_path_all_appear() {
    let dir = scratch("report-shared");
    let report = dir.join("shared.json");
    // Started together, so that their exits (and report writes) overlap.
    let children: Vec<_> = (0..6)
        .map(|i| {
            under_shim(client(), &dir, &report)
                .arg(format!("{}Mi", 10 * (i + 1)))
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut pids: Vec<u64> = Vec::new();
    for c in children {
        pids.push(c.id().into());
        assert!(c.wait_with_output().unwrap().status.success());
    }
    let all = processes(&report);
    let mut seen: Vec<u64> = all.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    seen.sort();
    pids.sort();
    assert_eq!(seen, pids, "every process has its entry");
    let mut peaks: Vec<u64> = all
        .iter()
        .map(|p| p["devices"][0]["peak"].as_u64().unwrap())
        .collect();
    peaks.sort();
    assert_eq!(peaks, (1..=6).map(|i| 10 * i * MIB).collect::<Vec<_>>());
    // A process with no %p adds to an existing report; a file that is not a report
    // is left alone and the entry goes beside it.
    let foreign = dir.join("notes.txt");
    std::fs::write(&foreign, "not a report").unwrap();
    let child = under_shim(client(), &dir, &foreign)
        .arg("1Mi")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&foreign).unwrap(), "not a report");
    let beside = dir.join(format!("notes.txt.{pid}"));
    assert_eq!(only_process(&beside)["pid"], pid);
    // Said on stderr, at the default level (docs/src/reports.md: "with an error line on
    // stderr"), naming both files: the figures are not where the user looks.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "gpucap: {} is not a gpucap report (\"gpucap_report\":1): left as it is; this \
         process's report went to {} instead",
        foreign.display(),
        beside.display()
    );
    assert_eq!(stderr.matches(&want).count(), 1, "{stderr}");
}

#[test]
fn a_process_that_never_calls_cuda_writes_nothing() {
    let dir = scratch("report-silent");
    let report = dir.join("r.json");
    for prog in ["/bin/true", "ls"] {
        let o = run(under_shim(Path::new(prog), &dir, &report)
            .env("GPUCAP_LOG", "info")
            .current_dir(&dir));
        assert_ok(&o);
        assert_eq!(stderr(&o), "", "{prog}");
    }
    assert!(!report.exists());
    assert!(!dir.join("r.json.lock").exists());
}

#[test]
fn info_prints_a_summary_line_per_gpu_at_exit() {
    let dir = scratch("report-info");
    let mut c = fake_cmd(client(), &dir.join("stats.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_LOG", "info")
        .args(["600Mi", "600Mi", "100Mi", "keep"]);
    let o = run(preload(&mut c));
    assert_ok(&o);
    let err = stderr(&o);
    let last = err.lines().last().unwrap_or("");
    assert_eq!(
        last,
        "gpucap: GPU 0: peak 700 MiB of the 1 GiB cap, 700 MiB in use at exit, 2 allocations, 1 refused (largest 600 MiB)",
        "{}",
        dump(&o)
    );
    // Without GPUCAP_LOG=info, no summary (the refusal line is a warning).
    c.env("GPUCAP_LOG", "warn");
    let o = run(&mut c);
    assert!(!stderr(&o).contains("in use at exit"), "{}", dump(&o));
}

#[test]
fn run_says_before_the_program_that_a_report_cannot_be_written() {
    // docs/src/reports.md: a report that cannot be written costs an error line; `gpucap
    // run` knows it before a run of hours, as `check` does, and says so then (the program
    // runs all the same: its status is unchanged).
    let dir = scratch("report-nodir");
    let report = dir.join("no-such-dir").join("r-%p.json");
    let mut c = gpucap(&dir);
    c.arg("run")
        .arg("--limit")
        .arg("1Gi")
        .arg("--report")
        .arg(&report)
        .arg("--")
        .arg("true");
    let o = run(&mut c);
    assert_ok(&o);
    let want = format!(
        "gpucap: report {}: its directory {} does not exist: nothing will be written",
        report.display(),
        dir.join("no-such-dir").display()
    );
    assert!(stderr(&o).lines().any(|l| l == want), "{}", dump(&o));
    // A directory that exists: no line.
    let ok = dir.join("r-%p.json");
    let o = run(gpucap(&dir)
        .arg("run")
        .arg("--limit")
        .arg("1Gi")
        .arg("--report")
        .arg(&ok)
        .arg("--")
        .arg("true"));
    assert_ok(&o);
    assert!(
        !stderr(&o).contains("nothing will be written"),
        "{}",
        dump(&o)
    );
}

// ---- gpucap run --measure ---------------------------------------------------------------

fn gpucap(dir: &Path) -> Command {
    let mut c = fake_cmd(cli(), &dir.join("stats.json"));
    c.env("FAKECUDA_TOTAL_MEM", "4Gi");
    c
}

/// The value after `--limit ` in the `suggested limit:` line.
fn suggested_limit(err: &str) -> Option<String> {
    let line = err
        .lines()
        .find(|l| l.starts_with("gpucap: measure: suggested limit: --limit "))?;
    line.split_whitespace().nth(5).map(str::to_string)
}

#[test]
fn measure_prints_the_peak_and_a_limit_that_lets_the_program_run() {
    let dir = scratch("measure");
    let client = cudarc_client();
    let steps = ["600", "300", "free", "200"]; // peak 900 MiB
    let o = run(gpucap(&dir)
        .arg("run")
        .arg("--measure")
        .arg("--")
        .arg(&client)
        .args(steps));
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert_eq!(r.outcomes(), ["600 ok", "300 ok", "200 ok"], "{}", dump(&o));
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l == "gpucap: measure: GPU 0: peak 900 MiB (943718400 bytes), 3 allocations"),
        "{}",
        dump(&o)
    );
    // 900 MiB + 20% = 1080 MiB, rounded up to a quarter of 1 GiB.
    let limit = suggested_limit(&err).unwrap_or_else(|| panic!("no suggestion\n{}", dump(&o)));
    assert_eq!(limit, "1.25Gi");
    // Nothing is left behind in the temporary directory's place.
    assert!(!err.contains("cannot"), "{err}");

    // The suggestion lets the same program run capped...
    let o = run(gpucap(&dir)
        .args(["run", "--limit", &limit, "--"])
        .arg(&client)
        .args(steps));
    assert_ok(&o);
    assert_eq!(
        ClientReport::parse(&stdout(&o)).outcomes(),
        ["600 ok", "300 ok", "200 ok"],
        "{}",
        dump(&o)
    );
    assert!(refusals(&stderr(&o)).is_empty(), "{}", dump(&o));
    // ...where a cap below the peak would not.
    let o = run(gpucap(&dir)
        .args(["run", "--limit", "800Mi", "--"])
        .arg(&client)
        .args(steps));
    assert_eq!(refusals(&stderr(&o)).len(), 1, "{}", dump(&o));
}

/// A program that allocates and then `exec`s another (a launcher script's `exec python
/// train.py`, a shell's `exec`): the first program's figures are written before the
/// `exec` (the exit hook does not run; the new program keeps the pid and start time
/// that named the first one's entry), so `--measure` counts its peak, where it
/// suggested a limit for the second program's alone. Each `exec` the C library exports
/// as a function of its own (`execv`, `execve`, `execvp`), and the variadic ones
/// (`execl`, `execlp`, `execle`: their `exec1` entry was missing before they were
/// exported).
#[test]
fn measure_counts_what_a_program_held_before_it_execd_another() {
    let dir = scratch("measure-exec");
    let script = compile_c("script", "", &["-lcuda"]);
    let script = script.to_str().unwrap();
    // The variadic ones pass their arguments past the sixth on the stack (script.c): a
    // trampoline that moved them would exec a program with other arguments.
    for how in ["execv", "execve", "execvp", "execl", "execlp", "execle"] {
        let o = run(gpucap(&dir).args(["run", "--measure", "--"]).args([
            script,
            "alloc:700Mi",
            &format!("exec:{how}"),
            script,
            "alloc:100Mi",
        ]));
        assert_ok(&o);
        let err = stderr(&o);
        assert!(
            err.lines().any(|l| l.starts_with("gpucap: measure: pid ")
                && l.contains(
                    ", before it exec'ed another): GPU 0: peak 700 MiB (734003200 bytes)"
                )),
            "{how}\n{}",
            dump(&o)
        );
        assert!(
            err.lines().any(|l| l
                == "gpucap: measure: 1 process used CUDA, in 2 programs \
                (one that exec'ed another is counted apart)"),
            "{how}\n{}",
            dump(&o)
        );
        // 700 MiB + 20% = 840 MiB, rounded up to a quarter of 512 MiB.
        assert_eq!(
            suggested_limit(&err).as_deref(),
            Some("896Mi"),
            "{how}\n{}",
            dump(&o)
        );
    }
    // The program it execs does not use CUDA: one process, one program (it said "0
    // process used CUDA, in 1 programs").
    let o = run(gpucap(&dir).args(["run", "--measure", "--"]).args([
        script,
        "alloc:500Mi",
        "exec:execv",
        "/bin/true",
    ]));
    assert_ok(&o);
    assert!(
        stderr(&o)
            .lines()
            .any(|l| l == "gpucap: measure: 1 process used CUDA"),
        "{}",
        dump(&o)
    );
}

#[test]
fn measure_refuses_a_cap_and_a_report() {
    let dir = scratch("measure-cap");
    let marker = dir.join("ran");
    let sh = |c: &mut Command| {
        c.arg("--")
            .arg("sh")
            .arg("-c")
            .arg("touch \"$0\"")
            .arg(&marker);
    };
    let mut c = gpucap(&dir);
    c.args(["run", "--measure", "--limit", "1Gi"]);
    sh(&mut c);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains("--measure runs CMD without a cap"),
        "{}",
        dump(&o)
    );
    let mut c = gpucap(&dir);
    c.args(["run", "--measure"]).env("GPUCAP_LIMIT", "1Gi");
    sh(&mut c);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("unset GPUCAP_LIMIT"), "{}", dump(&o));
    // A driver's hand-over is named as the variable that set the cap (before: "unset
    // GPUCAP_LIMIT", which was not set).
    for var in ["CUDA_DEVICE_MEMORY_LIMIT", "GPU_DEVICE_0_MEMORY"] {
        let mut c = gpucap(&dir);
        c.args(["run", "--measure"]).env(
            var,
            if var.starts_with("CUDA") {
                "1024m"
            } else {
                "1Gi"
            },
        );
        sh(&mut c);
        let o = run(&mut c);
        assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
        assert!(
            stderr(&o).contains(&format!("without a cap: unset {var}\n")),
            "{}",
            dump(&o)
        );
    }
    let mut c = gpucap(&dir);
    c.args(["run", "--measure", "--report", "/tmp/x.json"]);
    sh(&mut c);
    assert_eq!(run(&mut c).status.code(), Some(2));
    assert!(!marker.exists(), "the command ran");
}

/// Under a cap handed down in `gpucap.env` beside the library, `--measure` cannot run
/// CMD uncapped: it says so first, and where CMD was refused at the ceiling the summary
/// says how many allocations and that the suggestion is too little. Before, it ran CMD
/// capped without a word and suggested a limit below what CMD needed.
#[test]
fn measure_under_a_ceiling_says_so_and_counts_what_was_refused() {
    let dir = scratch("measure-ceiling");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let lib = home.join("libgpucap.so");
    std::fs::copy(shim(), &lib).unwrap();
    std::fs::write(home.join("gpucap.env"), "GPUCAP_LIMIT=256Mi\n").unwrap();
    let file = home.join("gpucap.env").display().to_string();
    let o = run(gpucap(&dir)
        .env("GPUCAP_LIB", &lib)
        .args(["run", "--measure", "--"])
        .arg(cudarc_client())
        .args(["200", "300"]));
    let err = stderr(&o);
    assert_eq!(
        ClientReport::parse(&stdout(&o)).outcomes(),
        ["200 ok", "300 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );
    for line in [
        format!(
            "gpucap: measure: {file} hands down a cap, a ceiling --measure cannot lift: CMD \
             runs under it, and what it asks above it is refused, not measured\n"
        ),
        format!(
            "gpucap: measure: GPU 0: 1 allocation refused (the largest 300 MiB) under the \
             ceiling of {file}: CMD needs more than this peak shows\n"
        ),
        "CMD needs more: allocations were refused)\n".to_string(),
    ] {
        assert!(err.contains(&line), "{line}\n{}", dump(&o));
    }
}

#[test]
fn measure_passes_the_exit_status_through() {
    let dir = scratch("measure-status");
    for (script, code) in [("exit 0", 0), ("exit 3", 3), ("kill -KILL $$", 128 + 9)] {
        let o = run(gpucap(&dir).args(["run", "--measure", "--", "sh", "-c", script]));
        assert_eq!(o.status.code(), Some(code), "{script}\n{}", dump(&o));
        assert!(
            stderr(&o)
                .contains("gpucap: measure: no figures: no process made a CUDA call under gpucap"),
            "{}",
            dump(&o)
        );
    }
    let o = run(gpucap(&dir).args(["run", "--measure", "--", "gpucap-no-such-command"]));
    assert_eq!(o.status.code(), Some(127), "{}", dump(&o));
}

#[test]
fn measure_forwards_sigterm_and_leaves_sigint_to_the_terminal() {
    let dir = scratch("measure-signals");
    let script = "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.05; done";
    let mut child = gpucap(&dir)
        .args(["run", "--measure", "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id() as i32;
    // SIGINT to gpucap alone (a terminal would send it to the whole group): ignored.
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "gpucap died of SIGINT");
    // SIGTERM is passed on: the command's trap runs and its status comes back.
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "gpucap did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(rest, "got TERM\n");
    assert_eq!(status.code(), Some(42));
}
