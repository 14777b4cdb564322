#!/usr/bin/env python3
"""What gpucap charges against what the driver counts (NVML's per-process used memory,
nvmlDeviceGetComputeRunningProcesses), for scripts/gpu/checks/memory.sh. Runs capped.

  accounting.py charge --client driver|torch|jax|cupy --cap N
      (under `gpucap run --limit N --log debug`) makes the framework's context, a few
      arrays and a matrix product (cuBLAS's workspace), then prints gpucap's charge
      (cap - free, as cuMemGetInfo shows it), the framework's own figure, and the
      driver's figure for this process, with the difference explained.
  accounting.py growth --client driver|torch --cap N --part keep|small|both
      (under `gpucap run --growth --limit N`) small (first, from a fresh process):
      2,000 blocks of 64 KiB take about their size, not 2 MiB each (PyTorch: run with
      PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that each tensor is its own cudaMalloc);
      keep: a large block freed (PyTorch: and
      empty_cache()) keeps the driver's figure, and serves the next one without it
      growing.
Prints INFO and FIGURE lines, then OK:/FAIL:/SKIP: (exit 0/1/77).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nvml_ctypes import Nvml, NvmlError  # noqa: E402
from observer import Cuda  # noqa: E402
from verdicts import MiB, Outcome, fail, figure, info, mib, ok, skip  # noqa: E402

SMALL_N, SMALL_SIZE = 2000, 64 * 1024


class Driver:
    """The driver figure for this process on the visible GPU (its UUID from the
    driver, so that NVML, which ignores CUDA_VISIBLE_DEVICES, reads the same GPU)."""

    def __init__(self, cuda):
        import ctypes
        self.cuda = cuda
        b = (ctypes.c_ubyte * 16)()
        cuda.lib.cuDeviceGetUuid_v2.restype = ctypes.c_int
        cuda.check(cuda.lib.cuDeviceGetUuid_v2(b, ctypes.c_int(0)), "cuDeviceGetUuid_v2")
        h = bytes(b).hex()
        uuid = "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])
        try:
            self.nvml = Nvml()
            self.h = self.nvml.handle(uuid)
        except NvmlError as e:
            fail("NVML: %s" % e)

    def used(self, when):
        u = self.nvml.process_used(self.h, os.getpid())
        if u is None:
            skip("NVML does not list this process's used memory (pid %d): no driver figure to compare" % os.getpid())
        info("%s: the driver counts %s for this process" % (when, mib(u)))
        return u


def framework(client):
    """(init, work, own_figure, name): work makes arrays and a matrix product."""
    keep = []
    if client == "driver":
        def work():
            for n in (64 * MiB, 8 * MiB):
                p = cuda_box[0].alloc(n)
                if p is None:
                    fail("cuMemAlloc_v2(%s) refused" % mib(n))
                keep.append(p)
        return (lambda: None), work, (lambda: sum([64 * MiB, 8 * MiB])), "its cuMemAlloc_v2 blocks"
    if client == "torch":
        import torch

        def init():
            torch.cuda.init()
            torch.cuda.mem_get_info()

        def work():
            a = torch.randn(2048, 2048, device="cuda")
            keep.extend([a, a @ a, torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")])
            torch.cuda.synchronize()
        return init, work, torch.cuda.memory_reserved, "torch.cuda.memory_reserved() (cuBLAS's workspace included)"
    if client == "jax":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp
        dev = [d for d in jax.devices() if d.platform == "gpu"]
        if not dev:
            skip("JAX sees no GPU")

        def work():
            a = jax.random.normal(jax.random.PRNGKey(0), (2048, 2048))
            b = (a @ a).block_until_ready()
            keep.extend([a, b, jnp.zeros(16 * MiB, dtype=jnp.float32).block_until_ready()])

        def own():
            s = dev[0].memory_stats() or {}
            return s.get("bytes_reserved") or s.get("pool_bytes") or s.get("bytes_in_use", 0)
        return (lambda: jnp.zeros(1).block_until_ready()), work, own, "JAX's bytes_reserved (memory_stats)"
    if client == "cupy":
        import cupy

        def work():
            a = cupy.random.standard_normal((2048, 2048), dtype=cupy.float32)
            keep.extend([a, a @ a, cupy.empty(64 * MiB, dtype=cupy.uint8)])
            cupy.cuda.Device().synchronize()
        return ((lambda: cupy.cuda.runtime.memGetInfo()), work,
                (lambda: cupy.get_default_memory_pool().total_bytes()), "CuPy's memory pool total_bytes()")
    fail("unknown client %s" % client)


cuda_box = []


def cmd_charge(client, cap):
    try:
        init, work, own, own_name = framework(client)
    except ImportError as e:
        skip("%s not importable (%s)" % (client, e))
    init()
    cuda = Cuda()  # the framework's primary context, current on this thread
    cuda_box.append(cuda)
    drv = Driver(cuda)
    free, total = cuda.mem_info()
    if total != cap:
        fail("cuMemGetInfo total is %d (%s), not the cap %d: not running under gpucap's cap" % (total, mib(total), cap))
    ctx_charge, ctx_driver = cap - free, drv.used("the context alone")
    work()
    free, _ = cuda.mem_info()
    charge, driver, fw = cap - free, drv.used("after arrays and a matrix product"), own()
    for k, v in (("charge", charge), ("driver", driver), ("framework", fw), ("ctx_charge", ctx_charge),
                 ("ctx_driver", ctx_driver)):
        figure("accounting_%s_%s_bytes" % (client, k), v)
    if driver > cap:
        fail("the driver counts %s for this process, past the %s cap (gpucap charges %s)"
             % (mib(driver), mib(cap), mib(charge)))
    gap = driver - charge
    ok("%s: gpucap charges %s (the context %s, %s %s, other %s); the driver counts %s (the context alone %s): "
       "%s %s gpucap's charge%s" % (
           client, mib(charge), mib(ctx_charge), own_name, mib(fw), mib(charge - ctx_charge - fw), mib(driver),
           mib(ctx_driver), mib(abs(gap)), "above" if gap >= 0 else "below",
           " (module code and data loaded after the context was measured, lazily loaded kernels, the driver's own "
           "allocations: not allocation calls gpucap sees)" if gap > 0 else ""))


def cmd_growth(client, cap, part):
    if client == "torch":
        if part == "small" and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
            fail("growth --part small with PyTorch needs PYTORCH_NO_CUDA_MEMORY_CACHING=1")
        try:
            import torch
        except ImportError as e:
            skip("torch not importable (%s)" % e)
        torch.cuda.init()
        torch.cuda.mem_get_info()
        held = []

        def alloc(n):
            held.append(torch.empty(n, dtype=torch.uint8, device="cuda"))

        def free_all():
            held.clear()
            torch.cuda.empty_cache()
        freed = "freed + torch.cuda.empty_cache()"
    else:
        held = []

        def alloc(n):
            p = cuda_box[0].alloc(n)
            if p is None:
                fail("cuMemAlloc_v2(%s) refused" % mib(n))
            held.append(p)

        def free_all():
            for p in held:
                cuda_box[0].release(p)
            held.clear()
        freed = "freed (cuMemFree_v2)"
    cuda = Cuda()
    cuda_box.append(cuda)
    drv = Driver(cuda)
    free, total = cuda.mem_info()
    if total != cap:
        fail("cuMemGetInfo total is %d (%s), not the cap %d: not running under gpucap's cap" % (total, mib(total), cap))
    said = []
    if part in ("small", "both"):
        d0 = drv.used("before %d blocks of %d KiB" % (SMALL_N, SMALL_SIZE // 1024))
        for _ in range(SMALL_N):
            alloc(SMALL_SIZE)
        d1 = drv.used("%d blocks of %d KiB held" % (SMALL_N, SMALL_SIZE // 1024))
        grew, asked = d1 - d0, SMALL_N * SMALL_SIZE
        figure("growth_%s_small_bytes" % client, grew)
        if grew > asked * 5 // 4 + 8 * MiB:
            fail("growth mode: %d blocks of %d KiB (%s) grew the driver's figure by %s: small blocks take more "
                 "than their size (2 MiB each would be %s)" % (SMALL_N, SMALL_SIZE // 1024, mib(asked), mib(grew),
                                                              mib(SMALL_N * 2 * MiB)))
        free_all()
        said.append("%d blocks of %d KiB grew it by %s (asked %s; a 2 MiB page each would be %s)"
                    % (SMALL_N, SMALL_SIZE // 1024, mib(grew), mib(asked), mib(SMALL_N * 2 * MiB)))
    if part in ("keep", "both"):
        big = free // 2 // (2 * MiB) * (2 * MiB)
        d0 = drv.used("start")
        alloc(big)
        d1 = drv.used("%s held" % mib(big))
        free_all()
        d2 = drv.used("%s %s" % (mib(big), freed))
        if d2 < d1 - 2 * MiB:
            fail("growth mode: after %s was %s the driver counts %s, down from %s: the footprint shrank"
                 % (mib(big), freed, mib(d2), mib(d1)))
        alloc(big)
        d3 = drv.used("%s again" % mib(big))
        if d3 > d2 + 2 * MiB:
            fail("growth mode: the second %s took new memory (the driver counts %s, was %s): not served from "
                 "what was kept" % (mib(big), mib(d3), mib(d2)))
        free_all()
        figure("growth_%s_keep_bytes" % client, d2 - d0)
        said.append("%s %s kept the driver's figure (%s -> %s) and served the next %s without new memory"
                    % (mib(big), freed, mib(d1), mib(d2), mib(big)))
    ok("%s in growth mode: %s" % (client, "; ".join(said)))


def main(argv):
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("charge", "growth"))
    p.add_argument("--client", choices=("driver", "torch", "jax", "cupy"), required=True)
    p.add_argument("--cap", type=int, required=True)
    p.add_argument("--part", choices=("keep", "small", "both"), default="both")
    a = p.parse_args(argv)
    try:
        if a.what == "charge":
            cmd_charge(a.client, a.cap)
        else:
            cmd_growth(a.client, a.cap, a.part)
        fail("no verdict")
    except Outcome as o:
        print("%s: %s" % (o.status, o.message), flush=True)
        return {"OK": 0, "FAIL": 1, "SKIP": 77}[o.status]
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print("FAIL: unexpected %s: %s" % (type(e).__name__, e), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
