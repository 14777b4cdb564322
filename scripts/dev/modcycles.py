#!/usr/bin/env python3
"""Fails on an import cycle between the modules of a Rust crate, at every level.

    scripts/dev/modcycles.py DIR...     # each DIR: a crate (its Cargo.toml), searched below

Every module that is a folder (the crate root too) is checked: its child modules must
not import each other in a circle. A file's module path comes from where it lives
(`src/model/ctx.rs` is `model::ctx`, `src/model.rs` and `src/model/mod.rs` are `model`).
A file depends on what it names through `crate::a::b`, `super::x` and `self::x` paths,
brace groups included (`use crate::model::{ctx, pool}`); naming `crate::model::ctx` from
`api::memory` is the edge `api -> model` at the top level, naming `super::pool` from
`model::ctx` the edge `ctx -> pool` inside `model`. Unit tests are left out:
`#[cfg(test)] mod x { ... }` blocks to the end of a file, and files named `tests.rs` or
`*_tests.rs`. Prints each cycle and exits 1 if there is one; scripts/test.sh runs it.
"""
import pathlib
import re
import sys

GROUP = re.compile(r"\b(crate|super|self)((?:::\w+)*)::\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{.*", re.S)


def crates(dirs):
    for d in dirs:
        for toml in sorted(pathlib.Path(d).rglob("Cargo.toml")):
            inside = toml.relative_to(d).parts
            if "target" in inside or "[package]" not in toml.read_text():
                continue
            root = toml.parent / "src" if (toml.parent / "src").is_dir() else toml.parent
            yield toml.parent, root


def files(root):
    """Module path (a tuple) -> its source files (other crates below are skipped)."""
    mods = {}
    for f in root.rglob("*.rs"):
        rel = f.relative_to(root)
        if any((root / p).joinpath("Cargo.toml").exists() for p in rel.parents if str(p) != "."):
            continue
        if "target" in rel.parts or f.name == "tests.rs" or f.name.endswith("_tests.rs"):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
            parts = parts[:-1]
        if parts == ["build"]:
            continue
        mods.setdefault(tuple(parts), []).append(f)
    return mods


def named_paths(module, text):
    """The module paths a file of `module` names, as tuples from the crate root."""
    def absolute(kind, rest):
        if kind == "crate":
            return tuple(rest)
        base = module if kind == "self" else module[:-1]
        return tuple(base) + tuple(rest)

    out = set()
    for kind, prefix, group in GROUP.findall(text):
        head = [p for p in prefix.split("::") if p]
        for item in re.sub(r"\{[^{}]*\}", "", group).split(","):
            words = [w for w in item.strip().split("::") if w and re.fullmatch(r"\w+", w)]
            if words:
                out.add(absolute(kind, head + words))
    for kind, rest in PATH.findall(text):
        out.add(absolute(kind, [p for p in rest.split("::") if p]))
    return out


def graphs(mods):
    """For each folder module (a tuple), the graph of its children's imports."""
    children = {}
    for m in mods:
        for k in range(len(m)):
            children.setdefault(m[:k], set()).add(m[k])
    out = {folder: {c: set() for c in kids} for folder, kids in children.items()}
    for m, fs in mods.items():
        for f in fs:
            text = TESTS.sub("", f.read_text(errors="replace"))
            for p in named_paths(m, text):
                k = 0
                while k < len(m) and k < len(p) and m[k] == p[k]:
                    k += 1
                if k >= len(m) or k >= len(p):
                    continue  # an ancestor, or the module itself
                folder = m[:k]
                if p[k] in out.get(folder, {}):
                    out[folder][m[k]].add(p[k])
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
        for folder, graph in sorted(graphs(files(root)).items()):
            for comp in cycles(graph):
                bad += 1
                where = "::".join(folder) or "the crate root"
                print(f"import cycle in {crate}, in {where}: {' <-> '.join(comp)}")
    if n == 0:
        print(f"modcycles: no crate (Cargo.toml with [package]) below {' '.join(dirs)}")
        return 2
    print(f"modcycles: {bad} cycle(s) in {n} crate(s), every folder level checked")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
