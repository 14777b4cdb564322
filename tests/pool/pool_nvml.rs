//! NVML in a pool (`GPUCAP_POOL`): what `nvidia-smi`-style monitors inside the container
//! see is the pool. Two members hold 300 MiB and 200 MiB of a 1 GiB pool on one (fake,
//! shared) GPU, where a process outside the pool holds 100 MiB more; then
//!
//! - an NVML-only process (a monitor: it never calls `cuInit`, never joins) sees total
//!   1 GiB, used 500 MiB, and `nvmlDeviceGetComputeRunningProcesses` (`_v2`, `_v3`)
//!   lists the two members with their bytes, NVML's count protocol kept
//!   (tests/c/nvml.c `procs`, linked and through dlsym; `nvidia-ml-py` too, which also
//!   asks `nvmlDeviceGetRunningProcessDetailList`);
//! - a member's own NVML view is the same;
//! - reading changes nothing in the pool file;
//! - once a member is SIGKILLed it is no longer listed; its bytes stay in `used` until a
//!   member takes them back (here: one that joins);
//! - without a pool the driver's list is untouched, and a pool file that cannot be read
//!   makes the NVML calls fail closed.

use super::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::*;

const CAP: u64 = GIB;
/// `gpuInstanceId`/`computeInstanceId` outside MIG.
const NO_INSTANCE: u64 = u32::MAX as u64;

fn nvml_prog() -> PathBuf {
    fake_nvml();
    compile_c("nvml", "", &["-lnvidia-ml", "-lcuda"])
}

fn script() -> PathBuf {
    compile_c("script", "", &["-lcuda"])
}

/// One fake GPU of 8 GiB that every process of the test shares.
fn on_the_gpu<'a>(cmd: &'a mut Command, dir: &Path) -> &'a mut Command {
    cmd.env("FAKECUDA_SHARED", dir.join("gpu"))
        .env("FAKECUDA_TOTAL_MEM", "8Gi")
        .env("FAKECUDA_DEVICES", "1")
        .env("FAKECUDA_CONTEXT_MEM", "0")
}

/// Under the shim, a member (or reader) of the test's 1 GiB pool.
fn in_the_pool<'a>(cmd: &'a mut Command, dir: &Path) -> &'a mut Command {
    on_the_gpu(cmd, dir);
    preload(cmd)
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_POOL", "nvml")
        .env("GPUCAP_POOL_DIR", dir.join("pools"))
}

/// The processes a test started, killed when it ends (passed or not).
struct Started(Vec<(String, Child)>);

impl Started {
    fn spawn(&mut self, name: &str, cmd: &mut Command) -> u32 {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.0.push((name.to_string(), child));
        pid
    }

    /// SIGKILLs `name` and reaps it.
    fn kill(&mut self, name: &str) {
        let i = self.0.iter().position(|(n, _)| n == name).unwrap();
        let (_, mut child) = self.0.remove(i);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Waits for every process still running; each must have passed.
    fn finish(&mut self) {
        for (name, child) in self.0.drain(..) {
            let o = child.wait_with_output().unwrap();
            assert!(o.status.success(), "{name}: {}", dump(&o));
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until a process of the test has created `path` (its `touch:` step).
fn wait_for(path: &Path, started: &mut Started) {
    for _ in 0..6000 {
        if path.exists() {
            return;
        }
        for (name, c) in &mut started.0 {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("{name} ended ({status}) before creating {}", path.display());
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{} never appeared", path.display());
}

/// What one NVML reader saw of NVML device 0.
#[derive(Debug, Default)]
struct Seen {
    /// v1 (total, free, used), v2 (total, reserved, free, used).
    v1: (u64, u64, u64),
    v2: (u64, u64, u64, u64),
    /// version -> (pid, bytes) listed; gi/ci of every v2/v3 entry.
    procs: BTreeMap<String, BTreeSet<(u32, u64)>>,
    instance_ids: BTreeSet<u64>,
}

fn kv(line: &str) -> BTreeMap<&str, u64> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect()
}

/// Parses `nvml procs` output (and the pynvml client's, which prints the same lines for
/// `v3` only): `versions` are the process queries it made.
fn seen(out: &str, versions: &[&str]) -> Seen {
    let mut s = Seen::default();
    for v in versions {
        s.procs.insert(v.to_string(), BTreeSet::new());
    }
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["dev", "0", ..] => {
                let m = kv(line);
                s.v1 = (m["total"], m["free"], m["used"]);
                s.v2 = (m["v2total"], m["v2reserved"], m["v2free"], m["v2used"]);
            }
            ["proc", "0", version, ..] => {
                let m = kv(line);
                s.procs
                    .entry(version.to_string())
                    .or_default()
                    .insert((m["pid"] as u32, m["used"]));
                for k in ["gi", "ci"] {
                    if let Some(&id) = m.get(k) {
                        s.instance_ids.insert(id);
                    }
                }
            }
            _ => {}
        }
    }
    s
}

/// Runs `nvml procs <how> [cuda]` (or anything printing the same lines) and parses it.
fn read(cmd: &mut Command, what: &str) -> Seen {
    let o = run(cmd);
    assert_passed(&o, what);
    seen(&stdout(&o), &["v1", "v2", "v3"])
}

/// The pool's view of NVML device 0: `used` bytes of the 1 GiB cap, `procs` listed
/// by all three versions, outside MIG.
fn assert_pool_view(s: &Seen, used: u64, procs: &[(u32, u64)], what: &str) {
    assert_eq!(
        s.v1,
        (CAP, CAP - used, used),
        "{what}: v1 (total, free, used) = (cap, cap - pool used, pool used)\n{s:?}"
    );
    // v2 reserves nothing inside the cap (the driver's reserved lies outside what the
    // pool charges): its used is v1's, the pool's (nvidia-smi reads v2).
    assert_eq!(
        s.v2,
        (CAP, 0, CAP - used, used),
        "{what}: v2 (total, reserved, free, used) = (cap, 0, cap - pool used, pool used)\n{s:?}"
    );
    let want: BTreeSet<(u32, u64)> = procs.iter().copied().collect();
    for (version, listed) in &s.procs {
        assert_eq!(
            listed, &want,
            "{what}: {version} lists the pool's live members"
        );
    }
    if !procs.is_empty() {
        assert_eq!(
            s.instance_ids,
            BTreeSet::from([NO_INSTANCE]),
            "{what}: gi/ci"
        );
    }
}

/// The pool file (there is one: `<pools>/gpucap-<uid>/nvml.pool`).
fn pool_file(dir: &Path) -> PathBuf {
    let pools = dir.join("pools");
    let user = std::fs::read_dir(&pools)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gpucap-"))
        })
        .expect("the per-user pool directory");
    user.join("nvml.pool")
}

#[test]
fn nvml_shows_the_pool_and_lists_its_processes() {
    let (nvml, script) = (nvml_prog(), script());
    let dir = scratch("pool-nvml");
    std::fs::create_dir_all(dir.join("pools")).unwrap();
    let stats = |n: &str| dir.join(format!("{n}.json"));
    let mut started = Started(Vec::new());

    // Two members and a process outside the pool, holding their memory until `done`.
    let done = dir.join("done");
    let member = |name: &str, size: &str, started: &mut Started| {
        let ready = dir.join(name);
        let mut c = fake_cmd(&script, &stats(name));
        in_the_pool(&mut c, &dir).args([
            format!("alloc:{size}"),
            format!("touch:{}", ready.display()),
            format!("wait:{}", done.display()),
        ]);
        let pid = started.spawn(name, &mut c);
        wait_for(&ready, started);
        pid
    };
    let a = member("a", "300Mi", &mut started);
    let b = member("b", "200Mi", &mut started);
    let outsider = dir.join("outsider");
    let mut c = fake_cmd(&script, &stats("outsider"));
    on_the_gpu(&mut c, &dir).args([
        "alloc:100Mi".to_string(),
        format!("touch:{}", outsider.display()),
        format!("wait:{}", done.display()),
    ]);
    let o_pid = started.spawn("outsider", &mut c);
    wait_for(&outsider, &mut started);
    let both = [(a, 300 * MIB), (b, 200 * MIB)];

    // Control: the driver itself shows the whole GPU and all three processes.
    let mut c = fake_cmd(&nvml, &stats("r"));
    let s = read(
        on_the_gpu(&mut c, &dir).args(["procs", "dl"]),
        "control without the shim",
    );
    // (v1's used includes what the driver reserves, the fake's default
    // FAKECUDA_NVML_RESERVED; v2 shows it apart.)
    let reserved = 644_939_776;
    assert_eq!(
        (s.v1.2, s.v2.1, s.v2.3),
        (600 * MIB + reserved, reserved, 600 * MIB),
        "control: {s:?}"
    );
    assert_eq!(
        s.procs["v3"],
        BTreeSet::from([(a, 300 * MIB), (b, 200 * MIB), (o_pid, 100 * MIB)]),
        "control"
    );
    // Under the shim without a pool: the cap, and the driver's list untouched.
    let mut c = fake_cmd(&nvml, &stats("r"));
    on_the_gpu(&mut c, &dir).args(["procs", "dl"]);
    let s = read(
        preload(&mut c).env("GPUCAP_LIMIT", "1Gi"),
        "shim without a pool",
    );
    assert_eq!(s.v1.0, CAP);
    assert_eq!(s.procs["v1"].len(), 3, "no pool: the driver's list: {s:?}");

    // A monitor (NVML only, never joins) and a member that allocates nothing.
    let file = pool_file(&dir);
    let before = std::fs::read(&file).unwrap();
    for how in ["linked", "dl"] {
        let mut c = fake_cmd(&nvml, &stats("r"));
        let what = format!("NVML-only reader ({how})");
        let s = read(in_the_pool(&mut c, &dir).args(["procs", how]), &what);
        assert_pool_view(&s, 500 * MIB, &both, &what);
    }
    assert!(
        !stats("r").exists(),
        "the NVML-only reader initialised CUDA"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "an NVML-only reader changed the pool file"
    );
    let mut c = fake_cmd(&nvml, &stats("m"));
    let s = read(
        in_the_pool(&mut c, &dir).args(["procs", "dl", "cuda"]),
        "a member's NVML",
    );
    assert_pool_view(&s, 500 * MIB, &both, "a member's own NVML view");

    // nvidia-ml-py, the real client, as a monitor.
    let python = client_python("GPUCAP_TEST_PYTHON_NVML", "nvidia-ml-py");
    let pynvml = |dir: &Path| {
        let mut c = fake_cmd(python.as_ref().unwrap(), &stats("p"));
        in_the_pool(&mut c, dir)
            .arg(root().join("tests/clients/nvml_client.py"))
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let o = run(&mut c);
        assert!(
            o.status.success() && stdout(&o).contains("done"),
            "pynvml: {}",
            dump(&o)
        );
        seen(&stdout(&o), &["v3", "detail"])
    };
    if python.is_some() {
        let s = pynvml(&dir);
        assert_pool_view(&s, 500 * MIB, &both, "pynvml");
    }

    // A member dies holding 200 MiB: no longer listed. Its bytes are in `used` until a
    // member takes them back (a reader never does; a live member may have already).
    started.kill("b");
    let mut c = fake_cmd(&nvml, &stats("r"));
    let s = read(
        in_the_pool(&mut c, &dir).args(["procs", "dl"]),
        "reader after the kill",
    );
    assert!(
        s.v1.2 == 500 * MIB || s.v1.2 == 300 * MIB,
        "used after the kill: {s:?}"
    );
    assert_pool_view(&s, s.v1.2, &[(a, 300 * MIB)], "after the kill");
    // A process joining the pool takes the dead member's share back.
    let mut c = fake_cmd(&script, &stats("j"));
    let o = run(in_the_pool(&mut c, &dir).arg("info"));
    assert!(o.status.success(), "a member joining: {}", dump(&o));
    let mut c = fake_cmd(&nvml, &stats("r"));
    let s = read(
        in_the_pool(&mut c, &dir).args(["procs", "linked"]),
        "reader after the take-back",
    );
    assert_pool_view(&s, 300 * MIB, &[(a, 300 * MIB)], "after the take-back");
    if python.is_some() {
        assert_pool_view(&pynvml(&dir), 300 * MIB, &[(a, 300 * MIB)], "pynvml");
    }

    std::fs::write(&done, "").unwrap();
    started.finish();
}

/// Before any member joined there is no pool file: the pool is empty (the configured
/// cap, nothing listed by the pool, nothing created); a pool file that is not one makes
/// the NVML calls fail closed with one message, as a misconfigured cap does.
#[test]
fn nvml_before_the_pool_exists_and_with_a_bad_pool_file() {
    let nvml = nvml_prog();
    let dir = scratch("pool-nvml-bad");
    std::fs::create_dir_all(dir.join("pools")).unwrap();
    let stats = dir.join("stats.json");

    let mut c = fake_cmd(&nvml, &stats);
    let s = read(
        in_the_pool(&mut c, &dir).args(["procs", "dl"]),
        "no pool file yet",
    );
    assert_eq!(s.v1, (CAP, CAP, 0), "{s:?}");
    assert!(s.procs.values().all(|p| p.is_empty()), "{s:?}");
    assert_eq!(
        std::fs::read_dir(dir.join("pools")).unwrap().count(),
        0,
        "a reader created something in the pool directory"
    );

    // A file of the right permissions that is no pool file.
    let bad = dir.join("bad.pool");
    std::fs::write(&bad, vec![7u8; 4096]).unwrap();
    std::fs::set_permissions(
        &bad,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .unwrap();
    for how in ["linked", "dl"] {
        let mut c = fake_cmd(&nvml, &stats);
        in_the_pool(&mut c, &dir)
            .env("GPUCAP_POOL", &bad)
            .args(["denied", how]);
        let o = run(&mut c);
        assert_passed(&o, &format!("nvml denied {how} with a bad pool file"));
        let err = stderr(&o);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("gpucap:")).collect();
        assert!(
            lines.len() == 1 && lines[0].contains(&bad.display().to_string()),
            "{how}: one message naming the pool file:\n{err}"
        );
    }
}

/// A member with a guarantee and a ceiling (GPUCAP_GUARANTEE, GPUCAP_CEILING): NVML's
/// memory info agrees with its `cuMemGetInfo`: total is its ceiling, free what it could
/// take now (the rest of its ceiling, less another member's unused guarantee).
#[test]
fn nvml_shows_a_members_ceiling_and_what_it_could_take() {
    let (nvml, script) = (nvml_prog(), script());
    let dir = scratch("pool-nvml-shares");
    std::fs::create_dir_all(dir.join("pools")).unwrap();
    let mut started = Started(Vec::new());
    // Another member holds a 700 MiB guarantee, 100 MiB of it used.
    let (ready, done) = (dir.join("g"), dir.join("done"));
    let mut c = fake_cmd(&script, &dir.join("g.json"));
    in_the_pool(&mut c, &dir)
        .env("GPUCAP_GUARANTEE", "700Mi")
        .args([
            "alloc:100Mi".to_string(),
            format!("touch:{}", ready.display()),
            format!("wait:{}", done.display()),
        ]);
    started.spawn("guaranteed", &mut c);
    wait_for(&ready, &mut started);
    for (ceiling, total, free) in [("800Mi", 800, 224), ("250Mi", 250, 150)] {
        let mut c = fake_cmd(&nvml, &dir.join("n.json"));
        let o = run(in_the_pool(&mut c, &dir)
            .env("GPUCAP_CEILING", ceiling)
            .args(["consistent", "dl", "100Mi"]));
        assert_ok(&o);
        let line = format!("total={} free={}", total * MIB, free * MIB);
        assert!(
            stdout(&o)
                .lines()
                .any(|l| l.starts_with("cuda ") && l.contains(&line)),
            "{line}\n{}",
            dump(&o)
        );
    }
    std::fs::write(&done, b"").unwrap();
    started.finish();
}
