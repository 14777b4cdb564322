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

use super::hami::HAMI_SHARED_CACHE;
use super::limit::{Limit, limit_is_none};
use super::model::{Ceiling, Config, ENV_FILE_NAME, ETC_ENV_FILE};
use super::pool_vars::PoolSpec;
use super::sources::{DRA_EXAMPLE, HAMI_CLASSIC, HAMI_DRA, NVIDIA_TOOLKIT, VGPU_MANAGER};
use super::typed::name_typed;

/// The configuration of a process whose environment (`env`, already read) has
/// variables of its own while a configuration file (`file`, read from `path`) exists:
/// the environment's choices under the file's ceiling. `raw` gives a variable of the
/// environment as set. The lines of what the environment could not do are added to
/// `notes` (the shim says each at warn level, `gpucap check` prints them); a cap above
/// the ceiling is said by the shim per GPU, in bytes (`held_line`).
pub fn under_file(
    env: Config,
    raw: &dyn Fn(&str) -> Option<String>,
    file: Config,
    path: &Path,
) -> Config {
    let mut file = file;
    let file_notes = std::mem::take(&mut file.notes);
    let mut c = bind_to_file(env, raw, file, path);
    // The environment's lines name the flags typed; the file's own name its variables.
    name_typed(&mut c);
    c.notes.extend(file_notes);
    c
}

/// [`under_file`], its lines naming the variables and without the file's notes.
fn bind_to_file(
    env: Config,
    raw: &dyn Fn(&str) -> Option<String>,
    file: Config,
    path: &Path,
) -> Config {
    let mut c = env;
    let from = path.display().to_string();
    // A file that is itself under a ceiling (one beside a copy of the library, under
    // /etc's) passes that ceiling on: it holds over the file's own.
    c.outer = file.bound.clone().or(file.outer.clone());
    // What the environment leaves unset comes from the file.
    if c.limit.is_none() && raw("GPUCAP_LIMIT").is_none() {
        c.limit_none = file.limit_none;
    }
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
            if let Some(grant) = c.pool_of_grant.take() {
                // The grant's container pool was only the default: the file's holds.
                let by_default = super::sources::container_pool_note(&grant);
                c.info.retain(|l| *l != by_default);
                match raw("GPUCAP_POOL") {
                    Some(v) => {
                        let leaving = super::sources::leaving_container_pool(&v, &grant);
                        c.notes.retain(|l| *l != leaving);
                    }
                    None => c.pool = None,
                }
            }
            if c.pool.as_ref() != Some(&pool) && (c.pool.is_some() || env_names_pool(raw)) {
                let asked = match pool_vars_set(raw) {
                    s if s.is_empty() => "the environment's pool".to_string(),
                    s => s,
                };
                c.notes.push(format!(
                    "{asked} would leave the pool {pool} that {from} names: the process \
                     stays in it (the environment may not leave a pool handed down)"
                ));
            } else if dir_moved {
                c.notes.push(format!(
                    "GPUCAP_POOL_DIR={:?} would move the pool {pool} that {from} names \
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
            // A pool of the environment's, or a lone process's file, goes where the
            // file says unless the environment says otherwise.
            if c.pool_dir.is_none() {
                c.pool_dir = file.pool_dir;
            }
        }
    }
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

/// The line of a process under a ceiling joining a pool that holds GPU `device` to more
/// (`pool_cap`; None: no cap): it joins held at `held` bytes, what it may hold there.
pub fn pool_held_line(
    ceiling: &Ceiling,
    pool: &str,
    device: usize,
    pool_cap: Option<u64>,
    held: u64,
) -> String {
    let cap = pool_cap.map_or("no cap".to_string(), crate::size::format_bytes);
    format!(
        "gpucap: the pool {pool} holds GPU {device} to {cap}, more than this process may hold \
         under the ceiling of {}: it joins the pool held at {}",
        ceiling.from,
        crate::size::format_bytes(held)
    )
}

/// The configuration of a process whose environment has no variable of its own, read
/// from the file `path` alone: its cap is the file's, a ceiling handed down as under
/// [`under_file`] (nothing was asked instead).
pub fn from_file_alone(mut file: Config, path: &Path) -> Config {
    if file.bound.is_none()
        && let Some(spec) = file.limit.clone()
    {
        file.bound = Some(Ceiling {
            spec,
            from: path.display().to_string(),
            asked: None,
            asked_none: false,
        });
    }
    file
}

/// The drivers whose hand-over [`HandedDown::Driver`] names, by index.
const HANDOVER_DRIVERS: [&str; 6] = [
    HAMI_CLASSIC,
    HAMI_DRA,
    VGPU_MANAGER,
    DRA_EXAMPLE,
    NVIDIA_TOOLKIT,
    "HAMi-core",
];

/// Where the ceiling a process is held at came from, as its pool slot or its visible
/// file records it for `gpucap status`, `top` and `metrics`: one word
/// ([`word`](Self::word), 0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandedDown {
    /// `gpucap.env` beside the library.
    BesideLibrary,
    /// `/etc/gpucap/gpucap.env`.
    Etc,
    /// A GPU driver's hand-over in the environment, by its index in the drivers known.
    Driver(u8),
}

/// The low byte of a [`HandedDown`] word says which; the next, the driver.
const HANDED_BESIDE: u64 = 1;
const HANDED_ETC: u64 = 2;
const HANDED_DRIVER: u64 = 3;

impl HandedDown {
    /// A file's ceiling, by the file it came from.
    pub fn of_file(from: &str) -> HandedDown {
        if from == ETC_ENV_FILE {
            HandedDown::Etc
        } else {
            HandedDown::BesideLibrary
        }
    }

    /// Where `config`'s ceiling came from: its file's, or else the driver whose
    /// hand-over gave its cap (None: its cap is its own environment's, or none).
    pub fn of(config: &Config) -> Option<HandedDown> {
        if let Some(b) = &config.bound {
            return Some(HandedDown::of_file(&b.from));
        }
        config.limit.as_ref()?;
        let driver = config.origins.iter().find(|o| o.driver != "gpucap")?.driver;
        let i = HANDOVER_DRIVERS
            .iter()
            .position(|&d| d == driver)
            .unwrap_or(HANDOVER_DRIVERS.len() - 1);
        Some(HandedDown::Driver(i as u8))
    }

    /// As a word of the pool file or the visible file (never 0).
    pub fn word(self) -> u64 {
        match self {
            HandedDown::BesideLibrary => HANDED_BESIDE,
            HandedDown::Etc => HANDED_ETC,
            HandedDown::Driver(i) => HANDED_DRIVER | u64::from(i) << 8,
        }
    }

    /// What a word says (None: 0, or a word no gpucap writes).
    pub fn from_word(word: u64) -> Option<HandedDown> {
        let driver = (word >> 8) as usize;
        match word & 0xff {
            HANDED_BESIDE if driver == 0 => Some(HandedDown::BesideLibrary),
            HANDED_ETC if driver == 0 => Some(HandedDown::Etc),
            HANDED_DRIVER if driver < HANDOVER_DRIVERS.len() => {
                Some(HandedDown::Driver(driver as u8))
            }
            _ => None,
        }
    }

    /// Where it came from, for `status` and `top`: `/etc/gpucap/gpucap.env`,
    /// `gpucap.env beside the library`, `HAMi device plugin's hand-over`.
    pub fn text(self) -> String {
        match self {
            HandedDown::BesideLibrary => format!("{ENV_FILE_NAME} beside the library"),
            HandedDown::Etc => ETC_ENV_FILE.to_string(),
            HandedDown::Driver(i) => format!(
                "{}'s hand-over",
                HANDOVER_DRIVERS
                    .get(usize::from(i))
                    .copied()
                    .unwrap_or("a driver")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::from_vars;
    use crate::config::model::LogLevel;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The environment `env` under the file `file`, as the shim reads them.
    fn merged(env: &[(&str, &str)], file: &[(&str, &str)]) -> Config {
        let env = vars(env);
        let raw = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let e = from_vars(env.iter().map(|(k, v)| (k, v))).unwrap();
        let f = from_vars(vars(file)).unwrap();
        under_file(e, &raw, f, Path::new("/lib/gpucap.env"))
    }

    /// GPU 0's cap in bytes (of a 4 GiB GPU) as the shim works it out.
    fn cap0(c: &Config) -> Capped {
        let b = c.bound.as_ref().expect("a ceiling");
        let asked = if b.asked_none {
            None
        } else {
            c.limit.as_ref().and_then(|s| s.for_ordinal(0))
        };
        cap_under(asked, b.spec.for_ordinal(0), Some(4 * GIB))
    }

    const FILE: &[(&str, &str)] = &[("GPUCAP_LIMIT", "256Mi")];

    #[test]
    fn the_smaller_cap_holds_and_a_raise_is_held_at_the_ceiling() {
        for (env, cap, held) in [
            (vec![], 256 * MIB, false),
            (vec![("GPUCAP_LOG", "debug")], 256 * MIB, false),
            (vec![("GPUCAP_LIMIT", "4Gi")], 256 * MIB, true),
            (vec![("GPUCAP_LIMIT", "90%")], 256 * MIB, true),
            (vec![("GPUCAP_LIMIT", "none")], 256 * MIB, true),
            (vec![("GPUCAP_LIMIT", "0=4Gi")], 256 * MIB, true),
            // GPU 0 left without a cap of its own: no cap asked there, held.
            (vec![("GPUCAP_LIMIT", "1=4Gi")], 256 * MIB, true),
            (vec![("GPUCAP_LIMIT", "128Mi")], 128 * MIB, false),
            (vec![("GPUCAP_LIMIT", "5%")], 4 * GIB / 20, false),
            (vec![("CUDA_DEVICE_MEMORY_LIMIT", "4096m")], 256 * MIB, true),
            (vec![("CUDA_DEVICE_MEMORY_LIMIT", "100m")], 100 * MIB, false),
            (vec![("GPU_DEVICE_0_MEMORY", "4Gi")], 256 * MIB, true),
        ] {
            let c = merged(&env, FILE);
            let got = cap0(&c);
            assert_eq!(got.cap, Some(cap), "{env:?}");
            assert_eq!(got.held, held, "{env:?}");
            let b = c.bound.as_ref().unwrap();
            assert_eq!(b.from, "/lib/gpucap.env");
            // Something was asked exactly where the environment set a cap (or none).
            let asks = env.iter().any(|(k, _)| !k.starts_with("GPUCAP_LOG"));
            assert_eq!(b.asked.is_some(), asks, "{env:?}: {:?}", b.asked);
        }
    }

    #[test]
    fn a_fraction_ceiling_is_compared_in_bytes() {
        let c = merged(&[("GPUCAP_LIMIT", "3Gi")], &[("GPUCAP_LIMIT", "50%")]);
        assert_eq!(
            cap0(&c),
            Capped {
                cap: Some(2 * GIB),
                held: true
            }
        );
        let c = merged(&[("GPUCAP_LIMIT", "1Gi")], &[("GPUCAP_LIMIT", "50%")]);
        assert_eq!(cap0(&c).cap, Some(GIB));
    }

    #[test]
    fn cap_under_never_uncaps() {
        let (b, f) = (Limit::Bytes, Limit::Fraction);
        let c = |a, ceil, t| cap_under(a, ceil, t).cap;
        assert_eq!(c(None, None, None), None);
        assert_eq!(c(Some(b(5)), None, None), Some(5));
        assert_eq!(c(None, Some(b(5)), None), Some(5));
        assert_eq!(c(Some(b(3)), Some(b(5)), None), Some(3));
        assert_eq!(c(Some(b(9)), Some(b(5)), None), Some(5));
        // A fraction without the GPU's total is 0: never more than the ceiling.
        assert_eq!(c(Some(f(0.5)), Some(b(5)), None), Some(0));
        assert_eq!(c(Some(b(9)), Some(f(0.5)), None), Some(0));
        assert_eq!(c(Some(f(0.5)), Some(f(0.25)), Some(100)), Some(25));
        assert!(cap_under(None, Some(b(5)), None).held);
        assert!(!cap_under(Some(b(5)), Some(b(5)), None).held);
    }

    #[test]
    fn the_files_pool_binds_and_the_environment_picks_one_where_the_file_names_none() {
        let file = &[
            ("GPUCAP_LIMIT", "256Mi"),
            ("GPUCAP_POOL", "ctr"),
            ("GPUCAP_POOL_DIR", "/pools"),
        ];
        for env in [
            vec![("GPUCAP_POOL", "off")],
            vec![("GPUCAP_POOL", "mine")],
            vec![("GPUCAP_POOL", "/x/y.pool")],
            vec![("GPUCAP_CLAIM_DIR", "/claim")],
            vec![("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/x/h.cache")],
            vec![("GPUCAP_POOL_DIR", "/elsewhere")],
            vec![("GPUCAP_POOL", "ctr"), ("GPUCAP_POOL_DIR", "/elsewhere")],
        ] {
            let c = merged(&env, file);
            assert_eq!(c.pool, Some(PoolSpec::Name("ctr".into())), "{env:?}");
            assert_eq!(c.pool_dir.as_deref(), Some(Path::new("/pools")), "{env:?}");
            let lines: Vec<_> = c.notes.iter().filter(|n| n.contains("stays in")).collect();
            assert_eq!(lines.len(), 1, "{env:?}: {:?}", c.notes);
            assert!(lines[0].contains("/lib/gpucap.env"), "{lines:?}");
        }
        // The same pool, or nothing said about pools: no line.
        for env in [vec![("GPUCAP_POOL", "ctr")], vec![("GPUCAP_LOG", "info")]] {
            let c = merged(&env, file);
            assert!(c.notes.iter().all(|n| !n.contains("stays in")), "{env:?}");
        }
        // A file without a pool: the environment's choice stands, under the ceiling.
        let c = merged(
            &[("GPUCAP_POOL", "mine"), ("GPUCAP_POOL_DIR", "/mine")],
            FILE,
        );
        assert_eq!(c.pool, Some(PoolSpec::Name("mine".into())));
        assert_eq!(c.pool_dir.as_deref(), Some(Path::new("/mine")));
        assert_eq!(cap0(&c).cap, Some(256 * MIB));
        let c = merged(&[("GPUCAP_POOL", "off")], FILE);
        assert_eq!(c.pool, None);
        assert_eq!(cap0(&c).cap, Some(256 * MIB));
        // A driver's grant's container pool is a default: a file's pool replaces it
        // without a word, and a file without one keeps it.
        let grant = [("GPU_DEVICE_0_MEMORY", "1Gi")];
        let c = merged(&grant, file);
        assert_eq!(c.pool, Some(PoolSpec::Name("ctr".into())));
        assert!(c.notes.iter().all(|n| !n.contains("pool")), "{:?}", c.notes);
        assert!(
            c.info.iter().all(|n| !n.contains("container")),
            "{:?}",
            c.info
        );
        let c = merged(&[grant[0], ("GPUCAP_POOL", "off")], file);
        assert_eq!(c.pool, Some(PoolSpec::Name("ctr".into())));
        let lines: Vec<_> = c.notes.iter().filter(|n| n.contains("stays in")).collect();
        assert_eq!(lines.len(), 1, "{:?}", c.notes);
        assert!(lines[0].contains("/lib/gpucap.env"), "{lines:?}");
        let c = merged(&grant, FILE);
        assert_eq!(c.pool, Some(PoolSpec::Name("container-mntns".into())));
    }

    #[test]
    fn what_the_environment_leaves_unset_comes_from_the_file() {
        let file = &[
            ("GPUCAP_LIMIT", "256Mi"),
            ("GPUCAP_LOG", "info"),
            ("GPUCAP_GROWTH", "1"),
            ("GPUCAP_REPORT", "/r.json"),
        ];
        let c = merged(&[("GPUCAP_LIMIT", "128Mi")], file);
        assert_eq!(c.log, LogLevel::Info);
        assert!(c.growth);
        assert_eq!(c.report.as_deref(), Some(Path::new("/r.json")));
        let c = merged(&[("GPUCAP_LOG", "off"), ("GPUCAP_GROWTH", "0")], file);
        assert_eq!(c.log, LogLevel::Off);
        assert!(!c.growth);
        // The pool directory too (where a lone process shows itself).
        let f = &[("GPUCAP_LIMIT", "256Mi"), ("GPUCAP_POOL_DIR", "/pools")];
        let c = merged(&[("GPUCAP_LOG", "debug")], f);
        assert_eq!(c.pool_dir.as_deref(), Some(Path::new("/pools")));
        let c = merged(&[("GPUCAP_POOL_DIR", "/mine")], f);
        assert_eq!(c.pool_dir.as_deref(), Some(Path::new("/mine")));
    }

    #[test]
    fn a_file_without_a_cap_leaves_the_environments() {
        let c = merged(&[("GPUCAP_LIMIT", "4Gi")], &[("GPUCAP_LOG", "info")]);
        assert_eq!(c.bound, None);
        assert_eq!(c.limit.unwrap().default, Some(Limit::Bytes(4 * GIB)));
    }

    #[test]
    fn the_held_line_names_what_was_asked_the_ceiling_and_the_file() {
        let c = merged(&[("GPUCAP_LIMIT", "4Gi")], FILE);
        let line = held_line(c.bound.as_ref().unwrap(), 0, 256 * MIB);
        assert_eq!(
            line,
            "gpucap: GPUCAP_LIMIT=\"4Gi\" asks more than the ceiling of GPU 0, 256 MiB (from \
             /lib/gpucap.env): the program runs at the ceiling"
        );
    }

    #[test]
    fn the_pool_line_names_the_pool_the_file_and_what_the_process_holds() {
        let c = merged(&[("GPUCAP_POOL", "p")], FILE);
        let b = c.bound.as_ref().unwrap();
        assert_eq!(
            pool_held_line(b, "p", 0, Some(4 * GIB), 256 * MIB),
            "gpucap: the pool p holds GPU 0 to 4 GiB, more than this process may hold under \
             the ceiling of /lib/gpucap.env: it joins the pool held at 256 MiB"
        );
        assert!(pool_held_line(b, "p", 1, None, MIB).contains("GPU 1 to no cap"));
    }

    #[test]
    fn a_file_alone_is_a_ceiling_with_nothing_asked() {
        let f = from_vars(vars(FILE)).unwrap();
        let c = from_file_alone(f, Path::new("/etc/gpucap/gpucap.env"));
        let b = c.bound.as_ref().unwrap();
        assert_eq!((b.asked.as_ref(), b.asked_none), (None, false));
        assert_eq!(
            cap0(&c),
            Capped {
                cap: Some(256 * MIB),
                held: false
            }
        );
        assert_eq!(HandedDown::of(&c), Some(HandedDown::Etc));
        // A file without a cap hands none down.
        let f = from_vars(vars(&[("GPUCAP_LOG", "info")])).unwrap();
        assert_eq!(from_file_alone(f, Path::new("/x")).bound, None);
    }

    #[test]
    fn where_a_ceiling_came_from_is_one_word() {
        assert_eq!(
            HandedDown::of(&merged(&[("GPUCAP_LOG", "info")], FILE)),
            Some(HandedDown::BesideLibrary)
        );
        let env = vars(&[("CUDA_DEVICE_MEMORY_LIMIT", "256m")]);
        let hami = from_vars(env.iter().map(|(k, v)| (k, v))).unwrap();
        let handed = HandedDown::of(&hami).expect("a driver's hand-over");
        assert_eq!(handed.text(), "HAMi device plugin's hand-over");
        let own = from_vars(vars(&[("GPUCAP_LIMIT", "4Gi")])).unwrap();
        assert_eq!(HandedDown::of(&own), None, "the environment's own cap");
        assert_eq!(HandedDown::of(&Config::default()), None);
        for h in [HandedDown::BesideLibrary, HandedDown::Etc, handed] {
            assert_ne!(h.word(), 0);
            assert_eq!(HandedDown::from_word(h.word()), Some(h));
        }
        for w in [0, 4, 0x101, 0x903, u64::MAX] {
            assert_eq!(HandedDown::from_word(w), None, "{w:#x}");
        }
        assert_eq!(HandedDown::Etc.text(), "/etc/gpucap/gpucap.env");
        assert_eq!(
            HandedDown::BesideLibrary.text(),
            "gpucap.env beside the library"
        );
    }
}
