#!/usr/bin/env python3
"""The nccl check of scripts/gpu-check.sh: NCCL under the cap, on one GPU.

With --client torch (PyTorch with NCCL, on a GPU): torch.distributed with the NCCL
backend (init over tcp://127.0.0.1, a 60 s timeout on every collective):
  alone   one process, world size 1, under `gpucap run --limit CAP`: an all_reduce of a
          tensor of 0.4 x the room under the cap, then a tensor of the whole room refused
          (OutOfMemoryError, no hang), then an all_reduce again; NCCL's buffers (it
          allocates them with cuMemCreate and maps them) must be in gpucap's charge: the
          driver's figure for the process (NVML) at most gpucap's charge + TOLERANCE, and
          within the cap.
  pair    two processes, world size 2, both on the one GPU: NCCL refuses two ranks on one
          device ("Duplicate GPU detected", ncclInvalidUsage, since NCCL 2.5; no setting
          allows it: NVIDIA/nccl issue 418). Recorded: refused as NCCL says, or ran; a hang
          (no answer within the timeout) FAILs.
  pool    two processes of world size 1 each (their own communicators) in one gpucap pool
          of 2 x CAP, at once: each as `alone`; the driver's figure for both within the
          pool's cap, and `gpucap status --pool` against NVML's sum.
With --client driver (no NCCL: the fake GPU in CI), the members stand in for NCCL with
what it does to memory: 8 buffers of 4 MiB made with cuMemCreate, reserved, mapped and
set accessible, the "tensor" with cuMemAlloc_v2; `pair` is left out. Prints INFO lines
and OK:/FAIL:/SKIP: (exit 0/1/77).

  nccl_check.py --cli GPUCAP --cap BYTES --client torch|driver [--timeout S]
  nccl_check.py member --client C --cap BYTES --world W --rank R --port P   (under gpucap)
"""

import argparse
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nvml_ctypes import Nvml  # noqa: E402
from child import Child  # noqa: E402
from verdicts import MiB, Outcome, concluded, fail, info, mib, ok  # noqa: E402

TOLERANCE = 64 * MiB  # the driver's own per-process bookkeeping (JAX's gap was 30 MiB)
SHARE = 0.4


# ---- the members (run under gpucap run) ------------------------------------------------

def member_torch(a):
    import datetime
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    free, total = torch.cuda.mem_get_info()
    if total != a.cap:
        fail("torch.cuda.mem_get_info total %s, not the %s cap" % (mib(total), mib(a.cap)))
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % a.port, world_size=a.world, rank=a.rank,
                            timeout=datetime.timedelta(seconds=60))
    n = int(free * SHARE) // 4
    t = torch.ones(n, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if float(t[0]) != a.world or float(t[-1]) != a.world:
        fail("all_reduce of %d ones over %d ranks gave %s" % (n, a.world, float(t[0])))
    refused = False
    try:
        torch.empty(free, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        refused = True
    dist.all_reduce(t)
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info()
    out = dict(tensor=n * 4, refused=refused, charge=a.cap - free2, reserved=torch.cuda.memory_reserved())
    return out, dist.destroy_process_group  # the communicator lives until NVML was read


def member_driver(a):
    from cuda_ctypes import AccessDesc, AllocProp, Driver, Location, u64
    drv = Driver()
    free, total = drv.mem_info(0)
    if total != a.cap:
        fail("cuMemGetInfo total %s, not the %s cap" % (mib(total), mib(a.cap)))
    prop = AllocProp(type=1, handle_types=0, location=Location(1, 0))
    access = AccessDesc(location=Location(1, 0), flags=3)
    for i in range(8):  # NCCL's buffers: ncclCuMemAlloc
        h, va = u64(), u64()
        drv.must("cuMemCreate", ctypes.byref(h), 4 * MiB, ctypes.byref(prop), 0)
        drv.must("cuMemAddressReserve", ctypes.byref(va), 4 * MiB, 0, u64(0), 0)
        drv.must("cuMemMap", va, 4 * MiB, 0, h, 0)
        drv.must("cuMemSetAccess", va, 4 * MiB, ctypes.byref(access), 1)
    n = int(free * SHARE) // (2 * MiB) * (2 * MiB)
    rc, p = drv.alloc(n)
    if rc != 0:
        fail("the tensor of %s -> %d" % (mib(n), rc))
    rc, _ = drv.alloc(free)
    free2, _ = drv.mem_info(0)
    return dict(tensor=n, refused=rc == 2, charge=a.cap - free2, reserved=n), lambda: None


def member(argv):
    ap = argparse.ArgumentParser(prog="nccl_check.py member")
    for k in ("--cap", "--world", "--rank", "--port"):
        ap.add_argument(k, type=int, required=True)
    ap.add_argument("--client", required=True)
    a = ap.parse_args(argv)
    try:
        out, close = member_torch(a) if a.client == "torch" else member_driver(a)
        print("HOLD %s" % json.dumps(out), flush=True)
        sys.stdin.readline()  # held until the coordinator has read NVML
        close()
    except Outcome as o:
        print("ERROR %s" % o.message, flush=True)
        return 1
    except Exception as e:  # noqa: BLE001
        print("ERROR %s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1][:400] if str(e) else ""),
              flush=True)
        return 1
    print("DONE", flush=True)
    return 0


# ---- the check ---------------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_members(a, n, world, cap, pool, env):
    """n members at once; ({pid: HOLD dict or 'ERROR ...'}, {pid: NVML bytes}, pool's used)."""
    pre = [a.cli, "run", "--limit", str(cap)] + (["--pool", pool] if pool else []) + ["--"]
    port = free_port()
    kids = [Child(pre + [sys.executable, os.path.abspath(__file__), "member", "--client", a.client, "--cap",
                         str(cap), "--world", str(world), "--rank", str(r if world > 1 else 0), "--port",
                         str(port if world > 1 else free_port())], a.timeout, env=env) for r in range(n)]
    got, nv, pool_used = {}, {}, None
    nvml = Nvml()
    h = nvml.handle(os.environ.get("CUDA_VISIBLE_DEVICES") or 0)
    try:
        for c in kids:
            got[c.p.pid] = expect_any(c)
        procs = nvml.processes(h)
        nv = {c.p.pid: procs.get(c.p.pid) for c in kids}
        if pool:
            o = subprocess.run([a.cli, "status", "--pool", pool, "--json"], env=env, capture_output=True, text=True,
                               timeout=60)
            if o.returncode == 0:
                pool_used = sum(g["used"] for g in json.loads(o.stdout)["gpus"])
        for c in kids:
            c.send("done")
            c.finish()
    finally:
        for c in kids:
            c.kill()
    return got, nv, pool_used


def expect_any(c):
    """The member's HOLD json (a dict) or its ERROR text (a str: no answer in time is a hang)."""
    deadline = time.monotonic() + c.timeout
    while True:
        line = c.readline(deadline)
        if line is None:
            c.kill()
            return "ERROR no answer within %d s (a hang)" % c.timeout
        if line == "":
            return "ERROR exited (status %s) without an answer" % c.p.wait()
        line = line.rstrip("\n")
        if line.startswith("HOLD "):
            return json.loads(line[5:])
        if line.startswith("ERROR "):
            return line
        print("  child| " + line, flush=True)


def judge(what, got, nv, cap):
    said = []
    for pid, r in got.items():
        if isinstance(r, str):
            fail("%s: member %d: %s" % (what, pid, r))
        used = nv.get(pid)
        if not r["refused"]:
            fail("%s: member %d: a tensor of the whole room was not refused beside its NCCL communicator" % (what, pid))
        if used is not None:
            if used > cap:
                fail("%s: the driver counts %s for member %d, past the %s cap" % (what, mib(used), pid, mib(cap)))
            if used > r["charge"] + TOLERANCE:
                fail("%s: the driver counts %s for member %d, gpucap charged %s: %s not charged (NCCL's buffers?)"
                     % (what, mib(used), pid, mib(r["charge"]), mib(used - r["charge"])))
        said.append("tensor %s, gpucap %s, NVML %s" % (mib(r["tensor"]), mib(r["charge"]), mib(used)))
    return "; ".join(said)


def check(a):
    tmp = tempfile.mkdtemp(prefix="gpucap-nccl.")
    env = dict(os.environ, GPUCAP_POOL_DIR=tmp)
    env.pop("LD_PRELOAD", None)
    try:
        got, nv, _ = run_members(a, 1, 1, a.cap, None, env)
        alone = judge("alone", got, nv, a.cap)
        info("alone: %s" % alone)
        pair = "left out (no NCCL here)"
        if a.client == "torch":
            got, nv, _ = run_members(a, 2, 2, a.cap, None, env)
            errs = [r for r in got.values() if isinstance(r, str)]
            if errs and all("Duplicate GPU" in e or "invalid usage" in e for e in errs):
                pair = "refused by NCCL (%s)" % errs[0][6:120]
            elif errs:
                fail("pair: %s" % "; ".join(errs))
            else:
                pair = "ran: " + judge("pair", got, nv, a.cap)
            info("two ranks on one GPU: %s" % pair)
        pool_cap = 2 * a.cap
        got, nv, pool_used = run_members(a, 2, 1, pool_cap, "nccl%d" % os.getpid(), env)
        pooled = judge("pool", got, nv, pool_cap)
        total = sum(v or 0 for v in nv.values())
        if total > pool_cap:
            fail("pool: the driver counts %s for the two members, past the pool's %s cap" % (mib(total), mib(pool_cap)))
        if pool_used is None:
            fail("pool: gpucap status --pool showed nothing while the members held their memory")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ok("NCCL (%s) world size 1: %s; two ranks on one GPU: %s; two members of a %s pool: %s, the pool %s, NVML's sum %s"
       % (a.client, alone, pair, mib(pool_cap), pooled, mib(pool_used), mib(total)))


def main(argv):
    if argv[:1] == ["member"]:
        return member(argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cap", type=int, required=True)
    ap.add_argument("--client", choices=("torch", "driver"), required=True)
    ap.add_argument("--timeout", type=int, default=120)
    a = ap.parse_args(argv)
    return concluded(lambda: check(a))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
