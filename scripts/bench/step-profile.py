#!/usr/bin/env python3
"""The driver calls of one step of a real program, recorded on the fake GPU, and the
sequence that tests/c/step_replay.c replays from them.

  scripts/bench/step-profile.py record NAME [--python PY] [--warmup W] [--steps N]
                                      [--batch B] [--image I] [--out FILE]
      runs `PY tests/clients/torch_steps.py NAME W N B I` (NAME: train or graph; PY: a
      Python with PyTorch, default target/venv-torch/bin/python) on the fake GPU with
      FAKECUDA_TRACE=1, and writes tests/fixtures/steps/NAME.json (or FILE): every
      driver call per step by entry point (`calls_per_step`), those gpucap hooks
      (`hooked_per_step`: the names libgpucap.so exports), and one step's hooked calls in
      order (`step`, in step_replay's words). The N steps between the client's `begin`
      and `mid` markers and the N between `mid` and `end` must make the same calls, and
      the first N must be N times one step's sequence: a step that is not steady is an
      error. Needs `cargo build --release` (the fake and libgpucap.so).
  scripts/bench/step-profile.py sequence FIXTURE OUT
      writes FIXTURE's `step` to OUT, one call per line: step_replay's input.

Kernels are numbered in order of first use in the step; a launch of a function handle
(CUfunction) names the kernel whose cuKernelGetFunction returned it (LF/XF).
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"^fakecuda: ([A-Za-z_0-9]+(?:\[\d+\])?)\((.*?)\) -> (\S+)(?: \[(.*)\])?$")
ARG = re.compile(r"(\w+)=(0x[0-9a-f]+|-?\d+)")
# The hooked calls step_replay replays, by entry point (the _ptsz forms alike).
REPLAYED = {
    "cuLaunchKernel": "L",
    "cuLaunchKernelEx": "X",
    "cuKernelGetFunction": "G",
    "cuStreamSynchronize": "S",
    "cuGraphLaunch": "GL",
}


def base(name):
    return name[: -len("_ptsz")] if name.endswith("_ptsz") else name


def hooked_names():
    lib = os.path.join(ROOT, "target", "release", "libgpucap.so")
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True)
    return {f[2] for f in (l.split() for l in out.stdout.splitlines()) if len(f) == 3 and f[1] == "T"}


def segments(trace):
    """The trace lines between the markers: (begin..mid, mid..end), and every line."""
    lines = trace.splitlines()
    marks = {l.split(": ", 1)[1]: i for i, l in enumerate(lines) if l.startswith("step-profile: ")}
    if set(marks) != {"begin", "mid", "end"}:
        sys.exit("step-profile: the client's markers are missing (%s)" % sorted(marks))
    return lines[marks["begin"] + 1 : marks["mid"]], lines[marks["mid"] + 1 : marks["end"]], lines


def parse(lines):
    calls = []
    for l in lines:
        m = LINE.match(l)
        if m:
            calls.append((m.group(1), dict(ARG.findall(m.group(2))), m.group(3), m.group(4) or ""))
    return calls


def record(args):
    py = args.python or os.path.join(ROOT, "target", "venv-torch", "bin", "python")
    client = [py, os.path.join(ROOT, "tests", "clients", "torch_steps.py"), args.name,
              str(args.warmup), str(args.steps), str(args.batch), str(args.image)]
    env = dict(os.environ, FAKECUDA_TRACE="1", FAKECUDA_TOTAL_MEM=os.environ.get("FAKECUDA_TOTAL_MEM", "16Gi"))
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([os.path.join(ROOT, "scripts", "fake-gpu.sh"), *client], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0 or "done" not in run.stdout.split():
        sys.stderr.write(run.stderr[-3000:])
        sys.exit("step-profile: the client failed (exit %d)" % run.returncode)
    first, second, every = segments(run.stderr)
    one, two = parse(first), parse(second)
    count = lambda calls: collections.Counter(c[0] for c in calls)
    if count(one) != count(two):
        sys.exit("step-profile: the two runs of %d steps made different calls: not steady" % args.steps)
    n = args.steps
    per_step = {}
    for name, c in sorted(count(one).items()):
        if c % n:
            sys.exit("step-profile: %s: %d calls in %d steps, not a whole number per step" % (name, c, n))
        per_step[name] = c // n
    hooked = hooked_names()
    # Function handles back to the kernel whose cuKernelGetFunction returned them.
    kernel_of = {}
    for name, a, rc, note in parse(every):
        if base(name) == "cuKernelGetFunction" and rc == "CUDA_SUCCESS":
            m = re.search(r"function=(0x[0-9a-f]+)", note)
            if m:
                kernel_of[m.group(1)] = a["kernel"]
    number = {}
    words = []
    for name, a, rc, note in one:
        b = base(name)
        if name not in hooked or b not in REPLAYED:
            continue
        w = REPLAYED[b]
        if w in ("L", "X"):
            handle = a["f"]
            if "a function handle" in note:
                handle = kernel_of.get(handle, handle)
                w += "F"
            words.append("%s %d" % (w, number.setdefault(handle, len(number))))
        elif w == "G":
            words.append("G %d" % number.setdefault(a["kernel"], len(number)))
        else:
            words.append(w)
    if len(words) % n or words != words[: len(words) // n] * n:
        sys.exit("step-profile: the %d steps are not one sequence repeated" % n)
    step = words[: len(words) // n]
    fixture = {
        "what": "the driver calls of one step of tests/clients/torch_steps.py %s on the fake GPU" % args.name,
        "regenerate": "scripts/bench/step-profile.py record %s (then cargo test --release --test bench step_profile::)" % args.name,
        "client": run.stdout.split("\n")[0],
        "command": "torch_steps.py %s %d %d %d %d" % (args.name, args.warmup, n, args.batch, args.image),
        "steps_compared": n,
        "calls_per_step": per_step,
        "hooked_per_step": {k: v for k, v in per_step.items() if k in hooked},
        "kernels": len(number),
        "step": step,
    }
    out = args.out or os.path.join(ROOT, "tests", "fixtures", "steps", args.name + ".json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print("%s: %d calls per step, %d hooked, %d kernels" % (out, sum(per_step.values()), len(step), len(number)))


def sequence(args):
    with open(args.fixture) as f:
        step = json.load(f)["step"]
    with open(args.out, "w") as f:
        f.write("".join(w + "\n" for w in step))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("name", choices=["train", "graph"])
    r.add_argument("--python")
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--steps", type=int, default=2)
    r.add_argument("--batch", type=int, default=64)
    r.add_argument("--image", type=int, default=128)
    r.add_argument("--out")
    s = sub.add_parser("sequence")
    s.add_argument("fixture")
    s.add_argument("out")
    args = p.parse_args()
    record(args) if args.cmd == "record" else sequence(args)


if __name__ == "__main__":
    main()
