//! What a process reports: the `GPUCAP_LOG=info` summary and the `GPUCAP_REPORT` file at
//! exit and before an `exec` (whose program keeps the pid, not the figures), and the
//! report refreshed after a refusal (a program that then dies without `exit()` still
//! leaves one).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, TryLockError};

use gpucap_core::config::LogLevel;
use gpucap_core::ledger::NO_CAP;
use gpucap_core::report::{self, DeviceReport, ProcessReport};

use crate::log::log;

use super::{ACTIVE_PID, Shim, now_ms, retained_bytes};

/// How a report is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Moment {
    /// After a refusal: the process runs on.
    Running,
    /// At exit.
    Exited,
    /// Before an `exec`: this program ends, the process goes on as another.
    Exec,
}

/// Serialises this process's report writes (the exit hook and refusals).
static WRITING: Mutex<()> = Mutex::new(());

/// When a refusal last refreshed the report (ms since the Unix epoch), and the largest
/// refused request it showed: refusals in a tight loop rewrite the file at most every
/// 100 ms, unless a larger request was refused.
static REFUSAL_WRITTEN_MS: AtomicU64 = AtomicU64::new(0);
static REFUSAL_WRITTEN_LARGEST: AtomicU64 = AtomicU64::new(0);
const REFUSAL_WRITE_INTERVAL_MS: u64 = 100;

/// Whether this process said that its report went beside a file that is not a report
/// (said once: a refusal in a loop rewrites the report).
static SAID_REPORT_ELSEWHERE: AtomicBool = AtomicBool::new(false);

impl Shim {
    /// This process's figures for each device it used.
    pub fn device_reports(&self) -> Vec<DeviceReport> {
        self.touched_devices()
            .filter_map(|d| {
                let u = self.ledger.usage(d)?;
                // In growth mode the cap is charged for retained memory too, which the
                // program freed: in use is the rest (0 once every block was freed).
                let retained = retained_bytes(d);
                Some(DeviceReport {
                    ordinal: d as u32,
                    cap: (u.cap != NO_CAP).then_some(u.cap),
                    peak: u.peak,
                    in_use: u.used.saturating_sub(retained),
                    retained,
                    allocations: u.allocs,
                    refusals: u.refusals,
                    largest_refused: u.largest_refused,
                })
            })
            .collect()
    }

    /// Is this the process that read the configuration (not a forked child of it)?
    fn own_process(&self) -> bool {
        self.active() && ACTIVE_PID.load(Relaxed) == std::process::id()
    }

    /// At exit (from the library's destructor): the `GPUCAP_LOG=info` summary and the
    /// `GPUCAP_REPORT` file. Nothing for a process that never called into CUDA.
    pub fn at_exit(&self) {
        // The pool gets this process's whole share back now, not when a member notices.
        crate::membership::leave();
        crate::lone::remove();
        if !self.own_process() {
            return;
        }
        self.final_report(Moment::Exited);
    }

    /// Before this process `exec`s another program (from the `exec` hooks): the exit
    /// hook does not run, and the new program keeps the pid and the start time that name
    /// this one's entry, so this program's figures are written now under an id of their
    /// own (`report::write_entry_before_exec`), with the summary at `GPUCAP_LOG=info`.
    /// Its visible file and pool slot are left as they are: their locks go with the
    /// `exec` (close-on-exec descriptors), which is what tells readers and the pool this
    /// program is gone, and an `exec` that fails leaves them in force. Nothing in a
    /// forked child that did not call into CUDA (a `vfork` child shares this process's
    /// memory: it must not write or allocate).
    pub fn before_exec(&self) {
        if self.own_process() {
            self.final_report(Moment::Exec);
        }
    }

    /// The summary at `GPUCAP_LOG=info` and the report of this program at its end
    /// (`Exited`, or `Exec`: its process goes on as another program).
    fn final_report(&self, moment: Moment) {
        let Ok(config) = self.config() else {
            return;
        };
        let devices = self.device_reports();
        if crate::log::LEVEL.load(Relaxed) >= LogLevel::Info as u8 {
            let before = if moment == Moment::Exec {
                "before exec: "
            } else {
                ""
            };
            if devices.is_empty() {
                log!(Info, "{before}no GPU memory was allocated");
            }
            for d in &devices {
                let line = report::summary_line(d, config.growth);
                let line = match moment {
                    Moment::Exec => line.replace(" at exit", " at the exec"),
                    _ => line,
                };
                log!(Info, "{before}{line}");
            }
        }
        if let Some(path) = &config.report {
            let guard = WRITING.lock().unwrap_or_else(|p| p.into_inner());
            self.write_report(path, config.growth, devices, moment);
            drop(guard);
        }
    }

    /// After a refused request: refresh the report, so that a program that then dies
    /// without `exit()` (the usual crash after an out-of-memory error, a fatal signal)
    /// still leaves one, marked `"state":"running"`. No signal handler is installed.
    pub(super) fn after_refusal(&self) {
        if !self.own_process() {
            return;
        }
        let Ok(config) = self.config() else {
            return;
        };
        let Some(path) = &config.report else {
            return;
        };
        let devices = self.device_reports();
        let largest = devices.iter().map(|d| d.largest_refused).max().unwrap_or(0);
        let now = now_ms();
        let last = REFUSAL_WRITTEN_MS.load(Relaxed);
        if last != 0
            && now.saturating_sub(last) < REFUSAL_WRITE_INTERVAL_MS
            && largest <= REFUSAL_WRITTEN_LARGEST.load(Relaxed)
        {
            return;
        }
        // Another thread writing now: its figures are as fresh; never wait in a hook.
        let guard = match WRITING.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        REFUSAL_WRITTEN_MS.store(now.max(1), Relaxed);
        REFUSAL_WRITTEN_LARGEST.fetch_max(largest, Relaxed);
        self.write_report(path, config.growth, devices, Moment::Running);
        drop(guard);
    }

    /// Writes this process's entry (the caller holds `WRITING`).
    fn write_report(
        &self,
        template: &Path,
        growth: bool,
        devices: Vec<DeviceReport>,
        moment: Moment,
    ) {
        let pid = std::process::id();
        let (file, per_process) = report::expand_path(template, pid);
        let entry = ProcessReport {
            id: match report::own_start_time() {
                Some(t) => format!("{pid}-{t}"),
                None => pid.to_string(),
            },
            pid,
            cmdline: report::own_cmdline(),
            exited: moment != Moment::Running,
            time: report::now_secs(),
            growth,
            devices,
        };
        let write = match moment {
            Moment::Exec => report::write_entry_before_exec,
            Moment::Running | Moment::Exited => report::write_entry,
        };
        match write(&file, per_process, &entry) {
            // A file that is not a gpucap report of this version was left alone and the
            // entry went beside it: said once, or the figures would be where nobody looks.
            Ok(written) if written != file => {
                if !SAID_REPORT_ELSEWHERE.swap(true, Relaxed) {
                    log!(
                        Error,
                        "{} is not a gpucap report (\"gpucap_report\":{}): left as it is; \
                         this process's report went to {} instead",
                        file.display(),
                        report::REPORT_VERSION,
                        written.display()
                    );
                }
            }
            Ok(written) => log!(Debug, "report written to {}", written.display()),
            Err(e) => log!(Error, "no report written: {e}"),
        }
    }
}
