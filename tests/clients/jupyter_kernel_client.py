#!/usr/bin/env python3
"""Starts a Jupyter kernel by its kernelspec name with jupyter_client, as a notebook
server does, and runs cells in it that use the GPU through cuda-bindings and NVML
(pynvml). tests/deployment/wheel.rs runs it with a kernel that `gpucap jupyter install` wrote.

Usage: jupyter_kernel_client.py KERNEL_NAME STDERR_FILE UNDER_MIB OVER_MIB

Prints one JSON object: per cell its reply status, what it printed (stdout, stderr
streams), and for an error its ename and evalue; the kernel's own stderr (fd 2, which
the shim writes to) goes to STDERR_FILE.
"""

import json
import sys

from jupyter_client.manager import KernelManager

SETUP = """
from cuda.bindings import driver
import pynvml
SUCCESS = driver.CUresult.CUDA_SUCCESS
assert driver.cuInit(0)[0] == SUCCESS
dev = driver.cuDeviceGet(0)[1]
ctx = driver.cuDevicePrimaryCtxRetain(dev)[1]
assert driver.cuCtxSetCurrent(ctx)[0] == SUCCESS
held = []

def alloc(mib):
    err, ptr = driver.cuMemAlloc(mib << 20)
    if err != SUCCESS:
        # what a framework does with the driver's answer: its out-of-memory error
        raise MemoryError(f"cuMemAlloc of {mib} MiB: {err.name}")
    held.append(ptr)
    print(f"alloc {mib} ok")
"""

MEM_INFO = """
err, free, total = driver.cuMemGetInfo()
print(f"mem_get_info free={free} total={total}")
pynvml.nvmlInit()
info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
print(f"nvml total={info.total} used={info.used}")
"""


def run(kc, code):
    out = {"stdout": "", "stderr": "", "status": None}

    def hook(msg):
        t = msg["header"]["msg_type"]
        c = msg["content"]
        if t == "stream":
            out[c["name"]] += c["text"]
        elif t == "error":
            out["ename"] = c["ename"]
            out["evalue"] = c["evalue"]

    reply = kc.execute_interactive(code, output_hook=hook, timeout=120)
    out["status"] = reply["content"]["status"]
    if out["status"] == "error":
        out.setdefault("ename", reply["content"].get("ename"))
        out.setdefault("evalue", reply["content"].get("evalue"))
    return out


def main():
    name, stderr_file, under, over = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with open(stderr_file, "w") as err:
        km = KernelManager(kernel_name=name)
        km.start_kernel(stderr=err)
        try:
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            cells = {
                "setup": run(kc, SETUP),
                "info": run(kc, MEM_INFO),
                "under": run(kc, f"alloc({under})"),
                "over": run(kc, f"alloc({over})"),
                "after": run(kc, f"print('alive', 6 * 7)\nalloc({under})"),
            }
            kc.stop_channels()
        finally:
            alive = km.is_alive()
            km.shutdown_kernel(now=True)
    cells["alive_at_end"] = alive
    cells["argv"] = km.kernel_spec.argv
    print(json.dumps(cells))


if __name__ == "__main__":
    main()
