#!/usr/bin/env python3
"""Checks that the repository's Python scripts import from each other only names that exist.

    scripts/dev/pyimports.py DIR...

Each DIR (scripts/gpu, tests/clients, ...) is searched for .py files. A script puts its own
folder, or another script folder, first on sys.path and imports the helpers there
(`from verdicts import fail`, `from probes.training import training_step`); the real-GPU
checks run only where a GPU is lent, so a helper moved or renamed would otherwise show only
there. For every `from M import a, b` and `import M` (at any depth in the file) where M is a
module of one of the DIRs (a file `M.py`, or `M/__init__.py` and `M/x.py` for `M.x`), the
names must be defined at M's top level (a function, a class, an assignment, an import).
Frameworks and the standard library are not looked at.

Prints one line per name that is missing and exits 1, else prints how many imports it
checked and exits 0. Needs only the standard library.
"""

import ast
import os
import sys


def local_modules(dirs):
    """Module name -> path, for every .py file below each of `dirs` (its own folder the
    root of its dotted name: probes/training.py is probes.training)."""
    found = {}
    for top in dirs:
        for folder, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            rel = os.path.relpath(folder, top)
            prefix = "" if rel == "." else rel.replace(os.sep, ".") + "."
            for f in files:
                if f.endswith(".py"):
                    name = f[:-3]
                    dotted = prefix[:-1] if name == "__init__" else prefix + name
                    if dotted:
                        found.setdefault(dotted, os.path.join(folder, f))
    return found


def top_level_names(path):
    names = set()
    for node in ast.parse(open(path).read(), path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
    return names


def main(dirs):
    if not dirs:
        print("usage: pyimports.py DIR...", file=sys.stderr)
        return 2
    modules = local_modules(dirs)
    checked, missing = 0, []
    for path in sorted(set(modules.values())):
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                have = top_level_names(modules[node.module])
                for a in node.names:
                    checked += 1
                    sub = "%s.%s" % (node.module, a.name)
                    if a.name != "*" and a.name not in have and sub not in modules:
                        missing.append("%s:%d: %s has no %s" % (path, node.lineno, node.module, a.name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    head = a.name.split(".")[0]
                    if head in modules or a.name in modules:
                        checked += 1
                        if a.name not in modules:
                            missing.append("%s:%d: no module %s" % (path, node.lineno, a.name))
    for line in missing:
        print(line)
    if missing:
        return 1
    print("pyimports: %d imports of the scripts' own modules checked in %s" % (checked, ", ".join(dirs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
