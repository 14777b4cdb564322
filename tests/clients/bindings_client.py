#!/usr/bin/env python3
"""An ordinary CUDA program written against NVIDIA's cuda-bindings driver API
(`from cuda.bindings import driver`, cuda-bindings 12.x and 13.x). It knows nothing
about gpucap: gpucap's end-to-end tests run it under the shim and read its output.

Usage: bindings_client.py [STEP...] where each STEP is
  <MiB>        cuMemAlloc that many MiB (kept until exit), then cuMemsetD8 it to
               zero, write a pattern at both ends with cuMemcpyHtoD and read it back
               with cuMemcpyDtoH
  async:<MiB>  the same with cuMemAllocAsync/cuMemcpyHtoDAsync on a stream
  free         release the most recent allocation still held (cuMemFree/cuMemFreeAsync)
  info         print the memory information again

Output, one fact per line (the same lines as tests/cudarc-client):
  bindings <version> driver_version=<N>
  device 0 total_mem=<bytes>
  mem_get_info free=<bytes> total=<bytes>
  alloc <MiB> ok | alloc <MiB> err <CUresult name> | alloc <MiB> data-mismatch
  alloc_async <MiB> ok | ... err <name> | alloc_async <MiB> unsupported
  free <MiB> ok
  done
Exit status: 0 when every step ran (refused allocations included), 1 when data read
back differs or an unexpected call failed, 2 on bad arguments, 3 when cuInit or the
context failed (`init err <CUresult name>`).
"""

import ctypes
import sys

from cuda.bindings import driver

try:
    from cuda.bindings import __version__ as BINDINGS_VERSION
except ImportError:  # pragma: no cover - very old releases
    BINDINGS_VERSION = "unknown"

MIB = 1 << 20
PROBE = MIB  # bytes written and read back at each end of an allocation
SUCCESS = driver.CUresult.CUDA_SUCCESS


class Unexpected(Exception):
    pass


def name(err):
    return getattr(err, "name", str(err))


def check(call, result):
    """cuda-bindings returns (CUresult, values...); raise unless it succeeded."""
    err = result[0]
    if err != SUCCESS:
        raise Unexpected(f"{call} {name(err)}")
    rest = result[1:]
    return rest[0] if len(rest) == 1 else rest


def roundtrip(dptr, size, seed, stream=None):
    """Zero the allocation, write a pattern at both ends, read it back."""
    dptr = int(dptr)
    n = min(PROBE, size)
    if stream is None:
        check("cuMemsetD8", driver.cuMemsetD8(dptr, 0, size))
    else:
        check("cuMemsetD8Async", driver.cuMemsetD8Async(dptr, 0, size, stream))
    ok = True
    for start in (0, size - n):
        pattern = (ctypes.c_ubyte * n)(*[((i * 31) + seed) & 0xFF for i in range(n)])
        back = (ctypes.c_ubyte * n)()
        if stream is None:
            check("cuMemcpyHtoD", driver.cuMemcpyHtoD(dptr + start, ctypes.addressof(pattern), n))
            check("cuMemcpyDtoH", driver.cuMemcpyDtoH(ctypes.addressof(back), dptr + start, n))
        else:
            check("cuMemcpyHtoDAsync",
                  driver.cuMemcpyHtoDAsync(dptr + start, ctypes.addressof(pattern), n, stream))
            check("cuMemcpyDtoHAsync",
                  driver.cuMemcpyDtoHAsync(ctypes.addressof(back), dptr + start, n, stream))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(stream))
        ok = ok and bytes(back) == bytes(pattern)
    if size > 2 * n:
        mid = (ctypes.c_ubyte * 1)(0xAA)
        check("cuMemcpyDtoH", driver.cuMemcpyDtoH(ctypes.addressof(mid), dptr + size // 2, 1))
        ok = ok and mid[0] == 0
    return ok


def info():
    free, total = check("cuMemGetInfo", driver.cuMemGetInfo())
    print(f"mem_get_info free={free} total={total}", flush=True)


def main(argv):
    steps = []
    for s in argv:
        kind, _, num = s.rpartition(":")
        if s in ("free", "info"):
            steps.append((s, 0))
        elif kind in ("", "async") and num.isdigit():
            steps.append((kind or "sync", int(num)))
        else:
            print(f"bindings_client: bad step {s!r}; expected <MiB>, async:<MiB>, free or info",
                  file=sys.stderr)
            return 2

    try:
        (err,) = driver.cuInit(0)
    except Exception as e:  # no libcuda.so.1, or it lacks cuGetProcAddress_v2
        print(f"init err {type(e).__name__}: {e}", flush=True)
        return 3
    if err != SUCCESS:
        print(f"init err {name(err)}", flush=True)
        return 3
    try:
        version = check("cuDriverGetVersion", driver.cuDriverGetVersion())
        print(f"bindings {BINDINGS_VERSION} driver_version={version}", flush=True)
        dev = check("cuDeviceGet", driver.cuDeviceGet(0))
        # The primary context: cuCtxCreate's signature differs between 12.x and 13.x.
        ctx = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
        check("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
    except Unexpected as e:
        print(f"init err {e}", flush=True)
        return 3

    try:
        return run(dev, steps)
    except Unexpected as e:
        print(f"unexpected err {e}", flush=True)
        return 1


def run(dev, steps):
    print(f"device 0 total_mem={check('cuDeviceTotalMem', driver.cuDeviceTotalMem(dev))}",
          flush=True)
    info()
    stream = None
    held = []  # (label, MiB, dptr, stream or None)
    all_ok = True
    for kind, mib in steps:
        if kind == "info":
            info()
        elif kind == "free":
            if not held:
                print("free none", flush=True)
                continue
            label, mib, dptr, s = held.pop()
            if s is None:
                check("cuMemFree", driver.cuMemFree(dptr))
            else:
                check("cuMemFreeAsync", driver.cuMemFreeAsync(dptr, s))
                check("cuStreamSynchronize", driver.cuStreamSynchronize(s))
            print(f"free {mib} ok", flush=True)
        else:
            label = "alloc" if kind == "sync" else "alloc_async"
            if kind == "async":
                if stream is None:
                    pools = check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
                        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev))
                    if not pools:
                        print(f"{label} {mib} unsupported", flush=True)
                        continue
                    stream = check("cuStreamCreate", driver.cuStreamCreate(0))
                err, dptr = driver.cuMemAllocAsync(mib * MIB, stream)
                s = stream
            else:
                err, dptr = driver.cuMemAlloc(mib * MIB)
                s = None
            if err != SUCCESS:
                print(f"{label} {mib} err {name(err)}", flush=True)
                continue
            if mib == 0 or roundtrip(dptr, mib * MIB, len(held), s):
                print(f"{label} {mib} ok", flush=True)
            else:
                print(f"{label} {mib} data-mismatch", flush=True)
                all_ok = False
            held.append((label, mib, dptr, s))
    info()
    while held:
        _, _, dptr, s = held.pop()
        if s is None:
            check("cuMemFree", driver.cuMemFree(dptr))
        else:
            check("cuMemFreeAsync", driver.cuMemFreeAsync(dptr, s))
    if stream is not None:
        check("cuStreamSynchronize", driver.cuStreamSynchronize(stream))
        check("cuStreamDestroy", driver.cuStreamDestroy(stream))
    if all_ok:
        print("done", flush=True)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
