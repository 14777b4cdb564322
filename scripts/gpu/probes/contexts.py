"""probe.py ctx-overhead and ctx-child: what the first CUDA context takes of the GPU, raw and
under gpucap (the free memory an uncapped observer sees before and after a child makes it),
and what the capped child is shown right after.
"""

import os
import statistics
import sys

from child import Child
from observer import Cuda
from verdicts import fail, figure, info, mib, ok, parse_kv

# The probe itself (`probe.py ctx-child`): the context child when no drvbench is given.
PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probe.py")


def cmd_ctx_overhead(a):
    cap = a.cap
    cuda = Cuda()
    results = {"raw": [], "gpucap": []}
    views = []
    child_cmd = [a.bin, "ctx"] if a.bin else [sys.executable, PROBE, "ctx-child"]
    info("context child: " + " ".join(child_cmd))
    for i in range(a.runs):
        for mode in ("raw", "gpucap"):
            cmd = list(child_cmd)
            if mode == "gpucap":
                cmd = [a.cli, "run", "--limit", str(cap), "--"] + cmd
            before = cuda.settled_free()
            child = Child(cmd, timeout=a.timeout)
            view = parse_kv(child.expect("READY"))
            after = cuda.settled_free()
            child.send("done")
            rc = child.finish()
            if rc not in (0, None):
                fail("%s context child exited with status %s" % (mode, rc))
            results[mode].append(before - after)
            info("run %d, %s: free %s -> %s: the first context took %s; the child saw free %s of %s"
                 % (i + 1, mode, mib(before), mib(after), mib(before - after),
                    mib(int(view.get("free", 0))), mib(int(view.get("total", 0)))))
            if mode == "gpucap":
                views.append(view)
    for v in views:
        if int(v.get("total", -1)) != cap:
            fail("under gpucap the child's cuMemGetInfo total is %s, not the cap %d" % (v.get("total"), cap))
        if int(v.get("free", -1)) > cap:
            fail("under gpucap the child's cuMemGetInfo free %s is more than the cap" % v.get("free"))
    raw = statistics.median(results["raw"])
    shim = statistics.median(results["gpucap"])
    figure("ctx_overhead_raw_bytes", int(raw))
    figure("ctx_overhead_gpucap_bytes", int(shim))
    figure("ctx_overhead_runs", a.runs)
    free_view = min(int(v["free"]) for v in views) if views else 0
    figure("ctx_charged_bytes", cap - free_view)
    ok("the first context takes %s of device memory (median of %d runs; %s under gpucap); the capped child "
       "sees free %s of the %s cap right after it (%s charged before any allocation)"
       % (mib(raw), a.runs, mib(shim), mib(free_view), mib(cap), mib(cap - free_view)))


def cmd_ctx_child(a):
    """drvbench ctx in Python (when nvcc is missing): the first context, then wait."""
    cuda = Cuda()
    free, total = cuda.mem_info()
    print("READY free=%d total=%d" % (free, total), flush=True)
    sys.stdin.readline()
    ok("context child done")
