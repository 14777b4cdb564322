"""NVML through ctypes (libnvidia-ml.so.1), for the checks of scripts/gpu/: no pynvml
needed, so the same code runs on the fake GPU's NVML in CI and on a real driver.

Reads what the driver says: device memory (nvmlDeviceGetMemoryInfo) and the compute
processes with their used memory (nvmlDeviceGetComputeRunningProcesses_v3, the
24-byte nvmlProcessInfo_t the driver and nvidia-ml-py use). Under gpucap (LD_PRELOAD)
these are gpucap's figures where gpucap changes them (a pool, a cap); without it, the
driver's own.
"""

import ctypes

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7


class NvmlError(Exception):
    pass


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Process(ctypes.Structure):  # nvmlProcessInfo_t (v2 layout, what _v3 fills)
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]


class Nvml:
    """One NVML session; devices by UUID (as CUDA_VISIBLE_DEVICES names them) or index."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise NvmlError("cannot load libnvidia-ml.so.1: %s" % e) from e
        self.call("nvmlInit_v2")

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != NVML_SUCCESS:
            raise NvmlError("%s failed with NVML error %d" % (name, rc))

    def count(self):
        n = ctypes.c_uint()
        self.call("nvmlDeviceGetCount_v2", ctypes.byref(n))
        return n.value

    def handle(self, which):
        """`which`: an index (int) or a GPU UUID (str)."""
        h = ctypes.c_void_p()
        if isinstance(which, int):
            self.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(which), ctypes.byref(h))
        else:
            self.call("nvmlDeviceGetHandleByUUID", which.encode(), ctypes.byref(h))
        return h

    def uuid(self, h):
        buf = ctypes.create_string_buffer(96)
        self.call("nvmlDeviceGetUUID", h, buf, ctypes.c_uint(96))
        return buf.value.decode()

    def memory(self, h):
        """(total, free, used) in bytes."""
        m = _Memory()
        self.call("nvmlDeviceGetMemoryInfo", h, ctypes.byref(m))
        return m.total, m.free, m.used

    def processes(self, h):
        """{pid: used bytes or None} of the compute processes NVML lists on the device."""
        n = ctypes.c_uint(0)
        rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), None)
        if rc == NVML_SUCCESS and n.value == 0:
            return {}
        if rc not in (NVML_SUCCESS, NVML_ERROR_INSUFFICIENT_SIZE):
            raise NvmlError("nvmlDeviceGetComputeRunningProcesses_v3 (count) failed with NVML error %d" % rc)
        room = n.value + 8  # processes may start between the two calls
        arr = (_Process * room)()
        n = ctypes.c_uint(room)
        self.call("nvmlDeviceGetComputeRunningProcesses_v3", h, ctypes.byref(n), arr)
        # NVML_VALUE_NOT_AVAILABLE (all ones): the driver does not say (some containers)
        return {p.pid: (None if p.used == (1 << 64) - 1 else p.used) for p in arr[: n.value]}

    def process_used(self, h, pid):
        """The driver's figure for one process (bytes), or None when it is not listed."""
        return self.processes(h).get(pid)
