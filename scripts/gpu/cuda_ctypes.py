"""The CUDA driver through ctypes for the real-GPU checks (escapes.py, graphs.py,
nccl_check.py): the driver's structures the checks pass, `Driver` (the calls they make,
typed; the primary context of each GPU made current on demand), `Witness` (NVML's figure
for this process on a GPU, checked against the cap, and the highest seen), `room_of` (the
free memory gpucap shows, after checking that the total is the cap) and `fill` (blocks
until one is refused: the driver's figure then). Importing it loads no library; a Driver
loads libcuda.so.1 and initialises CUDA.
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nvml_ctypes import Nvml, NvmlError  # noqa: E402
from verdicts import MiB, fail, info, mib, skip  # noqa: E402

u64, sz, c_int, vp = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p
OOM = 2


class Location(ctypes.Structure):
    _fields_ = [("type", c_int), ("id", c_int)]


class AllocProp(ctypes.Structure):  # CUmemAllocationProp, 32 bytes
    _fields_ = [("type", c_int), ("handle_types", c_int), ("location", Location), ("win32", vp),
                ("alloc_flags", ctypes.c_ubyte * 8)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", c_int)]


class PoolProps(ctypes.Structure):  # CUmemPoolProps, 88 bytes
    _fields_ = [("alloc_type", c_int), ("handle_types", c_int), ("location", Location), ("win32", vp),
                ("max_size", sz), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]


class Driver:
    def __init__(self):
        self.L = ctypes.CDLL("libcuda.so.1")
        for f in ("cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                  "cuMemGetInfo_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetAllocationGranularity",
                  "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemRelease",
                  "cuMemUnmap", "cuMemAddressFree", "cuMemPoolCreate", "cuMemPoolDestroy",
                  "cuMemAllocFromPoolAsync", "cuDeviceGetDefaultMemPool", "cuCtxSynchronize",
                  "cuDeviceGetUuid_v2", "cuModuleLoadData", "cuModuleUnload"):
            getattr(self.L, f).restype = c_int
        self.L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), sz]
        self.L.cuMemFree_v2.argtypes = [u64]
        self.L.cuMemCreate.argtypes = [ctypes.POINTER(u64), sz, ctypes.POINTER(AllocProp), ctypes.c_ulonglong]
        self.L.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), sz, sz, u64, ctypes.c_ulonglong]
        self.L.cuMemMap.argtypes = [u64, sz, sz, u64, ctypes.c_ulonglong]
        self.L.cuMemSetAccess.argtypes = [u64, sz, ctypes.POINTER(AccessDesc), sz]
        self.L.cuMemRelease.argtypes = [u64]
        self.L.cuMemUnmap.argtypes = [u64, sz]
        self.L.cuMemAddressFree.argtypes = [u64, sz]
        self.L.cuMemAllocFromPoolAsync.argtypes = [ctypes.POINTER(u64), sz, vp, vp]
        self.L.cuMemPoolDestroy.argtypes = [vp]
        self.L.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        self.L.cuModuleUnload.argtypes = [vp]
        self.must("cuInit", 0)
        n = c_int()
        self.must("cuDeviceGetCount", ctypes.byref(n))
        self.count = n.value
        self.ctx = {}

    def must(self, name, *args):
        rc = getattr(self.L, name)(*args)
        if rc != 0:
            fail("%s -> %d" % (name, rc))

    def use(self, dev):
        if dev not in self.ctx:
            ctx = vp()
            self.must("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), c_int(dev))
            self.ctx[dev] = ctx
        self.must("cuCtxSetCurrent", self.ctx[dev])

    def mem_info(self, dev):
        self.use(dev)
        free, total = sz(), sz()
        self.must("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def uuid(self, dev):
        b = (ctypes.c_ubyte * 16)()
        self.must("cuDeviceGetUuid_v2", b, c_int(dev))
        h = bytes(b).hex()
        return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])

    def alloc(self, n):
        p = u64()
        rc = self.L.cuMemAlloc_v2(ctypes.byref(p), n)
        return rc, p.value


class Witness:
    """The driver's figure for this process on a GPU (NVML), and the highest seen."""

    def __init__(self, drv, cap):
        self.cap = cap
        self.peak = 0
        try:
            self.nvml = Nvml()
        except NvmlError as e:
            fail("NVML: %s" % e)
        self.handles = {}
        self.drv = drv

    def look(self, dev, when):
        if dev not in self.handles:
            self.handles[dev] = self.nvml.handle(self.drv.uuid(dev))
        used = self.nvml.process_used(self.handles[dev], os.getpid())
        if used is None:
            skip("NVML does not list this process's used memory (pid %d; a PID namespace of its own?)" % os.getpid())
        self.peak = max(self.peak, used)
        info("%s: the driver counts %s for this process on GPU %d (cap %s)" % (when, mib(used), dev, mib(self.cap)))
        if used > self.cap:
            fail("%s: the driver counts %s for this process on GPU %d, past the %s cap"
                 % (when, mib(used), dev, mib(self.cap)))
        return used


def room_of(drv, dev, cap):
    free, total = drv.mem_info(dev)
    if total != cap:
        fail("cuMemGetInfo total on GPU %d is %d (%s), not the cap %d: not running under gpucap's cap"
             % (dev, total, mib(total), cap))
    return free


def fill(drv, w, dev, cap, label):
    """Blocks of cap/16 until one is refused; the driver's figure then."""
    drv.use(dev)
    blocks, block = [], max(cap // 16 // (2 * MiB) * (2 * MiB), 2 * MiB)
    while len(blocks) < 10000:
        rc, p = drv.alloc(block)
        if rc == OOM:
            break
        if rc != 0:
            fail("cuMemAlloc_v2(%s) while filling -> %d" % (mib(block), rc))
        blocks.append(p)
    used = w.look(dev, "%s: GPU %d filled to a refusal with %d blocks of %s" % (label, dev, len(blocks), mib(block)))
    for p in blocks:
        drv.must("cuMemFree_v2", u64(p))
    return used
