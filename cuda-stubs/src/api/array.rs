//! CUDA arrays and mipmapped arrays: creation, destruction, descriptors, levels and memory
//! requirements (the size model is in model/array.rs).

use crate::abi::types::{CudaArray3dDescriptor, CudaArrayDescriptor, CudaArrayMemoryRequirements};
use crate::abi::{CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CuResult, inp, note, out};
use crate::model::array::{self, ARRAY_ALIGNMENT};
use crate::model::ctx::current;
use crate::model::device::{cfg, check_dev};
use libc::{c_int, c_uint};

fn create(handle: *mut usize, desc: CudaArray3dDescriptor) -> CuResult {
    let (ctx, dev) = current()?;
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (h, bytes) = array::create(ctx, dev, desc)?;
    note(|| format!("array={h:#x}, bytes={bytes}"));
    out(handle, h)
}

fn requirements(out_p: *mut CudaArrayMemoryRequirements, bytes: u64, device: c_int) -> CuResult {
    check_dev(device)?;
    out(
        out_p,
        CudaArrayMemoryRequirements {
            size: bytes as usize,
            alignment: ARRAY_ALIGNMENT as usize,
            reserved: [0; 4],
        },
    )
}

crate::abi::exports! {
    fn cuArrayCreate_v2(handle: *mut usize, desc: *const CudaArrayDescriptor) {
        let d = inp(desc)?;
        create(handle, CudaArray3dDescriptor {
            width: d.width,
            height: d.height,
            depth: 0,
            format: d.format,
            num_channels: d.num_channels,
            flags: 0,
        })
    }

    fn cuArray3DCreate_v2(handle: *mut usize, desc: *const CudaArray3dDescriptor) {
        create(handle, inp(desc)?)
    }

    // What is mapped into it (cuMemMapArrayAsync) is unmapped with it.
    fn cuArrayDestroy(handle: usize) {
        array::destroy(handle)?;
        crate::model::vmm::drop_array_tiles(handle);
        Ok(())
    }

    fn cuArrayGetDescriptor_v2(desc: *mut CudaArrayDescriptor, handle: usize) {
        cfg()?;
        let a = array::get(handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if a.desc.depth != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(desc, CudaArrayDescriptor {
            width: a.desc.width,
            height: a.desc.height,
            format: a.desc.format,
            num_channels: a.desc.num_channels,
        })
    }

    fn cuArray3DGetDescriptor_v2(desc: *mut CudaArray3dDescriptor, handle: usize) {
        cfg()?;
        let a = array::get(handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(desc, a.desc)
    }

    fn cuArrayGetMemoryRequirements(reqs: *mut CudaArrayMemoryRequirements, array: usize, device: c_int) {
        cfg()?;
        let a = array::get(array).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        requirements(reqs, a.bytes, device)
    }

    fn cuMipmappedArrayCreate(handle: *mut usize, desc: *const CudaArray3dDescriptor, levels: c_uint) {
        let (ctx, dev) = current()?;
        let desc = inp(desc)?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (h, bytes) = array::create_mipmap(ctx, dev, desc, levels)?;
        note(|| format!("mipmap={h:#x}, bytes={bytes}"));
        out(handle, h)
    }

    fn cuMipmappedArrayDestroy(handle: usize) {
        cfg()?;
        array::destroy_mipmap(handle)?;
        crate::model::vmm::drop_array_tiles(handle);
        Ok(())
    }

    fn cuMipmappedArrayGetLevel(level_array: *mut usize, handle: usize, level: c_uint) {
        cfg()?;
        if level_array.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(level_array, array::mipmap_level(handle, level)?)
    }

    fn cuMipmappedArrayGetMemoryRequirements(reqs: *mut CudaArrayMemoryRequirements, handle: usize, device: c_int) {
        cfg()?;
        let bytes = array::mipmap_size(handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        requirements(reqs, bytes, device)
    }
}
