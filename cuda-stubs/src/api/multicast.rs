//! Multicast objects (cuMulticastCreate, cuMulticastAddDevice, cuMulticastBindMem,
//! cuMulticastBindAddr and their _v2, cuMulticastUnbind, cuMulticastGetGranularity): see
//! `model::multicast`. Off unless `FAKECUDA_MULTICAST=1`: `CUDA_ERROR_NOT_SUPPORTED`.

use crate::abi::types::CUdeviceptr;
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CuResult, inp, note, out};
use crate::model::device::{cfg, check_dev};
use crate::model::multicast;
use crate::model::vmm::GRANULARITY;
use libc::c_int;

/// CUmulticastObjectProp (CUDA 12.1 on, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmulticastObjectProp {
    pub num_devices: u32,
    pub size: usize,
    pub handle_types: u64,
    pub flags: u64,
}

const _: () = assert!(std::mem::size_of::<CUmulticastObjectProp>() == 32);

/// The devices support multicast (`FAKECUDA_MULTICAST=1`).
pub fn supported() -> CuResult {
    if cfg()?.multicast {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}

crate::abi::exports! {
    fn cuMulticastGetGranularity(granularity: *mut usize, prop: *const CUmulticastObjectProp, option: c_int) {
        supported()?;
        let p = inp(prop)?;
        if p.num_devices == 0 || p.flags != 0 || !matches!(option, 0 | 1) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Minimum and recommended alike: the VMM granularity (the driver's are not recorded).
        out(granularity, GRANULARITY)
    }

    fn cuMulticastCreate(handle: *mut u64, prop: *const CUmulticastObjectProp) {
        supported()?;
        let p = inp(prop)?;
        if handle.is_null() || p.flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = multicast::create(p.num_devices, p.size)?;
        note(|| format!("handle={h:#x}"));
        out(handle, h)
    }

    fn cuMulticastAddDevice(handle: u64, dev: c_int) {
        supported()?;
        multicast::add_device(handle, check_dev(dev)?)
    }

    fn cuMulticastBindMem(handle: u64, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) {
        supported()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        multicast::bind(handle, None, mc_offset, mem, mem_offset, size)
    }

    fn cuMulticastBindMem_v2(handle: u64, dev: c_int, mc_offset: usize, mem: u64, mem_offset: usize, size: usize, flags: u64) {
        supported()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        multicast::bind(handle, Some(check_dev(dev)?), mc_offset, mem, mem_offset, size)
    }

    fn cuMulticastBindAddr(handle: u64, mc_offset: usize, ptr: CUdeviceptr, size: usize, flags: u64) {
        supported()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        multicast::bind_addr(handle, None, mc_offset, ptr as usize, size)
    }

    fn cuMulticastBindAddr_v2(handle: u64, dev: c_int, mc_offset: usize, ptr: CUdeviceptr, size: usize, flags: u64) {
        supported()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        multicast::bind_addr(handle, Some(check_dev(dev)?), mc_offset, ptr as usize, size)
    }

    fn cuMulticastUnbind(handle: u64, dev: c_int, mc_offset: usize, size: usize) {
        supported()?;
        multicast::unbind(handle, check_dev(dev)?, mc_offset, size)
    }
}
