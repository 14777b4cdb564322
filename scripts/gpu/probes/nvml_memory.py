"""probe.py nvml --cap N --uuid U: nvmlDeviceGetMemoryInfo (and its _v2) show the cap as the
GPU's total memory.
"""

import ctypes

from verdicts import fail, first_line, info, mib, ok, skip


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
