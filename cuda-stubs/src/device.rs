//! Driver initialisation, device queries and error strings.

use std::sync::atomic::{AtomicBool, Ordering};

use fake_gpu::config::{self, Config};
use crate::ffi::*;
use fake_gpu::identity;
use libc::{c_char, c_int, c_uint};

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The configuration once cuInit succeeded; CUDA_ERROR_NOT_INITIALIZED before.
pub fn cfg() -> Result<&'static Config, CUresult> {
    if INITIALIZED.load(Ordering::Acquire) {
        config::get().map_err(|_| CUDA_ERROR_NOT_INITIALIZED)
    } else {
        Err(CUDA_ERROR_NOT_INITIALIZED)
    }
}

/// Validates a CUdevice (its ordinal among the visible devices).
pub fn check_dev(dev: c_int) -> Result<usize, CUresult> {
    let cfg = cfg()?;
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < cfg.visible.len())
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// The physical device behind a (valid) ordinal.
pub fn phys_of(dev: usize) -> usize {
    cfg().map(|c| c.visible[dev]).unwrap_or(dev)
}

/// The UUID cuDeviceGetUuid_v2 reports: the MIG instance's with FAKECUDA_MIG=1, else the
/// GPU's (see identity.rs for the values).
pub fn uuid_v2(dev: usize) -> [u8; 16] {
    let phys = phys_of(dev);
    match cfg() {
        Ok(c) if c.mig => identity::mig_uuid(phys),
        _ => identity::gpu_uuid(phys),
    }
}

/// The UUID cuDeviceGetUuid reports: always the GPU's (the real driver added _v2 to report
/// MIG instances; the old entry point keeps naming the parent GPU).
pub fn uuid_v1(dev: usize) -> [u8; 16] {
    identity::gpu_uuid(phys_of(dev))
}

pub fn device_name(dev: usize) -> String {
    match cfg() {
        Ok(c) => identity::device_name(phys_of(dev), c.mig, c.total_mem),
        Err(_) => identity::device_name(dev, false, 0),
    }
}

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

/// cuDeviceGetAttribute: an H100-like device with compute capability 9.0.
pub fn attribute(attr: c_int, dev: usize) -> c_int {
    match attr {
        1 => 1024,                                      // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                                  // MAX_BLOCK_DIM_X/Y
        4 => 64,                                        // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                                  // MAX_GRID_DIM_X
        6 | 7 => 65535,                                 // MAX_GRID_DIM_Y/Z
        8 => 49152,                                     // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                                     // TOTAL_CONSTANT_MEMORY
        10 => 32,                                       // WARP_SIZE
        11 => i32::MAX,                                 // MAX_PITCH
        12 => 65536,                                    // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,                                // CLOCK_RATE (kHz)
        14 => 512,                                      // TEXTURE_ALIGNMENT
        15 => 1,                                        // GPU_OVERLAP
        16 => 132,                                      // MULTIPROCESSOR_COUNT
        19 => 1,                                        // CAN_MAP_HOST_MEMORY
        30 => 512,                                      // SURFACE_ALIGNMENT
        31 => 1,                                        // CONCURRENT_KERNELS
        32 => 1,                                        // ECC_ENABLED
        33 => identity::pci_bus(phys_of(dev)) as c_int, // PCI_BUS_ID
        36 => 2_619_000,                                // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                                     // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,                                 // L2_CACHE_SIZE
        39 => 2048,                                     // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                                        // ASYNC_ENGINE_COUNT
        41 => 1,                                        // UNIFIED_ADDRESSING
        51 => 32,                                       // TEXTURE_PITCH_ALIGNMENT
        75 => 9,                                        // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                                        // COMPUTE_CAPABILITY_MINOR
        78 => 1,                                        // STREAM_PRIORITIES_SUPPORTED
        79 | 80 => 1,                                   // GLOBAL/LOCAL_L1_CACHE_SUPPORTED
        81 => 233_472,                                  // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,                                    // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                                        // MANAGED_MEMORY
        89 => 1,                                        // CONCURRENT_MANAGED_ACCESS
        90 => 1,                                        // COMPUTE_PREEMPTION_SUPPORTED
        91 => 1,                                        // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        95 => 1,                                        // COOPERATIVE_LAUNCH
        97 => 232_448,                                  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        99 => 1,                                        // HOST_REGISTER_SUPPORTED
        102 => 1,                                       // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
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
        _ => 0,
    }
}

crate::ffi::exports! {
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let cfg = config::get().inspect_err(|msg| log(msg)).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // Joins the FAKECUDA_SHARED file, if any (an error names the problem).
        crate::memory::init_ledger(cfg).inspect_err(|msg| log(msg)).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if !INITIALIZED.swap(true, Ordering::AcqRel) {
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
        match ERRORS.iter().find(|e| e.0 == error) {
            Some(e) => out(pstr, e.1.as_ptr().cast()),
            None => {
                let _ = out(pstr, std::ptr::null());
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
}

/// The name of a CUresult, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
pub fn error_name(code: CUresult) -> Option<&'static str> {
    ERRORS
        .iter()
        .find(|e| e.0 == code)
        .map(|e| e.1.trim_end_matches('\0'))
}

fn error_string(code: CUresult) -> Option<&'static str> {
    let s = match code {
        0 => "no error\0",
        1 => "invalid argument\0",
        2 => "out of memory\0",
        3 => "initialization error\0",
        4 => "driver shutting down\0",
        100 => "no CUDA-capable device is detected\0",
        101 => "invalid device ordinal\0",
        201 => "invalid device context\0",
        400 => "invalid resource handle\0",
        500 => "named symbol not found\0",
        600 => "device not ready\0",
        801 => "operation not supported\0",
        999 => "unknown error\0",
        _ => return ERRORS.iter().find(|e| e.0 == code).map(|e| e.1),
    };
    Some(s)
}

/// CUresult values and names, from the CUDA 12.9 cuda.h `cudaError_enum` (NUL-terminated).
const ERRORS: &[(CUresult, &str)] = &[
    (0, "CUDA_SUCCESS\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0"),
    (5, "CUDA_ERROR_PROFILER_DISABLED\0"),
    (6, "CUDA_ERROR_PROFILER_NOT_INITIALIZED\0"),
    (7, "CUDA_ERROR_PROFILER_ALREADY_STARTED\0"),
    (8, "CUDA_ERROR_PROFILER_ALREADY_STOPPED\0"),
    (34, "CUDA_ERROR_STUB_LIBRARY\0"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE\0"),
    (100, "CUDA_ERROR_NO_DEVICE\0"),
    (101, "CUDA_ERROR_INVALID_DEVICE\0"),
    (102, "CUDA_ERROR_DEVICE_NOT_LICENSED\0"),
    (200, "CUDA_ERROR_INVALID_IMAGE\0"),
    (201, "CUDA_ERROR_INVALID_CONTEXT\0"),
    (202, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT\0"),
    (205, "CUDA_ERROR_MAP_FAILED\0"),
    (206, "CUDA_ERROR_UNMAP_FAILED\0"),
    (207, "CUDA_ERROR_ARRAY_IS_MAPPED\0"),
    (208, "CUDA_ERROR_ALREADY_MAPPED\0"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU\0"),
    (210, "CUDA_ERROR_ALREADY_ACQUIRED\0"),
    (211, "CUDA_ERROR_NOT_MAPPED\0"),
    (212, "CUDA_ERROR_NOT_MAPPED_AS_ARRAY\0"),
    (213, "CUDA_ERROR_NOT_MAPPED_AS_POINTER\0"),
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE\0"),
    (215, "CUDA_ERROR_UNSUPPORTED_LIMIT\0"),
    (216, "CUDA_ERROR_CONTEXT_ALREADY_IN_USE\0"),
    (217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED\0"),
    (218, "CUDA_ERROR_INVALID_PTX\0"),
    (219, "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT\0"),
    (220, "CUDA_ERROR_NVLINK_UNCORRECTABLE\0"),
    (221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND\0"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION\0"),
    (223, "CUDA_ERROR_JIT_COMPILATION_DISABLED\0"),
    (224, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY\0"),
    (225, "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC\0"),
    (226, "CUDA_ERROR_CONTAINED\0"),
    (300, "CUDA_ERROR_INVALID_SOURCE\0"),
    (301, "CUDA_ERROR_FILE_NOT_FOUND\0"),
    (302, "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND\0"),
    (303, "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED\0"),
    (304, "CUDA_ERROR_OPERATING_SYSTEM\0"),
    (400, "CUDA_ERROR_INVALID_HANDLE\0"),
    (401, "CUDA_ERROR_ILLEGAL_STATE\0"),
    (402, "CUDA_ERROR_LOSSY_QUERY\0"),
    (500, "CUDA_ERROR_NOT_FOUND\0"),
    (600, "CUDA_ERROR_NOT_READY\0"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS\0"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\0"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT\0"),
    (703, "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING\0"),
    (704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED\0"),
    (705, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED\0"),
    (708, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE\0"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED\0"),
    (710, "CUDA_ERROR_ASSERT\0"),
    (711, "CUDA_ERROR_TOO_MANY_PEERS\0"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED\0"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED\0"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR\0"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION\0"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS\0"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE\0"),
    (718, "CUDA_ERROR_INVALID_PC\0"),
    (719, "CUDA_ERROR_LAUNCH_FAILED\0"),
    (720, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE\0"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK\0"),
    (800, "CUDA_ERROR_NOT_PERMITTED\0"),
    (801, "CUDA_ERROR_NOT_SUPPORTED\0"),
    (802, "CUDA_ERROR_SYSTEM_NOT_READY\0"),
    (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH\0"),
    (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE\0"),
    (805, "CUDA_ERROR_MPS_CONNECTION_FAILED\0"),
    (806, "CUDA_ERROR_MPS_RPC_FAILURE\0"),
    (807, "CUDA_ERROR_MPS_SERVER_NOT_READY\0"),
    (808, "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED\0"),
    (809, "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED\0"),
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED\0"),
    (811, "CUDA_ERROR_CDP_NOT_SUPPORTED\0"),
    (812, "CUDA_ERROR_CDP_VERSION_MISMATCH\0"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0"),
    (902, "CUDA_ERROR_STREAM_CAPTURE_MERGE\0"),
    (903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0"),
    (904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED\0"),
    (905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION\0"),
    (906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT\0"),
    (907, "CUDA_ERROR_CAPTURED_EVENT\0"),
    (908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD\0"),
    (909, "CUDA_ERROR_TIMEOUT\0"),
    (910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE\0"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE\0"),
    (912, "CUDA_ERROR_INVALID_CLUSTER_SIZE\0"),
    (913, "CUDA_ERROR_FUNCTION_NOT_LOADED\0"),
    (914, "CUDA_ERROR_INVALID_RESOURCE_TYPE\0"),
    (915, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION\0"),
    (916, "CUDA_ERROR_KEY_ROTATION\0"),
    (999, "CUDA_ERROR_UNKNOWN\0"),
];
