//! The configuration: read once, on the first CUDA call (the environment, a
//! `gpucap.env` beside the library or in /etc/gpucap, a driver's hand-over), and a
//! device's limit turned into its cap in bytes, under a ceiling handed down.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::Ordering::*;

use gpucap_core::config::{self, Config};
use gpucap_core::size::format_bytes;

use crate::log::log;

use super::{ACTIVE_PID, Misconfigured, Shim};

impl Shim {
    /// The configuration, read from the environment on first use. An invalid one is
    /// reported once and makes every later call fail closed. Marks the process as one
    /// that called into CUDA (it writes a report and a summary at exit).
    pub fn config(&self) -> Result<&Config, Misconfigured> {
        if ACTIVE_PID.load(Relaxed) == 0 {
            let _ = ACTIVE_PID.compare_exchange(0, std::process::id(), Relaxed, Relaxed);
        }
        self.config_quiet()
    }

    /// The configuration, as [`config`](Self::config), for a call that is not a CUDA
    /// call (NVML): the process is not marked as a CUDA user by it.
    pub fn config_quiet(&self) -> Result<&Config, Misconfigured> {
        let loaded = self.config.get_or_init(|| {
            let result = load_config();
            match &result {
                Ok((c, from)) => {
                    crate::log::LEVEL.store(c.log as u8, Relaxed);
                    // HAMi-core variables gpucap does not act on (a shared cache, SM
                    // limits): said at warn level, so never silently ignored.
                    for note in &c.notes {
                        log!(Warn, "{note}");
                    }
                    if let Some(file) = from {
                        log!(
                            Debug,
                            "configuration (or its pool) read from {}",
                            file.display()
                        );
                    }
                }
                // The error is always shown, whatever GPUCAP_LOG says: it may be the
                // very variable that is wrong, and the program is being stopped.
                Err(e) => eprintln!("{e}"),
            }
            result.map(|(c, _)| c)
        });
        loaded.as_ref().map_err(|_| Misconfigured)
    }

    /// Makes sure `device`'s cap is known, computing a fraction from the device's
    /// physical total (asked of the driver through `physical_total` only once).
    /// A fraction that cannot be resolved caps the device at zero: never uncapped.
    pub fn resolve_cap(&self, device: usize, physical_total: impl FnOnce() -> Option<u64>) {
        let Some(flag) = self.cap_resolved.get(device) else {
            return;
        };
        if flag.load(Acquire) {
            return;
        }
        let Ok(config) = self.config() else {
            return;
        };
        let limit_of = |spec: &config::LimitSpec| {
            gpucap_core::identity::limit_for(spec, device, visible_uuids)
        };
        // The driver is asked the GPU's total once, whichever limit needs it.
        let mut physical_total = Some(physical_total);
        let mut total_read: Option<Option<u64>> = None;
        let mut total =
            || *total_read.get_or_insert_with(|| physical_total.take().and_then(|f| f()));
        let asked = match &config.bound {
            Some(b) if b.asked_none => None,
            _ => config.limit.as_ref().and_then(limit_of),
        };
        let cap = match &config.bound {
            None => {
                let cap = resolve_limit(device, asked, &mut total);
                if cap.is_some() {
                    handed_down(config, device); // a driver's hand-over, if it is one
                }
                cap
            }
            // Under a file's ceiling: the smaller of the two, in bytes.
            Some(bound) => {
                let ceiling = limit_of(&bound.spec);
                let fraction =
                    |l: Option<config::Limit>| matches!(l, Some(config::Limit::Fraction(_)));
                let known = if fraction(asked) || fraction(ceiling) {
                    let t = total();
                    if t.is_none() {
                        log!(
                            Error,
                            "cannot read the physical memory of GPU {device} to resolve its cap: allocations on it are refused"
                        );
                    }
                    t
                } else {
                    None
                };
                let capped = config::cap_under(asked, ceiling, known);
                // At the ceiling (held there, or asked just as much), not lowered below it.
                if capped.cap.is_some() && capped.cap == config::cap_under(None, ceiling, known).cap
                {
                    handed_down(config, device);
                }
                if capped.held
                    && bound.asked.is_some()
                    && let Some(c) = capped.cap
                {
                    let line = config::held_line(bound, device, c);
                    log!(Warn, "{}", line.trim_start_matches("gpucap: "));
                }
                // In bytes now: said once if above the GPU's memory, as any cap.
                resolve_limit(device, capped.cap.map(config::Limit::Bytes), &mut total)
            }
        };
        self.ledger.set_cap(device, cap);
        flag.store(true, Release);
    }
}

/// GPU `device`'s cap is a ceiling handed down to this process (a configuration file's or
/// a driver's; nothing where its cap is its environment's own): its pool slot or its
/// visible file says so, for `gpucap status`.
fn handed_down(config: &Config, device: usize) {
    if let Some(h) = config::HandedDown::of(config) {
        crate::membership::note_at_ceiling(device);
        crate::lone::mark_handed_down(h.word(), device);
    }
}

/// A GPU's limit in bytes: bytes as given (said once when above the GPU's memory: it
/// never binds), a fraction of the GPU's total; a fraction whose total cannot be read
/// caps the GPU at zero (never uncapped).
fn resolve_limit(
    device: usize,
    limit: Option<config::Limit>,
    total: &mut dyn FnMut() -> Option<u64>,
) -> Option<u64> {
    match limit {
        None => None,
        // A cap above the GPU's memory never binds: said once, when the device is
        // first used (the driver is asked its total once, as for a fraction).
        Some(config::Limit::Bytes(b)) => {
            if let Some(t) = total()
                && b > t
            {
                log!(
                    Warn,
                    "the cap of GPU {device}, {}, is more than the GPU has ({}): it never binds",
                    format_bytes(b),
                    format_bytes(t)
                );
            }
            Some(b)
        }
        Some(limit) => match total() {
            Some(t) => Some(limit.resolve(t)),
            None => {
                log!(
                    Error,
                    "cannot read the physical memory of GPU {device} to resolve the limit {limit}: allocations on it are refused"
                );
                Some(0)
            }
        },
    }
}

// ---- configuration file ----------------------------------------------------------------

/// The configuration: from the environment, or, when it has no `GPUCAP_*` variable
/// at all (`ssh`, `su -`, `sudo`, `env -i` empty it), from `gpucap.env` beside this
/// library or `/etc/gpucap/gpucap.env` (the container entrypoint writes them). Where
/// both are there, the environment's choices hold under the file's ceiling
/// (`config::under_file`): its cap and its pool bind. Also returns the file used. A
/// file that exists but cannot be read or is invalid is an error (fail closed): it is
/// there to keep such processes capped.
fn load_config() -> Result<(Config, Option<PathBuf>), String> {
    let env = config_vars();
    let file = config::from_env_files(own_dir().as_deref())?;
    if !config::has_gpucap_vars(env.iter().map(|(k, v)| (k, v))) {
        return Ok(match file {
            Some((c, path)) => (config::from_file_alone(c, &path), Some(path)),
            None => (Config::default(), None),
        });
    }
    let c = config::from_vars(env.iter().map(|(k, v)| (k, v))).map_err(|e| e.to_string())?;
    Ok(match file {
        Some((file, path)) => {
            let raw = |name: &str| {
                env.iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.to_string_lossy().into_owned())
            };
            (config::under_file(c, &raw, file, &path), Some(path))
        }
        None => (c, None),
    })
}

/// Lists the visible devices' UUIDs with the real driver.
#[cfg(not(test))]
fn visible_uuids() -> Option<Vec<[u8; 16]>> {
    crate::driver::queries::visible_uuids()
}

/// Unit tests run without a driver: no devices.
#[cfg(test)]
fn visible_uuids() -> Option<Vec<[u8; 16]>> {
    None
}

/// The environment variables the configuration reads (copied at the FFI edge).
#[cfg(not(test))]
fn config_vars() -> Vec<(OsString, OsString)> {
    crate::environ::config_vars()
}

/// Unit tests: the same variables, through `std`.
#[cfg(test)]
fn config_vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| config::looked_at(k.as_encoded_bytes()))
        .collect()
}

/// The directory libgpucap.so was loaded from (asked of the loader at the FFI edge).
#[cfg(not(test))]
fn own_dir() -> Option<PathBuf> {
    crate::resolve::own_dir()
}

/// Unit tests run without the library: no directory of its own.
#[cfg(test)]
fn own_dir() -> Option<PathBuf> {
    None
}

// ---- reports and the exit summary ------------------------------------------------------
