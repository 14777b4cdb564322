#!/usr/bin/env python3
"""The escapes of tests/c/escapes.c, on whatever driver is there (the fake in CI, a real
one on a GPU), through ctypes, sized from what the process can see under its cap (the
CUDA context is charged too, and takes different memory on each GPU). Run under
`gpucap run --limit CAP`; the driver's own figure for this process (NVML's
per-process used memory, nvmlDeviceGetComputeRunningProcesses) must never pass the cap.

  escapes.py vmm-release --cap N     cuMemCreate -> map -> cuMemRelease at once (NVIDIA's
                                     idiom), blocks of 0.4 x the room: the third is
                                     refused, the mappings keep the charge; an unmap
                                     gives one back
  escapes.py pool-cumemfree --cap N  half the room from a created pool, freed with
                                     cuMemFree_v2 and the pool destroyed: 3/4 of the room
                                     is then there
  escapes.py pool-other-gpu --cap N  (2 visible GPUs) GPU 1's default pool with GPU 0's
                                     context current: charged to GPU 1 (0.6 x its room
                                     twice: the second refused). One GPU: SKIP
  escapes.py page-rounding --cap N   the driver takes whole 2 MiB pages for an allocation
                                     above 1 MiB (an H200 took 4 MiB for 3 MiB + 1 byte),
                                     which gpucap charges so (src/core/linear.rs): what the
                                     driver took for one block of each of a few sizes, then
                                     the cap filled with blocks of 2 MiB + 4 KiB (half of
                                     each second page unused), of 1 MiB + 4 KiB, and of
                                     1 MiB (charged as asked: FAILs if the driver gives
                                     each its own page)
  escapes.py module-globals --cap N  a module (cuModuleLoadData, PTX JIT-compiled by the
                                     driver) whose __device__ global takes 0.6 x the room:
                                     charged while loaded (the room drops by at least the
                                     global), a second one refused, cuModuleUnload gives it
                                     back
  escapes.py stack-limit --cap N     cuCtxSetLimit(CU_LIMIT_STACK_SIZE) raised so that the
                                     stack takes over half the room (an H100 took 3.87 GiB
                                     for 16 KiB per thread): charged as the driver took it,
                                     twice that refused, lowering it gives back what the
                                     driver gave back
  escapes.py lazy-kernels --cap N    a library (cuLibraryLoadData) whose __device__ global
                                     takes 0.6 x the room: nothing at the load (lazy
                                     loading); its kernel's first launch loads it into the
                                     context, charged as the driver took it; 0.6 x the room
                                     more refused; cuLibraryUnload gives it back
  escapes.py library-global --cap N  the same library's global asked for (cuLibraryGetGlobal,
                                     as cudart's cudaGetSymbolAddress) before any kernel of it
                                     ran: the library loaded into the context there, charged
                                     as the driver took it
  escapes.py local-stack --cap N     a kernel whose threads take enough local memory
                                     (a .local array it reads and writes) that the stack
                                     the driver grows to it at its launch takes over half
                                     the room: charged as the driver took it, a kernel with
                                     twice that refused (the stack kept), lowering the
                                     stack gives back what the driver gave back
  escapes.py legacy-launch --cap N   the same kernels launched by the deprecated cuLaunchGrid
                                     (the block set by cuFuncSetBlockShape, the parameter
                                     by cuParamSetv)
  escapes.py multi-device --cap N    the same kernels launched by the deprecated
                                     cuLaunchCooperativeKernelMultiDevice (one device, on
                                     a stream of its own; SKIP where the GPU cannot)
  escapes.py capture-lazy --cap N    lazy-kernels with the kernel first put into a graph:
  escapes.py graph-node --cap N      its first launch inside a stream capture (global mode,
                                     as PyTorch captures; the capture ends with its graph:
                                     gpucap's measurement there forbids nothing), or a
                                     kernel node of a graph built by hand (never launched);
                                     by the graph's launch what the driver took is charged,
                                     wherever it took it (the capture or the node's making,
                                     the instantiation, the launch: printed); 0.6 x the room
                                     more refused; the unload gives it back
  escapes.py graph-generic-node --cap N  graph-node with the node made by CUDA 12.2's
                                     generic cuGraphAddNode_v2 (a CUgraphNodeParams of the
                                     kernel type)
  escapes.py green-context --cap N    two green contexts (CUDA 12.4), the first made while the
                                     primary context is inactive (cuGreenCtxCreate retains it,
                                     so makes it): after each, the room dropped by at least
                                     what the driver's figure rose; both destroyed
Each ends by filling the GPU with blocks until one is refused: the driver's figure
then is at most the cap (and, uncapped, far past it: the control). Prints INFO lines and
OK:/FAIL:/SKIP: (exit 0/1/77).
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cuda_ctypes import (  # noqa: E402
    OOM, AccessDesc, AllocProp, Driver, Location, PoolProps, Witness, c_int, fill, room_of, sz, u64, vp)
from verdicts import MiB, Outcome, fail, info, mib, ok, skip  # noqa: E402


def vmm_release(drv, w, cap):
    room = room_of(drv, 0, cap)
    prop = AllocProp(type=1, handle_types=0, location=Location(1, 0))
    gran = sz()
    drv.must("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop), c_int(0))
    g = gran.value
    size = int(room * 0.4) // g * g
    if size < g:
        fail("no room for two VMM blocks under the cap (%s free)" % mib(room))
    access = AccessDesc(location=Location(1, 0), flags=3)
    maps, made = [], 0
    for i in range(8):
        h = u64()
        rc = drv.L.cuMemCreate(ctypes.byref(h), size, ctypes.byref(prop), 0)
        if rc == OOM:
            info("cuMemCreate #%d of %s refused (out of memory)" % (i + 1, mib(size)))
            continue
        if rc != 0:
            fail("cuMemCreate #%d -> %d" % (i + 1, rc))
        made += 1
        va = u64()
        drv.must("cuMemAddressReserve", ctypes.byref(va), size, 0, u64(0), 0)
        drv.must("cuMemMap", va, size, 0, h, 0)
        drv.must("cuMemSetAccess", va, size, ctypes.byref(access), 1)
        drv.must("cuMemRelease", h)  # the idiom: the mapping keeps the memory
        maps.append(va.value)
    w.look(0, "%d mappings of %s, each handle released at once" % (len(maps), mib(size)))
    if made != 2:
        fail("%d of 8 cuMemCreate(%s) succeeded with %s free under the cap; 2 fit" % (made, mib(size), mib(room)))
    drv.must("cuMemUnmap", u64(maps[0]), size)
    drv.must("cuMemAddressFree", u64(maps[0]), size)
    h = u64()
    rc = drv.L.cuMemCreate(ctypes.byref(h), size, ctypes.byref(prop), 0)
    if rc != 0:
        fail("after unmapping a released handle, cuMemCreate(%s) -> %d: the unmap was not credited" % (mib(size), rc))
    drv.must("cuMemRelease", h)
    drv.must("cuMemUnmap", u64(maps[1]), size)
    drv.must("cuMemAddressFree", u64(maps[1]), size)
    used = fill(drv, w, 0, cap, "after the VMM blocks")
    return ("VMM handles released while mapped stayed charged (2 of 8 blocks of %s, granularity %s); "
            "the driver's figure peaked at %s of the %s cap" % (mib(size), mib(g), mib(max(w.peak, used)), mib(cap)))


def pool_cumemfree(drv, w, cap):
    room = room_of(drv, 0, cap)
    props = PoolProps(alloc_type=1, handle_types=0, location=Location(1, 0))
    pool = vp()
    drv.must("cuMemPoolCreate", ctypes.byref(pool), ctypes.byref(props))
    half = room // 2 // (2 * MiB) * (2 * MiB)
    p = u64()
    drv.must("cuMemAllocFromPoolAsync", ctypes.byref(p), half, pool, None)
    drv.must("cuCtxSynchronize")
    w.look(0, "%s from a created pool" % mib(half))
    drv.must("cuMemFree_v2", p)  # legal for stream-ordered memory
    drv.must("cuMemPoolDestroy", pool)
    big = room * 3 // 4 // (2 * MiB) * (2 * MiB)
    rc, q = drv.alloc(big)
    if rc != 0:
        fail("pool memory freed with cuMemFree_v2 and the pool destroyed: cuMemAlloc_v2(%s) -> %d (%s was free)"
             % (mib(big), rc, mib(room)))
    w.look(0, "%s with cuMemAlloc_v2 after the pool went" % mib(big))
    drv.must("cuMemFree_v2", u64(q))
    used = fill(drv, w, 0, cap, "after the pool")
    return ("pool memory freed by cuMemFree_v2 was credited (3/4 of the room, %s, fitted after); the driver's "
            "figure peaked at %s of the %s cap" % (mib(big), mib(max(w.peak, used)), mib(cap)))


def pool_other_gpu(drv, w, cap):
    if drv.count < 2:
        skip("one GPU visible (cuDeviceGetCount = %d): another GPU's pool needs two" % drv.count)
    room1 = room_of(drv, 1, cap)
    room_of(drv, 0, cap)  # GPU 0's context current from here on
    pool = vp()
    drv.must("cuDeviceGetDefaultMemPool", ctypes.byref(pool), c_int(1))
    size = int(room1 * 0.6) // (2 * MiB) * (2 * MiB)
    got = []
    for i in range(2):
        p = u64()
        rc = drv.L.cuMemAllocFromPoolAsync(ctypes.byref(p), size, pool, None)
        drv.L.cuCtxSynchronize()
        if rc == 0:
            got.append(p.value)
        elif rc != OOM:
            fail("cuMemAllocFromPoolAsync #%d from GPU 1's default pool -> %d" % (i + 1, rc))
    w.look(1, "%d block(s) of %s from GPU 1's default pool, GPU 0 current" % (len(got), mib(size)))
    if len(got) != 1:
        fail("%d of 2 blocks of %s (0.6 x GPU 1's room) from GPU 1's default pool succeeded with GPU 0's context "
             "current; 1 fits" % (len(got), mib(size)))
    for p in got:
        drv.must("cuMemFree_v2", u64(p))
    used = fill(drv, w, 1, cap, "GPU 1 after its pool")
    return ("GPU 1's default pool, used with GPU 0 current, was charged to GPU 1; the driver's figure on GPU 1 "
            "peaked at %s of the %s cap" % (mib(max(w.peak, used)), mib(cap)))


ROUNDING_SIZES = (4096, 1 * MiB, 1 * MiB + 4096, 2 * MiB, 2 * MiB + 4096, 3 * MiB + 1)
FILL_BLOCKS = ((2 * MiB + 4096, "2 MiB + 4 KiB"), (1 * MiB + 4096, "1 MiB + 4 KiB"), (1 * MiB, "1 MiB"))


def page_rounding(drv, w, cap):
    drv.use(0)
    room_of(drv, 0, cap)
    took = []
    for size in ROUNDING_SIZES:
        before = w.look(0, "before %d bytes" % size)
        rc, p = drv.alloc(size)
        if rc != 0:
            fail("cuMemAlloc_v2(%d) -> %d" % (size, rc))
        after = w.look(0, "after %d bytes" % size)
        drv.must("cuMemFree_v2", u64(p))
        took.append("%d B: %s" % (size, mib(after - before)))
    info("the driver took, per block: %s" % "; ".join(took))
    filled = []
    for block, name in FILL_BLOCKS:
        blocks = []
        while len(blocks) < 100000:
            rc, p = drv.alloc(block)
            if rc == OOM:
                break
            if rc != 0:
                fail("cuMemAlloc_v2(%d) while filling -> %d" % (block, rc))
            blocks.append(p)
        used = w.look(0, "the cap filled with %d blocks of %s (%s asked)"
                      % (len(blocks), name, mib(len(blocks) * block)))
        for p in blocks:
            drv.must("cuMemFree_v2", u64(p))
        filled.append("%d blocks of %s (%s asked): the driver's figure %s" % (len(blocks), name,
                                                                          mib(len(blocks) * block), mib(used)))
    return ("filling the %s cap, %s; its peak %s; per block the driver took %s"
            % (mib(cap), "; ".join(filled), mib(w.peak), "; ".join(took)))


def big_global(drv, cap, what, kernel=False):
    """(room under the cap, size, PTX): a global `big` of 60 % of GPU 0's room under the cap
    in whole 2 MiB pages, with an empty kernel `k` beside it if `kernel`."""
    room = room_of(drv, 0, cap)
    size = int(room * 0.6) // (2 * MiB) * (2 * MiB)
    if size < 2 * MiB:
        fail("no room for %s's global under the cap (%s free)" % (what, mib(room)))
    ptx = (".version 6.0\n.target sm_50\n.address_size 64\n"
           ".visible .global .align 4 .b8 big[%d];\n" % size
           + (".visible .entry k()\n{\n\tret;\n}\n" if kernel else "")).encode()
    return room, size, ptx


def module_globals(drv, w, cap):
    room, size, ptx = big_global(drv, cap, "a module")
    m = vp()
    rc = drv.L.cuModuleLoadData(ctypes.byref(m), ptx)
    if rc != 0:
        fail("cuModuleLoadData(a global of %s) -> %d" % (mib(size), rc))
    loaded = room_of(drv, 0, cap)
    w.look(0, "a module with a global of %s loaded" % mib(size))
    if room - loaded < size:
        fail("a module with a global of %s lowered the room by %s only: not charged" % (mib(size), mib(room - loaded)))
    m2 = vp()
    rc = drv.L.cuModuleLoadData(ctypes.byref(m2), ptx)
    if rc == 0:
        drv.must("cuModuleUnload", m2)
        fail("a second module with a global of %s loaded with %s free under the cap" % (mib(size), mib(loaded)))
    if rc != OOM:
        fail("a second module past the cap -> %d, expected %d" % (rc, OOM))
    w.look(0, "a second such module refused")
    drv.must("cuModuleUnload", m)
    back = room_of(drv, 0, cap)
    if back < room:
        fail("after cuModuleUnload the room is %s, %s before the load" % (mib(back), mib(room)))
    used = fill(drv, w, 0, cap, "after the module")
    return ("a module with a global of %s was charged %s while loaded (a second refused), given back at unload; "
            "the driver's figure peaked at %s of the %s cap" % (mib(size), mib(room - loaded), mib(max(w.peak, used)),
                                                            mib(cap)))


def stack_steps(drv, room):
    """(SMs, threads per SM, k, the stack now): k steps of 512 bytes more a thread make a
    stack that takes over 0.55 of `room` (each step: 512 bytes for every resident thread)."""
    sms, per_sm = c_int(), c_int()
    drv.must("cuDeviceGetAttribute", ctypes.byref(sms), c_int(16), c_int(0))  # MULTIPROCESSOR_COUNT
    drv.must("cuDeviceGetAttribute", ctypes.byref(per_sm), c_int(39), c_int(0))  # MAX_THREADS_PER_MULTIPROCESSOR
    step = 512 * sms.value * per_sm.value
    old = sz()
    drv.must("cuCtxGetLimit", ctypes.byref(old), c_int(0))
    return sms, per_sm, max(1, -(-int(room * 0.55) // step)), old


def stack_limit(drv, w, cap):
    room = room_of(drv, 0, cap)
    sms, per_sm, k, old = stack_steps(drv, room)
    value = old.value + 512 * k
    before = w.look(0, "before the stack is raised")
    rc = drv.L.cuCtxSetLimit(c_int(0), sz(value))
    if rc != 0:
        fail("cuCtxSetLimit(STACK_SIZE, %d) with %s free under the cap -> %d" % (value, mib(room), rc))
    raised = room_of(drv, 0, cap)
    took = w.look(0, "a stack of %d bytes per thread (%d SMs x %d threads)" % (value, sms.value, per_sm.value)) - before
    charged = room - raised
    if charged + 2 * MiB < took:
        fail("a stack of %d bytes per thread took %s of the driver, gpucap charged %s" % (value, mib(took), mib(charged)))
    rc = drv.L.cuCtxSetLimit(c_int(0), sz(old.value + 1024 * k))
    if rc == 0:
        fail("a stack of %d bytes per thread was allowed with %s free under the cap" % (old.value + 1024 * k, mib(raised)))
    if rc != OOM:
        fail("a stack past the cap -> %d, expected %d" % (rc, OOM))
    kept = sz()
    drv.must("cuCtxGetLimit", ctypes.byref(kept), c_int(0))
    if kept.value != value:
        fail("after the refused stack the limit is %d, not %d" % (kept.value, value))
    w.look(0, "twice that stack refused")
    drv.must("cuCtxSetLimit", c_int(0), sz(old.value))
    lowered = room_of(drv, 0, cap)
    gave = took + before - w.look(0, "the stack lowered to %d" % old.value)
    if (lowered - raised) + 2 * MiB < gave:
        fail("lowering the stack gave %s back to the driver, gpucap credited %s" % (mib(gave), mib(lowered - raised)))
    used = fill(drv, w, 0, cap, "after the stack")
    return ("a stack of %d bytes per thread took %s of the driver and was charged %s (twice that refused); lowered "
            "to %d: the driver gave back %s, gpucap credited %s; the driver's figure peaked at %s of the %s cap"
            % (value, mib(took), mib(charged), old.value, mib(gave), mib(lowered - raised), mib(max(w.peak, used)),
               mib(cap)))


def lazy_kernels(drv, w, cap, by_global=False):
    """A library's first use in the context: its kernel's first launch, or (by_global) its
    global asked for (cuLibraryGetGlobal, as cudart's cudaGetSymbolAddress does)."""
    room, size, ptx = big_global(drv, cap, "a library", kernel=True)
    lib, k = vp(), vp()
    before = w.look(0, "before the library is loaded")
    rc = drv.L.cuLibraryLoadData(ctypes.byref(lib), ptx, None, None, c_int(0), None, None, c_int(0))
    if rc != 0:
        fail("cuLibraryLoadData(a global of %s) -> %d" % (mib(size), rc))
    at_load = w.look(0, "a library with a global of %s loaded" % mib(size)) - before
    drv.must("cuLibraryGetKernel", ctypes.byref(k), lib, b"k")
    if by_global:
        use, ptr, n = "its global asked for", u64(), sz()
        rc = drv.L.cuLibraryGetGlobal(ctypes.byref(ptr), ctypes.byref(n), lib, b"big")
    else:
        use = "its kernel's first launch"
        rc = drv.L.cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    if rc != 0:
        fail("%s -> %d" % (use, rc))
    drv.must("cuCtxSynchronize")
    launched = room_of(drv, 0, cap)
    took = w.look(0, use) - before
    charged = room - launched
    if charged + 2 * MiB < took:
        fail("the library's first use (%s) took %s of the driver (%s at its load), gpucap charged %s"
             % (use, mib(took), mib(at_load), mib(charged)))
    gave, credited, peak = refused_then_unloaded(drv, w, cap, lib, size, before, took, launched)
    return ("a library with a global of %s took %s at its load and %s by %s, charged %s (%s more refused); its "
            "unload gave back %s, credited %s; the driver's figure peaked at %s of the %s cap"
            % (mib(size), mib(at_load), mib(took), use, mib(charged), mib(size), mib(gave), mib(credited), mib(peak),
               mib(cap)))


def library_global(drv, w, cap):
    return lazy_kernels(drv, w, cap, by_global=True)


def refused_then_unloaded(drv, w, cap, lib, size, before, took, launched):
    """A library's kernel launched, the driver having taken `took` since `before` and the
    room `launched` left: `size` more must be refused, the unload credit what the driver
    gave back; then the fill. (given back, credited, the driver's peak)."""
    rc, p = drv.alloc(size)
    if rc == 0:
        drv.must("cuMemFree_v2", u64(p))
        fail("%s more allocated beside the loaded library with %s free under the cap" % (mib(size), mib(launched)))
    if rc != OOM:
        fail("an allocation past the cap -> %d, expected %d" % (rc, OOM))
    drv.must("cuLibraryUnload", lib)
    back = room_of(drv, 0, cap)
    gave = took + before - w.look(0, "the library unloaded")
    if (back - launched) + 2 * MiB < gave:
        fail("cuLibraryUnload gave %s back to the driver, gpucap credited %s" % (mib(gave), mib(back - launched)))
    used = fill(drv, w, 0, cap, "after the library")
    return gave, back - launched, max(w.peak, used)


class KernelNodeParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", vp)] + [(f, ctypes.c_uint) for f in ("gx", "gy", "gz", "bx", "by", "bz", "shared")] + \
        [("params", vp), ("extra", vp), ("kern", vp), ("ctx", vp)]


class GraphNodeParams(ctypes.Structure):  # CUgraphNodeParams (CUDA 12.2): 256 bytes
    _fields_ = [("type", c_int), ("reserved0", c_int * 3), ("kernel", KernelNodeParams),
                ("rest", ctypes.c_ubyte * (232 - ctypes.sizeof(KernelNodeParams))), ("reserved2", ctypes.c_longlong)]


def graph_lazy(drv, w, cap, by_hand, generic=False):
    """A library's kernel, never launched, put into a graph: first launched inside a stream
    capture (global mode, as PyTorch captures), or (by_hand) a kernel node of a graph built
    with cuGraphAddKernelNode_v2 (generic: with CUDA 12.2's cuGraphAddNode_v2); then
    instantiated and launched."""
    room, size, ptx = big_global(drv, cap, "a library", kernel=True)
    lib, k, s, g, x = vp(), vp(), vp(), vp(), vp()
    before = w.look(0, "before the library is loaded")
    rc = drv.L.cuLibraryLoadData(ctypes.byref(lib), ptx, None, None, c_int(0), None, None, c_int(0))
    if rc != 0:
        fail("cuLibraryLoadData(a global of %s) -> %d" % (mib(size), rc))
    drv.must("cuLibraryGetKernel", ctypes.byref(k), lib, b"k")
    drv.must("cuStreamCreate", ctypes.byref(s), c_int(1))
    if by_hand:
        where = "the node's making"
        drv.must("cuGraphCreate", ctypes.byref(g), ctypes.c_uint(0))
        p = KernelNodeParams(kern=k.value, gx=1, gy=1, gz=1, bx=1, by=1, bz=1)
        node = vp()
        if generic:
            call = "cuGraphAddNode_v2"
            rc = drv.L.cuGraphAddNode_v2(ctypes.byref(node), g, None, None, sz(0),
                                         ctypes.byref(GraphNodeParams(type=0, kernel=p)))
        else:
            call = "cuGraphAddKernelNode_v2"
            rc = drv.L.cuGraphAddKernelNode_v2(ctypes.byref(node), g, None, sz(0), ctypes.byref(p))
        if rc != 0:
            fail("%s of the library's kernel -> %d" % (call, rc))
        made = w.look(0, "its kernel added to a graph built by hand") - before
    else:
        where = "the capture"
        drv.must("cuStreamBeginCapture_v2", s, c_int(0))  # CU_STREAM_CAPTURE_MODE_GLOBAL
        rc = drv.L.cuLaunchKernel(k, 1, 1, 1, 1, 1, 1, 0, s, None, None)
        end = drv.L.cuStreamEndCapture(s, ctypes.byref(g))
        if rc != 0 or end != 0:
            fail("the kernel's first launch inside a capture -> %d, the capture's end -> %d (901: the capture was "
                 "invalidated by a call it forbids)" % (rc, end))
        made = w.look(0, "its kernel's first launch captured") - before
    drv.must("cuGraphInstantiateWithFlags", ctypes.byref(x), g, ctypes.c_ulonglong(0))
    at_instantiation = w.look(0, "the graph instantiated") - before
    drv.must("cuGraphLaunch", x, s)
    drv.must("cuStreamSynchronize", s)
    launched = room_of(drv, 0, cap)
    took = w.look(0, "the graph launched") - before
    charged = room - launched
    if charged + 2 * MiB < took:
        fail("the library's kernel put into a graph took %s of the driver by the graph's launch (%s at %s, %s at "
             "the instantiation), gpucap charged %s" % (mib(took), mib(made), where, mib(at_instantiation),
                                                        mib(charged)))
    drv.must("cuGraphExecDestroy", x)
    drv.must("cuGraphDestroy", g)
    gave, credited, peak = refused_then_unloaded(drv, w, cap, lib, size, before, took, launched)
    return ("a library with a global of %s, its kernel first put into a graph at %s: the driver took %s there, %s "
            "by the instantiation, %s by the graph's launch, charged %s (%s more refused); its unload gave back %s, "
            "credited %s; the driver's figure peaked at %s of the %s cap"
            % (mib(size), where, mib(made), mib(at_instantiation), mib(took), mib(charged), mib(size), mib(gave),
               mib(credited), mib(peak), mib(cap)))


def capture_lazy(drv, w, cap):
    return graph_lazy(drv, w, cap, by_hand=False)


def graph_node(drv, w, cap):
    return graph_lazy(drv, w, cap, by_hand=True)


def graph_generic_node(drv, w, cap):
    return graph_lazy(drv, w, cap, by_hand=True, generic=True)


def local_kernel(local):
    """PTX of a kernel `k(out)` whose threads keep `local` bytes of local memory (an array
    indexed by the thread, so that none of it can be left out)."""
    return (".version 6.0\n.target sm_50\n.address_size 64\n"
            ".visible .entry k(.param .u64 out)\n{\n"
            "\t.local .align 4 .b8 d[%d];\n\t.reg .b32 %%r<4>;\n\t.reg .b64 %%rd<8>;\n"
            "\tld.param.u64 %%rd1, [out];\n\tcvta.to.global.u64 %%rd2, %%rd1;\n"
            "\tmov.u32 %%r1, %%tid.x;\n\tmul.wide.u32 %%rd3, %%r1, 4;\n"
            "\tmov.u64 %%rd4, d;\n\tadd.u64 %%rd5, %%rd4, %%rd3;\n"
            "\tst.volatile.local.u32 [%%rd5], %%r1;\n\tld.volatile.local.u32 %%r2, [%%rd5];\n"
            "\tadd.u64 %%rd6, %%rd2, %%rd3;\n\tst.global.u32 [%%rd6], %%r2;\n\tret;\n}\n" % local).encode()


class LaunchParams(ctypes.Structure):
    """CUDA_LAUNCH_PARAMS (cuda.h): one device's launch of cuLaunchCooperativeKernelMultiDevice."""
    _fields_ = [("function", vp), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", vp), ("params", vp)]


def local_stack(drv, w, cap, legacy=False, multi=False):
    """A kernel whose threads need more local memory than the stack, launched (legacy: by
    the deprecated cuLaunchGrid, its block set by cuFuncSetBlockShape, its parameter by
    cuParamSetv; multi: by the deprecated cuLaunchCooperativeKernelMultiDevice, one device
    on a stream of its own): the stack it grows is charged; twice that is refused."""
    room = room_of(drv, 0, cap)
    sms, per_sm, k, old = stack_steps(drv, room)
    rc, out = drv.alloc(4096)
    if rc != 0:
        fail("cuMemAlloc_v2(4 KiB) -> %d" % rc)
    arg = u64(out)
    params = (vp * 1)(ctypes.cast(ctypes.byref(arg), vp))
    stream = vp()
    if multi:
        able = c_int()
        drv.must("cuDeviceGetAttribute", ctypes.byref(able), c_int(96), c_int(0))  # COOPERATIVE_MULTI_DEVICE_LAUNCH
        if able.value == 0:
            skip("GPU 0 cannot take part in cuLaunchCooperativeKernelMultiDevice (COOPERATIVE_MULTI_DEVICE_LAUNCH 0)")
        drv.must("cuStreamCreate", ctypes.byref(stream), c_int(1))

    def launch(f):
        if multi:
            p = LaunchParams(f, (1, 1, 1), (32, 1, 1), 0, stream, ctypes.cast(params, vp))
            rc = drv.L.cuLaunchCooperativeKernelMultiDevice(ctypes.byref(p), ctypes.c_uint(1), ctypes.c_uint(0))
            if rc == 0:
                drv.must("cuStreamSynchronize", stream)
            return rc
        if not legacy:
            return drv.L.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, None, params, None)
        drv.must("cuFuncSetBlockShape", f, c_int(32), c_int(1), c_int(1))
        drv.must("cuParamSetv", f, c_int(0), ctypes.byref(arg), ctypes.c_uint(8))
        drv.must("cuParamSetSize", f, ctypes.c_uint(8))
        return drv.L.cuLaunchGrid(f, c_int(1), c_int(1))

    def kernel(local):
        m, f, got = vp(), vp(), c_int()
        drv.must("cuModuleLoadData", ctypes.byref(m), local_kernel(local))
        drv.must("cuModuleGetFunction", ctypes.byref(f), m, b"k")
        drv.must("cuFuncGetAttribute", ctypes.byref(got), c_int(3), f)  # LOCAL_SIZE_BYTES
        info("a kernel declaring %d bytes of local memory a thread: LOCAL_SIZE_BYTES %d" % (local, got.value))
        return m, f, got.value

    m1, f1, local1 = kernel(old.value + 512 * k)
    if local1 <= old.value:
        fail("the kernel's threads take %d bytes of local memory, within the %d-byte stack: nothing to grow"
             % (local1, old.value))
    before = w.look(0, "before the kernel's launch")
    rc = launch(f1)
    if rc != 0:
        fail("the launch of a kernel with %d bytes of local memory a thread, %s free under the cap -> %d"
             % (local1, mib(room), rc))
    drv.must("cuCtxSynchronize")
    grown = sz()
    drv.must("cuCtxGetLimit", ctypes.byref(grown), c_int(0))
    raised = room_of(drv, 0, cap)
    took = w.look(0, "launched: the stack %d bytes a thread (%d SMs x %d threads)"
                  % (grown.value, sms.value, per_sm.value)) - before
    charged = room - raised
    if charged + 2 * MiB < took:
        fail("a launch that grew the stack to %d bytes a thread took %s of the driver, gpucap charged %s"
             % (grown.value, mib(took), mib(charged)))
    m2, f2, local2 = kernel(2 * local1)
    rc = launch(f2)
    if rc == 0:
        fail("a kernel with %d bytes of local memory a thread launched with %s free under the cap"
             % (local2, mib(raised)))
    if rc != OOM:
        fail("a launch whose stack is past the cap -> %d, expected %d" % (rc, OOM))
    kept = sz()
    drv.must("cuCtxGetLimit", ctypes.byref(kept), c_int(0))
    if kept.value != grown.value:
        fail("after the refused launch the stack is %d, not %d" % (kept.value, grown.value))
    w.look(0, "the kernel with twice that local memory refused")
    drv.must("cuModuleUnload", m2)
    drv.must("cuModuleUnload", m1)
    drv.must("cuCtxSetLimit", c_int(0), sz(old.value))
    lowered = room_of(drv, 0, cap)
    gave = took + before - w.look(0, "the stack lowered to %d" % old.value)
    if (lowered - raised) + 2 * MiB < gave:
        fail("lowering the stack gave %s back to the driver, gpucap credited %s" % (mib(gave), mib(lowered - raised)))
    drv.must("cuMemFree_v2", u64(out))
    used = fill(drv, w, 0, cap, "after the stack")
    return ("a kernel with %d bytes of local memory a thread grew the stack to %d at its launch: the driver took %s, "
            "gpucap charged %s (twice that refused before the driver grew it); lowered to %d: the driver gave back "
            "%s, gpucap credited %s; the driver's figure peaked at %s of the %s cap"
            % (local1, grown.value, mib(took), mib(charged), old.value, mib(gave), mib(lowered - raised),
               mib(max(w.peak, used)), mib(cap)))


class DevResource(ctypes.Structure):
    """CUdevResource as CUDA 13's cuda.h lays it out (144 bytes; CUDA 12.4's SM fields at the
    same offsets)."""
    _fields_ = [("type", ctypes.c_uint), ("padding", ctypes.c_ubyte * 92), ("sm_count", ctypes.c_uint),
                ("min_partition", ctypes.c_uint), ("alignment", ctypes.c_uint), ("flags", ctypes.c_uint),
                ("rest", ctypes.c_ubyte * 24), ("next", ctypes.c_void_p)]


def legacy_launch(drv, w, cap):
    return local_stack(drv, w, cap, legacy=True)


def multi_device(drv, w, cap):
    return local_stack(drv, w, cap, multi=True)


def green_context(drv, w, cap):
    """Two green contexts (CUDA 12.4), the first made while the primary context is inactive:
    cuGreenCtxCreate retains the primary context, so the first makes it. After each, the room
    must have dropped by at least what the driver's figure rose; both destroyed, the primary
    context goes with them."""
    if not hasattr(drv.L, "cuGreenCtxCreate"):
        skip("this driver has no green contexts (CUDA 12.4)")
    whole, parts, n = DevResource(), (DevResource * 2)(), ctypes.c_uint(2)
    drv.must("cuDeviceGetDevResource", c_int(0), ctypes.byref(whole), c_int(1))  # CU_DEV_RESOURCE_TYPE_SM
    drv.must("cuDevSmResourceSplitByCount", parts, ctypes.byref(n), ctypes.byref(whole), None, ctypes.c_uint(0),
             ctypes.c_uint(1))
    if n.value < 2:
        skip("GPU 0's %d SMs split into %d partition(s): two are needed" % (whole.sm_count, n.value))
    info("GPU 0: %d SMs, partitions of at least %d in multiples of %d: two of %d made"
         % (whole.sm_count, whole.min_partition, whole.alignment, parts[0].sm_count))
    greens, steps = [], []
    for i in range(2):
        desc, g = vp(), vp()
        drv.must("cuDevResourceGenerateDesc", ctypes.byref(desc), ctypes.byref(parts[i]), ctypes.c_uint(1))
        rc = drv.L.cuGreenCtxCreate(ctypes.byref(g), desc, c_int(0), ctypes.c_uint(1))  # CU_GREEN_CTX_DEFAULT_STREAM
        if rc != 0:
            fail("cuGreenCtxCreate of %d SMs -> %d" % (parts[i].sm_count, rc))
        greens.append(g)
        if i == 0:
            ctx = vp()
            drv.must("cuCtxFromGreenCtx", ctypes.byref(ctx), g)
            drv.must("cuCtxSetCurrent", ctx)
        took = w.look(0, "%d green context(s) made, the primary context inactive before the first" % (i + 1))
        free, total = sz(), sz()
        drv.must("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        if total.value != cap:
            fail("cuMemGetInfo total is %s, not the cap %s: not running under gpucap's cap"
                 % (mib(total.value), mib(cap)))
        charged = cap - free.value
        steps.append((took, charged))
        if charged + 2 * MiB < took:
            fail("%d green context(s): the driver took %s for this process (the primary context they retain and "
                 "their own), gpucap charged %s" % (i + 1, mib(took), mib(charged)))
    drv.must("cuCtxSetCurrent", None)
    for g in greens:
        drv.must("cuGreenCtxDestroy", g)
    used = fill(drv, w, 0, cap, "after the green contexts")
    (took1, charged1), (took2, charged2) = steps
    return ("the first green context (the primary context inactive before) took %s of the driver, charged %s; "
            "the second %s more, charged %s more; the driver's figure peaked at %s of the %s cap"
            % (mib(took1), mib(charged1), mib(took2 - took1), mib(charged2 - charged1), mib(max(w.peak, used)),
               mib(cap)))


def main(argv):
    if len(argv) != 3 or argv[1] != "--cap":
        print("usage: escapes.py vmm-release|pool-cumemfree|pool-other-gpu|page-rounding|module-globals|stack-limit"
              "|lazy-kernels|library-global|local-stack|legacy-launch|multi-device|capture-lazy|graph-node"
              "|graph-generic-node"
              "|green-context --cap BYTES",
              file=sys.stderr)
        return 2
    cap = int(argv[2])
    modes = {"vmm-release": vmm_release, "pool-cumemfree": pool_cumemfree, "pool-other-gpu": pool_other_gpu,
             "page-rounding": page_rounding, "module-globals": module_globals, "stack-limit": stack_limit,
             "lazy-kernels": lazy_kernels, "library-global": library_global, "local-stack": local_stack,
             "legacy-launch": legacy_launch, "multi-device": multi_device, "capture-lazy": capture_lazy,
             "graph-node": graph_node, "graph-generic-node": graph_generic_node, "green-context": green_context}
    try:
        if argv[0] not in modes:
            fail("unknown mode %s" % argv[0])
        drv = Driver()
        ok(modes[argv[0]](drv, Witness(drv, cap), cap))
    except Outcome as o:
        print("%s: %s" % (o.status, o.message), flush=True)
        return {"OK": 0, "FAIL": 1, "SKIP": 77}[o.status]
    except Exception as e:  # noqa: BLE001
        print("FAIL: unexpected %s: %s" % (type(e).__name__, e), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
