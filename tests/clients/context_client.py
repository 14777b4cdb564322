#!/usr/bin/env python3
"""An ordinary cuda-bindings program (12.x and 13.x) that makes and ends CUDA contexts
in a loop, leaving an allocation live in each, as bindings that manage contexts
themselves do (pycuda-style code ends the contexts it created with cuCtxDetach). It
knows nothing about gpucap.

Usage: context_client.py <how> <rounds> <MiB>
  <how>: detach   cuCtxCreate, then cuCtxDetach (its only reference)
         attach   cuCtxCreate, cuCtxAttach, cuCtxDetach twice (the context lives
                  until the second)
         destroy  cuCtxCreate, then cuCtxDestroy
         release  cuDevicePrimaryCtxRetain, then cuDevicePrimaryCtxRelease
         reset    cuDevicePrimaryCtxRetain, then cuDevicePrimaryCtxReset

Each round allocates <MiB> with cuMemAlloc in the new context and never frees it: the
driver frees it with the context. Output, one fact per line:
  start free=<bytes> total=<bytes>      cuMemGetInfo in a context that stays
  round <n> free=<bytes>                the same after the round's context ended
  round <n> err <where> <CUresult name> a call failed (the loop stops)
  done
Exit status 0 when every round ran, 1 otherwise, 3 when cuInit failed.
"""

import sys

from cuda.bindings import driver

MIB = 1 << 20
SUCCESS = driver.CUresult.CUDA_SUCCESS


class Failed(Exception):
    pass


def check(where, result):
    err = result[0]
    if err != SUCCESS:
        raise Failed(f"{where} {getattr(err, 'name', err)}")
    rest = result[1:]
    return rest[0] if len(rest) == 1 else rest


def create(dev):
    """cuCtxCreate: (flags, dev) in 12.x, (params, flags, dev) in 13.x."""
    try:
        return check("cuCtxCreate", driver.cuCtxCreate(None, 0, dev))
    except TypeError:
        return check("cuCtxCreate", driver.cuCtxCreate(0, dev))


def free_with(ctx):
    check("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
    free, total = check("cuMemGetInfo", driver.cuMemGetInfo())
    return free, total


def main(argv):
    if len(argv) != 3 or argv[0] not in ("detach", "attach", "destroy", "release", "reset"):
        print(__doc__, file=sys.stderr)
        return 2
    how, rounds, mib = argv[0], int(argv[1]), int(argv[2])
    (err,) = driver.cuInit(0)
    if err != SUCCESS:
        print(f"init err {getattr(err, 'name', err)}", flush=True)
        return 3
    dev = check("cuDeviceGet", driver.cuDeviceGet(0))
    primary = how in ("release", "reset")
    # A context that stays, to read the free memory with.
    observer = create(dev) if primary else check(
        "cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
    start, total = free_with(observer)
    print(f"start free={start} total={total}", flush=True)
    for n in range(rounds):
        try:
            if primary:
                ctx = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(dev))
                check("cuCtxSetCurrent", driver.cuCtxSetCurrent(ctx))
            else:
                ctx = create(dev)
            check("cuMemAlloc", driver.cuMemAlloc(mib * MIB))
            if how == "detach":
                check("cuCtxDetach", driver.cuCtxDetach(ctx))
            elif how == "attach":
                again = check("cuCtxAttach", driver.cuCtxAttach(0))
                check("cuCtxDetach", driver.cuCtxDetach(ctx))
                held, _ = free_with(ctx)
                print(f"round {n} attached free={held}", flush=True)
                check("cuCtxDetach", driver.cuCtxDetach(again))
            elif how == "destroy":
                check("cuCtxDestroy", driver.cuCtxDestroy(ctx))
            elif how == "release":
                check("cuDevicePrimaryCtxRelease", driver.cuDevicePrimaryCtxRelease(dev))
            else:
                check("cuDevicePrimaryCtxReset", driver.cuDevicePrimaryCtxReset(dev))
            free, _ = free_with(observer)
        except Failed as e:
            print(f"round {n} err {e}", flush=True)
            return 1
        print(f"round {n} free={free}", flush=True)
    if primary:
        check("cuCtxDestroy", driver.cuCtxDestroy(observer))
    else:
        check("cuDevicePrimaryCtxRelease", driver.cuDevicePrimaryCtxRelease(dev))
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
