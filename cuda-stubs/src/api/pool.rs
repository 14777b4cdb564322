//! Stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync) and memory pools: the
//! default and current pools of each device or location, pool creation, attributes, access.

use crate::abi::types::{
    CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READ,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ALLOCATION_TYPE_MANAGED,
    CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN, CU_MEM_LOCATION_TYPE_HOST,
    CU_MEM_LOCATION_TYPE_HOST_NUMA, CU_MEM_LOCATION_TYPE_NONE, CU_MEMPOOL_ATTR_MAX_POOL_SIZE,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH, CUdeviceptr, CUmemAccessDesc, CUmemLocation, CUmemPoolProps,
};
use crate::abi::{
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUresult,
    CuResult, inp, note, out,
};
use crate::model::device::{cfg, check_dev};
use crate::model::graph;
use crate::model::linear::{self, Kind};
use crate::model::pool::{self, Pool};
use crate::model::stream;
use libc::{c_int, c_void};

/// The device of a (location, allocation type) the CUDA 13 pool-by-location calls name.
/// Only device memory (`DEVICE`, `PINNED`) has pools in the fake: host, host NUMA, locality
/// domain and managed pools are CUDA_ERROR_NOT_SUPPORTED; combinations the header rules out
/// are CUDA_ERROR_INVALID_VALUE, and so is an unknown device, unless `bad_device` says
/// otherwise.
fn pool_location(
    location: *const CUmemLocation,
    alloc_type: c_int,
    bad_device: CUresult,
) -> Result<usize, CUresult> {
    cfg()?;
    let loc = inp(location)?;
    let managed = match alloc_type {
        CU_MEM_ALLOCATION_TYPE_PINNED => false,
        CU_MEM_ALLOCATION_TYPE_MANAGED => true,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    match (loc.type_, managed) {
        (CU_MEM_LOCATION_TYPE_DEVICE, false) => check_dev(loc.id).map_err(|_| bad_device),
        (
            CU_MEM_LOCATION_TYPE_DEVICE
            | CU_MEM_LOCATION_TYPE_HOST
            | CU_MEM_LOCATION_TYPE_HOST_NUMA
            | CU_MEM_LOCATION_TYPE_NONE,
            true,
        )
        | (
            CU_MEM_LOCATION_TYPE_HOST
            | CU_MEM_LOCATION_TYPE_HOST_NUMA
            | CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN,
            false,
        ) => Err(CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}
/// cuMemPoolSetAttribute on the pool: the reuse flags, the release threshold, and the high
/// watermarks (only to 0, which resets them to the current value).
fn set_attribute(p: &mut Pool, attr: c_int, value: *mut c_void) -> CuResult {
    match attr {
        CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            ..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            p.reuse[attr as usize - 1] = inp(value.cast::<c_int>())?
        }
        CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => p.release_threshold = inp(value.cast::<u64>())?,
        CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
            if inp(value.cast::<u64>())? != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            if attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH {
                p.reserved_high = p.reserved;
            } else {
                p.used_high = p.used;
            }
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

fn alloc_from(dptr: *mut CUdeviceptr, size: usize, pool: Option<usize>, stream: usize) -> CuResult {
    let (ctx, sdev) = stream::context_of(stream)?;
    if dptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (pool, dev) = match pool {
        Some(p) => (p, pool::get(p)?.dev),
        None => (pool::current_of(sdev), sdev),
    };
    if size == 0 {
        // The real driver (13.0, H200) answers success for 0 bytes: nothing is allocated.
        return out(dptr, 0);
    }
    if let Some((g, _)) = graph::capture_of(stream)? {
        // Captured: an alloc node of the graph, from the pool's device.
        let _ = ctx;
        let props = CUmemPoolProps {
            alloc_type: CU_MEM_ALLOCATION_TYPE_PINNED,
            handle_types: 0,
            location: CUmemLocation {
                type_: CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev as c_int,
            },
            win32_security_attributes: 0,
            max_size: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let (_, p) = graph::add_alloc(g, dev, size as u64, props, Vec::new())?;
        return out(dptr, p);
    }
    out(
        dptr,
        linear::alloc(dev, ctx, size as u64, Kind::Pool(pool))?,
    )
}

crate::abi::exports! {
    fn cuDeviceGetDefaultMemPool(pool: *mut usize, dev: c_int) {
        out(pool, pool::default_of(check_dev(dev)?))
    }

    fn cuDeviceGetMemPool(pool: *mut usize, dev: c_int) {
        out(pool, pool::current_of(check_dev(dev)?))
    }

    fn cuDeviceSetMemPool(dev: c_int, pool: usize) {
        pool::set_current(check_dev(dev)?, pool)
    }

    // CUDA 13.0: the same by (location, allocation type).
    fn cuMemGetDefaultMemPool(pool_out: *mut usize, location: *mut CUmemLocation, alloc_type: c_int) {
        let dev = pool_location(location, alloc_type, CUDA_ERROR_INVALID_DEVICE)?;
        out(pool_out, pool::default_of(dev))
    }

    fn cuMemGetMemPool(pool: *mut usize, location: *mut CUmemLocation, alloc_type: c_int) {
        let dev = pool_location(location, alloc_type, CUDA_ERROR_INVALID_VALUE)?;
        out(pool, pool::current_of(dev))
    }

    fn cuMemSetMemPool(location: *mut CUmemLocation, alloc_type: c_int, pool: usize) {
        pool::set_current(pool_location(location, alloc_type, CUDA_ERROR_INVALID_VALUE)?, pool)
    }

    fn cuMemPoolCreate(pool: *mut usize, props: *const CUmemPoolProps) {
        cfg()?;
        let props = inp(props)?;
        if pool.is_null() || props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || props.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let dev = check_dev(props.location.id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let h = pool::create(dev, props.max_size as u64, props.handle_types, props.usage);
        note(|| format!("pool={h:#x}"));
        out(pool, h)
    }

    fn cuMemPoolDestroy(pool: usize) {
        cfg()?;
        // Outstanding allocations stay valid; the pool goes once they are freed.
        pool::destroy(pool)
    }

    fn cuMemPoolTrimTo(pool: usize, min_bytes: usize) {
        pool::get(pool)?;
        pool::trim_to(pool, min_bytes as u64);
        Ok(())
    }

    fn cuMemPoolSetAttribute(pool: usize, attr: c_int, value: *mut c_void) {
        pool::get(pool)?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        pool::update(pool, |p| set_attribute(p, attr, value))
    }

    fn cuMemPoolGetAttribute(pool: usize, attr: c_int, value: *mut c_void) {
        let p = pool::get(pool)?;
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                out(value.cast::<c_int>(), p.reuse[attr as usize - 1])
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => out(value.cast::<u64>(), p.release_threshold),
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => out(value.cast::<u64>(), p.reserved),
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => out(value.cast::<u64>(), p.reserved_high),
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT => out(value.cast::<u64>(), p.used),
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => out(value.cast::<u64>(), p.used_high),
            CU_MEMPOOL_ATTR_MAX_POOL_SIZE => {
                let v = p.kind_attribute(attr, cfg()?.driver_version).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                out(value.cast::<u64>(), v)
            }
            _ => {
                let v = p.kind_attribute(attr, cfg()?.driver_version).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                out(value.cast::<c_int>(), v as c_int)
            }
        }
    }

    // Other devices' access to the pool's memory; the pool's own device always has READWRITE.
    fn cuMemPoolSetAccess(pool: usize, desc: *const CUmemAccessDesc, count: usize) {
        let p = pool::get(pool)?;
        if desc.is_null() && count > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut grants = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: the caller passes an array of `count` descriptors.
            let d = inp(unsafe { desc.add(i) })?;
            let dev = (d.location.type_ == CU_MEM_LOCATION_TYPE_DEVICE)
                .then(|| check_dev(d.location.id).ok())
                .flatten()
                .ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let valid = matches!(d.flags, CU_MEM_ACCESS_FLAGS_PROT_NONE | CU_MEM_ACCESS_FLAGS_PROT_READ | CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                && (dev != p.dev || d.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
            if !valid {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            grants.push((dev, d.flags));
        }
        pool::update(pool, |p| {
            for (dev, flags) in grants {
                p.access[dev] = flags;
            }
            Ok(())
        })
    }

    fn cuMemPoolGetAccess(flags: *mut c_int, pool: usize, location: *const CUmemLocation) {
        let p = pool::get(pool)?;
        let loc = inp(location)?;
        let access = if loc.type_ == CU_MEM_LOCATION_TYPE_DEVICE {
            p.access[check_dev(loc.id).map_err(|_| CUDA_ERROR_INVALID_VALUE)?]
        } else {
            CU_MEM_ACCESS_FLAGS_PROT_NONE
        };
        out(flags, access)
    }

    fn cuMemAllocAsync | cuMemAllocAsync_ptsz (dptr: *mut CUdeviceptr, bytesize: usize, stream: usize) {
        alloc_from(dptr, bytesize, None, stream)
    }

    fn cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz (dptr: *mut CUdeviceptr, bytesize: usize, pool: usize, stream: usize) {
        alloc_from(dptr, bytesize, Some(pool), stream)
    }

    fn cuMemFreeAsync | cuMemFreeAsync_ptsz (dptr: CUdeviceptr, stream: usize) {
        stream::check(stream)?;
        if dptr == 0 {
            // Freeing NULL is a no-op on the real driver.
            return Ok(());
        }
        // Captured: a free node when it is graph memory.
        if let Some((g, _)) = graph::capture_of(stream)?
            && let Some(rc) = graph::captured_free(g, dptr)
        {
            return rc;
        }
        linear::free(dptr)
    }
}
