#!/usr/bin/env python3
"""Probes of scripts/gpu-check.sh: what PyTorch, JAX, CuPy, numba and NVML see under gpucap.

Each subcommand prints INFO lines, then one last line and exit status:
  "OK: <detail>"    exit 0
  "FAIL: <why>"     exit 1
  "SKIP: <reason>"  exit 77 (a framework or package is missing)
and "FIGURE <key> <value>" lines for figures scripts/gpu-check.sh records.

Capped subcommands (run under `gpucap run --limit CAP`):
  torch --cap N            mem_get_info shows the cap, past it OutOfMemoryError, recovery
                           (PYTORCH_CUDA_ALLOC_CONF picks the allocator: set by the caller)
  jax-preallocate --cap N  the preallocated pool is a fraction of the cap
  jax-grow --cap N         allocating arrays past the cap fails with RESOURCE_EXHAUSTED
  cupy --cap N --pool default|async
  numba --cap N            the memory info shows the cap, past it numba's CudaAPIError
                           CUDA_ERROR_OUT_OF_MEMORY, recovery after its pending frees
  nvml --cap N --uuid U    nvmlDeviceGetMemoryInfo shows the cap
  growth-holder [--fraction F]  the process the growth check watches (driven over stdin)
  train                    one timed PyTorch training run (prints RESULT ms/step)
Uncapped (observers and helpers):
  detect torch|jax|cupy|numba|pynvml   imports it and runs a small computation on the GPU
  growth --cap N --mode growth|release [--no-fill] -- HOLDER CMD...
  ctx-overhead --cap N --cli GPUCAP [--bin DRVBENCH] [--runs R]
  ctx-child                (the context child without nvcc: prints READY, waits)
  report PATH --cap N [--expect-refusal] [--min-peak N] [--growth]
  bench-summary --tsv F --out JSON [...]

Needs only the standard library itself; each framework is imported by its own
subcommand (scripts/gpu/probes/, a file each), and the verdicts (verdicts.py), the observers
that talk to the driver with ctypes (observer.py) and the child processes (child.py) are
the other checks' too.
"""

import argparse
import sys
import traceback

from probes.bench_summary import cmd_bench_summary
from probes.contexts import cmd_ctx_child, cmd_ctx_overhead
from probes.cupy_memory import cmd_cupy
from probes.detect import cmd_detect
from probes.growth import cmd_growth, cmd_growth_holder
from probes.jax_memory import cmd_jax_grow, cmd_jax_preallocate
from probes.numba_memory import cmd_numba
from probes.nvml_memory import cmd_nvml
from probes.reports import cmd_report
from probes.torch_memory import cmd_torch
from probes.training import cmd_train
from verdicts import SKIP_RC, Outcome, fail, first_line


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("detect")
    s.add_argument("what", choices=["torch", "jax", "cupy", "numba", "pynvml"])
    s.set_defaults(fn=cmd_detect)

    for name, fn in (("torch", cmd_torch), ("jax-preallocate", cmd_jax_preallocate), ("jax-grow", cmd_jax_grow)):
        s = sub.add_parser(name)
        s.add_argument("--cap", type=int, required=True)
        s.set_defaults(fn=fn)

    s = sub.add_parser("cupy")
    s.add_argument("--cap", type=int, required=True)
    s.add_argument("--pool", choices=["default", "async"], default="default")
    s.set_defaults(fn=cmd_cupy)

    s = sub.add_parser("numba")
    s.add_argument("--cap", type=int, required=True)
    s.set_defaults(fn=cmd_numba)

    s = sub.add_parser("nvml")
    s.add_argument("--cap", type=int, required=True)
    s.add_argument("--uuid", required=True)
    s.set_defaults(fn=cmd_nvml)

    s = sub.add_parser("growth-holder")
    s.add_argument("--fraction", type=float, default=0.75,
                   help="of the free memory it sees at the start")
    s.set_defaults(fn=cmd_growth_holder)

    s = sub.add_parser("growth")
    s.add_argument("--cap", type=int, required=True)
    s.add_argument("--mode", choices=["growth", "release"], required=True)
    s.add_argument("--no-fill", action="store_true")
    s.add_argument("--timeout", type=int, default=240)
    s.add_argument("holder", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_growth)

    s = sub.add_parser("ctx-overhead")
    s.add_argument("--cap", type=int, required=True)
    s.add_argument("--bin", help="drvbench (default: a Python child through ctypes)")
    s.add_argument("--cli", required=True)
    s.add_argument("--runs", type=int, default=3)
    s.add_argument("--timeout", type=int, default=60)
    s.set_defaults(fn=cmd_ctx_overhead)

    s = sub.add_parser("ctx-child")
    s.set_defaults(fn=cmd_ctx_child)

    s = sub.add_parser("report")
    s.add_argument("path")
    s.add_argument("--cap", type=int, required=True)
    s.add_argument("--expect-refusal", action="store_true")
    s.add_argument("--min-peak", type=int, default=0)
    s.add_argument("--growth", action="store_true")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("train")
    s.add_argument("--steps", type=int, default=50)
    s.add_argument("--warmup", type=int, default=10)
    s.add_argument("--batch", type=int, default=64)
    s.add_argument("--image", type=int, default=128)
    s.set_defaults(fn=cmd_train)

    s = sub.add_parser("bench-summary")
    s.add_argument("--tsv", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--figures")
    s.add_argument("--checks")
    s.add_argument("--meta", action="append")
    s.set_defaults(fn=cmd_bench_summary)

    a = p.parse_args(argv)
    try:
        a.fn(a)
        fail("the probe ended without a verdict")
    except Outcome as o:
        print("%s: %s" % (o.status, o.message), flush=True)
        return {"OK": 0, "FAIL": 1, "SKIP": SKIP_RC}[o.status]
    except Exception as e:  # noqa: BLE001 - any other error is a failure, with its traceback
        traceback.print_exc()
        print("FAIL: unexpected %s: %s" % (type(e).__name__, first_line(e)), flush=True)
        return 1


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
