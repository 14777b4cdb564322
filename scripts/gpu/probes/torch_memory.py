"""probe.py torch --cap N: PyTorch under the cap: torch.cuda.mem_get_info() shows it, an
allocation past it raises PyTorch's out-of-memory error, and after del + empty_cache() more
than half of it is allocated again (PYTORCH_CUDA_ALLOC_CONF, set by the caller, picks the
allocator). The helpers are shared with the growth holder.
"""

import gc
import os

from observer import report_physical
from verdicts import MiB, Outcome, align2m, fail, first_line, info, mib, ok, shows_the_cap, skip


def torch_oom_types(torch):
    types = []
    for mod in (torch, torch.cuda):
        t = getattr(mod, "OutOfMemoryError", None)
        if isinstance(t, type) and t not in types:
            types.append(t)
    return tuple(types)


def torch_expect_oom(torch, nbytes, what):
    """Allocates nbytes on the GPU, which must raise the out-of-memory error."""
    types = torch_oom_types(torch)
    try:
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - sorted out below
        if types and isinstance(e, types):
            info("%s: torch.empty(%s) raised %s.%s: %s"
                 % (what, mib(nbytes), type(e).__module__, type(e).__name__, first_line(e)))
            return type(e).__name__
        if isinstance(e, RuntimeError) and "out of memory" in str(e).lower():
            info("%s: torch.empty(%s) raised RuntimeError (out of memory): %s"
                 % (what, mib(nbytes), first_line(e)))
            return "RuntimeError(out of memory)"
        fail("%s: torch.empty(%s) raised %s, not an out-of-memory error: %s"
             % (what, mib(nbytes), type(e).__name__, first_line(e)))
    del x
    fail("%s: torch.empty(%s) succeeded past the cap" % (what, mib(nbytes)))


def torch_filled(torch, nbytes, value):
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    x.fill_(value)
    torch.cuda.synchronize()
    # slices of a 1-D tensor are contiguous: .cpu() copies without device memory
    for part in (x[:4096], x[-4096:]):
        if not bool((part.cpu() == value).all()):
            fail("a %s tensor filled with %d reads back different bytes" % (mib(nbytes), value))
    return x


def torch_version(torch):
    """(major, minor) of torch.__version__ ("2.5.1+cu124" -> (2, 5))."""
    try:
        return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return (0, 0)


def cmd_torch(a):
    cap = a.cap
    import torch
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    info("torch %s (CUDA %s), PYTORCH_CUDA_ALLOC_CONF=%r" % (torch.__version__, torch.version.cuda, conf))
    # An option this PyTorch does not know makes its first allocation raise: not gpucap's doing.
    if "expandable_segments" in conf and torch_version(torch) < (2, 1):
        skip("PyTorch %s has no expandable_segments (2.1 and later)" % torch.__version__)
    if "cudaMallocAsync" in conf and not hasattr(torch.cuda, "get_allocator_backend"):
        # (the backend and get_allocator_backend() came in the same change)
        skip("PyTorch %s has no backend:cudaMallocAsync" % torch.__version__)
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False under gpucap (it is True without)")
    free, total = torch.cuda.mem_get_info()
    shows_the_cap("torch.cuda.mem_get_info()", "torch.cuda.mem_get_info()", free, total, cap)
    async_backend = "cudaMallocAsync" in conf
    if async_backend:
        if torch.cuda.get_allocator_backend() != "cudaMallocAsync":
            fail("PYTORCH_CUDA_ALLOC_CONF=%s but the allocator backend is %s"
                 % (conf, torch.cuda.get_allocator_backend()))

    # Sizes are fractions of what the process can use at the start (the cap, less
    # whatever gpucap already charged it, e.g. its CUDA context).
    base = free
    a_bytes = align2m(base * 0.5)
    x = torch_filled(torch, a_bytes, 0x5A)
    free1, _ = torch.cuda.mem_get_info()
    info("with %s allocated: mem_get_info free %s" % (mib(a_bytes), mib(free1)))
    if free1 > cap - a_bytes:
        fail("mem_get_info free is %s with %s of the %s cap allocated" % (mib(free1), mib(a_bytes), mib(cap)))
    if "expandable_segments:True" in conf.replace(" ", ""):
        try:
            segs = torch.cuda.memory_snapshot()
        except Exception as e:  # noqa: BLE001
            segs = None
            info("torch.cuda.memory_snapshot() unavailable: %s" % first_line(e))
        if segs:
            flags = [s.get("is_expandable") for s in segs if "is_expandable" in s]
            if flags and not any(flags):
                fail("expandable_segments:True was asked for, but no segment is expandable")
            info("segments: %d, expandable: %s" % (len(segs), any(flags) if flags else "not reported"))
    report_physical("holding %s" % mib(a_bytes))

    b_bytes = align2m(base * 0.6)
    err = torch_expect_oom(torch, b_bytes, "%s more, past the cap" % mib(b_bytes))
    torch_expect_oom(torch, cap + 64 * MiB, "larger than the cap")

    # still working, and the cap is what torch reserved at most
    x[: 1 << 20].fill_(0x11)
    torch.cuda.synchronize()
    if not bool((x[:4096].cpu() == 0x11).all()):
        fail("after the out-of-memory errors the first tensor no longer reads back")
    try:
        reserved = torch.cuda.memory_reserved()
        info("torch.cuda.memory_reserved(): %s" % mib(reserved))
        if reserved > cap:
            fail("torch reserved %s, more than the %s cap" % (mib(reserved), mib(cap)))
    except Outcome:
        raise
    except Exception as e:  # noqa: BLE001 - not every backend keeps the statistic
        info("torch.cuda.memory_reserved() unavailable: %s" % first_line(e))

    # recovery: give the memory back and take more than half of the cap again
    del x
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info()
    info("after del + empty_cache(): mem_get_info free %s" % mib(free2))
    c_bytes = align2m(base * 0.8)
    y = torch_filled(torch, c_bytes, 0x77)
    try:
        peak = torch.cuda.max_memory_reserved()
        info("torch.cuda.max_memory_reserved(): %s" % mib(peak))
        if peak > cap:
            fail("torch's peak reservation %s is more than the %s cap" % (mib(peak), mib(cap)))
    except Outcome:
        raise
    except Exception as e:  # noqa: BLE001
        info("torch.cuda.max_memory_reserved() unavailable: %s" % first_line(e))
    del y
    torch.cuda.empty_cache()
    ok("mem_get_info total = cap (%s); %s past the cap raised %s; after empty_cache() %s allocated"
       % (mib(cap), mib(b_bytes), err, mib(c_bytes)))
