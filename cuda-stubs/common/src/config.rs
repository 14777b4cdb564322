//! FAKECUDA_* environment variables (and CUDA_VISIBLE_DEVICES), read once. The fake libcuda
//! and the fake NVML read the same variables through this module.

use std::path::PathBuf;

use crate::identity::{MAX_DEVICES, parse_visible};
use crate::size::parse_size;

#[derive(Debug, Clone)]
pub struct Config {
    /// FAKECUDA_DEVICES: number of devices (default 1).
    pub devices: usize,
    /// FAKECUDA_TOTAL_MEM: memory of each device in bytes (default 80Gi).
    pub total_mem: u64,
    /// FAKECUDA_DRIVER_VERSION: what cuDriverGetVersion reports (default 13050).
    pub driver_version: i32,
    /// FAKECUDA_STATS: where the exit-time stats JSON goes.
    pub stats_path: Option<PathBuf>,
    /// FAKECUDA_SHARED: the shared-memory file that makes processes share the devices.
    pub shared: Option<PathBuf>,
    /// FAKECUDA_CONTEXT_MEM: device memory each context takes (default 0).
    pub context_mem: u64,
    /// FAKECUDA_GREEN_CTX_MEM: device memory a green context (`cuGreenCtxCreate`) takes of
    /// its own, beside the primary context it retains (default 0: what a real driver's
    /// takes is not recorded yet; the driver probe asks).
    pub green_ctx_mem: u64,
    /// FAKECUDA_LIBRARY_MEM: device memory a library (cuLibraryLoadData) takes in a
    /// context when its first kernel is used there, as CUDA's lazy loading does (default 0).
    pub library_mem: u64,
    /// FAKECUDA_FUNCTION_MEM: device memory a module's kernel takes when its function is
    /// first asked for (cuModuleGetFunction: CUDA's lazy loading loads a module's kernels
    /// there, not at the load) (default 0).
    pub function_mem: u64,
    /// FAKECUDA_MIG: each GPU is presented as one MIG instance.
    pub mig: bool,
    /// FAKECUDA_ARENA: freed linear allocations stay mapped and serve the next request
    /// of the same length, so the steady state of an alloc/free loop makes no system
    /// call (for measuring the shim's own time).
    pub arena: bool,
    /// FAKECUDA_NVML_FAIL: every nvmlInit of the fake NVML fails
    /// (NVML_ERROR_DRIVER_NOT_LOADED), as on a machine whose NVML cannot reach the driver.
    pub nvml_fail: bool,
    /// FAKECUDA_NVML_RESERVED: memory NVML shows reserved by the driver on each device,
    /// outside what CUDA sees (default [`DEFAULT_NVML_RESERVED`]).
    pub nvml_reserved: u64,
    /// FAKECUDA_NVML_PID_OFFSET: NVML lists each process under its pid plus this (default
    /// 0), as NVML does in a container, where it reports the host's pids.
    pub nvml_pid_offset: u32,
    /// FAKECUDA_NVML_EXTRA_PROCS: NVML lists this many more compute processes on each
    /// device (default 0), under pids 1 to N (the host's other processes, no offset),
    /// holding nothing the fake counts: for a GPU that runs more processes than a caller's
    /// array holds, and for pids that collide with a containerised process's own.
    pub nvml_extra_procs: u32,
    /// FAKECUDA_GRAPH_NODES_FAIL: `cuGraphGetNodes` fails (`CUDA_ERROR_NOT_SUPPORTED`),
    /// so that a graph's memory nodes cannot be listed; everything else about graphs works.
    pub graph_nodes_fail: bool,
    /// FAKECUDA_NUMA_NODES: host NUMA nodes (1..64, default 1), the ids a host-NUMA
    /// location (`CU_MEM_LOCATION_TYPE_HOST_NUMA`) may name.
    pub numa_nodes: u32,
    /// FAKECUDA_MULTICAST: the devices support multicast objects (`cuMulticastCreate`,
    /// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` 1), as GPUs joined by NVLink switches do;
    /// off (the default), the multicast calls answer `CUDA_ERROR_NOT_SUPPORTED`, as on the
    /// single H100 and H200 recorded.
    pub multicast: bool,
    /// FAKECUDA_STACK_LOWER_FAILS: `cuCtxSetLimit(CU_LIMIT_STACK_SIZE)` to a smaller value
    /// fails (`CUDA_ERROR_UNKNOWN`, the stack kept), so that tests can see what happens when
    /// the driver will not set a limit back.
    pub stack_lower_fails: bool,
    /// FAKECUDA_HEAP_AT_LAUNCH: a malloc heap raised (`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)`,
    /// which takes nothing at the call, as driver 580 answered) is taken at the context's next
    /// kernel launch, direct or a graph's, and kept until the context ends. Off (the
    /// default) the heap takes nothing anywhere: which launch a real driver takes it at is
    /// not recorded (`scripts/gpu/diag/heap-when.py` asks).
    pub heap_at_launch: bool,
    /// FAKECUDA_PRINTF_AT_LAUNCH: a printf FIFO raised (`cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE)`)
    /// takes nothing at the call and is taken at the context's next kernel launch, as the
    /// heap under FAKECUDA_HEAP_AT_LAUNCH. Off (the default) the FIFO takes nothing
    /// anywhere: what a real driver takes for it and when is not recorded yet (the driver
    /// probe's `limit.printf_fifo_64MiB` asks the call).
    pub printf_at_launch: bool,
    /// FAKECUDA_KERNEL_ATTRIBUTE_LOADS: under lazy loading, `cuKernelGetAttribute` and
    /// `cuKernelSetAttribute` on a device whose context is current load the kernel into that
    /// context (as `cuKernelGetFunction` does), as a driver that reads a kernel's attributes
    /// from its loaded code would. Off (the default) they load nothing: what a real driver
    /// does there is not recorded yet (the driver probe's `library.kernel_get_attribute_takes`
    /// asks), so that tests can show what is charged either way.
    pub kernel_attribute_loads: bool,
    /// FAKECUDA_CONTEXT_DELAY_MS: making a context (`cuCtxCreate*`, the first
    /// `cuDevicePrimaryCtxRetain`) takes this long (default 0), its memory taken halfway,
    /// as a real driver takes a while: so that tests can make two processes' contexts
    /// overlap.
    pub context_delay_ms: u64,
    /// FAKECUDA_LIMIT_DELAY_MS: `cuCtxSetLimit` takes this long (default 0), a stack's
    /// memory taken or given back halfway: so that tests can put another process's
    /// traffic inside the call.
    pub limit_delay_ms: u64,
    /// FAKECUDA_LIMIT_HALFWAY: a path; the process's Nth `cuCtxSetLimit` creates
    /// `PATH.N` halfway through (its memory taken or given back, before the second half of
    /// FAKECUDA_LIMIT_DELAY_MS): so that a test can act inside the call.
    pub limit_halfway: Option<PathBuf>,
    /// FAKECUDA_LIMIT_UNTIL: a path; every `cuCtxSetLimit` of the process, once its
    /// memory is taken or given back (after `PATH.N` of FAKECUDA_LIMIT_HALFWAY), waits
    /// until the path exists (at most 60 s) before it returns: so that a test can hold a
    /// call open until another process acted.
    pub limit_until: Option<PathBuf>,
    /// FAKECUDA_LOAD_HALFWAY: a path; the process's Nth module load (`cuModuleLoad*`) or
    /// library load (`cuLibraryLoad*`) creates `PATH.N` once its memory is taken (a
    /// module's globals, and what eager loading loads with it): so that a test can act
    /// inside the call.
    pub load_halfway: Option<PathBuf>,
    /// FAKECUDA_LOAD_UNTIL: a path; every module or library load of the process, once its
    /// memory is taken (after `PATH.N` of FAKECUDA_LOAD_HALFWAY), waits until the path
    /// exists (at most 60 s) before it returns: so that a test can hold a load open until
    /// another process acted.
    pub load_until: Option<PathBuf>,
    /// CUDA_MODULE_LOADING=EAGER (any case): modules and libraries are loaded eagerly, as
    /// the driver does then: a module's kernels with the module, a library into every
    /// context at its load and into each context made later at its creation. Otherwise
    /// lazily (CUDA's default since 12.2): at each kernel's first use in a context.
    pub eager: bool,
    /// FAKECUDA_CAPTURE_UNSAFE: entry points (comma-separated, of those the fake checks:
    /// `cuMemGetInfo_v2`, `cuCtxSynchronize`) that a stream capture forbids
    /// as "potentially unsafe" (`cuThreadExchangeStreamCaptureMode`'s documentation): made by
    /// a thread not in relaxed mode while a capture forbids it, such a call answers
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates that capture. Empty (the
    /// default): nothing is refused, as no recorded answer shows which calls a real driver
    /// forbids; `scripts/gpu/diag/capture-lazy.py` asks one.
    pub capture_unsafe: Vec<String>,
    /// CUDA_VISIBLE_DEVICES: the physical device of each CUDA ordinal.
    pub visible: Vec<usize>,
}

/// A 0/1 variable (unset or empty: 0).
fn flag(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<bool, String> {
    match var(name).as_deref().map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("invalid {name}={v:?}: expected 0 or 1")),
    }
}

/// A delay in milliseconds, 0 to 60000 (unset: 0).
fn delay_ms(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<u64, String> {
    match var(name) {
        None => Ok(0),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&ms| ms <= 60_000)
            .ok_or_else(|| format!("invalid {name}={v:?}: expected 0 to 60000 (milliseconds)")),
    }
}

pub const DEFAULT_TOTAL_MEM: u64 = 80 << 30;
/// The most FAKECUDA_NVML_EXTRA_PROCS lists.
pub const MAX_EXTRA_PROCS: u32 = 100_000;
/// CUDA 13.5, the version of the headers src/procaddr_table.txt was generated from (the
/// newest CUDA the tests use).
pub const DEFAULT_DRIVER_VERSION: i32 = 13050;
/// What NVML reported reserved on an H200 with driver 580.159.04
/// (tests/driver-answers/h200-580.159.04.json): NVML's total is `cuDeviceTotalMem` plus
/// this, and v1's `used` includes it.
pub const DEFAULT_NVML_RESERVED: u64 = 644_939_776;

static CONFIG: std::sync::OnceLock<Result<Config, String>> = std::sync::OnceLock::new();

/// The configuration, or the message naming the invalid variable.
pub fn get() -> Result<&'static Config, &'static str> {
    CONFIG
        .get_or_init(|| from_env(|k| std::env::var(k).ok()))
        .as_ref()
        .map_err(|e| e.as_str())
}

/// Where FAKECUDA_SHARED=`value` keeps its state: a value with a `/` is the file's path,
/// any other is a name, `/dev/shm/fakecuda-NAME`.
pub fn shared_path(value: &str) -> Result<PathBuf, String> {
    if value.contains('/') {
        return Ok(PathBuf::from(value));
    }
    let ok = !value.is_empty()
        && value.len() <= 200
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !ok {
        return Err(format!(
            "invalid FAKECUDA_SHARED={value:?}: expected a name of letters, digits, '.', '_' and '-', or a file path"
        ));
    }
    Ok(PathBuf::from(format!("/dev/shm/fakecuda-{value}")))
}

pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let devices = match var("FAKECUDA_DEVICES") {
        None => 1,
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_DEVICES)
            .ok_or_else(|| {
                format!("invalid FAKECUDA_DEVICES={v:?}: expected a whole number from 0 to {MAX_DEVICES}")
            })?,
    };
    let total_mem = match var("FAKECUDA_TOTAL_MEM") {
        None => DEFAULT_TOTAL_MEM,
        Some(v) => {
            parse_size(v.trim()).map_err(|e| format!("invalid FAKECUDA_TOTAL_MEM={v:?}: {e}"))?
        }
    };
    let driver_version = match var("FAKECUDA_DRIVER_VERSION") {
        None => DEFAULT_DRIVER_VERSION,
        Some(v) => v
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|&n| n >= 2000)
            .ok_or_else(|| {
                format!("invalid FAKECUDA_DRIVER_VERSION={v:?}: expected a CUDA version number like 13050")
            })?,
    };
    let stats_path = var("FAKECUDA_STATS")
        .filter(|v| !v.is_empty())
        .map(Into::into);
    let shared = match var("FAKECUDA_SHARED").filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => Some(shared_path(&v)?),
    };
    let context_mem = match var("FAKECUDA_CONTEXT_MEM") {
        None => 0,
        Some(v) => {
            parse_size(v.trim()).map_err(|e| format!("invalid FAKECUDA_CONTEXT_MEM={v:?}: {e}"))?
        }
    };
    let green_ctx_mem = match var("FAKECUDA_GREEN_CTX_MEM") {
        None => 0,
        Some(v) => parse_size(v.trim())
            .map_err(|e| format!("invalid FAKECUDA_GREEN_CTX_MEM={v:?}: {e}"))?,
    };
    let library_mem = match var("FAKECUDA_LIBRARY_MEM") {
        None => 0,
        Some(v) => {
            parse_size(v.trim()).map_err(|e| format!("invalid FAKECUDA_LIBRARY_MEM={v:?}: {e}"))?
        }
    };
    let function_mem = match var("FAKECUDA_FUNCTION_MEM") {
        None => 0,
        Some(v) => {
            parse_size(v.trim()).map_err(|e| format!("invalid FAKECUDA_FUNCTION_MEM={v:?}: {e}"))?
        }
    };
    let mig = match var("FAKECUDA_MIG").as_deref().map(str::trim) {
        None | Some("" | "0") => false,
        Some("1") => true,
        Some(v) => return Err(format!("invalid FAKECUDA_MIG={v:?}: expected 0 or 1")),
    };
    let arena = match var("FAKECUDA_ARENA").as_deref().map(str::trim) {
        None | Some("" | "0") => false,
        Some("1") => true,
        Some(v) => return Err(format!("invalid FAKECUDA_ARENA={v:?}: expected 0 or 1")),
    };
    let nvml_fail = match var("FAKECUDA_NVML_FAIL").as_deref().map(str::trim) {
        None | Some("" | "0") => false,
        Some("1") => true,
        Some(v) => return Err(format!("invalid FAKECUDA_NVML_FAIL={v:?}: expected 0 or 1")),
    };
    let nvml_reserved = match var("FAKECUDA_NVML_RESERVED") {
        None => DEFAULT_NVML_RESERVED,
        Some(v) => parse_size(v.trim())
            .map_err(|e| format!("invalid FAKECUDA_NVML_RESERVED={v:?}: {e}"))?,
    };
    let nvml_pid_offset = match var("FAKECUDA_NVML_PID_OFFSET") {
        None => 0,
        Some(v) => v.trim().parse::<u32>().map_err(|_| {
            format!(
                "invalid FAKECUDA_NVML_PID_OFFSET={v:?}: expected a whole number (0 to 4294967295)"
            )
        })?,
    };
    let nvml_extra_procs = match var("FAKECUDA_NVML_EXTRA_PROCS") {
        None => 0,
        Some(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n <= MAX_EXTRA_PROCS)
            .ok_or_else(|| {
                format!(
                    "invalid FAKECUDA_NVML_EXTRA_PROCS={v:?}: expected a whole number (0 to {MAX_EXTRA_PROCS})"
                )
            })?,
    };
    let graph_nodes_fail = flag(&var, "FAKECUDA_GRAPH_NODES_FAIL")?;
    let numa_nodes = match var("FAKECUDA_NUMA_NODES") {
        None => 1,
        Some(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| format!("invalid FAKECUDA_NUMA_NODES={v:?}: expected 1 to 64"))?,
    };
    let multicast = flag(&var, "FAKECUDA_MULTICAST")?;
    let stack_lower_fails = flag(&var, "FAKECUDA_STACK_LOWER_FAILS")?;
    let heap_at_launch = flag(&var, "FAKECUDA_HEAP_AT_LAUNCH")?;
    let printf_at_launch = flag(&var, "FAKECUDA_PRINTF_AT_LAUNCH")?;
    let kernel_attribute_loads = flag(&var, "FAKECUDA_KERNEL_ATTRIBUTE_LOADS")?;
    let context_delay_ms = delay_ms(&var, "FAKECUDA_CONTEXT_DELAY_MS")?;
    let limit_delay_ms = delay_ms(&var, "FAKECUDA_LIMIT_DELAY_MS")?;
    let limit_halfway = var("FAKECUDA_LIMIT_HALFWAY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let limit_until = var("FAKECUDA_LIMIT_UNTIL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let load_halfway = var("FAKECUDA_LOAD_HALFWAY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let load_until = var("FAKECUDA_LOAD_UNTIL")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let eager = var("CUDA_MODULE_LOADING").is_some_and(|v| v.trim().eq_ignore_ascii_case("EAGER"));
    let capture_unsafe = parse_capture_unsafe(var("FAKECUDA_CAPTURE_UNSAFE").as_deref())?;
    let visible = parse_visible(var("CUDA_VISIBLE_DEVICES").as_deref(), devices, mig);
    Ok(Config {
        devices,
        total_mem,
        driver_version,
        stats_path,
        shared,
        context_mem,
        green_ctx_mem,
        library_mem,
        function_mem,
        mig,
        arena,
        nvml_fail,
        nvml_reserved,
        nvml_pid_offset,
        nvml_extra_procs,
        graph_nodes_fail,
        numa_nodes,
        multicast,
        stack_lower_fails,
        heap_at_launch,
        printf_at_launch,
        kernel_attribute_loads,
        context_delay_ms,
        limit_delay_ms,
        limit_halfway,
        limit_until,
        load_halfway,
        load_until,
        eager,
        capture_unsafe,
        visible,
    })
}

/// The entry points the fake can refuse during a capture (FAKECUDA_CAPTURE_UNSAFE).
pub const CAPTURE_CHECKED: [&str; 2] = ["cuMemGetInfo_v2", "cuCtxSynchronize"];

/// FAKECUDA_CAPTURE_UNSAFE: names among [`CAPTURE_CHECKED`], comma-separated.
fn parse_capture_unsafe(v: Option<&str>) -> Result<Vec<String>, String> {
    let names = v
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty());
    names
        .map(|n| {
            CAPTURE_CHECKED
                .contains(&n)
                .then(|| n.to_string())
                .ok_or_else(|| {
                    format!(
                        "invalid FAKECUDA_CAPTURE_UNSAFE entry {n:?}: expected some of {}",
                        CAPTURE_CHECKED.join(", ")
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn defaults() {
        let c = from_env(env(&[])).unwrap();
        assert_eq!(
            (c.devices, c.total_mem, c.driver_version),
            (1, 80 << 30, 13050)
        );
        assert!(c.stats_path.is_none());
        assert!(c.shared.is_none() && !c.mig);
        assert_eq!((c.context_mem, c.visible.clone()), (0, vec![0]));
        assert_eq!(c.nvml_reserved, 644_939_776, "an H200's, driver 580");
        assert_eq!(c.nvml_pid_offset, 0);
        assert_eq!(c.numa_nodes, 1);
        assert!(
            !c.multicast
                && !c.stack_lower_fails
                && !c.heap_at_launch
                && !c.printf_at_launch
                && !c.kernel_attribute_loads,
            "off unless asked"
        );
        let c = from_env(env(&[
            ("FAKECUDA_MULTICAST", "1"),
            ("FAKECUDA_STACK_LOWER_FAILS", "1"),
            ("FAKECUDA_HEAP_AT_LAUNCH", "1"),
            ("FAKECUDA_PRINTF_AT_LAUNCH", "1"),
            ("FAKECUDA_KERNEL_ATTRIBUTE_LOADS", "1"),
        ]))
        .unwrap();
        assert!(c.multicast && c.stack_lower_fails && c.heap_at_launch && c.printf_at_launch);
        assert!(c.kernel_attribute_loads);
        let e = from_env(env(&[("FAKECUDA_MULTICAST", "yes")]))
            .err()
            .unwrap();
        assert!(
            e.contains("FAKECUDA_MULTICAST=\"yes\": expected 0 or 1"),
            "{e}"
        );
        assert_eq!((c.nvml_extra_procs, c.graph_nodes_fail), (0, false));
        let c = from_env(env(&[
            ("FAKECUDA_NVML_EXTRA_PROCS", "100"),
            ("FAKECUDA_GRAPH_NODES_FAIL", "1"),
        ]))
        .unwrap();
        assert_eq!((c.nvml_extra_procs, c.graph_nodes_fail), (100, true));
        for bad in ["-1", "many", "100001"] {
            let e = from_env(env(&[("FAKECUDA_NVML_EXTRA_PROCS", bad)]))
                .err()
                .unwrap();
            assert!(
                e.contains("FAKECUDA_NVML_EXTRA_PROCS") && e.contains("0 to 100000"),
                "{e}"
            );
        }
        let c = from_env(env(&[("FAKECUDA_NVML_PID_OFFSET", "100000")])).unwrap();
        assert_eq!(c.nvml_pid_offset, 100_000);
        let e = from_env(env(&[("FAKECUDA_NVML_PID_OFFSET", "-1")]))
            .err()
            .unwrap();
        assert!(e.contains("FAKECUDA_NVML_PID_OFFSET"), "{e}");
    }

    #[test]
    fn shared_mig_context_and_visible() {
        let c = from_env(env(&[
            ("FAKECUDA_DEVICES", "3"),
            ("FAKECUDA_SHARED", "job-1"),
            ("FAKECUDA_CONTEXT_MEM", "300Mi"),
            ("FAKECUDA_MIG", "1"),
            (
                "CUDA_VISIBLE_DEVICES",
                "2,MIG-face0001-0000-0000-0000-000000000000,7,1",
            ),
        ]))
        .unwrap();
        assert_eq!(
            c.shared.as_deref(),
            Some(std::path::Path::new("/dev/shm/fakecuda-job-1"))
        );
        assert_eq!((c.context_mem, c.mig), (300 << 20, true));
        assert!(!c.arena, "off unless asked");
        assert!(!c.nvml_fail, "off unless asked");
        assert!(
            from_env(env(&[("FAKECUDA_NVML_FAIL", "1")]))
                .unwrap()
                .nvml_fail
        );
        assert_eq!(c.visible, vec![2, 0]);
        let c = from_env(env(&[("FAKECUDA_SHARED", "/tmp/x/state")])).unwrap();
        assert_eq!(
            c.shared.as_deref(),
            Some(std::path::Path::new("/tmp/x/state"))
        );
    }

    #[test]
    fn parses_values() {
        let c = from_env(env(&[
            ("FAKECUDA_DEVICES", "4"),
            ("FAKECUDA_TOTAL_MEM", "1.5Gi"),
            ("FAKECUDA_DRIVER_VERSION", "13000"),
            ("FAKECUDA_NVML_RESERVED", "0"),
            ("FAKECUDA_LIBRARY_MEM", "92Mi"),
            ("FAKECUDA_FUNCTION_MEM", "2Mi"),
        ]))
        .unwrap();
        assert_eq!(
            (c.devices, c.total_mem, c.driver_version, c.nvml_reserved),
            (4, 3 << 29, 13000, 0)
        );
        assert_eq!((c.library_mem, c.function_mem), (92 << 20, 2 << 20));
        let c = from_env(env(&[("FAKECUDA_NUMA_NODES", "2")])).unwrap();
        assert_eq!(c.numa_nodes, 2);
        assert!(
            !c.eager,
            "lazy loading unless CUDA_MODULE_LOADING says EAGER"
        );
        for (v, eager) in [
            ("EAGER", true),
            ("eager", true),
            ("LAZY", false),
            ("", false),
        ] {
            let c = from_env(env(&[("CUDA_MODULE_LOADING", v)])).unwrap();
            assert_eq!(c.eager, eager, "CUDA_MODULE_LOADING={v}");
        }
        assert_eq!(
            from_env(env(&[])).unwrap().library_mem,
            0,
            "none unless asked"
        );
        assert!(from_env(env(&[])).unwrap().capture_unsafe.is_empty());
        let c = from_env(env(&[(
            "FAKECUDA_CAPTURE_UNSAFE",
            " cuMemGetInfo_v2, cuCtxSynchronize,",
        )]))
        .unwrap();
        assert_eq!(c.capture_unsafe, ["cuMemGetInfo_v2", "cuCtxSynchronize"]);
        let e = from_env(env(&[("FAKECUDA_CAPTURE_UNSAFE", "cuMemAlloc_v2")]))
            .err()
            .unwrap();
        assert!(
            e.contains("FAKECUDA_CAPTURE_UNSAFE")
                && e.contains("cuMemGetInfo_v2, cuCtxSynchronize"),
            "{e}"
        );
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for (k, v) in [
            ("FAKECUDA_DEVICES", "x"),
            ("FAKECUDA_TOTAL_MEM", "lots"),
            ("FAKECUDA_DRIVER_VERSION", "12.8"),
            ("FAKECUDA_SHARED", "a b"),
            ("FAKECUDA_CONTEXT_MEM", "-1"),
            ("FAKECUDA_LIBRARY_MEM", "much"),
            ("FAKECUDA_FUNCTION_MEM", "some"),
            ("FAKECUDA_MIG", "yes"),
            ("FAKECUDA_NVML_FAIL", "yes"),
            ("FAKECUDA_NVML_RESERVED", "some"),
            ("FAKECUDA_NUMA_NODES", "0"),
            ("FAKECUDA_NUMA_NODES", "65"),
        ] {
            let err = from_env(env(&[(k, v)])).unwrap_err();
            assert!(err.contains(k), "{err}");
        }
    }
}
