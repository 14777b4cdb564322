//! The `gpucap` command line: `gpucap run [--limit L] -- PROGRAM...` and `gpucap check`.
//!
//! The programs run on the fake GPU (the fake driver on LD_LIBRARY_PATH, no inherited
//! GPUCAP_*/FAKECUDA_*/LD_PRELOAD); the capped program is the unmodified cudarc client.

mod common;

use common::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

/// `gpucap ARGS...` on the fake GPU (FAKECUDA_TOTAL_MEM=4Gi unless overridden).
fn gpucap(args: &[&OsStr], stats: &Path) -> Command {
    let mut cmd = fake_cmd(cli(), stats);
    cmd.args(args).env("FAKECUDA_TOTAL_MEM", "4Gi");
    cmd
}

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// A program that would leave `marker` behind if it ever started.
fn touch_cmd(marker: &Path) -> Vec<&OsStr> {
    vec![os("sh"), os("-c"), os("touch \"$0\""), marker.as_os_str()]
}

/// `gpucap run` refused to start the program: exit status 2, stderr names `what`
/// and `value`, the marker file was not created.
#[track_caller]
fn assert_config_error(o: &Output, marker: &Path, what: &str, value: &str) {
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected exit status 2\n{}",
        dump(o)
    );
    let err = stderr(o);
    assert!(
        err.lines().any(|l| l.contains(what) && l.contains(value)),
        "stderr should name {what} and {value:?}\n{}",
        dump(o)
    );
    assert!(
        !marker.exists(),
        "the program ran although the configuration is invalid\n{}",
        dump(o)
    );
}

#[test]
fn run_caps_the_program() {
    let dir = scratch("cli-cap");
    let client = cudarc_client();
    let o = run(&mut gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            client.as_os_str(),
            os("600"),
            os("600"),
            os("free"),
            os("600"),
        ],
        &dir.join("stats.json"),
    ));
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert!(r.done, "{}", dump(&o));
    assert_eq!(
        r.outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY", "600 ok"],
        "{}",
        dump(&o)
    );
    assert_eq!(r.total_mem, Some(GIB), "{}", dump(&o));
    assert_eq!(r.mem_info.first(), Some(&(GIB, GIB)), "{}", dump(&o));
    let refused = refusals(&stderr(&o));
    assert_eq!(refused.len(), 1, "{}", dump(&o));
    assert!(
        refused[0].ends_with("of 600 MiB on GPU 0: 600 MiB of the 1 GiB cap in use"),
        "{}",
        dump(&o)
    );
    let stats = read_stats(&dir.join("stats.json"));
    assert!(
        stats[0].peak_used <= GIB,
        "peak {} over the cap",
        stats[0].peak_used
    );
}

#[test]
fn run_takes_the_limit_from_the_environment() {
    let dir = scratch("cli-env");
    let client = cudarc_client();
    let o = run(gpucap(
        &[
            os("run"),
            os("--"),
            client.as_os_str(),
            os("1000"),
            os("100"),
        ],
        &dir.join("s.json"),
    )
    .env("GPUCAP_LIMIT", "25%"));
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert_eq!(r.total_mem, Some(GIB), "{}", dump(&o));
    assert_eq!(
        r.outcomes(),
        ["1000 ok", "100 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );
}

#[test]
fn run_returns_the_exit_status() {
    let dir = scratch("cli-status");
    for code in [0, 1, 7, 42] {
        let script = format!("exit {code}");
        let o = run(&mut gpucap(
            &[
                os("run"),
                os("--limit"),
                os("1Gi"),
                os("--"),
                os("sh"),
                os("-c"),
                os(&script),
            ],
            &dir.join("s.json"),
        ));
        assert_eq!(o.status.code(), Some(code), "{}", dump(&o));
    }
    // Killed by a signal: the same signal, or the shell's 128+N.
    let o = run(&mut gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            os("sh"),
            os("-c"),
            os("kill -TERM $$"),
        ],
        &dir.join("s.json"),
    ));
    assert!(
        o.status.signal() == Some(15) || o.status.code() == Some(128 + 15),
        "{}",
        dump(&o)
    );
}

#[test]
fn run_passes_arguments_and_stdio_through() {
    let dir = scratch("cli-args");
    let o = run(&mut gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            os("sh"),
            os("-c"),
            os("printf '%s|' \"$@\"; echo oops >&2"),
            os("sh"),
            os("a b"),
            os("--limit"),
            os(""),
        ],
        &dir.join("s.json"),
    ));
    assert_ok(&o);
    assert_eq!(stdout(&o), "a b|--limit||", "{}", dump(&o));
    assert!(stderr(&o).contains("oops"), "{}", dump(&o));
}

/// `gpucap run FLAGS -- sh -c 'touch MARKER'` with `var` set: its output, and the
/// marker the program would have created had it started.
fn run_touch(
    tag: &str,
    flags: &[&str],
    var: Option<(&str, &OsStr)>,
) -> (Output, std::path::PathBuf) {
    let dir = scratch(tag);
    let marker = dir.join("started");
    let mut args: Vec<&OsStr> = [os("run")]
        .into_iter()
        .chain(flags.iter().map(os))
        .collect();
    args.push(os("--"));
    args.extend(touch_cmd(&marker));
    let mut cmd = gpucap(&args, &dir.join("s.json"));
    if let Some((k, v)) = var {
        cmd.env(k, v);
    }
    (run(&mut cmd), marker)
}

#[test]
fn bad_limit_flag_stops_before_the_program() {
    let (o, marker) = run_touch("cli-badflag", &["--limit", "150%"], None);
    assert_config_error(&o, &marker, "limit", "150%");
}

#[test]
fn bad_limit_variable_stops_before_the_program() {
    let (o, marker) = run_touch("cli-badenv", &[], Some(("GPUCAP_LIMIT", os("abc"))));
    assert_config_error(&o, &marker, "GPUCAP_LIMIT", "abc");
}

#[test]
fn unknown_variable_stops_before_the_program() {
    let var = Some(("GPUCAP_LIMT", os("1Gi")));
    let (o, marker) = run_touch("cli-unknown", &["--limit", "1Gi"], var);
    assert_config_error(&o, &marker, "GPUCAP_LIMT", "1Gi");
}

#[test]
fn bad_log_level_stops_before_the_program() {
    let var = Some(("GPUCAP_LOG", os("loud")));
    let (o, marker) = run_touch("cli-badlog", &["--limit", "1Gi"], var);
    assert_config_error(&o, &marker, "GPUCAP_LOG", "loud");
}

#[test]
fn non_utf8_limit_stops_before_the_program() {
    let var = Some(("GPUCAP_LIMIT", OsStr::from_bytes(b"1G\xffi")));
    let (o, marker) = run_touch("cli-badbytes", &[], var);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("GPUCAP_LIMIT"), "{}", dump(&o));
    assert!(!marker.exists(), "{}", dump(&o));
}

#[test]
fn existing_ld_preload_is_kept() {
    let dir = scratch("cli-preload");
    // The program sees both the shim and the library that was already preloaded...
    let o = run(gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            os("sh"),
            os("-c"),
            os("printf %s \"$LD_PRELOAD\""),
        ],
        &dir.join("s.json"),
    )
    .env("LD_PRELOAD", "libm.so.6"));
    assert_ok(&o);
    let seen = stdout(&o);
    let entries: Vec<&str> = seen.split([':', ' ']).filter(|s| !s.is_empty()).collect();
    assert!(
        entries.contains(&"libm.so.6"),
        "LD_PRELOAD={seen:?}\n{}",
        dump(&o)
    );
    assert!(
        entries.iter().any(|e| e.ends_with("libgpucap.so")),
        "LD_PRELOAD={seen:?}\n{}",
        dump(&o)
    );
    // ...and the cap still holds.
    let client = cudarc_client();
    let o = run(gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            client.as_os_str(),
            os("600"),
            os("600"),
        ],
        &dir.join("s.json"),
    )
    .env("LD_PRELOAD", "libm.so.6"));
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert_eq!(
        r.outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );
}

#[test]
fn missing_shim_library_is_an_error() {
    let dir = scratch("cli-nolib");
    let marker = dir.join("started");
    let missing = dir.join("no-such-dir/libgpucap.so");
    let mut args = vec![os("run"), os("--limit"), os("1Gi"), os("--")];
    args.extend(touch_cmd(&marker));
    let o = run(gpucap(&args, &dir.join("s.json")).env("GPUCAP_LIB", &missing));
    assert!(!o.status.success(), "{}", dump(&o));
    assert!(
        stderr(&o).contains(missing.to_str().unwrap()),
        "stderr should name the missing library\n{}",
        dump(&o)
    );
    assert!(
        !marker.exists(),
        "the program ran without the shim\n{}",
        dump(&o)
    );
}

#[test]
fn check_prints_bytes_per_device() {
    let dir = scratch("cli-check");
    let o = run(gpucap(
        &[os("check"), os("--limit"), os("50%")],
        &dir.join("s.json"),
    )
    .env("FAKECUDA_TOTAL_MEM", "8Gi"));
    assert_ok(&o);
    assert!(
        stdout(&o).contains("4294967296"),
        "4 GiB in bytes\n{}",
        dump(&o)
    );

    // Two devices with their own caps: 1 GiB on GPU 0, half of 8 GiB on GPU 1.
    let o = run(gpucap(&[os("check")], &dir.join("s.json"))
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", "2")
        .env("GPUCAP_LIMIT", "0=1Gi,1=50%"));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("1073741824"), "GPU 0: 1 GiB\n{}", dump(&o));
    assert!(out.contains("4294967296"), "GPU 1: 4 GiB\n{}", dump(&o));
}

#[test]
fn check_rejects_bad_configuration() {
    let dir = scratch("cli-checkbad");
    let o = run(&mut gpucap(
        &[os("check"), os("--limit"), os("150%")],
        &dir.join("s.json"),
    ));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("150%"), "{}", dump(&o));
    let o = run(gpucap(&[os("check")], &dir.join("s.json")).env("GPUCAP_LIMT", "1Gi"));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(stderr(&o).contains("GPUCAP_LIMT"), "{}", dump(&o));
}

#[test]
fn non_utf8_environment_is_harmless() {
    let dir = scratch("cli-bytes");
    let odd = OsStr::from_bytes(b"caf\xe9 \xff");
    let o = run(gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            os("sh"),
            os("-c"),
            os("printf %s \"$ODD_BYTES\""),
        ],
        &dir.join("s.json"),
    )
    .env("ODD_BYTES", odd)
    .env(OsStr::from_bytes(b"ODD_\xffNAME"), "x"));
    assert_ok(&o);
    assert_eq!(
        o.stdout,
        odd.as_bytes(),
        "the variable reaches the program unchanged\n{}",
        dump(&o)
    );

    let o = run(gpucap(
        &[os("check"), os("--limit"), os("1Gi")],
        &dir.join("s.json"),
    )
    .env("ODD_BYTES", odd));
    assert_ok(&o);
    assert!(stdout(&o).contains("1073741824"), "{}", dump(&o));
}

#[test]
fn run_without_a_program_is_a_usage_error() {
    let dir = scratch("cli-usage");
    let o = run(&mut gpucap(
        &[os("run"), os("--limit"), os("1Gi")],
        &dir.join("s.json"),
    ));
    assert!(!o.status.success(), "{}", dump(&o));
    let o = run(&mut gpucap(
        &[os("no-such-subcommand")],
        &dir.join("s.json"),
    ));
    assert!(!o.status.success(), "{}", dump(&o));
}

// ---- issue 3: --report, --growth, check's growth/report lines -----------------------------

#[test]
fn run_report_flag_writes_the_report_relative_to_the_current_directory() {
    let dir = scratch("cli-report");
    let client = cudarc_client();
    // The client runs elsewhere: the relative path was made absolute by gpucap.
    let o = run(gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--report"),
            os("usage.json"),
            os("--"),
            os("sh"),
            os("-c"),
            os("cd / && exec \"$0\" 600 600"),
            client.as_os_str(),
        ],
        &dir.join("s.json"),
    )
    .current_dir(&dir));
    assert_ok(&o);
    let text = std::fs::read_to_string(dir.join("usage.json"))
        .unwrap_or_else(|e| panic!("no report: {e}\n{}", dump(&o)));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let d = &v["processes"][0]["devices"][0];
    assert_eq!(
        (
            d["cap"].as_u64(),
            d["peak"].as_u64(),
            d["refusals"].as_u64()
        ),
        (Some(GIB), Some(600 * MIB), Some(1)),
        "{text}"
    );
}

#[test]
fn run_growth_asks_the_frameworks_to_grow_unless_told_otherwise() {
    let dir = scratch("cli-growth");
    let show = os(
        "printf '%s %s %s\\n' \"$GPUCAP_GROWTH\" \"$TF_FORCE_GPU_ALLOW_GROWTH\" \"$XLA_PYTHON_CLIENT_PREALLOCATE\"",
    );
    let o = run(&mut gpucap(
        &[
            os("run"),
            os("--growth"),
            os("--"),
            os("sh"),
            os("-c"),
            show,
        ],
        &dir.join("s.json"),
    ));
    assert_ok(&o);
    assert_eq!(stdout(&o), "1 true false\n", "{}", dump(&o));
    let o = run(gpucap(
        &[
            os("run"),
            os("--growth"),
            os("--"),
            os("sh"),
            os("-c"),
            show,
        ],
        &dir.join("s.json"),
    )
    .env("TF_FORCE_GPU_ALLOW_GROWTH", "false"));
    assert_eq!(stdout(&o), "1 false false\n", "{}", dump(&o));
    // Without --growth, nothing is set.
    let o = run(&mut gpucap(
        &[os("run"), os("--"), os("sh"), os("-c"), show],
        &dir.join("s.json"),
    ));
    assert_eq!(stdout(&o), "  \n", "{}", dump(&o));
}

#[test]
fn check_shows_growth_and_report() {
    let dir = scratch("cli-check-gr");
    let o = run(&mut gpucap(
        &[
            os("check"),
            os("--growth"),
            os("--report"),
            os("/tmp/r-%p.json"),
        ],
        &dir.join("s.json"),
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.lines().any(|l| l.starts_with("growth: on")),
        "{}",
        dump(&o)
    );
    assert!(out.lines().any(|l| l == "report: /tmp/r-%p.json (JSON usage report at exit; %p = the process id)"), "{}", dump(&o));
    let o = run(&mut gpucap(&[os("check")], &dir.join("s.json")));
    let out = stdout(&o);
    assert!(
        out.lines().any(|l| l == "growth: off") && out.lines().any(|l| l == "report: none"),
        "{}",
        dump(&o)
    );
    let o = run(gpucap(&[os("check")], &dir.join("s.json")).env("GPUCAP_GROWTH", "sometimes"));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
}
