#!/usr/bin/env python3
"""The pool-64 and kill-storm checks of scripts/gpu-check.sh: many processes in one gpucap
pool at once, on whatever driver is there (the fake GPU in CI, a real one on a GPU); the
members use the driver API through ctypes, this process watches uncapped (NVML).

  pool_storm.py pool-64 --cli GPUCAP [--members 64]
      MEMBERS processes, each started and waiting on stdin, are told to go at once; each
      then makes cuInit, the primary context and a first block of 64 MiB. Raw (no gpucap)
      then in one pool (`gpucap run --limit CAP --pool NAME`, CAP = the members' contexts
      and blocks with 5 % to spare, plus one context): the time from "go" until all hold
      their block, each way. While they hold: the pool's figure (`gpucap status --pool
      NAME --json`) against NVML's sum over the members (at most the cap; the pool's figure
      short of NVML's by more than 2 MiB a member FAILs: memory not charged; above it is the
      figure pool64_over_nvml_mib: what members' measurements counted in beside their own
      contexts, all made at once); then one more member, whose block
      is its whole room plus 64 MiB, is refused with the pool's line (at its block, or at
      its context when the room does not hold that).
  pool_storm.py kill-storm --cli GPUCAP [--seconds 6]
      A pool of 8: 4 holders each hold 4 blocks, 4 allocators allocate blocks until one is
      refused and free half, over and over; the holders are SIGKILLed one by one (every
      SECONDS/5). A thread samples NVML's used memory of the device every millisecond: it
      must never pass the pool's cap plus what was used before the pool started (plus 2 MiB
      a member). How long the driver takes to release a killed holder's memory (from the
      kill until NVML no longer lists its pid) is measured, each kill.
  pool_storm.py fork-hold --cli GPUCAP
      A member holds a block and forks a child that never uses CUDA (a DataLoader worker);
      the member is SIGKILLed. Where the driver keeps its memory while the child holds the
      device files, another member's request that only that memory would serve is refused
      (NVML's used memory never passes the pool's cap plus what was there before), and is
      served once the child is gone.
Prints INFO and FIGURE lines and OK:/FAIL:/SKIP: (exit 0/1/77).

  pool_storm.py first BLOCK        (a pool-64 member: READY, waits for a line, then HELD T)
  pool_storm.py hold N BLOCK       (a holder: READY after N blocks, then waits)
  pool_storm.py churn BLOCK SECONDS  (an allocator: READY, waits for a line, churns, DONE)
  pool_storm.py forker BLOCK       (holds BLOCK, forks a sleeping child: READY CHILD_PID, waits)
  pool_storm.py asker BLOCK        (a context; READY; each "ask" line: ASK rc, keeping the block;
                                    each "free" line: frees what it keeps, FREED)
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nvml_ctypes import Nvml  # noqa: E402
from pool_contexts import context_size  # noqa: E402
from child import Child  # noqa: E402
from verdicts import MiB, concluded, fail, figure, info, mib, ok  # noqa: E402

BLOCK = 64 * MiB
SLACK = 2 * MiB  # per member: the driver's own bookkeeping


# ---- the members ---------------------------------------------------------------------------

def driver():
    L = ctypes.CDLL("libcuda.so.1")
    for f in ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemFree_v2",
              "cuMemGetInfo_v2"):
        getattr(L, f).restype = ctypes.c_int
    L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    L.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    return L


def context(L):
    ctx = ctypes.c_void_p()
    for rc, what in ((L.cuInit(0), "cuInit"), (L.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "the context"),
                     (L.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")):
        if rc != 0:
            print("ERROR %s -> %d" % (what, rc), flush=True)
            sys.exit(1)


def alloc(L, n):
    p = ctypes.c_uint64()
    rc = L.cuMemAlloc_v2(ctypes.byref(p), n)
    return rc, p.value


def member(argv):
    L = driver()
    if argv[0] == "first":
        print("READY", flush=True)
        sys.stdin.readline()
        context(L)
        rc, _ = alloc(L, int(argv[1]))
        print(("HELD %.6f" % time.time()) if rc == 0 else "ERROR the first block -> %d" % rc, flush=True)
        sys.stdin.readline()
        return 0
    if argv[0] == "beyond":  # the member past the pool's room
        context(L)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        L.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        rc, _ = alloc(L, free.value + BLOCK)
        print("BEYOND %d %d" % (rc, free.value), flush=True)
        return 0
    if argv[0] == "hold":
        context(L)
        for i in range(int(argv[1])):
            rc, _ = alloc(L, int(argv[2]))
            if rc != 0:
                print("ERROR block %d -> %d" % (i + 1, rc), flush=True)
                return 1
        print("READY", flush=True)
        sys.stdin.readline()
        return 0
    if argv[0] == "churn":
        context(L)
        block, end_after = int(argv[1]), float(argv[2])
        print("READY", flush=True)
        sys.stdin.readline()
        held, allocs, refused = [], 0, 0
        end = time.monotonic() + end_after
        while time.monotonic() < end:
            rc, p = alloc(L, block)
            if rc == 0 and len(held) < 64:
                held.append(p)
                allocs += 1
                continue
            refused += rc != 0
            for q in held[len(held) // 2:]:
                L.cuMemFree_v2(q)
            del held[len(held) // 2:]
            time.sleep(0.001)
        print("DONE %s" % json.dumps(dict(allocs=allocs, refused=refused)), flush=True)
        return 0
    if argv[0] == "forker":
        context(L)
        rc, _ = alloc(L, int(argv[1]))
        if rc != 0:
            print("ERROR the block -> %d" % rc, flush=True)
            return 1
        child = os.fork()
        if child == 0:  # holds the inherited descriptors, the driver's among them
            time.sleep(3600)
            os._exit(0)
        print("READY %d" % child, flush=True)
        sys.stdin.readline()
        return 0
    if argv[0] == "asker":
        context(L)
        print("READY", flush=True)
        kept = []
        for line in sys.stdin:
            if line.strip() == "ask":
                rc, q = alloc(L, int(argv[1]))
                if rc == 0:
                    kept.append(q)
                print("ASK %d" % rc, flush=True)
            elif line.strip() == "free":
                for q in kept:
                    L.cuMemFree_v2(q)
                kept = []
                print("FREED", flush=True)
        return 0
    print("ERROR usage", flush=True)
    return 2


# ---- the checks ------------------------------------------------------------------------------

class Setting:
    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="gpucap-storm.")
        self.env = dict(os.environ, GPUCAP_POOL_DIR=self.tmp)
        self.env.pop("LD_PRELOAD", None)
        self.nvml = Nvml()
        self.h = self.nvml.handle(os.environ.get("CUDA_VISIBLE_DEVICES") or 0)
        self.name = "storm%d" % os.getpid()

    def prefix(self, cap):
        return [self.a.cli, "run", "--limit", str(cap), "--pool", self.name, "--"] if cap else []

    def me(self, *args):
        return [sys.executable, os.path.abspath(__file__)] + [str(x) for x in args]

    def pool_used(self):
        o = subprocess.run([self.a.cli, "status", "--pool", self.name, "--json"], env=self.env, capture_output=True,
                           text=True, timeout=60)
        if o.returncode != 0:
            fail("gpucap status --pool %s: %s" % (self.name, (o.stderr or o.stdout).strip()[:300]))
        return sum(g["used"] for g in json.loads(o.stdout)["gpus"])


def start_together(s, n, cap):
    """n first-block members told to go at once: (seconds until all held, the children).
    Their standard error joins their output, so that a line gpucap says (a refusal) is
    echoed with the member's lines where the member fails."""
    kids = [Child(s.prefix(cap) + s.me("first", BLOCK), s.a.timeout, env=s.env, stderr=subprocess.STDOUT)
            for _ in range(n)]
    for c in kids:
        c.expect("READY")
    t0 = time.time()
    for c in kids:
        c.send("go")
    last = 0.0
    for c in kids:
        r = c.expect("HELD")
        last = max(last, float(r))
    return last - t0, kids


def pool_64(s):
    n = s.a.members
    ctx = context_size(s.a, s.nvml, s.h)
    cap = int(n * (ctx + BLOCK) * 1.05) + 2 * ctx
    cap = (cap + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
    total, _, used0 = s.nvml.memory(s.h)
    if cap > total - used0:
        fail("%d members need a %s pool; %s of %s is free" % (n, mib(cap), mib(total - used0), mib(total)))
    raw, kids = start_together(s, n, None)
    for c in kids:
        c.send("done")
        c.finish()
    info("raw: %d processes held their first block %.3f s after go" % (n, raw))
    # the driver gives an exited process's memory back a little later: the pool's members
    # measure their contexts device-wide, so they start once it is back
    deadline = time.monotonic() + 30
    while s.nvml.memory(s.h)[2] > used0 + n * SLACK and time.monotonic() < deadline:
        time.sleep(0.05)
    pooled, kids = start_together(s, n, cap)
    try:
        info("pool: %d processes held their first block %.3f s after go" % (n, pooled))
        procs = s.nvml.processes(s.h)
        nv = sum(procs.get(c.p.pid) or 0 for c in kids)
        listed = sum(1 for c in kids if procs.get(c.p.pid) is not None)
        pool = s.pool_used()
        info("the pool's figure %s, NVML's sum over its %d members %s (%d listed)" % (mib(pool), n, mib(nv), listed))
        err = os.path.join(s.tmp, "beyond.err")
        with open(err, "w") as e:
            o = subprocess.run(s.prefix(cap) + s.me("beyond"), env=s.env, stdout=subprocess.PIPE, stderr=e, text=True,
                               timeout=s.a.timeout)
        said = open(err).read()
        beyond = [ln for ln in o.stdout.splitlines() if ln.startswith("BEYOND ")]
        # the pool's room may not hold even its context (a measurement counts in what it
        # cannot tell apart: charged more, never less): refused there
        at_context = [ln for ln in o.stdout.splitlines() if ln.startswith("ERROR the context -> 2")]
    finally:
        for c in kids:
            c.send("done")
            c.finish()
    figure("pool64_raw_seconds", "%.3f" % raw)
    figure("pool64_pool_seconds", "%.3f" % pooled)
    figure("pool64_over_nvml_mib", "%.1f" % ((pool - nv) / MiB))
    if nv > cap:
        fail("NVML counts %s for the %d members, past the pool's %s cap" % (mib(nv), n, mib(cap)))
    if listed == n and pool + SLACK * n < nv:
        fail("the pool's figure %s is short of NVML's %s for its members: memory not charged" % (mib(pool), mib(nv)))
    if not at_context and (not beyond or beyond[0].split()[1] == "0"):
        fail("member %d's block past the pool's room was not refused (%s)" % (n + 1, beyond or o.returncode))
    if "pool" not in said:
        fail("member %d was refused without the pool's line (stderr: %s)" % (n + 1, said.strip()[:300]))
    line = [ln for ln in said.splitlines() if "refused" in ln][:1]
    ok("%d processes at once held their first block %.3f s after go raw, %.3f s in one pool of %s (a context %s); the "
       "pool's figure %s, NVML's sum %s; member %d, past the room, was refused%s: %s"
       % (n, raw, pooled, mib(cap), mib(ctx), mib(pool), mib(nv), n + 1, " at its context" if at_context else "",
          line[0] if line else said.strip()[:200]))


def kill_storm(s):
    ctx = context_size(s.a, s.nvml, s.h)
    hold_blocks = 4
    cap = 8 * ctx + 4 * hold_blocks * BLOCK + 8 * BLOCK
    total, _, base = s.nvml.memory(s.h)
    if 2 * cap > total - base:
        fail("the kill storm's %s pool needs twice that free; %s of %s is in use" % (mib(cap), mib(base), mib(total)))
    tol = SLACK * 8
    samples, worst, worst_at, stop = [0], [0], [0.0], threading.Event()
    kills = []  # when each holder was killed (time.monotonic())

    def sample():
        while not stop.is_set():
            used = s.nvml.memory(s.h)[2]
            samples[0] += 1
            if used > worst[0]:
                worst[0], worst_at[0] = used, time.monotonic()
            time.sleep(0.001)

    def when_worst():
        # Where the highest sample fell among the kills: what to look at if it was past the cap.
        before = [k for k in kills if k <= worst_at[0]]
        if not before:
            return "before the first kill"
        return "%.1f ms after kill %d of %d" % (1000 * (worst_at[0] - before[-1]), len(before), len(kills))

    holders, churners, released = [], [], []
    t = threading.Thread(target=sample, daemon=True)
    try:
        for _ in range(4):
            c = Child(s.prefix(cap) + s.me("hold", hold_blocks, BLOCK), s.a.timeout, env=s.env)
            holders.append(c)
            r = c.expect("READY")
            if r.startswith("ERROR"):
                fail("a holder: %s" % r)
        for _ in range(4):
            c = Child(s.prefix(cap) + s.me("churn", BLOCK, s.a.seconds), s.a.timeout, env=s.env,
                      stderr=subprocess.DEVNULL)
            churners.append(c)
            c.expect("READY")
        t.start()
        for c in churners:
            c.send("go")
        for c in holders:
            time.sleep(s.a.seconds / 5)
            pid = c.p.pid
            killed = time.monotonic()
            kills.append(killed)
            os.kill(pid, signal.SIGKILL)
            c.p.wait()
            while pid in s.nvml.processes(s.h) and time.monotonic() - killed < 30:
                time.sleep(0.001)
            released.append(time.monotonic() - killed)
        done = [json.loads(c.expect("DONE")) for c in churners]
    finally:
        stop.set()
        for c in holders + churners:
            c.kill()
    t.join(timeout=5)
    over = worst[0] - base
    info("%d samples of the device's used memory; highest %s over the %s before (cap %s), %s"
         % (samples[0], mib(over), mib(base), mib(cap), when_worst()))
    figure("kill_storm_max_over_base_bytes", over)
    figure("kill_storm_release_ms_max", "%.1f" % (1000 * max(released)))
    if over > cap + tol:
        fail("NVML's used memory of the device reached %s over what was there before the pool, past its %s cap (%s)"
             % (mib(over), mib(cap), when_worst()))
    if samples[0] < 100 or not any(d["allocs"] for d in done):
        fail("nothing to judge: %d samples, allocations %s" % (samples[0], [d["allocs"] for d in done]))
    ok("4 holders of %s each SIGKILLed while 4 members allocated (%d allocations, %d refused): the device's used memory "
       "peaked at %s over the %s before, within the pool's %s cap (%d samples, 1 ms apart); the driver released a killed "
       "holder's memory %s ms after the kill"
       % (mib(hold_blocks * BLOCK), sum(d["allocs"] for d in done), sum(d["refused"] for d in done), mib(over),
          mib(base), mib(cap), samples[0], "/".join("%.0f" % (1000 * r) for r in released)))


def fork_hold(s):
    ctx = context_size(s.a, s.nvml, s.h)
    ask = 2 * BLOCK
    # Room for the killed member's context and block and the asker's context, not for the
    # asker's request too; the asker's context and request fit once the first two are back.
    cap = 2 * ctx + BLOCK + ask // 2
    total, _, base = s.nvml.memory(s.h)
    if 3 * cap > total - base:
        fail("the fork-hold pool of %s needs three times that free; %s of %s is in use" % (mib(cap), mib(base), mib(total)))
    tol = SLACK * 2
    forker = asker = None
    child = 0
    try:
        forker = Child(s.prefix(cap) + s.me("forker", BLOCK), s.a.timeout, env=s.env)
        r = forker.expect("READY")
        if r.startswith("ERROR"):
            fail("the member that forks: %s" % r)
        child = int(r.split()[0])
        held = s.nvml.memory(s.h)[2] - base
        forker.p.send_signal(signal.SIGKILL)
        forker.p.wait()
        time.sleep(0.3)
        kept = s.nvml.memory(s.h)[2] - base
        figure("fork_hold_kept_after_kill_bytes", kept)
        asker = Child(s.prefix(cap) + s.me("asker", ask), s.a.timeout, env=s.env)
        asker.expect("READY")
        asker.send("ask")
        first = int(asker.expect("ASK"))
        over = s.nvml.memory(s.h)[2] - base
        os.kill(child, signal.SIGKILL)
        child_killed = time.monotonic()
        while s.nvml.memory(s.h)[2] - base > over - kept + tol and time.monotonic() - child_killed < 10:
            time.sleep(0.005)
        asker.send("free")
        asker.expect("FREED")
        then, deadline = -1, time.monotonic() + 5
        while then != 0 and time.monotonic() < deadline:
            asker.send("ask")
            then = int(asker.expect("ASK"))
            if then != 0:
                time.sleep(0.05)
    finally:
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for c in (forker, asker):
            if c:
                c.kill()
    if over > cap + tol:
        fail("NVML's used memory of the device reached %s over what was there before, past the pool's %s cap: the "
             "killed member's %s, still the driver's while its forked child lived, was served again (%s asked: %s)"
             % (mib(over), mib(cap), mib(kept), mib(ask), "served" if first == 0 else "rc %d" % first))
    if then != 0:
        fail("once the forked child was gone the pool still refused %s (rc %d) under its %s cap" % (mib(ask), then, mib(cap)))
    if kept < held - tol:
        ok("the driver released the killed member's %s at its death although its forked child lived (%s kept): "
           "nothing to hold; %s asked after it: %s" % (mib(held), mib(kept), mib(ask), "served" if first == 0 else "rc %d" % first))
        return
    if first == 0:
        fail("%s was served while the killed member's %s were still the driver's" % (mib(ask), mib(kept)))
    ok("the driver kept a SIGKILLed member's %s while its forked child lived; the pool refused %s meanwhile (NVML at "
       "most %s over the %s before, cap %s) and served it once the child was gone"
       % (mib(kept), mib(ask), mib(over), mib(base), mib(cap)))


def main(argv):
    if argv[:1] and argv[0] in ("first", "beyond", "hold", "churn", "forker", "asker"):
        return member(argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("which", choices=("pool-64", "kill-storm", "fork-hold"))
    ap.add_argument("--cli", required=True)
    ap.add_argument("--members", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--timeout", type=int, default=120)
    a = ap.parse_args(argv)
    made = []

    def run():
        made.append(Setting(a))
        {"pool-64": pool_64, "kill-storm": kill_storm, "fork-hold": fork_hold}[a.which](made[0])

    try:
        return concluded(run)
    finally:
        for s in made:
            shutil.rmtree(s.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
