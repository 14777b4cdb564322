//! The shape of the code (docs/src/how-it-works.md, "Map of the code"): data flows one way in every crate,
//! checked by scripts/dev/modcycles.py, no crate borrows another's files by `#[path]`, and
//! the map names every folder of `src/` and every file at the top of a crate, and nothing
//! that is not there; the Python scripts import from each other only names that exist
//! (scripts/dev/pyimports.py).

use super::common;

use std::path::Path;
use std::process::Command;

use common::*;

fn modcycles(dirs: &[&Path]) -> std::process::Output {
    run(Command::new("python3")
        .arg(root().join("scripts/dev/modcycles.py"))
        .args(dirs))
}

/// Writes a small crate whose `model` folder holds `a.rs` and `b.rs` with the given
/// bodies.
fn crate_with(tag: &str, a: &str, b: &str) -> std::path::PathBuf {
    crate_with_parent(tag, "mod a;\nmod b;\n", a, b)
}

/// [`crate_with`], `model.rs` itself holding `model`.
fn crate_with_parent(tag: &str, model: &str, a: &str, b: &str) -> std::path::PathBuf {
    let dir = scratch(tag);
    std::fs::create_dir_all(dir.join("src/model")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
    std::fs::write(dir.join("src/lib.rs"), "mod model;\nmod api;\n").unwrap();
    std::fs::write(dir.join("src/api.rs"), "use crate::model::a::A;\n").unwrap();
    std::fs::write(dir.join("src/model.rs"), model).unwrap();
    std::fs::write(dir.join("src/model/a.rs"), a).unwrap();
    std::fs::write(dir.join("src/model/b.rs"), b).unwrap();
    dir
}

#[test]
fn the_cycle_check_finds_a_cycle_inside_a_folder() {
    let cyclic = crate_with(
        "modcycles-cyclic",
        "use super::b::B;\npub struct A;\n",
        "use crate::model::{a::A};\npub struct B;\n",
    );
    let o = modcycles(&[&cyclic]);
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    assert!(stdout(&o).contains("in model: a <-> b"), "{}", dump(&o));

    let one_way = crate_with(
        "modcycles-one-way",
        "use super::b::B;\npub struct A;\n",
        "pub struct B;\n",
    );
    let o = modcycles(&[&one_way]);
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
}

/// Two files that take each other's names through their parent, which imports them
/// from each (`use a::A;` privately, or `pub use`), import each other all the same: the
/// check follows a name to the file that defines it.
#[test]
fn the_cycle_check_follows_a_name_through_the_parent() {
    for (tag, model, b) in [
        (
            "modcycles-relayed",
            "mod a;\nmod b;\nuse a::A;\nuse b::B;\n",
            "use super::A;\npub struct B(A);\n",
        ),
        (
            "modcycles-reexported",
            "mod a;\nmod b;\npub use a::A;\npub use b::B;\n",
            "pub struct B(super::A);\n",
        ),
    ] {
        let cyclic = crate_with_parent(tag, model, "use super::B;\npub struct A(B);\n", b);
        let o = modcycles(&[&cyclic]);
        assert_eq!(o.status.code(), Some(1), "{tag}: {}", dump(&o));
        assert!(
            stdout(&o).contains("in model: a <-> b"),
            "{tag}: {}",
            dump(&o)
        );
    }

    let one_way = crate_with_parent(
        "modcycles-relayed-one-way",
        "mod a;\nmod b;\nuse a::A;\nuse b::B;\n",
        "use super::B;\npub struct A(B);\n",
        "pub struct B;\n",
    );
    let o = modcycles(&[&one_way]);
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
}

#[test]
fn no_module_cycle_in_the_shim_the_cli_the_core_or_the_fake_gpu() {
    let o = modcycles(&[&root().join("src"), &root().join("cuda-stubs")]);
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    assert!(
        stdout(&o).contains("in 7 crate(s)"),
        "core, pool file, shim, CLI, fake libcuda, fake NVML, their shared crate: {}",
        dump(&o)
    );
}

/// The folders whose Python scripts import each other's helpers (each the root of its
/// scripts' `sys.path`): the real-GPU checks run only where a GPU is lent, so a helper
/// moved or renamed must fail here, not on the device.
const SCRIPT_FOLDERS: [&str; 5] = [
    "scripts/gpu",
    "scripts/bench",
    "scripts/dev",
    "scripts/k8s",
    "tests/clients",
];

fn pyimports(dirs: &[std::path::PathBuf]) -> std::process::Output {
    run(Command::new("python3")
        .arg(root().join("scripts/dev/pyimports.py"))
        .args(dirs))
}

/// Every name a script imports from another of the repository's scripts exists there
/// (`scripts/dev/pyimports.py`): when `probe.py`'s helpers moved to `verdicts.py`,
/// `observer.py` and `probes/`, `tests/clients/torch_steps.py` still imported
/// `resnet18_like` from `probe`, which no test ran.
#[test]
fn the_scripts_import_only_names_their_helpers_define() {
    let dirs: Vec<_> = SCRIPT_FOLDERS.iter().map(|d| root().join(d)).collect();
    let o = pyimports(&dirs);
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    let checked: usize = stdout(&o)
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(checked > 150, "too few imports found: {}", dump(&o));
}

/// The check itself: a name its module lacks, a module that is not there, and a submodule
/// of a package are told apart.
#[test]
fn the_import_check_finds_a_name_its_module_lacks() {
    let dir = scratch("pyimports");
    std::fs::create_dir_all(dir.join("pkg")).unwrap();
    std::fs::write(
        dir.join("helpers.py"),
        "import os\n\ndef ok():\n    pass\n\nMiB = 1 << 20\n",
    )
    .unwrap();
    std::fs::write(dir.join("pkg/__init__.py"), "").unwrap();
    std::fs::write(dir.join("pkg/part.py"), "def step():\n    pass\n").unwrap();
    let good = "from helpers import MiB, ok, os\nfrom pkg.part import step\nfrom pkg import part\nimport pkg.part\nimport torch\n";
    std::fs::write(dir.join("main.py"), good).unwrap();
    let o = pyimports(std::slice::from_ref(&dir));
    assert_eq!(o.status.code(), Some(0), "{}", dump(&o));
    std::fs::write(
        dir.join("main.py"),
        format!("{good}def f():\n    from helpers import fail\n    from pkg.part import train\n    import pkg.gone\n"),
    )
    .unwrap();
    let o = pyimports(std::slice::from_ref(&dir));
    assert_eq!(o.status.code(), Some(1), "{}", dump(&o));
    let out = stdout(&o);
    for want in [
        "main.py:7: helpers has no fail",
        "main.py:8: pkg.part has no train",
        "main.py:9: no module pkg.gone",
    ] {
        assert!(out.contains(want), "{want}: {}", dump(&o));
    }
    assert_eq!(out.lines().count(), 3, "{}", dump(&o));
}

#[test]
fn no_crate_includes_another_crates_files_by_path() {
    let mut found = Vec::new();
    for dir in ["src", "cuda-stubs"] {
        let mut stack = vec![root().join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() && p.file_name().is_some_and(|n| n != "target") {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let text = std::fs::read_to_string(&p).unwrap();
                    if text.lines().any(|l| l.trim_start().starts_with("#[path")) {
                        found.push(p.display().to_string());
                    }
                }
            }
        }
    }
    assert!(found.is_empty(), "#[path] includes: {found:?}");
}

/// The image recipe (scripts/Dockerfile.example, and its copy in docs/src/container.md) builds
/// exactly the shim and the CLI, by package names that exist, and never the fake GPU.
#[test]
fn the_dockerfile_builds_the_shim_and_the_cli_only() {
    let recipe = std::fs::read_to_string(root().join("scripts/Dockerfile.example")).unwrap();
    let readme = std::fs::read_to_string(root().join("docs/src/container.md")).unwrap();
    let run = recipe
        .lines()
        .find(|l| l.starts_with("RUN cargo build"))
        .expect("a RUN cargo build line");
    assert!(
        readme.contains(run),
        "docs/src/container.md's Dockerfile differs: {run}"
    );
    let packages: Vec<&str> = run
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1])
        .collect();
    let o = run_cmd_metadata();
    let meta: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut built = Vec::new();
    for p in meta["packages"].as_array().unwrap() {
        if packages.contains(&p["name"].as_str().unwrap()) {
            for t in p["targets"].as_array().unwrap() {
                let kinds: Vec<&str> = t["kind"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|k| k.as_str().unwrap())
                    .collect();
                if kinds != ["custom-build"] {
                    let name = t["name"].as_str().unwrap();
                    built.push(format!("{}:{name}", kinds.join("+")));
                }
            }
        }
    }
    built.sort();
    assert_eq!(
        built,
        ["bin:gpucap", "cdylib:gpucap"],
        "packages {packages:?} of `{run}`"
    );
}

fn run_cmd_metadata() -> std::process::Output {
    let o = run(Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root()));
    assert!(o.status.success(), "{}", dump(&o));
    o
}

/// The rows of the map of the code (docs/src/how-it-works.md, "Map of the code"): for each
/// row, the paths its first cell names (braces expanded: `src/core/{a,b}.rs`) and every
/// span in backticks of the whole row.
fn map_rows(page: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let section = page
        .split("\n## Map of the code\n")
        .nth(1)
        .expect("how-it-works.md has a \"Map of the code\" section");
    let section = section.split("\n## ").next().unwrap();
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let (first, _) = line[1..].split_once('|').unwrap();
        let heads = in_backticks(first)
            .into_iter()
            .flat_map(|s| expand(&s))
            .collect();
        let spans = in_backticks(line)
            .into_iter()
            .flat_map(|s| expand(&s))
            .collect();
        rows.push((heads, spans));
    }
    rows
}

fn in_backticks(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `a/{x,y}.rs` as `a/x.rs`, `a/y.rs` (every brace group, left to right).
fn expand(s: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (s.find('{'), s.find('}')) else {
        return vec![s.to_string()];
    };
    s[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{}{alt}{}", &s[..open], &s[close + 1..])))
        .collect()
}

/// Every path the map of the code names, in full: the spans that begin with `src/`, and
/// the spans that read as a file or folder (`x.rs`, `x/`, `x/y.rs`) joined to a folder
/// of the row's first cell (the `ledger/` row's `device.rs` names
/// `src/core/ledger/device.rs`).
fn map_names(page: &str) -> (Vec<String>, std::collections::BTreeSet<String>) {
    let mut full = Vec::new();
    let mut named = std::collections::BTreeSet::new();
    for (heads, spans) in map_rows(page) {
        let folders: Vec<&String> = heads.iter().filter(|h| h.ends_with('/')).collect();
        for s in spans {
            if s.starts_with("src/") {
                full.push(s.clone());
                named.insert(s);
            } else if !s.contains(' ') && (s.ends_with(".rs") || s.ends_with('/')) {
                named.extend(folders.iter().map(|f| format!("{f}{s}")));
            }
        }
    }
    (full, named)
}

/// The folders of `src/` and the files at the top of each crate's folder that the map must
/// name: every folder but test data (`proptest-regressions/`) and test modules
/// (`tests/`), and every `.rs` file beside a `Cargo.toml` but the crate root `lib.rs`.
fn to_be_mapped() -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root().join("src")];
    while let Some(d) = stack.pop() {
        let rel = d.strip_prefix(root()).unwrap().display().to_string();
        if rel != "src" {
            out.push(format!("{rel}/"));
        }
        let crate_root = d.join("Cargo.toml").exists();
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            if p.is_dir() && !["tests", "proptest-regressions", "target"].contains(&name.as_str()) {
                stack.push(p);
            } else if crate_root && name.ends_with(".rs") && name != "lib.rs" {
                out.push(format!("{rel}/{name}"));
            }
        }
    }
    out.sort();
    out
}

/// The map of the code names only paths that exist, and names every folder of `src/` and
/// every file at the top of each crate: a folder or file added or removed without the map
/// fails here.
#[test]
fn the_map_of_the_code_matches_the_tree() {
    let page = std::fs::read_to_string(root().join("docs/src/how-it-works.md")).unwrap();
    let (full, named) = map_names(&page);
    assert!(full.len() > 20, "the map's paths were not found: {full:?}");
    let missing: Vec<&String> = full
        .iter()
        .filter(|p| {
            let path = root().join(p);
            if p.ends_with('/') {
                !path.is_dir()
            } else {
                !path.is_file()
            }
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the map names paths that do not exist: {missing:?}"
    );
    let unmapped: Vec<String> = to_be_mapped()
        .into_iter()
        .filter(|p| !named.contains(p))
        .collect();
    assert!(
        unmapped.is_empty(),
        "not on the map of the code (docs/src/how-it-works.md): {unmapped:?}"
    );
}

#[test]
fn the_map_reader_expands_braces_and_joins_a_row_s_names_to_its_folder() {
    let page = "# x\n\n## Map of the code\n\n| path | what |\n| --- | --- |\n\
                | `src/a/`, `src/{b,c}.rs` | `d.rs` the d, `e/`, `not a path`, `f::g` |\n\n## Next\n\
                | `src/after.rs` | not the map |\n";
    let (full, named) = map_names(page);
    assert_eq!(full, ["src/a/", "src/b.rs", "src/c.rs"]);
    let named: Vec<&str> = named.iter().map(String::as_str).collect();
    assert_eq!(
        named,
        ["src/a/", "src/a/d.rs", "src/a/e/", "src/b.rs", "src/c.rs"]
    );
}
