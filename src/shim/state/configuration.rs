//! The configuration: read once, on the first CUDA call (the environment, a
//! `gpucap.env` beside the library or in /etc/gpucap, a driver's hand-over), and a
//! device's limit turned into its cap in bytes, under a ceiling handed down.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use gpucap_core::config::{self, Config};

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
            // Files read: no cancellation meanwhile (`cancel.rs`).
            let _held = crate::cancel::NoCancel::hold();
            let dirs = library_dirs();
            let result = load_config(&dirs);
            match &result {
                Ok((c, from)) => {
                    crate::log::LEVEL.store(c.log as u8, Relaxed);
                    // Its notes and info lines wait for CUDA (`say_notes`): a process
                    // that only reads NVML (nvidia-smi in a capped container) is silent.
                    if let Some(file) = from {
                        log!(
                            Debug,
                            "configuration (or its pool) read from {}",
                            file.display()
                        );
                    }
                    if let [own, others @ ..] = dirs.as_slice() {
                        for other in others {
                            log!(
                                Debug,
                                "another copy of libgpucap.so is loaded (from {}): the one \
                                 from {} caps, the other stays idle",
                                other.display(),
                                own.display()
                            );
                        }
                    }
                }
                // The error is always shown, whatever GPUCAP_LOG says: it may be the
                // very variable that is wrong, and the program is being stopped.
                Err(e) => crate::log::say(e),
            }
            result.map(|(c, _)| c)
        });
        loaded.as_ref().map_err(|_| Misconfigured)
    }

    /// The configuration's notes (HAMi-core variables gpucap does not act on, a shared
    /// cache, SM limits, decimal units: warn level, so never silently ignored) and its
    /// info lines, said once, at the process's first `cuInit`: not where it only reads
    /// NVML, whose every tool would print them.
    pub fn say_notes(&self) {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let Ok(c) = self.config() else {
            return;
        };
        if SAID.swap(true, Relaxed) {
            return;
        }
        for note in &c.notes {
            log!(Warn, "{note}");
        }
        for line in &c.info {
            log!(Info, "{line}");
        }
    }

    /// Makes sure `device`'s cap is known ([`config::device_cap`]: the rule lives in core),
    /// asking the driver the device's physical total through `physical_total` at most
    /// once. A fraction that cannot be resolved caps the device at zero: never uncapped.
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
        let resolved = config::device_cap(config, device, limit_of, physical_total);
        for note in &resolved.notes {
            if note.is_error() {
                log!(Error, "{}", note.text(device));
            } else {
                log!(Warn, "{}", note.text(device));
            }
        }
        if let Some(h) = resolved.handed_down {
            // Its pool slot or its visible file says so, for `gpucap status`.
            crate::membership::note_at_ceiling(device);
            crate::lone::mark_handed_down(h.word(), device);
        }
        self.ledger.set_ceiling(device, resolved.ceiling_bytes);
        self.ledger.set_cap(device, resolved.cap);
        flag.store(true, Release);
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
fn load_config(dirs: &[PathBuf]) -> Result<(Config, Option<PathBuf>), String> {
    let (mut env, secure) = (config_vars(), secure_execution());
    // A program that runs as another user than the one who started it uses no path or
    // pool the environment names.
    let dropped = secure
        .then(|| config::drop_in_secure_execution(&mut env))
        .flatten();
    // Whether the GPUs a ceiling's ordinals name are the environment's choice: a file's
    // configuration, read alone, takes it from the environment too.
    let chosen = env.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES");
    // What this process's children inherit: these variables, and the library where a
    // file took part (or could not be read: the child fails closed as this one does).
    hand_down_vars(&env);
    let loaded = load_config_from(env, dirs);
    hand_down_file(!matches!(loaded, Ok((_, None))));
    loaded.map(|(mut c, f)| {
        c.notes.extend(dropped);
        c.visible_chosen |= chosen;
        (c, f)
    })
}

/// [`load_config`] of the environment's variables `env`.
fn load_config_from(
    env: Vec<(OsString, OsString)>,
    dirs: &[PathBuf],
) -> Result<(Config, Option<PathBuf>), String> {
    let dirs: Vec<&std::path::Path> = dirs.iter().map(PathBuf::as_path).collect();
    let file = config::from_env_files(&dirs)?;
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

/// Whether the process runs in secure execution (asked at the FFI edge).
#[cfg(not(test))]
fn secure_execution() -> bool {
    crate::environ::secure_execution()
}

/// Unit tests run as the user who started them.
#[cfg(test)]
fn secure_execution() -> bool {
    false
}

/// Remembers the configuration's variables for the children (`hand_down.rs`).
#[cfg(not(test))]
fn hand_down_vars(env: &[(OsString, OsString)]) {
    let vars = env.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes()));
    crate::hand_down::remember_vars(vars);
}

/// Remembers whether a configuration file took part, for the children.
#[cfg(not(test))]
fn hand_down_file(file: bool) {
    crate::hand_down::remember_file(file);
}

/// Unit tests start no child.
#[cfg(test)]
fn hand_down_vars(_: &[(OsString, OsString)]) {}

/// Unit tests start no child.
#[cfg(test)]
fn hand_down_file(_: bool) {}

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

/// The directories of the copies of libgpucap.so loaded, this one's first (asked of the
/// loader at the FFI edge).
#[cfg(not(test))]
fn library_dirs() -> Vec<PathBuf> {
    crate::resolve::library_dirs()
}

/// Unit tests run without the library: no directory of its own.
#[cfg(test)]
fn library_dirs() -> Vec<PathBuf> {
    Vec::new()
}

// ---- reports and the exit summary ------------------------------------------------------
