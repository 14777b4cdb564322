//! This process's own file when it is capped alone, in no pool (`gpucap_core::lone`):
//! `gpucap status`, `top` and `metrics` find it there. Made at the first `cuInit`,
//! before the driver answers (no allocation can have been made yet), empty until it is
//! shown, with the live figures: a sealed memfd mapped over the ledger's figures (an
//! allocation writes the words it always wrote, nothing more; no other process can
//! write, shrink or grow them). The visible file is a copy for display: writing it
//! changes nothing this process decides. Named once the driver said which GPUs there
//! are; removed at exit; a forked child takes its figures back as its own and makes a
//! file of its own at its next `cuInit`. Over `gpucap-pool-file`; no driver calls.
//!
//! Failing to show itself (a full file system, no memfd) never stops the program and
//! never uncaps it: one line at warn level says why.

use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{AcqRel, Acquire, Release},
};
use std::sync::{Mutex, Once};

use gpucap_core::config::Config;
use gpucap_core::ledger::Devices;
use gpucap_core::lone::{DEVICES_BYTES, LoneInfo};
use gpucap_pool_file::{Lone, own_pid_namespace};

use crate::log::log;

/// This process's file (null: none).
static LONE: AtomicPtr<Lone> = AtomicPtr::new(std::ptr::null_mut());
static MAKING: Mutex<()> = Mutex::new(());
static AT_FORK: Once = Once::new();

fn current() -> Option<&'static Lone> {
    // SAFETY: set only from a leaked Box, never freed.
    unsafe { LONE.load(Acquire).as_ref() }
}

/// Before the driver's `cuInit` answers: makes the file, unnamed, over `devices` (the
/// ledger's figures). Nothing in a pool (its file shows the process) or when made already.
pub fn prepare(config: &Config, devices: &'static Devices) {
    if config.pool.is_some() || current().is_some() {
        return;
    }
    let _guard = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if current().is_some() {
        return;
    }
    // SAFETY: `Devices` is `repr(C)` and made of `AtomicU64`s only, no padding (its
    // size asserted in the core): DEVICES_BYTES / 8 words, static.
    let words: &'static [AtomicU64] = unsafe {
        std::slice::from_raw_parts(
            devices as *const Devices as *const AtomicU64,
            DEVICES_BYTES / 8,
        )
    };
    let made = gpucap_pool_file::user_dir(config.pool_dir.as_deref(), true).and_then(|dir| {
        let dir = dir.ok_or("no directory")?;
        let name = gpucap_core::lone::file_name(std::process::id(), own_pid_namespace());
        Lone::prepare(&dir, &name, words)
    });
    match made {
        Ok(lone) => {
            LONE.store(Box::into_raw(Box::new(lone)), Release);
            // SAFETY: registers a plain extern "C" function taking nothing, run in fork
            // children.
            AT_FORK.call_once(|| unsafe {
                libc::pthread_atfork(None, None, Some(forget_in_child));
            });
        }
        Err(e) => log!(
            Warn,
            "this process will not show in gpucap status, top or metrics: {e}"
        ),
    }
}

/// After the driver's `cuInit` succeeded: the header (who, which GPUs), then the name.
pub fn show(config: &Config, uuids: &[[u8; 16]]) {
    let Some(lone) = current() else {
        return;
    };
    let _guard = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    if lone.is_shown() {
        return;
    }
    let command = gpucap_core::budget::member_command(&gpucap_pool_file::own_cmdline());
    let info = LoneInfo {
        pid: std::process::id(),
        pid_namespace: own_pid_namespace(),
        start_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        uid: gpucap_pool_file::own_uid(),
        growth: config.growth,
        command,
        uuids: uuids.to_vec(),
    };
    gpucap_core::lone::write_header(lone.words(), &info);
    if let Err(e) = lone.show() {
        log!(
            Warn,
            "this process will not show in gpucap status, top or metrics: {e}"
        );
    }
}

/// GPU `device`'s cap is a ceiling handed down to this process, from where `handed`
/// (`config::HandedDown`'s word) says: written in the header for `gpucap status`.
pub fn mark_handed_down(handed: u64, device: usize) {
    let Some(lone) = current() else {
        return;
    };
    let _guard = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    gpucap_core::lone::mark_handed_down(lone.words(), handed, device);
    if let Err(e) = lone.rewrite_header() {
        log!(
            Warn,
            "gpucap status will not show this process's ceiling: {e}"
        );
    }
}

/// Whether a file was made and not named yet ([`show`] has work to do).
pub fn pending() -> bool {
    current().is_some_and(|l| !l.is_shown())
}

/// At exit: the file is removed.
pub fn remove() {
    if let Some(lone) = current() {
        lone.remove();
    }
}

/// In a forked child: the parent's file is the parent's (see `Lone::forget_in_child`).
extern "C" fn forget_in_child() {
    let p = LONE.swap(std::ptr::null_mut(), AcqRel);
    // SAFETY: set only from a leaked Box, never freed (the child's copy leaks).
    if let Some(lone) = unsafe { p.as_ref() } {
        lone.forget_in_child();
    }
}
