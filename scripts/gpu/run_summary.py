#!/usr/bin/env python3
"""Writes scripts/gpu-run.sh's summary.txt and results.json from its work folder.

  run_summary.py --work W --out OUTDIR --budget S --started EPOCH --total S

W holds parts.tsv (name, status, seconds, detail), env.log, a folder per part that ran
gpu-check.sh (checks/, bench/, step-cost/, graphs/, ...: results.txt "STATUS name
detail", times.txt "name seconds", figures.txt; step-cost/step-cost.json), gpu-bench.json,
first-use.json and driver-answers.json.d/driver-answers.json where those parts ran.
"""

import argparse
import json
import os
import sys
import time


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def load_json(path):
    text = read(path)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return {"unreadable": path}


def checks_of(folder, part):
    times = {}
    for line in read(os.path.join(folder, "times.txt")).splitlines():
        name, _, secs = line.partition(" ")
        if secs.isdigit():
            times[name] = int(secs)
    out = []
    for line in read(os.path.join(folder, "results.txt")).splitlines():
        status, _, rest = line.partition(" ")
        name, _, detail = rest.partition(" ")
        out.append({"name": name, "status": status, "detail": detail, "seconds": times.get(name), "part": part})
    return out


def figures_of(folder):
    figs = {}
    for line in read(os.path.join(folder, "figures.txt")).splitlines():
        key, _, value = line.partition(" ")
        try:
            figs[key] = int(value)
        except ValueError:
            try:
                figs[key] = float(value)
            except ValueError:
                figs[key] = value
    return figs


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--started", type=int, required=True)
    p.add_argument("--total", type=int, required=True)
    a = p.parse_args(argv)
    w = a.work
    parts = []
    for line in read(os.path.join(w, "parts.tsv")).splitlines():
        f = line.split("\t")
        if len(f) >= 3:
            parts.append({"name": f[0], "status": f[1], "seconds": int(f[2]), "detail": f[3] if len(f) > 3 else ""})
    # the gpu-check.sh folders of the parts, in the order they ran
    folders = [pt["name"] for pt in parts if os.path.isdir(os.path.join(w, pt["name"]))]
    checks, figures = [], {}
    for name in folders:
        checks += checks_of(os.path.join(w, name), name)
        figures.update(figures_of(os.path.join(w, name)))
    env = read(os.path.join(w, "env.log"))
    answers = (load_json(os.path.join(w, "driver-answers.json.d", "driver-answers.json")) or {}).get("answers") or {}
    result = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(a.started)),
        "budget_s": a.budget,
        "total_s": a.total,
        "env": env.splitlines(),
        "parts": parts,
        "checks": checks,
        "figures": figures,
        "bench": load_json(os.path.join(w, "gpu-bench.json")),
        "first_use": load_json(os.path.join(w, "first-use.json")),
        "step_cost": load_json(os.path.join(w, "step-cost", "step-cost.json")),
        # the driver's answers the last run asked to see again (tests/c/driver_probe.c)
        "rechecked_answers": {k: v for k, v in answers.items()
                              if k.startswith("edges.") or k == "null.cuMemGetInfo_v2(NULL, total)"},
        "counts": {s: sum(1 for c in checks if c["status"] == s) for s in ("PASS", "FAIL", "SKIP")},
    }
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = ["gpu-run: %s, %ds of a %ds budget" % (result["started"], a.total, a.budget)]
    lines += ["  " + l for l in env.splitlines() if l.startswith(("GPU ", "gpucap:", "nvcc:", "host:", "python:"))
              or ", GPU-" in l]
    lines.append("")
    lines.append("parts:")
    for pt in parts:
        lines.append("  %-13s %-4s %4ds  %s" % (pt["name"], pt["status"], pt["seconds"], pt["detail"]))
    lines.append("")
    lines.append("checks:")
    for c in checks:
        secs = "%4ds" % c["seconds"] if c["seconds"] is not None else "    -"
        lines.append("%s %s (%s): %s" % (c["status"], c["name"], secs.strip(), c["detail"]))
    sc = result["step_cost"]
    if sc and "workloads" in sc:
        lines.append("")
        lines.append("step cost: ratio to raw, median [95 % bootstrap interval] of per-round ratios")
        for w, e in sc["workloads"].items():
            said = ", ".join("%s %.4f [%.4f, %.4f]" % (way, r["median"], r["low"], r["high"])
                             for way, r in e["ratios"].items() if r)
            lines.append("  %-7s raw %.4g %s; %s (%d rounds)" % (w, e["raw_median"], e["unit"], said, len(e["rounds"])))
    if result["rechecked_answers"]:
        lines.append("")
        lines.append("driver answers re-checked: " + "; ".join("%s = %s" % kv for kv in
                                                              sorted(result["rechecked_answers"].items())))
    n = result["counts"]
    lines.append("")
    lines.append("%d passed, %d failed, %d skipped; parts: %s" % (
        n["PASS"], n["FAIL"], n["SKIP"], ", ".join("%s %s" % (pt["name"], pt["status"]) for pt in parts)))
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
