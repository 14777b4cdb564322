//! `gpucap pool set NAME PID [--guarantee SIZE] [--ceiling SIZE|none] [--gpu N|UUID]
//! [--dir DIR]` (or `--claim DIR` for NAME): the words after `pool set`. Run by
//! `commands::pool`.

use std::path::PathBuf;

use gpucap_core::config::PoolSpec;

/// A parsed `pool set`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub pool: PoolSpec,
    /// The pool as typed (for the lines printed).
    pub name: String,
    /// The member's process id, as `gpucap status` shows it.
    pub pid: u32,
    /// `--guarantee`: the new guarantee (0: none).
    pub guarantee: Option<u64>,
    /// `--ceiling`: the new ceiling (Some(None): `none`, the pool's cap).
    pub ceiling: Option<Option<u64>>,
    /// `--gpu`: the GPU's number in `gpucap status --pool` or its UUID (None: every GPU
    /// the member uses).
    pub gpu: Option<String>,
    /// `--dir`: the pool directory.
    pub dir: Option<PathBuf>,
}

/// Parses the words after `pool set`.
pub fn parse(words: &[String]) -> Result<Request, String> {
    let (mut guarantee, mut ceiling) = (None, None);
    let read = crate::pool_operands::read(
        words,
        "pool set",
        &["--guarantee", "--ceiling"],
        |flag, value| {
            let given = match flag {
                "--guarantee" => guarantee.is_some(),
                "--ceiling" => ceiling.is_some(),
                _ => false,
            };
            if given {
                return Err(format!("{flag} given more than once"));
            }
            match flag {
                "--guarantee" => {
                    let v = value("--guarantee SIZE")?;
                    guarantee = Some(size("--guarantee", &v, true)?);
                }
                "--ceiling" => {
                    let v = value("--ceiling SIZE|none")?;
                    ceiling = Some(match v.as_str() {
                        "none" => None,
                        _ => Some(size("--ceiling", &v, false)?),
                    });
                }
                _ => return Ok(false),
            }
            Ok(true)
        },
    )?;
    let (name, pid, pool) = crate::pool_operands::pool_and_value(
        &read.plain,
        read.claim,
        "pool set takes a pool and a member's PID (gpucap pool set NAME PID \
         --guarantee SIZE --ceiling SIZE, or gpucap pool set --claim DIR PID ...)",
    )?;
    let pid = match pid.parse::<u32>() {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(format!(
                "invalid PID {pid:?} of pool set: a member's process id, as gpucap status \
                 shows it"
            ));
        }
    };
    if guarantee.is_none() && ceiling.is_none() {
        return Err("pool set changes --guarantee, --ceiling or both: neither was given".into());
    }
    Ok(Request {
        pool,
        name,
        pid,
        guarantee,
        ceiling,
        gpu: read.gpu,
        dir: read.dir,
    })
}

/// A size of `flag` (as GPUCAP_LIMIT takes it); 0 only where `zero` allows it.
fn size(flag: &str, value: &str, zero: bool) -> Result<u64, String> {
    match gpucap_core::config::parse_cap_size(value) {
        Ok(0) if !zero => Err(format!(
            "{flag} 0: a ceiling must be more than 0 (none: no ceiling of its own, the pool's cap)"
        )),
        Ok(s) => Ok(s),
        Err(e) => Err(format!("invalid size {value:?} of {flag}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(words: &[&str]) -> Result<Request, String> {
        parse(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn a_change_names_a_pool_a_member_and_its_figures() {
        let r = p(&[
            "train",
            "4242",
            "--guarantee",
            "2Gi",
            "--ceiling=6Gi",
            "--gpu",
            "1",
        ])
        .unwrap();
        assert_eq!(r.pool, PoolSpec::Name("train".into()));
        assert_eq!(r.pid, 4242);
        assert_eq!(r.guarantee, Some(2 << 30));
        assert_eq!(r.ceiling, Some(Some(6 << 30)));
        assert_eq!(r.gpu.as_deref(), Some("1"));
        let r = p(&["--claim", "/claims/5f0c", "7", "--ceiling", "none"]).unwrap();
        assert_eq!(r.pool, PoolSpec::Claim("/claims/5f0c".into()));
        assert_eq!((r.pid, r.guarantee, r.ceiling), (7, None, Some(None)));
        assert_eq!(
            p(&["t", "7", "--guarantee", "0"]).unwrap().guarantee,
            Some(0)
        );
        for (words, says) in [
            (&["train", "7"][..], "neither was given"),
            (
                &["train", "--guarantee", "1Gi"],
                "a pool and a member's PID",
            ),
            (&["train", "x", "--guarantee", "1Gi"], "invalid PID \"x\""),
            (
                &["train", "7", "--guarantee", "8X"],
                "invalid size \"8X\" of --guarantee",
            ),
            (
                &["train", "7", "--ceiling", "0"],
                "--ceiling 0: a ceiling must be more than 0",
            ),
            (
                &["train", "7", "--ceiling"],
                "--ceiling SIZE|none needs a value",
            ),
            (
                &["train", "7", "--guarantea", "1Gi"],
                "(did you mean --guarantee?)",
            ),
            (
                &["train", "7", "--force"],
                "unknown option '--force' of pool set (the options",
            ),
            (&["a b", "7", "--ceiling", "1Gi"], "invalid pool"),
        ] {
            let e = p(words).unwrap_err();
            assert!(e.contains(says), "{words:?}: {e}");
        }
    }
}
