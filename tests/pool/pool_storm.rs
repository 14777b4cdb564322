//! Kill storms: members of a 1 GiB pool churning on a shared fake GPU are
//! SIGKILLed at random and respawned; the fake driver's own figure for the pool's
//! processes (its shared peak) must never pass the cap, at any step of any storm. A
//! killed member's bytes may be handed out again only once the driver released them.

use super::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const CAP: u64 = 1024 * MIB;

fn churn() -> PathBuf {
    compile_c("pool_churn", "", &["-lcuda"])
}

/// A churning member of the pool in `dir`: plain, stream-ordered, VMM and managed blocks.
fn member(dir: &Path) -> Child {
    let mut c = fake_cmd(churn(), &dir.join("stats.json"));
    preload(&mut c)
        .env("FAKECUDA_TOTAL_MEM", "4Gi")
        .env("FAKECUDA_SHARED", dir.join("fake-gpu"))
        .env("GPUCAP_LIMIT", "1Gi")
        .env("GPUCAP_POOL", "t")
        .env("GPUCAP_POOL_DIR", dir)
        .env("CHURN_KINDS", "mixed")
        .args(["2", "1000000", "96Mi"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pool_churn")
}

/// The fake driver's highest total use of device 0 by all its processes (the header
/// of the FAKECUDA_SHARED file: magic, devices, total, 5 reserved words, then the peaks).
pub(super) fn shared_peak(dir: &Path) -> u64 {
    let Ok(bytes) = std::fs::read(dir.join("fake-gpu")) else {
        return 0;
    };
    bytes
        .get(64..72)
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap()))
}

fn sigkill(c: &mut Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// One storm: 8 members, 40 of them killed at random points and respawned, then all
/// killed. Returns the step at which the fake's figure first passed the cap, if any.
fn storm(n: usize, seed: &mut u64) -> Option<(usize, u64)> {
    let dir = scratch(&format!("storm{n}"));
    let mut members: Vec<Child> = (0..8).map(|_| member(&dir)).collect();
    std::thread::sleep(Duration::from_millis(150));
    let mut over = None;
    for step in 0..40 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(4 + (*seed >> 60)));
        let k = (*seed >> 33) as usize % members.len();
        sigkill(&mut members[k]);
        members[k] = member(&dir);
        let peak = shared_peak(&dir);
        if peak > CAP && over.is_none() {
            over = Some((step, peak));
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    for m in &mut members {
        sigkill(m);
    }
    let peak = shared_peak(&dir);
    if peak > CAP && over.is_none() {
        over = Some((40, peak));
    }
    let _ = std::fs::remove_dir_all(&dir);
    over
}

#[test]
fn kill_storms_never_take_the_fake_gpu_past_the_pools_cap() {
    let storms: usize = std::env::var("GPUCAP_STORMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut seed = std::process::id() as u64 ^ 0x5eed;
    let start = Instant::now();
    let mut over = Vec::new();
    for n in 0..storms {
        if let Some((step, peak)) = storm(n, &mut seed) {
            eprintln!(
                "storm {n}: step {step}: the fake GPU held {} MiB",
                peak / MIB
            );
            over.push((n, step, peak));
        }
    }
    eprintln!(
        "{storms} storms in {:.1} s, {} over the cap",
        start.elapsed().as_secs_f64(),
        over.len()
    );
    assert!(
        over.is_empty(),
        "the fake GPU held more than the pool's 1 GiB cap in {} of {storms} storms: {over:?}",
        over.len()
    );
}
