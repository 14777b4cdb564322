#!/usr/bin/env python3
"""Diagnostic: what the driver counts for a torch process (NVML per-process used memory)
step by step, beside what gpucap charges (cuMemGetInfo's total - free under gpucap)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
from nvml_ctypes import Nvml  # noqa: E402

MiB = 1 << 20
n = Nvml()
h = n.handle(0)  # one GPU on the lent machine


def step(what):
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    drv = n.process_used(h, os.getpid())
    print("%-34s driver %8.1f MiB   gpucap/cuda used %8.1f MiB" % (what, (drv or 0) / MiB, (total - free) / MiB),
          flush=True)


torch.cuda.init()
torch.cuda.mem_get_info()
step("context")
x = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
step("empty 16 MiB")
x[:1].fill_(1)
step("fill_ (first kernel)")
y = x.float()
step("x.float() (16 MiB -> 64 MiB)")
del y
torch.cuda.empty_cache()
step("y freed, empty_cache")
z = torch.randn(1024, 1024, device="cuda")
step("randn 4 MiB")
w = z @ z
step("matmul (cuBLAS)")
