//! The words after `gpucap pool resize` and `gpucap pool set`: their options (the shared
//! `--gpu`, `--dir` and `--claim`, and the command's own), a pool and one value (`NAME
//! VALUE`), or a claim's pool and the value (`--claim DIR VALUE`).

use std::path::PathBuf;

use gpucap_core::config::{PoolSpec, nearest_name, parse_pool};

/// The words read: those that are no option, and the shared options.
#[derive(Debug, Default)]
pub struct Operands {
    pub plain: Vec<String>,
    /// `--gpu`: the GPU's number in `gpucap status --pool` or its UUID.
    pub gpu: Option<String>,
    /// `--dir`: the pool directory.
    pub dir: Option<PathBuf>,
    /// `--claim`: the claim's directory.
    pub claim: Option<String>,
}

/// The options every such command takes.
const SHARED: [&str; 3] = ["--gpu", "--dir", "--claim"];

/// Reads `words` (each option as `--flag VALUE` or `--flag=VALUE`): the shared options,
/// and `command`'s own (`own_options`) through `own`, given the flag and a way to take
/// its value (false: not its option). An unknown option is an error naming `command`
/// and its options, or the nearest one where one is near.
pub fn read(
    words: &[String],
    command: &str,
    own_options: &[&str],
    mut own: impl FnMut(&str, &mut dyn FnMut(&str) -> Result<String, String>) -> Result<bool, String>,
) -> Result<Operands, String> {
    let mut read = Operands::default();
    let mut it = words.iter();
    while let Some(w) = it.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (w.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or(format!("{name} needs a value"))
        };
        let given = match flag {
            "--gpu" => read.gpu.is_some(),
            "--dir" => read.dir.is_some(),
            "--claim" => read.claim.is_some(),
            _ => false,
        };
        if given {
            return Err(format!("{flag} given more than once"));
        }
        match flag {
            "--gpu" => read.gpu = Some(value("--gpu N|UUID")?),
            "--dir" => read.dir = Some(PathBuf::from(value("--dir DIR")?)),
            "--claim" => read.claim = Some(value("--claim DIR")?),
            f if f.starts_with('-') && f.len() > 1 => {
                if own(f, &mut value)? {
                    continue;
                }
                let options: Vec<&str> = own_options.iter().chain(&SHARED).copied().collect();
                return Err(match nearest_name(f, &options) {
                    Some(near) => {
                        format!("unknown option '{f}' of {command} (did you mean {near}?)")
                    }
                    None => format!(
                        "unknown option '{f}' of {command} (the options are {})",
                        listed(&options)
                    ),
                });
            }
            _ => read.plain.push(w.clone()),
        }
    }
    Ok(read)
}

/// `a, b and c`.
fn listed(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The pool as typed (for the lines printed), the value's word, and the pool: the
/// claim's where `--claim DIR` named it, else the name's (`plain`: the words that are no
/// option; `usage`: the command's forms, for the error when their count is wrong).
pub fn pool_and_value<'a>(
    plain: &'a [String],
    claim: Option<String>,
    usage: &str,
) -> Result<(String, &'a String, PoolSpec), String> {
    let (name, value, claimed) = match (plain, claim) {
        ([name, value], None) => (name.clone(), value, None),
        ([value], Some(dir)) if dir.starts_with('/') => (
            format!("--claim {dir}"),
            value,
            Some(PoolSpec::Claim(dir.into())),
        ),
        ([_], Some(dir)) => {
            return Err(format!(
                "--claim {dir}: the absolute path of the claim's directory (as its containers \
                 have GPUCAP_CLAIM_DIR)"
            ));
        }
        _ => return Err(format!("{usage}, {} given", plain.len())),
    };
    match claimed.map_or_else(|| parse_pool(&name), |c| Ok(Some(c))) {
        Ok(Some(spec)) => Ok((name, value, spec)),
        Ok(None) | Err(_) => Err(format!(
            "invalid pool {name:?}: a pool's name, its file's absolute path, or a claim's \
             pool (claim:ID)"
        )),
    }
}
