"""probe.py growth-holder and growth: growth mode on a real GPU. The holder (capped, PyTorch)
allocates, frees with empty_cache() and allocates again, each step when told to on stdin;
the observer (uncapped) watches the GPU's free memory meanwhile and fills the GPU before the
holder allocates again. mode=growth: the holder runs with --growth and keeps its footprint;
mode=release: without (the control: the memory comes back, which shows the measure works).
"""

import gc
import sys

from child import Child
from observer import Cuda
from probes.torch_memory import torch_filled, torch_oom_types
from verdicts import MiB, align2m, fail, figure, first_line, info, mib, ok, parse_kv


def cmd_growth_holder(a):
    """Allocates, frees + empty_cache(), re-allocates, each step when told to on stdin."""
    import torch
    small = torch.zeros(256, device="cuda")  # keeps the small-block segment alive throughout
    free0, _ = torch.cuda.mem_get_info()
    n = align2m(free0 * a.fraction)
    x = torch_filled(torch, n, 1)
    free, total = torch.cuda.mem_get_info()
    print("ALLOCATED bytes=%d free=%d total=%d" % (n, free, total), flush=True)
    sys.stdin.readline()
    del x
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    print("RELEASED free=%d total=%d" % (free, total), flush=True)
    sys.stdin.readline()
    types = torch_oom_types(torch)
    try:
        y = torch_filled(torch, n, 2)
        del y
        print("REALLOC ok", flush=True)
    except Exception as e:  # noqa: BLE001
        if (types and isinstance(e, types)) or "out of memory" in str(e).lower():
            print("REALLOC oom " + first_line(e).replace("\n", " "), flush=True)
        else:
            raise
    sys.stdin.readline()
    del small
    ok("holder done")


def cmd_growth(a):
    """Observer. mode=growth: the holder runs with --growth; mode=release: without (the
    control: memory comes back on empty_cache(), which shows the measure works)."""
    cap, mode = a.cap, a.mode
    holder = list(a.holder)
    if holder and holder[0] == "--":
        holder = holder[1:]
    if not holder:
        fail("no holder command given")
    cuda = Cuda()
    f0 = cuda.settled_free()
    info("observer (uncapped): free %s before the holder starts" % mib(f0))
    child = Child(holder + ["--fraction", "0.75"], timeout=a.timeout)
    ptrs = []
    try:
        held = parse_kv(child.expect("ALLOCATED"))
        n = int(held.get("bytes", 0))
        if n <= 0:
            fail("the holder did not say how much it allocated")
        if mode == "growth" and int(held.get("total", 0)) != cap:
            fail("the holder's mem_get_info total is %s, not the cap %d" % (held.get("total"), cap))
        f1 = cuda.settled_free()
        info("holder allocated %s: free %s (dropped by %s, its context included)" % (mib(n), mib(f1), mib(f0 - f1)))
        if f0 - f1 < n * 0.9:
            fail("the observer saw free memory drop by only %s when the holder allocated %s: "
                 "the measure does not work here (another process freeing memory?)" % (mib(f0 - f1), mib(n)))
        child.send("release")
        held_view = parse_kv(child.expect("RELEASED"))
        f2 = cuda.settled_free()
        back = f2 - f1
        info("holder freed it and called empty_cache(): free %s (%+.1f MiB); the holder's own view: free %s of %s"
             % (mib(f2), back / MiB, mib(int(held_view.get("free", 0))), mib(int(held_view.get("total", 0)))))
        figure("%s_given_back_bytes" % mode, back)
        if a.no_fill:
            taken = None
            info("--no-fill: not filling the GPU")
        else:
            ptrs, taken = cuda.fill_gpu()
            info("observer took all it could but %s: %s (free now %s)" % (mib(64 * MiB), mib(taken), mib(cuda.free_now())))
        child.send("realloc")
        realloc = child.expect("REALLOC")
        info("holder re-allocating %s: %s" % (mib(n), realloc))
    except BaseException:
        # the verdict is already FAIL: do not leave the holder holding memory
        child.kill()
        raise
    finally:
        for p in ptrs:
            cuda.release(p)
    child.send("exit")
    rc = child.finish()
    if rc not in (0, None):
        fail("the holder exited with status %s" % rc)
    if mode == "growth":
        if back > n / 4:
            fail("after empty_cache() %s came back to the GPU: growth mode did not keep the footprint" % mib(back))
        if taken is not None and taken > f1 + n / 4:
            fail("another process took %s with only %s free before the release: it got the held memory"
                 % (mib(taken), mib(f1)))
        if not realloc.startswith("ok"):
            fail("the holder could not re-allocate the %s it kept: %s" % (mib(n), realloc))
        ok("empty_cache() gave back %s of %s; %s; the holder re-allocated %s from what it kept"
           % (mib(max(back, 0)), mib(n),
              "another process then took all the rest (%s) and could not get it" % mib(taken)
              if taken is not None else "GPU not filled (--no-fill)", mib(n)))
    else:
        if back < n * 0.75:
            fail("without --growth, empty_cache() gave back only %s of %s (expected all of it): "
                 "the growth check's measure cannot tell" % (mib(back), mib(n)))
        if taken is not None and not realloc.startswith("oom"):
            fail("the GPU was filled by another process, yet the holder re-allocated %s: "
                 "the fill did not work, so the growth check's fill proves nothing" % mib(n))
        ok("without --growth, empty_cache() gave back %s of %s and another process could take it%s"
           % (mib(back), mib(n), " (the holder then got out of memory)" if taken is not None else ""))
