#!/usr/bin/env python3
"""A GPU client driven by lines on stdin, for the pool and growth checks of scripts/gpu/:
the same choreography runs with the driver API through ctypes (`--client driver`: the
fake GPU in CI, or any NVIDIA driver) and with PyTorch (`--client torch`: a real GPU).

  member.py --client driver|torch [--caching]

Prints `STARTED pid=P` once imported, then answers each command with one line:
  init          READY pid=P free=F total=T     (creates the CUDA context; cuMemGetInfo)
  alloc N       ALLOC ok N ms=M | ALLOC oom N ms=M MESSAGE
  small N K     SMALL ok N K | SMALL oom N K I   (N blocks of K bytes, kept)
  free          FREED B                        (frees every block held; torch: then
                                                empty_cache(), unless --caching)
  info          INFO free=F total=T
  quit          exits 0
An unknown command or a failing call other than out-of-memory prints `ERROR ...` and
exits 1. `--caching`: torch keeps its caching allocator's cache at `free`.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class DriverClient:
    """cuMemAlloc_v2 / cuMemFree_v2 through ctypes (observer.Cuda), device 0."""

    def __init__(self):
        import observer
        self.observer = observer
        self.cuda = None
        self.held = []

    def init(self):
        self.cuda = self.observer.Cuda()

    def info(self):
        return self.cuda.mem_info()

    def alloc(self, n):
        p = self.cuda.alloc(n)
        if p is None:
            return "cuMemAlloc_v2 refused"
        self.held.append((p, n))
        return None

    def free(self, _caching):
        total = sum(n for _, n in self.held)
        for p, _ in reversed(self.held):
            self.cuda.release(p)
        self.held = []
        return total


class TorchClient:
    """torch.empty(N, uint8) on cuda:0; OutOfMemoryError is the refusal."""

    def __init__(self):
        import torch
        self.torch = torch
        self.held = []

    def init(self):
        self.torch.cuda.init()
        self.torch.cuda.mem_get_info()  # the primary context, no allocation

    def info(self):
        return self.torch.cuda.mem_get_info()

    def alloc(self, n):
        torch = self.torch
        try:
            x = torch.empty(n, dtype=torch.uint8, device="cuda")
            x[:1].fill_(1)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - out of memory is the expected refusal
            if "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError":
                return "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:200])
            raise
        self.held.append((x, n))
        return None

    def free(self, caching):
        total = sum(n for _, n in self.held)
        self.held = []
        if not caching:
            self.torch.cuda.empty_cache()
        return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--client", choices=("driver", "torch"), required=True)
    p.add_argument("--caching", action="store_true")
    a = p.parse_args()
    client = DriverClient() if a.client == "driver" else TorchClient()
    out = sys.stdout
    out.write("STARTED pid=%d\n" % os.getpid())
    out.flush()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        if cmd == "init":
            client.init()
            free, total = client.info()
            out.write("READY pid=%d free=%d total=%d\n" % (os.getpid(), free, total))
        elif cmd == "alloc" and len(words) == 2:
            n = int(words[1])
            t = time.monotonic()
            why = client.alloc(n)
            ms = (time.monotonic() - t) * 1e3
            if why is None:
                out.write("ALLOC ok %d ms=%.1f\n" % (n, ms))
            else:
                out.write("ALLOC oom %d ms=%.1f %s\n" % (n, ms, why))
        elif cmd == "small" and len(words) == 3:
            count, size = int(words[1]), int(words[2])
            for i in range(count):
                if client.alloc(size) is not None:
                    out.write("SMALL oom %d %d %d\n" % (count, size, i))
                    break
            else:
                out.write("SMALL ok %d %d\n" % (count, size))
        elif cmd == "free":
            out.write("FREED %d\n" % client.free(a.caching))
        elif cmd == "info":
            free, total = client.info()
            out.write("INFO free=%d total=%d\n" % (free, total))
        elif cmd == "quit":
            return 0
        else:
            out.write("ERROR unknown command %r\n" % line.strip())
            out.flush()
            return 1
        out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - the driver sees one line, then exit 1
        print("ERROR %s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else ""),
              flush=True)
        sys.exit(1)
