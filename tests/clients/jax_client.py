#!/usr/bin/env python3
"""An ordinary JAX program (jax[cuda13] from PyPI). It knows nothing about gpucap or the fake
GPU: scripts/dev/frameworks.sh runs it on the fake GPU, with and without the shim.

Usage: jax_client.py [STEP...] where each STEP is
  info         jax.devices() and each device's memory_stats()
  fill:<MiB>   jax.device_put of that many MiB until XLA refuses (RESOURCE_EXHAUSTED), at
               most 64; the arrays are kept
  copy:<MiB>   device_put and back (np.asarray) of that many MiB of random bytes; compares

Output, one fact per line:
  jax <version> backend=<default backend>
  device <i> kind=<device_kind> platform=<platform>
  memory <i> limit=<bytes_limit> in_use=<bytes_in_use> peak=<peak_bytes_in_use>
  alloc <MiB> ok | alloc <MiB> err <exception class> RESOURCE_EXHAUSTED
  copy <MiB> ok | copy <MiB> mismatch
  done
"""

import sys

import jax
import numpy as np

MIB = 1 << 20
held = []


def memory(i, d):
    s = d.memory_stats() or {}
    print(f"memory {i} limit={s.get('bytes_limit', -1)} in_use={s.get('bytes_in_use', -1)} "
          f"peak={s.get('peak_bytes_in_use', -1)}", flush=True)


def step(s):
    if s == "info":
        for i, d in enumerate(jax.devices()):
            print(f"device {i} kind={d.device_kind.replace(' ', '_')} platform={d.platform}",
                  flush=True)
            memory(i, d)
    elif s.startswith("fill:"):
        mib = int(s.split(":")[1])
        for _ in range(64):
            try:
                x = jax.device_put(np.zeros(mib * MIB, dtype=np.uint8))
                x.block_until_ready()
                held.append(x)
                print(f"alloc {mib} ok", flush=True)
            except Exception as e:  # XlaRuntimeError / JaxRuntimeError
                kind = "RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in str(e) else "other"
                print(f"alloc {mib} err {type(e).__name__} {kind}", flush=True)
                if kind != "RESOURCE_EXHAUSTED":
                    print(str(e)[:2000], file=sys.stderr)
                break
        memory(0, jax.devices()[0])
    elif s.startswith("copy:"):
        mib = int(s.split(":")[1])
        host = np.random.default_rng(mib).integers(0, 256, size=mib * MIB, dtype=np.uint8)
        back = np.asarray(jax.device_put(host))
        print(f"copy {mib} {'ok' if (back == host).all() else 'mismatch'}", flush=True)
    else:
        print(f"bad step {s!r}", file=sys.stderr)
        sys.exit(2)


def main():
    print(f"jax {jax.__version__} backend={jax.default_backend()}", flush=True)
    for s in sys.argv[1:]:
        step(s)
    print("done", flush=True)


if __name__ == "__main__":
    main()
