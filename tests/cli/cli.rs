//! The `gpucap` command line: `gpucap run [--limit L] -- PROGRAM...` and `gpucap check`.
//!
//! The programs run on the fake GPU (the fake driver on LD_LIBRARY_PATH, no inherited
//! GPUCAP_*/FAKECUDA_*/LD_PRELOAD); the capped program is the unmodified cudarc client.

use super::common;

use common::*;
use std::ffi::{OsStr, OsString};
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
    // One line, naming the variable meant.
    let err = stderr(&o);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("GPUCAP_LIMT")).collect();
    assert_eq!(said.len(), 1, "{}", dump(&o));
    assert!(
        said[0].contains("did you mean GPUCAP_LIMIT?"),
        "{}",
        dump(&o)
    );
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
    assert!(
        stderr(&o).contains("did you mean GPUCAP_LIMIT?"),
        "{}",
        dump(&o)
    );
    let o = run(&mut gpucap(
        &[os("check"), os("--limt"), os("1Gi")],
        &dir.join("s.json"),
    ));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains("unknown option '--limt' (did you mean --limit?)"),
        "{}",
        dump(&o)
    );
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

// ---- --report, --growth, check's growth/report lines --------------------------------------

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

/// The `limit:` line of `gpucap check` with no cap tells a cap left unset from one set to
/// `none` on purpose, and names how (before: "GPUCAP_LIMIT unset" for all three).
#[test]
fn check_tells_no_cap_asked_from_none_set() {
    let dir = scratch("cli-check-none");
    let limit_line = |o: &Output| {
        assert_ok(o);
        stdout(o)
            .lines()
            .find(|l| l.starts_with("limit: "))
            .unwrap_or_else(|| panic!("no limit line\n{}", dump(o)))
            .to_string()
    };
    let o = run(&mut gpucap(&[os("check")], &dir.join("s.json")));
    assert_eq!(
        limit_line(&o),
        "limit: none (GPUCAP_LIMIT unset: allocations are counted, not capped)"
    );
    let o = run(&mut gpucap(
        &[os("check"), os("--limit"), os("none")],
        &dir.join("s.json"),
    ));
    assert_eq!(
        limit_line(&o),
        "limit: none (no cap asked, --limit none: allocations are counted, not capped)"
    );
    let o = run(gpucap(&[os("check")], &dir.join("s.json")).env("GPUCAP_LIMIT", "none"));
    assert_eq!(
        limit_line(&o),
        "limit: none (no cap asked, GPUCAP_LIMIT=none: allocations are counted, not capped)"
    );
}

/// With a pool, `gpucap check` has a `wait:` line: the wait and which flag or variable
/// set it (before: no line for GPUCAP_WAIT at all); without a pool, none.
#[test]
fn check_shows_the_wait_and_where_it_came_from() {
    let dir = scratch("cli-check-wait");
    let wait_line = |args: &[&str], wait: Option<&str>| {
        let mut all = vec![os("check"), os("--limit"), os("1Gi")];
        all.extend(args.iter().map(os));
        let mut c = gpucap(&all, &dir.join("s.json"));
        c.env("GPUCAP_POOL_DIR", &dir);
        if let Some(w) = wait {
            c.env("GPUCAP_WAIT", w);
        }
        let o = run(&mut c);
        assert_ok(&o);
        stdout(&o)
            .lines()
            .find(|l| l.starts_with("wait: "))
            .map(str::to_string)
    };
    assert_eq!(
        wait_line(&["--pool", "p", "--wait", "30s"], None).as_deref(),
        Some(
            "wait: 30 s (from --wait: an allocation the pool cannot take now waits up to \
             30 s for its members to free memory)"
        )
    );
    assert_eq!(
        wait_line(&["--pool", "p"], Some("1500ms")).as_deref(),
        Some(
            "wait: 1500 ms (from GPUCAP_WAIT: an allocation the pool cannot take now waits \
             up to 1500 ms for its members to free memory)"
        )
    );
    assert_eq!(
        wait_line(&["--pool", "p"], None).as_deref(),
        Some(
            "wait: none (an allocation the pool cannot take now is refused at once; --wait \
             or GPUCAP_WAIT sets a wait)"
        )
    );
    assert_eq!(wait_line(&[], None), None);
}

/// A fraction cap under 1 % is shown with enough digits never to read as 0% (before:
/// `--limit 0.0000001` gave "limit: every GPU: 0% of physical memory").
#[test]
fn check_never_shows_a_fraction_cap_as_zero() {
    let dir = scratch("cli-check-tiny");
    let o = run(&mut gpucap(
        &[os("check"), os("--limit"), os("0.0000001")],
        &dir.join("s.json"),
    ));
    assert_ok(&o);
    let out = stdout(&o);
    assert!(
        out.lines()
            .any(|l| l == "limit: every GPU: 0.00001% of physical memory"),
        "{}",
        dump(&o)
    );
    assert!(
        out.lines()
            .any(|l| l == "note: --limit's 0.0000001 is 0.00001% of the GPU's memory, below 1 %"),
        "{}",
        dump(&o)
    );
    assert!(!out.contains(" 0% "), "{}", dump(&o));
}

// ---- keys that name no visible GPU ------------------------------------------------------

/// The one `gpucap:` line of a program's stderr (panics unless there is exactly one).
#[track_caller]
fn one_gpucap_line(o: &Output) -> String {
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpucap")).collect();
    assert_eq!(lines.len(), 1, "one gpucap line expected\n{}", dump(o));
    lines[0].to_string()
}

#[test]
fn an_ordinal_past_the_visible_gpus_stops_check_and_run_with_the_shims_message() {
    let dir = scratch("cli-ordinal");
    let stats = dir.join("s.json");
    // Two fake GPUs, only physical GPU 1 visible: the process sees one GPU, ordinal 0.
    let hide = |c: &mut Command| {
        c.env("FAKECUDA_DEVICES", "2")
            .env("CUDA_VISIBLE_DEVICES", "1");
    };
    let expected = "gpucap: GPUCAP_LIMIT names GPU 1, but only 1 GPU is visible to CUDA \
                    (GPU 0); ordinals count the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0; \
                    accepted keys: 0 or GPU-face0000-0000-0000-0000-000000000001";

    let mut c = gpucap(&[os("check")], &stats);
    hide(c.env("GPUCAP_LIMIT", "0=1Gi,1=2Gi"));
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert_eq!(one_gpucap_line(&o), expected, "{}", dump(&o));
    assert!(!stdout(&o).contains("configuration OK"), "{}", dump(&o));

    let marker = dir.join("started");
    let mut args = vec![os("run"), os("--limit"), os("0=1Gi,1=2Gi"), os("--")];
    args.extend(touch_cmd(&marker));
    let mut c = gpucap(&args, &stats);
    hide(&mut c);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    // The same line, naming the flag typed.
    assert_eq!(
        one_gpucap_line(&o),
        expected.replace("GPUCAP_LIMIT names", "--limit names"),
        "{}",
        dump(&o)
    );
    assert!(!marker.exists(), "the program ran\n{}", dump(&o));

    // The shim, at the program's cuInit, says the very same line.
    let prog = compile_c("identity", "", &["-lcuda"]);
    let mut c = fake_cmd(&prog, &stats);
    hide(
        preload(&mut c)
            .env("GPUCAP_LIMIT", "0=1Gi,1=2Gi")
            .arg("1048576"),
    );
    let o = run(&mut c);
    assert!(stdout(&o).contains("init rc=800"), "{}", dump(&o));
    assert_eq!(one_gpucap_line(&o), expected, "{}", dump(&o));

    // The control: with both GPUs visible, both commands go ahead.
    let mut args = vec![os("run"), os("--limit"), os("0=1Gi,1=2Gi"), os("--")];
    args.extend(touch_cmd(&marker));
    let o = run(gpucap(&args, &stats)
        .env("FAKECUDA_DEVICES", "2")
        .env("CUDA_VISIBLE_DEVICES", "1,0"));
    assert_ok(&o);
    assert!(marker.exists(), "{}", dump(&o));
}

// ---- without a driver, and the fake GPU for your own program -----------------------------

/// Whether this machine has an NVIDIA driver the loader finds without LD_LIBRARY_PATH.
fn system_has_libcuda() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1 "))
        .unwrap_or(false)
}

/// The one line `gpucap` prints when libcuda.so.1 cannot be loaded.
#[track_caller]
fn assert_no_driver_line(line: &str) {
    assert!(
        line.starts_with("no NVIDIA driver: libcuda.so.1 cannot be loaded (")
            || line.starts_with("gpucap: no NVIDIA driver: libcuda.so.1 cannot be loaded ("),
        "{line}"
    );
    assert!(
        line.ends_with(
            "to try gpucap without a GPU, use its fake GPU: see \"Without a GPU\" under \
             \"Using it\" in README.md (scripts/fake-gpu.sh)"
        ),
        "{line}"
    );
    // The section it names is there, under "Using it".
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let using = readme.find("\n## Using it\n").expect("## Using it");
    let without = readme
        .find("\n### Without a GPU\n")
        .expect("### Without a GPU");
    let next = readme[using + 1..]
        .find("\n## ")
        .map_or(readme.len(), |i| using + 1 + i);
    assert!(
        using < without && without < next,
        "Without a GPU is not under Using it"
    );
}

#[test]
fn without_a_driver_check_and_run_say_so_in_one_line() {
    if system_has_libcuda() {
        eprintln!("SKIP: this machine has libcuda.so.1 in the loader's cache");
        return;
    }
    let dir = scratch("cli-nodriver");
    let empty = dir.join("no-libcuda-here");
    std::fs::create_dir_all(&empty).unwrap();
    let stats = dir.join("s.json");

    let o = run(
        gpucap(&[os("check"), os("--limit"), os("1Gi")], &stats).env("LD_LIBRARY_PATH", &empty)
    );
    assert_ok(&o);
    // check says it as run does: one line on stderr, with gpucap's prefix; its report
    // (stdout) says only that the devices are unknown.
    assert!(!stdout(&o).contains("libcuda"), "{}", dump(&o));
    assert!(
        stdout(&o).contains("\ndevices: unknown (no NVIDIA driver could be loaded)\n"),
        "{}",
        dump(&o)
    );
    assert_eq!(stderr(&o).lines().count(), 1, "{}", dump(&o));
    let line = one_gpucap_line(&o);
    assert!(line.starts_with("gpucap: no NVIDIA driver: "), "{line}");
    assert_no_driver_line(&line);

    // run: the line, then the program all the same (it may not need the GPU), with
    // or without GPUs named in the limit.
    for limit in ["1Gi", "0=1Gi"] {
        let o = run(gpucap(
            &[
                os("run"),
                os("--limit"),
                os(limit),
                os("--"),
                os("sh"),
                os("-c"),
                os("echo ran"),
            ],
            &stats,
        )
        .env("LD_LIBRARY_PATH", &empty));
        assert_ok(&o);
        assert_eq!(stdout(&o), "ran\n", "{}", dump(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", dump(&o));
        assert_no_driver_line(&one_gpucap_line(&o));
    }
    // GPUCAP_LOG=off silences it.
    let o = run(gpucap(&[os("run"), os("--"), os("true")], &stats)
        .env("LD_LIBRARY_PATH", &empty)
        .env("GPUCAP_LOG", "off"));
    assert_ok(&o);
    assert_eq!(stderr(&o), "", "{}", dump(&o));
}

/// `scripts/fake-gpu.sh ARGS` in an environment with no library path and nothing of
/// gpucap's or the fake's.
fn fake_gpu_script(script: &Path, args: &[&OsStr]) -> Command {
    let mut c = Command::new(script);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GPUCAP_") || k.starts_with("FAKECUDA_") || k.starts_with("LD_") {
            c.env_remove(&k);
        }
    }
    c.args(args);
    c
}

#[test]
fn the_fake_gpu_script_makes_the_folder_and_runs_a_program_on_it() {
    let script = root().join("scripts/fake-gpu.sh");
    let o = run(&mut fake_gpu_script(&script, &[]));
    assert_ok(&o);
    let folder = std::path::PathBuf::from(stdout(&o).trim_end());
    assert_eq!(stdout(&o).lines().count(), 1, "{}", dump(&o));
    let release = root().join("target/release");
    for (name, target) in [
        ("libcuda.so.1", "libcuda.so"),
        ("libcuda.so", "libcuda.so"),
        ("libnvidia-ml.so.1", "libnvidia_ml.so"),
        ("libnvidia-ml.so", "libnvidia_ml.so"),
    ] {
        let found = folder.join(name).canonicalize();
        assert_eq!(
            found.ok(),
            release.join(target).canonicalize().ok(),
            "{name} in {}",
            folder.display()
        );
    }

    // A program of one's own, through the CLI, on the fake GPU.
    let client = cudarc_client();
    let o = run(fake_gpu_script(
        &script,
        &[
            cli().as_os_str(),
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            client.as_os_str(),
            os("600"),
            os("600"),
        ],
    )
    .env("FAKECUDA_TOTAL_MEM", "4Gi"));
    assert_ok(&o);
    let r = ClientReport::parse(&stdout(&o));
    assert_eq!(r.total_mem, Some(GIB), "{}", dump(&o));
    assert_eq!(
        r.outcomes(),
        ["600 ok", "600 CUDA_ERROR_OUT_OF_MEMORY"],
        "{}",
        dump(&o)
    );

    // NVML is there too, under the name NVML users load.
    let nvml = "import ctypes; n = ctypes.CDLL('libnvidia-ml.so.1'); c = ctypes.c_uint(); \
                print(n.nvmlInit_v2(), n.nvmlDeviceGetCount_v2(ctypes.byref(c)), c.value)";
    let o = run(
        fake_gpu_script(&script, &[os("--"), os("python3"), os("-c"), os(nvml)])
            .env("FAKECUDA_DEVICES", "3"),
    );
    assert_ok(&o);
    assert_eq!(stdout(&o), "0 0 3\n", "{}", dump(&o));

    // Not built: it says which command builds it, and fails.
    let dir = scratch("fake-gpu-unbuilt");
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    let copy = dir.join("scripts/fake-gpu.sh");
    std::fs::copy(&script, &copy).unwrap();
    let o = run(&mut fake_gpu_script(&copy, &[]));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(
        stderr(&o).contains("run 'cargo build --release'"),
        "{}",
        dump(&o)
    );
    assert_eq!(stdout(&o), "", "{}", dump(&o));
}

// ---- the README's headline example -------------------------------------------------------

#[test]
fn the_readme_headline_example_is_what_gpucap_prints() {
    // The first `$ gpucap run` block of README.md: its command, then what it prints.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("```\n$ gpucap run ")
        .expect("a ``` block starting with $ gpucap run");
    let block = &readme[start + 4..];
    let block = &block[..block.find("```").unwrap()];
    let mut lines = block.lines();
    let command = lines.next().unwrap().trim_start_matches("$ gpucap ");
    let expected: Vec<&str> = lines.collect();
    // The demo's program and fake GPU (16 GiB), as scripts/demo.sh runs it.
    let client = cudarc_client();
    let args: Vec<OsString> = command
        .split_whitespace()
        .map(|w| match w {
            "cudarc-client" => client.clone().into_os_string(),
            w => OsString::from(w),
        })
        .collect();
    let dir = scratch("cli-headline");
    let o = run(fake_cmd(cli(), &dir.join("s.json"))
        .args(&args)
        .env("FAKECUDA_TOTAL_MEM", "16Gi"));
    assert_ok(&o);
    let printed = format!("{}{}", stdout(&o), stderr(&o));
    for line in &expected {
        assert!(
            printed.lines().any(|l| l == *line),
            "README's headline shows {line:?}, which `gpucap {command}` does not print\n{}",
            dump(&o)
        );
    }
    // The refusal line is the shim's own (tests/common's `refusals` finds it).
    assert_eq!(refusals(&printed).len(), 1, "{}", dump(&o));
    assert!(expected.iter().any(|l| l.starts_with("gpucap: refused ")));
}

/// HAMi-core's lowercase `g` is GiB in `--limit` and `GPUCAP_LIMIT`; Kubernetes' `m`
/// (milli) is refused with a line saying what to write.
#[test]
fn hamis_g_is_accepted_and_kubernetes_m_refused() {
    let dir = scratch("cli-units");
    let stats = dir.join("s.json");
    let o = run(&mut gpucap(&[os("check"), os("--limit"), os("8g")], &stats));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert!(
        stdout(&o).contains("limit: every GPU: 8 GiB (8589934592 bytes)"),
        "{}",
        dump(&o)
    );
    let o = run(gpucap(&[os("check")], &stats).env("GPUCAP_LIMIT", "8m"));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).contains("m is milli in Kubernetes")
            && stderr(&o).contains("write 8Mi for mebibytes"),
        "{}",
        dump(&o)
    );
}

/// A message about a value given by a flag names the flag typed, not its variable:
/// `check --limit 8GB`'s note, `cdi generate --limit 150%`'s error, a per-GPU key
/// naming no GPU (`--limit names GPU 1`), the pool's cap a guarantee is weighed against
/// (`(1 GiB, --limit)`); a child that sets the variable itself is named by it.
#[test]
fn messages_name_the_flag_typed() {
    let dir = scratch("cli-flagnames");
    let stats = dir.join("s.json");
    let o = run(&mut gpucap(
        &[os("check"), os("--limit"), os("8GB")],
        &stats,
    ));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        all.contains("note: --limit's 8GB is in decimal units"),
        "{}",
        dump(&o)
    );
    assert!(!all.contains("GPUCAP_LIMIT"), "{}", dump(&o));
    let out = dir.join("cdi.json");
    let cdi_dir = dir.join("cdi");
    let o = run(&mut gpucap(
        &[
            os("cdi"),
            os("generate"),
            os("--output"),
            out.as_os_str(),
            os("--dir"),
            cdi_dir.as_os_str(),
            os("--limit"),
            os("150%"),
        ],
        &stats,
    ));
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert!(
        stderr(&o).starts_with("gpucap: invalid --limit=\"150%\""),
        "{}",
        dump(&o)
    );
    assert!(!out.exists());
    // A per-GPU key that names no visible GPU, and the pool's cap a guarantee is
    // weighed against (before, both named GPUCAP_LIMIT: a user-journey review); the
    // variable set in the environment is named as the variable.
    let o = run(&mut gpucap(
        &[os("check"), os("--limit"), os("0=8Gi,1=50%")],
        &stats,
    ));
    assert!(
        o.status.code() == Some(2) && stderr(&o).starts_with("gpucap: --limit names GPU 1, "),
        "{}",
        dump(&o)
    );
    let o = run(gpucap(&[os("check")], &stats).env("GPUCAP_LIMIT", "0=8Gi,1=50%"));
    assert!(
        stderr(&o).starts_with("gpucap: GPUCAP_LIMIT names GPU 1, "),
        "{}",
        dump(&o)
    );
    // A child of `gpucap run --limit 1Gi` that sets its own GPUCAP_LIMIT inherits
    // GPUCAP_TYPED: its line names its variable, not the parent's flag (a review saw
    // `--limit names GPU 1` there).
    let client = cudarc_client();
    let o = run(&mut gpucap(
        &[
            os("run"),
            os("--limit"),
            os("1Gi"),
            os("--"),
            os("sh"),
            os("-c"),
            os("GPUCAP_LIMIT=1=512Mi exec \"$0\" 10"),
            client.as_os_str(),
        ],
        &stats,
    ));
    assert!(
        stderr(&o).contains("gpucap: GPUCAP_LIMIT names GPU 1, ")
            && !stderr(&o).contains("--limit names"),
        "{}",
        dump(&o)
    );
    let pools = dir.join("pools");
    std::fs::create_dir_all(&pools).unwrap();
    let o = run(gpucap(
        &[
            os("check"),
            os("--limit"),
            os("1Gi"),
            os("--pool"),
            os("p"),
            os("--guarantee"),
            os("2Gi"),
        ],
        &stats,
    )
    .env("GPUCAP_POOL_DIR", &pools));
    assert!(
        o.status.code() == Some(2)
            && stderr(&o).contains("is above the pool's cap (1 GiB, --limit)"),
        "{}",
        dump(&o)
    );
}

/// `cmd` run in a mount namespace of its own (`unshare -m`: another container's), with
/// the same arguments, environment and directory.
fn in_own_mount_namespace(cmd: &Command) -> Command {
    let mut c = Command::new("unshare");
    c.arg("-m").arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// The CDI device's default pool (`gpucap cdi generate` without `--pool`) is one per
/// container: processes in two mount namespaces (`unshare -m`, as two containers that
/// share `/dev/shm` with `--ipc=host`) get a pool each, and two processes in one mount
/// namespace share one, named as the entrypoint names it (`container-N`).
/// `gpucap run` refuses, before CMD starts, a cap other than the one the live members of
/// its pool hold a GPU to: `check`'s line, exit status 2, CMD never run (before: CMD
/// started, and the library refused every CUDA call it made, CUDA_ERROR_NOT_PERMITTED).
/// With no cap, the line says so in words ("at no cap" read badly), and no "runs
/// uncapped" line comes before it: the program would not run at all. The live members'
/// cap runs CMD.
#[test]
fn run_refuses_a_cap_other_than_the_pools_live_members_before_the_program_starts() {
    use common::pool_scratch::Scratch;
    let s = Scratch::new("run-pool-cap");
    let mut a = s.member("mm", "a", &["alloc:1Mi"]);
    let marker = s.dir.join("started");
    let touch = ["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()];
    let with = |flags: &[&str], cmd: &[&str]| {
        let mut args = flags.to_vec();
        args.extend(cmd);
        run(&mut s.gpucap(&args))
    };
    let differs = "gpucap: cannot join the pool mm: this process caps GPU 0 at 2 GiB, the \
                   pool's live members at 1 GiB (every member of a pool must set the same \
                   GPUCAP_LIMIT)";
    let c = with(&["check", "--limit", "2Gi", "--pool", "mm"], &[]);
    assert_eq!(c.status.code(), Some(2), "{}", dump(&c));
    assert_eq!(stderr(&c).trim_end(), differs, "{}", dump(&c));
    let o = with(&["run", "--limit", "2Gi", "--pool", "mm", "--"], &touch);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert_eq!(stderr(&o).trim_end(), differs, "{}", dump(&o));
    assert!(!marker.exists(), "the program ran\n{}", dump(&o));
    let o = with(&["run", "--pool", "mm", "--"], &touch);
    assert_eq!(o.status.code(), Some(2), "{}", dump(&o));
    assert_eq!(
        stderr(&o).trim_end(),
        "gpucap: cannot join the pool mm: this process sets no cap on GPU 0, the pool's \
         live members cap it at 1 GiB (every member of a pool must set the same GPUCAP_LIMIT)",
        "{}",
        dump(&o)
    );
    assert!(!marker.exists(), "the program ran\n{}", dump(&o));
    let o = with(&["run", "--limit", "1Gi", "--pool", "mm", "--"], &touch);
    assert_ok(&o);
    assert!(marker.exists(), "the program did not run\n{}", dump(&o));
    let _ = a.kill();
    let _ = a.wait();
}

/// `gpucap run` compares its cap only on the GPUs a live member of the pool holds, as
/// the library does: a member gone from GPU 0 (its cap left in the pool's file) and one
/// alive on GPU 1 do not stop a process on GPU 0 with another cap, which the library
/// lets join (before, run refused it: a review). The caps compared need no driver where
/// they are the same bytes on every GPU.
#[test]
fn run_compares_its_cap_only_on_the_gpus_live_members_hold() {
    use common::pool_scratch::{Scratch, script};
    use std::process::Stdio;
    let s = Scratch::new("run-pool-gpus");
    let script = script();
    let on = |gpu: &str, args: &[&str]| {
        let mut c = s.gpucap(args);
        c.env("FAKECUDA_DEVICES", "2")
            .env("CUDA_VISIBLE_DEVICES", gpu);
        c
    };
    let sc = script.to_str().unwrap();
    let gone = run(&mut on(
        "0",
        &[
            "run",
            "--limit",
            "1Gi",
            "--pool",
            "st",
            "--",
            sc,
            "alloc:1Mi",
        ],
    ));
    assert_ok(&gone);
    let ready = s.dir.join("b.ready");
    let never = s.dir.join("never");
    let (touch, wait) = (
        format!("touch:{}", ready.display()),
        format!("wait:{}", never.display()),
    );
    let mut b = on(
        "1",
        &[
            "run",
            "--limit",
            "1Gi",
            "--pool",
            "st",
            "--",
            sc,
            "alloc:1Mi",
            &touch,
            &wait,
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_ready(&mut b, &ready, "the member on GPU 1");
    let marker = s.dir.join("started");
    let o = run(&mut on(
        "0",
        &[
            "run",
            "--limit",
            "2Gi",
            "--pool",
            "st",
            "--",
            "sh",
            "-c",
            "touch \"$0\"",
            marker.to_str().unwrap(),
        ],
    ));
    let _ = b.kill();
    let _ = b.wait();
    assert_ok(&o);
    assert!(marker.exists(), "the program did not run\n{}", dump(&o));
}

#[test]
fn the_cdi_devices_default_pool_is_one_per_mount_namespace() {
    use common::pool_scratch::{Scratch, script};
    use std::process::Stdio;
    let s = Scratch::new("cdi-mntns");
    let o = run(Command::new(cli())
        .args(["cdi", "generate", "--limit", "1Gi", "--output"])
        .arg(s.dir.join("cdi.json"))
        .arg("--dir")
        .arg(s.dir.join("cdi")));
    assert_ok(&o);
    let env = std::fs::read_to_string(s.dir.join("cdi/capped/gpucap.env")).unwrap();
    let pool = env
        .lines()
        .find_map(|l| l.strip_prefix("GPUCAP_POOL="))
        .unwrap_or_else(|| panic!("no GPUCAP_POOL in\n{env}"));
    assert_eq!(pool, "container-mntns");
    let script = script();
    let never = s.dir.join("never");
    // A process of the device's pool holding 600 MiB of its 1 GiB: in a mount namespace
    // of its own, or in this test's.
    let holder = |tag: &str, own_namespace: bool| {
        let ready = s.dir.join(format!("{tag}.ready"));
        let args = [
            "run".to_string(),
            "--limit".into(),
            "1Gi".into(),
            "--pool".into(),
            pool.into(),
            "--".into(),
            script.to_str().unwrap().into(),
            "alloc:600Mi".into(),
            format!("touch:{}", ready.display()),
            format!("wait:{}", never.display()),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut c = s.gpucap(&args);
        if own_namespace {
            c = in_own_mount_namespace(&c);
        }
        let mut child = c
            .current_dir(&s.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_ready(&mut child, &ready, tag);
        child
    };
    let (a, b, c) = (holder("a", true), holder("b", true), holder("c", false));
    // Beside c, in its namespace: 600 MiB more do not fit the pool's 1 GiB.
    let d = s.once(pool, &["alloc:600Mi"]);
    let alloc = format!("alloc {} ", 600u64 << 20);
    assert!(
        stdout(&d).contains(&alloc) && !stdout(&d).contains(&format!("{alloc}0")),
        "the same namespace, the same pool: refused\n{}",
        dump(&d)
    );
    // The container's pool is a directory in the pool directory, every user's
    // (gpucap-container-NS, mode 0777), with its file (gpucap.pool).
    let mut pools: Vec<String> = std::fs::read_dir(&s.pools)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("gpucap.pool").is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    pools.sort();
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let ours: String = ours
        .to_string_lossy()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    assert_eq!(pools.len(), 3, "a pool per namespace: {pools:?}");
    assert!(
        pools
            .iter()
            .all(|p| p.starts_with("gpucap-container-") && !p.contains("mntns")),
        "{pools:?}"
    );
    assert!(
        pools.contains(&format!("gpucap-container-{ours}")),
        "{pools:?}"
    );
    for mut p in [a, b, c] {
        let _ = p.kill();
        let o = p.wait_with_output().unwrap();
        assert!(
            stdout(&o).contains(&format!("alloc {} 0", 600u64 << 20)),
            "each held its 600 MiB in its own pool\n{}",
            dump(&o)
        );
    }
}
