"""probe.py numba --cap N: numba-cuda under the cap: get_memory_info() shows it, past it
CudaAPIError CUDA_ERROR_OUT_OF_MEMORY, and after numba's pending frees the memory fits again.
"""

import gc

from observer import report_physical
from verdicts import MiB, align2m, fail, first_line, info, mib, ok, shows_the_cap


def numba_filled(cuda, np, nbytes, value):
    """A device array of nbytes holding value, written by a copy from the host (on the
    fake GPU too, where kernels do not run), its two ends read back."""
    x = cuda.to_device(np.full(nbytes, value, dtype=np.uint8))
    for part in (x[:4096], x[-4096:]):
        if not bool((part.copy_to_host() == value).all()):
            fail("a %s array filled with %d reads back different bytes" % (mib(nbytes), value))
    return x


def numba_expect_oom(cuda, nbytes, what):
    from numba.cuda.cudadrv.driver import CudaAPIError
    try:
        x = cuda.device_array(nbytes, dtype="uint8")
    except CudaAPIError as e:
        code = getattr(e.code, "name", str(e.code))
        if code != "CUDA_ERROR_OUT_OF_MEMORY":
            fail("%s: cuda.device_array(%s) raised CudaAPIError %s, not CUDA_ERROR_OUT_OF_MEMORY"
                 % (what, mib(nbytes), code))
        info("%s: cuda.device_array(%s) raised CudaAPIError %s" % (what, mib(nbytes), code))
        return
    except Exception as e:  # noqa: BLE001
        fail("%s: cuda.device_array(%s) raised %s, not CudaAPIError: %s"
             % (what, mib(nbytes), type(e).__name__, first_line(e)))
    del x
    fail("%s: cuda.device_array(%s) succeeded past the cap" % (what, mib(nbytes)))


def cmd_numba(a):
    cap = a.cap
    import numpy as np
    from importlib.metadata import version
    from numba import cuda
    info("numba-cuda %s" % version("numba-cuda"))
    ctx = cuda.current_context()
    free, total = ctx.get_memory_info()
    shows_the_cap("get_memory_info()", "get_memory_info", free, total, cap)
    base = free  # what the process can use (the cap less what gpucap already charged)
    a_bytes = align2m(base * 0.5)
    x = numba_filled(cuda, np, a_bytes, 0x5A)
    report_physical("holding %s" % mib(a_bytes))
    b_bytes = align2m(base * 0.6)
    numba_expect_oom(cuda, b_bytes, "%s more, past the cap" % mib(b_bytes))
    numba_expect_oom(cuda, cap + 64 * MiB, "larger than the cap")
    x[:4096].copy_to_device(np.full(4096, 0x11, dtype=np.uint8))
    if not bool((x[:4096].copy_to_host() == 0x11).all()):
        fail("after the out-of-memory errors the first array no longer reads back")
    del x
    gc.collect()
    ctx.memory_manager.deallocations.clear()  # numba queues frees; this flushes them
    free2, _ = ctx.get_memory_info()
    info("after del + the pending frees: get_memory_info free %s" % mib(free2))
    c_bytes = align2m(base * 0.8)
    y = numba_filled(cuda, np, c_bytes, 0x77)
    del y
    ok("get_memory_info total = cap (%s); %s past the cap raised CudaAPIError "
       "CUDA_ERROR_OUT_OF_MEMORY; %s allocated after the frees" % (mib(cap), mib(b_bytes), mib(c_bytes)))
