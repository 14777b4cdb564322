"""probe.py jax-preallocate|jax-grow --cap N: JAX under the cap: XLA's preallocated pool is
its fraction of the cap, not of the GPU; growing arrays past the cap fails with
RESOURCE_EXHAUSTED, and the memory freed fits again.
"""

import gc
import os

from observer import report_physical
from verdicts import Outcome, align2m, fail, figure, first_line, info, mib, ok


def jax_gpu_device(jax):
    d = jax.devices()[0]
    if d.platform not in ("gpu", "cuda"):
        fail("JAX's first device is %s (platform %s), not the GPU, under gpucap" % (d, d.platform))
    return d


def cmd_jax_preallocate(a):
    cap = a.cap
    import jax
    import jax.numpy as jnp
    info("jax %s; XLA_PYTHON_CLIENT_PREALLOCATE=%r XLA_PYTHON_CLIENT_MEM_FRACTION=%r XLA_CLIENT_MEM_FRACTION=%r"
         % (jax.__version__, os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
            os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"), os.environ.get("XLA_CLIENT_MEM_FRACTION")))
    d = jax_gpu_device(jax)
    x = (jnp.arange(1 << 20, dtype=jnp.float32) * 2.0).block_until_ready()
    if float(x[12345]) != 24690.0:
        fail("a small JAX computation gave a wrong result")
    stats = d.memory_stats()
    if not stats:
        fail("jax.devices()[0].memory_stats() returned nothing")
    info("memory_stats: " + ", ".join("%s=%s" % (k, stats[k]) for k in sorted(stats)
                                       if k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use",
                                                "bytes_reserved", "pool_bytes", "largest_free_block_bytes")))
    limit = stats.get("bytes_limit")
    if limit is None:
        fail("memory_stats() has no bytes_limit")
    figure("jax_bytes_limit", limit)
    report_physical("JAX preallocated")
    if limit > cap:
        fail("XLA's pool limit is %s, more than the %s cap: it took its fraction of the GPU"
             % (mib(limit), mib(cap)))
    if limit < cap // 2:
        fail("XLA's pool limit is %s, less than half the %s cap (default fraction 0.75 expected)"
             % (mib(limit), mib(cap)))
    ok("XLA's preallocated pool (bytes_limit) is %s = %.2f of the %s cap" % (mib(limit), limit / cap, mib(cap)))


def jax_is_oom(e):
    s = str(e)
    return "RESOURCE_EXHAUSTED" in s or "out of memory" in s.lower() or "CUDA_ERROR_OUT_OF_MEMORY" in s


def cmd_jax_grow(a):
    cap = a.cap
    import jax
    import jax.numpy as jnp
    info("jax %s; XLA_PYTHON_CLIENT_PREALLOCATE=%r XLA_PYTHON_CLIENT_ALLOCATOR=%r"
         % (jax.__version__, os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
            os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR")))
    d = jax_gpu_device(jax)
    chunk = align2m(cap / 8)
    n = chunk // 4
    arrays, total, err = [], 0, None
    for i in range(24):
        try:
            arr = jnp.full((n,), float(i + 1), dtype=jnp.float32)
            arr.block_until_ready()
        except Exception as e:  # noqa: BLE001 - sorted out below
            err = e
            break
        arrays.append(arr)
        total += chunk
    info("allocated %d arrays of %s (%s) before the error" % (len(arrays), mib(chunk), mib(total)))
    if err is None:
        fail("allocated %s in arrays, past the %s cap, without an error" % (mib(total), mib(cap)))
    info("error: %s: %s" % (type(err).__name__, first_line(err)))
    if not jax_is_oom(err):
        fail("allocating past the cap raised %s, not RESOURCE_EXHAUSTED: %s" % (type(err).__name__, first_line(err)))
    if total > cap:
        fail("%s of arrays were allocated under a %s cap" % (mib(total), mib(cap)))
    if total < cap // 4:
        fail("the first error came at %s, less than a quarter of the %s cap" % (mib(total), mib(cap)))
    try:
        stats = d.memory_stats() or {}
        info("memory_stats: bytes_limit=%s peak_bytes_in_use=%s"
             % (stats.get("bytes_limit"), stats.get("peak_bytes_in_use")))
    except Exception as e:  # noqa: BLE001
        info("memory_stats() unavailable: %s" % first_line(e))
    report_physical("JAX at its peak")
    # Recovery: free them and allocate again. The platform allocator gives freed memory
    # back to the driver, so most of it fits again as one array. XLA's BFC allocator
    # (the default) keeps its regions and cannot join two into one larger block: on the
    # first H200 run one array of 3/4 of the total did not fit in the freed 256 MiB pieces
    # (BFC's own limit, as without gpucap), so there the same arrays must fit again.
    count = len(arrays)
    for arr in arrays:
        arr.delete()
    del arrays
    gc.collect()
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") == "platform":
        sizes = [align2m(total * 0.75)]
    else:
        sizes = [chunk] * count
    again = []
    try:
        for size in sizes:
            y = jnp.full((size // 4,), 3.0, dtype=jnp.float32).block_until_ready()
            if float(y[-1]) != 3.0:
                fail("after the error, a new array reads back wrong")
            again.append(y)
    except Outcome:
        raise
    except Exception as e:  # noqa: BLE001
        fail("after freeing the arrays, allocating %s (%d of %d arrays of %s fitted) failed: %s"
             % (mib(sum(sizes)), len(again), len(sizes), mib(sizes[0]), first_line(e)))
    ok("%s in %s arrays fitted; the next one raised %s (RESOURCE_EXHAUSTED); %s allocated again after freeing (%d array%s)"
       % (mib(total), mib(chunk), type(err).__name__, mib(sum(sizes)), len(sizes), "" if len(sizes) == 1 else "s"))
