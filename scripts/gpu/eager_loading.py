#!/usr/bin/env python3
"""Under CUDA's eager loading (CUDA_MODULE_LOADING=EAGER, set by the caller), what the
driver counts for this PyTorch process beside what gpucap charges it, step by step
(scripts/gpu-check.sh's torch-eager check; run under `gpucap run --limit CAP`):

  context           PyTorch's libraries loaded with the context (an H200: 1250 MiB against
                    518 lazily, docs/gpu-runs/2026-11-26-h100/torch-lazy-loading.txt)
  first kernel      nothing more loaded: eager loading loaded it with the context
  matmul (cuBLAS)   cuBLAS's libraries loaded into the context at their load
                    (cuLibraryLoadData: 512 MiB against 98 lazily)

The driver's figure is nvidia-smi's for this pid (uncapped, NVML's process table), the
charge is cuMemGetInfo's total - free under gpucap. gpucap must never charge less than
the driver holds (16 MiB of slack for what the driver counts on its own page sizes):
FAIL at the first step where it does. SKIP where nvidia-smi does not list this process
(another PID namespace). Prints OK/FAIL/SKIP and FIGURE lines, as probe.py does.

  eager_loading.py --cap BYTES
"""

import argparse
import os
import sys

from observer import smi_process_used
from verdicts import concluded, fail, figure, info, mib, ok, skip

MiB = 1 << 20
SLACK = 16 * MiB


def run(cap):
    if os.environ.get("CUDA_MODULE_LOADING", "").upper() != "EAGER":
        fail("CUDA_MODULE_LOADING=%r: this check is of eager loading" % os.environ.get("CUDA_MODULE_LOADING"))
    import torch

    torch.cuda.init()
    worst = None

    def step(what):
        nonlocal worst
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        charged = total - free
        driver = smi_process_used(os.getpid())
        if driver is None:
            skip("nvidia-smi does not list this process (pid %d): no driver figure to hold gpucap's to" % os.getpid())
        info("%-16s driver %s, gpucap charges %s (cap %s)" % (what, mib(driver), mib(charged), mib(cap)))
        if charged + SLACK < driver:
            fail("%s: gpucap charges %s while the driver holds %s for this process under eager loading"
                 % (what, mib(charged), mib(driver)))
        short = driver - charged
        worst = short if worst is None else max(worst, short)
        return driver, charged

    step("context")
    x = torch.ones(1024, device="cuda")
    step("first kernel")
    z = torch.randn(1024, 1024, device="cuda")
    driver, charged = step("matmul (cuBLAS)" if (z @ z).shape[0] else "matmul")
    del x, z
    figure("eager_matmul_driver_mib", "%.1f" % (driver / MiB))
    figure("eager_matmul_charged_mib", "%.1f" % (charged / MiB))
    ok("eager loading: after a cuBLAS matmul the driver holds %s, gpucap charges %s (at most %s below it at any step)"
       % (mib(driver), mib(charged), mib(max(worst, 0))))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cap", type=int, required=True)
    a = p.parse_args(argv)
    return concluded(lambda: run(a.cap))


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
