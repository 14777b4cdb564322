//! What `gpucap check` and `gpucap run` make of a configuration file beside the library
//! (or in `/etc/gpucap`) when the environment has variables of its own: the shim's rule
//! (`config::under_file`: the file's cap is a ceiling). The lines that show each
//! figure, where it came from and which one holds are `report`'s.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use gpucap_core::config::{self, Config};

/// The configuration the shim under `lib` would use: the environment's (`config`, read
/// from `vars`) alone without a file; the file's where the environment has no
/// variable; else the environment's under the file's ceiling. Also the file, if one
/// was read. An unreadable or invalid file is an error, as in the shim.
pub fn as_the_shim_reads(
    config: Config,
    vars: &[(OsString, OsString)],
    lib: Option<&Path>,
) -> Result<(Config, Option<PathBuf>), String> {
    let file = config::from_env_files(lib.and_then(Path::parent))?;
    let Some((file, path)) = file else {
        return Ok((config, None));
    };
    if !config::has_gpucap_vars(vars.iter().map(|(k, v)| (k, v))) {
        return Ok((file, Some(path)));
    }
    let raw = |name: &str| {
        vars.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_string_lossy().into_owned())
    };
    Ok((config::under_file(config, &raw, file, &path), Some(path)))
}
