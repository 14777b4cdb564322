//! End to end with real, unmodified CUDA clients on the fake GPU:
//!
//! * `cudarc-client` (tests/cudarc-client): cudarc's safe driver API;
//! * `bindings_client.py` (tests/clients) under NVIDIA's cuda-bindings 12.x and 13.x,
//!   which resolve every driver entry point through `cuGetProcAddress_v2`.
//!
//! Each scenario runs the client with `LD_PRELOAD=libgpucap.so` and checks what the
//! program saw (memory info, which allocations succeeded, data read back), what the
//! shim said on stderr, and what the fake driver recorded (peak use never above the
//! cap). A control run without the shim shows the same allocations succeed, so these
//! tests fail if the shim does nothing.
//!
//! The Python interpreters come from `GPUCAP_TEST_PYTHON_CB12` / `GPUCAP_TEST_PYTHON_CB13`
//! (scripts/test.sh creates the virtual environments). When one is unset the test
//! prints `SKIP: ...` and passes, unless `GPUCAP_TEST_REQUIRE_CLIENTS=1`.

use super::common;

use common::*;
use std::process::{Command, Output};

const CAP_LINE_512: &str = "of 600 MiB on GPU 0: 512 MiB of the 1 GiB cap in use";
const OOM: &str = "CUDA_ERROR_OUT_OF_MEMORY";

#[derive(Clone, Copy, Debug)]
enum Client {
    Cudarc,
    Bindings12,
    Bindings13,
}

impl Client {
    /// The names the shim may give a plain allocation by this client: cudarc uses
    /// stream-ordered allocation when the device supports memory pools.
    fn alloc_apis(self) -> &'static [&'static str] {
        match self {
            Client::Cudarc => &["cuMemAlloc", "cuMemAllocAsync"],
            Client::Bindings12 | Client::Bindings13 => &["cuMemAlloc"],
        }
    }

    /// The command that runs this client, or `None` (after printing SKIP) when its
    /// interpreter is not configured.
    fn command(self, stats: &std::path::Path) -> Option<Command> {
        let (var, what) = match self {
            Client::Cudarc => return Some(fake_cmd(cudarc_client(), stats)),
            Client::Bindings12 => ("GPUCAP_TEST_PYTHON_CB12", "cuda-bindings 12.x"),
            Client::Bindings13 => ("GPUCAP_TEST_PYTHON_CB13", "cuda-bindings 13.x"),
        };
        let python = client_python(var, what)?;
        let mut cmd = fake_cmd(python, stats);
        cmd.arg(root().join("tests/clients/bindings_client.py"))
            .env("PYTHONDONTWRITEBYTECODE", "1");
        Some(cmd)
    }
}

/// One run of a client: what it printed, and the fake driver's statistics.
struct Run {
    out: Output,
    report: ClientReport,
    stats: Vec<DevStats>,
    stderr: String,
}

impl Run {
    /// A description of the run for assertion messages.
    fn dump(&self) -> String {
        format!(
            "status {:?}\n--- stdout\n{}--- stderr\n{}",
            self.out.status,
            stdout(&self.out),
            self.stderr
        )
    }
}

/// Runs `client` with `steps` on a fake GPU of `fake_total`, under the shim with
/// `GPUCAP_LIMIT=limit` when `limit` is given (without the shim otherwise).
fn run_client(
    client: Client,
    limit: Option<&str>,
    fake_total: &str,
    steps: &[&str],
) -> Option<Run> {
    let dir = scratch(&format!("{client:?}").to_lowercase());
    let stats_path = dir.join("stats.json");
    let mut cmd = client.command(&stats_path)?;
    cmd.args(steps).env("FAKECUDA_TOTAL_MEM", fake_total);
    if let Some(limit) = limit {
        preload(&mut cmd).env("GPUCAP_LIMIT", limit);
    }
    let out = run(&mut cmd);
    let report = ClientReport::parse(&stdout(&out));
    let stderr = stderr(&out);
    let stats = if stats_path.exists() {
        read_stats(&stats_path)
    } else {
        Vec::new()
    };
    Some(Run {
        out,
        report,
        stats,
        stderr,
    })
}

#[track_caller]
fn assert_ran(r: &Run) {
    assert!(
        r.out.status.success() && r.report.done,
        "the client did not run to its end:\n{}",
        r.dump()
    );
}

/// Exactly the expected refusal lines, in order; `apis[i]` lists the API names the
/// i-th line may carry.
#[track_caller]
fn assert_refusals(r: &Run, expected: &[(&[&str], &str)]) {
    // Nothing else from gpucap: a warning here (an entry point it does not recognise,
    // say) would greet every user of this client.
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.starts_with("gpucap"))
        .collect();
    let got = refusals(&r.stderr);
    assert_eq!(
        said,
        got,
        "gpucap said more than its refusals:\n{}",
        r.dump()
    );
    assert_eq!(
        got.len(),
        expected.len(),
        "refusal lines on stderr:\n{}",
        r.dump()
    );
    for (line, (apis, tail)) in got.iter().zip(expected) {
        let ok = apis
            .iter()
            .any(|api| *line == format!("gpucap: refused {api} {tail}"));
        assert!(
            ok,
            "refusal line {line:?}, expected `gpucap: refused {apis:?} {tail}`\n{}",
            r.dump()
        );
    }
}

#[track_caller]
fn assert_peak_within(r: &Run, cap: u64, at_least: u64) {
    let dev = r
        .stats
        .first()
        .unwrap_or_else(|| panic!("no fake driver stats\n{}", r.dump()));
    assert!(
        dev.peak_used <= cap,
        "the device held {} bytes at its peak, over the {cap} cap\n{}",
        dev.peak_used,
        r.dump()
    );
    assert!(
        dev.peak_used >= at_least,
        "the device peaked at {} bytes, less than the {at_least} the client held\n{}",
        dev.peak_used,
        r.dump()
    );
}

// --- scenarios ---------------------------------------------------------------------

/// 1 GiB cap on a 4 GiB device: two 256 MiB allocations succeed and carry data, a
/// 600 MiB one is refused with CUDA_ERROR_OUT_OF_MEMORY and one stderr line, a later
/// 256 MiB one still fits; the program sees a 1 GiB device.
fn caps_allocations(client: Client) {
    let Some(r) = run_client(client, Some("1Gi"), "4Gi", &["256", "256", "600", "256"]) else {
        return;
    };
    assert_ran(&r);
    assert_eq!(
        r.report.outcomes(),
        ["256 ok", "256 ok", &format!("600 {OOM}"), "256 ok"],
        "{}",
        r.dump()
    );
    assert_refusals(&r, &[(client.alloc_apis(), CAP_LINE_512)]);
    assert_eq!(
        r.report.total_mem,
        Some(GIB),
        "cuDeviceTotalMem\n{}",
        r.dump()
    );
    assert_eq!(
        r.report.mem_info.first(),
        Some(&(GIB, GIB)),
        "cuMemGetInfo before\n{}",
        r.dump()
    );
    assert_eq!(
        r.report.mem_info.last(),
        Some(&(256 * MIB, GIB)),
        "cuMemGetInfo with 768 MiB held\n{}",
        r.dump()
    );
    assert_peak_within(&r, GIB, 768 * MIB);
}

/// The same program without the shim: the 600 MiB allocation succeeds and the program
/// sees the whole device, so the refusal above is the shim's doing.
fn control_without_shim(client: Client) {
    let Some(r) = run_client(client, None, "4Gi", &["256", "256", "600", "256"]) else {
        return;
    };
    assert_ran(&r);
    assert_eq!(
        r.report.outcomes(),
        ["256 ok", "256 ok", "600 ok", "256 ok"],
        "{}",
        r.dump()
    );
    assert!(refusals(&r.stderr).is_empty(), "{}", r.dump());
    assert_eq!(r.report.total_mem, Some(4 * GIB), "{}", r.dump());
    assert_eq!(
        r.report.mem_info.first(),
        Some(&(4 * GIB, 4 * GIB)),
        "{}",
        r.dump()
    );
    assert_peak_within(&r, 4 * GIB, 1368 * MIB);
}

/// Freeing credits the cap: 600 MiB, a second 600 MiB refused, free, 600 MiB again.
fn free_credits_cap(client: Client) {
    let Some(r) = run_client(client, Some("1Gi"), "4Gi", &["600", "600", "free", "600"]) else {
        return;
    };
    assert_ran(&r);
    assert_eq!(
        r.report.outcomes(),
        ["600 ok", &format!("600 {OOM}"), "600 ok"],
        "{}",
        r.dump()
    );
    assert_refusals(
        &r,
        &[(
            client.alloc_apis(),
            "of 600 MiB on GPU 0: 600 MiB of the 1 GiB cap in use",
        )],
    );
    assert_peak_within(&r, GIB, 600 * MIB);
}

/// A percentage of the physical memory: 25% of 4 GiB is 1 GiB.
fn percent_limit(client: Client) {
    let Some(r) = run_client(client, Some("25%"), "4Gi", &["1000", "100"]) else {
        return;
    };
    assert_ran(&r);
    assert_eq!(
        r.report.outcomes(),
        ["1000 ok", &format!("100 {OOM}")],
        "{}",
        r.dump()
    );
    assert_eq!(r.report.total_mem, Some(GIB), "{}", r.dump());
    assert_eq!(
        r.report.mem_info.first().map(|m| m.1),
        Some(GIB),
        "{}",
        r.dump()
    );
    assert_peak_within(&r, GIB, 1000 * MIB);
}

/// A cap larger than the device changes nothing: the program sees the physical
/// total, and the device itself runs out (no gpucap refusal line).
fn cap_above_physical(client: Client) {
    let Some(r) = run_client(client, Some("8Gi"), "1Gi", &["600", "600"]) else {
        return;
    };
    assert_ran(&r);
    assert_eq!(r.report.total_mem, Some(GIB), "{}", r.dump());
    assert_eq!(r.report.mem_info.first(), Some(&(GIB, GIB)), "{}", r.dump());
    assert_eq!(
        r.report.outcomes(),
        ["600 ok", &format!("600 {OOM}")],
        "{}",
        r.dump()
    );
    assert!(
        refusals(&r.stderr).is_empty(),
        "the device, not gpucap, refused\n{}",
        r.dump()
    );
    // Free memory is the device's own, not the (larger) room left under the cap.
    assert_eq!(
        r.report.mem_info.last(),
        Some(&(GIB - 600 * MIB, GIB)),
        "{}",
        r.dump()
    );
}

/// `GPUCAP_LOG=off`: the cap still holds, and the shim prints nothing.
fn log_off_is_silent(client: Client) {
    let Some(mut cmd) = client.command(&scratch("log-off").join("stats.json")) else {
        return;
    };
    preload(&mut cmd)
        .args(["600", "600"])
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_LOG", "off");
    let out = run(&mut cmd);
    assert_ok(&out);
    let report = ClientReport::parse(&stdout(&out));
    assert_eq!(
        report.outcomes(),
        ["600 ok", &format!("600 {OOM}")],
        "{}",
        stdout(&out)
    );
    assert!(
        !stderr(&out).contains("gpucap"),
        "stderr:\n{}",
        stderr(&out)
    );
}

/// An invalid GPUCAP_LIMIT stops the program at cuInit with CUDA_ERROR_NOT_PERMITTED
/// and says why on stderr; nothing reaches the device.
fn invalid_limit(client: Client) {
    let Some(r) = run_client(client, Some("abc"), "4Gi", &["256"]) else {
        return;
    };
    assert_eq!(r.out.status.code(), Some(3), "{}", r.dump());
    assert_eq!(
        r.report.init_err.as_deref(),
        Some("CUDA_ERROR_NOT_PERMITTED"),
        "{}",
        r.dump()
    );
    assert!(
        r.stderr
            .lines()
            .any(|l| l.starts_with("gpucap: invalid GPUCAP_LIMIT") && l.contains("abc")),
        "no `gpucap: invalid GPUCAP_LIMIT ... abc` line\n{}",
        r.dump()
    );
    if let Some(dev) = r.stats.first() {
        assert_eq!(dev.alloc_calls, 0, "{}", r.dump());
    }
}

/// Stream-ordered allocation (cuMemAllocAsync on a created stream) is counted with
/// the plain allocations, and refused with its own name.
fn async_allocations(client: Client) {
    let Some(r) = run_client(
        client,
        Some("1Gi"),
        "4Gi",
        &["256", "async:256", "async:600", "600", "free", "async:600"],
    ) else {
        return;
    };
    assert_ran(&r);
    let kinds: Vec<&str> = r.report.allocs.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "alloc",
            "alloc_async",
            "alloc_async",
            "alloc",
            "alloc_async"
        ],
        "{}",
        r.dump()
    );
    assert_eq!(
        r.report.outcomes(),
        [
            "256 ok",
            "256 ok",
            &format!("600 {OOM}"),
            &format!("600 {OOM}"),
            "600 ok"
        ],
        "{}",
        r.dump()
    );
    assert_refusals(
        &r,
        &[
            (&["cuMemAllocAsync"], CAP_LINE_512),
            (&["cuMemAlloc"], CAP_LINE_512),
        ],
    );
    assert_peak_within(&r, GIB, 856 * MIB);
}

/// Contexts made and ended in a loop through the client's own bindings, each holding
/// a live 64 MiB block when it ends (cuCtxDetach, cuCtxAttach + two cuCtxDetach,
/// cuCtxDestroy, the primary's release and reset): 100 rounds under a 1 GiB cap, each
/// giving back to `cuMemGetInfo` the free memory of the start.
fn contexts_end_in_a_loop(client: Client) {
    let var = match client {
        Client::Bindings12 => "GPUCAP_TEST_PYTHON_CB12",
        Client::Bindings13 => "GPUCAP_TEST_PYTHON_CB13",
        Client::Cudarc => unreachable!("cudarc-client does not manage contexts"),
    };
    let Some(python) = client_python(var, "cuda-bindings") else {
        return;
    };
    for how in ["detach", "attach", "destroy", "release", "reset"] {
        let stats = scratch(&format!("ctx-client-{how}")).join("stats.json");
        let mut cmd = fake_cmd(&python, &stats);
        cmd.arg(root().join("tests/clients/context_client.py"))
            .args([how, "100", "64"])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("FAKECUDA_TOTAL_MEM", "8Gi")
            .env("FAKECUDA_CONTEXT_MEM", "32Mi");
        preload(&mut cmd).env("GPUCAP_LIMIT", "1Gi");
        let o = run(&mut cmd);
        let out = stdout(&o);
        let what = format!("{client:?} {how}");
        assert!(
            o.status.success() && out.contains("done"),
            "{what}:\n{}",
            dump(&o)
        );
        let field = |line: &str, key: &str| -> u64 {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what}: no {key} in {line:?}"))
        };
        let start = out.lines().find(|l| l.starts_with("start ")).unwrap();
        assert_eq!(field(start, "total="), GIB, "{what}: {start}");
        let start = field(start, "free=");
        let rounds: Vec<u64> = out
            .lines()
            .filter(|l| l.starts_with("round ") && !l.contains("attached"))
            .map(|l| field(l, "free="))
            .collect();
        assert_eq!(rounds.len(), 100, "{what}:\n{}", dump(&o));
        assert!(
            rounds.iter().all(|&f| f == start),
            "{what}: free after each round, expected {start} every time: {rounds:?}"
        );
        if how == "attach" {
            // Between the two detaches the context, and its block, still count.
            let held: Vec<u64> = out
                .lines()
                .filter(|l| l.contains("attached"))
                .map(|l| field(l, "free="))
                .collect();
            assert!(
                held.len() == 100 && held.iter().all(|&f| f == start - 32 * MIB - 64 * MIB),
                "{what}: free while attached: {held:?}"
            );
        }
        let s = &read_stats(&stats)[0];
        assert!(s.peak_used <= GIB, "{what}: {s:?}");
        assert_eq!(s.final_used, 0, "{what}: {s:?}");
    }
}

macro_rules! client_tests {
    ($module:ident, $client:expr, [$($scenario:ident),*]) => {
        mod $module {
            $(
                #[test]
                fn $scenario() {
                    super::$scenario($client)
                }
            )*
        }
    };
}

client_tests!(
    cudarc,
    super::Client::Cudarc,
    [
        caps_allocations,
        control_without_shim,
        free_credits_cap,
        percent_limit,
        cap_above_physical,
        invalid_limit,
        log_off_is_silent
    ]
);
client_tests!(
    bindings12,
    super::Client::Bindings12,
    [
        caps_allocations,
        control_without_shim,
        free_credits_cap,
        percent_limit,
        cap_above_physical,
        invalid_limit,
        async_allocations,
        contexts_end_in_a_loop
    ]
);
client_tests!(
    bindings13,
    super::Client::Bindings13,
    [
        caps_allocations,
        control_without_shim,
        free_credits_cap,
        percent_limit,
        cap_above_physical,
        invalid_limit,
        async_allocations,
        contexts_end_in_a_loop
    ]
);
