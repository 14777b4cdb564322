"""probe.py detect torch|jax|cupy|numba|pynvml: is a framework there and able to compute on
the GPU, uncapped? OK with its version, SKIP with the reason it cannot be used.
"""

import os

from verdicts import fail, first_line, ok, skip


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
