//! `gpucap run --measure -- CMD`: run CMD uncapped under the shim with a private
//! `GPUCAP_REPORT`, wait for it, then print each GPU's peak and a suggested `--limit`.
//!
//! The suggestion rule: the peak plus 20% headroom, rounded up to a tidy value: a
//! multiple of a quarter of the largest power of two not above it (so 896Mi, 1.25Gi,
//! 1.5Gi, 2Gi, 2.5Gi, 3Gi, 5Gi, 6Gi...), at least 1Mi. The rounding adds at most 25%
//! more, so the suggestion is between 1.2x and 1.5x the peak.

use std::ffi::{OsStr, OsString, c_int};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering::SeqCst};

use crate::args::Overrides;
use crate::environment::{load, lookup, set_var};
use crate::exit::{EXIT_USAGE, exec_failure};
use crate::launch::{child_env, prepare};
use crate::preload;
use gpucap_core::report::{ProcessReport, process_of, read_report};
use gpucap_core::size::format_bytes;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The suggested cap for a peak of `peak` bytes (see the module's documentation).
pub fn suggest_limit(peak: u64) -> u64 {
    let x = peak.saturating_add(peak.div_ceil(5));
    if x <= MIB {
        return MIB;
    }
    let p = 1u64 << (63 - x.leading_zeros());
    let step = (p / 4).max(1);
    x.div_ceil(step).saturating_mul(step)
}

/// `bytes` as a `--limit` value: `4Gi`, `1.25Gi`, `896Mi`, `1.5Mi`, or whole bytes.
pub fn format_limit(bytes: u64) -> String {
    let decimal = |unit: u64, name: &str| -> Option<String> {
        if bytes.is_multiple_of(unit) {
            return Some(format!("{}{name}", bytes / unit));
        }
        if bytes.is_multiple_of(unit / 4) && bytes >= unit {
            let quarters = bytes / (unit / 4);
            let frac = match quarters % 4 {
                1 => "25",
                2 => "5",
                _ => "75",
            };
            return Some(format!("{}.{frac}{name}", quarters / 4));
        }
        None
    };
    decimal(GIB, "Gi")
        .or_else(|| decimal(MIB, "Mi"))
        .unwrap_or_else(|| bytes.to_string())
}

/// The peak of each GPU over all the processes (a cap applies to each process alone,
/// so the largest one is what a cap must allow), by ordinal.
pub fn peaks(processes: &[ProcessReport]) -> Vec<(u32, u64)> {
    let mut out: Vec<(u32, u64)> = Vec::new();
    for d in processes.iter().flat_map(|p| &p.devices) {
        match out.iter_mut().find(|(o, _)| *o == d.ordinal) {
            Some((_, peak)) => *peak = (*peak).max(d.peak),
            None => out.push((d.ordinal, d.peak)),
        }
    }
    out.sort();
    out
}

/// The `--limit` value to suggest for these peaks: one value when every GPU gets the
/// same, else a per-GPU list. None when nothing was allocated.
pub fn suggestion(peaks: &[(u32, u64)]) -> Option<String> {
    let used: Vec<(u32, u64)> = peaks
        .iter()
        .filter(|(_, p)| *p > 0)
        .map(|&(o, p)| (o, suggest_limit(p)))
        .collect();
    let first = used.first()?.1;
    if used.iter().all(|&(_, s)| s == first) {
        return Some(format_limit(first));
    }
    Some(
        used.iter()
            .map(|&(o, s)| format!("{o}={}", format_limit(s)))
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// What `--measure` prints once CMD has exited (each line starts `gpucap: `); `ceiling`:
/// the file whose cap CMD ran under, if one did.
pub fn measure_text(processes: &[ProcessReport], command: &str, ceiling: Option<&Path>) -> String {
    let mut out: Vec<String> = Vec::new();
    if processes.is_empty() {
        // Nothing written: no CUDA call, or every process that made one ended without
        // `exit()`, which writes no figures (reports.md); which of the two is not known.
        out.push(
            "measure: no figures: no process made a CUDA call under gpucap, or each one that \
             did ended without exit() (a fatal signal, SIGKILL, _exit, as forked workers \
             end), which leaves none: nothing to suggest"
                .to_string(),
        );
        return lines(out);
    }
    let several = processes.len() > 1;
    // A program that `exec`ed another left an entry of its own (`<id>.execN`): a
    // process is its id without that suffix, each of its programs said.
    let mut ids: Vec<&str> = processes.iter().map(|p| process_of(&p.id).0).collect();
    ids.sort_unstable();
    ids.dedup();
    let count = ids.len();
    out.push(format!(
        "measure: {count} process{} used CUDA{}",
        if count > 1 { "es" } else { "" },
        if processes.len() > count {
            format!(
                ", in {} programs (one that exec'ed another is counted apart)",
                processes.len()
            )
        } else {
            String::new()
        }
    ));
    for p in processes {
        let who = if several {
            let name = p.cmdline.first().map_or("?", |c| c.as_str());
            let before = if process_of(&p.id).1 {
                ", before it exec'ed another"
            } else {
                ""
            };
            format!("pid {} ({name}{before}): ", p.pid)
        } else {
            String::new()
        };
        if !p.exited {
            out.push(format!(
                "measure: {who}did not exit normally; its figures are from its last refused allocation"
            ));
        }
        if p.devices.is_empty() {
            out.push(format!("measure: {who}no GPU memory allocated"));
        }
        for d in &p.devices {
            out.push(format!(
                "measure: {who}GPU {}: peak {} ({} bytes), {} allocation{}",
                d.ordinal,
                format_bytes(d.peak),
                d.peak,
                d.allocations,
                if d.allocations == 1 { "" } else { "s" }
            ));
            if d.refusals > 0 {
                out.push(format!(
                    "measure: {who}GPU {}: {} allocation{} refused (the largest {}){}: CMD \
                     needs more than this peak shows",
                    d.ordinal,
                    d.refusals,
                    if d.refusals == 1 { "" } else { "s" },
                    format_bytes(d.largest_refused),
                    ceiling.map_or(String::new(), |p| format!(
                        " under the ceiling of {}",
                        p.display()
                    )),
                ));
            }
        }
    }
    let refused = processes
        .iter()
        .flat_map(|p| &p.devices)
        .any(|d| d.refusals > 0);
    match suggestion(&peaks(processes)) {
        Some(limit) => {
            out.push(format!(
                "measure: suggested limit: --limit {limit} (the peak plus 20%, rounded up{})",
                if refused {
                    "; CMD needs more: allocations were refused"
                } else {
                    ""
                }
            ));
            out.push(format!(
                "measure: e.g. gpucap run --limit {limit} -- {command}"
            ));
        }
        None => out.push("measure: no GPU memory was allocated: no limit to suggest".to_string()),
    }
    lines(out)
}

fn lines(v: Vec<String>) -> String {
    v.iter().map(|l| format!("gpucap: {l}\n")).collect()
}

// ---- running CMD ------------------------------------------------------------------------

/// The child's pid once spawned (0 before), and a SIGTERM/SIGHUP that arrived before.
static CHILD: AtomicI32 = AtomicI32::new(0);
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: c_int) {
    let pid = CHILD.load(SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; pid is our child's (not yet reaped).
        unsafe { libc::kill(pid, sig) };
    } else {
        PENDING.store(sig, SeqCst);
    }
}

/// SIGTERM and SIGHUP are passed on to the child (a handler, not SIG_IGN: handlers
/// are reset by exec, so the child starts with the default disposition).
fn forward_signals() {
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; `forward` is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as extern "C" fn(c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Ctrl-C and Ctrl-\ go to the whole foreground process group: the child gets them,
/// gpucap ignores them and waits to report. Set before the child is spawned (no window
/// where a Ctrl-C kills gpucap but not the child); returns the dispositions they had,
/// for the child to get back.
fn ignore_terminal_signals() -> [libc::sighandler_t; 2] {
    // SAFETY: setting a signal to SIG_IGN has no preconditions.
    [libc::SIGINT, libc::SIGQUIT].map(|sig| unsafe { libc::signal(sig, libc::SIG_IGN) })
}

/// A fresh private directory for the report.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut last = None;
    for i in 0..100u32 {
        let dir = base.join(format!("gpucap-measure-{}-{nanos}-{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no directory name left")))
}

fn shell_words(program: &OsStr, args: &[OsString]) -> String {
    std::iter::once(program)
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| {
            let a = a.to_string_lossy();
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,%+@".contains(c))
            {
                a.into_owned()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `gpucap run --measure [--log L] [--growth] [--] CMD ARGS...`.
pub fn measure(overrides: &Overrides, program: &OsStr, args: &[OsString]) -> i32 {
    if overrides.limit.is_some() {
        eprintln!("gpucap: --measure runs CMD without a cap: drop --limit");
        return EXIT_USAGE;
    }
    if overrides.report.is_some() {
        eprintln!(
            "gpucap: --measure writes its own report: drop --report (or run without --measure)"
        );
        return EXIT_USAGE;
    }
    let pool_flag = [
        ("--pool", overrides.pool.is_some()),
        ("--wait", overrides.wait.is_some()),
        ("--guarantee", overrides.guarantee.is_some()),
        ("--ceiling", overrides.ceiling.is_some()),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag));
    if let Some(flag) = pool_flag {
        eprintln!("gpucap: --measure runs CMD alone, outside any pool: drop {flag}");
        return EXIT_USAGE;
    }
    if overrides.quiet {
        eprintln!("gpucap: --measure says no uncapped line for --quiet to silence: drop --quiet");
        return EXIT_USAGE;
    }
    let (config, vars) = match load(overrides) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if config.limit.is_some() {
        // The variables the cap came from (a driver's hand-over as much as GPUCAP_LIMIT).
        let mut names: Vec<&str> = config.origins.iter().map(|o| o.var.as_str()).collect();
        names.dedup();
        if names.is_empty() {
            names.push("GPUCAP_LIMIT");
        }
        eprintln!(
            "gpucap: --measure runs CMD without a cap: unset {}",
            names.join(" and ")
        );
        return EXIT_USAGE;
    }
    if config.report.is_some() {
        eprintln!("gpucap: --measure writes its own report: unset GPUCAP_REPORT");
        return EXIT_USAGE;
    }
    if config.pool.is_some() {
        eprintln!(
            "gpucap: --measure runs CMD alone, outside any pool: set GPUCAP_POOL=off (or unset \
             it) and unset CUDA_DEVICE_MEMORY_SHARED_CACHE"
        );
        return EXIT_USAGE;
    }
    // Without a limit the driver check only says, in one line, when there is no driver
    // to measure.
    let lib = match prepare(&config, &vars) {
        Ok(lib) => lib,
        Err(code) => return code,
    };
    // A cap handed down beside the library binds CMD whatever its environment says: it
    // runs under that ceiling, and what it asks above it is refused, not measured.
    let ceiling = match crate::environment::config_file(Some(&lib)) {
        Ok(Some((file, path))) if file.limit.is_some() => Some(path),
        _ => None,
    };
    if let Some(path) = &ceiling {
        eprintln!(
            "gpucap: measure: {} hands down a cap, a ceiling --measure cannot lift: CMD runs \
             under it, and what it asks above it is refused, not measured",
            path.display()
        );
    }
    let dir = match private_dir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gpucap: cannot create a directory for the report: {e}");
            return EXIT_USAGE;
        }
    };
    let report = dir.join("report.json");
    let ld_preload = preload::merge_ld_preload(lookup(&vars, "LD_PRELOAD"), &lib);
    let mut env = child_env(overrides, vars, ld_preload);
    set_var(&mut env, "GPUCAP_REPORT", report.clone().into_os_string());

    forward_signals();
    let before = ignore_terminal_signals();
    // The child gets SIGINT/SIGQUIT as gpucap had them (default, or ignored when gpucap
    // itself was started with them ignored, as for a background job).
    let restore = before.map(|h| {
        if h == libc::SIG_IGN {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        }
    });
    let mut command = std::process::Command::new(program);
    command.args(args).env_clear().envs(env);
    // SAFETY: the closure only calls signal(), which is async-signal-safe, between
    // fork and exec.
    unsafe {
        command.pre_exec(move || {
            libc::signal(libc::SIGINT, restore[0]);
            libc::signal(libc::SIGQUIT, restore[1]);
            Ok(())
        });
    }
    let spawned = command.spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            let (code, message) = exec_failure(program, &e);
            eprintln!("{message}");
            return code;
        }
    };
    CHILD.store(child.id() as i32, SeqCst);
    let pending = PENDING.swap(0, SeqCst);
    if pending != 0 {
        // SAFETY: the child has not been waited for, so its pid is still its own.
        unsafe { libc::kill(child.id() as i32, pending) };
    }
    let status = child.wait();
    CHILD.store(0, SeqCst);
    let code = match status {
        Ok(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
        Err(e) => {
            eprintln!("gpucap: waiting for the command failed: {e}");
            EXIT_USAGE
        }
    };
    let processes = if report.exists() {
        match read_report(&report) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("gpucap: measure: cannot read the report: {e}");
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    let _ = std::fs::remove_dir_all(&dir);
    eprint!(
        "{}",
        measure_text(&processes, &shell_words(program, args), ceiling.as_deref())
    );
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpucap_core::config::{Limit, parse_limit_spec};
    use gpucap_core::report::DeviceReport;

    #[test]
    fn suggestions_are_tidy_and_above_the_peak() {
        assert_eq!(suggest_limit(0), MIB);
        assert_eq!(suggest_limit(1000), MIB);
        assert_eq!(suggest_limit(700 * MIB), 896 * MIB); // 840 MiB -> 128 MiB steps
        assert_eq!(suggest_limit(3 * GIB / 2), 2 * GIB); // 1.8 GiB -> 256 MiB steps
        assert_eq!(suggest_limit(GIB), 5 * GIB / 4); // 1.2 GiB -> 1.25 GiB
        assert_eq!(suggest_limit(3 * GIB), 4 * GIB);
        assert_eq!(suggest_limit(10 * GIB), 12 * GIB);
        assert_eq!(suggest_limit(u64::MAX), u64::MAX);
        for peak in [1, 5 * MIB, 123_456_789, 3 * GIB + 1, 70 * GIB, 1 << 50] {
            let s = suggest_limit(peak);
            assert!(s as u128 * 5 >= peak as u128 * 6, "{peak}: {s}");
            assert!(s as u128 * 2 <= peak as u128 * 3 || s == MIB, "{peak}: {s}");
            // The text parses back to exactly the suggestion.
            let spec = parse_limit_spec(&format_limit(s)).unwrap();
            assert_eq!(
                spec.default,
                Some(Limit::Bytes(s)),
                "{peak}: {}",
                format_limit(s)
            );
        }
    }

    #[test]
    fn limit_text() {
        assert_eq!(format_limit(4 * GIB), "4Gi");
        assert_eq!(format_limit(5 * GIB / 4), "1.25Gi");
        assert_eq!(format_limit(3 * GIB / 2), "1.5Gi");
        assert_eq!(format_limit(7 * GIB / 4), "1.75Gi");
        assert_eq!(format_limit(896 * MIB), "896Mi");
        assert_eq!(format_limit(5 * MIB / 4), "1.25Mi");
        assert_eq!(format_limit(1000), "1000");
    }

    fn proc_with(pid: u32, devs: &[(u32, u64)]) -> ProcessReport {
        ProcessReport {
            id: pid.to_string(),
            pid,
            cmdline: vec!["prog".into()],
            exited: true,
            time: 0,
            growth: false,
            devices: devs
                .iter()
                .map(|&(ordinal, peak)| DeviceReport {
                    ordinal,
                    cap: None,
                    peak,
                    in_use: 0,
                    retained: 0,
                    allocations: 2,
                    refusals: 0,
                    largest_refused: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn texts() {
        let one = [proc_with(7, &[(0, 700 * MIB)])];
        assert_eq!(
            measure_text(&one, "prog 1", None),
            "gpucap: measure: 1 process used CUDA\n\
             gpucap: measure: GPU 0: peak 700 MiB (734003200 bytes), 2 allocations\n\
             gpucap: measure: suggested limit: --limit 896Mi (the peak plus 20%, rounded up)\n\
             gpucap: measure: e.g. gpucap run --limit 896Mi -- prog 1\n"
        );
        let two = [
            proc_with(7, &[(0, GIB), (1, MIB)]),
            proc_with(8, &[(0, 3 * GIB)]),
        ];
        assert_eq!(peaks(&two), [(0, 3 * GIB), (1, MIB)]);
        let t = measure_text(&two, "x", None);
        assert!(t.contains("pid 8 (prog): GPU 0: peak 3 GiB"), "{t}");
        assert!(t.contains("--limit 0=4Gi,1=1.25Mi "), "{t}");
        assert!(measure_text(&[], "x", None).contains("no figures: no process made a CUDA call"));
        assert!(measure_text(&[proc_with(1, &[])], "x", None).contains("no limit to suggest"));
        assert_eq!(suggestion(&[(0, GIB), (2, GIB)]).as_deref(), Some("1.25Gi"));
    }

    #[test]
    fn quoting() {
        let args = [
            OsString::from("a b"),
            OsString::from("it's"),
            OsString::from("--x=1"),
        ];
        assert_eq!(
            shell_words(OsStr::new("prog"), &args),
            r"prog 'a b' 'it'\''s' --x=1"
        );
    }
}
