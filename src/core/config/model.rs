//! What a configuration is: [`Config`], the error of a bad variable ([`ConfigError`]), and
//! the records it keeps of where its caps came from ([`Origin`], [`CapSource`]) and of a
//! ceiling handed down ([`Ceiling`]), and the configuration files' names. Types only: the
//! files beside it read variables into them.

use std::fmt;
use std::path::PathBuf;

use super::limit::{DeviceKey, LimitSpec};
use super::ordinals::Ordinals;
use super::pool_vars::PoolSpec;

/// The name of the configuration file the shim looks for beside itself.
pub const ENV_FILE_NAME: &str = "gpucap.env";

/// Where the shim looks (beside a copy's file, a ceiling over it; else instead of one).
pub const ETC_ENV_FILE: &str = "/etc/gpucap/gpucap.env";

/// How much the shim logs (to stderr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
}

impl LogLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Off => "off",
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `GPUCAP_LIMIT`; None = unset: allocations are counted, not capped.
    pub limit: Option<LimitSpec>,
    /// `GPUCAP_LIMIT=none`: no cap asked on purpose ([`limit`](Self::limit) is None),
    /// rather than none set.
    pub limit_none: bool,
    /// `GPUCAP_LOG`, default `warn`.
    pub log: LogLevel,
    /// `GPUCAP_GROWTH` (reserved; validated, not yet used), default false.
    pub growth: bool,
    /// `GPUCAP_REPORT`: where the shim writes its JSON usage report at exit (`%p` is
    /// replaced by the process id). See `crate::report`.
    pub report: Option<PathBuf>,
    /// `GPUCAP_LD_SO_PRELOAD`: the container entrypoint also installs the shim in
    /// `/etc/ld.so.preload`. Only scripts/docker-entrypoint.sh acts on it.
    pub ld_so_preload: bool,
    /// What a value set means that its setter may not expect (HAMi-core variables gpucap
    /// does not act on, a size in decimal units, …), one line each: `gpucap check`
    /// prints them, the shim logs them at warn level.
    pub notes: Vec<String>,
    /// Where the configuration puts the process, said once (a claim's pool): `gpucap
    /// check` prints them, the shim logs them at info level (every process of a claim
    /// is in its pool: nothing to warn about).
    pub info: Vec<String>,
    /// `GPUCAP_POOL` (or HAMi-core's `CUDA_DEVICE_MEMORY_SHARED_CACHE`): the processes
    /// naming the same pool share one budget per GPU. None: each process is capped alone.
    pub pool: Option<PoolSpec>,
    /// The driver's grant whose container pool [`Config::pool`] is by default (no
    /// claim directory comes with the grant and the environment named no pool):
    /// a configuration file that names a pool replaces it without a word.
    pub pool_of_grant: Option<String>,
    /// `GPUCAP_POOL_DIR`: where named pools' files live.
    pub pool_dir: Option<PathBuf>,
    /// `GPUCAP_WAIT`: how long an allocation the pool cannot take now waits for members
    /// to free memory (zero: refused at once).
    pub wait: std::time::Duration,
    /// `GPUCAP_POOL_MEMBERS`: the member slots of a pool file this process makes
    /// (None: the default, 256). A file that exists keeps its own count.
    pub pool_members: Option<usize>,
    /// `GPUCAP_GUARANTEE`: bytes the pool keeps for this process (a fraction: of the
    /// pool's cap). Only in a pool.
    pub guarantee: Option<LimitSpec>,
    /// `GPUCAP_CEILING`: the most this process may hold of the pool (a fraction: of the
    /// pool's cap). Only in a pool.
    pub ceiling: Option<LimitSpec>,
    /// Every source of caps (`GPUCAP_LIMIT`, HAMi-core's, the drivers' of
    /// `config::sources`), in that order; `limit` is the first one's, and they agree.
    pub cap_sources: Vec<CapSource>,
    /// The variables the caps came from, for `gpucap check`.
    pub origins: Vec<Origin>,
    /// The configuration file's cap where the environment has variables of its own
    /// (`under_file`, in `ceiling.rs`): no GPU's cap is above it. None: no file, or no
    /// cap in it.
    pub bound: Option<Ceiling>,
    /// A second ceiling over [`bound`](Self::bound): `/etc/gpucap/gpucap.env`'s, where a
    /// `gpucap.env` beside a copy of the library was read too (a user's copy of the
    /// library with a file of its own beside it never passes over the machine's).
    /// On each GPU the smaller of the two holds.
    pub outer: Option<Ceiling>,
    /// The environment sets `CUDA_VISIBLE_DEVICES`: which GPU each CUDA ordinal is, is
    /// its choice, so a ceiling's ordinal keys may name other GPUs than its writer saw
    /// (`device_cap` then holds each GPU at the least of them).
    pub visible_chosen: bool,
    /// `GPUCAP_ORDINALS`: the GPUs the ordinal keys were written under (`ordinals`),
    /// which `from_vars` has moved them from onto the process's own (where the keys are
    /// those the frame came with).
    pub ordinals: Option<Ordinals>,
    /// `GPUCAP_TYPED`: the flags of `gpucap run` that set variables, which lines name
    /// instead of the variables (`name_typed`, in `typed.rs`).
    pub typed: Vec<&'static str>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limit: None,
            limit_none: false,
            log: LogLevel::Warn,
            growth: false,
            report: None,
            ld_so_preload: false,
            notes: Vec::new(),
            info: Vec::new(),
            pool: None,
            pool_of_grant: None,
            pool_dir: None,
            wait: std::time::Duration::ZERO,
            pool_members: None,
            guarantee: None,
            ceiling: None,
            cap_sources: Vec::new(),
            origins: Vec::new(),
            bound: None,
            outer: None,
            visible_chosen: false,
            ordinals: None,
            typed: Vec::new(),
        }
    }
}

/// A bad `GPUCAP_*` variable. Displays as one line:
/// `gpucap: invalid GPUCAP_LIMIT="150%": a percentage must be in (0%, 100%]; accepted: ...`
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigError {
    /// The variable's name.
    pub var: String,
    /// Its value (lossily converted if it was not UTF-8).
    pub value: String,
    /// What is wrong.
    pub reason: String,
    /// The forms that would have been accepted ("" = none to show).
    pub accepted: &'static str,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The name is escaped like the value: a line break in it stays on one line.
        write!(
            f,
            "gpucap: invalid {}={:?}: {}",
            self.var.escape_debug(),
            self.value,
            self.reason
        )?;
        if !self.accepted.is_empty() {
            write!(f, "; accepted: {}", self.accepted)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// One variable a cap came from, for `gpucap check`: `CUDA_MEM_LIMIT_0="1024m"` from
/// vgpu-manager, for the GPU `key` (None: every GPU).
#[derive(Clone, Debug, PartialEq)]
pub struct Origin {
    /// The variable's name.
    pub var: String,
    /// Its value, as set.
    pub value: String,
    /// Who sets it: `GPUCAP_LIMIT`, `vgpu-manager`, ...
    pub driver: &'static str,
    /// The GPU it caps (None: every GPU the process sees).
    pub key: Option<DeviceKey>,
}

impl Origin {
    /// `CUDA_MEM_LIMIT_0="1024m" (vgpu-manager)`.
    pub fn text(&self) -> String {
        format!("{}={:?} ({})", self.var, self.value, self.driver)
    }

    /// Whether it caps the GPU with CUDA ordinal `ordinal` and UUID `uuid`.
    pub fn covers(&self, ordinal: u32, uuid: Option<&[u8; 16]>) -> bool {
        match &self.key {
            None => true,
            Some(DeviceKey::Ordinal(n)) => *n == ordinal,
            Some(DeviceKey::Uuid(u)) => uuid == Some(&u.bytes),
        }
    }
}

/// A source of caps: what it is called in messages, and the caps it gives.
#[derive(Clone, Debug, PartialEq)]
pub struct CapSource {
    /// `NVIDIA_GPU_MEMORY_LIMIT="512" (NVIDIA container toolkit)`.
    pub name: String,
    /// The first variable of it and its value, for the error's `invalid VAR="VALUE"`.
    pub var: String,
    pub value: String,
    pub spec: LimitSpec,
}

impl CapSource {
    /// Whether it names a GPU by UUID (compared only once the visible GPUs are known).
    pub(super) fn has_uuid_keys(&self) -> bool {
        self.spec.uuid_keys().next().is_some()
    }
}

/// A cap handed down: the configuration file's, which no variable of the environment
/// raises or removes.
#[derive(Clone, Debug, PartialEq)]
pub struct Ceiling {
    /// The file's cap.
    pub spec: LimitSpec,
    /// The file it came from.
    pub from: String,
    /// What the environment asked instead (`GPUCAP_LIMIT="4Gi"`), if it set a cap or
    /// `GPUCAP_LIMIT=none`; None: it set none, and the file's cap is the cap.
    pub asked: Option<String>,
    /// The environment asked for no cap (`GPUCAP_LIMIT=none`): held at the ceiling
    /// on every GPU the ceiling caps.
    pub asked_none: bool,
}
