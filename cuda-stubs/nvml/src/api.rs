//! The implemented NVML entry points: initialisation, system versions, device handles and
//! identity, memory, running processes, MIG.

use libc::{c_char, c_int, c_uint};

use crate::abi::{
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_MEMORY_V2,
    NVML_PROCESS_DETAIL_LIST_V1, NVML_PROCESS_MODE_ALL, NVML_PROCESS_MODE_COMPUTE, Res, exports,
    fill, in_str, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlProcessDetail_v1_t,
    nvmlProcessDetailList_v1_t, nvmlProcessInfo_v1_t, nvmlProcessInfo_v2_t, nvmlReturn_t, out,
    out_str,
};
use crate::devices::{
    MAX_MIG_DEVICES, PCI_DEVICE_ID, PCI_SUBSYSTEM_ID, cfg, dev, driver_version, gpu_handle, init,
    mig_handle, nvmlDevice_t, processes_of, shutdown, used_of,
};
use fake_gpu::identity;

fn handle_by_index(index: c_uint, device: *mut nvmlDevice_t) -> Res {
    let cfg = cfg()?;
    if index as usize >= cfg.devices {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out(device, gpu_handle(index as usize))
}

/// A device's memory as NVML counts it: what CUDA sees (total, used) plus what the
/// driver reserves beside it (FAKECUDA_NVML_RESERVED), as a real driver's NVML shows.
struct Memory {
    cuda_total: u64,
    used: u64,
    reserved: u64,
}

impl Memory {
    fn total(&self) -> u64 {
        self.cuda_total.saturating_add(self.reserved)
    }
    fn free(&self) -> u64 {
        self.cuda_total.saturating_sub(self.used)
    }
}

fn memory(h: nvmlDevice_t) -> Result<Memory, nvmlReturn_t> {
    let (phys, _) = dev(h)?;
    let cfg = cfg()?;
    Ok(Memory {
        cuda_total: cfg.total_mem,
        used: used_of(cfg, phys),
        reserved: cfg.nvml_reserved,
    })
}

fn pci_info(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> Res {
    let (phys, _) = dev(device)?;
    let bus = identity::pci_bus(phys);
    out(
        pci,
        nvmlPciInfo_t {
            bus_id_legacy: fill(&format!("0000:{bus:02X}:00.0")),
            domain: 0,
            bus,
            device: 0,
            pci_device_id: PCI_DEVICE_ID,
            pci_sub_system_id: PCI_SUBSYSTEM_ID,
            bus_id: fill(&identity::pci_bus_id(phys)),
        },
    )
}

/// The nvmlDeviceGet*RunningProcesses protocol: INSUFFICIENT_SIZE with the count when the
/// caller's array is too small.
fn processes<T>(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64, bool) -> T,
) -> Res {
    let (phys, _) = dev(device)?;
    let cfg = cfg()?;
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // As in a container: the host's pid (FAKECUDA_NVML_PID_OFFSET); then the host's
    // other processes (FAKECUDA_NVML_EXTRA_PROCS), pids 1 to N.
    let procs: Vec<(u32, u64)> = processes_of(cfg, phys)
        .into_iter()
        .map(|(pid, used)| (pid.wrapping_add(cfg.nvml_pid_offset), used))
        .chain((1..=cfg.nvml_extra_procs).map(|pid| (pid, 0)))
        .collect();
    // SAFETY: non-null count from the caller.
    let room = unsafe { *count } as usize;
    out(count, procs.len() as c_uint)?;
    if procs.is_empty() {
        return Ok(());
    }
    if room < procs.len() || infos.is_null() {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, &(pid, used)) in procs.iter().enumerate() {
        // SAFETY: the caller's array holds `room` >= procs.len() entries.
        unsafe { infos.add(i).write_unaligned(make(pid, used, cfg.mig)) };
    }
    Ok(())
}

fn process_v2(pid: u32, used: u64, mig: bool) -> nvmlProcessInfo_v2_t {
    let id = if mig { 0 } else { u32::MAX };
    nvmlProcessInfo_v2_t {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: id,
        compute_instance_id: id,
    }
}

exports! {
    fn nvmlInit() {
        init(0)
    }

    fn nvmlInit_v2() {
        init(0)
    }

    fn nvmlInitWithFlags(flags: c_uint) {
        init(flags)
    }

    fn nvmlShutdown() {
        shutdown()
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        out_str(version, length, driver_version(cfg()?.driver_version))
    }

    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let cfg = cfg()?;
        let v = format!("{}.{}", cfg.driver_version / 1000, driver_version(cfg.driver_version));
        out_str(version, length, &v)
    }

    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        out(version, cfg()?.driver_version)
    }

    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        out(version, cfg()?.driver_version)
    }

    fn nvmlDeviceGetCount(count: *mut c_uint) {
        out(count, cfg()?.devices as c_uint)
    }

    fn nvmlDeviceGetCount_v2(count: *mut c_uint) {
        out(count, cfg()?.devices as c_uint)
    }

    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) {
        handle_by_index(index, device)
    }

    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        handle_by_index(index, device)
    }

    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        let cfg = cfg()?;
        let want = in_str(uuid)?;
        if device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        for phys in 0..cfg.devices {
            if identity::gpu_uuid_string(phys).eq_ignore_ascii_case(want) {
                return out(device, gpu_handle(phys));
            }
            if cfg.mig && identity::mig_uuid_string(phys).eq_ignore_ascii_case(want) {
                return out(device, mig_handle(phys));
            }
        }
        Err(NVML_ERROR_NOT_FOUND)
    }

    fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let phys = identity::parse_pci_bus_id(in_str(bus_id)?, cfg()?.devices).ok_or(NVML_ERROR_NOT_FOUND)?;
        out(device, gpu_handle(phys))
    }

    fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, device: *mut nvmlDevice_t) {
        let phys = identity::parse_pci_bus_id(in_str(bus_id)?, cfg()?.devices).ok_or(NVML_ERROR_NOT_FOUND)?;
        out(device, gpu_handle(phys))
    }

    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        match dev(device)? {
            (phys, false) => out(index, phys as c_uint),
            (_, true) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) {
        let (phys, _) = dev(device)?;
        out(minor, phys as c_uint)
    }

    // Not part of an NVLink fabric: the call succeeds with clusterUuid zero, status
    // SUCCESS, cliqueId 0 and state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED (0): bytes 4..29 of
    // nvmlGpuFabricInfoV_t, after its version word (every version has them there).
    fn nvmlDeviceGetGpuFabricInfoV(device: nvmlDevice_t, info: *mut u8) {
        dev(device)?;
        if info.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller's struct is at least 29 bytes long (version, uuid, status,
        // cliqueId, state).
        unsafe { std::ptr::write_bytes(info.add(4), 0, 25) };
        Ok(())
    }

    // No NVLink: the answer a PCIe card's NVML gives for every link.
    fn nvmlDeviceGetNvLinkState(device: nvmlDevice_t, link: c_uint, active: *mut c_uint) {
        dev(device)?;
        let _ = (link, active);
        Err(NVML_ERROR_NOT_SUPPORTED)
    }

    // PCIe 5.0 x16, as an H100 PCIe card (PyTorch's and XLA's bandwidth estimates ask).
    fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, generation: *mut c_uint) {
        dev(device)?;
        out(generation, 5)
    }

    fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, generation: *mut c_uint) {
        dev(device)?;
        out(generation, 5)
    }

    fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, width: *mut c_uint) {
        dev(device)?;
        out(width, 16)
    }

    fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, width: *mut c_uint) {
        dev(device)?;
        out(width, 16)
    }

    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let (phys, mig) = dev(device)?;
        out_str(name, length, &identity::device_name(phys, mig, cfg()?.total_mem))
    }

    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let s = match dev(device)? {
            (phys, false) => identity::gpu_uuid_string(phys),
            (phys, true) => identity::mig_uuid_string(phys),
        };
        out_str(uuid, length, &s)
    }

    fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        pci_info(device, pci)
    }

    fn nvmlDeviceGetPciInfo_v2(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        pci_info(device, pci)
    }

    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        pci_info(device, pci)
    }

    fn nvmlDeviceGetCudaComputeCapability(device: nvmlDevice_t, major: *mut c_int, minor: *mut c_int) {
        dev(device)?;
        out(major, 9)?;
        out(minor, 0)
    }

    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) {
        // v1's used includes the reserved memory (a real driver's answer).
        let m = self::memory(device)?;
        out(memory, nvmlMemory_t { total: m.total(), free: m.free(), used: m.used.saturating_add(m.reserved) })
    }

    fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) {
        let m = self::memory(device)?;
        if memory.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null caller struct; `version` is its first field.
        let version = unsafe { (*memory).version };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        out(memory, nvmlMemory_v2_t { version, total: m.total(), reserved: m.reserved, free: m.free(), used: m.used })
    }

    fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) {
        processes(device, count, infos, |pid, used, _| nvmlProcessInfo_v1_t { pid, used_gpu_memory: used })
    }

    fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        processes(device, count, infos, process_v2)
    }

    fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v2_t) {
        processes(device, count, infos, process_v2)
    }

    fn nvmlDeviceGetRunningProcessDetailList(device: nvmlDevice_t, list: *mut nvmlProcessDetailList_v1_t) {
        if list.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller's non-null list struct, read field by field.
        let (version, mode, array) = unsafe { ((*list).version, (*list).mode, (*list).proc_array) };
        if version != NVML_PROCESS_DETAIL_LIST_V1 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if mode > NVML_PROCESS_MODE_ALL {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: as above; the count field of the caller's struct.
        let count = unsafe { &raw mut (*list).num_proc_array_entries };
        if mode == NVML_PROCESS_MODE_COMPUTE || mode == NVML_PROCESS_MODE_ALL {
            processes(device, count, array, |pid, used, mig| {
                let v2 = process_v2(pid, used, mig);
                nvmlProcessDetail_v1_t {
                    pid,
                    used_gpu_memory: used,
                    gpu_instance_id: v2.gpu_instance_id,
                    compute_instance_id: v2.compute_instance_id,
                    used_gpu_cc_protected_memory: 0,
                }
            })
        } else {
            // The fake has no graphics or MPS processes.
            dev(device)?;
            out(count, 0)
        }
    }

    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        match dev(device)? {
            (_, false) => {
                let m = cfg()?.mig as c_uint;
                out(current, m)?;
                out(pending, m)
            }
            (_, true) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        match dev(device)? {
            (_, false) => out(count, if cfg()?.mig { MAX_MIG_DEVICES } else { 0 }),
            (_, true) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceGetMigDeviceHandleByIndex(device: nvmlDevice_t, index: c_uint, mig_device: *mut nvmlDevice_t) {
        let (phys, mig) = dev(device)?;
        let max = if cfg()?.mig { MAX_MIG_DEVICES } else { 0 };
        if mig || index >= max || mig_device.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        if index != 0 {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        out(mig_device, mig_handle(phys))
    }

    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig_device: nvmlDevice_t, device: *mut nvmlDevice_t) {
        match dev(mig_device)? {
            (phys, true) => out(device, gpu_handle(phys)),
            (_, false) => Err(NVML_ERROR_INVALID_ARGUMENT),
        }
    }

    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) {
        let (_, mig) = dev(device)?;
        out(is_mig, mig as c_uint)
    }

    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        match dev(device)? {
            (_, true) => out(id, 0),
            (_, false) => Err(NVML_ERROR_NOT_SUPPORTED),
        }
    }

    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        match dev(device)? {
            (_, true) => out(id, 0),
            (_, false) => Err(NVML_ERROR_NOT_SUPPORTED),
        }
    }
}
