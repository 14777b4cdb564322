//! The shape of the code (docs/src/how-it-works.md, "Map of the code"): data flows one way in every crate,
//! checked by scripts/dev/modcycles.py, and no crate borrows another's files by `#[path]`.

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
    let dir = scratch(tag);
    std::fs::create_dir_all(dir.join("src/model")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
    std::fs::write(dir.join("src/lib.rs"), "mod model;\nmod api;\n").unwrap();
    std::fs::write(dir.join("src/api.rs"), "use crate::model::a::A;\n").unwrap();
    std::fs::write(dir.join("src/model.rs"), "mod a;\nmod b;\n").unwrap();
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
