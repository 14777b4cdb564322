#!/usr/bin/env python3
"""The pool-contexts check of scripts/gpu-check.sh (scripts/gpu/checks/pool.sh): a pool
member's new context is never charged short while the other members churn.

gpucap measures a new context as the device's free memory before minus after the
driver made it: device-wide, so another member's free inside that window would make the
context look smaller than it is, and a context charged short lets the pool hold more
than its cap. The members mark their frees and allocations around their driver calls
and the measuring member takes them out (docs/src/counting.md, "Accuracy of the context
charge"). Here, on whatever driver is there (the fake GPU in CI, a real one on a GPU):

  - 3 churners in one GPUCAP_POOL each hold a block and cycle between 1 and 8 blocks
    (allocate until 8 are held or one is refused, then free down to 1) for SECONDS;
  - 1 member makes and destroys contexts (cuCtxCreate_v2, held HOLD_MS, every 16th
    LONG_HOLD_MS, cuCtxDestroy_v2; it holds no other context, so each is measured as a
    first context, by NVML) while they churn, and says when each context lived (from
    cuCtxCreate_v2's return to cuCtxDestroy_v2's call, CLOCK_MONOTONIC); a refused
    context is counted and tried again;
  - the cap is the 4 contexts plus 0.6 of what the churners want at most, so the pool is
    full (refusals) whenever a context lives and the churners are high, and a context
    charged short would let them fill it past the cap;
  - this process samples, as often as it can, the driver's own figure for the members:
    the sum of NVML's per-process used memory of their pids
    (nvmlDeviceGetComputeRunningProcesses_v3, through ctypes, uncapped), or where NVML
    gives no per-process figure, the device's used memory less what it was before the
    pool started; and, in a thread, `gpucap status --pool NAME --json`.

FAIL if the maker's charge (gpucap status, while its context lives) is ever short of
what a context takes by the driver's count (an uncapped child's, measured first), 0
included: a read of `gpucap status` made wholly while one of its contexts lived that
shows the maker charged 0 is a context charged nothing (a context always takes memory;
the maker holds nothing else, so between its contexts 0 is right and not judged); if no
such read was made (nothing to judge); if the
driver's figure is above the cap plus TOLERANCE in two samples in a row (one sample
reads several processes' figures one after another: on the fake GPU a lone sample can
add one member's figure from before a free to another's from after the allocation it
made room for, a few in 70,000, and under load two in a row were seen once, so with
per-process figures a sample is the smaller of their sum and the device's used memory
less what it was before the pool started, one reading that holds them all; an
undercharged context keeps the pool over its cap for as long as it lives); if gpucap's used is ever above the cap; if a member failed; or if
nothing was made. TOLERANCE is 2 MiB per member process: the blocks are whole 2 MiB
pages, so the driver's page rounding adds nothing to them; what remains is its own
bookkeeping per process (on the H200 it counted a driver-API process 5.6 MiB *below*
gpucap's charge). A context charged short is short by whole blocks (64 MiB).

  pool_contexts.py --cli GPUCAP [--seconds S] [--hold-ms MS] [--block-mib B] [--timeout S]
  pool_contexts.py churn BLOCK LOW HIGH SECONDS     (a churner, run under gpucap run)
  pool_contexts.py contexts SECONDS HOLD_MS         (the context maker, likewise)

The members print READY, wait for a line on stdin, run, print DONE {json}. Prints INFO
lines, then OK:/FAIL:/SKIP: (exit 0/1/77) as the probes of scripts/gpu/ do.
"""

import argparse
import bisect
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nvml_ctypes import Nvml, NvmlError  # noqa: E402
from child import Child  # noqa: E402
from observer import Cuda  # noqa: E402
from verdicts import MiB, Outcome, fail, info, mib, ok  # noqa: E402

CHURNERS = 3
LOW, HIGH = 1, 8  # blocks a churner holds at its lowest and highest
OOM = 2
LONG_EVERY, LONG_HOLD_MS = 16, 200  # every 16th context lives at least 200 ms


# ---- the members (run under gpucap run) ------------------------------------------------

def member_churn(block, low, high, seconds):
    cuda = Cuda()  # the primary context, measured while the pool is quiet
    held = []
    for _ in range(low):
        p = cuda.alloc(block)
        if p is None:
            fail("churner: its first %s was refused" % mib(block))
        held.append(p)
    print("READY pid=%d" % os.getpid(), flush=True)
    sys.stdin.readline()
    allocs = frees = refusals = cycles = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while len(held) < high:  # up: until HIGH held or refused
            p = cuda.alloc(block)
            if p is None:
                refusals += 1
                break
            held.append(p)
            allocs += 1
        while len(held) > low:  # down
            cuda.release(held.pop())
            frees += 1
        cycles += 1
    for p in held:
        cuda.release(p)
    return dict(allocs=allocs, frees=frees, refusals=refusals, cycles=cycles)


def member_contexts(seconds, hold_ms):
    lib = ctypes.CDLL("libcuda.so.1")
    vp = ctypes.c_void_p
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuCtxCreate_v2.argtypes = [ctypes.POINTER(vp), ctypes.c_uint, ctypes.c_int]
    lib.cuCtxDestroy_v2.argtypes = [vp]
    for f in ("cuInit", "cuDeviceGet", "cuCtxCreate_v2", "cuCtxDestroy_v2"):
        getattr(lib, f).restype = ctypes.c_int
    if lib.cuInit(0) != 0:
        fail("context maker: cuInit failed")
    dev = ctypes.c_int()
    if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        fail("context maker: cuDeviceGet failed")
    print("READY pid=%d" % os.getpid(), flush=True)
    sys.stdin.readline()
    rounds = refusals = 0
    lived = []  # [made, ended] of each context: time.monotonic(), CLOCK_MONOTONIC
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ctx = vp()
        rc = lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev.value)
        made = time.monotonic()
        if rc == OOM:  # the pool is full: expected near the cap
            refusals += 1
            time.sleep(0.001)
            continue
        if rc != 0:
            fail("context maker: cuCtxCreate_v2 returned %d in round %d" % (rc, rounds + 1))
        long = rounds % LONG_EVERY == LONG_EVERY - 1
        time.sleep(max(hold_ms, LONG_HOLD_MS if long else 0) / 1e3)
        lived.append([made, time.monotonic()])
        rc = lib.cuCtxDestroy_v2(ctx)
        if rc != 0:
            fail("context maker: cuCtxDestroy_v2 returned %d in round %d" % (rc, rounds + 1))
        rounds += 1
    return dict(rounds=rounds, refusals=refusals, lived=lived)


def member_main(argv):
    try:
        if argv[0] == "churn" and len(argv) == 5:
            done = member_churn(int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4]))
        elif argv[0] == "contexts" and len(argv) == 3:
            done = member_contexts(float(argv[1]), float(argv[2]))
        else:
            print("ERROR usage: churn BLOCK LOW HIGH SECONDS | contexts SECONDS HOLD_MS", flush=True)
            return 2
    except Outcome as o:
        print("ERROR %s" % o.message, flush=True)
        return 1
    print("DONE %s" % json.dumps(done), flush=True)
    return 0


# ---- the check ---------------------------------------------------------------------------

class StatusWatch(threading.Thread):
    """`gpucap status --pool NAME --json` in a loop: the highest used it showed."""

    def __init__(self, cli, name, env):
        super().__init__(daemon=True)
        self.cmd = [cli, "status", "--pool", name, "--json"]
        self.env = env
        self.stop = threading.Event()
        self.max_used = 0
        self.cap = None
        self.reads = 0
        self.error = None
        self.maker = None  # the context maker's pid: {its used: times seen}
        self.maker_charges = {}
        self.maker_reads = []  # (started, ended, its used): time.monotonic() around the read

    def run(self):
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                o = subprocess.run(self.cmd, env=self.env, capture_output=True, text=True, timeout=60)
                st = json.loads(o.stdout) if o.returncode == 0 else None
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                self.error = "%s: %s" % (" ".join(self.cmd), e)
                return
            if st is None:
                self.error = "%s: exit %d: %s" % (" ".join(self.cmd), o.returncode, o.stderr.strip()[:300])
                return
            for g in st["gpus"]:
                self.cap = g["cap"]
                self.max_used = max(self.max_used, g["used"])
            for m in st["members"]:
                if m["pid"] == self.maker:
                    used = sum(g["used"] for g in m["gpus"])
                    self.maker_charges[used] = self.maker_charges.get(used, 0) + 1
                    self.maker_reads.append((started, time.monotonic(), used))
            self.reads += 1


def reads_while_a_context_lived(reads, lived):
    """The reads (started, ended, used) made wholly while one of the maker's contexts
    lived (lived: [made, ended] pairs, in order)."""
    made = [w[0] for w in lived]
    inside = []
    for r in reads:
        i = bisect.bisect_right(made, r[0]) - 1  # the last context made before the read
        if i >= 0 and r[1] <= lived[i][1]:
            inside.append(r)
    return inside


def driver_figure(nvml, h, pids, baseline):
    """The driver's figure for the pool's members: (bytes, {pid: bytes}) from NVML's
    per-process figures (a member with no context is not listed: 0), or with
    `baseline`, the device's used memory less it (NVML gives no per-process figure)."""
    if baseline is not None:
        return nvml.memory(h)[2] - baseline, None
    procs = nvml.processes(h)
    mine = {p: procs.get(p) or 0 for p in pids}
    return sum(mine.values()), mine


def context_size(a, nvml, h):
    """What one context takes by the driver's count: an uncapped child makes one and
    NVML names its figure (the device's used memory before and after, where NVML gives
    no per-process figure: a container's pids)."""
    before = nvml.memory(h)[2]
    c = Child([sys.executable, os.path.join(HERE, "probe.py"), "ctx-child"], a.timeout)
    try:
        c.expect("READY")
        got, deadline = None, time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = nvml.process_used(h, c.p.pid)
            if not got:
                time.sleep(0.05)
        if not got:
            got = nvml.memory(h)[2] - before
    finally:
        c.send("done")
        c.finish()
    if got < 2 * MiB:
        fail("a process holding a context shows %s on the GPU (NVML): cannot size the pool" % mib(got))
    return got


def check(a):
    uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    nvml = Nvml()
    h = nvml.handle(uuid if uuid.startswith("GPU-") else 0)
    ctx = context_size(a, nvml, h)
    block = max(2 * MiB, min(a.block_mib * MiB, ctx // 4) // (2 * MiB) * (2 * MiB))
    want = CHURNERS * HIGH * block
    cap = (CHURNERS + 1) * ctx + int(0.6 * want)
    cap = (cap + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
    tolerance = 2 * MiB * (CHURNERS + 1)
    info("a context takes %s (NVML, uncapped); blocks of %s; the churners want up to %s; cap %s, tolerance %s"
         % (mib(ctx), mib(block), mib(want), mib(cap), mib(tolerance)))
    total, _, used0 = nvml.memory(h)
    if 2 * cap > total - used0:
        fail("the pool's %s cap needs twice that free on the GPU; %s of %s is in use"
             % (mib(cap), mib(used0), mib(total)))

    pdir = tempfile.mkdtemp(prefix="gpucap-poolctx.")
    name = "poolctx%d" % os.getpid()
    env = dict(os.environ, GPUCAP_POOL_DIR=pdir)
    env.pop("LD_PRELOAD", None)
    pre = [a.cli, "run", "--limit", str(cap), "--pool", name, "--", sys.executable, os.path.abspath(__file__)]
    members, errs = [], []

    def start(i, args):
        err = os.path.join(pdir, "member%d.err" % i)
        errs.append(err)
        c = Child(pre + args, a.timeout, stderr=open(err, "w"), env=env)
        members.append(c)
        r = c.expect("READY")
        if r.startswith("ERROR") or not r.startswith("pid="):
            fail("member %d did not start: %s" % (i, r))
        return c

    watch = None
    try:
        base = nvml.memory(h)[2]
        for i in range(CHURNERS):  # one at a time: each context is measured alone
            start(i, ["churn", str(block), str(LOW), str(HIGH), str(a.seconds)])
        maker = start(CHURNERS, ["contexts", str(a.seconds), str(a.hold_ms)])
        pids = [c.p.pid for c in members]
        procs = nvml.processes(h)  # the churners hold their contexts: listed, with a figure
        per_process = all(procs.get(p) is not None for p in pids[:CHURNERS])
        info("members %s ready; the driver's figure: %s" % (pids, "NVML per process" if per_process else
                                                             "the device's used less %s" % mib(base)))
        watch = StatusWatch(a.cli, name, env)
        watch.maker = maker.p.pid
        watch.start()
        for c in members:
            c.send("go")
        samples, worst, worst_by = 0, 0, None
        over, confirmed, prev_over = 0, 0, False
        end = time.monotonic() + a.seconds + a.timeout
        done = {}
        while len(done) < len(members) and time.monotonic() < end:
            fig, by = driver_figure(nvml, h, pids, None if per_process else base)
            if by is not None:
                # NVML's per-process figures are read one after another, so a sample taken
                # while the sampler is descheduled can add one member's figure from before a
                # free to another's from after the allocation it made room for; the device's
                # used memory, one reading, holds every member's and bounds their sum from
                # above (nothing else runs on the device): the smaller of the two is judged.
                fig = min(fig, nvml.memory(h)[2] - base)
            samples += 1
            is_over = fig > cap + tolerance
            over += is_over
            confirmed += is_over and prev_over
            prev_over = is_over
            if fig > worst:
                worst, worst_by = fig, by
            for i, c in enumerate(members):
                if i not in done and c.p.poll() is not None:
                    done[i] = c
        watch.stop.set()
        results = []
        for i, c in enumerate(members):
            r = c.expect("DONE")
            rc = c.finish()
            if rc != 0:
                fail("member %d exited with status %s: %s" % (i, rc, open(errs[i]).read()[-300:]))
            results.append(json.loads(r))
        watch.join(timeout=60)
    except Outcome as o:
        if o.status == "FAIL":
            tails = ["member %d: %s" % (i, open(e).read().strip()[-200:]) for i, e in enumerate(errs)]
            raise Outcome("FAIL", "%s (%s)" % (o.message, "; ".join(t for t in tails if not t.endswith(": "))))
        raise
    finally:
        if watch is not None:
            watch.stop.set()
        for c in members:
            c.kill()
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            for e in errs:
                if os.path.exists(e):
                    shutil.copy(e, a.keep)
        shutil.rmtree(pdir, ignore_errors=True)
    churn = results[:CHURNERS]
    made = results[CHURNERS]
    cycles = sum(r["cycles"] for r in churn)
    refused = sum(r["refusals"] for r in churn)
    info("%d samples of the driver's figure, highest %s (%s) of the %s cap; gpucap status read %d times, "
         "highest used %s" % (samples, mib(worst), {p: mib(v) for p, v in (worst_by or {}).items()}, mib(cap),
                              watch.reads, mib(watch.max_used)))
    info("churners: %d cycles, %d allocations, %d refused; contexts: %d made and destroyed, %d refused"
         % (cycles, sum(r["allocs"] for r in churn), refused, made["rounds"], made["refusals"]))
    info("samples over the cap: %d, of which right after another over it: %d" % (over, confirmed))
    info("the context maker's charge as gpucap status saw it: %s"
         % ", ".join("%s x%d" % (mib(k), v) for k, v in sorted(watch.maker_charges.items())))
    print("FIGURE pool_contexts_rounds %d" % made["rounds"], flush=True)
    print("FIGURE pool_contexts_max_driver_bytes %d" % worst, flush=True)
    print("FIGURE pool_contexts_cap_bytes %d" % cap, flush=True)
    short = sorted(k for k in watch.maker_charges if 0 < k < ctx - tolerance)
    live_reads = reads_while_a_context_lived(watch.maker_reads, made["lived"])
    zero = [r for r in live_reads if r[2] == 0]
    info("gpucap status reads made wholly while a context of the maker lived: %d, of which it showed the "
         "maker charged 0: %d" % (len(live_reads), len(zero)))
    print("FIGURE pool_contexts_live_reads %d" % len(live_reads), flush=True)
    wrong = []
    if zero:
        wrong.append("the context maker was charged 0 B while one of its contexts lived (%d of %d status reads "
                     "made wholly while a context lived): a context charged nothing" % (len(zero), len(live_reads)))
    if short:
        wrong.append("the context maker was charged %s while its context lived (seen %d times): short of the %s "
                     "a context takes" % (", ".join(mib(k) for k in short),
                                          sum(watch.maker_charges[k] for k in short), mib(ctx)))
    if confirmed:
        wrong.append("the driver's figure for the pool's members was over the %s cap (tolerance %s) in %d pairs "
                     "of samples in a row, highest %s" % (mib(cap), mib(tolerance), confirmed, mib(worst)))
    if watch.max_used > cap:
        wrong.append("gpucap status showed the pool's used at %s, over its %s cap" % (mib(watch.max_used), mib(cap)))
    if watch.error:
        wrong.append("gpucap status failed while the members ran: %s" % watch.error)
    if wrong:
        fail("%s (%d contexts made, %d samples, %d churn cycles)"
             % ("; ".join(wrong), made["rounds"], samples, cycles))
    if made["rounds"] == 0 or samples < 100 or watch.reads == 0 or not any(watch.maker_charges) or not live_reads:
        fail("nothing to judge: %d contexts made, %d samples, %d status reads (%d with a context, %d made wholly "
             "while a context lived)" % (made["rounds"], samples, watch.reads,
                                         sum(v for k, v in watch.maker_charges.items() if k), len(live_reads)))
    ok("%d contexts made and destroyed (%d refused) while 3 members churned blocks of %s (%d cycles, %d refused) "
       "for %.0f s: the driver's figure for the pool peaked at %s of the %s cap (%d samples, %d lone ones over "
       "it, tolerance %s), gpucap's at %s; the maker's charge with a context %s..%s (a context: %s)"
       % (made["rounds"], made["refusals"], mib(block), cycles, refused, a.seconds, mib(worst), mib(cap), samples,
          over, mib(tolerance), mib(watch.max_used), mib(min(k for k in watch.maker_charges if k)),
          mib(max(watch.maker_charges)), mib(ctx)))


def main(argv):
    if argv[:1] in (["churn"], ["contexts"]):
        return member_main(argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hold-ms", type=float, default=10.0)
    ap.add_argument("--block-mib", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--keep", metavar="DIR", help="copy the members' stderr there")
    a = ap.parse_args(argv)
    try:
        check(a)
    except Outcome as o:
        print("%s: %s" % (o.status, o.message), flush=True)
        return {"OK": 0, "FAIL": 1, "SKIP": 77}[o.status]
    except NvmlError as e:
        print("FAIL: NVML: %s" % e, flush=True)
        return 1
    except Exception as e:  # noqa: BLE001
        print("FAIL: unexpected %s: %s" % (type(e).__name__, e), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
