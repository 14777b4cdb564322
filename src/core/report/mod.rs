//! Usage reports (`GPUCAP_REPORT=PATH`): what a process used on each GPU, as JSON.
//!
//! Used by the shim (which writes reports, from its exit hook and after a refusal) and
//! the CLI (`gpucap run --measure` reads them): `schema` holds the entries (serde, through
//! `serde_json`) and the summary line; `file` the `%p` expansion and the crash-safe,
//! multi-process-safe file update.
//!
//! # File format (version 1)
//!
//! ```text
//! {"gpucap_report":1,"processes":[
//! {"id":"4242-1234567","pid":4242,"cmdline":["python","train.py"],"state":"exited",
//!  "time":1712345678,"growth":false,"devices":[{"ordinal":0,"cap":4294967296,
//!  "peak":1610612736,"in_use":0,"retained":0,"allocations":12,"refusals":1,
//!  "largest_refused":3221225472}]}
//! ]}
//! ```
//!
//! One entry per process (one line each), in the order they first wrote:
//! - `id`: `<pid>-<start time>` (field 22 of /proc/self/stat): tells apart processes
//!   that reused a pid; a process's later writes replace its own entry. A program that
//!   `exec`ed another wrote its own as `<id>.exec<N>` (the new program keeps the id).
//! - `pid`, `cmdline` (/proc/self/cmdline, invalid UTF-8 replaced by U+FFFD).
//! - `state`: `exited` when written at exit; `running` when written right after a
//!   refusal. An entry still `running` in a file whose process is gone means it ended
//!   without `exit()` (killed, crashed, `_exit`): its figures are from its last refusal.
//! - `time`: Unix seconds of the write. `growth`: growth mode was on.
//! - `devices`: the GPUs the process used (CUDA ordinals as it saw them), each with
//!   `cap` (bytes, `null` = none), `peak` (most bytes charged at once), `in_use`
//!   (bytes still allocated when written: allocated and not freed; in growth mode the
//!   pages holding live allocations, so 0 once every block was freed), `retained`
//!   (growth mode: bytes freed by the program but kept by the process; `in_use +
//!   retained` is what the cap is charged), `allocations` (successful ones),
//!   `refusals` and `largest_refused` (bytes of the largest refused request, 0 if none).
//!   Bytes are those charged to the cap (pitch x height for pitched allocations).

mod file;
mod schema;

pub use file::{
    expand_path, now_secs, own_cmdline, own_start_time, process_of, read_report, write_atomically,
    write_entry, write_entry_before_exec,
};
pub use schema::{DeviceReport, ProcessReport, REPORT_VERSION, summary_line};

/// A report with two devices (one without a cap) and a command line that needs escaping.
#[cfg(test)]
fn sample(pid: u32, exited: bool) -> ProcessReport {
    const GI: u64 = 1 << 30;
    ProcessReport {
        id: format!("{pid}-77"),
        pid,
        cmdline: vec!["prog".into(), "a \"b\"\n\u{1}é".into()],
        exited,
        time: 1_700_000_000,
        growth: false,
        devices: vec![
            DeviceReport {
                ordinal: 0,
                cap: Some(4 * GI),
                peak: 3 * GI / 2,
                in_use: 0,
                retained: 0,
                allocations: 12,
                refusals: 1,
                largest_refused: 3 * GI,
            },
            DeviceReport {
                ordinal: 3,
                cap: None,
                peak: 5,
                in_use: 5,
                retained: 0,
                allocations: 1,
                refusals: 0,
                largest_refused: 0,
            },
        ],
    }
}
