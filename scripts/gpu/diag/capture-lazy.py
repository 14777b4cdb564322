#!/usr/bin/env python3
"""Diagnostic (the raw driver, then the same under gpucap): a kernel launched first inside a
stream capture, and the driver calls gpucap makes inside a launch hook while a capture is on.

1. When does lazy loading load a library's kernel that is first launched inside a capture:
   at the capture, at the graph's instantiation or at its launch? NVML's figure for this
   process (NVML, not CUDA, so that nothing is asked of the driver during the capture) after
   the library's load, after the captured launch, after the capture's end, after the
   instantiation and after the graph's launch. The library holds a global of GLOBAL_MIB so
   that its load shows. Twice: a kernel within the stack, and one whose threads take 8 KiB
   of local memory (more than the default stack: a launch outside a capture grows the
   stack). gpucap measures a first launch where it is made, the capture too
   (docs/src/counting.md, `cuLaunchKernel`); a driver that loads later would make that
   measurement find nothing. Under gpucap each row adds what a program is shown as used
   (`cuMemGetInfo`, read outside the capture only), and the capture's end must succeed.
2. Which driver calls gpucap makes inside a launch hook are "potentially unsafe" during a
   capture (CU_STREAM_CAPTURE_MODE_GLOBAL, the default): each made inside a fresh capture
   of one launch of a kernel already loaded, with its return code, the capture's status after
   it and `cuStreamEndCapture`'s answer. An unsafe call invalidates the capture (its end
   answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901): gpucap must then make it in relaxed
   mode (`cuThreadExchangeStreamCaptureMode`) or not at all. `cuMemAlloc_v2` and
   `cuCtxSynchronize` are the controls (documented as unsafe).

  python3 scripts/gpu/diag/capture-lazy.py [--global-mib 256]
  target/release/gpucap run --limit 8Gi -- python3 scripts/gpu/diag/capture-lazy.py

On the fake GPU (scripts/fake-gpu.sh python3 ...) part 1 loads at the capture and part 2
finds no call unsafe: the fake does not model the capture's restrictions, which is what
this asks of a real driver.
"""
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nvml_ctypes import Nvml  # noqa: E402
from pool_storm import context, driver  # noqa: E402

MiB = 1 << 20
STACK_SIZE = 0
LOCAL_SIZE_BYTES = 2  # CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
MULTIPROCESSOR_COUNT = 16
HEAD = ".version 7.0\n.target sm_50\n.address_size 64\n"


def library_ptx(global_bytes):
    """A kernel within the stack (`plain`), one whose threads keep 8 KiB of local memory
    (`local8k`), and a global `big` of `global_bytes` that a load takes."""
    return (HEAD + ".visible .global .align 4 .b8 big[%d];\n" % global_bytes
            + ".visible .entry plain(.param .u64 out)\n{\n\t.reg .b64 %rd<3>;\n"
            "\tld.param.u64 %rd1, [out];\n\tcvta.to.global.u64 %rd2, %rd1;\n"
            "\tst.global.u64 [%rd2], 7;\n\tret;\n}\n"
            ".visible .entry local8k(.param .u64 out)\n{\n\t.local .align 16 .b8 depot[8192];\n"
            "\t.reg .b64 %rd<4>;\n\t.reg .b32 %r<3>;\n\tld.param.u64 %rd1, [out];\n"
            "\tcvta.to.global.u64 %rd2, %rd1;\n\tmov.u32 %r1, %tid.x;\n"
            "\tmov.u64 %rd3, depot;\n\tst.local.u32 [%rd3], %r1;\n\tld.local.u32 %r2, [%rd3+4096];\n"
            "\tst.global.u32 [%rd2], %r2;\n\tret;\n}\n").encode()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--global-mib", type=int, default=256)
    a = p.parse_args()
    L = driver()
    context(L)
    nvml = Nvml()
    h = nvml.handle(0)
    under_gpucap = "libgpucap" in os.environ.get("LD_PRELOAD", "")
    print("under gpucap: %s" % ("yes" if under_gpucap else "no"), flush=True)
    c = ctypes.c_void_p

    def shown_used():
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        L.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return total.value - free.value

    def row(what, outside=True):
        used = nvml.process_used(h, os.getpid())
        line = "%-52s driver %s" % (what, "not listed" if used is None else "%9.1f MiB" % (used / MiB))
        if under_gpucap and outside:
            line += ", shown used %9.1f MiB" % (shown_used() / MiB)
        print(line, flush=True)

    out = ctypes.c_uint64()
    if L.cuMemAlloc_v2(ctypes.byref(out), 4096) != 0:
        print("ERROR cuMemAlloc_v2(4 KiB)")
        return 1
    arg = ctypes.c_uint64(out.value)
    params = (c * 1)(ctypes.cast(ctypes.byref(arg), c))
    stream = c()
    if L.cuStreamCreate(ctypes.byref(stream), 1) != 0:
        print("ERROR cuStreamCreate")
        return 1

    def launch(f, s):
        return L.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, None)

    def end_capture():
        g = c()
        rc = L.cuStreamEndCapture(stream, ctypes.byref(g))
        return rc, g

    # ---- 1. when a kernel launched first in a capture is loaded
    stack = ctypes.c_size_t()
    L.cuCtxGetLimit(ctypes.byref(stack), STACK_SIZE)
    print("the stack: %d bytes a thread" % stack.value, flush=True)
    for name in (b"plain", b"local8k"):
        print("-- %s, first launched inside a capture" % name.decode(), flush=True)
        lib, k = c(), c()
        rc = L.cuLibraryLoadData(ctypes.byref(lib), library_ptx(a.global_mib * MiB), None, None, 0, None, None, 0)
        if rc != 0 or L.cuLibraryGetKernel(ctypes.byref(k), lib, name) != 0:
            print("ERROR cuLibraryLoadData / cuLibraryGetKernel -> %d" % rc, flush=True)
            return 1
        row("the library loaded (%d MiB global)" % a.global_mib)
        rc = L.cuStreamBeginCapture_v2(stream, 0)
        rc_launch = launch(k, stream)
        row("captured launch -> %d (begin %d)" % (rc_launch, rc), outside=False)
        rc, g = end_capture()
        row("the capture ended -> %d" % rc)
        x = c()
        rc = L.cuGraphInstantiateWithFlags(ctypes.byref(x), g, ctypes.c_ulonglong(0)) if g.value else -1
        row("instantiated -> %d" % rc)
        if rc == 0:
            rc = L.cuGraphLaunch(x, stream)
            L.cuStreamSynchronize(stream)
            row("the graph launched -> %d" % rc)
            L.cuCtxGetLimit(ctypes.byref(stack), STACK_SIZE)
            print("the stack now: %d bytes a thread" % stack.value, flush=True)
            L.cuGraphExecDestroy(x)
        if g.value:
            L.cuGraphDestroy(g)
        rc = launch(k, None)
        L.cuCtxSynchronize()
        row("launched outside a capture -> %d" % rc)
        L.cuLibraryUnload(lib)
        L.cuCtxSetLimit(STACK_SIZE, ctypes.c_size_t(1024))
        row("unloaded, the stack set back to 1 KiB")

    # ---- 2. gpucap's own calls inside a capture
    lib, k = c(), c()
    L.cuLibraryLoadData(ctypes.byref(lib), library_ptx(4096), None, None, 0, None, None, 0)
    L.cuLibraryGetKernel(ctypes.byref(k), lib, b"plain")
    f = c()
    L.cuKernelGetFunction(ctypes.byref(f), k)
    launch(k, None)
    L.cuCtxSynchronize()
    i, sz, u, p = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_uint(), c()
    calls = [
        ("cuCtxGetCurrent", lambda: L.cuCtxGetCurrent(ctypes.byref(p))),
        ("cuCtxGetDevice", lambda: L.cuCtxGetDevice(ctypes.byref(i))),
        ("cuCtxGetLimit(STACK_SIZE)", lambda: L.cuCtxGetLimit(ctypes.byref(sz), STACK_SIZE)),
        ("cuFuncGetAttribute(LOCAL_SIZE_BYTES)", lambda: L.cuFuncGetAttribute(ctypes.byref(i), LOCAL_SIZE_BYTES, f)),
        ("cuKernelGetAttribute(LOCAL_SIZE_BYTES)",
         lambda: L.cuKernelGetAttribute(ctypes.byref(i), LOCAL_SIZE_BYTES, k, 0)),
        ("cuKernelGetLibrary", lambda: L.cuKernelGetLibrary(ctypes.byref(p), k)),
        ("cuFuncGetModule", lambda: L.cuFuncGetModule(ctypes.byref(p), f)),
        ("cuModuleGetLoadingMode", lambda: L.cuModuleGetLoadingMode(ctypes.byref(i))),
        ("cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
         lambda: L.cuDeviceGetAttribute(ctypes.byref(i), MULTIPROCESSOR_COUNT, 0)),
        ("cuStreamIsCapturing", lambda: L.cuStreamIsCapturing(stream, ctypes.byref(i))),
        ("cuDevicePrimaryCtxGetState", lambda: L.cuDevicePrimaryCtxGetState(0, ctypes.byref(u), ctypes.byref(i))),
        ("cuMemGetInfo_v2", lambda: L.cuMemGetInfo_v2(ctypes.byref(sz), ctypes.byref(ctypes.c_size_t()))),
        ("cuDeviceGetGraphMemAttribute(RESERVED_MEM_CURRENT)",
         lambda: L.cuDeviceGetGraphMemAttribute(0, 2, ctypes.byref(ctypes.c_uint64()))),
        ("cuMemAlloc_v2 (control)", lambda: L.cuMemAlloc_v2(ctypes.byref(ctypes.c_uint64()), 1 << 20)),
        ("cuCtxSynchronize (control)", lambda: L.cuCtxSynchronize()),
    ]
    print("-- each call inside a capture (mode GLOBAL) of one launch: its answer, the capture's status "
          "after it (1 active, 2 invalidated), cuStreamEndCapture's answer", flush=True)
    for what, call in calls:
        rc_begin = L.cuStreamBeginCapture_v2(stream, 0)
        rc_launch = launch(k, stream)
        rc = call()
        status = ctypes.c_int(-1)
        L.cuStreamIsCapturing(stream, ctypes.byref(status))
        rc_end, g = end_capture()
        if g.value:
            L.cuGraphDestroy(g)
        verdict = "safe" if (rc_end == 0 and status.value == 1) else "UNSAFE"
        print("%-52s -> %4d   status %d   end %4d   %s%s" % (
            what, rc, status.value, rc_end, verdict,
            "" if (rc_begin, rc_launch) == (0, 0) else "   (begin %d, launch %d)" % (rc_begin, rc_launch)),
            flush=True)
    L.cuLibraryUnload(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
