#!/usr/bin/env python3
"""CUDA graph memory and vLLM-style sizing under the cap, on whatever driver is there (the
fake GPU in CI, a real one on a GPU), through ctypes; run under `gpucap run --limit CAP`.
The driver's own figure for this process (NVML's per-process used memory) must never pass
the cap; gpucap's charge is the cap less cuMemGetInfo's free.

  graphs.py graphs --cap N   a graph with memory nodes made by stream capture
                             (cuMemAllocAsync + cuMemFreeAsync of 0.4 x the room on a
                             capturing stream): gpucap's charge, the graph memory attributes
                             (cuDeviceGetGraphMemAttribute USED/RESERVED_MEM_CURRENT) and
                             NVML after the capture, the instantiation, the upload, the first
                             launch and the second; says WHEN the driver reserved the graph's
                             memory (gpucap's hooks settle at each of the three: src/shim/
                             hooks/graphs.rs). gpucap's charge must cover what the driver
                             reserved (2 MiB of slack) at every stage; a second graph of
                             0.8 x the room is refused (at instantiation, or by the driver
                             at its upload or launch, never past the cap); after
                             cuGraphExecDestroy and cuDeviceGraphMemTrim the room is back.
  graphs.py vllm --cap N     vLLM's rule: the total from cuMemGetInfo and from NVML (they
                             must agree: a server reads either), a cache of 0.9 x total less
                             what is in use already, filled (64 MiB blocks), then a CUDA
                             graph (a memory node of 0.05 x total, instantiated, uploaded,
                             launched twice): no out-of-memory anywhere, the driver's figure
                             within the cap.
  graphs.py torch-graph --cap N   torch.cuda.graph capture and replay (a small MLP, 100
                             replays): mem_get_info shows the cap, replays agree with eager,
                             the driver's figure within the cap. SKIP without PyTorch.
Each ends by filling the GPU with blocks until one is refused. Prints INFO and FIGURE
lines and OK:/FAIL:/SKIP: (exit 0/1/77).
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_ctypes import Driver, Witness, fill, room_of, u64, sz, c_int, vp, OOM  # noqa: E402
from nvml_ctypes import Nvml  # noqa: E402
from verdicts import MiB, concluded, fail, figure, info, mib, ok, skip  # noqa: E402

USED_MEM_CURRENT, RESERVED_MEM_CURRENT = 0, 2
SLACK = 2 * MiB


class Graphs:
    """The capture and graph calls on top of escapes.Driver."""

    def __init__(self, drv):
        self.drv = drv
        L = drv.L
        for f in ("cuStreamCreate", "cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuMemAllocAsync",
                  "cuMemFreeAsync", "cuGraphInstantiateWithFlags", "cuGraphUpload", "cuGraphLaunch",
                  "cuStreamSynchronize", "cuGraphExecDestroy", "cuGraphDestroy", "cuDeviceGraphMemTrim",
                  "cuDeviceGetGraphMemAttribute"):
            getattr(L, f).restype = c_int
        L.cuMemAllocAsync.argtypes = [ctypes.POINTER(u64), sz, vp]
        L.cuMemFreeAsync.argtypes = [u64, vp]
        L.cuStreamBeginCapture_v2.argtypes = [vp, c_int]
        L.cuStreamEndCapture.argtypes = [vp, ctypes.POINTER(vp)]
        L.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_ulonglong]
        L.cuGraphUpload.argtypes = [vp, vp]
        L.cuGraphLaunch.argtypes = [vp, vp]
        L.cuStreamSynchronize.argtypes = [vp]
        L.cuGraphExecDestroy.argtypes = [vp]
        L.cuGraphDestroy.argtypes = [vp]
        L.cuDeviceGraphMemTrim.argtypes = [c_int]
        L.cuDeviceGetGraphMemAttribute.argtypes = [c_int, c_int, ctypes.POINTER(ctypes.c_uint64)]
        drv.use(0)
        self.stream = vp()
        drv.must("cuStreamCreate", ctypes.byref(self.stream), 1)

    def captured(self, size):
        """A graph that allocates and frees `size` bytes (stream capture)."""
        d = self.drv
        d.must("cuStreamBeginCapture_v2", self.stream, 0)
        p = u64()
        d.must("cuMemAllocAsync", ctypes.byref(p), size, self.stream)
        d.must("cuMemFreeAsync", p, self.stream)
        g = vp()
        d.must("cuStreamEndCapture", self.stream, ctypes.byref(g))
        return g

    def attr(self, which):
        v = ctypes.c_uint64()
        self.drv.must("cuDeviceGetGraphMemAttribute", 0, which, ctypes.byref(v))
        return v.value

    def call(self, name, *args):
        """The call's status (0, OOM or an error: FAIL)."""
        rc = getattr(self.drv.L, name)(*args)
        if rc not in (0, OOM):
            fail("%s -> %d" % (name, rc))
        return rc


def charge(drv, cap):
    return cap - drv.mem_info(0)[0]


def graphs(drv, w, cap):
    room = room_of(drv, 0, cap)
    gr = Graphs(drv)
    size = int(room * 0.4) // (2 * MiB) * (2 * MiB)
    base = charge(drv, cap)
    g = gr.captured(size)
    ex = vp()
    stages, reserved_at = [], None

    def stage(name):
        nonlocal reserved_at
        c, res, used = charge(drv, cap) - base, gr.attr(RESERVED_MEM_CURRENT), gr.attr(USED_MEM_CURRENT)
        nv = w.look(0, "after %s" % name)
        stages.append("%s: charged %s, reserved %s, used %s, NVML %s" % (name, mib(c), mib(res), mib(used), mib(nv)))
        info(stages[-1])
        if res > 0 and reserved_at is None:
            reserved_at = name
        if c + SLACK < res:
            fail("after %s the driver reserved %s of graph memory, gpucap charged %s for it" % (name, mib(res), mib(c)))

    stage("capture")
    if gr.call("cuGraphInstantiateWithFlags", ctypes.byref(ex), g, 0) != 0:
        fail("cuGraphInstantiateWithFlags of a graph of %s refused with %s free under the cap" % (mib(size), mib(room)))
    stage("instantiate")
    drv.must("cuGraphUpload", ex, gr.stream)
    drv.must("cuStreamSynchronize", gr.stream)
    stage("upload")
    for n in ("first launch", "second launch"):
        drv.must("cuGraphLaunch", ex, gr.stream)
        drv.must("cuStreamSynchronize", gr.stream)
        stage(n)
    figure("graphs_reserved_at", (reserved_at or "never").replace(" ", "-"))
    # a second graph of 0.8 x the room does not fit beside the first
    big = int(room * 0.8) // (2 * MiB) * (2 * MiB)
    g2, ex2 = gr.captured(big), vp()
    refused_at = None
    if gr.call("cuGraphInstantiateWithFlags", ctypes.byref(ex2), g2, 0) == OOM:
        refused_at = "instantiate"
    else:
        for name, fn in (("upload", "cuGraphUpload"), ("launch", "cuGraphLaunch")):
            if gr.call(fn, ex2, gr.stream) == OOM:
                refused_at = name
                break
        drv.L.cuStreamSynchronize(gr.stream)
        w.look(0, "the second graph (%s), %s" % (mib(big), "refused at " + refused_at if refused_at else "run"))
        drv.must("cuGraphExecDestroy", ex2)
    if refused_at is None:
        fail("a second graph of %s was instantiated, uploaded and launched beside one of %s under the %s cap"
             % (mib(big), mib(size), mib(cap)))
    drv.must("cuGraphDestroy", g2)
    drv.must("cuGraphExecDestroy", ex)
    drv.must("cuGraphDestroy", g)
    drv.must("cuDeviceGraphMemTrim", 0)
    left = charge(drv, cap) - base
    w.look(0, "after cuGraphExecDestroy and cuDeviceGraphMemTrim")
    if left > SLACK:
        fail("after cuGraphExecDestroy and cuDeviceGraphMemTrim gpucap still charges %s for the graphs" % mib(left))
    used = fill(drv, w, 0, cap, "after the graphs")
    return ("a captured graph of %s: the driver reserved its memory at %s (gpucap charged it at every stage: %s); "
            "a second of %s refused at %s; given back after trim; the driver's figure peaked at %s of the %s cap"
            % (mib(size), reserved_at or "no stage", "; ".join(stages), mib(big), refused_at, mib(max(w.peak, used)),
               mib(cap)))


def vllm(drv, w, cap):
    free, total = drv.mem_info(0)
    nvml = Nvml()
    nv_total = nvml.memory(nvml.handle(drv.uuid(0)))[0]
    info("cuMemGetInfo: total %s, free %s; NVML: total %s" % (mib(total), mib(free), mib(nv_total)))
    if nv_total != total:
        fail("cuMemGetInfo's total %s and NVML's %s differ: a server sizing from either gets another cache"
             % (mib(total), mib(nv_total)))
    cache = int(0.9 * total) - (total - free)
    if cache <= 0:
        fail("0.9 of the %s total is less than the %s in use already" % (mib(total), mib(total - free)))
    blocks, left, block = [], cache, 64 * MiB
    while left > 0:
        n = min(block, left)
        rc, p = drv.alloc(n)
        if rc != 0:
            fail("the cache (0.9 x %s less %s in use = %s): cuMemAlloc_v2(%s) after %s -> %d"
                 % (mib(total), mib(total - free), mib(cache), mib(n), mib(cache - left), rc))
        blocks.append(p)
        left -= n
    w.look(0, "the cache of %s filled (%d blocks)" % (mib(cache), len(blocks)))
    gr = Graphs(drv)
    act = int(0.05 * total) // (2 * MiB) * (2 * MiB)
    g, ex = gr.captured(act), vp()
    for what, rc in (("instantiate", gr.call("cuGraphInstantiateWithFlags", ctypes.byref(ex), g, 0)),):
        if rc != 0:
            fail("with the cache filled, %s of a graph of %s -> out of memory" % (what, mib(act)))
    for name, fn in (("upload", "cuGraphUpload"), ("launch", "cuGraphLaunch"), ("relaunch", "cuGraphLaunch")):
        if gr.call(fn, ex, gr.stream) != 0:
            fail("with the cache filled, the graph's %s -> out of memory" % name)
        drv.must("cuStreamSynchronize", gr.stream)
    used = w.look(0, "the cache and the graph (%s) launched" % mib(act))
    drv.must("cuGraphExecDestroy", ex)
    drv.must("cuGraphDestroy", g)
    for p in blocks:
        drv.must("cuMemFree_v2", u64(p))
    drv.must("cuDeviceGraphMemTrim", 0)
    figure("vllm_cache_bytes", cache)
    peak = max(w.peak, fill(drv, w, 0, cap, "after the cache"))
    return ("cuMemGetInfo and NVML both gave a total of %s; a cache of 0.9 x that less %s in use (%s) filled and a "
            "graph of %s instantiated, uploaded and launched twice with no out-of-memory; the driver's figure %s with "
            "both, peaked at %s of the %s cap" % (mib(total), mib(total - free), mib(cache), mib(act), mib(used),
                                                   mib(peak), mib(cap)))


def torch_graph(cap):
    try:
        import torch
    except ImportError as e:
        skip("PyTorch not importable (%s)" % e)
    free, total = torch.cuda.mem_get_info()
    if total != cap:
        fail("torch.cuda.mem_get_info total %s, not the %s cap" % (mib(total), mib(cap)))
    nvml = Nvml()
    h = nvml.handle(os.environ.get("CUDA_VISIBLE_DEVICES") or 0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    x = torch.randn(256, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        y = model(x)
    for _ in range(100):
        g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = model(x)
    if not torch.allclose(y, eager, rtol=1e-3, atol=1e-3):
        fail("the graph's replay differs from the eager result")
    used = nvml.process_used(h, os.getpid())
    free2, _ = torch.cuda.mem_get_info()
    info("torch.cuda.graph: reserved %s; gpucap charges %s; NVML %s"
         % (mib(torch.cuda.memory_reserved()), mib(cap - free2), mib(used)))
    if used is not None and used > cap:
        fail("NVML counts %s for this process, past the %s cap" % (mib(used), mib(cap)))
    return ("torch.cuda.graph captured and replayed 100 times (as eager); gpucap charges %s, the driver counts %s of "
            "the %s cap" % (mib(cap - free2), mib(used), mib(cap)))


def main(argv):
    if len(argv) != 3 or argv[1] != "--cap" or argv[0] not in ("graphs", "vllm", "torch-graph"):
        print("usage: graphs.py graphs|vllm|torch-graph --cap BYTES", file=sys.stderr)
        return 2
    cap = int(argv[2])

    def run():
        if argv[0] == "torch-graph":
            ok(torch_graph(cap))
        drv = Driver()
        ok({"graphs": graphs, "vllm": vllm}[argv[0]](drv, Witness(drv, cap), cap))

    return concluded(run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
