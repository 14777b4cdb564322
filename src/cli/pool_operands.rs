//! The operands of `gpucap pool resize` and `gpucap pool set`: a pool and one value
//! (`NAME VALUE`), or a claim's pool and the value (`--claim DIR VALUE`).

use gpucap_core::config::PoolSpec;

/// The pool as typed (for the lines printed), the value's word, and the claim's pool
/// where `--claim DIR` named it (`plain`: the words that are no option; `usage`: the
/// command's forms, for the error when their count is wrong).
pub fn pool_and_value<'a>(
    plain: &'a [String],
    claim: Option<String>,
    usage: &str,
) -> Result<(String, &'a String, Option<PoolSpec>), String> {
    match (plain, claim) {
        ([name, value], None) => Ok((name.clone(), value, None)),
        ([value], Some(dir)) if dir.starts_with('/') => Ok((
            format!("--claim {dir}"),
            value,
            Some(PoolSpec::Claim(dir.into())),
        )),
        ([_], Some(dir)) => Err(format!(
            "--claim {dir}: the absolute path of the claim's directory (as its containers \
             have GPUCAP_CLAIM_DIR)"
        )),
        _ => Err(format!("{usage}, {} given", plain.len())),
    }
}
