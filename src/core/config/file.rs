//! The configuration file `gpucap.env`, for processes whose environment was emptied.

use super::env::{PREFIX, from_vars, gpucap_like};
use super::hami::HAMI_PREFIX;
use super::limit::LimitFrom;
use super::model::{Config, ENV_FILE_NAME, ETC_ENV_FILE};
use super::ordinals::ORDINALS_VAR;
use super::sources::is_handover_name;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

// ---- the configuration file ----------------------------------------------------------
//
// A process whose environment was emptied (`ssh`, `su -`, `sudo`, `env -i`) but that
// still loads the shim (`/etc/ld.so.preload`, or an explicit LD_PRELOAD) must stay
// capped. The container entrypoint therefore writes the validated `GPUCAP_*`
// variables to `gpucap.env` beside libgpucap.so (`gpucap check --write-env FILE`), and
// the shim reads that file, or else `/etc/gpucap/gpucap.env`. When its environment
// has no `GPUCAP_*` variable at all, the file is the configuration; beside variables
// that are set, its cap and pool are a ceiling (`ceiling.rs`).

/// Does `vars` hold any `GPUCAP_*`, HAMi-core `CUDA_DEVICE_MEMORY_*` or driver hand-over
/// variable (`config::sources`)
/// (whatever its value)? If not, the configuration file is the whole configuration;
/// if so, the file is a ceiling over it (`under_file`).
pub fn has_gpucap_vars<I, K, V>(vars: I) -> bool
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
{
    vars.into_iter()
        .any(|(k, _)| configures(k.as_ref().as_bytes()))
}

/// Whether a variable of this name configures gpucap: a `GPUCAP_*` one, HAMi-core's
/// `CUDA_DEVICE_MEMORY_*`, or a driver's hand-over (not the others the configuration
/// reads: `NVIDIA_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`, HAMi-core's compute knobs).
pub fn configures(name: &[u8]) -> bool {
    gpucap_like(name) || name.starts_with(HAMI_PREFIX.as_bytes()) || is_handover_name(name)
}

/// The configuration of the configuration file: `gpucap.env` beside libgpucap.so, in
/// `lib_dirs` (the directory of each copy of the library the process has loaded, this
/// one first: a second copy comes with another path in `LD_PRELOAD` beside
/// `/etc/ld.so.preload`'s), else `ETC_ENV_FILE`. Where the files beside two copies
/// differ, that is an error naming both: the copy that caps is the first one loaded,
/// which the program's own `LD_PRELOAD` chooses, so a file beside another copy (an
/// operator's ceiling) is never passed over for it. `Ok(None)` when there is none; an
/// unreadable or invalid file is an error naming it. Used by the shim for a process
/// whose environment has no `GPUCAP_*` variable (and as the ceiling over one that has),
/// and by `gpucap check` to show what the shim would read.
pub fn from_env_files(
    lib_dirs: &[&std::path::Path],
) -> Result<Option<(Config, std::path::PathBuf)>, String> {
    let mut beside: Vec<(std::path::PathBuf, Vec<u8>)> = Vec::new();
    for dir in lib_dirs {
        let file = dir.join(ENV_FILE_NAME);
        if beside.iter().any(|(f, _)| *f == file) {
            continue;
        }
        if let Some(bytes) = read_if_there(&file)? {
            beside.push((file, bytes));
        }
    }
    if let Some((first, bytes)) = beside.first() {
        if let Some((other, _)) = beside.iter().find(|(_, b)| b != bytes) {
            return Err(format!(
                "gpucap: two copies of libgpucap.so are loaded, and the configuration files \
                 beside them differ ({} and {}): load one copy (LD_PRELOAD, /etc/ld.so.preload) \
                 or make the files the same",
                first.display(),
                other.display()
            ));
        }
        let (file, path) = parse_file(first, bytes.clone())?;
        // /etc's file, where there is one too, is a ceiling over the file beside the
        // copy: a copy of the library a user made, with a file of its own beside it,
        // never passes over the machine's.
        let etc = std::path::PathBuf::from(ETC_ENV_FILE);
        return match read_if_there(&etc)? {
            Some(etc_bytes) if etc_bytes != *bytes => {
                let (over, _) = parse_file(&etc, etc_bytes)?;
                Ok(Some((under_etc(file, bytes, &path, over), path)))
            }
            _ => Ok(Some((file, path))),
        };
    }
    let etc = std::path::PathBuf::from(ETC_ENV_FILE);
    match read_if_there(&etc)? {
        Some(bytes) => parse_file(&etc, bytes).map(Some),
        None => Ok(None),
    }
}

/// The configuration of the file at `path` (`file`, of `bytes`) under `/etc`'s (`etc`),
/// as an environment is under a file's (`under_file`): /etc's cap is its ceiling and
/// /etc's pool binds. The lines say the variables are the file's.
fn under_etc(file: Config, bytes: &[u8], path: &std::path::Path, etc: Config) -> Config {
    let pairs = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| parse_env_file(t).ok())
        .unwrap_or_default();
    let raw = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut c = super::ceiling::under_file(file, &raw, etc, std::path::Path::new(ETC_ENV_FILE));
    if let Some(b) = c.bound.as_mut() {
        b.asked = b.asked.take().map(|a| format!("{a} in {}", path.display()));
    }
    c
}

/// The bytes of `file`; None where it (or a directory of its path) does not exist.
fn read_if_there(file: &std::path::Path) -> Result<Option<Vec<u8>>, String> {
    use std::io::ErrorKind;
    match std::fs::read(file) {
        Ok(b) => Ok(Some(b)),
        // A link to nothing is a file that was meant to be there: refused, as an
        // unreadable one is (taken for no file, its cap would quietly be none).
        Err(e) if e.kind() == ErrorKind::NotFound && std::fs::symlink_metadata(file).is_ok() => {
            Err(format!(
                "gpucap: cannot read the configuration file {}: it is a link to nothing ({e})",
                file.display()
            ))
        }
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(format!(
            "gpucap: cannot read the configuration file {}: {e}",
            file.display()
        )),
    }
}

/// The configuration `file` holds (its `bytes`), or why it is invalid, naming it.
fn parse_file(
    file: &std::path::Path,
    bytes: Vec<u8>,
) -> Result<(Config, std::path::PathBuf), String> {
    let pairs = String::from_utf8(bytes)
        .map_err(|_| "not UTF-8 text".to_string())
        .and_then(|t| parse_env_file(&t))
        .map_err(|why| {
            format!(
                "gpucap: invalid configuration file {}: {why}",
                file.display()
            )
        })?;
    match from_vars(pairs) {
        Ok(c) => Ok((c, file.to_path_buf())),
        Err(e) => Err(format!("{e} (in {})", file.display())),
    }
}

/// Parses a `gpucap.env` file: one `GPUCAP_NAME=value` per line, the value taken
/// verbatim up to the end of the line (no quoting, no `export`); blank lines and
/// lines starting with `#` are skipped. Anything else is an error naming the line:
/// the file stands in for the environment, so a damaged one must fail closed.
/// The pairs go to [`from_vars`], which validates names and values.
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut lines: Vec<(&str, usize)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((name, value)) = trimmed.split_once('=') else {
            return Err(format!("line {}: expected GPUCAP_NAME=value", i + 1));
        };
        if !name.starts_with(PREFIX) || name.contains(char::is_whitespace) {
            return Err(format!(
                "line {}: {name:?} is not a GPUCAP_* variable name (only those belong here)",
                i + 1
            ));
        }
        if name == ORDINALS_VAR {
            return Err(format!(
                "line {}: {ORDINALS_VAR} belongs to a process's environment (the GPUs its \
                 parent's ordinal keys counted), never to a file, whose keys are never \
                 moved: write them as ordinals of the processes that read it, or by UUID",
                i + 1
            ));
        }
        // A name given twice is refused: which line should hold is not the file's to
        // leave open (an operator appending a lower cap would otherwise keep the first).
        if let Some(first) = lines.iter().find(|(n, _)| *n == name) {
            return Err(format!(
                "line {}: {name} is set again (first on line {}): keep one line for it",
                i + 1,
                first.1
            ));
        }
        lines.push((name, i + 1));
        out.push((name.to_string(), value.to_string()));
    }
    Ok(out)
}

/// The text of a `gpucap.env` file holding `vars` (the `GPUCAP_*` ones only, in
/// order, first occurrence of each name). A limit set by HAMi-core's
/// `CUDA_DEVICE_MEMORY_LIMIT*` variables alone is written as the `GPUCAP_LIMIT` it
/// resolves to, in bytes (the file holds `GPUCAP_*` variables only). A value with a
/// line break cannot be written (the format has no quoting): an error naming the
/// variable; so is a configuration [`from_vars`] refuses.
pub fn format_env_file<I, K, V>(vars: I) -> Result<String, String>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let vars: Vec<(K, V)> = vars.into_iter().collect();
    let config = from_vars(vars.iter().map(|(k, v)| (k, v))).map_err(|e| e.to_string())?;
    let mut text = format_gpucap_vars(&vars)?;
    if let Some(spec) = config
        .limit
        .as_ref()
        .filter(|s| matches!(s.from, LimitFrom::Hami | LimitFrom::Handover(_)))
    {
        let value = spec
            .to_gpucap_limit()
            .ok_or("the drivers' limit has no byte value to write")?;
        let whose = match spec.from {
            LimitFrom::Hami => "HAMi-core's variables",
            _ => "the driver's hand-over",
        };
        text.push_str(&format!(
            "# from {} ({whose}), in bytes\nGPUCAP_LIMIT={value}\n",
            spec.source()
        ));
    }
    Ok(text)
}

/// What the header of a file [`format_env_file`] made says of its writer.
pub const WRITTEN_BY_CHECK: &str = "written by `gpucap check --write-env`";

/// The header and the `GPUCAP_*` lines of [`format_env_file`].
fn format_gpucap_vars<K, V>(vars: &[(K, V)]) -> Result<String, String>
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let mut text = format!(
        "# gpucap configuration, {WRITTEN_BY_CHECK} (the container\n\
         # entrypoint). The shim reads it when its environment has no GPUCAP_* variable;\n\
         # beside variables that are set, its cap and pool are a ceiling they cannot lift.\n",
    );
    let mut seen: Vec<String> = Vec::new();
    for (k, v) in vars {
        let (k, v) = (k.as_ref(), v.as_ref());
        // GPUCAP_TYPED names the flags of the command that wrote the file: every process
        // that read it would name a flag nobody typed.
        if !k.as_bytes().starts_with(PREFIX.as_bytes()) || k == "GPUCAP_TYPED" {
            continue;
        }
        let (Some(k), Some(v)) = (k.to_str(), v.to_str()) else {
            return Err(format!("{} is not valid UTF-8", k.to_string_lossy()));
        };
        if seen.iter().any(|s| s == k) {
            continue;
        }
        if k == ORDINALS_VAR {
            return Err(format!(
                "{ORDINALS_VAR}={v:?} moves the ordinal keys onto this process's GPUs, and \
                 {ENV_FILE_NAME} holds keys that are never moved: unset it, writing the keys \
                 as ordinals of the processes that read the file, or by UUID"
            ));
        }
        if v.contains(['\n', '\r']) {
            return Err(format!(
                "{k} contains a line break, which {ENV_FILE_NAME} cannot hold"
            ));
        }
        text.push_str(&format!("{k}={v}\n"));
        seen.push(k.to_string());
    }
    Ok(text)
}
