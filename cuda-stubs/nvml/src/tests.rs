//! Calls the exports directly. The configuration is read once per process, so every test
//! starts from the same one: two 16 GiB GPUs in MIG mode sharing a FAKECUDA_SHARED file in
//! which this process holds 3 GiB of GPU 1.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::Once;

use super::*;
use crate::abi::{
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_MEMORY_V2,
    NVML_SUCCESS, nvmlErrorString, nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
    nvmlProcessInfo_v2_t, nvmlReturn_t,
};
use crate::api::{
    nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetCount, nvmlDeviceGetCount_v2,
    nvmlDeviceGetCudaComputeCapability, nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
    nvmlDeviceGetGpuInstanceId, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetHandleByPciBusId_v2,
    nvmlDeviceGetHandleByUUID, nvmlDeviceGetIndex, nvmlDeviceGetMaxMigDeviceCount,
    nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMigDeviceHandleByIndex,
    nvmlDeviceGetMigMode, nvmlDeviceGetName, nvmlDeviceGetPciInfo_v3, nvmlDeviceGetUUID,
    nvmlDeviceIsMigDeviceHandle, nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown,
    nvmlSystemGetCudaDriverVersion_v2, nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion,
};
use crate::devices::nvmlDevice_t;
use fake_gpu::shared::Shared;
use libc::{c_char, c_uint};

const GIB: u64 = 1 << 30;

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let path = std::env::temp_dir().join(format!("fakenvml-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        // SAFETY: set once, before any test reads the environment (config::get reads it
        // on first use, after this).
        unsafe {
            std::env::set_var("FAKECUDA_DEVICES", "2");
            std::env::set_var("FAKECUDA_TOTAL_MEM", "16Gi");
            std::env::set_var("FAKECUDA_MIG", "1");
            std::env::set_var("FAKECUDA_DRIVER_VERSION", "12090");
            std::env::set_var("FAKECUDA_NVML_RESERVED", "512Mi");
            std::env::set_var("FAKECUDA_SHARED", &path);
            std::env::set_var("CUDA_VISIBLE_DEVICES", "1"); // NVML ignores it
        }
        // This process, as a CUDA process would, holds 3 GiB of GPU 1.
        let s = Shared::join(&path, 2, 16 * GIB).unwrap();
        assert!(s.reserve(1, 3 * GIB));
        std::mem::forget(s);
    });
    assert_eq!(unsafe { nvmlInit_v2() }, NVML_SUCCESS);
}

fn handle(i: u32) -> nvmlDevice_t {
    let mut h = std::ptr::null();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(i, &mut h) },
        NVML_SUCCESS
    );
    h
}

fn string(f: impl FnOnce(*mut c_char, c_uint) -> nvmlReturn_t) -> String {
    let mut b = [0 as c_char; 96];
    assert_eq!(f(b.as_mut_ptr(), 96), NVML_SUCCESS);
    unsafe { CStr::from_ptr(b.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn devices_names_uuids_pci() {
    setup();
    unsafe {
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), NVML_SUCCESS);
        assert_eq!(n, 2, "physical devices, CUDA_VISIBLE_DEVICES ignored");
        let h1 = handle(1);
        let mut i = 9;
        assert_eq!(nvmlDeviceGetIndex(h1, &mut i), NVML_SUCCESS);
        assert_eq!(i, 1);
        assert_eq!(
            string(|b, l| nvmlDeviceGetName(h1, b, l)),
            "FakeCUDA Device 1"
        );
        let uuid = string(|b, l| nvmlDeviceGetUUID(h1, b, l));
        assert_eq!(uuid, "GPU-face0000-0000-0000-0000-000000000001");
        let mut small = [0 as c_char; 8];
        assert_eq!(
            nvmlDeviceGetUUID(h1, small.as_mut_ptr(), 8),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        let mut by = std::ptr::null();
        let c = std::ffi::CString::new(uuid).unwrap();
        assert_eq!(nvmlDeviceGetHandleByUUID(c.as_ptr(), &mut by), NVML_SUCCESS);
        assert_eq!(by, h1);
        assert_eq!(
            nvmlDeviceGetHandleByUUID(
                c"GPU-face0000-0000-0000-0000-000000000007".as_ptr(),
                &mut by
            ),
            NVML_ERROR_NOT_FOUND
        );
        let mut pci: nvmlPciInfo_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(h1, &mut pci), NVML_SUCCESS);
        assert_eq!(
            CStr::from_ptr(pci.bus_id.as_ptr()).to_str(),
            Ok("00000000:02:00.0")
        );
        assert_eq!(
            CStr::from_ptr(pci.bus_id_legacy.as_ptr()).to_str(),
            Ok("0000:02:00.0")
        );
        assert_eq!(
            (pci.domain, pci.bus, pci.device, pci.pci_device_id),
            (0, 2, 0, 0x233010de)
        );
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"00000000:02:00.0".as_ptr(), &mut by),
            NVML_SUCCESS
        );
        assert_eq!(by, h1);
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:01:00.0".as_ptr(), &mut by),
            NVML_SUCCESS
        );
        assert_eq!(by, handle(0));
        assert_eq!(
            nvmlDeviceGetHandleByPciBusId_v2(c"0000:09:00.0".as_ptr(), &mut by),
            NVML_ERROR_NOT_FOUND
        );
        let mut h = std::ptr::null();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(2, &mut h),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetIndex(0x1234 as nvmlDevice_t, &mut i),
            NVML_ERROR_INVALID_ARGUMENT
        );
        let (mut major, mut minor) = (0, 0);
        assert_eq!(
            nvmlDeviceGetCudaComputeCapability(h1, &mut major, &mut minor),
            NVML_SUCCESS
        );
        assert_eq!((major, minor), (9, 0));
    }
}

#[test]
fn versions_and_errors() {
    setup();
    unsafe {
        assert_eq!(string(|b, l| nvmlSystemGetDriverVersion(b, l)), "575.57.08");
        assert_eq!(
            string(|b, l| nvmlSystemGetNVMLVersion(b, l)),
            "12.575.57.08"
        );
        let mut v = 0;
        assert_eq!(nvmlSystemGetCudaDriverVersion_v2(&mut v), NVML_SUCCESS);
        assert_eq!(v, 12090);
        assert_eq!(
            CStr::from_ptr(nvmlErrorString(3)).to_str(),
            Ok("Not Supported")
        );
        assert_eq!(
            CStr::from_ptr(nvmlErrorString(999)).to_str(),
            Ok("Unknown Error")
        );
        // Unimplemented entry points exist and say NOT_SUPPORTED.
        assert_eq!(
            generated::nvmlDeviceGetTemperature(),
            NVML_ERROR_NOT_SUPPORTED
        );
    }
}

#[test]
fn memory_comes_from_the_shared_file() {
    setup();
    unsafe {
        let mut m = nvmlMemory_t::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(handle(1), &mut m), NVML_SUCCESS);
        // As a real driver's NVML: the total is CUDA's plus what the driver reserves
        // (FAKECUDA_NVML_RESERVED), which v1 counts as used.
        const RESERVED: u64 = GIB / 2;
        assert_eq!(
            m,
            nvmlMemory_t {
                total: 16 * GIB + RESERVED,
                free: 13 * GIB,
                used: 3 * GIB + RESERVED
            }
        );
        assert_eq!(nvmlDeviceGetMemoryInfo(handle(0), &mut m), NVML_SUCCESS);
        assert_eq!(m.used, RESERVED);
        let mut m2 = nvmlMemory_v2_t {
            version: NVML_MEMORY_V2,
            ..Default::default()
        };
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(handle(1), &mut m2), NVML_SUCCESS);
        assert_eq!(
            (m2.total, m2.reserved, m2.free, m2.used),
            (16 * GIB + RESERVED, RESERVED, 13 * GIB, 3 * GIB)
        );
        assert_eq!(m2.version, 0x0200_0028);
        m2.version = 2;
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(handle(1), &mut m2),
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        );
        // Processes: this one, with its 3 GiB (MIG instance ids set).
        let mut n = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(1), &mut n, null_mut()),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(n, 1);
        let mut p = [nvmlProcessInfo_v2_t::default(); 4];
        n = 4;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(1), &mut n, p.as_mut_ptr()),
            NVML_SUCCESS
        );
        assert_eq!(
            (n, p[0].pid, p[0].used_gpu_memory),
            (1, std::process::id(), 3 * GIB)
        );
        assert_eq!((p[0].gpu_instance_id, p[0].compute_instance_id), (0, 0));
        n = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(0), &mut n, null_mut()),
            NVML_SUCCESS
        );
        assert_eq!(n, 0);
    }
}

#[test]
fn mig_instances() {
    setup();
    unsafe {
        let h = handle(1);
        let (mut cur, mut pending) = (9, 9);
        assert_eq!(
            nvmlDeviceGetMigMode(h, &mut cur, &mut pending),
            NVML_SUCCESS
        );
        assert_eq!((cur, pending), (1, 1));
        let mut max = 0;
        assert_eq!(nvmlDeviceGetMaxMigDeviceCount(h, &mut max), NVML_SUCCESS);
        assert_eq!(max, 7);
        let mut mig = std::ptr::null();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h, 1, &mut mig),
            NVML_ERROR_NOT_FOUND
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h, 7, &mut mig),
            NVML_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(h, 0, &mut mig),
            NVML_SUCCESS
        );
        assert_ne!(mig, h);
        let mut is = 9;
        assert_eq!(nvmlDeviceIsMigDeviceHandle(mig, &mut is), NVML_SUCCESS);
        assert_eq!(is, 1);
        assert_eq!(nvmlDeviceIsMigDeviceHandle(h, &mut is), NVML_SUCCESS);
        assert_eq!(is, 0);
        assert_eq!(
            string(|b, l| nvmlDeviceGetUUID(mig, b, l)),
            "MIG-face0001-0000-0000-0000-000000000001"
        );
        assert_eq!(
            string(|b, l| nvmlDeviceGetUUID(h, b, l)),
            "GPU-face0000-0000-0000-0000-000000000001"
        );
        assert_eq!(
            string(|b, l| nvmlDeviceGetName(mig, b, l)),
            "FakeCUDA Device 1 MIG 7g.16gb"
        );
        let mut parent = std::ptr::null();
        assert_eq!(
            nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &mut parent),
            NVML_SUCCESS
        );
        assert_eq!(parent, h);
        assert_eq!(
            nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h, &mut parent),
            NVML_ERROR_INVALID_ARGUMENT
        );
        let mut by = std::ptr::null();
        assert_eq!(
            nvmlDeviceGetHandleByUUID(
                c"MIG-face0001-0000-0000-0000-000000000001".as_ptr(),
                &mut by
            ),
            NVML_SUCCESS
        );
        assert_eq!(by, mig);
        let mut m = nvmlMemory_t::default();
        assert_eq!(nvmlDeviceGetMemoryInfo(mig, &mut m), NVML_SUCCESS);
        assert_eq!(
            m.used,
            3 * GIB + GIB / 2,
            "its GPU's, the reserved 512 MiB included"
        );
        let mut id = 9;
        assert_eq!(nvmlDeviceGetGpuInstanceId(mig, &mut id), NVML_SUCCESS);
        assert_eq!(id, 0);
        assert_eq!(
            nvmlDeviceGetGpuInstanceId(h, &mut id),
            NVML_ERROR_NOT_SUPPORTED
        );
    }
}

#[test]
fn init_is_reference_counted() {
    setup();
    unsafe {
        assert_eq!(nvmlInitWithFlags(0), NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), NVML_SUCCESS);
        // The other tests' inits keep it initialised; shutting down more than initialising
        // fails. (Balanced here: setup() inits once per test, never shut down.)
        let mut n = 0;
        assert_eq!(nvmlDeviceGetCount(&mut n), NVML_SUCCESS);
    }
}

/// cuda-stubs/STUBS.md lists exactly the names of names.txt that build.rs made stubs.
#[test]
fn stubs_listing_matches_the_build() {
    let total = include_str!("names.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    fake_gpu::stubs_doc::check(
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../STUBS.md")),
        "libnvidia-ml.so.1",
        generated::STUBS,
        total,
    );
}
