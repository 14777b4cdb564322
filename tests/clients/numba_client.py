#!/usr/bin/env python3
"""An ordinary numba program (numba-cuda with NVIDIA's cuda-bindings, NVVM and runtime
wheels). It knows nothing about gpucap or the fake GPU: tests/real_clients/numba.rs runs it
on the fake GPU, with and without the shim, and reads its output.

Usage: numba_client.py [STEP...] where each STEP is
  info           the device count, each device's name, memory (from a context on it) and
                 compute capability
  meminfo        the current context's get_memory_info() (the driver's cuMemGetInfo)
  device:<n>     make device n current (numba.cuda.select_device)
  fill:<MiB>[:<n>]  allocate device arrays of that many MiB (numba.cuda.device_array)
                 until numba refuses, at most n (default 64); they are kept
  free           drop every array kept and let numba free them now (numba queues the
                 frees of dropped arrays; its memory manager's queue is flushed)
  copy:<MiB>     host -> device (numba.cuda.to_device) and back (.copy_to_host()) of that
                 many MiB of random bytes; compares
  hold           print `holding`, then wait for a line on stdin (the arrays stay)
  kernel         a @cuda.jit kernel (compiled by NVVM, loaded and launched on the fake:
                 not run)

Output, one fact per line:
  numba <numba-cuda version> driver=<cuDriverGetVersion>
  count <n>
  device <i> name=<name> total=<bytes> cc=<major>.<minor>
  mem_get_info free=<bytes> total=<bytes>
  alloc <MiB> ok | alloc <MiB> err <exception class> <CUresult name>
  filled <n> arrays
  freed
  copy <MiB> ok | copy <MiB> mismatch
  holding
  kernel ok shape=<n>
  done
Exit status 0 when every step ran (refusals included), 1 otherwise.
"""

import sys
from importlib.metadata import version

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

MIB = 1 << 20
held = []


@cuda.jit
def inc(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def result_name(e):
    """The CUresult a CudaAPIError carries, by name (CUDA_ERROR_OUT_OF_MEMORY)."""
    code = e.code
    return getattr(code, "name", None) or str(code)


def step(s):
    if s == "info":
        devices = list(cuda.gpus)
        print(f"count {len(devices)}", flush=True)
        for i, d in enumerate(devices):
            with d:
                ctx = cuda.current_context()
                total = ctx.get_memory_info().total
                name = d.name.decode() if isinstance(d.name, bytes) else d.name
                cc = d.compute_capability
                print(f"device {i} name={name.replace(' ', '_')} total={total} "
                      f"cc={cc[0]}.{cc[1]}", flush=True)
    elif s == "meminfo":
        free, total = cuda.current_context().get_memory_info()
        print(f"mem_get_info free={free} total={total}", flush=True)
    elif s.startswith("device:"):
        cuda.select_device(int(s.split(":")[1]))
    elif s.startswith("fill:"):
        parts = s.split(":")
        mib = int(parts[1])
        at_most = int(parts[2]) if len(parts) > 2 else 64
        n = 0
        for _ in range(at_most):
            try:
                held.append(cuda.device_array(mib * MIB, dtype=np.uint8))
                n += 1
                print(f"alloc {mib} ok", flush=True)
            except CudaAPIError as e:
                print(f"alloc {mib} err {type(e).__name__} {result_name(e)}", flush=True)
                break
        print(f"filled {n} arrays", flush=True)
    elif s == "free":
        held.clear()
        cuda.current_context().memory_manager.deallocations.clear()
        print("freed", flush=True)
    elif s.startswith("copy:"):
        mib = int(s.split(":")[1])
        host = np.random.default_rng(mib).integers(0, 256, size=mib * MIB, dtype=np.uint8)
        back = cuda.to_device(host).copy_to_host()
        same = back.shape == host.shape and bool((back == host).all())
        print(f"copy {mib} {'ok' if same else 'mismatch'}", flush=True)
    elif s == "hold":
        print("holding", flush=True)
        sys.stdin.readline()
    elif s == "kernel":
        x = cuda.device_array(1024, dtype=np.int32)
        inc[4, 256](x)
        cuda.synchronize()
        print(f"kernel ok shape={x.shape[0]}", flush=True)
    else:
        raise SystemExit(f"numba_client.py: unknown step {s!r}")


def main():
    from numba.cuda.cudadrv.driver import driver
    print(f"numba {version('numba-cuda')} driver={driver.get_version()}", flush=True)
    for s in sys.argv[1:]:
        step(s)
    print("done", flush=True)


if __name__ == "__main__":
    main()
