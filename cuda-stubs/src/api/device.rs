//! cuInit, cuDriverGetVersion, device queries and attributes (an H100-like device,
//! compute capability 9.0), error names and strings.

use crate::abi::errors::{error_name_nul, error_string};
use crate::abi::{CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, cstr, log, out};
use crate::model::device::{cfg, check_dev, device_name, init, phys_of, uuid_v1, uuid_v2};
use fake_gpu::config;
use fake_gpu::identity;
use libc::{c_char, c_int, c_uint};

/// Lets this process open as many files as it may (VMM handles with their own memfd,
/// IPC exports): the soft RLIMIT_NOFILE goes up to the hard one.
fn raise_fd_limit() {
    // SAFETY: reading and setting this process's own limit.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Handles of the callbacks registered with cuLogsRegisterCallback.
static LOG_CALLBACKS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// cuDeviceGetAttribute: an H100-like device with compute capability 9.0.
pub fn attribute(attr: c_int, dev: usize) -> c_int {
    match attr {
        1 => 1024,                                                  // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                                              // MAX_BLOCK_DIM_X/Y
        4 => 64,                                                    // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                                              // MAX_GRID_DIM_X
        6 | 7 => 65535,                                             // MAX_GRID_DIM_Y/Z
        8 => 49152,                                                 // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                                                 // TOTAL_CONSTANT_MEMORY
        10 => 32,                                                   // WARP_SIZE
        11 => i32::MAX,                                             // MAX_PITCH
        12 => 65536,                                                // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,                                            // CLOCK_RATE (kHz)
        14 => 512,                                                  // TEXTURE_ALIGNMENT
        15 => 1,                                                    // GPU_OVERLAP
        16 => 132,                                                  // MULTIPROCESSOR_COUNT
        19 => 1,                                                    // CAN_MAP_HOST_MEMORY
        30 => 512,                                                  // SURFACE_ALIGNMENT
        31 => 1,                                                    // CONCURRENT_KERNELS
        32 => 1,                                                    // ECC_ENABLED
        33 => identity::pci_bus(phys_of(dev)) as c_int,             // PCI_BUS_ID
        36 => 2_619_000,                                            // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                                                 // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,                                             // L2_CACHE_SIZE
        39 => 2048,       // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,          // ASYNC_ENGINE_COUNT
        41 => 1,          // UNIFIED_ADDRESSING
        51 => 32,         // TEXTURE_PITCH_ALIGNMENT
        75 => 9,          // COMPUTE_CAPABILITY_MAJOR
        76 => 0,          // COMPUTE_CAPABILITY_MINOR
        78 => 1,          // STREAM_PRIORITIES_SUPPORTED
        79 | 80 => 1,     // GLOBAL/LOCAL_L1_CACHE_SUPPORTED
        81 => 233_472,    // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,      // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,          // MANAGED_MEMORY
        87 => 2,          // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO (an H100's FP32:FP64)
        89 => 1,          // CONCURRENT_MANAGED_ACCESS
        90 => 1,          // COMPUTE_PREEMPTION_SUPPORTED
        91 => 1,          // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        95 => 1,          // COOPERATIVE_LAUNCH
        96 => 1,          // COOPERATIVE_MULTI_DEVICE_LAUNCH
        97 => 232_448,    // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        99 => 1,          // HOST_REGISTER_SUPPORTED
        102 => 1,         // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1,         // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        106 => 32,        // MAX_BLOCKS_PER_MULTIPROCESSOR
        108 => 50 << 20,  // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 128 << 20, // MAX_ACCESS_POLICY_WINDOW_SIZE
        111 => 1024,      // RESERVED_SHARED_MEMORY_PER_BLOCK
        115 => 1,         // MEMORY_POOLS_SUPPORTED
        119 => 1,         // MEMPOOL_SUPPORTED_HANDLE_TYPES (POSIX fd)
        120 => 1,         // CLUSTER_LAUNCH
        126 => 4,         // MEM_SYNC_DOMAIN_COUNT
        131 | 134 => -1,  // NUMA_ID, HOST_NUMA_ID
        132 => crate::api::multicast::supported().is_ok() as c_int, // MULTICAST_SUPPORTED
        _ => 0,
    }
}

crate::abi::exports! {
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Reads the configuration and joins the FAKECUDA_SHARED file, if any (an error
        // names the problem).
        let first = init().inspect_err(|msg| log(msg)).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if first {
            raise_fd_limit();
            crate::stats::register_at_exit();
        }
        Ok(())
    }

    fn cuDriverGetVersion(version: *mut c_int) {
        let v = config::get().map(|c| c.driver_version).unwrap_or(config::DEFAULT_DRIVER_VERSION);
        out(version, v)
    }

    fn cuDeviceGetCount(count: *mut c_int) {
        out(count, cfg()?.visible.len() as c_int)
    }

    fn cuDeviceGet(device: *mut c_int, ordinal: c_int) {
        check_dev(ordinal)?;
        out(device, ordinal)
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) {
        let dev = check_dev(dev)?;
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let s = device_name(dev);
        let n = s.len().min(len - 1);
        // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), name.cast::<u8>(), n);
            *name.add(n) = 0;
        }
        Ok(())
    }

    fn cuDeviceGetUuid(uuid_out: *mut [u8; 16], dev: c_int) {
        out(uuid_out, uuid_v1(check_dev(dev)?))
    }

    fn cuDeviceGetUuid_v2(uuid_out: *mut [u8; 16], dev: c_int) {
        out(uuid_out, uuid_v2(check_dev(dev)?))
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) {
        check_dev(dev)?;
        out(bytes, cfg()?.total_mem as usize)
    }

    fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: c_int) {
        let dev = check_dev(dev)?;
        out(value, attribute(attrib, dev))
    }

    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: c_int) {
        let dev = check_dev(dev)?;
        out(major, attribute(75, dev))?;
        out(minor, attribute(76, dev))
    }

    fn cuDeviceGetPCIBusId(pci_bus_id: *mut c_char, len: c_int, dev: c_int) {
        let dev = check_dev(dev)?;
        let s = identity::pci_bus_id(phys_of(dev));
        let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if pci_bus_id.is_null() || len == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = s.len().min(len - 1);
        // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), pci_bus_id.cast::<u8>(), n);
            *pci_bus_id.add(n) = 0;
        }
        Ok(())
    }

    fn cuDeviceGetByPCIBusId(dev: *mut c_int, pci_bus_id: *const c_char) {
        let cfg = cfg()?;
        let s = cstr(pci_bus_id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let phys = identity::parse_pci_bus_id(s, cfg.devices).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        let found = cfg.visible.iter().position(|&p| p == phys);
        out(dev, found.ok_or(CUDA_ERROR_INVALID_DEVICE)? as c_int)
    }

    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: c_int, peer: c_int) {
        check_dev(dev)?;
        check_dev(peer)?;
        out(can, (dev != peer) as c_int)
    }

    fn cuDeviceGetP2PAttribute(value: *mut c_int, attrib: c_int, src: c_int, dst: c_int) {
        check_dev(src)?;
        check_dev(dst)?;
        let _ = attrib;
        out(value, 0)
    }

    // CUDA 12.9 driver logs: the fake writes no log, so a registered callback is never
    // called; registration hands out a handle that unregistering takes back.
    fn cuLogsRegisterCallback(callback: Option<unsafe extern "C" fn()>, user_data: *mut libc::c_void, handle: *mut usize) {
        cfg()?;
        let _ = user_data;
        if callback.is_none() || handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = crate::model::os::new_handle();
        LOG_CALLBACKS.lock().unwrap_or_else(|e| e.into_inner()).push(h);
        out(handle, h)
    }

    fn cuLogsUnregisterCallback(handle: usize) {
        cfg()?;
        let mut cbs = LOG_CALLBACKS.lock().unwrap_or_else(|e| e.into_inner());
        let i = cbs.iter().position(|&h| h == handle).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        cbs.remove(i);
        Ok(())
    }

    // An iterator at the current end of the (empty) log.
    fn cuLogsCurrent(iterator: *mut c_uint, flags: c_uint) {
        cfg()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(iterator, 0)
    }

    fn cuGetErrorString(error: c_uint, pstr: *mut *const c_char) {
        match error_string(error) {
            Some(s) => out(pstr, s.as_ptr().cast()),
            None => {
                let _ = out(pstr, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }

    fn cuGetErrorName(error: c_uint, pstr: *mut *const c_char) {
        match error_name_nul(error) {
            Some(s) => out(pstr, s.as_ptr().cast()),
            None => {
                let _ = out(pstr, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
}
