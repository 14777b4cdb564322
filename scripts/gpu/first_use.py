#!/usr/bin/env python3
"""First use of CUDA on this machine's driver, raw and under gpucap (scripts/gpu-run.sh's
first-use part): tests/c/bench_first.c (cuInit, the first context, the first 4 KiB
allocation, each timed in the process) built here with the C compiler against whatever
libcuda.so.1 this process loads (the real driver, or the fake in CI).

  first_use.py --cli GPUCAP --reps N --out JSON --build DIR

Ways, interleaved, N runs each, for cuCtxCreate_v2 and cuDevicePrimaryCtxRetain:
  raw      no shim
  gpucap   gpucap run --limit 50%  (the first context measured by NVML)
  pool     the same in a pool (GPUCAP_POOL, a fresh pool directory)
Prints a table of medians (microseconds) and writes JSON; exit 1 on any failure.
"""

import argparse
import ctypes
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WAYS = ("raw", "gpucap", "pool")
FIELDS = ("init_ns", "ctx_ns", "alloc_ns", "total_ns")


def libcuda_path():
    """The file libcuda.so.1 resolves to in this process (its mapping); exits 77 (SKIP)
    where there is no driver."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print("SKIP: no NVIDIA driver (%s)" % e, flush=True)
        sys.exit(77)
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if re.search(r"/libcuda\.so(\.[0-9.]+)?$", path) or path.endswith("libcuda.so"):
                return path
    raise SystemExit("first-use: libcuda.so.1 loaded but not found in /proc/self/maps")


def build(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    exe = os.path.join(out_dir, "bench_first")
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), "cc")
    cmd = [cc, "-O2", "-I", os.path.join(ROOT, "tests/c"), "-o", exe, os.path.join(ROOT, "tests/c/bench_first.c"),
           libcuda_path()]
    print("first-use: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return exe


def one(exe, way, call, cli, pool_dir):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    cmd = [exe, call]
    if way != "raw":
        cmd = [cli, "run", "--limit", "50%", "--"] + cmd
    if way == "pool":
        env["GPUCAP_POOL_DIR"] = pool_dir
        cmd[2:2] = ["--pool", "firstuse"]
    o = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    m = re.search(r"init_ns=(\d+) ctx_ns=(\d+) alloc_ns=(\d+) total_ns=(\d+)", o.stdout)
    if o.returncode != 0 or not m:
        raise SystemExit("first-use: %s %s: exit %d: %s %s" % (way, call, o.returncode, o.stdout.strip(),
                                                               o.stderr.strip()[-300:]))
    return [int(x) for x in m.groups()]


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", required=True)
    p.add_argument("--build", required=True)
    a = p.parse_args(argv)
    exe = build(a.build)
    pool_dir = tempfile.mkdtemp(prefix="gpucap-firstuse.")
    runs = {(c, w): [] for c in ("create", "retain") for w in WAYS}
    for rep in range(a.reps):
        for call in ("create", "retain"):
            for way in WAYS:
                runs[(call, way)].append(one(exe, way, call, a.cli, pool_dir))
        print("first-use: rep %d of %d done" % (rep + 1, a.reps), flush=True)
    cases = []
    print("%-18s %10s %10s %10s %10s   (median of %d, us)" % ("", "cuInit", "context", "1st alloc", "total", a.reps))
    for (call, way), rs in runs.items():
        med = [statistics.median(r[i] for r in rs) / 1e3 for i in range(4)]
        cases.append(dict(call=call, way=way, **{f.replace("_ns", "_us"): round(v, 1) for f, v in zip(FIELDS, med)}))
        print("%-18s %10.1f %10.1f %10.1f %10.1f" % ("%s, %s" % (call, way), *med))
    with open(a.out, "w") as f:
        json.dump({"reps": a.reps, "cases": cases}, f, indent=1)
    print("first-use: wrote %s" % a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
