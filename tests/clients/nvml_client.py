"""What nvidia-ml-py (pynvml) sees: every NVML device (and its MIG instance, if any).

Prints one line per device, as tests/c/nvml.c does:
    dev <index>[.mig] uuid=<uuid> total=B free=B used=B v2total=B v2reserved=B v2free=B v2used=B
then one line per compute process (nvmlDeviceGetComputeRunningProcesses, which
nvidia-ml-py asks of _v3 with NVML's count protocol), and again as
nvmlDeviceGetRunningProcessDetailList lists them (compute mode):
    proc <index>[.mig] v3 pid=P used=B gi=G ci=C
    proc <index>[.mig] detail pid=P used=B gi=G ci=C
or, when NVML refuses to report the memory,
    denied <index>[.mig] <NVML return code> <pynvml's exception class>
(and "procsdenied ..." for the processes), then "done". Never initialises CUDA itself, like nvidia-smi.
"""

import pynvml


def show(label, handle):
    uuid = pynvml.nvmlDeviceGetUUID(handle)
    if isinstance(uuid, bytes):
        uuid = uuid.decode()
    try:
        m = pynvml.nvmlDeviceGetMemoryInfo(handle)
        m2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except pynvml.NVMLError as e:
        print(f"denied {label} {e.value} {type(e).__name__}", flush=True)
        return
    print(
        f"dev {label} uuid={uuid} total={m.total} free={m.free} used={m.used} "
        f"v2total={m2.total} v2reserved={m2.reserved} v2free={m2.free} v2used={m2.used}",
        flush=True,
    )
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLError as e:
        print(f"procsdenied {label} {e.value} {type(e).__name__}", flush=True)
        return
    for p in procs:
        print(
            f"proc {label} v3 pid={p.pid} used={p.usedGpuMemory} "
            f"gi={p.gpuInstanceId} ci={p.computeInstanceId}",
            flush=True,
        )
    # The r550+ list (what nvidia-ml-py offers beside _v3), compute mode.
    try:
        detail = pynvml.nvmlDeviceGetRunningProcessDetailList(
            handle, pynvml.nvmlProcessDetailList_v1, pynvml.NVML_PROCESS_MODE_COMPUTE
        )
    except pynvml.NVMLError as e:
        print(f"procsdenied {label} {e.value} {type(e).__name__} detail", flush=True)
        return
    for p in detail:
        print(
            f"proc {label} detail pid={p.pid} used={p.usedGpuMemory} "
            f"gi={p.gpuInstanceId} ci={p.computeInstanceId}",
            flush=True,
        )


def main():
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    print(f"count {n}", flush=True)
    for i in range(n):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        show(str(i), h)
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        except pynvml.NVMLError:
            continue
        show(f"{i}.mig", mig)
    pynvml.nvmlShutdown()
    print("done", flush=True)


if __name__ == "__main__":
    main()
