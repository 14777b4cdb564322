#!/usr/bin/env python3
"""Fails on an import cycle between the modules of a Rust crate, at every level.

    scripts/dev/modcycles.py DIR...     # each DIR: a crate (its Cargo.toml), searched below

Every module that is a folder (the crate root too) is checked: its child modules must
not import each other in a circle. A file's module path comes from where it lives
(`src/model/ctx.rs` is `model::ctx`, `src/model.rs` and `src/model/mod.rs` are `model`).
A file depends on what it names through `crate::a::b`, `super::x` and `self::x` paths,
brace groups included (`use crate::model::{ctx, pool}`); naming `crate::model::ctx` from
`api::memory` is the edge `api -> model` at the top level, naming `super::pool` from
`model::ctx` the edge `ctx -> pool` inside `model`. A name is counted where it is defined,
followed through the `use` lines of the modules it passes: with `model/mod.rs` holding
`use pool::Pool;`, `super::Pool` in `model::ctx` is the edge `ctx -> pool` too (a parent
relaying its children's names to each other hides no cycle). Unit tests are left out:
`#[cfg(test)] mod x { ... }` blocks to the end of a file, and files named `tests.rs` or
`*_tests.rs`. Prints each cycle and exits 1 if there is one; scripts/test.sh runs it.
"""
import pathlib
import re
import sys

USE = re.compile(r"^\s*(?:pub(?:\([^()]*\))?\s+)?use\s+([^;]+);", re.M)
DEFINES = r"\b(?:fn|struct|enum|const|static|type|trait|union|mod|macro_rules!)\s+{}\b"
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


def use_leaves(tree):
    """The leaves of a `use` tree (`a::{b, c::d as e, f::*}`), as (segments, the name it
    binds: its last segment, its `as` name, or None for a glob)."""
    tree = re.sub(r"\s+", " ", tree).strip()
    head, brace, rest = tree.partition("{")
    if not brace:
        path, _, alias = tree.partition(" as ")
        words = [w.strip() for w in path.split("::") if w.strip()]
        if words and words[-1] == "*":
            return [(words[:-1], None)]
        if words and words[-1] == "self":
            words = words[:-1]
        return [(words, alias.strip() or words[-1])] if words else []
    prefix = [w.strip() for w in head.split("::") if w.strip()]
    inner = rest[: rest.rfind("}")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return [(prefix + words, name) for part in parts for words, name in use_leaves(part)]


def imports(module, text, mods):
    """What the `use` lines of `module` bind: name -> the path it names (a tuple from the
    crate root), and the paths of its globs. Paths into other crates are left out."""
    names, globs = {}, []
    for tree in USE.findall(text):
        for words, name in use_leaves(tree):
            base = module
            if not words:
                continue
            if words[0] not in ("crate", "super", "self") and module + (words[0],) not in mods:
                continue  # `std::`, a dependency
            while words and words[0] in ("crate", "super", "self"):
                first = words.pop(0)
                base = () if first == "crate" else base[:-1] if first == "super" else base
            path = base + tuple(words)
            if name is None:
                globs.append(path)
            elif name != "_":
                names[name] = path
    return names, globs


def resolver(mods, texts):
    """A function that follows a path to where the name it ends in is defined: through each
    module on the way that only imports that name (`use`, `pub use`, a glob)."""
    bound = {m: imports(m, texts[m], mods) for m in mods}

    def defines(module, name):
        return re.search(DEFINES.format(re.escape(name)), texts.get(module, "")) is not None

    def defines_or_binds(module, name):
        """Where `name` in `module` comes from: None where the module defines it (or
        nothing is known of it), else the path its `use` names."""
        names, globs = bound.get(module, ({}, []))
        if name in names:
            return names[name]
        if defines(module, name):
            return None
        for g in globs:  # a glob yields to the module's own names
            if g + (name,) in mods or name in bound.get(g, ({}, []))[0] or defines(g, name):
                return g + (name,)
        return None

    def resolve(path, depth=0):
        for j in range(1, len(path)):
            if path[: j + 1] in mods or path[:j] not in mods:
                continue
            target = defines_or_binds(path[:j], path[j])
            if target is None or target == path[: j + 1] or depth > 16:
                return path
            return resolve(target + path[j + 1:], depth + 1)
        return path

    return resolve


def graphs(mods):
    """For each folder module (a tuple), the graph of its children's imports."""
    children = {}
    for m in mods:
        for k in range(len(m)):
            children.setdefault(m[:k], set()).add(m[k])
    out = {folder: {c: set() for c in kids} for folder, kids in children.items()}
    texts = {
        m: "\n".join(TESTS.sub("", f.read_text(errors="replace")) for f in fs)
        for m, fs in mods.items()
    }
    resolve = resolver(mods, texts)
    for m, text in texts.items():
        for p in map(resolve, named_paths(m, text)):
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
