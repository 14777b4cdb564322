#!/usr/bin/env python3
"""Fails on an import cycle between the top-level modules of a Rust crate.

    scripts/modcycles.py DIR...     # each DIR: a crate (its Cargo.toml), searched below

A crate's top-level modules are the files and folders beside its root file (lib.rs or
main.rs, in src/ if there is one). Module A depends on module B when a file of A names
`crate::B` (also inside `use crate::{B, ...}`). Unit tests are left out: `#[cfg(test)]
mod x { ... }` blocks to the end of a file, and files named `tests.rs` or `*_tests.rs`.
Prints each cycle and exits 1 if there is one; scripts/test.sh runs it.
"""
import pathlib
import re
import sys

USE_GROUP = re.compile(r"\bcrate::\{([^}]*)\}")
PATH = re.compile(r"\bcrate::(\w+)")
TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", re.S)


def crates(dirs):
    for d in dirs:
        for toml in sorted(pathlib.Path(d).rglob("Cargo.toml")):
            if "target" in toml.parts or "[package]" not in toml.read_text():
                continue
            root = toml.parent / "src" if (toml.parent / "src").is_dir() else toml.parent
            yield toml.parent, root


def modules(root):
    """Top-level module name -> its source files (other crates below are skipped)."""
    mods = {}
    for f in root.rglob("*.rs"):
        rel = f.relative_to(root)
        if any((root / p).joinpath("Cargo.toml").exists() for p in rel.parents if str(p) != "."):
            continue
        if "target" in rel.parts or f.name == "tests.rs" or f.name.endswith("_tests.rs"):
            continue
        top = rel.parts[0].removesuffix(".rs")
        if top in ("lib", "main", "mod", "build"):
            continue
        mods.setdefault(top, []).append(f)
    return mods


def edges(mods):
    out = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            text = TESTS.sub("", f.read_text(errors="replace"))
            names = set(PATH.findall(text))
            for group in USE_GROUP.findall(text):
                names |= {n.strip().split("::")[0] for n in group.split(",") if n.strip()}
            out[m] |= {n for n in names if n in mods and n != m}
    return out


def cycles(graph):
    """Strongly connected sets of two or more modules (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def main(dirs):
    bad = 0
    n = 0
    for crate, root in crates(dirs or ["."]):
        n += 1
        for comp in cycles(edges(modules(root))):
            bad += 1
            print(f"import cycle in {crate}: {' <-> '.join(comp)}")
    print(f"modcycles: {bad} cycle(s) in {n} crate(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
