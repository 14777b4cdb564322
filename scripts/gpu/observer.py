"""The uncapped witnesses of the real-GPU checks: nvidia-smi's figure for a process (run
without LD_PRELOAD), and device 0's primary context in this process through ctypes
(libcuda.so.1), which allocates, frees and reads free memory as the driver answers.
"""

import ctypes
import os
import subprocess
import time

from verdicts import MiB, fail, info, mib


def env_without_preload():
    """The environment for a helper that must not be capped (nvidia-smi as a witness)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def smi_process_used(pid):
    """This process's GPU memory as the driver accounts it (nvidia-smi, uncapped), in
    bytes, or None where nvidia-smi does not list it (a container's own pid namespace,
    no permission). Informational: it includes the CUDA context."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            env=env_without_preload(), capture_output=True, text=True, timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return int(parts[1]) * MiB
    return None


def report_physical(label):
    used = smi_process_used(os.getpid())
    if used is not None:
        info("%s: nvidia-smi (uncapped) counts %s on the GPU for this process, its CUDA context included"
             % (label, mib(used)))


class Cuda:
    """Device 0's primary context in this process, through libcuda.so.1."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            fail("cannot load libcuda.so.1: %s" % e)
        L = self.lib
        sz = ctypes.c_size_t
        L.cuInit.argtypes = [ctypes.c_uint]
        L.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        L.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        L.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        L.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(sz), ctypes.POINTER(sz)]
        L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), sz]
        L.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        L.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for f in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                  "cuMemGetInfo_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuGetErrorName"):
            getattr(L, f).restype = ctypes.c_int
        self.check(L.cuInit(0), "cuInit")
        dev = ctypes.c_int(0)
        self.check(L.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(L.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
        self.check(L.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def error_name(self, rc):
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return str(rc)

    def check(self, rc, what):
        if rc != 0:
            fail("observer: %s -> %s" % (what, self.error_name(rc)))

    def mem_info(self):
        free = ctypes.c_size_t()
        total = ctypes.c_size_t()
        self.check(self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    def free_now(self):
        return self.mem_info()[0]

    def alloc(self, n):
        """A device pointer, or None if the driver refuses (any error)."""
        p = ctypes.c_uint64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
        return p.value if rc == 0 else None

    def release(self, p):
        self.check(self.lib.cuMemFree_v2(ctypes.c_uint64(p)), "cuMemFree")

    def fill_gpu(self, leave=64 * MiB):
        """Allocates all the device memory the driver will give (256 MiB blocks, then
        2 MiB ones), then frees about `leave` bytes of it again: room for the page
        tables a mapping needs, far less than what the growth check's holder asks for.
        Returns (pointers, bytes held)."""
        big, small = [], []
        for chunk, into in ((256 * MiB, big), (2 * MiB, small)):
            while True:
                p = self.alloc(chunk)
                if p is None:
                    break
                into.append(p)
        left = 0
        while small and left < leave:
            self.release(small.pop())
            left += 2 * MiB
        if left < leave and big:
            self.release(big.pop())
            left += 256 * MiB
        return big + small, len(big) * 256 * MiB + len(small) * 2 * MiB

    def settled_free(self, limit=5.0):
        """Free memory once two readings 100 ms apart agree (memory of a process that
        just exited is given back asynchronously), or after `limit` seconds."""
        deadline = time.monotonic() + limit
        last = self.free_now()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.free_now()
            if now == last:
                return now
            last = now
        return last
