//! Checks the listing of stubs in cuda-stubs/STUBS.md against the stubs a build actually
//! has (the list build.rs generated). Called by the tests of both fake libraries.
//!
//! A library's section starts with its heading, `## <lib>: <n> of <total> exports are stubs`,
//! and lists one stub a line as ``- `name` ``, sorted. With `FAKECUDA_UPDATE_STUBS=1` the
//! check rewrites the section instead of failing.

use std::collections::BTreeSet;
use std::path::Path;

/// The heading of `lib`'s section.
fn heading(lib: &str, stubs: usize, total: usize) -> String {
    format!("## {lib}: {stubs} of {total} exports are stubs")
}

/// (heading line, entries) of `lib`'s section of `text`, if it has one.
fn section(text: &str, lib: &str) -> Option<(String, Vec<String>)> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with(&format!("## {lib}:")));
    let head = lines.next()?.to_string();
    let entries = lines
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("- `")?.strip_suffix('`'))
        .map(str::to_string)
        .collect();
    Some((head, entries))
}

/// `text` with `lib`'s section replaced by (or, if it has none, followed by) `new`.
fn replace_section(text: &str, lib: &str, new: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with(&format!("## {lib}:")));
    let mut out = String::new();
    match start {
        Some(s) => {
            let end = lines[s + 1..]
                .iter()
                .position(|l| l.starts_with("## "))
                .map_or(lines.len(), |e| s + 1 + e);
            for l in &lines[..s] {
                out.push_str(l);
                out.push('\n');
            }
            out.push_str(new);
            if end < lines.len() {
                out.push('\n');
            }
            for l in &lines[end..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        None => {
            out.push_str(text.trim_end());
            out.push_str("\n\n");
            out.push_str(new);
        }
    }
    out
}

/// Panics (naming what differs) unless `doc` lists exactly `stubs` for `lib`, out of `total`
/// exports. With FAKECUDA_UPDATE_STUBS=1 it rewrites the section instead.
pub fn check(doc: &Path, lib: &str, stubs: &[&str], total: usize) {
    let built: BTreeSet<&str> = stubs.iter().copied().collect();
    assert_eq!(built.len(), stubs.len(), "a stub is generated twice");
    let text = std::fs::read_to_string(doc).unwrap_or_default();
    let want_head = heading(lib, built.len(), total);
    let found = section(&text, lib);
    let listed: Vec<&str> = found
        .as_ref()
        .map(|(_, e)| e.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let listed_set: BTreeSet<&str> = listed.iter().copied().collect();
    let sorted = listed.windows(2).all(|w| w[0] < w[1]);
    let head_ok = found.as_ref().is_some_and(|(h, _)| *h == want_head);
    if listed_set == built && sorted && head_ok {
        return;
    }
    let mut new = format!("{want_head}\n\n");
    for s in &built {
        new.push_str(&format!("- `{s}`\n"));
    }
    if std::env::var_os("FAKECUDA_UPDATE_STUBS").is_some_and(|v| v == "1") {
        std::fs::write(doc, replace_section(&text, lib, &new)).unwrap();
        eprintln!("rewrote the {lib} section of {}", doc.display());
        return;
    }
    let missing: Vec<_> = built.difference(&listed_set).collect();
    let extra: Vec<_> = listed_set.difference(&built).collect();
    panic!(
        "{} does not list the stubs of {lib} as built:\n  stubs not listed: {missing:?}\n  \
         listed but implemented (or not exported): {extra:?}\n  heading: {:?}, expected {want_head:?}; \
         sorted: {sorted}\nRewrite the section with FAKECUDA_UPDATE_STUBS=1 and this test.",
        doc.display(),
        found.as_ref().map(|(h, _)| h),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_found_and_replaced() {
        let text = "# Title\n\nintro\n\n## liba: 1 of 3 exports are stubs\n\n- `a1`\n\n## libb: 0 of 1 exports are stubs\n";
        let (h, e) = section(text, "liba").unwrap();
        assert_eq!(
            (h.as_str(), e),
            ("## liba: 1 of 3 exports are stubs", vec!["a1".to_string()])
        );
        assert_eq!(section(text, "libb").unwrap().1, Vec::<String>::new());
        assert!(section(text, "libc").is_none());
        let new = "## liba: 2 of 3 exports are stubs\n\n- `a1`\n- `a2`\n";
        let replaced = replace_section(text, "liba", new);
        assert_eq!(
            replaced,
            "# Title\n\nintro\n\n## liba: 2 of 3 exports are stubs\n\n- `a1`\n- `a2`\n\n## libb: 0 of 1 exports are stubs\n"
        );
        assert_eq!(section(&replaced, "liba").unwrap().1, ["a1", "a2"]);
        let appended = replace_section("# T\n", "libc", "## libc: 0 of 0 exports are stubs\n");
        assert_eq!(appended, "# T\n\n## libc: 0 of 0 exports are stubs\n");
    }
}
