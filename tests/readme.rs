//! README.md's links lead somewhere: every relative link names a file of the
//! repository, and every `#anchor` a heading of the page it points into.

mod common;

use std::path::Path;

use common::*;

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The lines of `markdown` outside fenced code blocks.
fn prose(markdown: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    markdown.lines().filter(move |line| {
        if line.starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

fn anchors(markdown: &str) -> Vec<String> {
    prose(markdown)
        .filter(|line| line.starts_with('#'))
        .map(|line| anchor(line.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` links outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(markdown) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

fn check_page(page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let dir = page.parent().unwrap();
    let mut problems = Vec::new();
    for target in links(&text) {
        if target.starts_with("http://")
            || target.starts_with("https://")
            || target.starts_with("mailto:")
        {
            continue;
        }
        let (file, frag) = target.split_once('#').unwrap_or((&target, ""));
        let linked = if file.is_empty() {
            page.to_path_buf()
        } else {
            dir.join(file)
        };
        let Ok(linked) = linked.canonicalize() else {
            problems.push(format!("{}: link ({target}) names no file", page.display()));
            continue;
        };
        if !linked.starts_with(root().canonicalize().unwrap()) {
            problems.push(format!(
                "{}: link ({target}) leaves the repository",
                page.display()
            ));
            continue;
        }
        if !frag.is_empty() {
            let body = std::fs::read_to_string(&linked).unwrap_or_default();
            if !anchors(&body).iter().any(|a| a == frag) {
                problems.push(format!(
                    "{}: link ({target}): no heading #{frag} there",
                    page.display()
                ));
            }
        }
    }
    problems
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(anchor(" Proof on a real GPU"), "proof-on-a-real-gpu");
    assert_eq!(
        anchor(" `GPUCAP_LOG=info`: a summary at exit"),
        "gpucap_loginfo-a-summary-at-exit"
    );
    assert_eq!(
        links("see [a](b.md#c) and [d](#e)\n```\n[x](y)\n```"),
        ["b.md#c", "#e"]
    );
}

#[test]
fn every_link_of_the_readmes_resolves() {
    let mut problems = Vec::new();
    for page in ["README.md", "cuda-stubs/README.md"] {
        problems.extend(check_page(&root().join(page)));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
