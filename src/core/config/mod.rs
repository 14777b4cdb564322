//! gpucap's configuration: the `GPUCAP_*` environment variables, parsed and validated:
//! `limit` (caps and device keys), `env` (the variables, `Config`), `pool_vars` (which pool,
//! how long to wait for it, where), `file` (`gpucap.env`),
//! `shares` (a pool member's guarantee and ceiling), `ceiling` (a file's cap, which the
//! environment may lower but never raise), `device_cap` (one GPU's cap in bytes under it), `keys` (every per-GPU variable's
//! keys against the visible GPUs), `sources` (the caps the cluster's GPU drivers hand a
//! container, merged with the others by one resolver), `typed` (lines name the flags of
//! `gpucap run` that set variables).
//!
//! Part of gpucap-core, used by the shim and the CLI: plain safe Rust that only needs
//! `crate::size`. The variables are read by name from the pairs given (no envy: it
//! would only copy the same strings into a struct).
//!
//! Any error is returned as a [`ConfigError`]; callers must fail closed (refuse to start,
//! or refuse every allocation), never fall back to running uncapped.

mod ceiling;
mod device_cap;
mod env;
mod file;
mod hami;
mod keys;
mod limit;
mod pool_vars;
mod shares;
mod sources;
mod typed;
mod vars;

pub use ceiling::{Ceiling, HandedDown, from_file_alone, pool_held_line, under_file};
pub use device_cap::device_cap;
pub use env::{Config, ConfigError, LogLevel, from_vars, looked_at, nearest_name};
pub use file::{ENV_FILE_NAME, format_env_file, from_env_files, has_gpucap_vars};
pub use hami::HAMI_SHARED_CACHE;
pub use keys::{check_gpu_keys, check_var_keys, names_gpus};
pub use limit::{
    DeviceKey, DeviceUuid, Limit, LimitFrom, LimitSpec, MAX_DEVICES, format_uuid, limit_is_none,
    parse_limit_spec,
};
pub use pool_vars::{CLAIM_POOL_FILE, PoolSpec, parse_pool};
pub use shares::shares_for;
pub use typed::{flag_of_var, parse_typed, typed_value};

// The names the modules below take from each other through `super::`.
use ceiling::{cap_under, held_line};
use env::{
    CLAIM_DIR_ACCEPTED, GROWTH_ACCEPTED, HOME_ACCEPTED, LD_SO_PRELOAD_ACCEPTED, LIB_ACCEPTED,
    LOG_ACCEPTED, POOL_ACCEPTED, POOL_DIR_ACCEPTED, POOL_MEMBERS_ACCEPTED, PREFIX, REPORT_ACCEPTED,
    WAIT_ACCEPTED, gpucap_like, parse_bool, parse_log_level,
};
use file::ETC_ENV_FILE;
use hami::{HAMI_IGNORED, HAMI_LIMIT, HAMI_PREFIX, check_agree};
use limit::{LIMIT_ACCEPTED, MIN_UNITLESS_BYTES, ZERO_CAP, limit_notes, unitless_message};
use pool_vars::{parse_pool_dir, parse_pool_spec, parse_wait};
use shares::{CEILING_ACCEPTED, GUARANTEE_ACCEPTED, check_shares, parse_share_spec};
use sources::{
    CapSource, DRA_EXAMPLE, HAMI_CLASSIC, HAMI_DRA, HandoverVars, NVIDIA_TOOLKIT,
    NVIDIA_VISIBLE_DEVICES, Origin, VGPU_MANAGER, apply, check_sources_agree, claim_pool_note,
    hami_claim_dir, hami_classic_by_uuid, hami_dra_spec, is_handover_name, merge_hami_by_uuid,
    sources_need_gpus,
};
use typed::{TYPED_ACCEPTED, name_typed, name_typed_error};
use vars::{KNOWN_VARS, VARS, accepted_of, known_vars_list};

#[cfg(test)]
mod tests;
