//! GPUCAP_POOL on the fake GPU, with several processes: one budget per GPU for every
//! process of a pool, atomic across processes, crash-safe (SIGKILL at any point),
//! fork- and PID-namespace-proof, and fail-closed on a bad pool file. This file holds
//! the harness (a pool in a scratch directory, its members and its words); the tests
//! are in `sharing`, `forks`, `concurrency`, `waiting`, `shares` and `contexts`.
use super::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const OOM: &str = "2";

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// A pool test: a scratch directory for the pool, the shared fake GPU and signals.
struct Pool {
    dir: PathBuf,
}

impl Pool {
    fn new(tag: &str) -> Pool {
        Pool { dir: scratch(tag) }
    }

    /// `program` as a member of the pool `t` with a 1 GiB cap, on a 4 GiB fake GPU
    /// shared by every process of the test.
    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>, stats: &str) -> Command {
        let mut c = fake_cmd(program, &self.dir.join(stats));
        preload(&mut c)
            .env("FAKECUDA_TOTAL_MEM", "4Gi")
            .env("FAKECUDA_SHARED", self.dir.join("fake-gpu"))
            .env("GPUCAP_LIMIT", "1Gi")
            .env("GPUCAP_POOL", "t")
            .env("GPUCAP_POOL_DIR", &self.dir);
        c
    }

    fn script(&self, stats: &str, steps: &[&str]) -> Command {
        let mut c = self.cmd(script(), stats);
        c.args(steps);
        c
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The pool file of pool `t`.
    fn file(&self) -> PathBuf {
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        self.dir.join(format!("gpucap-{uid}")).join("t.pool")
    }

    /// (used, peak) of the pool's first GPU entry, read from the file's words.
    fn used_peak(&self) -> (u64, u64) {
        (self.gpu_word(0, 4) & ((1 << 48) - 1), self.gpu_word(0, 5))
    }

    /// Word `i` of GPU entry `g` of the pool file (the layout is
    /// src/core/budget/layout.rs: 16 header words, then 24 per GPU entry; `used`, word 4,
    /// holds bytes in its low 48 bits and a change count above; word 16 counts the
    /// contexts in flight in its low 32 bits).
    fn gpu_word(&self, g: usize, i: usize) -> u64 {
        let bytes = std::fs::read(self.file()).expect("pool file");
        let at = (16 + g * 24 + i) * 8;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    /// Waits until `n` processes hold a member's lock on the pool file (a killed
    /// process's locks go when the kernel has finished it off).
    fn wait_live_members(&self, n: usize) {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(self.file()).unwrap().ino();
        let start = Instant::now();
        loop {
            let locks = std::fs::read_to_string("/proc/locks").unwrap();
            let held = locks
                .lines()
                .filter(|l| l.contains("OFDLCK") && l.contains(&format!(":{ino} ")))
                .count();
            if held == n {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{held} members, not {n}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_file(&self, name: &str) {
        let p = self.dir.join(name);
        let start = Instant::now();
        while !p.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{name} never came"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.dir.join(name), b"").unwrap();
    }

    /// After members churned in a pool of `cap`: nothing left in use, and the pool's peak
    /// at most the cap and above half of it (the members competed for it); each member's
    /// stats file (`stats`) says the fake GPU never held more than the cap at once.
    fn assert_churned_within(&self, cap: u64, stats: impl IntoIterator<Item = String>) {
        for s in stats {
            let peak = self.shared_peak(&s);
            assert!(
                peak <= cap,
                "the fake GPU held {peak} bytes at once, over the {cap}-byte cap"
            );
        }
        let (used, peak) = self.used_peak();
        assert_eq!(used, 0, "every byte came back to the pool");
        assert!(peak <= cap && peak > cap / 2, "peak {peak}");
    }

    /// The fake GPU's highest total use by all processes, from a stats file.
    fn shared_peak(&self, stats: &str) -> u64 {
        let text = std::fs::read_to_string(self.dir.join(stats)).expect("stats");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["devices"][0]["shared_peak_used"]
            .as_u64()
            .expect("shared_peak_used")
    }
}

/// `gpucap status --pool t --json` of pool `p`, and its text form.
fn status_json(p: &Pool) -> (serde_json::Value, String) {
    let mut st = fake_cmd(cli(), &p.dir.join("st.json"));
    st.args(["status", "--pool", "t"])
        .env("GPUCAP_POOL_DIR", &p.dir);
    let text = stdout(&run_within(&mut st, 30));
    let o = run_within(st.arg("--json"), 30);
    (serde_json::from_str(&stdout(&o)).unwrap(), text)
}

fn spawn(c: &mut Command) -> Child {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

fn finish(c: Child) -> Output {
    c.wait_with_output().unwrap()
}

/// The number after `name=` in a line of tests/c/churn.c's (`churn … refused=N …`).
fn churn_field(line: &str, name: &str) -> u64 {
    line.split(&format!("{name}="))
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {line:?}"))
}

fn lines(o: &Output) -> Vec<String> {
    stdout(o).lines().map(str::to_string).collect()
}

fn has(o: &Output, line: &str) -> bool {
    stdout(o).lines().any(|l| l == line)
}

fn sigkill(c: &mut Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

/// A good pool file, made by a member.
fn made(p: &Pool) -> Vec<u8> {
    assert_ok(&run(&mut p.script("m.json", &["alloc:1Mi"])));
    std::fs::read(p.file()).unwrap()
}

fn churn() -> PathBuf {
    compile_c("pool_churn", "", &["-lcuda"])
}

// ---- GPUCAP_WAIT: waiting for memory instead of failing ---------------------------------

impl Pool {
    /// How many members wait on the pool's first GPU (the file's `waiters` word).
    fn waiters(&self) -> u64 {
        let bytes = std::fs::read(self.file()).expect("pool file");
        u64::from_le_bytes(bytes[(16 + 9) * 8..(16 + 10) * 8].try_into().unwrap())
    }

    fn wait_waiters(&self, n: u64) {
        let start = Instant::now();
        while self.waiters() != n {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{} waiters, not {n}",
                self.waiters()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn waiter(&self, stats: &str, steps: &[&str]) -> Child {
        spawn(self.script(stats, steps).env("GPUCAP_WAIT", "60s"))
    }
}

/// A member holding 800 MiB of the 1 GiB pool until `go` exists, then freeing it.
fn holder(p: &Pool) -> Child {
    let h = spawn(&mut p.script(
        "h.json",
        &[
            "alloc:800Mi",
            &format!("touch:{}", p.path("held")),
            &format!("wait:{}", p.path("go")),
            "free",
        ],
    ));
    p.wait_file("held");
    h
}

// ---- Hostile and unlucky states of the pool file -----------------------------------------

/// Runs `c` and fails the test if it has not exited within `secs` (it is killed then):
/// proof that nothing waits forever.
fn run_within(c: &mut Command, secs: u64) -> Output {
    let mut child = spawn(c);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            sigkill(&mut child);
            panic!("{c:?} still ran after {secs} s: it hangs");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    finish(child)
}

impl Pool {
    /// Writes word `i` of the pool file (as another process of the same user could).
    fn write_word(&self, i: usize, value: u64) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.file())
            .unwrap();
        f.write_all_at(&value.to_le_bytes(), i as u64 * 8).unwrap();
    }

    fn word(&self, i: usize) -> u64 {
        let bytes = std::fs::read(self.file()).expect("pool file");
        u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap())
    }
}

mod concurrency;
mod contexts;
mod forks;
mod shares;
mod sharing;
mod waiting;
