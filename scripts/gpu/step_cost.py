#!/usr/bin/env python3
"""The step-cost benchmark of scripts/gpu-check.sh (bench-step): what gpucap costs a real
step, against the raw driver, gpucap in a pool and HAMi-core (where its build is given).

Ways: raw (nothing preloaded), gpucap (`gpucap run --limit CAP`), pool (`gpucap run
--limit CAP --pool NAME`, a pool of its own for each workload), hami (LD_PRELOAD=libvgpu.so with
CUDA_DEVICE_MEMORY_LIMIT, where --hami names a build). Workloads:

  train   a ResNet-like PyTorch training step (probes/training.py's resnet18_like), STEPS steps after
          WARMUP: one long-lived worker process per way, started once (so PyTorch's start-up
          is out of every figure), told over stdin to run STEPS more steps each round;
          ms per step. Needs PyTorch (else left out, said so).
  launch  launchbench launch LAUNCHES: a tiny kernel launched LAUNCHES (100,000) times;
          ns per launch. A process per run (its start-up is outside the timed loop).
  graph   launchbench graph REPLAYS: a CUDA graph of 32 launches replayed REPLAYS times;
          ns per replay.

ROUNDS rounds (default 8); in each, every workload runs every way once, in an order that
rotates from round to round (stats.rotation). Each way is checked to be what it claims:
cuMemGetInfo's total in its processes is the cap under gpucap and in the pool (else
FAIL: an uncapped "gpucap" way measures nothing). Per-round ratios to raw: their median
and a 95 % bootstrap interval (scripts/gpu/stats.py), written to --out as JSON and as
FIGURE lines. With --deadline (seconds since the epoch), a round that would end past it
is not started (the rounds run are said; fewer than 3 is a FAIL).

  step_cost.py --cli GPUCAP --cap BYTES --out JSON [--launchbench BIN] [--hami SO]
               [--rounds 8] [--train-steps 200] [--warmup 20] [--launches 100000]
               [--replays 2000] [--batch 64] [--image 128] [--deadline EPOCH] [--timeout S]
  step_cost.py worker --steps N --warmup W --batch B --image I   (a training worker)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import stats  # noqa: E402
from child import Child  # noqa: E402
from verdicts import concluded, fail, info, mib, ok, parse_kv, skip  # noqa: E402

GOALS = {"train": (1.005, 1.01), "launch": (1.01, None), "graph": (1.01, None)}
UNITS = {"train": "ms per step", "launch": "ns per launch", "graph": "ns per replay"}


# ---- a training worker (run under a way's prefix) ----------------------------------------

def worker(argv):
    ap = argparse.ArgumentParser(prog="step_cost.py worker")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--image", type=int, required=True)
    a = ap.parse_args(argv)
    import torch
    from probes.training import training_step
    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    print("CTX total=%d free=%d" % (total, free), flush=True)
    step = training_step(torch, a.batch, a.image)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    print("READY total=%d" % total, flush=True)
    while sys.stdin.readline().strip() == "run":
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print("RESULT %.4f loss=%.4f" % (dt * 1000 / a.steps, float(loss)), flush=True)
    return 0


# ---- the ways --------------------------------------------------------------------------

class Ways:
    def __init__(self, a, tmp):
        self.cap = a.cap
        self.names = ["raw", "gpucap", "pool"]
        self.pool = "stepcost%d" % os.getpid()
        self.env = dict(os.environ, GPUCAP_POOL_DIR=tmp)
        self.env.pop("LD_PRELOAD", None)
        self.hami = None
        self.cli = a.cli
        self.tmp = tmp
        if a.hami:
            if os.path.isfile(a.hami):
                self.hami = a.hami
                self.names.append("hami")
            else:
                info("no HAMi-core build at %s: the hami way is left out" % a.hami)

    def prefix(self, way, workload):
        """The command prefix of a way; in the pool way each workload has a pool of its own
        (the training worker holds its memory while the loops run); HAMi-core's shared
        cache file, which sums its processes, likewise."""
        if way == "gpucap":
            return [self.cli, "run", "--limit", str(self.cap), "--"]
        if way == "pool":
            return [self.cli, "run", "--limit", str(self.cap), "--pool", "%s%s" % (self.pool, workload), "--"]
        if way == "hami":
            return ["env", "LD_PRELOAD=" + self.hami, "CUDA_DEVICE_MEMORY_LIMIT=%dm" % (self.cap >> 20),
                    "LIBCUDA_LOG_LEVEL=0", "CUDA_DEVICE_MEMORY_SHARED_CACHE=%s/hami-%s.cache" % (self.tmp, workload)]
        return []

    def judge_total(self, way, total, where):
        """A capping way must show the cap as cuMemGetInfo's total."""
        if way in ("gpucap", "pool") and total != self.cap:
            fail("the %s way's %s saw cuMemGetInfo total %s, not the %s cap: it was not capped, so it measures "
                 "nothing" % (way, where, mib(total), mib(self.cap)))
        if way == "hami" and total != self.cap:
            info("HAMi-core's %s saw total %s with a %s limit" % (where, mib(total), mib(self.cap)))


def run_once(ways, way, cmd, timeout):
    """One launchbench run: (value, total)."""
    try:
        o = subprocess.run(ways.prefix(way, cmd[1]) + cmd, env=ways.env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("%s run of %s timed out after %d s" % (way, " ".join(cmd), timeout))
    value = total = None
    for line in o.stdout.splitlines():
        if line.startswith("RESULT "):
            value = float(line.split()[1])
        elif line.startswith("TOTAL "):
            total = int(line.split()[1])
        elif line.startswith("COUNTER "):
            got, want = line.split()[1:3]
            if got != "0" and got != want:
                fail("%s run of %s: the counter is %s after %s launches" % (way, cmd[1], got, want))
    if o.returncode != 0 or value is None or total is None:
        tail = (o.stdout + o.stderr).strip().splitlines()[-3:]
        fail("%s run of %s: exit status %d, %s" % (way, " ".join(cmd[1:]), o.returncode, " | ".join(tail)))
    ways.judge_total(way, total, cmd[1])
    return value


def start_workers(a, ways):
    """One training worker per way, started one after another (each context made alone)."""
    workers = {}
    for way in ways.names:
        c = Child(ways.prefix(way, "train") + [sys.executable, os.path.abspath(__file__), "worker", "--steps",
                                      str(a.train_steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
                                      "--image", str(a.image)], a.timeout, env=ways.env)
        workers[way] = c
        kv = parse_kv(c.expect("CTX"))
        ways.judge_total(way, int(kv.get("total", 0)), "training worker")
    for way, c in workers.items():
        c.expect("READY")
    return workers


def measure(a):
    tmp = tempfile.mkdtemp(prefix="gpucap-stepcost.")
    ways = Ways(a, tmp)
    workloads = []
    workers = {}
    try:
        if a.torch:
            workers = start_workers(a, ways)
            workloads.append("train")
        else:
            info("PyTorch is not importable here: the training step is left out")
        if a.launchbench:
            workloads += ["launch", "graph"]
        else:
            info("no launchbench (nvcc): the launch and graph loops are left out")
        if not workloads:
            skip("no workload to run: neither PyTorch nor nvcc here")
        rounds = {w: [] for w in workloads}
        started = time.monotonic()
        last = 0.0
        for r in range(a.rounds):
            if a.deadline and time.time() + last * 1.2 + 5 > a.deadline:
                info("round %d not started: the time budget (--deadline) would be passed" % (r + 1))
                break
            t0 = time.monotonic()
            order = stats.rotation(ways.names, r)
            for w in workloads:
                got = {}
                for way in order:
                    if w == "train":
                        workers[way].send("run")
                        got[way] = float(workers[way].expect("RESULT").split()[0])
                    elif w == "launch":
                        got[way] = run_once(ways, way, [a.launchbench, "launch", str(a.launches)], a.timeout)
                    else:
                        got[way] = run_once(ways, way, [a.launchbench, "graph", str(a.replays)], a.timeout)
                rounds[w].append(got)
                info("round %d (%s), %s: %s" % (r + 1, ",".join(order), w,
                                                 ", ".join("%s %.4g" % (k, got[k]) for k in ways.names)))
            last = time.monotonic() - t0
        for c in workers.values():
            c.send("quit")
            c.finish()
    finally:
        for c in workers.values():
            c.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return ways, workloads, rounds, time.monotonic() - started


def check(a):
    ways, workloads, rounds, took = measure(a)
    n = min(len(v) for v in rounds.values())
    if n < 3:
        fail("only %d round(s) fitted the time budget; at least 3 are needed for an interval" % n)
    result = {"ways": ways.names, "cap_bytes": a.cap, "rounds_asked": a.rounds, "seconds": round(took, 1),
              "settings": {"train_steps": a.train_steps, "warmup": a.warmup, "batch": a.batch, "image": a.image,
                           "launches": a.launches, "replays": a.replays},
              "workloads": {}}
    parts = []
    for w in workloads:
        entry = {"unit": UNITS[w], "rounds": rounds[w], "ratios": {}}
        said = []
        for way in ways.names[1:]:
            s = stats.summarize(rounds[w], way)
            entry["ratios"][way] = s
            for k in ("median", "low", "high"):
                print("FIGURE step_cost_%s_%s_%s %s" % (w, way, k, s[k]), flush=True)
            said.append("%s x%.4f [%.4f, %.4f]" % (way, s["median"], s["low"], s["high"]))
        raw = stats.median([r["raw"] for r in rounds[w]])
        entry["raw_median"] = raw
        goal_median, goal_top = GOALS[w]
        g = entry["ratios"]["gpucap"]
        met = g["median"] <= goal_median and (goal_top is None or g["high"] <= goal_top)
        entry["goal"] = {"median_at_most": goal_median, "top_at_most": goal_top, "met": met}
        result["workloads"][w] = entry
        parts.append("%s (raw %.4g %s): %s%s" % (w, raw, UNITS[w], ", ".join(said),
                                                 "" if met else " (goal missed)"))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    ok("ratios to raw, median [95%% bootstrap interval] of %d rotating rounds%s: %s"
       % (n, "" if n >= a.rounds else " (of %d asked: the time budget)" % a.rounds, "; ".join(parts)))


def main(argv):
    if argv[:1] == ["worker"]:
        return worker(argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cap", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--launchbench")
    ap.add_argument("--hami")
    ap.add_argument("--torch", action="store_true", help="PyTorch works here: run the training step")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--launches", type=int, default=100000)
    ap.add_argument("--replays", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=128)
    ap.add_argument("--deadline", type=float)
    ap.add_argument("--timeout", type=int, default=120)
    a = ap.parse_args(argv)
    return concluded(lambda: check(a))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
