//! Memory imported from another API: cuImportExternalMemory,
//! cuExternalMemoryGetMappedBuffer, cuDestroyExternalMemory. The other API (Vulkan,
//! OpenGL, another process) allocated the memory, so none of these takes device memory;
//! a mapped buffer is freed with cuMemFree (as CUDA's documentation of
//! cuExternalMemoryGetMappedBuffer says). Only `CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD`
//! exists on Linux; the Windows, Direct3D and NvSciBuf types are
//! `CUDA_ERROR_NOT_SUPPORTED` here, as on a Linux machine without them.

use crate::abi::types::{
    CU_EXTERNAL_MEMORY_HANDLE_TYPE_NVSCIBUF, CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_DEDICATED,
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUdeviceptr,
};
use crate::abi::{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, inp, note, out};
use crate::model::ctx::current;
use crate::model::device::cfg;
use crate::model::external;
use crate::model::linear;

crate::abi::exports! {
    fn cuImportExternalMemory(ext_mem_out: *mut usize, desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC) {
        cfg()?;
        let d = inp(desc)?;
        if ext_mem_out.is_null() || d.flags & !CUDA_EXTERNAL_MEMORY_DEDICATED != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        match d.type_ {
            CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD => {}
            2..=CU_EXTERNAL_MEMORY_HANDLE_TYPE_NVSCIBUF => return Err(CUDA_ERROR_NOT_SUPPORTED),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        // The fd is the union's first member: the low 32 bits of its first word.
        let fd = d.handle[0] as u32 as i32;
        let h = external::import(fd, d.size)?;
        note(|| format!("extMem={h:#x}, fd={fd}, bytes={}", d.size));
        out(ext_mem_out, h)
    }

    fn cuExternalMemoryGetMappedBuffer(dptr: *mut CUdeviceptr, ext_mem: usize, desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) {
        let (ctx, dev) = current()?;
        let d = inp(desc)?;
        let o = external::get(ext_mem)?;
        let page = crate::model::os::page_size() as u64;
        let fits = d.offset.checked_add(d.size).is_some_and(|e| e <= o.size);
        if dptr.is_null() || d.flags != 0 || d.size == 0 || !fits || d.offset % page != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = linear::map_external(dev, ctx, o.fd, d.offset, d.size)?;
        note(|| format!("ptr={p:#x}"));
        out(dptr, p)
    }

    fn cuDestroyExternalMemory(ext_mem: usize) {
        cfg()?;
        external::destroy(ext_mem)
    }
}
