//! The pools of a pool directory by name, and for a `--pool` that names none the
//! nearest one there is (`did you mean train?`).

use std::path::Path;

use gpucap_core::config::{PoolSpec, parse_pool};

/// The pools of `dir` by name (`NAME.pool`, not the hidden files of a pool being made
/// or removed), and those whose file was removed from it while their members run (read
/// through a member's descriptor: gpucap_pool_file's `beacon`), sorted.
pub fn pool_names(dir: &Path) -> Vec<String> {
    let files: Vec<std::ffi::OsString> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let mut names: Vec<String> = files
        .into_iter()
        .chain(removed_file_names(dir))
        .filter_map(|n| n.into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .filter_map(|n| n.strip_suffix(".pool").map(str::to_string))
        .filter(|n| matches!(parse_pool(n), Ok(Some(PoolSpec::Name(_)))))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The file names of this user's pools removed from `dir` while their members run (read
/// through a member's descriptor: gpucap_pool_file's `beacon`).
pub fn removed_file_names(dir: &Path) -> impl Iterator<Item = std::ffi::OsString> {
    gpucap_pool_file::removed_pool_files(false)
        .into_iter()
        .filter(move |(p, _, _)| p.parent() == Some(dir))
        .filter_map(|(p, _, _)| p.file_name().map(|n| n.to_os_string()))
}

/// The edit distance between `a` and `b` (insertions, deletions, substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// The existing name nearest to `wanted`: a different case, or at most a third of its
/// characters (at least 2) changed; None when nothing is that near.
pub fn nearest<'a>(wanted: &str, names: &'a [String]) -> Option<&'a str> {
    let most = (wanted.chars().count() / 3).max(2);
    names
        .iter()
        .filter(|n| n.as_str() != wanted)
        .map(|n| {
            let d = if n.eq_ignore_ascii_case(wanted) {
                0
            } else {
                distance(&wanted.to_ascii_lowercase(), &n.to_ascii_lowercase())
            };
            (d, n)
        })
        .filter(|&(d, _)| d <= most)
        .min_by_key(|&(d, _)| d)
        .map(|(_, n)| n.as_str())
}

/// What follows "no pool file at PATH" for a file that does not exist: the nearest
/// pool of its directory, or the pools there are (`; did you mean train? (pools
/// there: eval, train)`); empty when the directory has none.
pub fn suggestion(path: &Path) -> String {
    let (Some(dir), Some(stem)) = (
        path.parent(),
        path.file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.strip_suffix(".pool").unwrap_or(n)),
    ) else {
        return String::new();
    };
    let names = pool_names(dir);
    if names.is_empty() {
        return String::new();
    }
    let listed = if names.len() <= 8 {
        names.join(", ")
    } else {
        format!("{}, … ({} in all)", names[..8].join(", "), names.len())
    };
    // A file's name typed for the pool's (`t.pool` for `t`).
    let file_named = stem
        .strip_suffix(".pool")
        .filter(|n| names.iter().any(|x| x == n));
    match file_named.or_else(|| nearest(stem, &names)) {
        Some(n) => format!("; did you mean {n}? (pools there: {listed})"),
        None => format!("; the pools there: {listed} (gpucap pool list)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_pools_file_name_typed_for_its_name_is_suggested() {
        let dir = std::env::temp_dir().join(format!("gpucap-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.pool"), b"").unwrap();
        let s = suggestion(&dir.join("t.pool.pool"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(s.starts_with("; did you mean t?"), "{s}");
    }

    #[test]
    fn the_nearest_name_is_a_typo_away() {
        let pools = names(&["eval", "train", "training-big"]);
        assert_eq!(nearest("trian", &pools), Some("train"));
        assert_eq!(nearest("Train", &pools), Some("train"));
        assert_eq!(nearest("evl", &pools), Some("eval"));
        assert_eq!(nearest("training-bog", &pools), Some("training-big"));
        assert_eq!(nearest("inference", &pools), None);
        assert_eq!(nearest("train", &pools), None, "itself is no suggestion");
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
    }
}
