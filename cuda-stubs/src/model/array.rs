//! CUDA arrays and mipmapped arrays: charged to the device ledger like any allocation. They
//! have no backing store (array copies and textures are not supported), only a size and a
//! descriptor.
//!
//! Size model (what is charged, and what cuArrayGetMemoryRequirements /
//! cuMipmappedArrayGetMemoryRequirements report, with alignment 512):
//! - an array: width x max(height,1) x max(depth,1) x channels x format size, rounded up to
//!   512 bytes;
//! - a mipmapped array: the sum of that over its levels, level l being
//!   max(1, width>>l) x max(1, height>>l) x max(1, depth>>l) (a 0 height or depth stays 0,
//!   the depth of a layered or cubemap array is not reduced);
//! - arrays created with CUDA_ARRAY3D_SPARSE or CUDA_ARRAY3D_DEFERRED_MAPPING are not
//!   charged (no memory until `cuMemMapArrayAsync` maps `cuMemCreate` memory into them,
//!   `vmm::map_array`, charged as that handle), but report the same requirements; what is
//!   mapped into one is unmapped at its end (`vmm::drop_array_tiles`, called by the API's
//!   destroy calls and `teardown`).

use super::HashMap;
use std::sync::Mutex;

use std::sync::LazyLock;

use super::ctx::Ctx;
use super::device::ledger;
use super::os::new_handle;
use crate::abi::types::{
    CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_MAPPED, CudaArray3dDescriptor,
};
use crate::abi::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUresult,
    CuResult,
};
use libc::{c_int, c_uint};

/// A CUDA array, or a level of a mipmapped array.
#[derive(Debug, Clone, Copy)]
pub struct Array {
    pub dev: usize,
    pub ctx: Ctx,
    /// Bytes charged (0 for deferred mapping and mipmap levels).
    pub size: u64,
    /// Bytes of the size model (what the memory requirements report).
    pub bytes: u64,
    pub desc: CudaArray3dDescriptor,
    /// The mipmapped array this is a level of (not destroyed on its own).
    pub level_of: Option<usize>,
}

static ARRAYS: LazyLock<Mutex<HashMap<usize, Array>>> = LazyLock::new(Default::default);

fn arrays() -> std::sync::MutexGuard<'static, HashMap<usize, Array>> {
    ARRAYS.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone)]
struct Mipmap {
    dev: usize,
    ctx: Ctx,
    /// Bytes charged (0 for deferred mapping).
    charged: u64,
    /// Bytes of the size model.
    bytes: u64,
    desc: CudaArray3dDescriptor,
    levels: u32,
    /// Level arrays handed out by cuMipmappedArrayGetLevel (level, handle).
    level_arrays: Vec<(u32, usize)>,
}

static MIPMAPS: LazyLock<Mutex<HashMap<usize, Mipmap>>> = LazyLock::new(Default::default);

fn mipmaps() -> std::sync::MutexGuard<'static, HashMap<usize, Mipmap>> {
    MIPMAPS.lock().unwrap_or_else(|e| e.into_inner())
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

/// Alignment reported by the memory-requirements queries; sizes are rounded up to it.
pub const ARRAY_ALIGNMENT: u64 = 512;

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
    .and_then(|b| b.checked_next_multiple_of(ARRAY_ALIGNMENT))
    .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
}

/// The descriptor of mip level `level`.
fn level_desc(d: &CudaArray3dDescriptor, level: u32) -> CudaArray3dDescriptor {
    let shrink = |x: usize| if x == 0 { 0 } else { (x >> level).max(1) };
    let keep_depth = d.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    CudaArray3dDescriptor {
        width: shrink(d.width),
        height: shrink(d.height),
        depth: if keep_depth { d.depth } else { shrink(d.depth) },
        ..*d
    }
}

/// How many levels a mipmap of this shape can have: 1 + floor(log2(largest dimension)).
fn max_levels(d: &CudaArray3dDescriptor) -> u32 {
    let keep_depth = d.flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP) != 0;
    let largest = d
        .width
        .max(d.height)
        .max(if keep_depth { 0 } else { d.depth });
    usize::BITS - largest.max(1).leading_zeros()
}

/// Bytes a mipmapped array takes: the sum of its levels.
pub fn mipmap_bytes(d: &CudaArray3dDescriptor, levels: u32) -> Result<u64, CUresult> {
    array_bytes(d)?;
    if levels == 0 || levels > max_levels(d) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    (0..levels).try_fold(0u64, |acc, l| {
        acc.checked_add(array_bytes(&level_desc(d, l))?)
            .ok_or(CUDA_ERROR_OUT_OF_MEMORY)
    })
}

/// A new array of context `ctx` on `dev` (cuArrayCreate, cuArray3DCreate), charged unless
/// its mapping is deferred: (handle, bytes of the size model).
pub fn create(ctx: Ctx, dev: usize, desc: CudaArray3dDescriptor) -> Result<(usize, u64), CUresult> {
    let bytes = array_bytes(&desc)?;
    let size = if desc.flags & CUDA_ARRAY3D_MAPPED != 0 {
        0
    } else {
        bytes
    };
    if size > 0 {
        ledger()?.reserve(dev, size)?;
    }
    let h = new_handle();
    arrays().insert(
        h,
        Array {
            dev,
            ctx,
            size,
            bytes,
            desc,
            level_of: None,
        },
    );
    Ok((h, bytes))
}

/// Whether memory can be mapped into the array (`resource_type` 0) or mipmapped array
/// (1) `handle`: made sparse or with deferred mapping.
pub fn mappable(resource_type: c_int, handle: usize) -> bool {
    let flags = match resource_type {
        0 => arrays().get(&handle).map(|a| a.desc.flags),
        1 => mipmaps().get(&handle).map(|m| m.desc.flags),
        _ => None,
    };
    flags.is_some_and(|f| f & CUDA_ARRAY3D_MAPPED != 0)
}

/// An array or mipmap level.
pub fn get(handle: usize) -> Option<Array> {
    arrays().get(&handle).copied()
}

/// Destroys an array (cuArrayDestroy): a free call. A mipmap level goes only with its
/// mipmapped array (CUDA_ERROR_INVALID_HANDLE).
pub fn destroy(handle: usize) -> CuResult {
    let l = ledger()?;
    let mut arr = arrays();
    match arr.get(&handle) {
        Some(a) if a.level_of.is_none() => {
            let a = arr.remove(&handle).unwrap();
            drop(arr);
            if a.size > 0 {
                l.release(a.dev, a.size, true);
            }
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// A new mipmapped array of `levels` levels (cuMipmappedArrayCreate), charged unless its
/// mapping is deferred: (handle, bytes of the size model).
pub fn create_mipmap(
    ctx: Ctx,
    dev: usize,
    desc: CudaArray3dDescriptor,
    levels: u32,
) -> Result<(usize, u64), CUresult> {
    let bytes = mipmap_bytes(&desc, levels)?;
    let charged = if desc.flags & CUDA_ARRAY3D_MAPPED != 0 {
        0
    } else {
        bytes
    };
    if charged > 0 {
        ledger()?.reserve(dev, charged)?;
    }
    let h = new_handle();
    mipmaps().insert(
        h,
        Mipmap {
            dev,
            ctx,
            charged,
            bytes,
            desc,
            levels,
            level_arrays: Vec::new(),
        },
    );
    Ok((h, bytes))
}

/// Bytes of the size model of a mipmapped array.
pub fn mipmap_size(handle: usize) -> Option<u64> {
    mipmaps().get(&handle).map(|m| m.bytes)
}

/// The array of level `level` of a mipmapped array (cuMipmappedArrayGetLevel): made on
/// first use, not charged on its own.
pub fn mipmap_level(handle: usize, level: u32) -> Result<usize, CUresult> {
    let mut mm = mipmaps();
    let m = mm.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if level >= m.levels {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if let Some(&(_, h)) = m.level_arrays.iter().find(|(l, _)| *l == level) {
        return Ok(h);
    }
    let desc = level_desc(&m.desc, level);
    let h = new_handle();
    arrays().insert(
        h,
        Array {
            dev: m.dev,
            ctx: m.ctx,
            size: 0,
            bytes: array_bytes(&desc)?,
            desc,
            level_of: Some(handle),
        },
    );
    m.level_arrays.push((level, h));
    Ok(h)
}

/// Destroys a mipmapped array and its level arrays (cuMipmappedArrayDestroy): a free call.
pub fn destroy_mipmap(handle: usize) -> CuResult {
    let m = mipmaps().remove(&handle).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    release_mipmap(&m, true);
    Ok(())
}

fn release_mipmap(m: &Mipmap, call: bool) {
    let mut arr = arrays();
    for (_, h) in &m.level_arrays {
        arr.remove(h);
    }
    drop(arr);
    if m.charged > 0
        && let Ok(l) = ledger()
    {
        l.release(m.dev, m.charged, call);
    }
}

/// Frees the arrays and mipmapped arrays of a context that ended (not counted as free
/// calls); their handles, for what is mapped into them (`teardown`).
pub fn free_all_of_context(ctx: Ctx) -> Vec<usize> {
    let Ok(l) = ledger() else {
        return Vec::new();
    };
    let mut ended = Vec::new();
    arrays().retain(|&h, a| {
        if a.ctx == ctx && a.size > 0 {
            l.release(a.dev, a.size, false);
        }
        if a.ctx == ctx {
            ended.push(h);
        }
        a.ctx != ctx
    });
    let gone: Vec<(usize, Mipmap)> = {
        let mut mm = mipmaps();
        let keys: Vec<usize> = mm
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(&h, _)| h)
            .collect();
        keys.iter()
            .filter_map(|&h| mm.remove(&h).map(|m| (h, m)))
            .collect()
    };
    for (h, m) in &gone {
        release_mipmap(m, false);
        ended.push(*h);
    }
    ended
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
        assert_eq!(array_bytes(&d(128, 0, 0, 0x20, 1)), Ok(512));
        assert_eq!(
            array_bytes(&d(100, 0, 0, 0x20, 1)),
            Ok(512),
            "rounded up to 512"
        );
        assert_eq!(array_bytes(&d(100, 10, 0, 0x01, 4)), Ok(4096));
        assert_eq!(array_bytes(&d(10, 10, 10, 0x10, 2)), Ok(4096));
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

    #[test]
    fn mipmap_sizes() {
        // 256x256 RGBA8: 256K + 64K + 16K + 4K + 1K + 512 (256B rounded) + 512 ... 9 levels.
        let m = d(256, 256, 0, 0x01, 4);
        assert_eq!(max_levels(&m), 9);
        let want: u64 = (0..9u32)
            .map(|l| ((256u64 >> l).max(1).pow(2) * 4).next_multiple_of(512))
            .sum();
        assert_eq!(mipmap_bytes(&m, 9), Ok(want));
        assert_eq!(mipmap_bytes(&m, 1), array_bytes(&m));
        assert_eq!(mipmap_bytes(&m, 10), Err(CUDA_ERROR_INVALID_VALUE));
        assert_eq!(mipmap_bytes(&m, 0), Err(CUDA_ERROR_INVALID_VALUE));
        // 1D: height stays 0; layered: the layer count is not halved.
        let one_d = d(1000, 0, 0, 0x20, 1);
        assert_eq!(level_desc(&one_d, 3).height, 0);
        assert_eq!(level_desc(&one_d, 3).width, 125);
        let mut layered = d(64, 64, 6, 0x20, 1);
        layered.flags = CUDA_ARRAY3D_LAYERED;
        assert_eq!(level_desc(&layered, 2).depth, 6);
        assert_eq!(max_levels(&layered), 7);
        assert_eq!(level_desc(&d(64, 64, 6, 0x20, 1), 2).depth, 1);
    }
}
