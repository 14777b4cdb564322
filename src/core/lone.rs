//! A process capped on its own (no `GPUCAP_POOL`) shows itself to `gpucap status`,
//! `top` and `metrics` through a small file of its own, `PID-PIDNS.lone`, in the
//! directory its pools would use (`gpucap-UID`). The file is:
//!
//! - first [`DEVICES_BYTES`] (64 KiB): the ledger's per-device figures
//!   ([`Devices`](crate::ledger::Devices)), as they were when the process showed itself.
//!   [`usage_in`] reads them.
//! - then one page, the header: who the process is and which GPUs it sees
//!   ([`LoneInfo`]), its magic word written last, and where its live figures are
//!   ([`figures_fd`]).
//!
//! The live figures are not in that file: the process keeps them in a sealed memfd of
//! the same layout mapped over the ledger's figures (an allocation writes the very words
//! it always wrote: nothing is added to its path), which no other process can write,
//! shrink or grow. Readers reach it as `/proc/PID/fd/N` and take its figures when its
//! header names the same process ([`same_process`]). The visible file is a copy for
//! display: what another process writes there changes nothing the shim decides.
//!
//! The process holds an open-file-description lock on the file for its life (the
//! kernel drops it when the process dies or execs): a file nobody holds is a dead
//! process's, ignored and removed by the next reader that can (`gpucap-pool-file`).
//! Pure: words in, words out.

use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use serde::Serialize;

use crate::config::{MAX_DEVICES, format_uuid};
pub use crate::ledger::{DEVICE_FIGURES_BYTES, DEVICE_WORDS, DEVICES_BYTES};
use crate::ledger::{NO_CAP, usage_in};

/// The header's words (one 4 KiB page).
pub const HEADER_WORDS: usize = 512;
/// The whole file.
pub const LONE_FILE_BYTES: usize = DEVICES_BYTES + HEADER_WORDS * 8;
/// The file's words.
pub const LONE_WORDS: usize = LONE_FILE_BYTES / 8;
/// The first header word once the header is whole: "GPUCAPL2" (2: the devices' cap
/// words stored inverted, 0 for none; a file of the first layout is not read).
pub const LONE_MAGIC: u64 = u64::from_le_bytes(*b"GPUCAPL2");
/// The name's ending.
pub const LONE_SUFFIX: &str = ".lone";

const H: usize = DEVICES_BYTES / 8;
const H_MAGIC: usize = H;
const H_PID: usize = H + 1;
const H_PIDNS: usize = H + 2;
const H_START: usize = H + 3;
const H_UID: usize = H + 4;
const H_GPUS: usize = H + 5;
const H_FLAGS: usize = H + 6;
/// The descriptor (+1) of the process's memfd of live figures; 0: none.
const H_FIGURES: usize = H + 7;
const H_UUIDS: usize = H + 8;
const H_COMMAND: usize = H_UUIDS + 2 * MAX_DEVICES;
const COMMAND_WORDS: usize = crate::budget::COMMAND_BYTES / 8;
/// Where a ceiling handed down to the process came from (`config::HandedDown`'s word;
/// 0: none), and the CUDA ordinals (one bit each) whose cap is that ceiling.
const H_HANDED: usize = H_COMMAND + COMMAND_WORDS;
const H_HANDED_GPUS: usize = H_HANDED + 1;
const _: () = assert!(H_HANDED_GPUS < H + HEADER_WORDS);

/// `flags`: the process runs in growth-only mode (`GPUCAP_GROWTH`).
const FLAG_GROWTH: u64 = 1;

/// The file name of process `pid` of PID namespace `pid_namespace` (its inode).
pub fn file_name(pid: u32, pid_namespace: u64) -> String {
    format!("{pid}-{pid_namespace}{LONE_SUFFIX}")
}

/// Who a lone process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoneInfo {
    pub pid: u32,
    pub pid_namespace: u64,
    /// When it registered, ms since the Unix epoch.
    pub start_ms: u64,
    pub uid: u32,
    pub growth: bool,
    /// As a pool member stores it ([`member_command`](crate::budget::member_command)).
    pub command: String,
    /// The UUID of each GPU it sees, by CUDA ordinal.
    pub uuids: Vec<[u8; 16]>,
}

/// Writes the header into `words` (the whole file), the magic word last.
pub fn write_header(words: &[AtomicU64], info: &LoneInfo) {
    if words.len() < LONE_WORDS {
        return;
    }
    words[H_PID].store(u64::from(info.pid), Relaxed);
    words[H_PIDNS].store(info.pid_namespace, Relaxed);
    words[H_START].store(info.start_ms, Relaxed);
    words[H_UID].store(u64::from(info.uid), Relaxed);
    let gpus = info.uuids.len().min(MAX_DEVICES);
    words[H_GPUS].store(gpus as u64, Relaxed);
    words[H_FLAGS].store(if info.growth { FLAG_GROWTH } else { 0 }, Relaxed);
    for (g, u) in info.uuids.iter().take(gpus).enumerate() {
        let (a, b) = u.split_at(8);
        words[H_UUIDS + 2 * g].store(
            u64::from_le_bytes(a.try_into().unwrap_or_default()),
            Relaxed,
        );
        words[H_UUIDS + 2 * g + 1].store(
            u64::from_le_bytes(b.try_into().unwrap_or_default()),
            Relaxed,
        );
    }
    let mut bytes = [0u8; COMMAND_WORDS * 8];
    let c = info.command.as_bytes();
    let n = c.len().min(bytes.len() - 1);
    bytes[..n].copy_from_slice(&c[..n]);
    for (i, w) in bytes.chunks(8).enumerate() {
        words[H_COMMAND + i].store(
            u64::from_le_bytes(w.try_into().unwrap_or_default()),
            Relaxed,
        );
    }
    words[H_MAGIC].store(LONE_MAGIC, Release);
}

/// Says in the header (`words`: the whole file) that the live figures are in the
/// process's descriptor `fd`.
pub fn set_figures_fd(words: &[AtomicU64], fd: i32) {
    if let (Some(w), Ok(fd)) = (words.get(H_FIGURES), u64::try_from(fd)) {
        w.store(fd + 1, Relaxed);
    }
}

/// The bytes at the start of the file that hold the figures of the GPUs the header
/// (`words`: the whole file) names: the part of [`DEVICES_BYTES`] a visible copy must
/// hold (readers read no other device's figures).
pub fn named_figure_bytes(words: &[AtomicU64]) -> usize {
    let gpus = words
        .get(H_GPUS)
        .map_or(0, |w| (w.load(Relaxed) as usize).min(MAX_DEVICES));
    gpus * crate::ledger::DEVICE_WORDS * 8
}

/// Says in the header (`words`: the whole file) that GPU `device`'s cap is a ceiling
/// handed down to the process, from where `handed` (`config::HandedDown`'s word) says.
pub fn mark_handed_down(words: &[AtomicU64], handed: u64, device: usize) {
    if words.len() < LONE_WORDS || device >= 64 {
        return;
    }
    words[H_HANDED_GPUS].fetch_or(1 << device, Relaxed);
    words[H_HANDED].store(handed, Relaxed);
}

/// The descriptor of the process's live figures its header names, if any.
pub fn figures_fd(words: &[AtomicU64]) -> Option<i32> {
    let w = words.get(H_FIGURES)?.load(Relaxed);
    i32::try_from(w.checked_sub(1)?).ok()
}

/// Whether two whole headers (`a`: the visible file's, `b`: the live figures') are of
/// the same process: both whole, the same pid, PID namespace and start.
pub fn same_process(a: &[AtomicU64], b: &[AtomicU64]) -> bool {
    a.len() == LONE_WORDS
        && b.len() == LONE_WORDS
        && [H_MAGIC, H_PID, H_PIDNS, H_START]
            .iter()
            .all(|&i| a[i].load(Acquire) == b[i].load(Acquire))
        && a[H_MAGIC].load(Relaxed) == LONE_MAGIC
}

/// The process's pid and PID namespace, as its header (`words`) says.
pub fn who(words: &[AtomicU64]) -> Option<(u32, u64)> {
    (words.len() == LONE_WORDS && words[H_MAGIC].load(Acquire) == LONE_MAGIC).then(|| {
        (
            words[H_PID].load(Relaxed) as u32,
            words[H_PIDNS].load(Relaxed),
        )
    })
}

/// One GPU of a lone process, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoneGpuView {
    /// The CUDA ordinal in the process (after its `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The GPU's UUID, `GPU-…`.
    pub uuid: String,
    #[serde(skip)]
    pub raw_uuid: [u8; 16],
    /// The cap in bytes; None: no cap.
    pub cap: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub refusals: u64,
    pub largest_refused: u64,
    pub allocs: u64,
    /// Where its cap came from when it is a ceiling handed down to the process
    /// (`/etc/gpucap/gpucap.env`, a driver's hand-over); None: its own environment's.
    pub ceiling_from: Option<String>,
}

/// A lone process, as read from its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoneView {
    pub pid: u32,
    pub pid_namespace: u64,
    pub start_ms: u64,
    pub uid: u32,
    pub growth: bool,
    pub command: String,
    pub gpus: Vec<LoneGpuView>,
}

/// Why a file is not a lone process's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoneError {
    /// Not this many words.
    Size(usize),
    /// The header is not whole yet (or not a lone file at all).
    Magic,
}

impl std::fmt::Display for LoneError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoneError::Size(n) => write!(
                f,
                "{} bytes, not the {LONE_FILE_BYTES} of a lone process's file",
                n * 8
            ),
            LoneError::Magic => write!(f, "not a lone process's file (no header)"),
        }
    }
}

/// Reads a lone process's file (`words`: the whole file), without changing it.
pub fn read(words: &[AtomicU64]) -> Result<LoneView, LoneError> {
    if words.len() != LONE_WORDS {
        return Err(LoneError::Size(words.len()));
    }
    if words[H_MAGIC].load(Acquire) != LONE_MAGIC {
        return Err(LoneError::Magic);
    }
    let w = |i: usize| words[i].load(Relaxed);
    let mut bytes = Vec::with_capacity(COMMAND_WORDS * 8);
    for i in 0..COMMAND_WORDS {
        bytes.extend_from_slice(&w(H_COMMAND + i).to_le_bytes());
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let command = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let handed = crate::config::HandedDown::from_word(w(H_HANDED));
    let handed_gpus = w(H_HANDED_GPUS);
    let gpus = (0..(w(H_GPUS) as usize).min(MAX_DEVICES))
        .filter_map(|g| {
            let u = usage_in(words, g)?;
            let mut raw = [0u8; 16];
            raw[..8].copy_from_slice(&w(H_UUIDS + 2 * g).to_le_bytes());
            raw[8..].copy_from_slice(&w(H_UUIDS + 2 * g + 1).to_le_bytes());
            Some(LoneGpuView {
                ordinal: g,
                uuid: format_uuid(false, &raw),
                raw_uuid: raw,
                cap: (u.cap != NO_CAP).then_some(u.cap),
                used: u.used,
                peak: u.peak,
                refusals: u.refusals,
                largest_refused: u.largest_refused,
                allocs: u.allocs,
                ceiling_from: handed
                    .filter(|_| handed_gpus & 1 << g != 0)
                    .map(|h| h.text()),
            })
        })
        .collect();
    Ok(LoneView {
        pid: w(H_PID) as u32,
        pid_namespace: w(H_PIDNS),
        start_ms: w(H_START),
        uid: w(H_UID) as u32,
        growth: w(H_FLAGS) & FLAG_GROWTH != 0,
        command,
        gpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> Vec<AtomicU64> {
        (0..LONE_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    fn info() -> LoneInfo {
        LoneInfo {
            pid: 42,
            pid_namespace: 7,
            start_ms: 1_700_000_000_123,
            uid: 1000,
            growth: true,
            command: "python train.py --epochs 3".into(),
            uuids: vec![[0x11; 16], [0x22; 16]],
        }
    }

    #[test]
    fn a_header_is_read_back() {
        let w = words();
        assert_eq!(read(&w), Err(LoneError::Magic), "no header yet");
        write_header(&w, &info());
        let v = read(&w).unwrap();
        assert_eq!((v.pid, v.pid_namespace, v.uid), (42, 7, 1000));
        assert_eq!(v.start_ms, 1_700_000_000_123);
        assert!(v.growth);
        assert_eq!(v.command, "python train.py --epochs 3");
        assert_eq!(v.gpus.len(), 2);
        assert_eq!(v.gpus[1].uuid, "GPU-22222222-2222-2222-2222-222222222222");
        assert_eq!(v.gpus[1].ordinal, 1);
        // Figures all zero: the cap word 0 is "none" (stored inverted), as a fresh
        // ledger's; a cap of 0 bytes is the word of all ones.
        assert_eq!(v.gpus[0].cap, None);
        w[0].store(u64::MAX, Relaxed);
        assert_eq!(read(&w).unwrap().gpus[0].cap, Some(0));
        assert_eq!(read(&w[1..]), Err(LoneError::Size(LONE_WORDS - 1)));
    }

    #[test]
    fn a_ceiling_handed_down_is_read_back_per_gpu() {
        let w = words();
        write_header(&w, &info());
        assert_eq!(read(&w).unwrap().gpus[0].ceiling_from, None);
        mark_handed_down(&w, crate::config::HandedDown::Etc.word(), 1);
        let v = read(&w).unwrap();
        assert_eq!(v.gpus[0].ceiling_from, None);
        assert_eq!(
            v.gpus[1].ceiling_from.as_deref(),
            Some("/etc/gpucap/gpucap.env")
        );
        // A word no gpucap writes shows nothing.
        mark_handed_down(&w, 0x77, 0);
        assert!(
            read(&w)
                .unwrap()
                .gpus
                .iter()
                .all(|g| g.ceiling_from.is_none())
        );
    }

    #[test]
    fn the_figures_are_the_ledgers_words() {
        let w = words();
        write_header(&w, &info());
        // Device 1's cap and used, at the offsets the ledger's layout gives.
        let per = crate::ledger::DEVICE_WORDS;
        w[per].store(0, Relaxed); // no cap: the word is stored inverted
        w[per + 1].store(5 << 20, Relaxed);
        w[per + 2].store(6 << 20, Relaxed);
        let v = read(&w).unwrap();
        assert_eq!(v.gpus[1].cap, None);
        assert_eq!((v.gpus[1].used, v.gpus[1].peak), (5 << 20, 6 << 20));
    }

    #[test]
    fn the_live_figures_are_taken_only_from_the_same_process() {
        let (a, b) = (words(), words());
        assert_eq!(figures_fd(&a), None);
        set_figures_fd(&a, 0);
        assert_eq!(figures_fd(&a), Some(0));
        set_figures_fd(&a, 7);
        assert_eq!(figures_fd(&a), Some(7));
        assert!(!same_process(&a, &b), "no header yet");
        write_header(&a, &info());
        write_header(&b, &info());
        assert!(same_process(&a, &b));
        assert_eq!(who(&a), Some((42, 7)));
        let mut other = info();
        other.start_ms += 1; // a later process with the same pid
        write_header(&b, &other);
        assert!(!same_process(&a, &b));
        assert!(!same_process(&a, &b[1..]));
    }

    #[test]
    fn a_long_command_keeps_its_last_nul() {
        let w = words();
        let mut i = info();
        i.command = "x".repeat(200);
        write_header(&w, &i);
        assert_eq!(read(&w).unwrap().command.len(), COMMAND_WORDS * 8 - 1);
    }
}
