#!/usr/bin/env python3
"""An ordinary PyTorch program (the CUDA build of torch from PyPI). It knows nothing about
gpucap or the fake GPU: scripts/dev/frameworks.sh runs it on the fake GPU, with and without the
shim, and reads its output.

Usage: torch_client.py [STEP...] where each STEP is
  info           is_available, device count, each device's properties
  meminfo        torch.cuda.mem_get_info() of the current device
  device:<n>     torch.cuda.set_device(n)
  fraction:<f>   torch.cuda.set_per_process_memory_fraction(f)
  fill:<MiB>     torch.empty of that many MiB on the current device until PyTorch refuses
                 (torch.OutOfMemoryError), at most 64; the tensors are kept
  threads:<MiB>x<n>  n tensors of that many MiB made on 4 worker threads (a loader's
                 ThreadPoolExecutor: no CUDA context is current on them), each kept
                 or refused
  free           drop the tensors, then torch.cuda.empty_cache()
  stats          memory_allocated / memory_reserved / the allocator backend
  copy:<MiB>     tensor.cuda() and .cpu() of that many MiB of random bytes; compares
  kernel         an elementwise kernel (launched on the fake: not run)
  green:<sms>    a green context of that many SMs (torch.cuda.green_contexts, CUDA 12.4),
                 a tensor of 1 MiB made and a kernel launched on a stream of it; kept

Output, one fact per line:
  torch <version> cuda=<torch.version.cuda> backend=<allocator backend>
  available <bool> count <n>
  device <i> name=<name> total=<bytes> cc=<major>.<minor>
  mem_get_info free=<bytes> total=<bytes>
  alloc <MiB> ok | alloc <MiB> err <exception class>
  thread alloc <MiB> ok | thread alloc <MiB> err <exception class>
  stats allocated=<bytes> reserved=<bytes>
  freed allocated=<bytes> reserved=<bytes>
  copy <MiB> ok | copy <MiB> mismatch
  kernel ok
  green <sms> ok sms=<its SMs>
  done
"""

import sys

import torch

MIB = 1 << 20
held = []


def step(s):
    if s == "info":
        n = torch.cuda.device_count()
        print(f"available {torch.cuda.is_available()} count {n}", flush=True)
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            print(f"device {i} name={p.name.replace(' ', '_')} total={p.total_memory} "
                  f"cc={p.major}.{p.minor}", flush=True)
    elif s == "meminfo":
        free, total = torch.cuda.mem_get_info()
        print(f"mem_get_info free={free} total={total}", flush=True)
    elif s.startswith("device:"):
        torch.cuda.set_device(int(s.split(":")[1]))
    elif s.startswith("fraction:"):
        torch.cuda.set_per_process_memory_fraction(float(s.split(":")[1]))
    elif s.startswith("fill:"):
        mib = int(s.split(":")[1])
        for _ in range(64):
            try:
                held.append(torch.empty(mib * MIB, dtype=torch.uint8, device="cuda"))
                print(f"alloc {mib} ok", flush=True)
            except torch.OutOfMemoryError as e:
                print(f"alloc {mib} err {type(e).__name__}", flush=True)
                break
    elif s.startswith("threads:"):
        from concurrent.futures import ThreadPoolExecutor
        mib, n = (int(x) for x in s.split(":")[1].split("x"))

        def load(_):
            return torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")

        with ThreadPoolExecutor(4) as pool:
            for f in [pool.submit(load, i) for i in range(n)]:
                try:
                    held.append(f.result())
                    print(f"thread alloc {mib} ok", flush=True)
                except torch.OutOfMemoryError as e:
                    print(f"thread alloc {mib} err {type(e).__name__}", flush=True)
    elif s == "stats":
        print(f"stats allocated={torch.cuda.memory_allocated()} "
              f"reserved={torch.cuda.memory_reserved()}", flush=True)
    elif s == "free":
        held.clear()
        torch.cuda.empty_cache()
        print(f"freed allocated={torch.cuda.memory_allocated()} "
              f"reserved={torch.cuda.memory_reserved()}", flush=True)
    elif s.startswith("copy:"):
        mib = int(s.split(":")[1])
        g = torch.Generator().manual_seed(mib)
        host = torch.randint(0, 256, (mib * MIB,), dtype=torch.uint8, generator=g)
        dev = host.cuda()
        back = dev.cpu()
        print(f"copy {mib} {'ok' if torch.equal(back, host) else 'mismatch'}", flush=True)
        del dev
    elif s == "kernel":
        a = torch.ones(1024, device="cuda")
        b = a * 2 + 1  # launched; the fake does not run it
        torch.cuda.synchronize()
        print(f"kernel ok shape={b.shape[0]}", flush=True)
    elif s.startswith("green:"):
        from torch.cuda.green_contexts import GreenContext
        g = GreenContext.create(num_sms=int(s.split(":")[1]))
        with torch.cuda.stream(g.Stream()):
            held.append(torch.ones(MIB // 4, device="cuda") * 2)
        torch.cuda.synchronize()
        held.append(g)
        print(f"green {s.split(':')[1]} ok sms={g.sm_count}", flush=True)
    else:
        print(f"bad step {s!r}", file=sys.stderr)
        sys.exit(2)


def main():
    backend = torch.cuda.get_allocator_backend() if torch.cuda.is_available() else "none"
    print(f"torch {torch.__version__} cuda={torch.version.cuda} backend={backend}", flush=True)
    for s in sys.argv[1:]:
        step(s)
    print("done", flush=True)


if __name__ == "__main__":
    main()
