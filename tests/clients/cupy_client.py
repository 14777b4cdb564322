#!/usr/bin/env python3
"""An ordinary CuPy program (cupy-cuda13x with NVIDIA's CUDA runtime wheel). It knows
nothing about gpucap or the fake GPU: tests/real_clients/cupy.rs runs it on the fake GPU, with
and without the shim, and reads its output.

Usage: cupy_client.py [deepbind] [STEP...] where `deepbind` first opens every extension
module with RTLD_DEEPBIND (sys.setdlopenflags before `import cupy`, as programs do to keep
two copies of a library's symbols apart), and each STEP is
  info           the device count, each device's name, memory and compute capability
  meminfo        cupy.cuda.runtime.memGetInfo() of the current device
  device:<n>     make device n current (cupy.cuda.Device(n).use())
  fill:<MiB>     allocate arrays of that many MiB through CuPy's memory pool until CuPy
                 refuses (cupy.cuda.memory.OutOfMemoryError), at most 64; they are kept
  free           drop every array kept and empty the pool (free_all_blocks)
  copy:<MiB>     host -> device (cupy.asarray) and back (.get()) of that many MiB of
                 random bytes; compares
  kernel         an elementwise kernel (compiled by NVRTC, launched on the fake: not run)

Output, one fact per line:
  cupy <version> runtime=<cudaRuntimeGetVersion> driver=<cudaDriverGetVersion>
  count <n>
  device <i> name=<name> total=<bytes> cc=<major>.<minor>
  mem_get_info free=<bytes> total=<bytes>
  alloc <MiB> ok | alloc <MiB> err <exception class>
  filled <n> arrays pool_used=<bytes> pool_total=<bytes>
  freed pool_used=<bytes> pool_total=<bytes>
  copy <MiB> ok | copy <MiB> mismatch
  kernel ok shape=<n>
  done
Exit status 0 when every step ran (refusals included), 1 otherwise.
"""

import os
import sys

if sys.argv[1:2] == ["deepbind"]:
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_DEEPBIND)
    del sys.argv[1]

import cupy  # noqa: E402 (after the dlopen flags)
import numpy as np  # noqa: E402

MIB = 1 << 20
held = []


def step(s):
    rt = cupy.cuda.runtime
    if s == "info":
        n = rt.getDeviceCount()
        print(f"count {n}", flush=True)
        for i in range(n):
            p = rt.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            print(f"device {i} name={name.replace(' ', '_')} total={p['totalGlobalMem']} "
                  f"cc={p['major']}.{p['minor']}", flush=True)
    elif s == "meminfo":
        free, total = rt.memGetInfo()
        print(f"mem_get_info free={free} total={total}", flush=True)
    elif s.startswith("device:"):
        cupy.cuda.Device(int(s.split(":")[1])).use()
    elif s.startswith("fill:"):
        mib = int(s.split(":")[1])
        n = 0
        for _ in range(64):
            try:
                held.append(cupy.empty(mib * MIB, dtype=cupy.uint8))
                n += 1
                print(f"alloc {mib} ok", flush=True)
            except cupy.cuda.memory.OutOfMemoryError as e:
                print(f"alloc {mib} err {type(e).__name__}", flush=True)
                break
        pool = cupy.get_default_memory_pool()
        print(f"filled {n} arrays pool_used={pool.used_bytes()} pool_total={pool.total_bytes()}",
              flush=True)
    elif s == "free":
        held.clear()
        pool = cupy.get_default_memory_pool()
        pool.free_all_blocks()
        print(f"freed pool_used={pool.used_bytes()} pool_total={pool.total_bytes()}", flush=True)
    elif s.startswith("copy:"):
        mib = int(s.split(":")[1])
        host = np.random.default_rng(mib).integers(0, 256, size=mib * MIB, dtype=np.uint8)
        dev = cupy.asarray(host)
        back = dev.get()
        same = back.shape == host.shape and bool((back == host).all())
        print(f"copy {mib} {'ok' if same else 'mismatch'}", flush=True)
        del dev
    elif s == "kernel":
        a = cupy.arange(1024, dtype=cupy.float32)
        b = a * 2 + 1  # compiled and launched; the fake does not run it
        cupy.cuda.Device().synchronize()
        print(f"kernel ok shape={b.shape[0]}", flush=True)
    else:
        print(f"bad step {s!r}", file=sys.stderr)
        sys.exit(2)


def main():
    rt = cupy.cuda.runtime
    print(f"cupy {cupy.__version__} runtime={rt.runtimeGetVersion()} driver={rt.driverGetVersion()}",
          flush=True)
    for s in sys.argv[1:]:
        step(s)
    print("done", flush=True)


if __name__ == "__main__":
    main()
