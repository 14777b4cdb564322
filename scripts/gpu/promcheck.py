#!/usr/bin/env python3
"""Checks a Prometheus text exposition (format 0.0.4) by the rules gpucap's tests hold
`gpucap metrics` to (tests/cli/metrics.rs: Prometheus's `promtool check metrics`, and each
series once), for machines without promtool (the real-GPU run). tests/bench/gpu_run.rs proves
this checker refuses what promtool refuses, on the same broken expositions.

  promcheck.py [FILE]      (stdin without FILE) -> "OK: N families, M samples" exit 0,
                           or one "FAIL: line L: why" per problem, exit 1

As a module: `problems(text)` -> list of strings, `samples(text)` -> list of
(name, {label: value}, float).

Rules: every line is a comment (`# HELP name text`, `# TYPE name type`, other `#`
comments) or a sample `name{labels} value [timestamp]`; metric and label names match
Prometheus's grammar; label values are quoted with only `\\\\`, `\\"` and `\\n` escapes;
each family has one HELP and one TYPE, before its samples, and its samples are together;
a counter's name ends in `_total` (promtool's lint); a sample's name is its family's
(or, for summaries and histograms, the family's `_sum`, `_count`, `_bucket`); each
series (name and labels) appears once; values are floats (`NaN`, `+Inf`, `-Inf` too).
"""

import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def _labels(s, where):
    """Parses `a="x",b="y"` (the part inside the braces); returns (dict, problem)."""
    out = {}
    i = 0
    while i < len(s):
        m = re.compile(r"\s*([^=\s]*)\s*=\s*\"").match(s, i)
        if not m:
            return out, "%s: a label is not name=\"value\" at %r" % (where, s[i:i + 20])
        name = m.group(1)
        if not LABEL.match(name):
            return out, "%s: bad label name %r" % (where, name)
        i = m.end()
        val = []
        while True:
            if i >= len(s):
                return out, "%s: label %s's value is not closed" % (where, name)
            c = s[i]
            if c == "\\":
                if i + 1 >= len(s) or s[i + 1] not in '\\"n':
                    return out, "%s: label %s has a bad escape %r" % (where, name, s[i:i + 2])
                val.append({"\\": "\\", '"': '"', "n": "\n"}[s[i + 1]])
                i += 2
                continue
            if c == '"':
                i += 1
                break
            if c == "\n":
                return out, "%s: label %s's value holds a line break" % (where, name)
            val.append(c)
            i += 1
        if name in out:
            return out, "%s: label %s twice" % (where, name)
        out[name] = "".join(val)
        rest = s[i:].lstrip()
        if rest.startswith(","):
            i = len(s) - len(rest) + 1
        elif rest:
            return out, "%s: junk after label %s: %r" % (where, name, rest[:20])
        else:
            break
    return out, None


def _float(s):
    if s in ("NaN", "+Inf", "-Inf", "Inf"):
        return float(s.replace("Inf", "inf"))
    return float(s)


def parse(text):
    """(samples, problems): samples as (name, labels, value)."""
    problems, samples = [], []
    help_of, type_of, seen_series, done_families = {}, {}, set(), set()
    current = None
    for n, line in enumerate(text.split("\n"), 1):
        where = "line %d" % n
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    problems.append("%s: bad metric name %r" % (where, name))
                    continue
                if name != current and name in done_families:
                    problems.append("%s: %s %s after its samples or another family" % (where, parts[1], name))
                table = help_of if parts[1] == "HELP" else type_of
                if name in table:
                    problems.append("%s: a second %s for %s" % (where, parts[1], name))
                if parts[1] == "TYPE":
                    t = parts[3].strip() if len(parts) > 3 else ""
                    if t not in TYPES:
                        problems.append("%s: %s has type %r, not one of %s" % (where, name, t, ", ".join(TYPES)))
                    elif t == "counter" and not name.endswith("_total"):
                        problems.append("%s: counter %s does not end in _total" % (where, name))
                    table[name] = t
                else:
                    table[name] = parts[3] if len(parts) > 3 else ""
                if current is not None and current != name:
                    done_families.add(current)
                current = name
            continue
        m = re.match(r"([^{\s]+)(\{(.*)\})?\s+(\S+)(\s+(-?\d+))?\s*\Z", line)
        if not m:
            problems.append("%s: not a sample: %r" % (where, line[:80]))
            continue
        name, _, body, value = m.group(1), m.group(2), m.group(3), m.group(4)
        if not NAME.match(name):
            problems.append("%s: bad metric name %r" % (where, name))
            continue
        labels, why = _labels(body or "", where)
        if why:
            problems.append(why)
            continue
        try:
            v = _float(value)
        except ValueError:
            problems.append("%s: %s's value %r is not a number" % (where, name, value))
            continue
        family = name
        if name not in type_of:
            for t, sfx in SUFFIXES.items():
                for s in sfx:
                    base = name[: -len(s)]
                    if name.endswith(s) and type_of.get(base) == t:
                        family = base
        if family not in type_of or family not in help_of:
            problems.append("%s: sample %s has no %s line before it" % (
                where, name, "TYPE" if family not in type_of else "HELP"))
        elif family != current:
            problems.append("%s: sample %s is not with its family's other lines" % (where, name))
        series = (name, tuple(sorted(labels.items())))
        if series in seen_series:
            problems.append("%s: series %s%s twice" % (where, name, labels))
        seen_series.add(series)
        samples.append((name, labels, v))
    for name in type_of:
        if name not in help_of:
            problems.append("%s has a TYPE but no HELP" % name)
    return samples, problems


def problems(text):
    return parse(text)[1]


def samples(text):
    return parse(text)[0]


def main(argv):
    text = open(argv[0]).read() if argv else sys.stdin.read()
    s, bad = parse(text)
    for b in bad:
        print("FAIL: " + b)
    if bad:
        return 1
    print("OK: %d families, %d samples" % (len({n for n, _, _ in s}), len(s)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
