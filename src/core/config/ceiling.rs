//! Ceilings: a cap handed down in a configuration file (`gpucap.env` beside the library,
//! or `/etc/gpucap/gpucap.env`) binds whatever the program's environment says.
//!
//! The environment may lower the cap, pick a log level, a report file, growth mode, a
//! pool directory or a pool of its own (where the file names none), but never raise
//! the cap, remove it (`GPUCAP_LIMIT=none`) or leave the file's pool. A driver's grant
//! in the environment (HAMi-core's variables, `config::sources`) is a ceiling too;
//! where it meets the file's, the smaller holds on each GPU. A fraction is compared in
//! bytes, once the GPU's total is known ([`cap_under`], in the shim). Where the
//! environment asks for more, the process runs at the ceiling and [`held_line`] says so.

use std::path::Path;

use super::*;

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

/// The configuration of a process whose environment (`env`, already read) has
/// variables of its own while a configuration file (`file`, read from `path`) exists:
/// the environment's choices under the file's ceiling. `raw` gives a variable of the
/// environment as set. The lines of what the environment could not do are added to
/// `notes` (the shim says each at warn level, `gpucap check` prints them); a cap above
/// the ceiling is said by the shim per GPU, in bytes ([`held_line`]).
pub fn under_file(
    env: Config,
    raw: &dyn Fn(&str) -> Option<String>,
    file: Config,
    path: &Path,
) -> Config {
    let mut c = env;
    let from = path.display().to_string();
    // What the environment leaves unset comes from the file.
    if raw("GPUCAP_LOG").is_none() {
        c.log = file.log;
    }
    if raw("GPUCAP_GROWTH").is_none() {
        c.growth = file.growth;
    }
    if raw("GPUCAP_REPORT").is_none() {
        c.report = c.report.take().or(file.report);
    }
    if raw("GPUCAP_POOL_MEMBERS").is_none() {
        c.pool_members = c.pool_members.or(file.pool_members);
    }
    // The file's pool binds: the process stays in it, whatever the environment names.
    match file.pool {
        Some(pool) => {
            let dir_moved = matches!(pool, PoolSpec::Name(_))
                && c.pool_dir.is_some()
                && c.pool_dir != file.pool_dir;
            if c.pool.as_ref() != Some(&pool) && (c.pool.is_some() || env_names_pool(raw)) {
                let asked = match pool_vars_set(raw) {
                    s if s.is_empty() => "the environment's pool".to_string(),
                    s => s,
                };
                c.notes.push(format!(
                    "gpucap: {asked} would leave the pool {pool} that {from} names: the process \
                     stays in it (the environment may not leave a pool handed down)"
                ));
            } else if dir_moved {
                c.notes.push(format!(
                    "gpucap: GPUCAP_POOL_DIR={:?} would move the pool {pool} that {from} names \
                     to another file: the process stays in the file's",
                    raw("GPUCAP_POOL_DIR").unwrap_or_default()
                ));
            }
            c.pool = Some(pool);
            c.pool_dir = file.pool_dir;
            if raw("GPUCAP_WAIT").is_none() {
                c.wait = file.wait;
            }
            if raw("GPUCAP_GUARANTEE").is_none() {
                c.guarantee = c.guarantee.take().or(file.guarantee);
            }
            if raw("GPUCAP_CEILING").is_none() {
                c.ceiling = c.ceiling.take().or(file.ceiling);
            }
        }
        None => {
            if c.pool.is_some() && c.pool_dir.is_none() {
                c.pool_dir = file.pool_dir;
            }
        }
    }
    c.notes.extend(file.notes);
    let Some(spec) = file.limit else {
        return c; // the file places no cap: the environment's stands
    };
    let none = raw("GPUCAP_LIMIT").filter(|v| limit_is_none(v));
    let asked = match (&c.limit, &none) {
        (Some(_), _) => Some(asked_text(&c, raw)),
        (None, Some(v)) => Some(format!("GPUCAP_LIMIT={v:?}")),
        (None, None) => None,
    };
    if c.limit.is_none() {
        c.limit = Some(spec.clone());
    }
    c.bound = Some(Ceiling {
        spec,
        from,
        asked,
        asked_none: none.is_some(),
    });
    c
}

/// Whether the environment names a pool (or none: `GPUCAP_POOL=off`).
fn env_names_pool(raw: &dyn Fn(&str) -> Option<String>) -> bool {
    !pool_vars_set(raw).is_empty()
}

/// The environment's pool variables as set, for the line.
fn pool_vars_set(raw: &dyn Fn(&str) -> Option<String>) -> String {
    ["GPUCAP_POOL", "GPUCAP_CLAIM_DIR", HAMI_SHARED_CACHE]
        .iter()
        .filter_map(|&v| raw(v).map(|x| format!("{v}={x:?}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The environment's cap as set: its sources' names (`GPUCAP_LIMIT="4Gi"`,
/// `CUDA_DEVICE_MEMORY_LIMIT="4096m" (HAMi-core)`).
fn asked_text(c: &Config, raw: &dyn Fn(&str) -> Option<String>) -> String {
    if c.cap_sources.is_empty() {
        return format!("GPUCAP_LIMIT={:?}", raw("GPUCAP_LIMIT").unwrap_or_default());
    }
    c.cap_sources
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(" and ")
}

/// A GPU's cap in bytes: the smaller of the environment's (`asked`) and the ceiling's,
/// each resolved against the GPU's `total` if a fraction (an unknown total: 0, never
/// uncapped). `held` is true where the ceiling is below what was asked (or nothing
/// was asked but the environment set `none`, told by the caller through `asked`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capped {
    pub cap: Option<u64>,
    pub held: bool,
}

/// See [`Capped`].
pub fn cap_under(asked: Option<Limit>, ceiling: Option<Limit>, total: Option<u64>) -> Capped {
    let bytes = |l: Limit| match l {
        Limit::Bytes(b) => b,
        Limit::Fraction(_) => total.map_or(0, |t| l.resolve(t)),
    };
    let (a, c) = (asked.map(bytes), ceiling.map(bytes));
    match (a, c) {
        (Some(a), Some(c)) => Capped {
            cap: Some(a.min(c)),
            held: c < a,
        },
        (None, Some(c)) => Capped {
            cap: Some(c),
            held: true,
        },
        (a, None) => Capped {
            cap: a,
            held: false,
        },
    }
}

/// The line of a GPU held at its ceiling: what the environment asked, the ceiling and
/// where it came from.
pub fn held_line(ceiling: &Ceiling, device: usize, cap: u64) -> String {
    format!(
        "gpucap: {} asks more than the ceiling of GPU {device}, {} (from {}): the program \
         runs at the ceiling",
        ceiling.asked.as_deref().unwrap_or("the environment"),
        crate::size::format_bytes(cap),
        ceiling.from
    )
}
