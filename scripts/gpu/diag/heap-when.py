#!/usr/bin/env python3
"""Diagnostic (raw driver, no gpucap): when does the driver take a raised malloc heap?

`cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)` took nothing at the call on driver 580
(docs/src/counting.md, `cuCtxSetLimit`: "taken at a later launch: not counted"). This
records which launch takes it: NVML's figure for this process after the context, after the
heap is raised to HEAP, after a launch of a kernel that does not call `malloc`, and after
a launch of one that does (PTX JIT-compiled by the driver), then after the heap is set back.
The answer decides how gpucap measures it (see the twenty-third session's note). With
--graph the kernel that calls `malloc` runs first from a CUDA graph (its launch captured
on a stream, the graph instantiated, then launched), then launched directly: whether the
heap is taken at a graph's launch (gpucap measures both a kernel's and a graph's next launch
after the heap is raised; the fake takes it at the next one under FAKECUDA_HEAP_AT_LAUNCH=1).

  python3 scripts/gpu/diag/heap-when.py [--heap-mib 1024] [--graph]

On the fake GPU (LD_LIBRARY_PATH=target/release/fakecuda) the heap takes nothing anywhere,
unless FAKECUDA_HEAP_AT_LAUNCH=1.
"""
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nvml_ctypes import Nvml  # noqa: E402
from pool_storm import alloc, context, driver  # noqa: E402

MiB = 1 << 20
MALLOC_HEAP_SIZE = 2
HEAD = ".version 7.0\n.target sm_50\n.address_size 64\n"
PLAIN = HEAD + (".visible .entry plain(.param .u64 out)\n{\n\t.reg .b64 %rd<3>;\n"
                "\tld.param.u64 %rd1, [out];\n\tcvta.to.global.u64 %rd2, %rd1;\n"
                "\tst.global.u64 [%rd2], 7;\n\tret;\n}\n")
MALLOC = HEAD + (".extern .func (.param .b64 func_retval0) malloc\n(\n\t.param .b64 malloc_param_0\n);\n"
                 ".visible .entry grab(.param .u64 out)\n{\n\t.reg .b64 %rd<4>;\n"
                 "\tld.param.u64 %rd1, [out];\n\tcvta.to.global.u64 %rd2, %rd1;\n"
                 "\t{\n\t.param .b64 param0;\n\tst.param.b64 [param0+0], 1024;\n"
                 "\t.param .b64 retval0;\n\tcall.uni (retval0), malloc, (param0);\n"
                 "\tld.param.b64 %rd3, [retval0+0];\n\t}\n"
                 "\tst.global.u64 [%rd2], %rd3;\n\tret;\n}\n")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heap-mib", type=int, default=1024)
    p.add_argument("--graph", action="store_true", help="run the malloc kernel first from a CUDA graph")
    a = p.parse_args()
    L = driver()
    context(L)
    nvml = Nvml()
    h = nvml.handle(0)

    def row(what):
        used = nvml.process_used(h, os.getpid())
        print("%-44s driver %s" % (what, "not listed" if used is None else "%9.1f MiB" % (used / MiB)),
              flush=True)

    rc, out = alloc(L, 4096)
    if rc != 0:
        print("ERROR cuMemAlloc_v2(4 KiB) -> %d" % rc)
        return 1
    arg = ctypes.c_uint64(out)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))

    def steps(name, calls):
        for what, call in calls:
            rc = call()
            if rc != 0:
                print("ERROR %s (%s) -> %d" % (what, name.decode(), rc), flush=True)
                return False
        return True

    def function(ptx, name):
        m, f = ctypes.c_void_p(), ctypes.c_void_p()
        ok = steps(name, (("cuModuleLoadData", lambda: L.cuModuleLoadData(ctypes.byref(m), ptx.encode())),
                          ("cuModuleGetFunction", lambda: L.cuModuleGetFunction(ctypes.byref(f), m, name))))
        return f if ok else None

    def launch(ptx, name):
        f = function(ptx, name)
        if f is not None and steps(name, (
                ("cuLaunchKernel", lambda: L.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, None, params, None)),
                ("cuCtxSynchronize", L.cuCtxSynchronize))):
            row("a launch of %s" % name.decode())

    def from_graph(ptx, name):
        f, s, g, x = function(ptx, name), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        if f is None or not steps(name, (
                ("cuStreamCreate", lambda: L.cuStreamCreate(ctypes.byref(s), 1)),
                ("cuStreamBeginCapture_v2", lambda: L.cuStreamBeginCapture_v2(s, 0)),
                ("cuLaunchKernel (captured)", lambda: L.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, None)),
                ("cuStreamEndCapture", lambda: L.cuStreamEndCapture(s, ctypes.byref(g))))):
            return
        row("its launch captured into a graph")
        if not steps(name, (("cuGraphInstantiateWithFlags",
                             lambda: L.cuGraphInstantiateWithFlags(ctypes.byref(x), g, ctypes.c_ulonglong(0))),)):
            return
        row("the graph instantiated")
        if steps(name, (("cuGraphLaunch", lambda: L.cuGraphLaunch(x, s)),
                        ("cuStreamSynchronize", lambda: L.cuStreamSynchronize(s)))):
            row("the graph of %s launched" % name.decode())

    row("the context and 4 KiB")
    heap = ctypes.c_size_t()
    L.cuCtxGetLimit(ctypes.byref(heap), MALLOC_HEAP_SIZE)
    print("the malloc heap: %d bytes" % heap.value, flush=True)
    rc = L.cuCtxSetLimit(MALLOC_HEAP_SIZE, ctypes.c_size_t(a.heap_mib * MiB))
    row("cuCtxSetLimit(MALLOC_HEAP_SIZE, %d MiB) -> %d" % (a.heap_mib, rc))
    launch(PLAIN, b"plain")
    launch(PLAIN, b"plain")
    if a.graph:
        from_graph(MALLOC, b"grab")
    launch(MALLOC, b"grab")
    rc = L.cuCtxSetLimit(MALLOC_HEAP_SIZE, heap)
    row("the heap set back to %d bytes -> %d" % (heap.value, rc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
