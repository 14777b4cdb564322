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
subcommand. The observers talk to the driver with ctypes (libcuda.so.1).
"""

import argparse
import ctypes
import gc
import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
import traceback

MiB = 1 << 20
GiB = 1 << 30
SKIP_RC = 77


class Outcome(Exception):
    """Ends a probe: status is OK, FAIL or SKIP."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def ok(msg):
    raise Outcome("OK", msg)


def fail(msg):
    raise Outcome("FAIL", msg)


def skip(msg):
    raise Outcome("SKIP", msg)


def info(msg):
    print("INFO: " + msg, flush=True)


def concluded(run):
    """Runs `run` (which ends with ok, fail or skip), prints its verdict line and returns
    its exit status (0, 1, 77); an unexpected exception is a FAIL."""
    try:
        run()
    except Outcome as o:
        print("%s: %s" % (o.status, o.message), flush=True)
        return {"OK": 0, "FAIL": 1, "SKIP": SKIP_RC}[o.status]
    except Exception as e:  # noqa: BLE001
        print("FAIL: unexpected %s: %s" % (type(e).__name__, e), flush=True)
        return 1
    print("FAIL: the check ended without a verdict", flush=True)
    return 1


def figure(key, value):
    print("FIGURE %s %s" % (key, value), flush=True)


def mib(n):
    if n is None:
        return "?"
    return "%.1f MiB" % (n / MiB)


def align2m(n):
    """Rounds down to a multiple of 2 MiB, at least 2 MiB."""
    n = int(n) // (2 * MiB) * (2 * MiB)
    return max(n, 2 * MiB)


def first_line(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def shows_the_cap(call, name, free, total, cap):
    """What a framework's memory figures (`call`, named `name` in a failure) say before any
    allocation under gpucap: the cap as the total, at most the cap free, and most of it."""
    info("%s: free %s, total %s" % (call, mib(free), mib(total)))
    if total != cap:
        fail("%s total is %d (%s), not the cap %d" % (name, total, mib(total), cap))
    if free > cap:
        fail("%s free %d is more than the cap" % (name, free))
    if free < cap // 4:
        fail("only %s of the %s cap is free before any allocation" % (mib(free), mib(cap)))


def env_without_preload():
    """The environment for a helper that must not be capped (nvidia-smi as a witness)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def smi_process_used(pid):
    """This process's GPU memory as the driver accounts it (nvidia-smi, uncapped), in
    bytes, or None where nvidia-smi does not list it (a container's own pid namespace,
    no permission). Informational: it includes the CUDA context."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            env=env_without_preload(), capture_output=True, text=True, timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return int(parts[1]) * MiB
    return None


def report_physical(label):
    used = smi_process_used(os.getpid())
    if used is not None:
        info("%s: nvidia-smi (uncapped) counts %s on the GPU for this process, its CUDA context included"
             % (label, mib(used)))


# ---------------------------------------------------------------------------------
# The driver through ctypes: the uncapped observer of the growth and context checks.

class Cuda:
    """Device 0's primary context in this process, through libcuda.so.1."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            fail("cannot load libcuda.so.1: %s" % e)
        L = self.lib
        sz = ctypes.c_size_t
        L.cuInit.argtypes = [ctypes.c_uint]
        L.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        L.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        L.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        L.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(sz), ctypes.POINTER(sz)]
        L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), sz]
        L.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        L.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        for f in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                  "cuMemGetInfo_v2", "cuMemAlloc_v2", "cuMemFree_v2", "cuGetErrorName"):
            getattr(L, f).restype = ctypes.c_int
        self.check(L.cuInit(0), "cuInit")
        dev = ctypes.c_int(0)
        self.check(L.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self.check(L.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
        self.check(L.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def error_name(self, rc):
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return str(rc)

    def check(self, rc, what):
        if rc != 0:
            fail("observer: %s -> %s" % (what, self.error_name(rc)))

    def mem_info(self):
        free = ctypes.c_size_t()
        total = ctypes.c_size_t()
        self.check(self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        return free.value, total.value

    def free_now(self):
        return self.mem_info()[0]

    def alloc(self, n):
        """A device pointer, or None if the driver refuses (any error)."""
        p = ctypes.c_uint64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
        return p.value if rc == 0 else None

    def release(self, p):
        self.check(self.lib.cuMemFree_v2(ctypes.c_uint64(p)), "cuMemFree")

    def fill_gpu(self, leave=64 * MiB):
        """Allocates all the device memory the driver will give (256 MiB blocks, then
        2 MiB ones), then frees about `leave` bytes of it again: room for the page
        tables a mapping needs, far less than what the growth check's holder asks for.
        Returns (pointers, bytes held)."""
        big, small = [], []
        for chunk, into in ((256 * MiB, big), (2 * MiB, small)):
            while True:
                p = self.alloc(chunk)
                if p is None:
                    break
                into.append(p)
        left = 0
        while small and left < leave:
            self.release(small.pop())
            left += 2 * MiB
        if left < leave and big:
            self.release(big.pop())
            left += 256 * MiB
        return big + small, len(big) * 256 * MiB + len(small) * 2 * MiB

    def settled_free(self, limit=5.0):
        """Free memory once two readings 100 ms apart agree (memory of a process that
        just exited is given back asynchronously), or after `limit` seconds."""
        deadline = time.monotonic() + limit
        last = self.free_now()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.free_now()
            if now == last:
                return now
            last = now
        return last


class Child:
    """A child process driven by lines: we read its stdout lines, write its stdin.
    Reads the pipe with os.read and splits lines itself, so that select() never waits
    on a line already buffered."""

    def __init__(self, cmd, timeout, **popen):
        info("starting: " + " ".join(cmd))
        self.timeout = timeout
        self.buf = b""
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **popen)
        self.fd = self.p.stdout.fileno()

    def readline(self, deadline):
        """The next line (with its newline), "" at EOF, None at the deadline."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                rest, self.buf = self.buf, b""
                return rest.decode(errors="replace")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode(errors="replace") + "\n"

    def expect(self, token):
        """Waits for a stdout line starting with token; returns the rest of the line.
        Lines before it are echoed; a FAIL line from the child ends the probe."""
        deadline = time.monotonic() + self.timeout
        while True:
            line = self.readline(deadline)
            if line is None:
                self.kill()
                fail("child: no '%s' line within %d s" % (token, self.timeout))
            if line == "":
                rc = self.p.wait()
                fail("child exited (status %s) before printing '%s'" % (rc, token))
            line = line.rstrip("\n")
            if line.startswith(token):
                return line[len(token):].strip()
            print("  child| " + line, flush=True)
            if line.startswith("FAIL: "):
                self.kill()
                fail("child: " + line[6:])

    def send(self, line):
        try:
            self.p.stdin.write((line + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def finish(self):
        """Closes its stdin, echoes the rest of its output, returns its exit status
        (None if it had to be killed)."""
        try:
            self.p.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        deadline = time.monotonic() + self.timeout
        while True:
            line = self.readline(deadline)
            if line is None:
                self.kill()
                return None
            if line == "":
                break
            print("  child| " + line.rstrip("\n"), flush=True)
        try:
            return self.p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def parse_kv(s):
    out = {}
    for part in s.split():
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


# ---------------------------------------------------------------------------------
# detect: is a framework there, uncapped?

def cmd_detect(a):
    what = a.what
    if what == "torch":
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
            skip("PyTorch not importable (%s)" % first_line(e))
        if torch.version.cuda is None:
            skip("PyTorch %s is a build without CUDA" % torch.__version__)
        if not torch.cuda.is_available():
            skip("PyTorch %s (CUDA %s) sees no GPU" % (torch.__version__, torch.version.cuda))
        try:
            # a kernel of its own: a build without kernels for this GPU fails here, uncapped
            v = torch.ones(1024, device="cuda").add_(1).sum().item()
        except Exception as e:  # noqa: BLE001
            skip("PyTorch %s cannot compute on the GPU (%s)" % (torch.__version__, first_line(e)))
        if v != 2048:
            skip("PyTorch %s computes wrong results on the GPU (%r)" % (torch.__version__, v))
        ok("torch %s CUDA %s" % (torch.__version__, torch.version.cuda))
    if what == "jax":
        # detection is uncapped: do not preallocate 75% of the GPU for it
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        try:
            import jax
            import jax.numpy as jnp
        except Exception as e:  # noqa: BLE001
            skip("JAX not importable (%s)" % first_line(e))
        try:
            devs = jax.devices("gpu")
        except Exception as e:  # noqa: BLE001
            skip("JAX %s has no GPU backend (%s)" % (jax.__version__, first_line(e)))
        if not devs:
            skip("JAX %s lists no GPU" % jax.__version__)
        try:
            # compiles (ptxas or the nvptx library) and runs a kernel on the GPU, uncapped
            v = float(jax.device_put(jnp.arange(1024, dtype=jnp.float32), devs[0]).sum())
        except Exception as e:  # noqa: BLE001
            skip("JAX %s cannot compute on the GPU (%s)" % (jax.__version__, first_line(e)))
        if v != 523776.0:
            skip("JAX %s computes wrong results on the GPU (%r)" % (jax.__version__, v))
        ok("jax %s (%s)" % (jax.__version__, getattr(devs[0], "device_kind", "gpu")))
    if what == "cupy":
        try:
            import cupy
        except Exception as e:  # noqa: BLE001
            skip("CuPy not importable (%s)" % first_line(e))
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # noqa: BLE001
            skip("CuPy %s cannot use the GPU (%s)" % (cupy.__version__, first_line(e)))
        if n < 1:
            skip("CuPy %s sees no GPU" % cupy.__version__)
        try:
            # an elementwise kernel compiled with NVRTC, and a copy back
            v = int((cupy.arange(1024, dtype=cupy.int64) * 2).sum())
        except Exception as e:  # noqa: BLE001
            skip("CuPy %s cannot compute on the GPU (%s)" % (cupy.__version__, first_line(e)))
        if v != 1047552:
            skip("CuPy %s computes wrong results on the GPU (%r)" % (cupy.__version__, v))
        ok("cupy %s" % cupy.__version__)
    if what == "numba":
        try:
            import numpy as np
            from numba import cuda
        except Exception as e:  # noqa: BLE001
            skip("numba not importable (%s)" % first_line(e))
        from importlib.metadata import version
        v_numba = version("numba-cuda")
        if not cuda.is_available():
            skip("numba-cuda %s sees no GPU" % v_numba)
        try:
            # a kernel of its own, compiled by NVVM, and a copy back
            @cuda.jit
            def double(x):
                i = cuda.grid(1)
                if i < x.size:
                    x[i] *= 2

            x = cuda.to_device(np.arange(1024, dtype=np.int64))
            double[4, 256](x)
            v = int(x.copy_to_host().sum())
        except Exception as e:  # noqa: BLE001
            skip("numba-cuda %s cannot compute on the GPU (%s)" % (v_numba, first_line(e)))
        if v != 1047552:
            skip("numba-cuda %s computes wrong results on the GPU (%r)" % (v_numba, v))
        ok("numba-cuda %s" % v_numba)
    if what == "pynvml":
        try:
            import pynvml
        except Exception as e:  # noqa: BLE001
            skip("pynvml not installed (pip package nvidia-ml-py) (%s)" % first_line(e))
        ok("pynvml from %s" % getattr(pynvml, "__file__", "?"))
    fail("unknown framework " + what)


# ---------------------------------------------------------------------------------
# PyTorch

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


# ---------------------------------------------------------------------------------
# JAX

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


# ---------------------------------------------------------------------------------
# CuPy

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


# ---------------------------------------------------------------------------------
# numba

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


# ---------------------------------------------------------------------------------
# NVML

def cmd_nvml(a):
    cap = a.cap
    try:
        import pynvml
    except Exception as e:  # noqa: BLE001
        skip("pynvml not installed (%s)" % first_line(e))
    pynvml.nvmlInit()
    try:
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(a.uuid)
        except (TypeError, AttributeError, ctypes.ArgumentError):
            h = pynvml.nvmlDeviceGetHandleByUUID(a.uuid.encode())
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        info("nvmlDeviceGetMemoryInfo: total %s, free %s, used %s" % (mib(m.total), mib(m.free), mib(m.used)))
        if m.total != cap:
            fail("nvmlDeviceGetMemoryInfo total is %d (%s), not the cap %d" % (m.total, mib(m.total), cap))
        if m.free > cap:
            fail("nvmlDeviceGetMemoryInfo free %d is more than the cap" % m.free)
        checked = "nvmlDeviceGetMemoryInfo"
        v2 = getattr(pynvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=v2)
            except TypeError:
                m2 = None
                info("this pynvml cannot ask for nvmlDeviceGetMemoryInfo_v2")
            except pynvml.NVMLError as e:
                m2 = None
                info("nvmlDeviceGetMemoryInfo_v2: %s" % e)
            if m2 is not None:
                info("nvmlDeviceGetMemoryInfo_v2: total %s, free %s, used %s, reserved %s"
                     % (mib(m2.total), mib(m2.free), mib(m2.used), mib(getattr(m2, "reserved", None))))
                if m2.total != cap:
                    fail("nvmlDeviceGetMemoryInfo_v2 total is %d (%s), not the cap %d"
                         % (m2.total, mib(m2.total), cap))
                checked += " and _v2"
    finally:
        pynvml.nvmlShutdown()
    ok("%s show total = cap (%s)" % (checked, mib(cap)))


# ---------------------------------------------------------------------------------
# Growth mode: a holder (capped, PyTorch) and an uncapped observer.

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


# ---------------------------------------------------------------------------------
# Context overhead

def cmd_ctx_overhead(a):
    cap = a.cap
    cuda = Cuda()
    results = {"raw": [], "gpucap": []}
    views = []
    child_cmd = [a.bin, "ctx"] if a.bin else [sys.executable, os.path.abspath(__file__), "ctx-child"]
    info("context child: " + " ".join(child_cmd))
    for i in range(a.runs):
        for mode in ("raw", "gpucap"):
            cmd = list(child_cmd)
            if mode == "gpucap":
                cmd = [a.cli, "run", "--limit", str(cap), "--"] + cmd
            before = cuda.settled_free()
            child = Child(cmd, timeout=a.timeout)
            view = parse_kv(child.expect("READY"))
            after = cuda.settled_free()
            child.send("done")
            rc = child.finish()
            if rc not in (0, None):
                fail("%s context child exited with status %s" % (mode, rc))
            results[mode].append(before - after)
            info("run %d, %s: free %s -> %s: the first context took %s; the child saw free %s of %s"
                 % (i + 1, mode, mib(before), mib(after), mib(before - after),
                    mib(int(view.get("free", 0))), mib(int(view.get("total", 0)))))
            if mode == "gpucap":
                views.append(view)
    for v in views:
        if int(v.get("total", -1)) != cap:
            fail("under gpucap the child's cuMemGetInfo total is %s, not the cap %d" % (v.get("total"), cap))
        if int(v.get("free", -1)) > cap:
            fail("under gpucap the child's cuMemGetInfo free %s is more than the cap" % v.get("free"))
    raw = statistics.median(results["raw"])
    shim = statistics.median(results["gpucap"])
    figure("ctx_overhead_raw_bytes", int(raw))
    figure("ctx_overhead_gpucap_bytes", int(shim))
    figure("ctx_overhead_runs", a.runs)
    free_view = min(int(v["free"]) for v in views) if views else 0
    figure("ctx_charged_bytes", cap - free_view)
    ok("the first context takes %s of device memory (median of %d runs; %s under gpucap); the capped child "
       "sees free %s of the %s cap right after it (%s charged before any allocation)"
       % (mib(raw), a.runs, mib(shim), mib(free_view), mib(cap), mib(cap - free_view)))


def cmd_ctx_child(a):
    """drvbench ctx in Python (when nvcc is missing): the first context, then wait."""
    cuda = Cuda()
    free, total = cuda.mem_info()
    print("READY free=%d total=%d" % (free, total), flush=True)
    sys.stdin.readline()
    ok("context child done")


# ---------------------------------------------------------------------------------
# gpucap's JSON usage report (GPUCAP_REPORT / gpucap run --report)

def cmd_report(a):
    cap = a.cap
    try:
        with open(a.path) as f:
            data = json.load(f)
    except FileNotFoundError:
        fail("gpucap wrote no report at %s (the shim was not loaded, or the process never used the GPU)" % a.path)
    except ValueError as e:
        fail("the report %s is not JSON: %s" % (a.path, e))
    procs = data.get("processes") or []
    devices = [(p, d) for p in procs for d in (p.get("devices") or [])]
    if not devices:
        fail("the report lists no process that used a GPU")
    peak = max(d.get("peak", 0) for _, d in devices)
    refusals = sum(d.get("refusals", 0) for _, d in devices)
    allocations = sum(d.get("allocations", 0) for _, d in devices)
    for p, d in devices:
        if d.get("cap") != cap:
            fail("the report gives pid %s a cap of %s on GPU %s, not %d" % (p.get("pid"), d.get("cap"), d.get("ordinal"), cap))
        if d.get("peak", 0) > cap:
            fail("the report gives pid %s a peak of %s, over the %s cap" % (p.get("pid"), mib(d.get("peak")), mib(cap)))
        if a.growth and not p.get("growth"):
            fail("pid %s did not run in growth mode" % p.get("pid"))
    if a.expect_refusal and refusals < 1:
        fail("gpucap refused nothing: the out-of-memory error did not come from the cap")
    if a.min_peak and peak < a.min_peak:
        fail("the peak charged to the cap was %s, less than the %s expected" % (mib(peak), mib(a.min_peak)))
    ok("gpucap's report: %d process(es), peak %s of the %s cap, %d allocation(s), %d refusal(s)"
       % (len(procs), mib(peak), mib(cap), allocations, refusals))


# ---------------------------------------------------------------------------------
# Benchmark: a PyTorch training step, and the summary of all figures

def resnet18_like(torch, num_classes=10):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def training_step(torch, batch, image):
    """One SGD step of resnet18_like on a fixed random batch (a function returning the
    loss): the step both training benchmarks time (train, scripts/gpu/step_cost.py)."""
    torch.manual_seed(0)
    model = resnet18_like(torch).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 3, image, image, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def cmd_train(a):
    import torch
    step = training_step(torch, a.batch, a.image)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    after = torch.cuda.memory_stats()
    value = float(loss)
    if not math.isfinite(value):
        fail("the loss is %r" % value)
    # the driver allocations PyTorch made while timed (what gpucap's hooks could cost)
    calls = ", ".join("%s %d" % (k, after.get(k, 0) - before.get(k, 0)) for k in ("num_device_alloc", "num_device_free"))
    info("loss %.4f, peak reserved %s; during the timed steps: %s" % (value, mib(torch.cuda.max_memory_reserved()), calls))
    print("RESULT %.3f steps=%d batch=%d image=%d" % (dt * 1000 / a.steps, a.steps, a.batch, a.image), flush=True)
    ok("%.3f ms per step" % (dt * 1000 / a.steps))


def median_or_none(values):
    return round(statistics.median(values), 2) if values else None


def cmd_bench_summary(a):
    rows = {}  # (group, key) -> {mode: [values]}
    with open(a.tsv) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4:
                continue
            group, key, mode, value = parts
            rows.setdefault((group, key), {}).setdefault(mode, []).append(float(value))
    figures = {}
    if a.figures and os.path.exists(a.figures):
        with open(a.figures) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        figures[parts[0]] = int(parts[1])
                    except ValueError:
                        figures[parts[0]] = parts[1]
    meta = {}
    for kv in a.meta or []:
        k, _, v = kv.partition("=")
        meta[k] = v
    checks = []
    if a.checks and os.path.exists(a.checks):
        with open(a.checks) as f:
            for line in f:
                status, _, rest = line.rstrip("\n").partition(" ")
                name, _, detail = rest.partition(" ")
                checks.append({"name": name, "status": status, "detail": detail})

    def entry(group, key, unit):
        modes = rows.get((group, key), {})
        e = {}
        for mode in ("raw", "gpucap", "growth"):
            vals = modes.get(mode, [])
            e["%s_%s" % (mode, unit)] = median_or_none(vals)
            e["%s_runs" % mode] = vals
        raw = e["raw_%s" % unit]
        for mode in ("gpucap", "growth"):
            v = e["%s_%s" % (mode, unit)]
            e["%s_ratio" % mode] = round(v / raw, 4) if (v is not None and raw) else None
        return e

    alloc = []
    for (group, key) in sorted(k for k in rows if k[0] == "pair"):
        e = {"size": int(key)}
        e.update(entry(group, key, "ns"))
        alloc.append(e)
    alloc.sort(key=lambda e: e["size"])
    churn = entry("churn", "mixed", "ns") if ("churn", "mixed") in rows else None
    train = entry("train", "resnet18", "ms") if ("train", "resnet18") in rows else None

    doc = {
        "gpucap_gpu_bench": 1,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": {"name": meta.get("gpu_name"), "driver_version": meta.get("driver_version"),
                "memory_total_mib": int(meta["memory_total_mib"]) if meta.get("memory_total_mib", "").isdigit() else None,
                "cuda_toolkit": meta.get("cuda_toolkit")},
        "host": meta.get("host"),
        "cap_bytes": int(meta["cap_bytes"]) if meta.get("cap_bytes", "").isdigit() else None,
        "train_cap_bytes": int(meta["train_cap_bytes"]) if meta.get("train_cap_bytes", "").isdigit() else None,
        "versions": {k[len("version_"):]: v for k, v in meta.items() if k.startswith("version_")},
        "method": {
            "reps": int(meta.get("reps", 0) or 0),
            "target_ms": int(meta.get("target_ms", 0) or 0),
            "modes": {"raw": "no shim", "gpucap": "gpucap run --limit CAP",
                      "growth": "gpucap run --growth --limit CAP"},
            "alloc_free": "drvbench pair SIZE: ns per cuMemAlloc + cuMemFree pair, median over reps",
            "churn": "drvbench churn: ns per free + alloc over 32 live blocks of 64 KiB..%s bytes"
                     % meta.get("churn_max_bytes", "?"),
            "train": "ResNet-18-like net, SGD, batch %s of 3x%sx%s random images, ms per step over %s steps "
                     "after %s warm-up steps" % (meta.get("train_batch"), meta.get("train_image"),
                                                 meta.get("train_image"), meta.get("train_steps"),
                                                 meta.get("train_warmup")),
        },
        "alloc_free": alloc,
        "churn": churn,
        "torch_train": train,
        "context_overhead": {k: v for k, v in figures.items() if k.startswith("ctx_overhead")} or None,
        "figures": figures,
        "checks": checks,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    def fmt(v, digits=1):
        return "-" if v is None else ("%.*f" % (digits, v))

    print()
    print("GPU: %s, driver %s; cap %s" % (meta.get("gpu_name"), meta.get("driver_version"),
                                         mib(doc["cap_bytes"]) if doc["cap_bytes"] else "?"))
    print("%-34s %12s %12s %12s %8s %8s" % ("", "raw", "gpucap", "growth", "ratio", "growth"))
    for e in alloc:
        size = e["size"]
        label = "%d KiB" % (size >> 10) if size < MiB else "%d MiB" % (size >> 20)
        print("%-34s %12s %12s %12s %8s %8s" % (
            "cuMemAlloc+cuMemFree %s (ns)" % label, fmt(e["raw_ns"]), fmt(e["gpucap_ns"]),
            fmt(e["growth_ns"]), fmt(e["gpucap_ratio"], 3), fmt(e["growth_ratio"], 3)))
    if churn:
        print("%-34s %12s %12s %12s %8s %8s" % (
            "alloc/free churn (ns per op)", fmt(churn["raw_ns"]), fmt(churn["gpucap_ns"]),
            fmt(churn["growth_ns"]), fmt(churn["gpucap_ratio"], 3), fmt(churn["growth_ratio"], 3)))
    if train:
        print("%-34s %12s %12s %12s %8s %8s" % (
            "ResNet-18-like step (ms)", fmt(train["raw_ms"], 3), fmt(train["gpucap_ms"], 3),
            fmt(train["growth_ms"], 3), fmt(train["gpucap_ratio"], 3), fmt(train["growth_ratio"], 3)))
    if "ctx_overhead_raw_bytes" in figures:
        print("first CUDA context: %s of device memory (%s under gpucap); charged to the cap before any "
              "allocation: %s" % (mib(figures["ctx_overhead_raw_bytes"]), mib(figures.get("ctx_overhead_gpucap_bytes")),
                                  mib(figures.get("ctx_charged_bytes"))))
    print("wrote %s" % a.out)
    ok("wrote %s" % a.out)


# ---------------------------------------------------------------------------------

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
