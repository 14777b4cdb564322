//! What each driver's file reads and gives: the variables it reads ([`HandoverVars`]),
//! what they give ([`Handover`]), and the error of a bad one ([`bad`]).

use crate::config::limit::LimitSpec;
use crate::config::model::{CapSource, ConfigError, Origin};

/// The variables of the environment a driver source reads: name and value, the first
/// occurrence of each name.
#[derive(Default)]
pub struct HandoverVars(pub Vec<(String, String)>);

impl HandoverVars {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The variables whose name starts with `prefix`, in the environment's order.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.0
            .iter()
            .filter(move |(n, _)| n.starts_with(prefix))
            .map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Adds a pair unless its name was seen (first occurrence wins, like getenv).
    pub fn push(&mut self, name: String, value: String) {
        if self.get(&name).is_none() {
            self.0.push((name, value));
        }
    }
}

/// What one driver's variables give.
#[derive(Default)]
pub struct Handover {
    /// The cap, if the driver gives one.
    pub cap: Option<(CapSource, Vec<Origin>)>,
    /// The request, where the driver gives one apart from the cap (the toolkit's).
    pub request: Option<(LimitSpec, String)>,
    /// The directory every container of the claim shares, for its pool.
    pub claim_dir: Option<(std::path::PathBuf, String)>,
    /// Why the driver's claim directory is not there (said unless GPUCAP_CLAIM_DIR
    /// names one).
    pub no_claim_dir: Option<String>,
    pub notes: Vec<String>,
}

/// An error about `var`=`value`, with what is accepted.
pub(crate) fn bad(var: &str, value: &str, reason: String, accepted: &'static str) -> ConfigError {
    ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        reason,
        accepted,
    }
}
