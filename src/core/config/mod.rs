//! gpucap's configuration: the `GPUCAP_*` environment variables, parsed and validated.
//! The files import one way, each from the layers below it (no module imports one above
//! it, nor one beside it that imports it back):
//!
//! 1. `limit` (caps and device keys), `pool_vars` (which pool, how long to wait for it,
//!    where), `ordinals` (which GPUs ordinal keys count, `GPUCAP_ORDINALS`): values
//!    alone, importing no other file but `limit`.
//! 2. `model`: what a configuration is (`Config`, `ConfigError`, where its caps came
//!    from, a ceiling handed down).
//! 3. the parsers and checks over it: `hami` (HAMi-core's variables), `typed` (lines name
//!    the flags of `gpucap run` that set variables), `agreement` (the sources of caps
//!    agree), `keys` (every per-GPU variable's keys against the visible GPUs), `shares` (a
//!    pool member's guarantee and ceiling), `vars` (the table of `GPUCAP_*` variables).
//! 4. `sources`: the caps the cluster's GPU drivers hand a container, merged with the
//!    others by one resolver.
//! 5. `env`: `from_vars`, the environment read through all of the above.
//! 6. `file` (`gpucap.env`), then `ceiling` (a file's cap, which the environment may lower
//!    but never raise), then `device_cap` (one GPU's cap in bytes under it).
//! 7. `hand_down`: the environment a capped program's child is started with.
//!
//! Part of gpucap-core, used by the shim and the CLI: plain safe Rust that only needs
//! `crate::size`. The variables are read by name from the pairs given (no envy: it
//! would only copy the same strings into a struct).
//!
//! Any error is returned as a [`ConfigError`]; callers must fail closed (refuse to start,
//! or refuse every allocation), never fall back to running uncapped.

mod agreement;
mod ceiling;
mod device_cap;
mod env;
mod file;
mod hami;
mod hand_down;
mod keys;
mod limit;
mod model;
mod ordinals;
mod pool_vars;
mod secure;
mod shares;
mod sources;
mod typed;
mod vars;

pub use ceiling::{HandedDown, from_file_alone, held_line, pool_held_line, under_file};
pub use device_cap::{CapNote, DeviceCap, device_cap};
pub use env::{from_vars, looked_at, may_be_looked_at, nearest_name};
pub use file::{configures, format_env_file, from_env_files, has_gpucap_vars, parse_env_file};
pub use hami::HAMI_SHARED_CACHE;
pub use hand_down::{
    LD_PRELOAD, Part, handed_down, name_of, plan, preload_entries, preloadable, shell_command,
    shell_gets_dashes, write as write_part,
};
pub use keys::{check_gpu_keys, check_var_keys, names_gpus};
pub use limit::{
    DeviceKey, DeviceUuid, Limit, LimitFrom, LimitSpec, MAX_DEVICES, format_uuid, limit_is_none,
    parse_cap_size, parse_limit_spec,
};
pub use model::{Ceiling, Config, ConfigError, ENV_FILE_NAME, ETC_ENV_FILE, LogLevel};
pub use ordinals::{
    Frame, Ordinals, bound_digest, digest_hex, key_digest, keyed_by_ordinal, keys_digest,
    pairs_digest, visible_as_frame,
};
pub use pool_vars::{CLAIM_POOL_FILE, CONTAINER_POOL, PoolSpec, parse_pool};
pub use secure::drop_in_secure_execution;
pub use shares::shares_for;
pub use typed::{
    flag_of_var, name_flags_in, parse_typed, typed_entries, typed_flags, typed_value, value_digest,
};

#[cfg(test)]
mod tests;
