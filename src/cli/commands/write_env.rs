//! What `gpucap check --write-env FILE` (the container entrypoint) writes where a file is
//! there already: the environment's configuration under that file's, which is a ceiling
//! as the shim reads one beside the library (an image's, an operator's, or one an
//! earlier `--write-env` made: a `RUN gpucap check --write-env` in an image's build). The
//! environment may lower its cap, never raise or remove it; what the file sets and the
//! environment does not stays; its pool stays where the environment says `off`. Before,
//! the file was written over with the environment's configuration alone: a container
//! started with `GPUCAP_LIMIT=4Gi`, or with no cap, lifted the image's 512 MiB for every
//! process that lost its environment. Also whether the environment asks more than
//! `/etc/gpucap/gpucap.env` allows (nothing is written then: the file would be read under
//! /etc's ceiling).

use std::ffi::OsString;
use std::path::Path;

use gpucap_core::config::{self, Config, Limit};

use crate::driver;
use crate::environment::lookup;

/// `text` (the environment's file, as `config::format_env_file` made it) under the file
/// at `path`, if there is one: its cap where the environment asks more (or none), its
/// variables the environment does not set, its pool where the environment's is `off`.
/// Ok(the text to write, the lines to say); Err where the file cannot be read, or the
/// two together are not a configuration the shim would read.
pub fn under_existing(
    text: String,
    env: &Config,
    vars: &[(OsString, OsString)],
    probe: &driver::Probe,
    path: &Path,
) -> Result<(String, Vec<String>), String> {
    let theirs_text = match std::fs::read(path) {
        Ok(bytes) => {
            String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((text, Vec::new())),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let theirs =
        config::parse_env_file(&theirs_text).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = config::from_vars(theirs.iter().map(|(k, v)| (k, v)))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let value = |pairs: &[(String, String)], name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut ours = config::parse_env_file(&text)?;
    let mut said = Vec::new();
    let shown = path.display();
    // The cap: the file's where the environment asks more on any GPU, or asks none.
    if let Some(cap) = value(&theirs, "GPUCAP_LIMIT")
        && file.limit.is_some()
        && asks_more(env, vars, probe, &file, path)
    {
        let asked = value(&ours, "GPUCAP_LIMIT").unwrap_or_else(|| "none".into());
        said.push(format!(
            "the environment's cap ({asked}) asks more than {shown} allows: its \
             GPUCAP_LIMIT={cap} is written"
        ));
        set(&mut ours, "GPUCAP_LIMIT", cap);
    }
    // The pool: the file's where the environment leaves every pool.
    if let Some(pool) = value(&theirs, "GPUCAP_POOL")
        && value(&ours, "GPUCAP_POOL").is_some_and(|p| p.eq_ignore_ascii_case("off"))
    {
        said.push(format!(
            "GPUCAP_POOL=off would leave {shown}'s pool: GPUCAP_POOL={pool} is written"
        ));
        set(&mut ours, "GPUCAP_POOL", pool);
    }
    // What the file sets and the environment does not.
    for (k, v) in &theirs {
        if value(&ours, k).is_none() {
            ours.push((k.clone(), v.clone()));
        }
    }
    let merged = config::format_env_file(ours.iter().map(|(k, v)| (k, v)))
        .map_err(|e| format!("{shown} and the environment together: {e}"))?;
    Ok((merged, said))
}

/// A `gpucap.env` written beside the library is read under `/etc/gpucap/gpucap.env`'s
/// ceiling, so a cap above it would never hold: the configuration asks what the image
/// does not allow, and nothing is written. Err where the environment (`config`, `vars`)
/// asks more than it on a GPU of `probe` (or none), with the line that says so.
pub fn within_etc_ceiling(
    config: &Config,
    vars: &[(OsString, OsString)],
    probe: &driver::Probe,
    file: &Path,
) -> Result<(), String> {
    let Some((etc, path)) = config::from_env_files(&[])? else {
        return Ok(());
    };
    if etc.limit.is_none() {
        return Ok(());
    }
    let driver::Probe::Devices(devices) = probe else {
        return Ok(());
    };
    let (under, held) = held_under(config, vars, etc, &path, devices);
    if let (Some(bound), Some((d, cap))) = (under.bound.as_ref(), held) {
        return Err(format!(
            "{}; not written: {}, read under that ceiling, would ask more than it allows",
            config::held_line(bound, d.ordinal as usize, cap)
                .trim_end_matches(": the program runs at the ceiling"),
            file.display()
        ));
    }
    Ok(())
}

/// The environment's configuration `env` under the ceiling `ceiling` (a file's, read
/// from `path`), as the shim reads it, and the first GPU of `devices` on which the
/// environment asks more than the ceiling, with the cap it is held at there.
fn held_under<'d>(
    env: &Config,
    vars: &[(OsString, OsString)],
    ceiling: Config,
    path: &Path,
    devices: &'d [driver::Device],
) -> (Config, Option<(&'d driver::Device, u64)>) {
    let raw = |name: &str| lookup(vars, name).map(|v| v.to_string_lossy().into_owned());
    let under = config::under_file(env.clone(), &raw, ceiling, path);
    let held = devices.iter().find_map(|d| {
        let c = d.cap(&under);
        c.cap.filter(|_| c.held).map(|cap| (d, cap))
    });
    (under, held)
}

/// Sets `name` to `value` in `pairs` (added where it is not there).
fn set(pairs: &mut Vec<(String, String)>, name: &str, value: String) {
    match pairs.iter_mut().find(|(k, _)| k == name) {
        Some(pair) => pair.1 = value,
        None => pairs.push((name.to_string(), value)),
    }
}

/// Whether the environment's configuration `env` asks more than the file's `file` on
/// a GPU of `probe`: no cap where the file caps (`none`), or a larger one (as the shim
/// holds a cap above a file's ceiling). Without the GPUs' figures, a cap other than the
/// file's counts as more, unless both are bytes alike on every GPU and the
/// environment's is not larger.
fn asks_more(
    env: &Config,
    vars: &[(OsString, OsString)],
    probe: &driver::Probe,
    file: &Config,
    path: &Path,
) -> bool {
    let Some(asked) = env.limit.as_ref() else {
        // No cap asked: `none` asks more; unset leaves the file's (merged in).
        return lookup(vars, "GPUCAP_LIMIT")
            .and_then(|v| v.to_str())
            .is_some_and(config::limit_is_none);
    };
    if let driver::Probe::Devices(devices) = probe {
        return held_under(env, vars, file.clone(), path, devices)
            .1
            .is_some();
    }
    let bytes = |s: &config::LimitSpec| match (s.devices.is_empty(), s.default) {
        (true, Some(Limit::Bytes(b))) => Some(b),
        _ => None,
    };
    match (bytes(asked), file.limit.as_ref().and_then(bytes)) {
        (Some(a), Some(f)) => a > f,
        _ => Some(asked) != file.limit.as_ref(),
    }
}
