//! The documentation's links lead somewhere: in the front page (README.md), the book
//! (docs/src/*.md, an mdBook) and every other Markdown file of the repository, every
//! relative link names a file of the repository and every `#anchor` a heading of the page
//! it points into; every page of the book is in its SUMMARY.md; and the book builds with
//! mdBook (`GPUCAP_TEST_MDBOOK`, which scripts/test.sh installs and sets), and every
//! link of the built book's HTML leads to a file of the built book and an `id` in it
//! (links to the repository's files outside the book are rewritten by
//! scripts/dev/book-repo-links.py, docs/book.toml's preprocessor).

use super::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// GitHub's anchor of a heading (mdBook makes the same): lower case, punctuation
/// dropped, spaces to dashes.
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

/// The targets of `[text](target)` links outside code blocks and code spans.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(markdown) {
        // Outside `code spans`: the even pieces between backticks.
        let text: Vec<&str> = line.split('`').step_by(2).collect();
        let text = text.join(" ");
        let mut rest = text.as_str();
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

/// What is wrong with the links of `page`, a Markdown file inside `root`.
fn check_page(root: &Path, page: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let dir = page.parent().unwrap();
    let root = root.canonicalize().unwrap();
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
        if !linked.starts_with(&root) {
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

/// Every Markdown file under `dir`, build outputs (`target`) and hidden folders left out.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            markdown_files(&path, out);
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The pages SUMMARY.md names, as written (`introduction.md`, ...).
fn summary_pages(summary: &str) -> Vec<String> {
    links(summary)
        .into_iter()
        .filter(|t| !t.starts_with("http"))
        .map(|t| t.split('#').next().unwrap().to_string())
        .collect()
}

/// What is wrong with the book under `book` (its `src/`): pages SUMMARY.md names that do
/// not exist, pages that exist and SUMMARY.md does not name.
fn check_summary(book: &Path) -> Vec<String> {
    let src = book.join("src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("docs/src/SUMMARY.md");
    let named = summary_pages(&summary);
    let mut problems = Vec::new();
    for page in &named {
        if !src.join(page).is_file() {
            problems.push(format!("SUMMARY.md names {page}, which does not exist"));
        }
    }
    let mut pages = Vec::new();
    markdown_files(&src, &mut pages);
    for page in pages {
        let rel = page
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel != "SUMMARY.md" && !named.contains(&rel) {
            problems.push(format!(
                "{rel} is not in SUMMARY.md: the book would leave it out"
            ));
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
        links("see [a](b.md#c) and [d](#e), not `f[g](h)`\n```\n[x](y)\n```"),
        ["b.md#c", "#e"]
    );
}

/// The checks find what they are for: a link to no file, to no heading, out of the
/// repository; a SUMMARY.md entry without its page, a page without its entry.
#[test]
fn the_checks_find_broken_links_and_pages() {
    let dir = scratch("readme-broken");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/a.md"), "# A page\n\n## Its part\n").unwrap();
    std::fs::write(dir.join("src/stray.md"), "# Not in the summary\n").unwrap();
    std::fs::write(
        dir.join("src/SUMMARY.md"),
        "# Summary\n\n- [A](a.md)\n- [Gone](gone.md)\n",
    )
    .unwrap();
    let page = dir.join("src/links.md");
    std::fs::write(
        &page,
        "[fine](a.md#its-part) [fine too](#here) [no file](b.md) [no heading](a.md#nowhere) \
         [out](../../../../../../../../../../../../etc/passwd)\n\n# Here\n",
    )
    .unwrap();
    let problems = check_page(&dir, &page).join("\n");
    assert!(problems.contains("link (b.md) names no file"), "{problems}");
    assert!(
        problems.contains("link (a.md#nowhere): no heading #nowhere"),
        "{problems}"
    );
    assert!(problems.contains("leaves the repository"), "{problems}");
    assert_eq!(problems.lines().count(), 3, "{problems}");
    let problems = check_summary(&dir).join("\n");
    assert!(problems.contains("SUMMARY.md names gone.md"), "{problems}");
    assert!(
        problems.contains("links.md is not in SUMMARY.md"),
        "{problems}"
    );
    assert!(
        problems.contains("stray.md is not in SUMMARY.md"),
        "{problems}"
    );
    assert_eq!(problems.lines().count(), 3, "{problems}");
}

#[test]
fn every_link_of_the_docs_resolves() {
    let mut pages = Vec::new();
    markdown_files(&root(), &mut pages);
    for must in ["README.md", "docs/src/SUMMARY.md", "cuda-stubs/README.md"] {
        assert!(pages.contains(&root().join(must)), "{must} not found");
    }
    let mut problems = Vec::new();
    for page in &pages {
        problems.extend(check_page(&root(), page));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let problems = check_summary(&root().join("docs"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// mdBook, or `None` (after SKIP) outside CI when there is none.
fn mdbook() -> Option<PathBuf> {
    checker_tool(
        "GPUCAP_TEST_MDBOOK",
        "mdbook",
        "run scripts/test.sh, which installs it",
    )
}

/// `mdbook build BOOK --dest-dir DEST`.
fn build_book(mdbook: &Path, book: &Path, dest: &Path) -> std::process::Output {
    Command::new(mdbook)
        .arg("build")
        .arg(book)
        .arg("--dest-dir")
        .arg(dest)
        .output()
        .expect("run mdbook")
}

/// The book builds, with a page of HTML for every page SUMMARY.md names; and mdBook
/// refuses a book whose SUMMARY.md names a page that does not exist (book.toml's
/// `create-missing = false`), rather than making an empty one.
#[test]
fn the_book_builds() {
    let Some(mdbook) = mdbook() else { return };
    let dir = scratch("readme-book");
    let o = build_book(&mdbook, &root().join("docs"), &dir.join("html"));
    assert!(o.status.success(), "mdbook build docs failed\n{}", dump(&o));
    let summary = std::fs::read_to_string(root().join("docs/src/SUMMARY.md")).unwrap();
    let pages = summary_pages(&summary);
    assert!(pages.len() > 10, "{pages:?}");
    for page in pages {
        let html = dir.join("html").join(page.replace(".md", ".html"));
        assert!(html.is_file(), "mdbook made no {}", html.display());
    }

    // The negative control: a copy of the book whose summary names a missing page.
    let copy = copy_book(&dir.join("broken"), true);
    std::fs::write(
        copy.join("src/SUMMARY.md"),
        format!("{summary}- [Missing](missing.md)\n"),
    )
    .unwrap();
    let o = build_book(&mdbook, &copy, &dir.join("broken-html"));
    assert!(
        !o.status.success(),
        "mdbook built a book with a missing page\n{}",
        dump(&o)
    );
    assert!(
        !copy.join("src/missing.md").exists(),
        "mdbook made the missing page"
    );
}

/// A copy of the book (docs/) at `copy`, its preprocessor named by absolute path (it
/// runs in the book's root); without it when `repo_links` is false.
fn copy_book(copy: &Path, repo_links: bool) -> PathBuf {
    std::fs::create_dir_all(copy.join("src")).unwrap();
    let toml = std::fs::read_to_string(root().join("docs/book.toml")).unwrap();
    let script = root().join("scripts/dev/book-repo-links.py");
    let toml = if repo_links {
        toml.replace(
            "../scripts/dev/book-repo-links.py",
            &script.display().to_string(),
        )
    } else {
        let cut = toml
            .find("[preprocessor.repo-links]")
            .expect("book.toml names the preprocessor");
        toml[..cut].to_string()
    };
    std::fs::write(copy.join("book.toml"), toml).unwrap();
    for entry in std::fs::read_dir(root().join("docs/src")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join("src").join(path.file_name().unwrap())).unwrap();
    }
    copy.to_path_buf()
}

/// Every `.html` file under `dir`.
fn html_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            html_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "html") {
            out.push(path);
        }
    }
}

/// The values of `attr="…"` in `html`, entities `&amp;` and `&quot;` undone.
fn attr_values(html: &str, attr: &str) -> Vec<String> {
    let key = format!(" {attr}=\"");
    html.match_indices(&key)
        .filter_map(|(i, _)| {
            let rest = &html[i + key.len()..];
            let end = rest.find('"')?;
            Some(rest[..end].replace("&quot;", "\"").replace("&amp;", "&"))
        })
        .collect()
}

/// The links of the built book (`href` and `src` of every page) that lead nowhere: to
/// no file of the book, or to an `#id` its page lacks. Links with a scheme (`https:`,
/// `mailto:`) are not followed.
fn dead_html_links(book: &Path) -> Vec<String> {
    let mut pages = Vec::new();
    html_files(book, &mut pages);
    let ids: std::collections::HashMap<PathBuf, std::collections::HashSet<String>> = pages
        .iter()
        .map(|p| {
            let html = std::fs::read_to_string(p).unwrap();
            (p.clone(), attr_values(&html, "id").into_iter().collect())
        })
        .collect();
    let mut dead = Vec::new();
    for page in &pages {
        let html = std::fs::read_to_string(page).unwrap();
        let mut links = attr_values(&html, "href");
        links.extend(attr_values(&html, "src"));
        for link in links {
            let scheme = link.split_once(':').is_some_and(|(s, _)| {
                !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '+')
            });
            if scheme || link.starts_with("//") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let path = path.split('?').next().unwrap();
            let target = if path.is_empty() {
                page.clone()
            } else {
                let mut t = page.parent().unwrap().to_path_buf();
                for part in path.split('/') {
                    match part {
                        "" | "." => {}
                        ".." => {
                            t.pop();
                        }
                        p => t.push(p),
                    }
                }
                t
            };
            let name = page.strip_prefix(book).unwrap().display();
            if !target.starts_with(book) || !target.exists() {
                dead.push(format!("{name}: {link} (no such file in the book)"));
            } else if !fragment.is_empty()
                && ids.get(&target).is_some_and(|set| !set.contains(fragment))
            {
                dead.push(format!("{name}: {link} (no id {fragment:?} there)"));
            }
        }
    }
    dead
}

/// The built book has no dead link: a page's link to a file of the repository outside
/// the book (`../../README.md`, right on GitHub) would be `../../README.html` there,
/// so the preprocessor rewrites it. The control: the same book built without the
/// preprocessor has such dead links, and the check finds them.
#[test]
fn the_built_books_links_all_resolve() {
    let Some(mdbook) = mdbook() else { return };
    let dir = scratch("readme-book-links");
    let out = dir.join("html");
    let o = build_book(&mdbook, &copy_book(&dir.join("book"), true), &out);
    assert!(o.status.success(), "mdbook build failed\n{}", dump(&o));
    let dead = dead_html_links(&out);
    assert!(
        dead.is_empty(),
        "dead links in the built book:\n{}",
        dead.join("\n")
    );

    let bare = dir.join("bare-html");
    let o = build_book(&mdbook, &copy_book(&dir.join("bare"), false), &bare);
    assert!(o.status.success(), "mdbook build failed\n{}", dump(&o));
    let dead = dead_html_links(&bare);
    assert!(
        dead.iter()
            .any(|d| d.starts_with("introduction.html: ../../README.html")),
        "the check found no dead link in a book built without the preprocessor: {dead:?}"
    );
}

/// scripts/k8s/README.md's table names every manifest of the folder (a new example
/// that the table misses is not found by a reader of the folder).
#[test]
fn the_kubernetes_examples_readme_names_every_manifest() {
    let dir = root().join("scripts/k8s");
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && !readme.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "scripts/k8s/README.md does not name {missing:?}"
    );
}

/// The README is a front page: at most 250 lines, and its set-up table has exactly two
/// rows, the main job (`scripts/demo.sh`) and the tests (`scripts/test.sh`), each short.
#[test]
fn the_readme_is_a_front_page_with_two_set_up_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: a front page has at most 250"
    );
    let setup = &readme[readme
        .find("\n## Set-up: two commands\n")
        .expect("README.md has a \"Set-up: two commands\" section")..];
    let setup = &setup[..setup[1..].find("\n## ").map_or(setup.len(), |i| i + 1)];
    let rows: Vec<&str> = setup
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("| ---") && !l.starts_with("| what"))
        .collect();
    assert_eq!(rows.len(), 2, "the set-up table's rows: {rows:#?}");
    for (row, command) in rows.iter().zip(["`scripts/demo.sh`", "`scripts/test.sh`"]) {
        assert!(row.trim_end().ends_with(&format!("| {command} |")), "{row}");
        assert!(
            row.len() <= 300,
            "a set-up row of {} characters: {row}",
            row.len()
        );
    }
}

/// Every script under scripts/ says what it is for in a comment at its top (after a
/// shebang), and scripts/README.md names every script and folder at the top level.
#[test]
fn every_script_says_what_it_is_for_and_the_index_names_it() {
    let dir = root().join("scripts");
    let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let mut missing = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "README.md" && !index.contains(&format!("`{name}")) {
            missing.push(format!("scripts/README.md does not name {name}"));
        }
    }
    let mut scripts = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "sh" || x == "py") {
                scripts.push(p);
            }
        }
    }
    for p in scripts {
        let text = std::fs::read_to_string(&p).unwrap();
        let first = text
            .lines()
            .filter(|l| !l.starts_with("#!") && !l.trim().is_empty())
            .find(|l| !l.starts_with("# shellcheck"));
        let says = first.is_some_and(|l| {
            let words = l
                .trim_start_matches(['#', '"', ' '])
                .split_whitespace()
                .count();
            (l.starts_with('#') || l.starts_with("\"\"\"")) && words >= 3
        });
        if !says {
            missing.push(format!(
                "{} begins with no comment of purpose: {first:?}",
                p.display()
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
