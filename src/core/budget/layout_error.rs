//! What a reader checks first of a pool file (its magic and layout version), and why a
//! file cannot be used, in the line a refused process prints.

use std::fmt;

pub const MAGIC: u64 = u64::from_le_bytes(*b"GPUCAPPL");
/// 9: version 8's words, which a claim's members keep in a sealed memfd (an older gpucap
/// maps a claim's file: beside a newer one it would keep a budget apart). 10: a member's
/// uid beside its pid (`S_PID`'s high bits, which version 9 read as a pid past 32 bits).
/// 11: a sixth traffic mark per member and GPU (`T_UNSURE`, announcements withdrawn).
pub const POOL_VERSION: u64 = 11;

/// Why a pool file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// Too short or too long for this version (`expected`: the length its header
    /// gives, or that of a file of the default 256 members).
    Size { bytes: usize, expected: usize },
    /// Not a gpucap pool file at all.
    Magic { found: [u8; 8] },
    /// A gpucap pool file of another version.
    Version { found: u64 },
    /// The right magic and version but words that cannot be: corrupted.
    Corrupt { what: String },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::Size { bytes, expected } => write!(
                f,
                "it is {bytes} bytes long, a version {POOL_VERSION} pool file of its members is \
                 {expected} (not a gpucap pool file, or a truncated one)"
            ),
            LayoutError::Magic { found } => {
                let shown: String = found
                    .iter()
                    .map(|&b| {
                        if b.is_ascii_graphic() {
                            (b as char).to_string()
                        } else {
                            format!("\\x{b:02x}")
                        }
                    })
                    .collect();
                write!(
                    f,
                    "it is not a gpucap pool file (it starts with \"{shown}\", a pool file with \
                     \"GPUCAPPL\"; HAMi-core's cache file cannot be shared with gpucap)"
                )
            }
            LayoutError::Version { found } => write!(
                f,
                "it is a version {found} pool file and this gpucap reads version \
                 {POOL_VERSION}: every process of a pool must run the same gpucap (remove the file once no \
                 process uses it)"
            ),
            LayoutError::Corrupt { what } => write!(
                f,
                "it is corrupted ({what}); remove it once no process uses it"
            ),
        }
    }
}

impl std::error::Error for LayoutError {}
