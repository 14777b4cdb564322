//! The pool variables' values: which pool a process joins (`GPUCAP_POOL`: a name, a
//! file, or a claim's directory), how long a joiner waits (`GPUCAP_WAIT`) and where named
//! pools' files live (`GPUCAP_POOL_DIR`).

use std::fmt;
use std::path::PathBuf;

// What each pool variable accepts, for its error line.
pub const POOL_ACCEPTED: &str = "a pool name (1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.'), \
     an absolute path of the pool file, or off (no pool)";
pub const POOL_DIR_ACCEPTED: &str =
    "the absolute path of an existing directory (gpucap makes its gpucap-UID directory in it)";
pub const CLAIM_DIR_ACCEPTED: &str = "the absolute path of the directory every container of one claim \
     shares, mounted read-write (the pool's file, gpucap.pool, is made in it)";
pub const WAIT_ACCEPTED: &str =
    "a duration up to 24h: 0, 500ms, 30s, 5m, 1h (a number and one of ms, s, m, h)";

/// Which pool a process joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolSpec {
    /// A name: the file `<name>.pool` in the pool directory.
    Name(String),
    /// The file itself.
    Path(PathBuf),
    /// A claim's directory, which every container of the claim shares (mounted
    /// read-write by its driver): the pool's file is [`CLAIM_POOL_FILE`] in it.
    Claim(PathBuf),
}

/// The pool file's name in a claim's directory.
pub const CLAIM_POOL_FILE: &str = "gpucap.pool";

impl fmt::Display for PoolSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolSpec::Name(n) => f.write_str(n),
            PoolSpec::Path(p) => write!(f, "{}", p.display()),
            PoolSpec::Claim(d) => write!(f, "{}", d.join(CLAIM_POOL_FILE).display()),
        }
    }
}

/// The suffix of a pool name that stands for this process's mount namespace.
pub const PER_CONTAINER_SUFFIX: &str = "-mntns";

/// The pool of a container's processes where nothing else names one: the CDI device
/// `capped` writes it, and a driver's grant with no claim directory takes it.
pub const CONTAINER_POOL: &str = "container-mntns";

impl PoolSpec {
    /// Whether this is the container's pool ([`CONTAINER_POOL`]): shared by every user
    /// of the container, as a claim's pool is (`gpucap-pool-file`'s `container.rs`).
    pub fn is_container_pool(&self) -> bool {
        matches!(self, PoolSpec::Name(n) if n == CONTAINER_POOL)
    }

    /// What a pool name ending in `-mntns` stands for: the same name with the number
    /// of this process's mount namespace instead (`container-mntns` is
    /// `container-4026532178`, the pool the entrypoint would name): one pool per
    /// container, also where containers share `/dev/shm` (`--ipc=host`). Without
    /// `/proc/self/ns/mnt`, the name without the suffix (`container`), as the
    /// entrypoint. The shim and `gpucap`'s commands both read it so.
    pub fn per_container(&self) -> PoolSpec {
        match self {
            PoolSpec::Name(n) if n.ends_with(PER_CONTAINER_SUFFIX) => {
                let link = std::fs::read_link("/proc/self/ns/mnt").ok();
                self.in_mount_namespace(link.as_deref().map(|l| l.to_string_lossy()).as_deref())
            }
            // Only such a name reads the link (a pool's joiner reads nothing more).
            other => other.clone(),
        }
    }

    /// [`PoolSpec::per_container`] for the mount namespace whose link reads `link`
    /// (`mnt:[4026532178]`).
    pub fn in_mount_namespace(&self, link: Option<&str>) -> PoolSpec {
        match self {
            PoolSpec::Name(n) if n.ends_with(PER_CONTAINER_SUFFIX) => {
                let base = &n[..n.len() - PER_CONTAINER_SUFFIX.len()];
                let ns: String = link
                    .unwrap_or_default()
                    .chars()
                    .filter(char::is_ascii_digit)
                    .collect();
                PoolSpec::Name(if ns.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}-{ns}")
                })
            }
            other => other.clone(),
        }
    }
}

/// Parses a `GPUCAP_POOL` value: a name, an absolute path (it contains a `/`), or
/// `off` (no pool: what turns off the container entrypoint's default).
pub fn parse_pool(value: &str) -> Result<Option<PoolSpec>, String> {
    if value == "off" {
        return Ok(None);
    }
    parse_pool_spec(value).map(Some)
}

pub(crate) fn parse_pool_spec(value: &str) -> Result<PoolSpec, String> {
    // `OFF` meant as off would otherwise be a shared pool of that name.
    if value.eq_ignore_ascii_case("off") && value != "off" {
        return Err(format!(
            "{value} is off in other letters: off (lower case) is no pool, and no pool is \
             named off in any case"
        ));
    }
    if value.contains('/') {
        if !value.starts_with('/') {
            return Err("a path must be absolute (every process must name the same file)".into());
        }
        if value.ends_with('/') {
            return Err(
                "a path must name a file, not a directory (set GPUCAP_POOL_DIR for \
                        the directory and GPUCAP_POOL to a name)"
                    .into(),
            );
        }
        return Ok(PoolSpec::Path(PathBuf::from(value)));
    }
    let ok = (1..=64).contains(&value.len())
        && !value.starts_with('.')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err("not a pool name".into());
    }
    Ok(PoolSpec::Name(value.to_string()))
}

/// Parses a `GPUCAP_WAIT` value: `0`, or a whole number followed by `ms`, `s`, `m` or
/// `h`, at most 24 hours.
pub fn parse_wait(value: &str) -> Result<std::time::Duration, String> {
    let v = value.trim();
    if v == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    if digits.is_empty() {
        return Err("not a duration".into());
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err("a leading zero".into());
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| "a number too large".to_string())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "" => return Err("no unit (0 is the only duration without one)".into()),
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    match ms {
        Some(ms) if ms <= 86_400_000 => Ok(std::time::Duration::from_millis(ms)),
        _ => Err("longer than 24h".into()),
    }
}

/// Parses a `GPUCAP_POOL_DIR` value.
pub fn parse_pool_dir(value: &str) -> Result<PathBuf, String> {
    if !value.starts_with('/') {
        return Err("the directory must be an absolute path".into());
    }
    Ok(PathBuf::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mntns_name_stands_for_the_mount_namespace_and_other_pools_for_themselves() {
        let c = PoolSpec::Name(CONTAINER_POOL.into());
        assert_eq!(
            c.in_mount_namespace(Some("mnt:[4026532178]")),
            PoolSpec::Name("container-4026532178".into())
        );
        assert_eq!(
            c.in_mount_namespace(None),
            PoolSpec::Name("container".into())
        );
        for other in [
            PoolSpec::Name("mntns".into()),
            PoolSpec::Name("ctr".into()),
            PoolSpec::Path("/x/container-mntns".into()),
            PoolSpec::Claim("/c".into()),
        ] {
            assert_eq!(other.in_mount_namespace(Some("mnt:[7]")), other);
        }
    }
}
