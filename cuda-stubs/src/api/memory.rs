//! Linear device memory (cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged, cuMemFree),
//! cuMemGetInfo, pinned host memory, pointer queries, and `fakecuda_device_used` for the
//! fake NVML.

use crate::abi::types::CUdeviceptr;
use crate::abi::{
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_OUT_OF_MEMORY, CuResult, note, out,
};
use crate::model::address::{PtrInfo, pointer_info};
use crate::model::ctx::current;
use crate::model::device::{cfg, ledger};
use crate::model::graph;
use crate::model::host;
use crate::model::linear::{self, Kind};
use libc::{c_int, c_uint, c_void};

fn host_alloc(pp: *mut *mut c_void, size: usize) -> CuResult {
    cfg()?;
    if size == 0 || pp.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let p = host::alloc(size)?;
    note(|| format!("ptr={p:#x}"));
    out(pp, p as *mut c_void)
}

/// Writes one attribute of `info` into `data` (booleans as one byte, so a zeroed
/// `unsigned int` and a `bool` destination both read correctly).
fn write_attribute(data: *mut c_void, attr: c_int, ptr: usize, info: &PtrInfo) -> CuResult {
    match attr {
        1 => out(data.cast::<usize>(), info.ctx), // CONTEXT
        2 => out(data.cast::<c_uint>(), if info.host { 1 } else { 2 }), // MEMORY_TYPE
        3 => out(data.cast::<u64>(), ptr as u64), // DEVICE_POINTER
        4 if info.host || info.managed => out(data.cast::<usize>(), ptr), // HOST_POINTER
        6 | 8 | 10 | 13 | 15 | 21 => out(
            data.cast::<u8>(),
            match attr {
                8 => info.managed as u8,
                10 | 15 => info.plain as u8, // IS_LEGACY_CUDA_IPC_CAPABLE, IS_GPU_DIRECT_RDMA_CAPABLE
                13 => 1,
                _ => 0,
            },
        ),
        7 | 20 => out(data.cast::<u64>(), info.id), // BUFFER_ID, MEMORY_BLOCK_ID
        9 => out(data.cast::<c_int>(), info.dev as c_int), // DEVICE_ORDINAL
        11 => out(data.cast::<u64>(), info.range.0 as u64), // RANGE_START_ADDR
        12 => out(data.cast::<usize>(), info.range.1), // RANGE_SIZE
        19 => out(data.cast::<u64>(), info.base as u64), // MAPPING_BASE_ADDR
        18 => out(data.cast::<usize>(), info.size), // MAPPING_SIZE
        14 => out(data.cast::<u64>(), 0),           // ALLOWED_HANDLE_TYPES
        16 => out(data.cast::<c_uint>(), 3),        // ACCESS_FLAGS: read-write
        17 => out(data.cast::<usize>(), info.pool), // MEMPOOL_HANDLE
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

crate::abi::exports! {
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) {
        let (ctx, dev) = current()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(dptr, linear::alloc(dev, ctx, bytesize as u64, Kind::Device)?)
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        let (ctx, dev) = current()?;
        if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = width.checked_add(511).ok_or(CUDA_ERROR_OUT_OF_MEMORY)? / 512 * 512;
        let size = (p as u64).checked_mul(height as u64).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = linear::alloc(dev, ctx, size, Kind::Device)?;
        out(pitch, p)?;
        out(dptr, ptr)
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) {
        let (ctx, dev) = current()?;
        if dptr.is_null() || !matches!(flags, 1 | 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(dptr, linear::alloc(dev, ctx, bytesize as u64, Kind::Managed)?)
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        if dptr == 0 {
            // Freeing NULL is a no-op on the real driver (once initialised).
            return cfg().map(|_| ());
        }
        linear::free(dptr)
    }

    fn cuMemGetInfo_v2(free_out: *mut usize, total_out: *mut usize) {
        graph::refuse_during_capture("cuMemGetInfo_v2")?;
        let (_, dev) = current()?;
        let l = ledger()?;
        // NULL for either figure is not an error on the real driver: it is not written.
        if !free_out.is_null() {
            out(free_out, l.total().saturating_sub(l.device_used(dev)) as usize)?;
        }
        if !total_out.is_null() {
            out(total_out, l.total() as usize)?;
        }
        Ok(())
    }

    fn cuMemGetAddressRange_v2(pbase: *mut CUdeviceptr, psize: *mut usize, dptr: CUdeviceptr) {
        cfg()?;
        let info = pointer_info(dptr as usize).filter(|i| !i.host).ok_or(CUDA_ERROR_NOT_FOUND)?;
        if !pbase.is_null() {
            out(pbase, info.base as CUdeviceptr)?;
        }
        if !psize.is_null() {
            out(psize, info.size)?;
        }
        Ok(())
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) {
        host_alloc(pp, bytesize)
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) {
        let _ = flags;
        host_alloc(pp, bytesize)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        cfg()?;
        host::free(p as usize)
    }

    fn cuMemHostGetDevicePointer_v2(pdptr: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) {
        cfg()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        out(pdptr, p as CUdeviceptr)
    }

    fn cuMemHostGetFlags(pflags: *mut c_uint, p: *mut c_void) {
        cfg()?;
        host::lookup(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(pflags, 0)
    }

    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) {
        cfg()?;
        let _ = flags;
        let start = p as usize;
        let end = start.checked_add(bytesize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if p.is_null() || bytesize == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        host::register(start, end)
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        cfg()?;
        if p.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        host::unregister(p as usize)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) {
        cfg()?;
        let info = pointer_info(ptr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        write_attribute(data, attribute, ptr as usize, &info)
    }

    fn cuPointerGetAttributes(num: c_uint, attributes: *const c_int, data: *mut *mut c_void, ptr: CUdeviceptr) {
        cfg()?;
        if num > 0 && (attributes.is_null() || data.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let info = pointer_info(ptr as usize);
        for i in 0..num as usize {
            // SAFETY: the caller passes arrays of `num` attributes and destinations.
            let (attr, dst) = unsafe { (*attributes.add(i), *data.add(i)) };
            if dst.is_null() {
                continue;
            }
            match &info {
                Some(info) => {
                    if write_attribute(dst, attr, ptr as usize, info).is_err() && attr == 4 {
                        out(dst.cast::<usize>(), 0)?;
                    }
                }
                // Unknown pointers read as "not CUDA memory": zeros (MEMORY_TYPE 0, NULL context).
                None => match attr {
                    1 | 4 | 12 | 17 | 18 => out(dst.cast::<usize>(), 0)?,
                    3 | 7 | 11 | 14 | 19 | 20 => out(dst.cast::<u64>(), 0)?,
                    9 => out(dst.cast::<c_int>(), -2)?,
                    6 | 8 | 10 | 13 | 15 | 21 => out(dst.cast::<u8>(), 0)?,
                    _ => out(dst.cast::<c_uint>(), 0)?,
                },
            }
        }
        Ok(())
    }
}

/// For the fake NVML (found with dlsym in the same process): the bytes this process holds
/// on physical device `phys`; 0 before cuInit or for a device it does not see.
#[unsafe(no_mangle)]
pub extern "C" fn fakecuda_device_used(phys: u32) -> u64 {
    std::panic::catch_unwind(|| {
        ledger()
            .ok()
            .and_then(|l| l.used_of_phys(phys as usize))
            .unwrap_or(0)
    })
    .unwrap_or(0)
}
