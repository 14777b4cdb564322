//! CUDA arrays: charged to the device ledger like any allocation. They have no backing
//! store (array copies and textures are not supported), only a size and a descriptor.

use std::collections::HashMap;
use std::sync::Mutex;

use once_cell::sync::Lazy;

use crate::context::{Ctx, current};
use crate::device::cfg;
use crate::ffi::*;
use crate::memory::ledger;
use libc::c_uint;

/// CUDA_ARRAY_DESCRIPTOR (v2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
}

/// CUDA_ARRAY3D_DESCRIPTOR (v2).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaArray3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

#[derive(Debug, Clone, Copy)]
struct Array {
    dev: usize,
    ctx: Ctx,
    size: u64,
    desc: CudaArray3dDescriptor,
}

static ARRAYS: Lazy<Mutex<HashMap<usize, Array>>> = Lazy::new(Default::default);

fn arrays() -> std::sync::MutexGuard<'static, HashMap<usize, Array>> {
    ARRAYS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes of one channel of a CUarray_format (packed and block formats approximated as 4).
fn format_size(format: c_uint) -> Option<u64> {
    Some(match format {
        0x01 | 0x08 | 0xc0 | 0xc6 => 1,
        0x02 | 0x09 | 0x10 | 0xc1 | 0xc3 | 0xc7 | 0xc9 => 2,
        0x03 | 0x0a | 0x20 | 0xc2 | 0xc4 | 0xc8 | 0xca | 0x50 => 4,
        0xc5 | 0xcb => 8,
        0x91..=0x9f | 0xa1..=0xa9 | 0xb0..=0xb3 => 4,
        _ => return None,
    })
}

/// Bytes an array of this shape takes; INVALID_VALUE for bad shapes, OUT_OF_MEMORY on overflow.
pub fn array_bytes(d: &CudaArray3dDescriptor) -> Result<u64, CUresult> {
    let elem = format_size(d.format).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if d.width == 0 || !matches!(d.num_channels, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    [
        d.width,
        d.height.max(1),
        d.depth.max(1),
        d.num_channels as usize,
    ]
    .iter()
    .try_fold(elem, |acc, &x| acc.checked_mul(x as u64))
    .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

fn create(handle: *mut usize, desc: CudaArray3dDescriptor) -> CuResult {
    let (ctx, dev) = current()?;
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let size = array_bytes(&desc)?;
    ledger()?.reserve(dev, size)?;
    let h = Box::into_raw(Box::new(0u64)) as usize;
    arrays().insert(
        h,
        Array {
            dev,
            ctx,
            size,
            desc,
        },
    );
    note(|| format!("array={h:#x}, bytes={size}"));
    out(handle, h)
}

/// Frees the arrays of a destroyed context (not counted as free calls).
pub fn free_all_of_context(ctx: Ctx) {
    let Ok(l) = ledger() else { return };
    arrays().retain(|_, a| {
        if a.ctx == ctx {
            l.release(a.dev, a.size, false);
        }
        a.ctx != ctx
    });
}

crate::ffi::exports! {
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

    fn cuArrayDestroy(handle: usize) {
        let l = ledger()?;
        let a = arrays().remove(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        l.release(a.dev, a.size, true);
        Ok(())
    }

    fn cuArrayGetDescriptor_v2(desc: *mut CudaArrayDescriptor, handle: usize) {
        cfg()?;
        let a = arrays().get(&handle).copied().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
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
        let a = arrays().get(&handle).copied().ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        out(desc, a.desc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(
        width: usize,
        height: usize,
        depth: usize,
        format: c_uint,
        ch: c_uint,
    ) -> CudaArray3dDescriptor {
        CudaArray3dDescriptor {
            width,
            height,
            depth,
            format,
            num_channels: ch,
            flags: 0,
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(array_bytes(&d(100, 0, 0, 0x20, 1)), Ok(400));
        assert_eq!(array_bytes(&d(100, 10, 0, 0x01, 4)), Ok(4000));
        assert_eq!(array_bytes(&d(10, 10, 10, 0x10, 2)), Ok(4000));
        assert_eq!(
            array_bytes(&d(0, 10, 10, 0x10, 2)),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            array_bytes(&d(10, 10, 10, 0x10, 3)),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(
            array_bytes(&d(usize::MAX, usize::MAX, 2, 0x20, 4)),
            Err(CUDA_ERROR_OUT_OF_MEMORY)
        );
    }
}
