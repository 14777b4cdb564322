#!/usr/bin/env python3
"""Diagnostic (raw driver, no gpucap): does the driver keep a process's memory while a
forked child that never uses CUDA (a DataLoader worker) still holds its device files?

For each way the parent ends, a parent makes its primary context (driver API through
ctypes), allocates BLOCK, forks a child that sleeps, and then:
  kill    is SIGKILLed;
  exit    exits normally (sys.exit: exit handlers run, its context is never destroyed);
  reset   releases and resets its primary context, then exits normally.
Printed per way: what NVML's device used figure held above the baseline 0.5 s after the
parent was gone (the child alive), whether NVML still lists the parent's pid then, and how
long after the child's SIGKILL the figure came back to the baseline. gpucap holds a dead
pool member's bytes while its forked children live (docs/src/pools.md, "fork, exec,
threads"); whether a normal exit should too is what the `exit` line answers.

  python3 scripts/gpu/diag/fork-hold.py [--block-mib 512]

On the fake GPU: LD_LIBRARY_PATH=target/release/fakecuda FAKECUDA_SHARED=/tmp/fake-state
(the fake's driver frees a process's memory at a normal exit, and at a kill only once its
children are gone).
"""
import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from nvml_ctypes import Nvml  # noqa: E402
from pool_storm import alloc, context, driver  # noqa: E402

MiB = 1 << 20


def parent(mode, block):
    L = driver()
    context(L)  # exits with an ERROR line where it fails
    rc, _ = alloc(L, block)
    if rc != 0:
        print("ERROR the block -> %d" % rc, flush=True)
        return 1
    child = os.fork()
    if child == 0:
        # Holds every inherited descriptor, the driver's among them, and never uses CUDA.
        time.sleep(3600)
        os._exit(0)
    print("READY %d" % child, flush=True)
    sys.stdin.readline()
    if mode == "reset":
        L.cuDevicePrimaryCtxRelease_v2(0)
        L.cuDevicePrimaryCtxReset_v2(0)
    return 0


def one(mode, block, nvml, h):
    base = nvml.memory(h)[2]
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--parent", mode, str(block)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("READY "):
        print("%-5s the parent: %s" % (mode, line or "no output"), flush=True)
        p.kill()
        return
    child = int(line.split()[1])
    held = nvml.memory(h)[2] - base
    if mode == "kill":
        p.send_signal(signal.SIGKILL)
    else:
        p.stdin.write("go\n")
        p.stdin.flush()
    p.wait()
    time.sleep(0.5)
    after = nvml.memory(h)[2] - base
    listed = p.pid in nvml.processes(h)
    os.kill(child, signal.SIGKILL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and nvml.memory(h)[2] > base + MiB:
        time.sleep(0.002)
    back = nvml.memory(h)[2] - base
    print("%-5s parent held %.0f MiB; 0.5 s after it was gone, its child alive: %.0f MiB still used, "
          "NVML lists the parent: %s; after the child's SIGKILL: %.0f MiB, %.0f ms later"
          % (mode, held / MiB, after / MiB, "yes" if listed else "no", back / MiB,
             1000 * (time.monotonic() - t0)), flush=True)


def main(argv):
    if argv[:1] == ["--parent"]:
        return parent(argv[1], int(argv[2]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--block-mib", type=int, default=512)
    a = ap.parse_args(argv)
    nvml = Nvml()
    h = nvml.handle(os.environ.get("CUDA_VISIBLE_DEVICES") or 0)
    for mode in ("kill", "exit", "reset"):
        one(mode, a.block_mib * MiB, nvml, h)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
