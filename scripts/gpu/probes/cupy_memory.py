"""probe.py cupy --cap N --pool default|async: CuPy under the cap: memGetInfo shows it, past
it cupy.cuda.memory.OutOfMemoryError, and after free_all_blocks() the memory fits again.
"""

import gc

from observer import report_physical
from verdicts import MiB, align2m, fail, first_line, info, mib, ok, shows_the_cap, skip


def cupy_filled(cp, nbytes, value):
    x = cp.empty(nbytes, dtype=cp.uint8)
    x.fill(value)
    cp.cuda.Device().synchronize()
    for part in (x[:4096], x[-4096:]):
        if not bool((cp.asnumpy(part) == value).all()):
            fail("a %s array filled with %d reads back different bytes" % (mib(nbytes), value))
    return x


def cupy_expect_oom(cp, nbytes, what):
    try:
        x = cp.empty(nbytes, dtype=cp.uint8)
        x.fill(1)
        cp.cuda.Device().synchronize()
    except cp.cuda.memory.OutOfMemoryError as e:
        info("%s: cupy.empty(%s) raised OutOfMemoryError: %s" % (what, mib(nbytes), first_line(e)))
        return
    except Exception as e:  # noqa: BLE001
        fail("%s: cupy.empty(%s) raised %s, not cupy.cuda.memory.OutOfMemoryError: %s"
             % (what, mib(nbytes), type(e).__name__, first_line(e)))
    del x
    fail("%s: cupy.empty(%s) succeeded past the cap" % (what, mib(nbytes)))


def cmd_cupy(a):
    cap = a.cap
    import cupy as cp
    info("cupy %s, pool %s" % (cp.__version__, a.pool))
    if a.pool == "async":
        if not hasattr(cp.cuda, "MemoryAsyncPool"):
            skip("CuPy %s has no cupy.cuda.MemoryAsyncPool" % cp.__version__)
        attr = getattr(cp.cuda.runtime, "cudaDevAttrMemoryPoolsSupported", 115)
        try:
            supported = cp.cuda.runtime.deviceGetAttribute(attr, cp.cuda.Device().id)
        except Exception as e:  # noqa: BLE001
            supported = None
            info("cudaDevAttrMemoryPoolsSupported unreadable: %s" % first_line(e))
        if supported == 0:
            skip("the GPU does not support stream-ordered memory pools")
        pool = cp.cuda.MemoryAsyncPool()
        cp.cuda.set_allocator(pool.malloc)
    else:
        pool = cp.get_default_memory_pool()
    free, total = cp.cuda.runtime.memGetInfo()
    shows_the_cap("cupy.cuda.runtime.memGetInfo()", "memGetInfo", free, total, cap)
    base = free  # what the process can use (the cap less what gpucap already charged)
    a_bytes = align2m(base * 0.5)
    x = cupy_filled(cp, a_bytes, 0x5A)
    report_physical("holding %s" % mib(a_bytes))
    b_bytes = align2m(base * 0.6)
    cupy_expect_oom(cp, b_bytes, "%s more, past the cap" % mib(b_bytes))
    cupy_expect_oom(cp, cap + 64 * MiB, "larger than the cap")
    x[: 1 << 20].fill(0x11)
    cp.cuda.Device().synchronize()
    if not bool((cp.asnumpy(x[:4096]) == 0x11).all()):
        fail("after the out-of-memory errors the first array no longer reads back")
    del x
    gc.collect()
    pool.free_all_blocks()
    free2, _ = cp.cuda.runtime.memGetInfo()
    info("after del + free_all_blocks(): memGetInfo free %s" % mib(free2))
    c_bytes = align2m(base * 0.8)
    y = cupy_filled(cp, c_bytes, 0x77)
    del y
    pool.free_all_blocks()
    ok("memGetInfo total = cap (%s); %s past the cap raised OutOfMemoryError (%s pool); "
       "%s allocated after free_all_blocks()" % (mib(cap), mib(b_bytes), a.pool, mib(c_bytes)))
