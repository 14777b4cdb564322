//! NVML tools, unmodified from their pip wheels, on the fake GPU's NVML: `gpustat --json`
//! and `nvitop -1` (one shot), both over `nvidia-ml-py`. A process of a pool holds
//! 300 MiB of a shared fake GPU of 8 GiB; without gpucap the tools show the whole GPU,
//! under gpucap (the pool, or a cap alone) they show the cap as the GPU's memory, the
//! pool's use as its used memory and the holder among its processes: what an operator
//! running `nvitop` inside a capped container sees.
//!
//! The tools come from the virtual environment whose Python is
//! `GPUCAP_TEST_PYTHON_NVML_TOOLS` (scripts/test.sh creates target/venv-nvml-tools, pinned);
//! the console scripts lie beside it. When that is unset the tests print SKIP and pass,
//! unless `GPUCAP_TEST_REQUIRE_CLIENTS=1` or `CI` is set, when they fail.

use super::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use serde_json::Value;

/// The venv's `bin` folder, or None (skipped).
fn tools() -> Option<PathBuf> {
    let python = client_python("GPUCAP_TEST_PYTHON_NVML_TOOLS", "gpustat and nvitop")?;
    Some(python.parent().expect("the venv's bin").to_path_buf())
}

/// A fake GPU of 8 GiB shared by the processes of `dir`, with a pool directory there.
struct Gpu {
    dir: PathBuf,
}

impl Gpu {
    fn new(tag: &str) -> Gpu {
        fake_nvml();
        let dir = scratch(tag);
        std::fs::create_dir_all(dir.join("pools")).unwrap();
        Gpu { dir }
    }

    /// `program` on this GPU; `gpucap`: the shim preloaded with these variables.
    fn cmd(&self, program: &Path, gpucap: Option<&[(&str, &str)]>) -> Command {
        let mut c = fake_cmd(program, &self.dir.join("stats.json"));
        c.env("FAKECUDA_TOTAL_MEM", "8Gi")
            .env("FAKECUDA_SHARED", self.dir.join("fake-gpu"))
            .env("TERM", "dumb")
            .env("HOME", &self.dir);
        if let Some(vars) = gpucap {
            preload(&mut c);
            c.env("GPUCAP_POOL_DIR", self.dir.join("pools"));
            for (k, v) in vars {
                c.env(k, v);
            }
        }
        c
    }

    /// A pool member holding 300 MiB until dropped.
    fn holder(&self) -> Holder {
        let script = compile_c("script", "", &["-lcuda"]);
        let (ready, go) = (self.dir.join("held"), self.dir.join("go"));
        let mut child = self
            .cmd(&script, Some(&POOL))
            .args(["alloc:300Mi"])
            .arg(format!("touch:{}", ready.display()))
            .arg(format!("wait:{}", go.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the holder");
        wait_ready(&mut child, &ready, "the holder");
        Holder { child, go }
    }
}

const POOL: [(&str, &str); 2] = [("GPUCAP_POOL", "tools"), ("GPUCAP_LIMIT", "2Gi")];

struct Holder {
    child: std::process::Child,
    go: PathBuf,
}

impl Holder {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.go, "");
        let _ = self.child.wait();
    }
}

/// `gpustat --json`'s GPU 0.
fn gpustat(gpu: &Gpu, bin: &Path, gpucap: Option<&[(&str, &str)]>) -> Value {
    let o = run(gpu.cmd(&bin.join("gpustat"), gpucap).arg("--json"));
    assert_ok(&o);
    let v: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("gpustat --json is not JSON ({e})\n{}", dump(&o)));
    v["gpus"][0].clone()
}

/// The holder's memory in `gpustat`'s processes of a GPU, in MiB.
fn listed(g: &Value, pid: u32) -> Option<u64> {
    g["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
        .and_then(|p| p["gpu_memory_usage"].as_u64())
}

/// gpustat shows the whole GPU without gpucap; in the pool, and beside it with a cap of
/// its own, the cap; the pool's use and its member.
#[test]
fn gpustat_shows_the_cap_and_the_pools_use() {
    let Some(bin) = tools() else {
        return;
    };
    let gpu = Gpu::new("nvml-tools-gpustat");
    let holder = gpu.holder();

    let plain = gpustat(&gpu, &bin, None);
    let total = plain["memory.total"].as_u64().unwrap();
    assert!(total > 8 * 1024, "the whole fake GPU, in MiB: {plain}");
    assert_eq!(plain["memory.used"], 300, "{plain}");
    assert_eq!(listed(&plain, holder.pid()), Some(300), "{plain}");

    let pooled = gpustat(&gpu, &bin, Some(&POOL));
    assert_eq!(pooled["memory.total"], 2048, "the pool's cap: {pooled}");
    assert_eq!(pooled["memory.used"], 300, "the pool's use: {pooled}");
    assert_eq!(listed(&pooled, holder.pid()), Some(300), "{pooled}");

    let alone = gpustat(&gpu, &bin, Some(&[("GPUCAP_LIMIT", "1Gi")]));
    assert_eq!(alone["memory.total"], 1024, "a cap of its own: {alone}");
}

/// nvitop's one-shot screen: the memory bar and the processes table.
#[test]
fn nvitop_shows_the_cap_and_the_pools_use() {
    let Some(bin) = tools() else {
        return;
    };
    let gpu = Gpu::new("nvml-tools-nvitop");
    let holder = gpu.holder();
    let screen = |gpucap: Option<&[(&str, &str)]>| {
        let o = run(gpu.cmd(&bin.join("nvitop"), gpucap).arg("-1"));
        assert_ok(&o);
        stdout(&o)
    };
    let row = |s: &str| {
        s.lines()
            .find(|l| l.contains(&format!(" {} ", holder.pid())))
            .map(String::from)
    };

    let plain = screen(None);
    let whole = bar_total(&plain).unwrap_or_else(|| panic!("no memory bar:\n{plain}"));
    assert!(whole > 8 * GIB, "the whole GPU ({whole} B):\n{plain}");
    assert!(
        row(&plain).is_some_and(|r| r.contains("300.0MiB")),
        "the holder listed:\n{plain}"
    );

    let pooled = screen(Some(&POOL));
    assert_eq!(
        bar_total(&pooled),
        Some(2 * GIB),
        "the pool's use of its cap:\n{pooled}"
    );
    assert!(
        row(&pooled).is_some_and(|r| r.contains("300.0MiB")),
        "the holder listed:\n{pooled}"
    );
}

/// The memory bar's total (`300.0MiB / 8807MiB`, `/ 80.60GiB`) when 300 MiB are used.
fn bar_total(screen: &str) -> Option<u64> {
    let line = screen.lines().find(|l| l.contains("300.0MiB / "))?;
    let total = line
        .split("300.0MiB / ")
        .nth(1)?
        .split_whitespace()
        .next()?;
    let (n, unit) = total.split_at(total.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = n.parse().ok()?;
    let unit = match unit {
        "MiB" => MIB,
        "GiB" => GIB,
        _ => return None,
    };
    Some((n * unit as f64).round() as u64)
}
